"""Trust nothing served: the auditor checks every artifact the trainer serves against the chain
before using it, and anything that does not verify is *unavailable* (reported with what failed,
which step and op, and the sha256 of the bytes), never grounds for a challenge, never a crash.

The trainer and auditor are the project's own agents on the embedded chain; a dishonest server is
a reader that swaps chosen artifacts (:class:`Serving`). Each test records an attack row for
``scripts/bench_security.py`` (``docs/security.md``, "served artifacts").
"""

from __future__ import annotations

import hashlib
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_report import trial as report_trial

from protocol.auditor import AuditorAgent, MalformedCommittedLog, Unavailable
from protocol.cheats import PoisonSample
from protocol.demo import create_job, default_spec
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactReader, ArtifactStore, StepRecord
from protocol.trainer import TrainerAgent
from vtrain.commit.roots import interval_root
from vtrain.commit.trace import framed_log_root
from vtrain.errors import CorruptLog, MissingArtifact, VtrainError
from vtrain.graph.executor import StepLog, state_tensors
from vtrain.graph.step_graph import OpKind
from vtrain.numerics.logfile import _uvarints, decode_step_log, encode_step_log, frame_step_log
from vtrain.numerics.rounding import Code, OpLog
from vtrain.training.loop import train_steps

TERMS = Terms()
CHEAT_STEP = 6  # PoisonSample at step 6: interval 1 of the 8-step, K=4 demo job
SUBST_STEP = 2  # the step whose artifacts a server swaps in interval 0


def trial(name: str):
    """This file's attack row ``name`` (recorded as ``served: <name>``)."""
    return report_trial(name, "served: ")


@dataclass
class World:
    proto: Any
    accounts: list[str]
    ctx: JobContext
    store: ArtifactStore
    honest_job: int
    cheat_job: int


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """Two jobs on one embedded chain, every interval posted: an honest one and a cheating one
    (PoisonSample at step 6); their artifacts in one store."""
    from protocol.chain import Chain
    from protocol.deploy import deploy

    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(default_spec("mlp"))
    with tempfile.TemporaryDirectory() as d:
        store = ArtifactStore(d)
        jobs = []
        for cheat in (None, PoisonSample(CHEAT_STEP)):
            job = create_job(proto, a[1], a[2], ctx, TERMS)
            trainer = TrainerAgent(proto, a[2], ctx, store, job, cheat=cheat)
            trainer.accept(TERMS)
            while trainer.run_interval() is not None:
                pass
            jobs.append(job)
        yield World(proto, a, ctx, store, *jobs)


@dataclass
class Serving(ArtifactReader):
    """The trainer's store as a dishonest server serves it: ``logs``, ``steps``, ``checkpoints``
    replace the stored artifact of that step (interval), every other read goes to ``inner``."""

    inner: ArtifactReader
    logs: dict[int, bytes] = field(default_factory=dict)
    steps: dict[int, StepRecord] = field(default_factory=dict)
    checkpoints: dict[int, bytes] = field(default_factory=dict)

    def _read(self, job: str, rel: str) -> bytes:
        return self.inner._read(job, rel)

    def _where(self, job: str, rel: str) -> str:
        return self.inner._where(job, rel)

    def get_log(self, job: Any, s: int) -> bytes:
        return self.logs[s] if s in self.logs else self.inner.get_log(job, s)

    def get_step(self, job: Any, s: int) -> StepRecord:
        return self.steps[s] if s in self.steps else self.inner.get_step(job, s)

    def get_checkpoint(self, job: Any, interval: int) -> bytes:
        return self.checkpoints[interval] if interval in self.checkpoints else self.inner.get_checkpoint(job, interval)


def _auditor(w: World, job: int, reader: Any, **kw: Any) -> AuditorAgent:
    return AuditorAgent(w.proto, w.accounts[3], w.ctx, reader, job, **kw)


def _refused(auditor: AuditorAgent) -> Unavailable:
    """The auditor neither challenged nor signed off, and says why: one unavailable interval."""
    assert auditor.audit() is None  # no challenge
    assert auditor.disputed == [] and auditor.flagged == []
    assert not auditor.signed_off()
    (u,) = auditor.unavailable.values()
    assert auditor.withheld == {u.interval: str(u)}
    return u


def _log(w: World, job: int, s: int) -> StepLog:
    return decode_step_log(w.store.get_log(job, s), s, w.ctx.job.graph)


