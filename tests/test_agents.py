"""Agent behaviour beyond the happy path: sampled auditing, bad artifacts, wrong specs, restarts."""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace

import pytest

from protocol.auditor import AuditorAgent
from protocol.chain import Chain, ChainError
from protocol.cheats import PoisonSample
from protocol.demo import create_job, default_spec
from protocol.deploy import deploy
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactStore
from protocol.trainer import TrainerAgent

TERMS = Terms()


@pytest.fixture(scope="module")
def world():
    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    with tempfile.TemporaryDirectory() as d:
        yield proto, ArtifactStore(d), a


def _job(world, cheat=None):
    proto, store, a = world
    ctx = JobContext.of(default_spec("mlp"))
    job = create_job(proto, a[1], a[2], ctx, TERMS)
    trainer = TrainerAgent(proto, a[2], ctx, store, job, cheat=cheat)
    trainer.accept(TERMS)
    while trainer.run_interval() is not None:
        pass
    return ctx, job, trainer


def test_sampled_auditor_starts_from_a_checked_checkpoint_and_still_catches_the_cheat(world) -> None:
    proto, store, a = world
    ctx, job, _ = _job(world, cheat=PoisonSample(6))
    auditor = AuditorAgent(proto, a[3], ctx, store, job)
    auditor._sampled = lambda i: i == 1  # skip interval 0, replay interval 1 only
    assert auditor.audit() == 1
    assert auditor.skipped == [0]


def test_sampled_auditor_rejects_a_checkpoint_that_is_not_the_committed_state(world, tmp_path) -> None:
    proto, store, a = world
    ctx, job, _ = _job(world)
    # a second store where the checkpoint of interval 1 was swapped for the initial state
    bad = ArtifactStore(tmp_path)
    for s in range(1, ctx.spec.steps + 1):
        bad.put_step(job, store.get_step(job, s))
        bad.put_log(job, s, store.get_log(job, s))
    bad.put_checkpoint(job, 0, store.get_checkpoint(job, 0))
    bad.put_checkpoint(job, 1, store.get_checkpoint(job, 0))
    auditor = AuditorAgent(proto, a[3], ctx, bad, job)
    auditor._sampled = lambda i: i == 1
    assert auditor.audit() is None  # reported as unavailable, never a challenge
    u = auditor.unavailable[1]
    assert (u.artifact, u.key, u.error) == ("checkpoint", 1, "NotCommitted") and u.sha256
    assert "expected the state committed at step 4" in u.reason
    assert auditor.disputed == [] and not auditor.signed_off()


def test_auditor_refuses_a_spec_the_job_does_not_commit_to(world) -> None:
    proto, store, a = world
    ctx, job, _ = _job(world)
    other = JobContext.of(default_spec("mlp").__class__(model="mlp", batch_size=16, steps=8, interval=4, seed=7))
    with pytest.raises(ChainError, match="different"):
        AuditorAgent(proto, a[3], other, store, job)


def test_a_restarted_auditor_resumes_the_game_from_the_chain(world) -> None:
    proto, store, a = world
    ctx, job, trainer = _job(world, cheat=PoisonSample(6))
    first = AuditorAgent(proto, a[3], ctx, store, job)
    bad = first.audit()
    gid = first.challenge(bad, TERMS)
    for _ in range(6):  # a few moves, then the auditor "crashes"
        trainer.play()
        first.play()
    restarted = AuditorAgent(proto, a[3], ctx, store, job)
    assert restarted.audit() == bad  # replays from scratch, same verdict
    restarted.disputed.append(gid)
    for _ in range(200):
        trainer.play()
        restarted.play()
        if restarted.player.view(gid).status != 1:
            break
    assert restarted.player.view(gid).status == 3  # challenger won


def test_job_event_searches_start_at_the_job_on_each_chain_of_their_own() -> None:
    """Two chains can hold the registry at one address, with job 1 created at different blocks:
    each deployment finds its own job's block (a cache shared across chains would hide events)."""
    from protocol.agent import job_first_block

    ctx = JobContext.of(default_spec("mlp"))
    blocks = []
    for padding in (5, 0):
        chain = Chain.connect(None)
        a = chain.accounts()
        proto = deploy(chain, a[0])
        for _ in range(padding):  # move job 1 to a later block on the first chain
            chain.w3.eth.send_transaction({"from": a[0], "to": a[9], "value": 1})
        job = create_job(proto, a[1], a[2], ctx, TERMS)
        blocks.append((proto.registry.address, job, job_first_block(proto, job), chain.w3.eth.block_number))
    (addr_a, job_a, first_a, head_a), (addr_b, job_b, first_b, head_b) = blocks
    assert addr_a == addr_b and job_a == job_b == 1
    assert first_a == head_a and first_b == head_b and first_b == first_a - 5


# -- refusing jobs: terms shorter than the agent can answer within, un-rulable specs ---------------


def _open_job(world, terms: Terms, spec=None):
    """A job created (not accepted) with ``terms``, and a trainer agent with the default policy."""
    proto, store, a = world
    ctx = JobContext.of(spec or default_spec("mlp"))
    job = create_job(proto, a[1], a[2], ctx, terms)
    return ctx, job, TrainerAgent(proto, a[2], ctx, store, job)


