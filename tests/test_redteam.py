"""Red-team trials: attacks from outside the attack matrix's earlier rows (docs/security.md,
"Red team"). Each asserts that the honest side wins (or the agent reports the problem and keeps
working) and records its trial for ``scripts/bench_security.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from security_report import trial as report_trial


def trial(name: str):
    """This file's attack row ``name`` (recorded as ``redteam: <name>``)."""
    return report_trial(name, "redteam: ")


# -- the trainer's artifact server answers slowly before any body -----------------------------------


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server that reads the request, then runs ``answer`` on the connection (one thread each)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(c: socket.socket) -> None:
        with c:
            try:
                c.recv(65536)
                answer(c)
            except OSError:
                pass

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()


def _drip(prefix: bytes, endless: bytes) -> Callable[[socket.socket], None]:
    def answer(c: socket.socket) -> None:
        c.sendall(prefix)
        for _ in range(200):  # 40 s unless the reader hangs up
            c.sendall(endless)
            time.sleep(0.2)

    return answer


SLOW_ANSWERS = {
    # a byte of the status line every 0.2 s: each socket read succeeds within its timeout
    "status-line": _drip(b"HTTP/1.0 200", b"0"),
    # the status, then one header line that never ends
    "header-line": _drip(b"HTTP/1.0 200 OK\r\nX-Pad: ", b"a"),
    # headers without end, each short (http.client reads up to 100)
    "many-headers": _drip(b"HTTP/1.0 200 OK\r\n", b"X-A: b\r\n"),
    # a chunked body whose chunk-size line never ends (read inside one read1 call)
    "chunk-size-line": _drip(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"0"),
}


@pytest.mark.parametrize("how", sorted(SLOW_ANSWERS))
def test_a_server_dripping_its_status_line_or_headers_is_cut_off_at_the_reads_deadline(how):
    """The trainer's server answers the auditor's read a byte at a time *before* the body (status
    line, headers, a chunk-size line): every socket read succeeds within its timeout, so before,
    the read waited without end (the deadline was checked only between body reads) and the
    auditor missed its game's clock. Now the whole read, retries included, ends at its deadline."""
    from protocol.store import ArtifactUnavailable, HttpArtifactReader

    with trial(f"artifact server drips its {how}"), raw_server(SLOW_ANSWERS[how]) as url:
        reader = HttpArtifactReader(url, retries=2, timeout=2.0, backoff=0.05, read_deadline=0.5)
        t0 = time.monotonic()
        with pytest.raises(ArtifactUnavailable, match="read's deadline"):
            reader.get_step(1, 1)
        assert time.monotonic() - t0 < 1.5  # one deadline for all attempts, not one each


# -- the auditor's game clock vs. the trainer's artifacts of later intervals ------------------------


class _StallingReader:
    """The cheating trainer's server: serves interval 0 (the cheat) at once; a read of a later
    interval's artifact stalls for longer than the auditor's clock (simulated: the trainer makes
    its moves, the chain's time passes the clock, the trainer claims the timeout)."""

    def __init__(self, store, last_prompt_step: int, stall: Callable[[], None]) -> None:
        self.store, self.last_prompt_step, self.stall = store, last_prompt_step, stall
        self.stalled: list[int] = []
        self.max_blob_bytes = store.max_blob_bytes

    def _maybe_stall(self, s: int) -> None:
        if s > self.last_prompt_step:
            self.stalled.append(s)
            self.stall()

    def get_step(self, job, s):  # noqa: ANN001, ANN201
        self._maybe_stall(s)
        return self.store.get_step(job, s)

    def get_log(self, job, s):  # noqa: ANN001, ANN201
        self._maybe_stall(s)
        return self.store.get_log(job, s)

    def get_checkpoint(self, job, interval):  # noqa: ANN001, ANN201
        return self.store.get_checkpoint(job, interval)

    def get_blob(self, job, digest, size=None):  # noqa: ANN001, ANN201
        return self.store.get_blob(job, digest, size)