def _other_log(w: World, job: int, s: int) -> StepLog:
    """Step ``s``'s log with one entry changed (to explicit 1.5): a valid log that is not the one
    committed for any step (the demo MLP's logs are mostly empty, hence all alike)."""
    return _with_op(_log(w, job, s), _explicit(1.5))


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _with_op(lg: StepLog, edit: Callable[[int, OpLog], OpLog]) -> StepLog:
    """``lg`` with its op of most entries replaced by ``edit(op, entries)``; a log with no entries
    (the demo MLP's usually has none: its sums are exact-grid) gets two made-up entries on its
    first MATMUL first (a different log, so one that breaks no rule is simply not the committed one)."""
    sparse = dict(lg.sparse)
    if not any(len(e) for e in sparse.values()):
        graph = JobContext.of(default_spec("mlp")).job.graph
        mm = next(o.id for o in graph.ops if o.kind == OpKind.MATMUL and o.numel >= 2)
        sparse[mm] = _entries([0, 1], [int(Code.DOWN), int(Code.UP)], [0.0, 0.0])
    op = max(sparse, key=lambda o: len(sparse[o]))
    sparse[op] = edit(op, sparse[op])
    return StepLog(lg.mode, sparse)


def _entries(idx, code, value) -> OpLog:
    return OpLog(np.asarray(idx, np.int64), np.asarray(code, np.uint8), np.asarray(value, np.float32))


# -- malformed logs: entry-level (a log with these leaves can be committed) and framing-level --------

def _dup(op: int, e: OpLog) -> OpLog:
    i = e.index.copy()
    i[1] = i[0]
    return _entries(i, e.code, e.value)


def _unsorted(op: int, e: OpLog) -> OpLog:
    i = e.index.copy()
    i[0], i[1] = i[1], i[0]
    return _entries(i, e.code, e.value)


def _unknown_code(op: int, e: OpLog) -> OpLog:
    c = e.code.copy()
    c[0] = 7
    return _entries(e.index, c, e.value)


def _past_numel(w: World) -> Callable[[int, OpLog], OpLog]:
    def edit(op: int, e: OpLog) -> OpLog:
        i = e.index.copy()
        i[-1] = w.ctx.job.graph.ops[op].numel
        return _entries(i, e.code, e.value)

    return edit


def _explicit(value: float) -> Callable[[int, OpLog], OpLog]:
    def edit(op: int, e: OpLog) -> OpLog:
        c, v = e.code.copy(), e.value.copy()
        c[0], v[0] = int(Code.EXPLICIT), value
        return _entries(e.index, c, v)

    return edit


ENTRY_ERRORS = {  # name -> (edit factory, the narrow error)
    "duplicated-index": (lambda w: _dup, "LogIndexOrderError"),
    "unsorted-indices": (lambda w: _unsorted, "LogIndexOrderError"),
    "unknown-code": (lambda w: _unknown_code, "LogCodeError"),
    "index-past-numel": (_past_numel, "LogIndexRangeError"),
    "explicit-nan": (lambda w: _explicit(float("nan")), "LogValueError"),
    "explicit-inf": (lambda w: _explicit(float("inf")), "LogValueError"),
}


def _varint(b: bytes, pos: int) -> tuple[int, int]:
    """One LEB128 number of log format 2 at ``pos``, and the position after it."""
    v, k = 0, 0
    while True:
        v |= (b[pos] & 0x7F) << (7 * k)
        pos, k = pos + 1, k + 1
        if not b[pos - 1] & 0x80:
            return v, pos


def _vint(v: int) -> bytes:
    return _uvarints(np.array([v], np.uint64))


def _header(data: bytes) -> tuple[int, int, int, int]:
    """A format-2 log's ``(flags, step, n_ops, header length)``."""
    step, pos = _varint(data, 7)
    n_ops, pos = _varint(data, pos)
    return data[6], step, n_ops, pos


def _payload(data: bytes) -> tuple[bytes, bytes]:
    """A format-2 log's header and its payload (decompressed when stored compressed)."""
    flags, _, _, pos = _header(data)
    return data[:pos], zlib.decompress(data[pos:]) if flags & 0x80 else data[pos:]


def _repack(head: bytes, body: bytes) -> bytes:
    return head[:6] + bytes([head[6] | 0x80]) + head[7:] + zlib.compress(body)


