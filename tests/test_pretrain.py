"""A client cannot take an honest trainer's stake with a job that cannot be finished
(docs/security.md, "a job that cannot be finished").

A job whose training reaches a value with no finite FP32 value (here the demo MLP at lr 1e6: step 3's
MUL overflows, in the second interval) can never be posted past that step; once the interval is
overdue the client reclaims its payment plus the bounty, and the rest of the stake is burned. The
trainer agent therefore trains the whole job into its store before it accepts (``pretrain``, on by
default) and refuses a job that diverges, by name; once accepted it posts from its store.

On the embedded chain, real contracts, the real trainer loop (``agents_cli._trainer_loop``, the
``vtrain trainer`` process minus its argument parsing), each node-clock wait passing 600 s.
"""

from __future__ import annotations

import json
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest

from protocol import agents_cli
from protocol.demo import create_job
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactStore, StepRecord
from protocol.trainer import TrainerAgent
from vtrain.commit.roots import interval_root
from vtrain.graph.executor import state_tensors
from vtrain.training.loop import train_steps
from vtrain.training.spec import TrainSpec

TERMS = Terms()
#: Two intervals of two steps; at lr 1e6 step 3 (interval 1) has no finite value at op 17 (MUL).
FINITE = TrainSpec(model="mlp", batch_size=16, steps=4, interval=2)
DIVERGING = replace(FINITE, optimizer=replace(FINITE.optimizer, lr=1e6))


@pytest.fixture(scope="module")
def contexts() -> dict[str, JobContext]:
    return {"finite": JobContext.of(FINITE), "diverging": JobContext.of(DIVERGING)}


@pytest.fixture
def node_clock(demo_world, monkeypatch: pytest.MonkeyPatch):
    """The loop's idle waits pass 600 s of chain time (an eth-tester chain has no clock of its own)."""
    chain = demo_world[0].chain
    monkeypatch.setattr(agents_cli, "time", types.SimpleNamespace(
        monotonic=time.monotonic, strftime=time.strftime, sleep=lambda _s: chain.advance_time(600)))


def _agent(world, ctx: JobContext, job: int, store: Path, **kw) -> tuple[TrainerAgent, list[int]]:
    """A trainer agent on ``store`` and the steps it trains (a spy on its training)."""
    proto, _, a = world
    agent = TrainerAgent(proto, a["trainer"], ctx, ArtifactStore(store), job)
    for k, v in kw.items():  # (set after: an agent without the field ignores it)
        setattr(agent, k, v)
    trained: list[int] = []
    train = agent._train

    def spy(state, first, last):  # noqa: ANN001, ANN202
        for o in train(state, first, last):
            trained.append(o.step)
            yield o

    agent._train = spy  # type: ignore[method-assign]
    return agent, trained


def _loop(agent: TrainerAgent, **kw) -> dict:
    params = tuple(agent.proto.chain.call(agent.proto.registry.functions.jobParams(agent.job_id)))
    out = agents_cli.Out.make("trainer", agent.job_id, events=False)
    return agents_cli._trainer_loop(agent, params, out, time.monotonic() + 120, 0.0, **kw)


def _result(capsys: pytest.CaptureFixture[str]) -> dict:
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == "result"][-1]


def _expire(proto, job: int) -> int:
    """Moves the chain past the job's accept deadline (the client may cancel); returns the deadline."""
    deadline = int(proto.chain.call(proto.registry.functions.acceptDeadline(job)))
    proto.chain.advance_time(max(1, deadline + 1 - proto.chain.now()))
    return deadline


def _wallet(world) -> tuple[int, int, int]:
    """The trainer's balance, nonce (transactions sent) and what the registry owes it."""
    proto, _, a = world
    w3, t = proto.chain.w3, a["trainer"]
    return (int(w3.eth.get_balance(t)), int(w3.eth.get_transaction_count(t)),
            int(proto.chain.call(proto.registry.functions.owed(t))))


