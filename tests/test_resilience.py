"""Agent resilience: RPC outages (retried with backoff, then a clear error), replies lost in
transit (a transaction is never sent twice), and agents killed (SIGKILL) at seeded random points
and restarted with the same state (the game still ends with the right winner and balances).

Fast tests use a tiny fake JSON-RPC server behind :class:`nodes.FlakyProxy`; the rest run on anvil
(`@pytest.mark.node`), the kill-and-restart trials also `@pytest.mark.slow`."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_report import record

import nodes
from protocol.chain import Chain, ChainError, RpcUnavailable

REPO = Path(__file__).resolve().parent.parent
ACCOUNTS = ["0x" + f"{i:040x}" for i in range(1, 6)]


class _FakeNode(http.server.BaseHTTPRequestHandler):
    """Answers eth_accounts / eth_chainId / eth_blockNumber; counts requests."""

    calls: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(body["method"])
        result = {"eth_accounts": ACCOUNTS, "eth_chainId": "0x7a69", "eth_blockNumber": "0x10"}.get(body["method"])
        reply = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_node() -> Iterator[str]:
    handler = type("Handler", (_FakeNode,), {"calls": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _fast(url: str, **kw: float) -> Chain:
    return Chain.http(url, 2.0, **{"retries": 50, "backoff": 0.05, "max_wait": 0.2, "deadline": 10.0, **kw})


def test_backoff_is_exponential_capped_and_jittered() -> None:
    c = Chain.http("http://127.0.0.1:1", retries=7, backoff=0.25, max_wait=5.0)
    assert c.waits() == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    slept: list[float] = []
    c.rng = random.Random(1)
    tries = iter(range(100))

    def flaky() -> str:
        if next(tries) < 5:
            raise ConnectionError("connection refused")
        return "ok"

    real_sleep = time.sleep
    try:
        time.sleep = slept.append  # type: ignore[assignment]
        assert c._retry("probe", flaky) == "ok"
    finally:
        time.sleep = real_sleep  # type: ignore[assignment]
    assert len(slept) == 5
    for got, cap in zip(slept, c.waits(), strict=False):
        assert cap / 2 <= got <= cap  # jitter within [cap/2, cap]
    assert len({round(s / c, 6) for s, c in zip(slept, c.waits(), strict=False)}) > 1  # not a fixed fraction


def test_short_outage_is_survived(fake_node: str) -> None:
    with nodes.FlakyProxy.to(fake_node) as proxy:
        chain = _fast(proxy.url)
        assert chain.accounts() == ACCOUNTS
        proxy.down_for(0.8)
        t0 = time.monotonic()
        assert chain.accounts() == ACCOUNTS  # retried through the outage
        waited = time.monotonic() - t0
        assert proxy.refused >= 1
    assert 0.6 < waited < 5.0
    record("crash_restart", "rpc short outage (fake node)", True, waited=round(waited, 2), refused=proxy.refused)


def test_dead_endpoint_fails_clearly_within_the_deadline() -> None:
    url = f"http://127.0.0.1:{nodes.free_port()}"
    chain = _fast(url, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(RpcUnavailable) as e:
        chain.accounts()
    took = time.monotonic() - t0
    assert took < 3.0
    msg = str(e.value)
    assert url in msg and "unreachable" in msg and "tries over" in msg and e.value.url == url
    assert e.value.tries >= 3  # it did retry
    # a small retry budget ends it sooner
    with pytest.raises(RpcUnavailable, match="1 tries"):
        _fast(url, retries=0).accounts()


@pytest.mark.parametrize("url", ["localhost:8545", "http://", "http://host:99999", "ftp://x", "http://[::1"])
def test_malformed_rpc_url_is_refused_before_any_request(url: str) -> None:
    with pytest.raises(ChainError, match="malformed|expected"):
        Chain.http(url)


def test_agent_started_against_a_dead_url_exits_with_a_message(tmp_path: Path) -> None:
    spec, dep, url = nodes.dead_endpoint_files(tmp_path)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "protocol.agents_cli", "trainer", "--rpc", url, "--rpc-deadline", "1",
                        "--deployment", str(dep), "--spec", str(spec), "--job", "1", "--store", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and url in p.stderr and "unreachable" in p.stderr
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "s").exists()  # nothing created for a run that never started


# -- on anvil ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anvil_url() -> Iterator[str]:
    with nodes.start_anvil() as node:
        yield node.url


@pytest.mark.node
def test_lost_reply_to_a_transaction_is_not_sent_twice(anvil_url: str) -> None:
    """The node receives a transaction, the reply is lost: the client finds the mined transaction by
    its nonce instead of sending it again (which would be a second transfer)."""
    with nodes.FlakyProxy.to(anvil_url) as proxy:
        chain = _fast(proxy.url)
        a, b = chain.accounts()[6:8]
        bal_b = chain.w3.eth.get_balance(b)
        nonce = chain.w3.eth.get_transaction_count(a)
        proxy.drop_response_to(b"eth_sendTransaction")

        class Transfer:  # the shape of a contract function that Chain.send expects
            fn_name = "transfer"

            def transact(self, params: dict) -> bytes:
                return chain.w3.eth.send_transaction({**params, "to": b})

        receipt = chain.send(Transfer(), a, value=10**15, gas=21_000, what="transfer")
        assert len(proxy.dropped) == 1  # the reply to the first send was really lost
        assert receipt["status"] == 1
        assert chain.w3.eth.get_transaction_count(a) == nonce + 1  # exactly one transaction
        assert chain.w3.eth.get_balance(b) - bal_b == 10**15
    record("crash_restart", "lost reply to eth_sendTransaction", True)


# -- corrupt or truncated artifacts (embedded chain, artifacts over HTTP) -----------------------------


@pytest.fixture(scope="module")
def posted(tmp_path_factory: pytest.TempPathFactory):
    """An honest job, every interval posted, its artifacts in a store folder."""
    from protocol.demo import create_job, default_spec
    from protocol.deploy import deploy
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(default_spec("mlp"))
    job = create_job(proto, a[1], a[2], ctx, Terms())
    root = tmp_path_factory.mktemp("good")
    trainer = TrainerAgent(proto, a[2], ctx, ArtifactStore(root), job)
    trainer.accept(Terms())
    while trainer.run_interval() is not None:
        pass
    return proto, ctx, job, root, a


def _ref_path(store_root: Path, job: int, kind: str, n: int) -> Path:
    ref = json.loads((store_root / str(job) / kind / f"{n}.json").read_text())
    return store_root / str(job) / "objects" / ref["digest"][2:]


def _other_log(ctx, step: int) -> bytes:
    """A well-formed log of ``step`` for another seed: decodes fine, is not what was committed."""
    import numpy as np

    from protocol.jobs import JobContext
    from vtrain.graph.executor import state_tensors
    from vtrain.graph.step_graph import OpKind
    from vtrain.numerics.logfile import encode_step_log
    from vtrain.numerics.rounding import OpLog
    from vtrain.training.loop import train_steps
    from vtrain.training.spec import TrainSpec

    other = JobContext.of(TrainSpec.from_dict({**ctx.spec.to_dict(), "seed": 99}))
    state = state_tensors(other.job.initial_state)
    out = None
    for o in train_steps(other.job, state, 1, step):
        out = o
    lg = out.log
    if not lg.n_entries:  # the demo MLP's logs are usually empty (exact-grid sums), hence all alike
        mm = next(op.id for op in ctx.job.graph.ops if op.kind == OpKind.MATMUL)
        lg.sparse[mm] = OpLog(np.array([0], np.int64), np.array([1], np.uint8), np.zeros(1, np.float32))
    return encode_step_log(lg, step, ctx.job.graph)


def _damage(kind: str, root: Path, job: int, ctx) -> str:
    """Damage one artifact of the store at ``root``; returns what the error must mention."""
    from protocol.store import ArtifactStore

    if kind == "truncated log":
        p = _ref_path(root, job, "logs", 2)
        p.write_bytes(p.read_bytes()[:-7])
        return p.name  # the expected digest
    if kind == "bit-flipped log":
        p = _ref_path(root, job, "logs", 3)
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x10
        p.write_bytes(bytes(b))
        return p.name
    if kind == "substituted log":  # index and object agree, but it is not the committed log
        (root / str(job) / "logs" / "2.json").unlink()
        ArtifactStore(root).put_log(job, 2, _other_log(ctx, 2))
        return "expected entries hashing to the committed logRoot_2"
    if kind == "garbled step record":
        p = root / str(job) / "steps" / "1.json"
        p.write_text(p.read_text()[:40])
        return "steps/1.json"
    if kind == "truncated checkpoint":
        p = _ref_path(root, job, "checkpoints", 1)
        p.write_bytes(p.read_bytes()[:100])
        return p.name
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["substituted log"] + [pytest.param(k, marks=pytest.mark.slow) for k in (
    "truncated log", "bit-flipped log", "garbled step record", "truncated checkpoint")])
def test_auditor_rejects_a_corrupt_artifact_and_recovers_with_a_good_copy(posted, tmp_path: Path, kind: str,
                                                                          caplog) -> None:
    """Served over HTTP, a damaged artifact is detected and reported as unavailable (named, with its
    expected hash), never used: the auditor neither signs the interval off nor challenges it. Once
    the server has a correct copy again, the same auditor (same caching reader) verifies every interval."""
    import shutil

    from protocol.agents_cli import caching_reader
    from protocol.auditor import AuditorAgent
    from protocol.store import HttpArtifactReader, serve_store

    proto, ctx, job, good, a = posted
    bad = tmp_path / "store"
    shutil.copytree(good, bad)
    mention = _damage(kind, bad, job, ctx)
    server, url = serve_store(bad)
    try:
        auditor = AuditorAgent(proto, a[3], ctx, caching_reader(HttpArtifactReader(url, retries=0)), job)
        if kind == "truncated checkpoint":
            auditor._sampled = lambda i: i == 1  # start interval 1 from the trainer's checkpoint
        for _ in range(2):  # asked again: still rejected (nothing corrupt was kept)
            assert auditor.audit() is None  # no challenge on an artifact that does not verify
            (why,) = auditor.unavailable.values()
            assert mention in str(why), str(why)
            assert not auditor.signed_off()
        assert auditor.verified == (1 if kind == "truncated checkpoint" else 0)  # nothing signed off
        assert auditor.disputed == []
        shutil.rmtree(bad)
        shutil.copytree(good, bad)  # the trainer serves a correct copy again
        assert auditor.audit() is None  # no challenge: every interval replays to its posted root
        assert auditor.verified == ctx.n_intervals and auditor.signed_off()
    finally:
        server.shutdown()
        server.server_close()
    record("crash_restart", f"corrupt artifact: {kind}", True)


@pytest.mark.slow
def test_trainer_repairs_its_own_damaged_store(posted, tmp_path: Path) -> None:
    """A trainer restarted on a damaged store regenerates exactly what was committed."""
    import shutil

    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    proto, ctx, job, good, a = posted
    bad = tmp_path / "store"
    shutil.copytree(good, bad)
    _damage("truncated log", bad, job, ctx)
    _damage("truncated checkpoint", bad, job, ctx)
    (bad / str(job) / "steps" / "6.json").unlink()
    store = ArtifactStore(bad)
    trainer = TrainerAgent(proto, a[2], ctx, store, job)
    assert trainer.repair() == [0, 1]
    ref = ArtifactStore(good)
    for s in range(1, ctx.spec.steps + 1):
        assert store.get_log(job, s) == ref.get_log(job, s) and store.get_step(job, s) == ref.get_step(job, s)
    assert store.get_checkpoint(job, 1) == ref.get_checkpoint(job, 1)
    assert trainer.repair() == []


# -- agents killed (SIGKILL) at seeded random points and restarted, on anvil -----------------------


@dataclasses.dataclass(frozen=True)
class Trial:
    """Kill ``role`` at ``point`` (``k`` drawn from ``Random(seed)``), restart it with the same
    arguments (same state directory), and expect the scenario's outcome."""

    name: str
    scenario: str  # "cheat" (poison-sample), "honest", "false" (false challenger)
    role: str  # "trainer", "auditor" or "both": the process(es) killed
    point: str  # "moves": after k on-chain moves of the game; "training": after k step records;
    #             "between-posts": once interval 0 is posted; "audit": k/10 s after interval 0 is posted
    seed: int
    kills: int = 1