def _framing(name: str, good: bytes, s: int) -> bytes:
    head, body = _payload(good)
    flags, step, n_ops, _ = _header(good)
    n, pos = _varint(body, 0)
    if name == "truncated":
        return good[: max(len(good) - 9, 3)]
    if name == "truncated-payload":
        return _repack(head, body[:-3])
    if name == "wrong-entry-count":  # the first op's count one larger than its entries
        if n == 0:  # no ops: declare one op (id 0) with one entry, and give none
            return _repack(head, _vint(1) + _vint(0) + _vint(1))
        gap, p1 = _varint(body, pos)
        c, p2 = _varint(body, p1)
        return _repack(head, body[:p1] + _vint(c + 1) + body[p2:])
    if name == "trailing-bytes":
        return _repack(head, body + b"\0\0\0\0")
    if name == "garbage-compression":
        return head[:6] + bytes([flags | 0x80]) + head[7:] + bytes(range(97, 123)) * 3
    if name == "wrong-op-count":  # the header's graph op count
        return good[:7] + _vint(step) + _vint(n_ops + 1) + good[len(head):]
    if name == "op-id-out-of-range":
        if n == 0:
            return _repack(head, _vint(1) + _vint(10_000) + _vint(0))
        _, p1 = _varint(body, pos)
        return _repack(head, body[:pos] + _vint(10_000) + body[p1:])
    if name == "wrong-step":
        return good[:7] + _vint(s + 1) + _vint(n_ops) + good[len(head):]
    if name == "wrong-magic":
        return b"XXLOG" + good[5:]
    raise AssertionError(name)


FRAMING_ERRORS = {
    "truncated": "LogTruncated",
    "truncated-payload": "LogTruncated",
    "wrong-entry-count": "LogTruncated",
    "trailing-bytes": "LogTrailingBytes",
    "garbage-compression": "LogCompressionError",
    "wrong-op-count": "LogHeaderError",
    "op-id-out-of-range": "LogOpTableError",
    "wrong-step": "LogHeaderError",
    "wrong-magic": "LogHeaderError",
}


# ============================================================ the attack found from outside


def test_honest_commit_then_a_substituted_log_with_a_matching_record_is_unavailable_not_challenged(world):
    """The trainer commits honestly, then serves for step 2 a different log together with a step
    record naming that log's root. The records no longer hash to the posted root: nothing of the
    interval is used, so the auditor neither challenges (it would lose its bond at the OUTPUT bind)
    nor signs off; served the committed artifacts again, it signs off."""
    w = world
    graph = w.ctx.job.graph
    with trial("honest commit, substituted log + matching record"):
        lg = _with_op(_log(w, w.honest_job, SUBST_STEP), lambda op, e: _entries(e.index[1:], e.code[1:], e.value[1:]))
        data = encode_step_log(lg, SUBST_STEP, graph)
        rec = w.store.get_step(w.honest_job, SUBST_STEP)
        forged = replace(rec, log_root=framed_log_root(frame_step_log(data, SUBST_STEP, graph), graph))
        serving = Serving(w.store, logs={SUBST_STEP: data}, steps={SUBST_STEP: forged})
        auditor = _auditor(w, w.honest_job, serving)
        u = _refused(auditor)
        assert (u.interval, u.artifact, u.error) == (0, "step record", "NotCommitted")
        assert "posted interval root" in u.reason and u.sha256
        assert auditor.book.records == {}  # nothing replayed from unverified inputs
        serving.logs.clear()
        serving.steps.clear()
        assert auditor.audit() is None and auditor.signed_off()


def test_honest_commit_then_a_substituted_log_alone_is_unavailable_not_challenged(world):
    w = world
    with trial("honest commit, substituted log"):
        data = encode_step_log(_other_log(w, w.honest_job, SUBST_STEP + 1), SUBST_STEP, w.ctx.job.graph)
        u = _refused(_auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: data})))
        assert (u.interval, u.artifact, u.key, u.error, u.sha256) == (0, "rounding log", SUBST_STEP, "NotCommitted",
                                                                      _sha(data))
        assert f"committed logRoot_{SUBST_STEP}" in u.reason


def test_cheater_serving_an_inconsistent_log_is_not_challenged_blindly_and_is_caught_once_served_right(world):
    """A cheating trainer serves, for its cheating step, a log that is not the committed one: the
    auditor cannot prove anything with it, so it reports the step unavailable (no challenge, no
    sign-off). Served the committed log, the same auditor catches the cheat from verified data."""
    w = world
    with trial("cheater serves an inconsistent log"):
        data = encode_step_log(_other_log(w, w.cheat_job, CHEAT_STEP - 1), CHEAT_STEP, w.ctx.job.graph)
        serving = Serving(w.store, logs={CHEAT_STEP: data})
        auditor = _auditor(w, w.cheat_job, serving)
        u = _refused(auditor)
        assert (u.interval, u.artifact, u.key, u.error, u.sha256) == (1, "rounding log", CHEAT_STEP, "NotCommitted",
                                                                      _sha(data))
        assert auditor.verified == 1  # interval 0 verified and replayed fine
        serving.logs.clear()
        assert auditor.audit() == 1 and auditor.flagged == [1]  # the real cheat, proven from verified data
        assert auditor.unavailable == {} and not auditor.signed_off()