def test_an_honest_trainer_never_stakes_on_a_job_that_diverges(demo_world, contexts, node_clock, tmp_path,
                                                               capsys) -> None:
    """Before: the trainer accepted (2 ETH staked), posted interval 0, stopped with NonFiniteValue at
    step 3 on every restart, and the client reclaimed its payment + 1 ETH of the stake (1 ETH burned).
    Now: it trains first, refuses by name, sends nothing; a restart refuses at once without training."""
    proto, _, a = demo_world
    ctx = contexts["diverging"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    before = _wallet(demo_world)
    agent, trained = _agent(demo_world, ctx, job, tmp_path)
    with pytest.raises(SystemExit) as done:
        _loop(agent)
    assert done.value.code == agents_cli.EXIT_REFUSED
    res = _result(capsys)
    assert res["refused"] == [f"step 3, op 17 (MUL): no finite value; not accepting job {job}"], res
    assert trained == [1, 2]  # interval 0 trained; step 3 has no finite value
    assert agent.status() == "open" and _wallet(demo_world) == before  # no stake, no gas, nothing owed

    again, trained = _agent(demo_world, ctx, job, tmp_path)  # started again: the recorded divergence
    with pytest.raises(SystemExit) as done:
        _loop(again)
    assert done.value.code == agents_cli.EXIT_REFUSED and trained == []
    assert _wallet(demo_world) == before
    # the client gets its payment back by cancelling once its offer expired; the trainer lost nothing
    _expire(proto, job)
    proto.chain.send(proto.registry.functions.cancelJob(job), a["client"], what="cancelJob")
    assert agent.status() == "cancelled" and _wallet(demo_world) == before


def test_an_accepted_job_that_diverges_stops_the_trainer_with_a_clear_error_once(demo_world, contexts, node_clock,
                                                                                  tmp_path) -> None:
    """With the policy off (``--no-pretrain``) the trainer stakes first; at step 3 it stops with a
    result naming the step and op (before: NonFiniteValue escaped the loop, and every restart trained
    the interval again to fail the same way); a restart stops at once, training nothing."""
    proto, _, a = demo_world
    ctx = contexts["diverging"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    agent, trained = _agent(demo_world, ctx, job, tmp_path, pretrain=False)
    res = _loop(agent)
    assert (res["ok"], res["error"], res["step"], res["op"], res["kind"]) == (False, "diverged", 3, 17, "MUL"), res
    assert res["posted"] == 1 and agent.status() == "active" and trained == [1, 2]

    again, trained = _agent(demo_world, ctx, job, tmp_path, pretrain=False)
    res = _loop(again)
    assert (res["error"], res["step"], res["op"], res["posted"]) == ("diverged", 3, 17, 0) and trained == []
    # what it costs (docs/security.md): the client reclaims once interval 1 is overdue
    proto.chain.advance_time(2 * TERMS.posting_period + 1)
    proto.chain.send(proto.registry.functions.reclaimJob(job), a["client"], what="reclaimJob")
    assert agent.status() == "fraudulent"


def test_a_restarted_trainer_resumes_its_pretraining_and_posts_from_its_store(demo_world, contexts, node_clock,
                                                                               tmp_path) -> None:
    """Stopped after interval 0 (a restart mid-pre-training), the next run trains only interval 1,
    accepts once, posts both intervals from its store without training, with the honest roots."""
    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    _, nonce0, _ = _wallet(demo_world)
    first, trained = _agent(demo_world, ctx, job, tmp_path)
    assert first.pretrain_job(stop=lambda: len(trained) >= 2) is False
    assert trained == [1, 2] and first.status() == "open" and _wallet(demo_world)[1] == nonce0

    agent, trained = _agent(demo_world, ctx, job, tmp_path)
    res = _loop(agent)
    assert res["ok"] and res["status"] == "finalized" and res["posted"] == 2, res
    assert trained == [3, 4]  # interval 0 kept; nothing trained after acceptance
    # acceptJob, two postInterval, finalize, withdraw: each sent once
    assert _wallet(demo_world)[1] - nonce0 == 5
    state = state_tensors(ctx.job.initial_state)
    outs = list(train_steps(ctx.job, state, 1, 4))
    for i in range(2):
        got = bytes(proto.chain.call(proto.registry.functions.getInterval(job, i))[0])
        assert got == interval_root([StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots)).leaf()
                                     for o in outs[2 * i: 2 * i + 2]])


def test_the_client_cannot_cancel_while_the_trainer_pretrains_within_the_offer(demo_world, contexts, node_clock,
                                                                              tmp_path) -> None:
    """The griefing the accept period stops: before, the client cancelled after the trainer's first
    step (its pre-training compute wasted, for free, as often as the client liked). Now cancelJob
    reverts until the accept deadline (CancelTooEarly, with the deadline); the trainer trains on,
    accepts."""
    from protocol.chain import Reverted

    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    deadline = int(proto.chain.call(proto.registry.functions.acceptDeadline(job)))
    agent, trained = _agent(demo_world, ctx, job, tmp_path)
    train = agent._train
    refused: list[str] = []

    def cancel_after_one_step(state, first, last):  # noqa: ANN001, ANN202
        for o in train(state, first, last):
            if o.step == 1:
                with pytest.raises(Reverted) as e:
                    proto.chain.send(proto.registry.functions.cancelJob(job), a["client"], what="cancelJob")
                refused.append(str(e.value))
            yield o

    agent._train = cancel_after_one_step  # type: ignore[method-assign]
    assert agent.accept(TERMS) and agent.status() == "active"
    assert trained == [1, 2, 3, 4] and len(refused) == 1
    assert f"CancelTooEarly({job}, {deadline}," in refused[0] and "firm until" in refused[0], refused