def test_a_cheater_stalling_its_later_intervals_artifacts_cannot_run_out_the_auditors_game_clock(tmp_path,
                                                                                                 monkeypatch):
    """The trainer cheats in interval 0 and posts interval 1, whose artifacts its server sends slowly
    (each read within its deadline, or many reads of one interval). Before, the auditor's loop
    audited interval 1 before each move of its game on interval 0: the fetch outlasted its clock and
    the cheater won the game on time (the bond too). Now, while its game runs, the auditor fetches
    nothing past the disputed interval (one conviction ends the job): it wins."""
    import types

    from protocol import agents_cli
    from protocol.auditor import AuditorAgent
    from protocol.chain import Chain
    from protocol.cheats import PoisonSample
    from protocol.demo import create_job, default_spec
    from protocol.deploy import deploy
    from protocol.game import STATUS_CHALLENGER_WON
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    terms = Terms()
    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(default_spec("mlp"))
    store = ArtifactStore(tmp_path)
    job = create_job(proto, a[1], a[2], ctx, terms)
    trainer = TrainerAgent(proto, a[2], ctx, store, job, cheat=PoisonSample(2))
    trainer.accept(terms)
    while trainer.run_interval() is not None:
        pass
    assert ctx.n_intervals == 2

    def stall() -> None:
        while trainer.play():  # the trainer moves until the auditor is to move
            pass
        chain.advance_time(terms.clock + 1)  # the read outlasts the auditor's clock
        trainer.play()  # and the trainer claims the timeout

    first, n = ctx.interval_span(0)
    reader = _StallingReader(store, first + n - 1, stall)
    auditor = AuditorAgent(proto, a[3], ctx, reader, job)
    # the trainer moves whenever the auditor's loop waits (one process, no threads)
    monkeypatch.setattr(agents_cli, "time", types.SimpleNamespace(monotonic=time.monotonic, strftime=time.strftime,
                                                                  sleep=lambda _s: trainer.play()))
    with trial("cheater stalls its later interval's artifacts during the game"):
        out = agents_cli.Out.make("auditor", job, events=False)
        result = agents_cli._auditor_loop(auditor, out, time.monotonic() + 120, 0.0)
        (gid,) = auditor.disputed
        assert auditor.player.view(gid).status == STATUS_CHALLENGER_WON, (result, reader.stalled)
        assert reader.stalled == [] and result["status"] == "fraudulent"
        assert result["withdrawn"] == terms.challenger_bond + terms.trainer_stake * 5000 // 10_000


# -- data-availability demands an honest trainer cannot answer -------------------------------------


def _lr():
    import da_harness as D
    import game_harness as H

    return D.with_logs(H.simulate(H.JobConfig()))


def test_a_log_demand_whose_start_position_cannot_answer_its_range_cannot_convict_an_honest_trainer(dep):
    """A demander fixes a Log demand's start at a leaf past its range (key > fromIndex), past the
    log's end, or at a position of a log whose size no answer has bound. Before, no run of the
    committed log answered such a demand: the honest trainer's answer reverted, the demand timed
    out and the demander took the bounty (the rest of the stake burned). Now a demand names 0 or a
    leaf of the bound size (else `StartNotPublished`), and the run from that leaf answers it."""
    import da_harness as D
    import game_harness as H
    from game_harness import JobStatus, reverts

    from protocol import availability as A

    lr = _lr()
    with trial("log demand with a start position past its range or the log"):
        job = H.active_job(dep, lr.run)
        op = lr.run.graph.index["update0"]
        s = 2
        keys = A.log_keys(lr.log(s, op))
        with reverts("StartNotPublished", 1, 0):  # no answer has bound the log's size yet
            dep.dry(dep.da.functions.demandLog(job, 0, s, op, 0, 3, 1), dep.challenger,
                    value=D.bond(dep, job) + D.log_fee(dep, 0, 3, 1))
        first = D.demand_log(dep, job, 0, s, op, 0, 3, start=0)  # binds the size
        dep.tx(dep.da.functions.answerLog(first, D.answer_run_for(lr, 0, s, op, 0, 3, 0)), dep.trainer)
        with reverts("StartNotPublished", len(keys), len(keys)):  # past the log's last leaf
            dep.dry(dep.da.functions.demandLog(job, 0, s, op, 0, 3, len(keys)), dep.challenger,
                    value=D.bond(dep, job) + D.log_fee(dep, 0, 3, len(keys)))
        start = len(keys) - 1  # the HIGH sentinel: its key is past fromIndex
        assert keys[start] > 5
        did = D.demand_log(dep, job, 0, s, op, 5, 9, start=start)
        before = dep.owed(dep.challenger)
        dep.tx(dep.da.functions.answerLog(did, D.answer_run_for(lr, 0, s, op, 5, 9, start)), dep.trainer)
        assert D.demand(dep, did)["status"] == 2  # answered
        assert dep.job_status(job) == JobStatus.ACTIVE
        assert dep.owed(dep.challenger) > before  # its bond back (and the unused fee)