TRIALS = [
    Trial("trainer killed mid-game", "cheat", "trainer", "moves", 11),
    Trial("auditor killed mid-game", "cheat", "auditor", "moves", 12),
    Trial("trainer killed mid-training", "cheat", "trainer", "training", 13),
    Trial("honest trainer killed between interval posts", "honest", "trainer", "between-posts", 14),
    Trial("false challenger killed mid-game", "false", "auditor", "moves", 15),
    Trial("trainer killed twice mid-game vs a false challenger", "false", "trainer", "moves", 16, kills=2),
    Trial("auditor killed while auditing", "cheat", "auditor", "audit", 17),
    Trial("both agents killed mid-game", "cheat", "both", "moves", 18),
]

#: Expected (verdict, final status, ETH moved per role, in units of 0.01 ETH; gas is below that).
#: A cheat: the trainer's 2 ETH stake is lost, half to the auditor (the bounty), half burned.
EXPECTED = {
    "cheat": ("challenger won", "fraudulent", {"client": 0, "trainer": -200, "auditor": 100}),
    "honest": ("no dispute", "finalized", {"client": -100, "trainer": 100, "auditor": 0}),
    "false": ("trainer won", "finalized", {"client": -100, "trainer": 150, "false_challenger": -50}),
}


@pytest.fixture(scope="module")
def node_demo(anvil_url: str, tmp_path_factory: pytest.TempPathFactory):
    from protocol.multiproc import ProcessDemo

    return ProcessDemo.setup(anvil_url, tmp_path_factory.mktemp("resilience"), lambda line: None)