def test_the_trainer_stops_pretraining_when_the_offer_expires_and_the_client_cancels(
        demo_world, contexts, node_clock, tmp_path, capsys) -> None:
    """The accept deadline passes while the trainer pre-trains (slower than it estimated): it stops
    (acceptJob would revert), refuses by name with the times and sends nothing; the client cancels."""
    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    before = _wallet(demo_world)
    agent, trained = _agent(demo_world, ctx, job, tmp_path)
    train = agent._train

    def slow(state, first, last):  # noqa: ANN001, ANN202
        for o in train(state, first, last):
            if o.step == 1:
                _expire(proto, job)
            yield o

    agent._train = slow  # type: ignore[method-assign]
    with pytest.raises(SystemExit) as done:
        _loop(agent, status_every=0.0)
    assert done.value.code == agents_cli.EXIT_REFUSED
    (why,) = _result(capsys)["refused"]
    assert why.startswith(f"job {job} refused: accept deadline passed: job {job} could be accepted until"), why
    assert trained == [1] and agent.status() == "open" and _wallet(demo_world) == before
    proto.chain.send(proto.registry.functions.cancelJob(job), a["client"], what="cancelJob")
    assert agent.status() == "cancelled" and _wallet(demo_world) == before


def test_the_trainer_does_not_start_a_job_whose_offer_expires_before_it_could_train_it(
        demo_world, contexts, node_clock, tmp_path, capsys) -> None:
    """4 steps at --step-seconds 30 with the margin of 2 need 240 s; an offer of 200 s is refused
    before any step is trained, naming the figures; nothing is sent. Before: it trained and the
    client could cancel at the last second (or the acceptJob reverted)."""
    from protocol.policy import TermsPolicy

    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, replace(TERMS, accept_period=200))
    before = _wallet(demo_world)
    agent, trained = _agent(demo_world, ctx, job, tmp_path, policy=TermsPolicy("trainer", step_seconds=30.0))
    with pytest.raises(SystemExit) as done:
        _loop(agent)
    assert done.value.code == agents_cli.EXIT_REFUSED
    (why,) = _result(capsys)["refused"]
    left = int(proto.chain.call(proto.registry.functions.acceptDeadline(job))) - proto.chain.now()
    assert 0 < left <= 200
    assert f"accept deadline in {left} s (at " in why and "too soon: training the 4 steps left before accepting " \
        f"needs 2 x 4 x 30 s = 240 s (--step-seconds, --term-margin); not starting job {job}" in why, why
    assert trained == [] and _wallet(demo_world) == before
    # 120 s per step do fit a day's offer (the default): 2 x 4 x 120 = 960 s
    ok = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    fits, _ = _agent(demo_world, ctx, ok, tmp_path / "ok", policy=TermsPolicy("trainer", step_seconds=120.0))
    assert fits.refusals() == []


def test_a_restarted_trainer_does_not_send_acceptJob_again(demo_world, contexts, node_clock, tmp_path) -> None:
    """A restart after acceptJob was sent: before, ``accept`` sent it again (the job reading open
    while it was pending, or always with --no-pretrain) and it reverted, costing gas. Now the agent
    waits for its own pending transactions, reads the job and sends nothing for a job it accepted."""
    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    first, _ = _agent(demo_world, ctx, job, tmp_path, pretrain=False)
    assert first.accept(TERMS) and first.status() == "active"
    nonce = _wallet(demo_world)[1]
    again, trained = _agent(demo_world, ctx, job, tmp_path, pretrain=False)
    assert again.accept(TERMS) and _wallet(demo_world)[1] == nonce and trained == []

    # the acceptJob still pending when the restarted agent looks: it is mined while the agent waits
    job2 = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    agent, trained = _agent(demo_world, ctx, job2, tmp_path / "2")
    waited: list[str] = []

    def mined_meanwhile(sender: str, **_kw) -> bool:  # noqa: ANN003
        waited.append(sender)
        proto.chain.send(proto.registry.functions.acceptJob(job2), a["trainer"], value=TERMS.trainer_stake,
                         what="the acceptJob sent before the restart")
        return True

    proto.chain.wait_pending = mined_meanwhile  # type: ignore[method-assign]
    try:
        nonce = _wallet(demo_world)[1]
        assert agent.accept(TERMS) and agent.status() == "active"
    finally:
        del proto.chain.wait_pending
    assert waited == [a["trainer"]] and _wallet(demo_world)[1] == nonce + 1 and trained == []