MALFORMED_ANSWERS = {
    # a Latin-1 '²' passes str.isdigit() and fails int(); 5,000 digits pass it and fail int() too
    "superscript-length": b"HTTP/1.0 200 OK\r\nContent-Length: \xb2\r\n\r\n{}",
    "5000-digit-length": b"HTTP/1.0 200 OK\r\nContent-Length: 1" + b"0" * 5000 + b"\r\n\r\n{}",
    "bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "negative-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n{}\r\n0\r\n\r\n",
    "bad-status": b"HTTP/1.0 abc OK\r\n\r\n{}",
    "no-status": b"\r\n\r\n",
    "binary-garbage": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("how", sorted(MALFORMED_ANSWERS))
def test_a_malformed_http_answer_is_unavailable_never_another_exception(how):
    """The trainer's server answers with a malformed status line, Content-Length or chunk size.
    Before, a Content-Length of '²' (Latin-1) or of 5,000 digits raised a ValueError out of the
    reader: the auditor's loop, which catches the artifact errors only, stopped (a stopped auditor
    never challenges: the cheater is paid). Now each is a VtrainError of the reader."""
    from protocol.store import HttpArtifactReader
    from vtrain.errors import VtrainError

    data = MALFORMED_ANSWERS[how]

    def answer(c: socket.socket) -> None:
        c.sendall(data)

    with trial(f"artifact server answers a malformed {how}"), raw_server(answer) as url:
        reader = HttpArtifactReader(url, retries=1, timeout=2.0, backoff=0.01, read_deadline=2.0)
        with pytest.raises(VtrainError):
            reader.get_step(1, 1)


# -- the trainer's game clock vs. its own training of the next interval -----------------------------


@pytest.mark.slow  # ~17 s (a long interval trained between moves)
def test_a_griefer_challenging_while_the_trainer_trains_a_long_interval_cannot_win_on_time(tmp_path, monkeypatch):
    """A griefer challenges interval 0 of an honest trainer as soon as it is posted, then never
    moves. The next interval takes the trainer longer than the game's clock to train (simulated:
    each step moves the chain's time a third of the clock on). Before, the trainer's loop trained
    the whole interval before its first move: its clock ran out and the griefer took the bounty
    from an honest trainer. Now it plays its games between steps: it wins the griefer's bond on
    time and is paid."""
    import types

    from web3.logs import DISCARD

    from protocol import agents_cli
    from protocol.chain import Chain
    from protocol.demo import create_job, default_spec
    from protocol.deploy import deploy
    from protocol.game import STATUS_TRAINER_WON
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    terms = Terms()
    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(default_spec("mlp"))
    job = create_job(proto, a[1], a[2], ctx, terms)
    # the trainer that stakes first and trains each interval after (--no-pretrain): a pre-training
    # trainer trains before it accepts, so no game can run while it trains an interval
    trainer = TrainerAgent(proto, a[2], ctx, ArtifactStore(tmp_path), job, pretrain=False)
    games: list[int] = []
    train = trainer._train

    def slow_train(state, first, last):  # noqa: ANN001, ANN202
        if first > 1 and not games:  # interval 0 is posted: the griefer challenges it at once
            r = chain.send(proto.game.functions.challenge(job, 0), a[4], value=terms.challenger_bond, what="grief")
            games.append(int(proto.game.events.GameCreated().process_receipt(r, errors=DISCARD)[0]["args"]["game"]))
        for o in train(state, first, last):
            chain.advance_time(terms.clock // 3)  # each step of this interval is long
            yield o

    trainer._train = slow_train
    # the loop's idle waits pass chain time (an eth-tester chain has no clock of its own)
    monkeypatch.setattr(agents_cli, "time", types.SimpleNamespace(
        monotonic=time.monotonic, strftime=time.strftime, sleep=lambda _s: chain.advance_time(600)))
    with trial("griefer challenges while the trainer trains an interval longer than the clock"):
        params = tuple(chain.call(proto.registry.functions.jobParams(job)))
        result = agents_cli._trainer_loop(trainer, params, agents_cli.Out.make("trainer", job, events=False),
                                          time.monotonic() + 120, 0.0)
        (gid,) = games
        assert trainer.player.view(gid).status == STATUS_TRAINER_WON, result
        assert result["status"] == "finalized"
        assert result["withdrawn"] == terms.payment + terms.trainer_stake + terms.challenger_bond


def test_a_small_artifact_sent_slowly_is_cut_off_by_its_size_not_a_fixed_deadline():
    """The trainer's server sends a 100-byte log blob over 5 s (a byte every 50 ms), well within
    the reader's fixed 600 s deadline. Served so, each of an interval's hundreds of artifacts would
    hold the auditor for most of that deadline: a day's window passes before it replays. Now a read
    of at most N bytes may take `timeout + N / min_rate`: this one is cut off in about a second."""
    from protocol.store import ArtifactUnavailable, HttpArtifactReader

    with trial("artifact server sends a small blob slowly"), raw_server(
        _drip(b"HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n", b"x")
    ) as url:
        reader = HttpArtifactReader(url, retries=0, timeout=0.5)
        assert reader.read_deadline == 600.0
        t0 = time.monotonic()
        with pytest.raises(ArtifactUnavailable, match="read's deadline"):
            reader.get_blob(1, b"\x11" * 32, 100)
        assert time.monotonic() - t0 < 1.5


# -- deeply nested JSON from someone else -------------------------------------------------------------

_DEEP_JSON_CHILD = r'''
import json, struct, sys
from pathlib import Path
import web3  # noqa: F401  what every agent process imports: eth-keyfile raises the recursion limit
assert sys.getrecursionlimit() >= 100_000, sys.getrecursionlimit()
deep = b"[" * 200_000 + b"]" * 200_000
root = Path(sys.argv[1])
(root / "1" / "steps").mkdir(parents=True)
(root / "1" / "steps" / "1.json").write_bytes(deep)
(root / "deployment.json").write_bytes(b'{"a": ' + deep + b"}")
(root / "key.json").write_bytes(b'{"crypto": ' + deep + b"}")
(root / "spec.json").write_bytes(b'{"model": ' + deep + b"}")
import click
from protocol.agents_cli import read_key_file
from protocol.chain import Deployment
from protocol.store import ArtifactStore, load_checkpoint
from vtrain.errors import VtrainError
from vtrain.training.spec import TrainSpec
trials = {
    "served step record": lambda: ArtifactStore(root).get_step(1, 1),
    "served checkpoint header": lambda: load_checkpoint(struct.pack("<Q", len(deep)) + deep),
    "deployment file": lambda: Deployment.read(root / "deployment.json"),
    "keystore": lambda: read_key_file(root / "key.json"),
    "spec file": lambda: TrainSpec.from_file(root / "spec.json"),
}
for name, f in trials.items():
    try:
        f()
    except (VtrainError, click.ClickException) as e:
        print(name, "refused:", type(e).__name__, flush=True)
'''


def test_deeply_nested_json_from_someone_else_is_refused_not_a_crash(tmp_path):
    """A served step record (or checkpoint header, deployment file, keystore, spec) of 200,000
    nested brackets: 400 KB, within every size bound. In a process that imported web3, whose
    eth-keyfile raises the recursion limit to 100,000, `json.loads` overflowed the C stack: the
    auditor died of SIGSEGV (and again on each restart: the cheater is paid). Now each is refused
    by its reader's narrow error (`loads_json` bounds the nesting first)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    with trial("deeply nested JSON served or handed over"):
        r = subprocess.run([sys.executable, "-c", _DEEP_JSON_CHILD, str(tmp_path)], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(repo)}, cwd=repo)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
        refused = [line.split(" refused:")[0] for line in r.stdout.splitlines() if " refused:" in line]
        assert refused == ["served step record", "served checkpoint header", "deployment file", "keystore",
                           "spec file"], r.stdout


def _keystore(kdf: str, params: dict) -> dict:
    return {"version": 3, "crypto": {"cipher": "aes-128-ctr", "cipherparams": {"iv": "00" * 16},
                                     "ciphertext": "00" * 32, "kdf": kdf, "kdfparams": params, "mac": "00" * 32}}


@pytest.mark.parametrize("how", ["pbkdf2-1e12-iterations", "pbkdf2-1e9-iterations", "scrypt-2^40", "dklen-1e9",
                                 "n-not-a-number", "dev-zero"])
def test_a_hostile_key_file_is_refused_at_once_with_a_clear_error(tmp_path, monkeypatch, how):
    """A --key-file handed over whose KDF asks for 10^12 PBKDF2 iterations (before: an OverflowError
    traceback), 10^9 (hours of CPU before the password is checked), 2^40 scrypt rounds, a 1 GB key,
    a non-number, or /dev/zero (before: read without end): refused in one line, before any work."""
    import json
    from pathlib import Path

    import click

    from protocol.agents_cli import read_key_file

    salt = "00" * 32
    keystores = {
        "pbkdf2-1e12-iterations": _keystore("pbkdf2", {"c": 10**12, "dklen": 32, "prf": "hmac-sha256", "salt": salt}),
        "pbkdf2-1e9-iterations": _keystore("pbkdf2", {"c": 10**9, "dklen": 32, "prf": "hmac-sha256", "salt": salt}),
        "scrypt-2^40": _keystore("scrypt", {"dklen": 32, "n": 2**40, "p": 1, "r": 8, "salt": salt}),
        "dklen-1e9": _keystore("pbkdf2", {"c": 1, "dklen": 10**9, "prf": "hmac-sha256", "salt": salt}),
        "n-not-a-number": _keystore("scrypt", {"dklen": 32, "n": "x", "p": 1, "r": 8, "salt": salt}),
    }
    path = Path("/dev/zero")
    if how in keystores:
        path = tmp_path / "key.json"
        path.write_text(json.dumps(keystores[how]))
    monkeypatch.setenv("VTRAIN_KEY_PASSWORD", "x")
    with trial(f"hostile key file: {how}"):
        t0 = time.monotonic()
        with pytest.raises(click.ClickException, match="key-file") as e:
            read_key_file(path)
        assert time.monotonic() - t0 < 2.0 and "\n" not in e.value.message


def test_markup_in_a_servers_reason_phrase_does_not_stop_the_auditor(capsys):
    """The trainer's server answers `HTTP/1.0 418 [/bold]`: the reason phrase reaches the auditor's
    progress line. Before, rich parsed it as markup (a closing tag with no opening one) and raised
    MarkupError out of the auditor's loop: the auditor stopped. Now served text is escaped, and a
    line that still does not parse is printed plain."""
    from protocol.agents_cli import Out, _unreadable
    from protocol.store import ArtifactUnavailable, HttpArtifactReader

    def answer(c: socket.socket) -> None:
        c.sendall(b"HTTP/1.0 418 [/bold][link=file:///etc/passwd]x\r\nContent-Length: 0\r\n\r\n")

    with trial("markup in the artifact server's reason phrase"), raw_server(answer) as url:
        with pytest.raises(ArtifactUnavailable) as e:
            HttpArtifactReader(url, retries=0).get_step(1, 1)
        out = Out.make("auditor", 1, events=False)
        _unreadable(out, e.value)
        out.say(f"unescaped: {e.value}")  # a caller that forgot to escape
        err = capsys.readouterr().err
        assert err.count("[/bold]") == 2, err


def test_a_fixed_start_log_demand_pays_for_the_page_it_can_force(dep):
    """A demander asks for one element far into a long log but fixes the run's start at leaf 0:
    the honest answer must publish every leaf from 0 up to the element (a full page, 4,096 leaves,
    ~10M gas). Before, the fee was priced on the range alone (3 leaves, ~360k gas): a griefer made
    the trainer spend ~28x what it paid. Now a fixed start pays a full page's fee (what the answer
    does not use comes back): the trainer earns at least its answer's gas."""
    import da_harness as D
    import game_harness as H

    from protocol import availability as A

    n = A.MAX_LOG_LEAVES + 10
    run = H.simulate(H.JobConfig())
    op = run.graph.index["update0"]
    lr = D.with_logs(run, {(2, op): D.entries_leaves([(k, 1, 0) for k in range(n)])})
    with trial("fixed-start log demand of one element far into a long log"):
        job = H.active_job(dep, lr.run)
        lo = n - 5
        fee = D.log_fee(dep, lo, lo + 1, 0)
        did = D.demand_log(dep, job, 0, 2, op, lo, lo + 1, 0)
        before = dep.owed(dep.trainer)
        r = dep.tx(dep.da.functions.answerLog(did, D.answer_run_for(lr, 0, 2, op, lo, lo + 1, 0)), dep.trainer)
        earned = dep.owed(dep.trainer) - before
        assert fee == A.log_demand_fee(H.DA_FEE_GAS_PRICE, lo, lo + 1, 0)
        assert earned >= r.gasUsed * H.DA_FEE_GAS_PRICE, (earned // H.DA_FEE_GAS_PRICE, r.gasUsed)