def _failed_txs(sc, address: str) -> list[str]:
    """Transactions of ``address`` in this scenario's blocks that reverted (a double post or a
    repeated move would revert)."""
    w3 = sc.chain.w3
    bad = []
    for b in range(sc._from_block, int(w3.eth.block_number) + 1):
        for t in w3.eth.get_block(b, full_transactions=True)["transactions"]:
            if str(t["from"]).lower() == address.lower() and w3.eth.get_transaction_receipt(t["hash"])["status"] != 1:
                bad.append(t["hash"].hex())
    return bad


def _kill_point(sc, trial: Trial, rng: random.Random, nth: int) -> dict:
    """Wait for the trial's kill point; returns what was drawn."""
    if trial.point == "moves":
        k = rng.randint(1, 8) + 4 * nth  # a later kill comes after more moves
        sc.wait_until(lambda: bool(sc.games()) and sc.game_cost(sc.games()[0])[0] >= k, timeout=150, poll=0.05)
        return {"k_moves": k}
    if trial.point == "training":
        k = rng.randint(1, sc.ctx.spec.steps - 1)
        steps = sc.work / f"store-{sc.job}" / str(sc.job) / "steps"
        sc.wait_until(lambda: steps.is_dir() and len(list(steps.glob("*.json"))) >= k, timeout=150, poll=0.02)
        return {"k_steps": k}
    posted = lambda: int(sc.chain.call(sc.proto.registry.functions.getJob(sc.job))[4]) >= 1  # noqa: E731
    sc.wait_until(posted, timeout=150, poll=0.02)
    if trial.point == "audit":
        delay = rng.randint(0, 15) / 10
        time.sleep(delay)
        return {"delay_s": delay}
    return {}


