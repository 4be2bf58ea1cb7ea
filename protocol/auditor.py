"""The auditor agent: replays every posted interval with the trainer's logs on its own hardware,
settles any element the rounding rule alone cannot with exact arithmetic (the same rule the
contract applies), and challenges the first interval whose root differs from its own."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from web3.logs import DISCARD

from protocol.agent import Player, checkpoint_bytes, checkpoint_state, job_first_block
from protocol.deploy import Protocol
from protocol.game import PARTY_CHALLENGER, ChallengerStrategy, StepBook
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactReader, ArtifactStore, StepRecord
from vtrain.commit.roots import LogEntry, decode_log_leaf, interval_root, state_root
from vtrain.commit.trace import StepTrace, framed_log_root, framed_op_log_leaves, framed_op_log_roots
from vtrain.errors import (
    CorruptArtifact,
    CorruptCheckpoint,
    LogEntryError,
    LogFramingError,
    MissingArtifact,
    NonFiniteValue,
    NotCommitted,
    VtrainError,
)
from vtrain.graph.executor import StepLog, state_tensors
from vtrain.graph.step_graph import OpKind, OpNode
from vtrain.numerics.exact import Partial
from vtrain.numerics.logfile import FramedLog, check_step_log, encode_step_log, frame_step_log
from vtrain.numerics.rounding import Mode, OpLog, declare_upholds_rn32_entries
from vtrain.training.loop import NonFiniteSite, component_roots, locate_nonfinite, replay_steps
from vtrain.training.rundir import atomic_write

log = logging.getLogger(__name__)


def exact_resolver(ctx: JobContext, overruled: list[tuple[int, int]] | None = None):
    """Resolver factory for :func:`vtrain.numerics.rounding.apply_log`: keep the trainer's value where the
    contract would uphold it (only ``RN32(e)``, wide-span sums included, but for a transcendental whose
    2^-109 bracket (ERF: 2^-80) held a midpoint), else take the exact rounding (``vtrain.numerics.exact``;
    EXP LOG TANH ERF: the value at 400 bits, mpmath, whose RN32 is the correctly rounded result). Every overruled
    element (op, index) is appended to ``overruled``.

    Entries the replay did not flag are checked against ``RN32(e)`` first, in one batch
    (:func:`vtrain.numerics.canonical.is_exact_rounding`): the contract demands that value of every claim,
    so an entry that gives another (a near-tie logged on the wrong side, a wrong explicit value) is a
    fraud the auditor wins; it is ruled like a flagged element, and the replay takes ``RN32(e)``.

    A flagged *explicit* entry of a sum (MATMUL, SUM, MEAN) whose value is ``RN32(e)`` by that same
    check is upheld without an exact ruling: the rule keeps an explicit claim equal to its entry's
    value exactly when ``RN32(lo) <= claimed <= RN32(hi)`` for the enclosure ``lo <= e <= hi`` (finite,
    not -0), which ``claimed = RN32(e)`` meets (RN32 is monotone). The replay flags such entries
    whenever FP32 spacing dwarfs the tight bound (d 256 GPT: ~100 a step, 1.5 ms each in rationals).

    A claim that does not stand where the exact value has no finite FP32 value (overflow past
    FLT_MAX, division by zero, log of x <= 0, ...: ``exact.no_finite_value``) is overruled too, and
    the replay stops there: a NonFiniteValue naming the element (``op``, ``index``), the dispute
    target of :func:`vtrain.training.loop.locate_nonfinite` (the honest trainer stops there)."""
    from vtrain.numerics.canonical import is_exact_rounding
    from vtrain.numerics.exact import SIGN, UnsupportedOp, exact_value, judge_element, no_finite_value, rn32

    descs = ctx.graph.descriptors

    def factory(op: OpNode, ins: list[torch.Tensor]):
        held: list[list[np.ndarray]] = []  # the inputs as numpy, made on first use (most ops need none)

        def tensors() -> list[np.ndarray]:
            if not held:
                held.append([t.detach().numpy() for t in ins])
            return held[0]

        def resolve(
            indices: np.ndarray, proposed: np.ndarray, codes: np.ndarray, flagged: np.ndarray | None = None
        ) -> np.ndarray:
            out = proposed.copy()
            bits = proposed.view(np.uint32)
            rule = np.ones(len(indices), dtype=bool) if flagged is None else flagged.copy()
            upheld = _explicit_at_rn32(indices, bits, codes, rule)
            unchecked = (~rule).nonzero()[0]
            if len(unchecked):
                try:
                    right = is_exact_rounding(op, descs[op.id], ins, indices[unchecked], bits[unchecked])
                except UnsupportedOp:
                    right = np.ones(len(unchecked), dtype=bool)  # a kind the adjudicator does not rule on
                rule[unchecked[~right]] = True
            for k in (rule & ~upheld).nonzero()[0].tolist():
                i, c = int(indices[k]), int(codes[k])
                entry = LogEntry(i, c, int(bits[k]) if c == 3 else 0) if c else None
                try:
                    if judge_element(descs[op.id], tensors(), i, int(bits[k]), entry):
                        continue
                    if overruled is not None:
                        overruled.append((op.id, i))
                    if no_finite_value(descs[op.id], tensors(), i):
                        # The claim does not stand and no finite one would: the honest trainer stops
                        # here, so this element is the dispute target (loop.locate_nonfinite).
                        raise NonFiniteValue(
                            f"{op.kind.name} op {op.id}: element {i}: the trainer's claim {int(bits[k]):#010x} "
                            "does not stand and the exact value has no finite FP32 value", op=op.id, index=i)
                    out[k] = np.array(rn32(exact_value(descs[op.id], tensors(), i)), np.uint32).view(np.float32)
                except UnsupportedOp:
                    continue  # a kind the adjudicator does not rule on (none rounds today): follow the log
            return out

        def _explicit_at_rn32(indices: np.ndarray, bits: np.ndarray, codes: np.ndarray, rule: np.ndarray) -> np.ndarray:
            """Flagged explicit entries of a sum whose claim is ``RN32(e)``: the rule upholds them."""
            upheld = np.zeros(len(indices), dtype=bool)
            if op.kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN) or not rule.any():
                return upheld
            finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
            pick = np.flatnonzero(rule & (codes == 3) & finite & (bits != np.uint32(SIGN)))
            if len(pick):
                try:
                    upheld[pick] = is_exact_rounding(op, descs[op.id], ins, indices[pick], bits[pick])
                except UnsupportedOp:
                    pass  # ruled one by one below
            return upheld

        return resolve

    # resolve returns an unflagged key unchanged where is_exact_rounding holds, which the replay's
    # kernel verdict YES (not -0) implies: such ops need not call it (rounding.UPHOLDS_RN32_ENTRIES)
    return declare_upholds_rn32_entries(factory)


def artifact_bound(ctx: JobContext) -> int:
    """Most bytes one artifact of ``ctx``'s job can have: a rounding log (at most 10 bytes an entry,
    one entry an element of every op, plus framing) or a checkpoint (4 bytes an element of the
    state plus its header), with 1 MiB to spare. Served blobs larger than this are refused unread."""
    graph = ctx.job.graph
    elements = sum(op.numel for op in graph.ops) + sum(math.prod(s.shape) for s in graph.slots)
    return (1 << 20) + 16 * elements + 256 * len(graph.slots)


def bound_reads(source: Any, limit: int) -> None:
    """Have ``source`` (an :class:`ArtifactReader`, or one wrapping another as ``inner`` or
    ``primary``) refuse any blob over ``limit`` bytes before reading it. Other sources (e.g. the
    on-chain one) read nothing unbounded."""
    if not isinstance(source, ArtifactReader):
        return
    source.max_blob_bytes = limit
    for name in ("inner", "primary"):
        inner = getattr(source, "__dict__", {}).get(name)
        if inner is not None:
            bound_reads(inner, limit)


@dataclass(frozen=True)
class Unavailable:
    """Why the trainer's artifacts of ``interval`` cannot be used: no source served a copy that
    verifies against the chain. It blocks sign-off and is retried on every audit; it is never
    grounds for a challenge (an unverified artifact proves nothing about the trainer's commitment).

    ``artifact`` is ``"step record"``, ``"rounding log"``, ``"checkpoint"`` or ``"replay"`` (the
    verified inputs could not be replayed); ``key`` its step (the checkpoint's: its interval);
    ``error`` the narrow exception type of the failure (``MissingArtifact``, ``NotCommitted``,
    ``LogIndexOrderError``, ...); ``sha256`` of the bytes served, when any were (of a step record:
    its canonical JSON)."""

    interval: int
    artifact: str
    key: int
    error: str
    reason: str
    sha256: str | None = None
    op: int | None = None

    def __str__(self) -> str:
        of = "interval" if self.artifact == "checkpoint" else "step"
        op = f", op {self.op}" if self.op is not None else ""
        sha = f" (sha256 {self.sha256})" if self.sha256 else ""
        return f"interval {self.interval}: {self.artifact} of {of} {self.key}{op}{sha}: {self.error}: {self.reason}"


@dataclass(frozen=True)
class MalformedCommittedLog:
    """Step ``step``'s rounding log *as committed*: its entries hash to the ``logRoot_s`` of the
    step leaf the trainer posted, yet break the log format's rules at op ``op`` (unsorted or
    repeated indices, an index past the op, an unknown code, a non-finite explicit value). Provable
    from the log and the chain alone, not by replay: the case for the data-availability fraud proof.
    It blocks sign-off and is never a replay challenge."""

    interval: int
    step: int
    op: int
    error: str
    reason: str
    sha256: str
    leaves: tuple[bytes, ...] = field(default=(), repr=False)
    """The op's log leaves as committed (the proof's material)."""
    op_roots: tuple[bytes, ...] = field(default=(), repr=False)
    """Every op's log root of the step as committed (they hash to ``logRoot_s``)."""

    def __str__(self) -> str:
        return (f"interval {self.interval}: the committed rounding log of step {self.step} (sha256 {self.sha256}) "
                f"is malformed at op {self.op}: {self.error}: {self.reason}")