@pytest.mark.parametrize(
    "terms,reason",
    [
        (replace(TERMS, clock=120), r"clock 120 s is shorter than this trainer needs: 2 x \d+ moves x 15 s"),
        (replace(TERMS, posting_period=1_000), r"posting period 1000 s is shorter than this trainer needs"),
        (replace(TERMS, trainer_stake=11 * TERMS.payment), r"stake \d+ wei is more than 10 x the payment"),
    ],
    ids=["short-clock", "short-posting-period", "stake-ratio"],
)
def test_trainer_refuses_terms_it_cannot_safely_answer_within(world, terms, reason) -> None:
    """The registry accepts these terms (above the deployment's floors); the trainer, which needs
    15 s a move and 600 s an interval with a margin of 2, declines before staking anything."""
    from protocol.policy import JobRefused

    ctx, job, trainer = _open_job(world, terms)
    assert trainer.refusals() and re.search(reason, "; ".join(trainer.refusals()))
    with pytest.raises(JobRefused, match=reason):
        trainer.accept(terms)
    assert trainer.status() == "open"  # nothing was sent
    # With what it needs configured lower (a fast machine on a fast chain), it accepts.
    from protocol.policy import TermsPolicy

    fast = TrainerAgent(trainer.proto, trainer.account, ctx, trainer.store, job,
                        policy=TermsPolicy("trainer", move_seconds=1, interval_seconds=60, max_stake_ratio=20))
    fast.accept(terms)
    assert fast.status() == "active"


def test_trainer_refuses_a_job_the_chain_cannot_rule_on(world) -> None:
    """Batch 70,000 on the MLP: 70,000-term weight-gradient reductions (the graph is built, nothing
    is trained). An honest trainer would lose any game that reaches them, so it does not stake."""
    from protocol.policy import JobRefused

    spec = replace(default_spec("mlp"), batch_size=70_000)
    _, job, trainer = _open_job(world, TERMS, spec)
    with pytest.raises(JobRefused, match=r"the chain cannot rule on this job: op \d+ \((MATMUL|SUM|MEAN)\): a "
                       r"reduction of [\d,]+ terms, more than the chunk level's limit of 65,536"):
        trainer.accept(TERMS)
    assert trainer.status() == "open"


def test_the_auditor_policy_refuses_a_window_too_short_to_replay_in(world) -> None:
    from protocol.agents_cli import job_refusals
    from protocol.policy import TermsPolicy

    proto, _, _ = world
    ctx, job, _ = _open_job(world, replace(TERMS, challenge_window=900))
    policy = TermsPolicy("auditor")  # 600 s to replay an interval, margin 2
    (why,) = job_refusals(proto, job, ctx, policy)
    assert why.startswith("challenge window 900 s is shorter than this auditor needs") and "1200 s" in why
    assert job_refusals(proto, job, ctx, replace(policy, replay_seconds=400)) == []


def test_the_auditor_policy_refuses_a_posting_period_shorter_than_its_replay(world) -> None:
    """Windows follow the posting schedule (interval i's closes no earlier than acceptedAt + i x
    postingPeriod + challengeWindow): an auditor that replays an interval slower than the terms
    post them falls further behind every interval, so it declines such a job."""
    from protocol.agents_cli import job_refusals
    from protocol.policy import TermsPolicy

    proto, _, _ = world
    ctx, job, _ = _open_job(world, replace(TERMS, posting_period=1_000, challenge_window=3_600))
    policy = TermsPolicy("auditor")  # 600 s to replay an interval, margin 2
    (why,) = job_refusals(proto, job, ctx, policy)
    assert why.startswith("posting period 1000 s is shorter than this auditor needs to replay an interval")
    assert "2 x 600 s = 1200 s" in why and "--replay-seconds" in why
    assert job_refusals(proto, job, ctx, replace(policy, replay_seconds=500)) == []


def test_game_moves_bound_grows_with_the_trees_of_the_job() -> None:
    from protocol.policy import FIXED_MOVES, game_moves

    ctx = JobContext.of(default_spec("mlp"))
    g = ctx.job.graph
    base = game_moves(g, 4)
    assert base > FIXED_MOVES + 2 + (g.n_ops - 1).bit_length() - 1
    assert game_moves(g, 8) == base + 1 and game_moves(g, 1) == base - 2


def test_agents_compute_on_their_device(world, monkeypatch) -> None:
    """``device`` reaches every step the agents run: the trainer's training and the auditor's checked
    replays build their executors on it (here ``cpu``, spied; the same graph, logs and roots on any
    device: tests/test_executor.py)."""
    import vtrain.training.loop as L

    seen: list[str | None] = []
    make = L.executor_for
    monkeypatch.setattr(L, "executor_for",
                        lambda job, mode, device=None: (seen.append(device), make(job, mode, device))[1])
    proto, store, a = world
    ctx = JobContext.of(default_spec("mlp"))
    job = create_job(proto, a[1], a[2], ctx, TERMS)
    trainer = TrainerAgent(proto, a[2], ctx, store, job, device="cpu")
    trainer.accept(TERMS)
    assert trainer.run_interval() is not None
    assert seen and set(seen) == {"cpu"}
    seen.clear()
    auditor = AuditorAgent(proto, a[3], ctx, store, job, device="cpu")
    auditor.audit()
    assert seen and set(seen) == {"cpu"}


def test_a_data_parallel_span_runs_its_ranks_on_its_device(monkeypatch) -> None:
    """``train_span`` (the trainer agent's ``nproc > 1``) hands its device to every rank's worker."""
    import vtrain.distributed.launch as launch
    from vtrain.graph.executor import state_tensors

    got: dict = {}

    def fake(run, nproc, **kw):
        got.update(kw, nproc=nproc)
        raise RuntimeError("stop after the launch call")

    monkeypatch.setattr(launch, "launch", fake)
    ctx = JobContext.of(default_spec("mlp"))
    with pytest.raises(RuntimeError, match="stop after"):
        next(launch.train_span(ctx.job, state_tensors(ctx.job.initial_state), 1, 1, 2, "cuda:1"))
    assert got["device"] == "cuda:1" and got["nproc"] == 2