def test_cheater_serving_a_log_with_a_duplicated_index_does_not_crash_the_auditor(world):
    w = world
    with trial("cheater serves a log with a duplicated index"):
        data = encode_step_log(_with_op(_log(w, w.cheat_job, CHEAT_STEP), _dup), CHEAT_STEP, w.ctx.job.graph)
        u = _refused(_auditor(w, w.cheat_job, Serving(w.store, logs={CHEAT_STEP: data})))
        assert (u.interval, u.key, u.error, u.sha256) == (1, CHEAT_STEP, "LogIndexOrderError", _sha(data))
        assert u.op is not None and "twice" in u.reason


# ============================================================ every malformed served log


@pytest.mark.parametrize("name", sorted(ENTRY_ERRORS))
def test_served_log_with_malformed_entries_is_unavailable(world, name):
    w = world
    edit, error = ENTRY_ERRORS[name]
    with trial(f"served log: {name}"):
        data = encode_step_log(_with_op(_log(w, w.honest_job, SUBST_STEP), edit(w)), SUBST_STEP, w.ctx.job.graph)
        u = _refused(_auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: data})))
        assert (u.interval, u.artifact, u.key, u.error, u.sha256) == (0, "rounding log", SUBST_STEP, error, _sha(data))
        assert u.op is not None and "expected" in u.reason and f"op {u.op}" in u.reason


@pytest.mark.parametrize("name", sorted(FRAMING_ERRORS))
def test_served_log_with_bad_framing_is_unavailable(world, name):
    w = world
    with trial(f"served log: {name}"):
        data = _framing(name, w.store.get_log(w.honest_job, SUBST_STEP), SUBST_STEP)
        u = _refused(_auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: data})))
        assert (u.interval, u.artifact, u.key, u.error, u.sha256) == (0, "rounding log", SUBST_STEP,
                                                                      FRAMING_ERRORS[name], _sha(data))
        assert "expected" in u.reason


# ============================================================ step records and checkpoints


def _other_job_artifacts(w: World) -> tuple[list[StepRecord], bytes]:
    """Self-consistent records of steps 1..4 and the interval-1 checkpoint of another seed."""
    from protocol.agent import checkpoint_bytes
    from vtrain.training.spec import TrainSpec

    other = JobContext.of(TrainSpec.from_dict({**w.ctx.spec.to_dict(), "seed": 99}))
    recs, last = [], None
    for o in train_steps(other.job, state_tensors(other.job.initial_state), 1, 4):
        recs.append(StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots)))
        last = o.state
    return recs, checkpoint_bytes(w.ctx, last)


def test_substituted_step_record_is_unavailable(world):
    w = world
    with trial("substituted step record"):
        recs, _ = _other_job_artifacts(w)
        u = _refused(_auditor(w, w.honest_job, Serving(w.store, steps={3: recs[2]})))
        assert (u.interval, u.artifact, u.error) == (0, "step record", "NotCommitted") and u.sha256


def test_a_substituted_record_is_not_kept_by_the_caching_reader(world):
    """The agents' caching reader drops every record of an interval whose records do not verify
    (which one is wrong is unknown), so a correct copy served later is accepted."""
    from protocol.agents_cli import caching_reader

    w = world
    with trial("substituted step record, then the committed one (cached reader)"):
        recs, _ = _other_job_artifacts(w)
        serving = Serving(w.store, steps={3: recs[2]})
        auditor = _auditor(w, w.honest_job, caching_reader(serving))
        assert _refused(auditor).artifact == "step record"
        serving.steps.clear()
        assert auditor.audit() is None and auditor.signed_off()


def test_garbled_step_record_is_unavailable(world, tmp_path):
    import shutil

    w = world
    with trial("garbled step record"):
        shutil.copytree(w.store.root, tmp_path / "s")
        p = tmp_path / "s" / str(w.honest_job) / "steps" / "3.json"
        p.write_text(p.read_text().replace('"s":3', '"s":"3"'))
        u = _refused(_auditor(w, w.honest_job, ArtifactStore(tmp_path / "s")))
        assert (u.interval, u.artifact, u.key, u.error) == (0, "step record", 3, "CorruptStepRecord")