@dataclass(frozen=True)
class VerifiedInterval:
    """The trainer's artifacts of ``interval``, every one checked against the chain: its step
    records (their leaves hash to the posted interval root), each step's rounding log (its entries
    hash to that step's committed ``logRoot_s``; empty for modes without logs) and, when the
    auditor has no state of its own before the interval, the trainer's checkpoint (its state root
    is the ``stateRoot`` committed at the step before)."""

    interval: int
    records: dict[int, StepRecord]
    logs: dict[int, StepLog]
    start: list[torch.Tensor] | None = None


StepData = VerifiedInterval | Unavailable | MalformedCommittedLog


class IntervalUnavailable(MissingArtifact):
    """Raised where a game move needs an interval's verified artifacts and none can be had (the
    :class:`Unavailable` is its message)."""


class _Rejected(Exception):
    """One source's copy of one artifact failed verification (internal to the auditor)."""

    def __init__(self, error: VtrainError, sha256: str | None = None, op: int | None = None, key: int | None = None):
        super().__init__(str(error))
        self.error, self.sha256, self.op, self.key = error, sha256, op, key


T = TypeVar("T")


def _as_step_log(framed: FramedLog) -> StepLog:
    """The entries of ``framed`` as a StepLog, unchecked (only to encode them for their sha256)."""
    return StepLog(framed.mode, {o: OpLog(e.index.astype(np.int64), e.code, e.value_bits.view(np.float32))
                                 for o, e in framed.sparse.items()})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class AuditorAgent:
    proto: Protocol
    account: str
    ctx: JobContext
    reader: ArtifactReader
    job_id: int
    honest: bool = True
    sample: float = 1.0
    device: str = "cpu"  # where the replays compute (cpu or cuda[:N]); the rule is device independent
    """Fraction of intervals to replay (1.0: all). A skipped interval is trusted; the next sampled
    one starts from the trainer's checkpoint, checked against the trainer's committed step leaf."""
    book: StepBook = field(init=False)
    player: Player = field(init=False)
    verified: int = 0  # intervals processed so far (replayed or skipped)
    skipped: list[int] = field(default_factory=list)
    disputed: list[int] = field(default_factory=list)
    overruled_steps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Steps where the trainer's log claimed a value the contract would not uphold (log abuse),
    even if the difference was absorbed before the state: still a provable lie in the trace."""
    withheld: dict[int, str] = field(default_factory=dict)
    """Intervals that could not be replayed because the trainer's artifacts (step records, logs,
    checkpoints) are missing, unreachable or do not verify against the chain: interval -> why (the
    text of :attr:`unavailable`). Retried on every :meth:`audit`; the job is not signed off while
    any is left (see :meth:`signed_off`)."""
    unavailable: dict[int, Unavailable] = field(default_factory=dict)
    """The same intervals, with what failed (artifact, step, op, error type, sha256 of the bytes)."""
    malformed: dict[int, MalformedCommittedLog] = field(default_factory=dict)
    """Intervals with a step whose *committed* rounding log is malformed (for the on-chain
    data-availability proof); they block sign-off and are never challenged by replay."""
    fallbacks: list[Any] = field(default_factory=list)
    """Further artifact sources (objects with ``get_step``, ``get_log``, ``get_checkpoint`` like an
    :class:`ArtifactReader`, raising a VtrainError for what they lack; ``get_log`` may return a
    :class:`~vtrain.numerics.logfile.FramedLog` of entries instead of bytes), tried in order for any
    artifact whose copy from :attr:`reader` does not verify: e.g. an on-chain data-availability
    copy. Whatever they serve is verified exactly like the reader's (see :meth:`_verified_step_data`)."""
    flagged: list[int] = field(default_factory=list)
    """Intervals the replay found wrong (returned by :meth:`audit`)."""
    nonfinite: dict[int, NonFiniteSite] = field(default_factory=dict)
    """Flagged intervals whose correct computation has no finite value at an element the trainer
    posted (interval -> where): the game descends to that element (steps from it on, ops from it
    on, disagreed) and the contract rules the claim there false (docs/protocol.md)."""
    _states: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    _committed: dict[int, dict[int, StepRecord]] = field(default_factory=dict)
    _verified: dict[int, VerifiedInterval] = field(default_factory=dict)
    state: ArtifactStore | None = None
    """Where the auditor keeps its own replay results (records, the state at each interval's end,
    progress): a restarted auditor resumes from them instead of replaying the whole job again."""
    _pending_bad: int | None = None
    _proofs_sent: set[int] = field(default_factory=set)
    onchain: Any = None
    """A :class:`protocol.availability.OnChainArtifacts`: step records and logs the reader cannot
    serve are demanded on-chain and read back, verified, from the published events."""

    def __post_init__(self) -> None:
        # First of all: the spec (and so the pinned model source and checkpoint) must be the job's
        # before its job is built, i.e. before any of the model's code runs or bytes are loaded.
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))
        if self.onchain is not None:  # asked for whatever the reader cannot serve verified
            self.fallbacks.append(self.onchain)
        bound = artifact_bound(self.ctx)  # no served blob larger than the job's can be read into memory
        for src in self._sources():
            bound_reads(src, bound)
        self.book = StepBook(self.ctx)
        self.player = Player(self.proto, self.account, PARTY_CHALLENGER)
        self._states[0] = state_tensors(self.ctx.job.initial_state)
        self._trace = lru_cache(maxsize=4)(self._regenerate)
        if self.state is not None:
            self._restore()

    # -- its own progress, on disk ------------------------------------------------------------------
    def _progress_path(self) -> Path:
        assert self.state is not None
        return Path(self.state.root) / str(self.job_id) / "audit.json"

    def _save(self, roots: list[bytes], bad: int | None) -> None:
        """Persist the interval just replayed (its records and end state, then the progress file:
        a crash in between leaves the old progress, which is still true)."""
        if self.state is None:
            return
        i = self.verified - 1
        first, n = self.ctx.interval_span(i)
        if i not in self.skipped:
            for s in range(first, first + n):
                self.state.put_step(self.job_id, self.book.records[s], replace=True)
            self.state.put_checkpoint(
                self.job_id, i + 1, checkpoint_bytes(self.ctx, self._states[first + n - 1]), replace=True
            )
        old = self._read_progress() or {}
        progress = {
            "job": self.job_id,
            "verified": self.verified,
            "roots": [r.hex() for r in roots[: self.verified]],
            "skipped": self.skipped,
            "bad": old.get("bad") if old.get("bad") is not None else bad,
            "overruled": {str(k): v for k, v in self.overruled_steps.items()},
        }
        atomic_write(self._progress_path(), json.dumps(progress, sort_keys=True).encode())

    def _read_progress(self) -> dict | None:
        p = self._progress_path()
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            log.warning("job %d: ignoring unreadable progress file %s (%s)", self.job_id, p, e)
            return None
        return d if isinstance(d, dict) else None

    def _restore(self) -> None:
        """Resume from the saved progress; anything missing, corrupt or not matching the chain
        means a full replay (never a verdict taken from a damaged file)."""
        d = self._read_progress()
        if not d:
            return
        try:
            verified = int(d["verified"])
            roots = self.posted()
            if (
                d.get("job") != self.job_id
                or verified > len(roots)
                or [bytes.fromhex(r) for r in d["roots"]] != roots[:verified]
            ):
                raise ValueError("does not match the roots posted on-chain")
            skipped = [int(i) for i in d.get("skipped", [])]
            records: dict[int, StepRecord] = {}
            states: dict[int, list[torch.Tensor]] = {}
            for i in range(verified):
                if i in skipped:
                    continue
                first, n = self.ctx.interval_span(i)
                for s in range(first, first + n):
                    records[s] = self.state.get_step(self.job_id, s)  # type: ignore[union-attr]
                end = self.state.get_checkpoint(self.job_id, i + 1)  # type: ignore[union-attr]
                states[first + n - 1] = checkpoint_state(self.ctx, end, f"saved state after interval {i}")
                if state_root(component_roots(states[first + n - 1])) != records[first + n - 1].state_root:
                    raise CorruptArtifact(f"saved state after interval {i} is not the state its record commits to")
            overruled = {int(k): [tuple(e) for e in v] for k, v in d.get("overruled", {}).items()}
            bad = d.get("bad")
        except (KeyError, TypeError, ValueError, VtrainError) as e:
            log.warning(
                "job %d: not resuming from %s (%s); replaying from the start", self.job_id, self._progress_path(), e
            )
            return
        self.book.records.update(records)
        self._states.update(states)
        self.verified, self.skipped = verified, skipped
        self.overruled_steps.update(overruled)  # type: ignore[arg-type]
        self._pending_bad = int(bad) if bad is not None else None
        log.info(
            "job %d: resumed the audit after interval %d from %s", self.job_id, verified - 1, self._progress_path()
        )

    # -- the trainer's artifacts: obtained and verified here, and only here ---------------------------
    def _verified_step_data(self, interval: int) -> StepData:
        """THE one place where the auditor obtains the trainer's artifacts of ``interval`` and checks
        each against the chain before anything uses it:

        * step records: the leaves ``uint64be(s) || stateRoot_s || logRoot_s`` of the interval's
          records must hash to the interval root posted on-chain (each record's state root is the
          tree of its components, checked when it is read);
        * rounding logs: each op's entries, exactly as the bytes frame them, must hash to that op's
          log root and those to the step's committed ``logRoot_s``; then the entries must follow the
          format's rules (else :class:`MalformedCommittedLog`: the trainer committed a malformed log);
        * the checkpoint the interval starts from, when the auditor has no state of its own there:
          its state root must be the ``stateRoot`` committed at the step before (interval ``i-1``'s
          verified records).

        Each artifact is asked of :attr:`reader`, then of each of :attr:`fallbacks`, until a copy
        verifies; a copy that does not is dropped from the reader's cache. Returns the
        :class:`VerifiedInterval`, or :class:`Unavailable` naming the first artifact no source could
        supply verified (with what failed), or the :class:`MalformedCommittedLog` found. Never raises
        for anything a source serves."""
        first, n = self.ctx.interval_span(interval)
        records = self._verified_records(interval)
        if not isinstance(records, dict):
            return records
        start: list[torch.Tensor] | None = None
        if self._states.get(first - 1) is None:
            checkpoint = self._verified_checkpoint(interval)
            if isinstance(checkpoint, Unavailable):
                return checkpoint
            start = checkpoint
        logs: dict[int, StepLog] = {}
        mode = Mode(self.ctx.spec.mode)
        if mode == Mode.PAPER:
            return Unavailable(interval, "rounding log", first, "NotCommitted",
                               "expected a committed log root, got mode paper (logRoot_s = 0): its logs "
                               "cannot be checked against the chain, so they are never used")
        if mode == Mode.CERTIFIED:
            for s in range(first, first + n):
                lg = self._verified_log(interval, s, records[s].log_root)
                if not isinstance(lg, StepLog):
                    return lg
                logs[s] = lg
        return VerifiedInterval(interval, records, logs, start)

    def _sources(self) -> list[Any]:
        return [self.reader, *self.fallbacks]

    def _first_verified(
        self, interval: int, artifact: str, key: int, kind: str, check: Callable[[Any], T]
    ) -> T | Unavailable:
        """``check(source)`` of the first source whose copy passes it; else Unavailable with the
        failure of the reader's copy (and the fallbacks' in the reason)."""
        failures: list[Unavailable] = []
        for src in self._sources():
            try:
                return check(src)
            except _Rejected as r:
                u = Unavailable(interval, artifact, key if r.key is None else r.key, type(r.error).__name__,
                                str(r.error), r.sha256, r.op)
            except VtrainError as e:  # missing, unreachable, corrupt in the store (hash, JSON, size)
                u = Unavailable(interval, artifact, key, type(e).__name__, str(e))
            failures.append(u)
            self._forget(src, kind, u.key)
        if len(failures) > 1:
            more = "; ".join(f"fallback {k}: {f.error}: {f.reason}" for k, f in enumerate(failures[1:], 1))
            u = failures[0]
            return Unavailable(u.interval, u.artifact, u.key, u.error, f"{u.reason}; {more}", u.sha256, u.op)
        return failures[0]

    def _posted_root(self, interval: int) -> bytes:
        return bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, interval))[0])

    def _verified_records(self, interval: int) -> dict[int, StepRecord] | Unavailable:
        """The trainer's step records of ``interval``, verified against the posted interval root."""
        if interval in self._committed:
            return self._committed[interval]
        first, n = self.ctx.interval_span(interval)
        posted = self._posted_root(interval)

        def check(src: Any) -> dict[int, StepRecord]:
            recs = []
            for t in range(first, first + n):
                try:
                    rec = src.get_step(self.job_id, t)
                except VtrainError as e:
                    raise _Rejected(e, key=t) from None
                if not isinstance(rec, StepRecord) or rec.s != t:
                    raise _Rejected(CorruptArtifact(f"expected the step record of step {t}, got {rec!r:.80}"), key=t)
                recs.append(rec)
            got = interval_root([r.leaf() for r in recs])
            if got != posted:
                for t in range(first, first + n):  # which of them is wrong is unknown: ask again for all
                    self._forget(src, "step", t)
                body = json.dumps([r.to_json() for r in recs], sort_keys=True, separators=(",", ":")).encode()
                raise _Rejected(
                    NotCommitted(
                        f"expected step leaves hashing to the posted interval root {posted.hex()}, got records of "
                        f"steps {first}..{first + n - 1} hashing to {got.hex()}"
                    ),
                    sha256=_sha256(body),
                )
            return {r.s: r for r in recs}

        got = self._first_verified(interval, "step record", first, "step", check)
        if isinstance(got, dict):
            self._committed[interval] = got
        return got

    def _verified_log(self, interval: int, s: int, committed: bytes) -> StepLog | Unavailable | MalformedCommittedLog:
        """Step ``s``'s rounding log, verified against its committed ``logRoot_s``."""
        graph = self.ctx.job.graph

        def check(src: Any) -> StepLog | MalformedCommittedLog:
            data = src.get_log(self.job_id, s)
            if isinstance(data, FramedLog):  # a source holding entries, not log bytes (e.g. read from the chain)
                if data.step != s or data.mode != Mode.CERTIFIED:
                    raise _Rejected(CorruptArtifact(
                        f"expected the certified log of step {s}, got the {data.mode.value} log of step {data.step}"))
                framed = data
                sha = _sha256(encode_step_log(_as_step_log(framed), s, graph))
            else:
                sha = _sha256(data)
                try:
                    framed = frame_step_log(data, s, graph, Mode.CERTIFIED)
                except LogFramingError as e:
                    raise _Rejected(e, sha) from None
            got = framed_log_root(framed, graph)
            try:
                lg = check_step_log(framed, graph)
            except LogEntryError as e:
                if got == committed:
                    return MalformedCommittedLog(interval, s, e.op, type(e).__name__, str(e), sha,
                                                 tuple(framed_op_log_leaves(framed, e.op)),
                                                 tuple(framed_op_log_roots(framed, graph)))
                raise _Rejected(e, sha, e.op) from None
            if got != committed:
                raise _Rejected(
                    NotCommitted(
                        f"expected entries hashing to the committed logRoot_{s} {committed.hex()}, got {got.hex()}"
                    ),
                    sha,
                )
            return lg

        return self._first_verified(interval, "rounding log", s, "log", check)

    def _verified_checkpoint(self, interval: int) -> list[torch.Tensor] | Unavailable:
        """The trainer's state at the start of ``interval``, verified against the ``stateRoot``
        committed at its step before (in the verified records of interval ``interval - 1``)."""
        first, _ = self.ctx.interval_span(interval)
        prev = self._verified_records(interval - 1)
        if not isinstance(prev, dict):
            return Unavailable(interval, "checkpoint", interval, prev.error,
                               f"the records committing to its state do not verify ({prev})", prev.sha256)
        want = prev[first - 1].state_root

        def check(src: Any) -> list[torch.Tensor]:
            data = src.get_checkpoint(self.job_id, interval)
            sha = _sha256(data)
            try:
                state = checkpoint_state(self.ctx, data, f"checkpoint of interval {interval}")
            except CorruptCheckpoint as e:
                raise _Rejected(e, sha) from None
            got = state_root(component_roots(state))
            if got != want:
                raise _Rejected(
                    NotCommitted(
                        f"expected the state committed at step {first - 1} (stateRoot {want.hex()}), "
                        f"got a state with root {got.hex()}"
                    ),
                    sha,
                )
            return state

        return self._first_verified(interval, "checkpoint", interval, "checkpoint", check)

    def _logs(self, s: int) -> StepLog:
        """Step ``s``'s verified rounding log (for a replay in a game); IntervalUnavailable if
        its interval's artifacts cannot be had verified."""
        i = (s - 1) // self.ctx.spec.interval
        if i not in self._verified:
            got = self._verified_step_data(i)
            if not isinstance(got, VerifiedInterval):
                raise IntervalUnavailable(str(got))
            self._verified[i] = got
        return self._verified[i].logs[s]

    def _forget(self, src: Any, kind: str, key: int) -> None:
        forget = getattr(src, "forget", None)
        if forget is not None:
            forget(kind, self.job_id, key)

    def _block(self, i: int, why: Unavailable | MalformedCommittedLog) -> None:
        """Interval ``i`` cannot be audited now: record why (no sign-off), retried next audit."""
        if isinstance(why, MalformedCommittedLog):
            self.malformed[i] = why
            self.unavailable.pop(i, None)
            self.withheld.pop(i, None)
            log.warning("job %d: %s; NOT signing off this job (a case for the on-chain data-availability proof)",
                        self.job_id, why)
            return
        self.unavailable[i] = why
        self.withheld[i] = str(why)
        self.malformed.pop(i, None)
        log.warning(
            "job %d: interval %d cannot be replayed, the trainer's artifacts are unavailable (%s); "
            "NOT signing off this job",
            self.job_id,
            i,
            why,
        )

    def posted(self) -> list[bytes]:
        n = int(self.proto.chain.call(self.proto.registry.functions.getJob(self.job_id))[4])
        return [
            bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0]) for i in range(n)
        ]

    def prove_malformed(self, interval: int) -> bool:
        """Convict the trainer on-chain for interval ``interval``'s malformed committed log
        (``DataAvailability.proveMalformedLog``: two adjacent leaves out of order, or a leaf whose
        code or value breaks the format, proven against the posted roots); once per interval. False
        when there is no availability contract or the malformation is not one the contract checks
        (an index past the op's size, a NaN explicit value): the job is then only not signed off."""
        m = self.malformed.get(interval)
        da = getattr(self.proto, "availability", None)
        if m is None or da is None or not m.leaves or interval in self._proofs_sent:
            return False
        self._proofs_sent.add(interval)
        from protocol.availability import log_run
        from protocol.chain import ChainError

        recs = [r for _, r in sorted(self._committed.get(interval, {}).items())]
        first, end = _malformed_window(m.leaves)
        run = log_run(recs, m.step, list(m.op_roots), m.op, list(m.leaves), first, end)
        try:
            self.proto.chain.send(da.functions.proveMalformedLog(self.job_id, interval, m.step, m.op, run),
                                  self.account, what=f"proveMalformedLog(job {self.job_id}, step {m.step}, op {m.op})")
        except ChainError as e:
            log.warning("job %d: the malformed log of step %d op %d is not provable on-chain (%s)",
                        self.job_id, m.step, m.op, e)
            return False
        log.warning("job %d: proved on-chain that step %d's committed log is malformed at op %d: trainer convicted",
                    self.job_id, m.step, m.op)
        return True

    def audit(self) -> int | None:
        """Replay every newly posted interval; return the first interval whose root differs."""
        if self._pending_bad is not None:  # found before a restart, maybe not challenged yet
            bad, self._pending_bad = self._pending_bad, None
            if bad not in self.flagged:
                self.flagged.append(bad)
            return bad
        roots = self.posted()
        while self.verified < len(roots):
            i = self.verified
            first, n = self.ctx.interval_span(i)
            if not self._sampled(i):
                self.skipped.append(i)
                self.verified += 1
                self._save(roots, None)
                continue
            if i in self.nonfinite:  # found before: its game needs no second replay
                return i
            data = self._verified_step_data(i)
            if not isinstance(data, VerifiedInterval):
                self._block(i, data)
                if isinstance(data, MalformedCommittedLog):
                    self.prove_malformed(i)
                return None
            self.unavailable.pop(i, None)
            self.withheld.pop(i, None)
            self.malformed.pop(i, None)
            if data.start is not None:
                self._states[first - 1] = data.start
            state = self._states[first - 1]
            overruled: list[tuple[int, int]] = []
            self._verified = {i: data, **{k: v for k, v in self._verified.items() if k in self.flagged}}
            done = first - 1  # the last step replayed
            try:
                for o in replay_steps(
                    self.ctx.job,
                    state,
                    first,
                    first + n - 1,
                    data.logs.__getitem__,
                    check=True,
                    resolver_factory=exact_resolver(self.ctx, overruled),
                    device=self.device,
                ):
                    self.book.records[o.step] = StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots))
                    state, done = o.state, o.step
                    if overruled:
                        self.overruled_steps[o.step] = list(overruled)
                        log.info(
                            "job %d: step %d: trainer's log claims values exact arithmetic overrules: %s",
                            self.job_id,
                            o.step,
                            overruled[:4],
                        )
                        overruled.clear()
            except VtrainError as e:  # verified inputs that cannot be replayed (e.g. a non-finite value)
                site = None
                if isinstance(e, NonFiniteValue):
                    site = locate_nonfinite(self.ctx.job, state, done + 1, data.logs[done + 1],
                                            exact_resolver(self.ctx), self.device)
                if site is None:
                    self._block(i, Unavailable(i, "replay", first, type(e).__name__, str(e)))
                    return None
                # The correct computation has no finite value there: the honest trainer stopped, this
                # one posted the step anyway. A fraud to dispute, not an unavailable artifact.
                log.info("job %d: step %d: op %d element %d has no finite value (%s); the trainer posted it",
                         self.job_id, site.step, site.op, site.index, e)
                self.nonfinite[i] = site
                self.unavailable.pop(i, None)
                self.withheld.pop(i, None)
                self.flagged.append(i)
                return i
            self._states[first + n - 1] = state
            mine = interval_root([self.book.records[s].leaf() for s in range(first, first + n)])
            self.verified += 1
            abused = any(first <= s < first + n for s in self.overruled_steps)
            self._save(roots, i if mine != roots[i] or abused else None)
            if mine != roots[i]:
                log.info(
                    "job %d: interval %d differs (posted %s, replayed %s)",
                    self.job_id,
                    i,
                    roots[i].hex()[:16],
                    mine.hex()[:16],
                )
                self.flagged.append(i)
                return i
            if abused:
                self.flagged.append(i)
                return i
        return None

    def signed_off(self) -> bool:
        """True only when every interval of the job was audited, none was found wrong, none is
        waiting for artifacts that verify and none holds a malformed committed log."""
        return (self.verified == self.ctx.n_intervals and not self.withheld and not self.malformed
                and not self.flagged)

    def _sampled(self, i: int) -> bool:
        if self.sample >= 1.0:
            return True
        digest = hashlib.sha256(f"{self.account}:{self.job_id}:{i}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.sample

    def challenge(self, interval: int, terms: Terms) -> int:
        r = self.proto.chain.send(
            self.proto.game.functions.challenge(self.job_id, interval),
            self.account,
            value=terms.challenger_bond,
            what=f"job {self.job_id}: challenge interval {interval}",
        )
        ev = self.proto.game.events.GameCreated().process_receipt(r, errors=DISCARD)
        gid = int(ev[0]["args"]["game"])
        self.disputed.append(gid)
        self.player.stats.add(gid, int(r["gasUsed"]))
        return gid

    def _regenerate(self, s: int) -> StepTrace:
        i = (s - 1) // self.ctx.spec.interval
        first, _ = self.ctx.interval_span(i)
        site = self.nonfinite.get(i)
        if site is not None and s >= site.step:
            if s > site.step:
                raise VtrainError(f"step {s} follows step {site.step}, which has no finite value: no trace")
            # The trace up to the op with no finite value (ChallengerStrategy reads no further).
            return StepTrace(s, self.ctx.job.graph, list(site.outputs), self._logs(s))
        state = self._states.get(first - 1)
        if state is None:
            raise VtrainError(f"auditor has no replayed state before step {first}")
        if s > first:
            for o in replay_steps(
                self.ctx.job, state, first, s - 1, self._logs, resolver_factory=exact_resolver(self.ctx),
                device=self.device,
            ):
                state = o.state
        (o,) = list(
            replay_steps(
                self.ctx.job, state, s, s, self._logs, resolver_factory=exact_resolver(self.ctx), keep_trace=True,
                device=self.device,
            )
        )
        return StepTrace.of(s, self.ctx.job.graph, o.result)

    def _opened_components(self, gid: int) -> list[bytes] | None:
        logs = self.proto.game.events.StepOpened.get_logs(
            from_block=job_first_block(self.proto, self.job_id), argument_filters={"game": gid}
        )
        return [bytes(c) for c in logs[-1]["args"]["components"]] if logs else None

    def _chunk(self, gid: int) -> bytes | None:
        logs = self.proto.game.events.ChunkOpened.get_logs(
            from_block=job_first_block(self.proto, self.job_id), argument_filters={"game": gid}
        )
        return bytes(logs[-1]["args"]["data"]) if logs else None

    def _partials(self, gid: int) -> list[Partial] | None:
        logs = self.proto.game.events.PartialsPosted.get_logs(
            from_block=job_first_block(self.proto, self.job_id), argument_filters={"game": gid}
        )
        return [Partial.of(p) for p in logs[-1]["args"]["partials"]] if logs else None

    def _target_step(self, interval: int) -> int | None:
        first, n = self.ctx.interval_span(interval)
        return next((s for s in sorted(self.overruled_steps) if first <= s < first + n), None)

    def play(self) -> int:
        strategy = ChallengerStrategy(
            self.ctx,
            self.book,
            self._trace,
            self._opened_components,
            self._chunk,
            honest=self.honest,
            target_step=self._target_step,
            partials_of=self._partials,
            nonfinite_of=self.nonfinite.get,
        )
        sent = 0
        for gid in self.disputed:
            sent += self.player.step(gid, strategy.move)
        return sent

    def withdraw(self) -> int:
        """Pull everything the registry owes this agent's account; returns the amount (wei)."""
        return self.player.withdraw()


def _malformed_window(leaves: Sequence[bytes]) -> tuple[int, int]:
    """Leaves ``[first, end)`` of a malformed op log that show the fault to the contract: the first
    pair whose keys do not increase, else the first entry whose code (1-3) or value (explicit only)
    breaks the format, else (a sentinel problem) the whole log, at most one answer page."""
    from protocol.availability import MAX_LOG_LEAVES

    keys = [decode_log_leaf(x) for x in leaves]
    for p in range(len(keys) - 1):
        if keys[p][0] >= keys[p + 1][0]:
            return p, p + 2
    for p, (_, code, value) in enumerate(keys[1:-1], start=1):
        if code not in (1, 2, 3) or (code != 3 and value != 0):
            return p, p + 1
    return 0, min(len(leaves), MAX_LOG_LEAVES)