def run_trial(demo, trial: Trial) -> None:
    rng = random.Random(trial.seed)
    roles = ["trainer", "auditor"] if trial.role == "both" else [trial.role]
    sc = demo.scenario(trial.name, "poison-sample" if trial.scenario == "cheat" else None,
                       trial.scenario == "false", lambda line: None, timeout=240)
    sc.create_job()
    drawn: list[dict] = []
    try:
        sc.start("trainer")
        sc.start("auditor")
        for nth in range(trial.kills):
            drawn.append(_kill_point(sc, trial, rng, nth))
            for role in roles:
                sc.kill(role)
            time.sleep(rng.uniform(0, 1.0))  # down for a moment (far less than a chess clock)
            for role in roles:
                sc.start(role)
        res = sc.finish()
    finally:
        sc.close()
    verdict, status, moved = EXPECTED[trial.scenario]
    accts = sc.accounts
    delta = {k: round((sc.chain.w3.eth.get_balance(accts[k]) - sc._balances0[k]) / 1e16) for k in moved}
    failed = {r: _failed_txs(sc, accts[r]) for r in ("trainer", "false_challenger" if trial.scenario == "false"
                                                      else "auditor")}
    posts = sc.proto.registry.events.IntervalPosted.get_logs(from_block=sc._from_block,
                                                             argument_filters={"job": sc.job})
    timeouts = [why for why, _ in sc.advances if "chess clock" in why]
    ok = ((res.verdict, res.final_status) == (verdict, status) and delta == moved
          and not any(failed.values()) and len(posts) == sc.ctx.n_intervals and not timeouts)
    record("crash_restart", trial.name, ok, seed=trial.seed, role=trial.role, point=trial.point, drawn=drawn,
           verdict=res.verdict, status=res.final_status, moves=res.moves, eth_moved_cents=delta,
           failed_txs=sum(map(len, failed.values())), restarts=trial.kills)
    assert (res.verdict, res.final_status) == (verdict, status), trial
    assert delta == moved, (trial, delta)  # the right party paid, nobody lost funds to the restart
    assert not any(failed.values()), failed  # never a double post or a repeated move
    assert len(posts) == sc.ctx.n_intervals  # each interval posted exactly once
    assert timeouts == []  # the restarted agent moved before its chess clock ran out
    for role in roles:
        runs = [r for r in sc.runs if r.role == role]
        assert len(runs) == trial.kills + 1 and runs[-1].result["ok"]