@pytest.mark.parametrize("how", ["substituted", "truncated"])
def test_substituted_or_truncated_checkpoint_is_unavailable(world, how):
    """A sampled auditor starts interval 1 from the trainer's checkpoint: one that is not the
    committed state at step 4 (or not a checkpoint at all) is never used."""
    w = world
    with trial(f"{how} checkpoint"):
        _, other = _other_job_artifacts(w)
        data = other if how == "substituted" else w.store.get_checkpoint(w.honest_job, 1)[:-20]
        auditor = _auditor(w, w.honest_job, Serving(w.store, checkpoints={1: data}))
        auditor._sampled = lambda i: i == 1
        u = _refused(auditor)
        error = "NotCommitted" if how == "substituted" else "CorruptCheckpoint"
        assert (u.interval, u.artifact, u.key, u.error, u.sha256) == (1, "checkpoint", 1, error, _sha(data))
        assert auditor.skipped == [0]


# ============================================================ a log committed malformed


def _commit_interval0(w: World, step_log: Callable[[int, StepLog], bytes | None]) -> tuple[int, ArtifactStore]:
    """A trainer that trains interval 0 honestly but commits for each step the log bytes
    ``step_log`` returns (None: the honest log), with the root those bytes' entries hash to."""
    graph, proto, a = w.ctx.job.graph, w.proto, w.accounts
    job = create_job(proto, a[1], a[2], w.ctx, TERMS)
    proto.chain.send(proto.registry.functions.acceptJob(job), a[2], value=TERMS.trainer_stake)
    store = ArtifactStore(tempfile.mkdtemp(prefix="malformed-"))
    first, n = w.ctx.interval_span(0)
    leaves = []
    for o in train_steps(w.ctx.job, state_tensors(w.ctx.job.initial_state), first, first + n - 1):
        data = step_log(o.step, o.log) or encode_step_log(o.log, o.step, graph)
        root = framed_log_root(frame_step_log(data, o.step, graph), graph)
        rec = StepRecord(o.step, o.state_root, root, tuple(o.component_roots))
        store.put_log(job, o.step, data)
        store.put_step(job, rec)
        leaves.append(rec.leaf())
    proto.chain.send(proto.registry.functions.postInterval(job, 0, interval_root(leaves)), a[2])
    return job, store


@pytest.mark.parametrize("name", sorted(ENTRY_ERRORS))
def test_committed_malformed_log_is_reported_as_such_never_challenged(world, name):
    """The trainer's posted root commits to a malformed log: the auditor proves it from the log and
    the chain (the entries hash to the committed logRoot_s) and reports a MalformedCommittedLog,
    for the on-chain data-availability proof; it neither replays, challenges nor signs off."""
    w = world
    edit, error = ENTRY_ERRORS[name]
    with trial(f"committed malformed log: {name}"):
        graph = w.ctx.job.graph
        job, store = _commit_interval0(
            w, lambda s, lg: encode_step_log(_with_op(lg, edit(w)), s, graph) if s == SUBST_STEP else None
        )
        auditor = _auditor(w, job, store)
        assert auditor.audit() is None and auditor.disputed == [] and not auditor.signed_off()
        assert auditor.unavailable == {} and auditor.withheld == {}
        m = auditor.malformed[0]
        assert isinstance(m, MalformedCommittedLog)
        assert (m.interval, m.step, m.error, m.sha256) == (0, SUBST_STEP, error, _sha(store.get_log(job, SUBST_STEP)))
        assert f"op {m.op}" in m.reason
        # and on-chain: DataAvailability.proveMalformedLog convicts where the contract checks the fault
        status = w.proto.chain.call(w.proto.registry.functions.jobStatus(job))
        owed = w.proto.chain.call(w.proto.registry.functions.owed(auditor.account))
        if name in ON_CHAIN_PROVABLE:
            assert status == 5 and owed >= TERMS.trainer_stake // 2, (name, status, owed)  # Fraudulent, the bounty
        else:
            assert status == 2, name  # still Active: only not signed off (docs/security.md, known limits)
        assert not auditor.prove_malformed(0)  # once per interval


#: Malformations the DataAvailability contract checks on-chain (keys in order, codes, values).
ON_CHAIN_PROVABLE = {"duplicated-index", "unsorted-indices", "unknown-code"}


# ============================================================ a fallback source