def test_the_pretrained_roots_are_checked_once_while_their_files_are_unchanged(demo_world, contexts,
                                                                                tmp_path) -> None:
    """Before: every posting pass re-read the interval's records and checkpoints and re-hashed them
    (``pretrained_root``). Now the checked root is kept with the files' fingerprint: no checkpoint
    is read again until a file of the interval changes, then it is checked again."""
    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    agent, _ = _agent(demo_world, ctx, job, tmp_path)
    assert agent.pretrain_job()
    reads: list[int] = []
    load = agent._checkpoint
    agent._checkpoint = lambda i: reads.append(i) or load(i)  # type: ignore[method-assign]
    good = [agent.pretrained_root(i) for i in range(2)]
    assert all(good) and reads  # checked once (pre-training writes, it does not check)
    reads.clear()
    assert [agent.pretrained_root(i) for i in range(2)] == good and reads == []
    rec = tmp_path / str(job) / "steps" / "2.json"
    rec.write_text(json.dumps(json.loads(rec.read_text()), indent=1))  # the same record, other bytes
    assert agent.pretrained_root(0) == good[0] and reads  # checked again (its last record)
    reads.clear()
    assert agent.pretrained_root(1) == good[1] and reads  # interval 1 starts from step 2's state
    reads.clear()
    assert [agent.pretrained_root(i) for i in range(2)] == good and reads == []


def test_a_damaged_pretrained_interval_is_trained_again_not_posted(demo_world, contexts, tmp_path) -> None:
    """A pre-trained interval whose record, checkpoint or marker no longer matches is not posted
    from the store: ``pretrained_root`` refuses it and the interval is trained again."""
    proto, _, a = demo_world
    ctx = contexts["finite"]
    job = create_job(proto, a["client"], a["trainer"], ctx, TERMS)
    agent, trained = _agent(demo_world, ctx, job, tmp_path)
    assert agent.pretrain_job() and trained == [1, 2, 3, 4]
    good = [agent.pretrained_root(i) for i in range(2)]
    assert all(good)
    (tmp_path / str(job) / "steps" / "3.json").unlink()
    assert agent.pretrained_root(1) is None and agent.pretrained_root(0) == good[0]
    marker = tmp_path / str(job) / "local" / "pretrain" / "0"
    marker.write_text(marker.read_text().replace(good[0].hex(), "00" * 32))
    assert agent.pretrained_root(0) is None
    assert agent.pretrain_job() and trained == [1, 2, 3, 4, 1, 2, 3, 4]
    assert [agent.pretrained_root(i) for i in range(2)] == good


def test_the_cli_offers_the_pretraining_and_policy_flags() -> None:
    from click.testing import CliRunner

    trainer = CliRunner().invoke(agents_cli.agents_main, ["trainer", "--help"], terminal_width=200)
    assert trainer.exit_code == 0
    assert "--pretrain / --no-pretrain" in trainer.output and "--step-seconds" in trainer.output
    auditor = CliRunner().invoke(agents_cli.agents_main, ["auditor", "--help"], terminal_width=200)
    assert "--min-read-rate" in auditor.output


def test_the_cli_passes_step_seconds_and_min_read_rate_on(monkeypatch, tmp_path) -> None:
    """``--step-seconds`` reaches the trainer's TermsPolicy, ``--min-read-rate`` the auditor's HTTP
    reader (both made before the node is contacted)."""
    import click
    from click.testing import CliRunner

    import protocol.policy
    import protocol.store

    made: dict[str, dict] = {}

    def spy(name: str):
        def make(*args, **kw):  # noqa: ANN002, ANN003, ANN202
            made[name] = kw
            raise click.ClickException("stop here")
        return make

    monkeypatch.setattr(protocol.policy, "TermsPolicy", spy("policy"))
    monkeypatch.setattr(protocol.store, "HttpArtifactReader", spy("reader"))
    spec = tmp_path / "spec.json"
    spec.write_text(FINITE.to_json())
    base = ["--rpc", "http://127.0.0.1:9", "--deployment", str(tmp_path / "d.json"), "--job", "1", "--spec", str(spec)]
    r = CliRunner().invoke(agents_cli.agents_main, ["trainer", *base, "--store", str(tmp_path / "s"),
                                                    "--step-seconds", "7.5"])
    assert "stop here" in r.output and made["policy"]["step_seconds"] == 7.5, r.output
    r = CliRunner().invoke(agents_cli.agents_main, ["auditor", *base, "--store-url", "http://127.0.0.1:9",
                                                    "--min-read-rate", "65536"])
    assert "stop here" in r.output and made["reader"]["min_rate"] == 65536.0, r.output