@pytest.mark.node
@pytest.mark.slow
@pytest.mark.parametrize("trial", TRIALS, ids=[t.name.replace(" ", "-") for t in TRIALS])
def test_agent_killed_at_a_seeded_point_and_restarted(node_demo, trial: Trial) -> None:
    run_trial(node_demo, trial)


@pytest.mark.node
@pytest.mark.slow
def test_agents_survive_an_rpc_outage_mid_game(node_demo) -> None:
    """Both agents talk to the node through a proxy that goes down for 3 s in the middle of the
    game: they retry with backoff and the game ends as it should."""
    with nodes.FlakyProxy.to(node_demo.rpc) as proxy:
        demo = dataclasses.replace(node_demo, rpc=proxy.url)
        sc = demo.scenario("rpc outage", "poison-sample", False, lambda line: None, timeout=240)
        sc.create_job()
        try:
            sc.start("trainer")
            sc.start("auditor")
            sc.wait_until(lambda: bool(sc.games()) and sc.game_cost(sc.games()[0])[0] >= 4, timeout=150, poll=0.05)
            proxy.down_for(3.0)
            res = sc.finish()
        finally:
            sc.close()
    ok = (res.verdict, res.final_status) == ("challenger won", "fraudulent") and proxy.refused > 0
    record("crash_restart", "rpc outage of 3 s mid-game", ok, refused=proxy.refused, moves=res.moves)
    assert (res.verdict, res.final_status) == ("challenger won", "fraudulent")
    assert proxy.refused > 0  # the agents really hit the outage
    assert [r.role for r in sc.runs] == ["trainer", "auditor"]  # nobody crashed