def test_a_fallback_source_supplies_what_the_store_serves_wrong(world):
    """The hook for another source (e.g. an on-chain data-availability copy): the store's copy of
    step 2's log does not verify, the fallback's does, and it is used; a fallback with a wrong copy
    too leaves the interval unavailable, naming both failures."""
    w = world
    with trial("fallback source supplies a verified copy"):
        bad = encode_step_log(_other_log(w, w.honest_job, SUBST_STEP + 1), SUBST_STEP, w.ctx.job.graph)
        good = w.store.get_log(w.honest_job, SUBST_STEP)
        wrong = _auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: bad}),
                         fallbacks=[Serving(w.store, logs={SUBST_STEP: bad[:-1]})])
        u = _refused(wrong)
        assert u.error == "NotCommitted" and "fallback 1: LogTruncated" in u.reason
        fine = _auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: bad}),
                        fallbacks=[Serving(w.store, logs={SUBST_STEP: good})])
        assert fine.audit() is None and fine.signed_off()

        class Entries(Serving):  # a source of entries rather than log bytes (e.g. read from the chain)
            def get_log(self, job: Any, s: int) -> Any:
                return frame_step_log(self.inner.get_log(job, s), s, w.ctx.job.graph)

        framed = _auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: bad}), fallbacks=[Entries(w.store)])
        assert framed.audit() is None and framed.signed_off()


def test_a_missing_artifact_is_still_reported_as_withheld(world):
    class Withholding(Serving):
        def get_log(self, job: Any, s: int) -> bytes:
            if s == SUBST_STEP:
                raise MissingArtifact(f"job {job}: log of step {s} not found")
            return super().get_log(job, s)

    u = _refused(_auditor(world, world.honest_job, Withholding(world.store)))
    assert (u.artifact, u.key, u.error, u.sha256) == ("rounding log", SUBST_STEP, "MissingArtifact", None)


# ============================================================ fuzzing the readers


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, value) edits: 0 flip a byte, 1 delete one, 2 insert one, 3 truncate."""
    b = bytearray(data)
    for kind, pos, val in edits:
        if not b:
            break
        p = pos % len(b)
        if kind == 0:
            b[p] ^= val or 1
        elif kind == 1:
            del b[p]
        elif kind == 2:
            b.insert(p, val)
        else:
            del b[p:]
    return bytes(b)


EDITS = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=6)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(edits=EDITS, inside=st.booleans())
def test_fuzz_log_reader_raises_only_corrupt_log(world, edits, inside):
    """Random byte edits of a real log, either of its bytes or of its decompressed payload
    (recompressed, so the parser behind zlib is reached): it decodes, or raises a CorruptLog."""
    w = world
    # a real log, with entries of every kind (made up where the step has none: see _with_op)
    good = encode_step_log(_with_op(_log(w, w.cheat_job, CHEAT_STEP), _explicit(1.5)), CHEAT_STEP, w.ctx.job.graph)
    if inside:
        head, body = _payload(good)
        data = _repack(head, _mutate(body, edits))
    else:
        data = _mutate(good, edits)
    try:
        lg = decode_step_log(data, CHEAT_STEP, w.ctx.job.graph)
    except CorruptLog:
        return
    framed_log_root(frame_step_log(data, CHEAT_STEP, w.ctx.job.graph), w.ctx.job.graph)
    assert isinstance(lg, StepLog)


class _Bytes(ArtifactReader):
    """A reader serving fixed bytes at any path (for the parsers behind it)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def _read(self, job: str, rel: str) -> bytes:
        if rel not in self.files:
            raise MissingArtifact(rel)
        return self.files[rel]

    def _where(self, job: str, rel: str) -> str:
        return rel


@FUZZ
@given(edits=EDITS)
def test_fuzz_step_record_reader_raises_only_vtrain_errors(world, edits):
    w = world
    raw = (w.store.root / str(w.honest_job) / "steps" / "3.json").read_bytes()
    try:
        rec = _Bytes({"steps/3.json": _mutate(raw, edits)}).get_step(1, 3)
    except VtrainError:
        return
    assert isinstance(rec, StepRecord) and rec.s == 3


@FUZZ
@given(edits=EDITS)
def test_fuzz_checkpoint_reader_raises_only_vtrain_errors(world, edits):
    from protocol.agent import checkpoint_state

    w = world
    good = w.store.get_checkpoint(w.honest_job, 1)
    try:
        checkpoint_state(w.ctx, _mutate(good, edits), "fuzzed checkpoint")
    except VtrainError:
        return


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=EDITS, inside=st.booleans())
def test_fuzz_auditor_served_mutated_logs_never_crashes_nor_challenges_an_honest_trainer(world, edits, inside):
    w = world
    good = w.store.get_log(w.honest_job, SUBST_STEP)
    if inside:
        head, body = _payload(good)
        data = _repack(head, _mutate(body, edits))
    else:
        data = _mutate(good, edits)
    auditor = _auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: data}))
    assert auditor.audit() is None and auditor.disputed == []
    if auditor.signed_off():  # only when the mutation left the committed entries as they were
        assert framed_log_root(frame_step_log(data, SUBST_STEP, w.ctx.job.graph), w.ctx.job.graph) == (
            w.store.get_step(w.honest_job, SUBST_STEP).log_root)
    else:
        assert list(auditor.unavailable) == [0] and auditor.unavailable[0].key == SUBST_STEP


# ============================================================ the log reader on its own


def test_log_reader_checks_paper_trits_mode_and_payload_size(world):
    from vtrain.errors import LogCodeError, LogHeaderError, LogTrailingBytes
    from vtrain.numerics.paper import hooked_ops
    from vtrain.numerics.rounding import Mode

    w = world
    graph = w.ctx.job.graph
    good = w.store.get_log(w.honest_job, SUBST_STEP)
    with pytest.raises(LogHeaderError, match="expected mode paper, got certified"):
        frame_step_log(good, SUBST_STEP, graph, Mode.PAPER)
    head, _ = _payload(good)
    zipped = head[:6] + bytes([0x80]) + head[7:]  # certified, payload compressed
    bomb = zipped + zlib.compress(b"\0" * (10 * 2**20))  # far more than any log of this graph
    with pytest.raises(LogTrailingBytes, match="at most"):
        decode_step_log(bomb, SUBST_STEP, graph)
    with pytest.raises(LogTrailingBytes, match="at most"):  # the same uncompressed
        decode_step_log(head[:6] + bytes([0]) + head[7:] + b"\0" * (10 * 2**20), SUBST_STEP, graph)
    paper_head = head[:6] + bytes([0x81]) + head[7:]  # paper, payload compressed
    n = sum((graph.ops[o].numel + 4) // 5 for o in hooked_ops(graph))  # the paper's hooks (paper.py)
    ok = decode_step_log(paper_head + zlib.compress(b"\1" * n), SUBST_STEP, graph)
    assert ok.mode == Mode.PAPER and all(len(d.trits) == graph.ops[o].numel for o, d in ok.dense.items())
    with pytest.raises(LogCodeError, match="expected packed trits below 243, got 250"):
        decode_step_log(paper_head + zlib.compress(b"\xfa" * n), SUBST_STEP, graph)


def test_paper_mode_logs_are_never_used_by_the_auditor(world):
    """Paper mode commits no log root: its logs cannot be verified, so the auditor does not replay."""
    w = world
    ctx = JobContext.of(replace(default_spec("mlp"), mode="paper"))
    job = create_job(w.proto, w.accounts[1], w.accounts[2], ctx, TERMS)
    with tempfile.TemporaryDirectory() as d:
        trainer = TrainerAgent(w.proto, w.accounts[2], ctx, ArtifactStore(d), job)
        trainer.accept(TERMS)
        trainer.run_interval()
        auditor = AuditorAgent(w.proto, w.accounts[3], ctx, ArtifactStore(d), job)
        u = _refused(auditor)
        assert (u.artifact, u.error) == ("rounding log", "NotCommitted") and "mode paper" in u.reason


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_valid_log_hashes_the_same_framed_as_checked(world, data):
    """For any log that follows the rules, the root of its entries as framed (what a malformed
    commitment would hash) is the committed root the trainer computes (``step_log_root_of``)."""
    from vtrain.commit.roots import op_log_root, step_log_root
    from vtrain.commit.trace import op_log_entries
    from vtrain.numerics.rounding import Mode
    from vtrain.training.loop import step_log_root_of

    graph = world.ctx.job.graph
    ops = data.draw(st.lists(st.sampled_from([op.id for op in graph.ops if op.numel]), max_size=4, unique=True))
    sparse = {}
    for o in ops:
        numel = graph.ops[o].numel
        idx = sorted(data.draw(st.sets(st.integers(0, numel - 1), max_size=min(numel, 12))))
        codes = data.draw(st.lists(st.sampled_from([1, 2, 3]), min_size=len(idx), max_size=len(idx)))
        vals = data.draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=len(idx),
                                  max_size=len(idx)))
        sparse[o] = _entries(idx, codes, [v if c == 3 else 0.0 for v, c in zip(vals, codes, strict=True)])
    lg = StepLog(Mode.CERTIFIED, sparse)
    raw = encode_step_log(lg, 5, graph)
    # the reference: leaf by leaf through LogEntry (vtrain.commit.roots.op_log_root), not the array path
    reference = step_log_root([op_log_root(op_log_entries(lg, op.id)) for op in graph.ops])
    assert framed_log_root(frame_step_log(raw, 5, graph), graph) == reference == step_log_root_of(lg, graph)
    back = decode_step_log(raw, 5, graph)
    assert step_log_root_of(back, graph) == reference