class _NoReads:
    """A reader that must not be used (a resumed auditor has nothing to fetch again)."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the resumed auditor read the trainer's store ({name})")


def test_auditor_resumes_from_its_state_dir_and_distrusts_a_damaged_one(posted, tmp_path: Path) -> None:
    from protocol.agents_cli import caching_reader
    from protocol.auditor import AuditorAgent
    from protocol.store import ArtifactStore

    proto, ctx, job, good, a = posted
    state = ArtifactStore(tmp_path / "state")
    first = AuditorAgent(proto, a[3], ctx, ArtifactStore(good), job, state=state)
    assert first.audit() is None and first.verified == ctx.n_intervals
    resumed = AuditorAgent(proto, a[3], ctx, _NoReads(), job, state=state)  # type: ignore[arg-type]
    assert resumed.verified == ctx.n_intervals and resumed.audit() is None
    assert resumed.book.records == first.book.records
    last = ctx.spec.steps
    assert all(torch_equal(x, y) for x, y in zip(resumed._states[last], first._states[last], strict=True))
    # a damaged saved state is not trusted: the auditor replays from the trainer's artifacts instead
    ckpt = _ref_path(tmp_path / "state", job, "checkpoints", 1)
    ckpt.write_bytes(ckpt.read_bytes()[:-9])
    again = AuditorAgent(proto, a[3], ctx, caching_reader(ArtifactStore(good)), job, state=state)
    assert again.verified == 0
    assert again.audit() is None and again.verified == ctx.n_intervals
    record("crash_restart", "auditor resumes from its state dir", True)


def torch_equal(x, y) -> bool:
    import torch

    return bool(torch.equal(x, y))


def test_agent_loop_outlives_a_long_outage_until_its_own_timeout() -> None:
    from protocol.agents_cli import Out, through_outages

    out = Out.make("trainer", 1, events=False)
    calls = []

    def loop() -> dict:
        calls.append(1)
        if len(calls) < 3:
            raise RpcUnavailable("http://127.0.0.1:9", "eth_blockNumber", 9, 60.0, ConnectionError("refused"))
        return {"ok": True}

    assert through_outages(loop, out, time.monotonic() + 60) == {"ok": True} and len(calls) == 3
    calls.clear()
    with pytest.raises(RpcUnavailable, match=r"http://127.0.0.1:9 unreachable: 9 tries over 60.0 s"):
        through_outages(loop, out, time.monotonic() - 1)  # past --timeout: the error ends the agent


def test_a_node_that_is_not_there_at_start_up_is_reported_within_seconds() -> None:
    url = f"http://127.0.0.1:{nodes.free_port()}"
    chain = Chain.http(url, backoff=0.05, max_wait=0.1)
    assert chain.deadline == 60.0  # a request mid-run waits out an outage of up to a minute
    t0 = time.monotonic()
    with pytest.raises(RpcUnavailable, match=url):
        chain.first_contact(deadline=0.5)  # the first contact gives up much sooner (10 s by default)
    assert time.monotonic() - t0 < 2.0
    assert chain.deadline == 60.0


@pytest.mark.node
@pytest.mark.slow
def test_lost_reply_to_a_contract_call_creates_one_job(anvil_url: str) -> None:
    """createJob (with its payment) through a proxy that loses the reply: exactly one job, paid once;
    the mined transaction is recognised by its nonce and calldata."""
    from protocol.chain import _calldata
    from protocol.demo import create_job, default_spec
    from protocol.deploy import Protocol, deploy
    from protocol.jobs import JobContext, Terms

    direct = Chain.connect(anvil_url)
    proto = deploy(direct, direct.accounts()[0])
    ctx = JobContext.of(default_spec())
    with nodes.FlakyProxy.to(anvil_url) as proxy:
        chain = _fast(proxy.url)
        flaky = Protocol(chain, *(chain.w3.eth.contract(address=c.address, abi=c.abi)
                                  for c in (proto.registry, proto.game, proto.adjudicator)))
        client, trainer = chain.accounts()[1], chain.accounts()[2]
        assert _calldata(flaky.registry.functions.jobCount()) is not None
        count = int(direct.call(proto.registry.functions.jobCount()))
        nonce = direct.w3.eth.get_transaction_count(client)
        proxy.drop_response_to(b"eth_sendTransaction")
        job = create_job(flaky, client, trainer, ctx, Terms())
        assert len(proxy.dropped) == 1
    assert job == count + 1 == int(direct.call(proto.registry.functions.jobCount()))
    assert direct.w3.eth.get_transaction_count(client) == nonce + 1
    record("crash_restart", "lost reply to createJob", True)