def test_the_auditor_cli_reports_each_unavailable_interval_once(world, capsys):
    from protocol.agents_cli import Out, _report_blocked

    w = world
    data = encode_step_log(_other_log(w, w.honest_job, SUBST_STEP + 1), SUBST_STEP, w.ctx.job.graph)
    auditor = _auditor(w, w.honest_job, Serving(w.store, logs={SUBST_STEP: data}))
    u = _refused(auditor)
    out, reported = Out.make("auditor", w.honest_job, events=True), {}
    assert _report_blocked(auditor, out, reported) is True
    first = capsys.readouterr()
    assert f'"sha256": "{_sha(data)}"' in first.out and '"event": "unavailable"' in first.out
    assert "unavailable" in first.err and u.sha256 in first.out
    assert _report_blocked(auditor, out, reported) is True
    assert capsys.readouterr().out == ""  # the same reason is not repeated on every poll
    auditor.unavailable.clear()
    assert _report_blocked(auditor, out, reported) is False and reported == {}


# -- sizes: nothing served is read into memory past what the job can need ---------------------------


def test_a_served_blob_larger_than_the_job_allows_is_refused_before_it_is_read(world, tmp_path):
    """The trainer's server names, for one step's log, a blob larger than any log of the job can be
    (the blob is there and hashes to its name): the auditor refuses it unread (`ArtifactTooLarge`,
    sizes named), never fetching it; an honest copy served later is accepted."""
    import json
    import shutil

    from protocol.auditor import artifact_bound
    from protocol.store import HttpArtifactReader, serve_store

    w = world
    with trial("log blob larger than the job's bound"):
        shutil.copytree(w.store.root, tmp_path / "s")
        store = ArtifactStore(tmp_path / "s")
        big = b"\0" * (artifact_bound(w.ctx) + 1)
        digest = store.put_blob(w.honest_job, big)
        index = tmp_path / "s" / str(w.honest_job) / "logs" / "3.json"
        honest = index.read_bytes()
        index.write_text(json.dumps({"digest": "0x" + digest.hex(), "size": len(big)}))
        server, url = serve_store(tmp_path / "s")
        try:
            reader = HttpArtifactReader(url, retries=0)
            auditor = _auditor(w, w.honest_job, reader)
            assert reader.max_blob_bytes == artifact_bound(w.ctx)
            u = _refused(auditor)
            assert (u.artifact, u.key, u.error) == ("rounding log", 3, "ArtifactTooLarge")
            assert f"names a blob of {len(big)} bytes, more than the {artifact_bound(w.ctx)} bytes" in u.reason
            index.write_bytes(honest)
            assert auditor.audit() is None and auditor.signed_off()
        finally:
            server.shutdown()
            server.server_close()


def test_a_server_dripping_bytes_is_cut_off_at_the_reads_deadline():
    """A trainer's server that sends a byte every 0.1 s (each socket read succeeds, so no timeout
    fires) would hold the auditor past its challenge window: the read is cut off at its deadline."""
    import http.server
    import threading
    import time

    from protocol.store import ArtifactUnavailable, HttpArtifactReader

    class Drip(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(100):  # 10 s unless the reader hangs up
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = HttpArtifactReader(f"http://127.0.0.1:{server.server_address[1]}", retries=0, timeout=2.0,
                                    read_deadline=1.0)
        t0 = time.monotonic()
        with pytest.raises(ArtifactUnavailable, match="still sending after the read's deadline"):
            reader.get_step(1, 1)
        assert time.monotonic() - t0 < 4.0
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("how", ["no-length", "huge-length"])
def test_a_server_streaming_without_end_is_cut_off_at_the_limit(how):
    """A server answering a step record with an endless body (or a Content-Length of 100 GB) makes
    the reader refuse it after at most MAX_JSON_BYTES + 1 bytes (or before reading any)."""
    import http.server
    import threading

    from protocol.store import MAX_JSON_BYTES, ArtifactTooLarge, HttpArtifactReader

    sent = []

    class Endless(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            if how == "huge-length":
                self.send_header("Content-Length", str(10**11))
            self.end_headers()
            chunk = b" " * (1 << 20)
            try:
                for _ in range(64):  # 64 MiB unless the reader hangs up
                    self.wfile.write(chunk)
                    sent.append(len(chunk))
            except OSError:
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = HttpArtifactReader(f"http://127.0.0.1:{server.server_address[1]}", retries=0)
        with pytest.raises(ArtifactTooLarge, match=f"expected at most {MAX_JSON_BYTES} bytes, got"):
            reader.get_step(1, 1)
    finally:
        server.shutdown()
        server.server_close()
    assert sum(sent) < 64 << 20  # the reader hung up early
