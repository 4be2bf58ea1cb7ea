"""Data availability on-chain (``contracts/DataAvailability.sol``, docs/protocol.md "Data availability").

Three parts:

- **Answers** (pure): the arguments of ``answerStep``/``answerLog`` built from a trainer's own
  records and logs, with the range openings of :func:`protocol.proofs.range_siblings`.
- :class:`AvailabilityResponder`: the trainer's side. It finds open demands on its job by their
  events (so it is idempotent across restarts: an answered demand is no longer Open) and answers
  each from its artifact store within its clock.
- :class:`OnChainArtifacts`: the auditor's side, a reader of step records and rounding logs that
  demands what the trainer withheld and reads the published data back from the events. Nothing
  from an event is used before it is re-verified here against the posted interval root with
  :mod:`vtrain.commit` (whole trees rebuilt: the interval's step leaves, logRoot_s from every op
  log root, each op log root from its leaves). :class:`FallbackReader` puts it behind a store.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from web3.logs import DISCARD

from protocol.agent import job_first_block
from protocol.chain import Reverted
from protocol.deploy import Protocol
from protocol.jobs import JobContext
from protocol.proofs import range_siblings
from protocol.store import ArtifactReader, ArtifactUnavailable, StepRecord
from vtrain.commit.merkle import MerkleTree, merkle_root
from vtrain.commit.roots import (
    EMPTY_OP_LOG_ROOT,
    HIGH_KEY,
    LOG_LEAF_SIZE,
    decode_log_leaf,
    interval_root,
    interval_tree,
    op_log_leaves,
    roots_tree,
    step_log_root,
)
from vtrain.commit.trace import op_log_entries, op_log_roots
from vtrain.errors import CorruptArtifact, MissingArtifact, VtrainError
from vtrain.graph.executor import StepLog
from vtrain.numerics.logfile import decode_step_log, encode_step_log
from vtrain.numerics.rounding import Mode, OpLog

log = logging.getLogger(__name__)

#: Bounds of one answer (DataAvailability.sol; tests/test_availability.py checks they match).
MAX_OP_ROOTS = 1024
MAX_LOG_LEAVES = 4096
NO_POSITION = 2**64 - 1
MAX_TO_INDEX = 0xFFFFFFFE

#: The answer-fee model (DataAvailability.sol): a demand pays feeGasPrice * (ANSWER_BASE_GAS +
#: GAS_PER_ROOT per root | GAS_PER_LEAF per leaf) with its bond; the trainer earns it by answering.
ANSWER_BASE_GAS = 350_000
GAS_PER_ROOT = 3_000
GAS_PER_LEAF = 2_600
#: Wei per gas of the answer fee that :func:`protocol.deploy.deploy` gives a DataAvailability
#: (1 gwei on a dev chain; a public deployment picks its own, at least the typical base fee).
DEV_FEE_GAS_PRICE = 10**9

KIND_STEP, KIND_LOG = 1, 2
JOB_FRAUDULENT = 5
STATUS_OPEN, STATUS_ANSWERED, STATUS_TIMED_OUT, STATUS_CONVICTED, STATUS_CLOSED = 1, 2, 3, 4, 5

#: ``LogRun`` as web3 takes it: (stateRoot, logRoot, stepProof, opLogRoot, opProof, position, size, leaves, siblings).
LogRunArgs = tuple[bytes, bytes, list[bytes], bytes, list[bytes], int, int, bytes, list[bytes]]


def step_demand_fee(price: int, n_slots: int, n_ops: int, first_op: int) -> int:
    """``stepDemandFee``: the fee of a Step demand from ``first_op`` (the answer's size is known)."""
    return price * (ANSWER_BASE_GAS + GAS_PER_ROOT * (n_slots + min(MAX_OP_ROOTS, n_ops - first_op)))


def log_demand_fee(price: int, from_index: int, to_index: int, start_position: int = NO_POSITION) -> int:
    """``logDemandFee``: the fee of a Log demand, priced on the most leaves an answer can need (a
    full page with a fixed start: the leaves from there to the range are not known on-chain)."""
    leaves = MAX_LOG_LEAVES if start_position != NO_POSITION else min(MAX_LOG_LEAVES, to_index - from_index + 2)
    return price * (ANSWER_BASE_GAS + GAS_PER_LEAF * leaves)


def log_answer_earned(price: int, fee: int, leaves: int) -> int:
    """What answering a Log demand with a run of ``leaves`` leaves earns the trainer (the rest of
    ``fee`` goes back to the demander)."""
    return min(fee, price * (ANSWER_BASE_GAS + GAS_PER_LEAF * leaves))


def demand_fee(proto: Protocol, fn: Any) -> int:
    """The answer fee (wei) the demand call ``fn`` (``demandStep``/``demandLog``) must pay with its
    bond, as the contract computes it."""
    da = _da(proto)
    if fn.fn_name == "demandStep":
        job, _, _, first_op = fn.args
        return int(proto.chain.call(da.functions.stepDemandFee(job, first_op)))
    _, _, _, _, from_index, to_index, start_position = fn.args
    return int(proto.chain.call(da.functions.logDemandFee(from_index, to_index, start_position)))


# ---------------------------------------------------------------------------------------------
# Answers


def step_answer(
    records: Sequence[StepRecord], s: int, op_roots: Sequence[bytes], first_op: int
) -> tuple[list[bytes], bytes, list[bytes], list[bytes], list[bytes]]:
    """``answerStep``'s arguments after the id: ``(components, logRoot, stepProof, opLogRoots,
    opSiblings)`` for step ``s`` of the interval whose records are ``records`` (in step order) and
    the op log roots ``[first_op, first_op + MAX_OP_ROOTS)`` of its ``op_roots``."""
    pos = s - records[0].s
    rec = records[pos]
    tree = interval_tree([r.leaf() for r in records])
    end = min(first_op + MAX_OP_ROOTS, len(op_roots))
    if not 0 <= first_op < end:
        raise ValueError(f"first_op: expected 0 <= first_op < {len(op_roots)}, got {first_op}")
    page = list(op_roots[first_op:end])
    return (
        list(rec.components),
        rec.log_root,
        list(tree.prove(pos).path),
        page,
        range_siblings(roots_tree(list(op_roots)), first_op, end),
    )


def log_keys(leaves: Sequence[bytes]) -> list[int]:
    return [decode_log_leaf(leaf)[0] for leaf in leaves]


def answer_range(
    keys: Sequence[int], from_index: int, to_index: int, start_position: int = NO_POSITION
) -> tuple[int, int]:
    """Leaves ``[first, end)`` answering a Log demand on a sorted log with these ``keys``: from the
    bracket of ``from_index`` (or ``start_position``) to the first key >= ``to_index + 1``, at
    most :data:`MAX_LOG_LEAVES` leaves."""
    first = start_position if start_position != NO_POSITION else bisect.bisect_right(keys, from_index) - 1
    if not 0 <= first < len(keys):
        raise ValueError(f"no leaf to start from: position {first} of {len(keys)} (from index {from_index})")
    reach = bisect.bisect_left(keys, to_index + 1, lo=first)
    end = min(max(reach + 1, first + 1), len(keys), first + MAX_LOG_LEAVES)
    return first, end


def log_run(
    records: Sequence[StepRecord],
    s: int,
    op_roots: Sequence[bytes],
    op: int,
    leaves: Sequence[bytes],
    first: int,
    end: int,
) -> LogRunArgs:
    """The ``LogRun`` of op ``op``'s log leaves ``[first, end)`` at step ``s`` with every proof (the
    leaves are taken as they are: a malformed log makes a run the contract convicts on)."""
    pos = s - records[0].s
    rec = records[pos]
    tree = MerkleTree.from_leaves(list(leaves))
    return (
        rec.state_root,
        rec.log_root,
        list(interval_tree([r.leaf() for r in records]).prove(pos).path),
        op_roots[op],
        list(roots_tree(list(op_roots)).prove(op).path),
        first,
        len(leaves),
        b"".join(leaves[first:end]),
        range_siblings(tree, first, end),
    )


# ---------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True)
class DemandInfo:
    """A demand as its ``DemandCreated`` event and ``getDemand`` describe it."""

    id: int
    demander: str
    interval: int
    step: int
    kind: int
    op: int
    from_index: int
    to_index: int
    start_position: int
    deadline: int
    status: int


@dataclass
class AvailabilityEvents:
    """The DataAvailability events of one job, read incrementally (each block range once: mined
    events do not change), with demand statuses read once per block."""

    proto: Protocol
    job: int
    created: dict[int, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    """StepPublished args, oldest first."""
    logs: list[dict[str, Any]] = field(default_factory=list)
    """LogPublished args, oldest first."""
    _next: int | None = None
    _statuses: dict[int, int] = field(default_factory=dict)
    _status_block: int = -1

    def refresh(self) -> int:
        """Read the events mined since the last call; returns the latest block number."""
        latest = int(self.proto.chain.w3.eth.block_number)
        if self._next is None:
            self._next = job_first_block(self.proto, self.job)
        if latest >= self._next:
            ev = _da(self.proto).events
            span = {"from_block": self._next, "to_block": latest, "argument_filters": {"job": self.job}}
            for e in ev.DemandCreated.get_logs(**span):
                self.created[int(e["args"]["id"])] = dict(e["args"])
            self.steps += [dict(e["args"]) for e in ev.StepPublished.get_logs(**span)]
            self.logs += [dict(e["args"]) for e in ev.LogPublished.get_logs(**span)]
            self._next = latest + 1
        return latest

    def demands(self) -> list[DemandInfo]:
        """Every demand on the job with its status as of the latest block."""
        latest = self.refresh()
        da = _da(self.proto)
        out = []
        for i, a in sorted(self.created.items()):
            final = self._statuses.get(i, STATUS_OPEN) != STATUS_OPEN
            if not final and self._status_block != latest:
                self._statuses[i] = int(self.proto.chain.call(da.functions.getDemand(i))[4])
            out.append(
                DemandInfo(
                    i, a["demander"], int(a["interval"]), int(a["step"]), int(a["kind"]), int(a["op"]),
                    int(a["fromIndex"]), int(a["toIndex"]), int(a["startPosition"]), int(a["deadline"]),
                    self._statuses.get(i, STATUS_OPEN),
                )
            )
        self._status_block = latest
        return out


def _da(proto: Protocol) -> Any:
    if proto.availability is None:
        raise ArtifactUnavailable("this deployment has no DataAvailability contract")
    return proto.availability


# ---------------------------------------------------------------------------------------------
# Trainer side


@dataclass
class AvailabilityResponder:
    """Answers every open demand on ``job_id`` from the trainer's own ``store``."""

    proto: Protocol
    account: str
    ctx: JobContext
    store: ArtifactReader
    job_id: int
    gas: list[tuple[str, int]] = field(default_factory=list)
    """(what, gas used) of every answer sent."""
    events: AvailabilityEvents = field(init=False)

    def __post_init__(self) -> None:
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))
        self.events = AvailabilityEvents(self.proto, self.job_id)

    def respond(self) -> int:
        """Answer each open demand whose deadline has not passed; returns how many were answered."""
        sent = 0
        now = self.proto.chain.now()
        for d in self.events.demands():
            if d.status != STATUS_OPEN or now > d.deadline:
                continue
            what = f"job {self.job_id}: answer demand {d.id} ({'step' if d.kind == KIND_STEP else 'log'} {d.step})"
            try:
                answer = self._answer(d)
            except (ValueError, VtrainError) as e:
                # SAFETY: a demand this trainer cannot answer (its store lacks the data, or the demand
                # names a leaf its log does not have) must not stop it answering the others.
                log.error("%s: cannot answer: %s", what, e)
                continue
            try:
                r = self.proto.chain.send(answer, self.account, what=what)
            except Reverted as e:
                log.warning("%s: %s", what, e)
                continue
            self.gas.append((what, int(r["gasUsed"])))
            sent += 1
        return sent

    def _answer(self, d: DemandInfo) -> Any:
        first, n = self.ctx.interval_span(d.interval)
        records = [self.store.get_step(self.job_id, t) for t in range(first, first + n)]
        step_log = decode_step_log(self.store.get_log(self.job_id, d.step), d.step, self.ctx.job.graph)
        roots = op_log_roots(step_log, self.ctx.job.graph)
        fns = _da(self.proto).functions
        if d.kind == KIND_STEP:
            return fns.answerStep(d.id, *step_answer(records, d.step, roots, d.op))
        leaves = op_log_leaves(op_log_entries(step_log, d.op))
        lo, hi = answer_range(log_keys(leaves), d.from_index, d.to_index, d.start_position)
        return fns.answerLog(d.id, log_run(records, d.step, roots, d.op, leaves, lo, hi))


# ---------------------------------------------------------------------------------------------
# Auditor side


@dataclass
class OnChainArtifacts:
    """Step records and rounding logs of ``job_id`` obtained on-chain: what is not yet published is
    demanded (one bond per demand, returned when answered, plus the answer's fee, paid to the trainer
    when it answers and refunded when it does not) and :class:`ArtifactUnavailable` says
    to come back later; a demand the trainer let expire is claimed (the trainer is convicted)."""

    proto: Protocol
    account: str
    ctx: JobContext
    job_id: int
    bond: int
    demanded: list[int] = field(default_factory=list)
    """Ids of the demands this source made."""
    events: AvailabilityEvents = field(init=False)
    _verified_logs: dict[int, StepLog] = field(default_factory=dict, init=False)
    _verified_records: dict[int, dict[int, StepRecord]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        # the job's graph decodes what is published: the spec must be the job's before it is built
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))
        self.events = AvailabilityEvents(self.proto, self.job_id)

    # -- the reader API ------------------------------------------------------------------------------
    def get_step(self, job: str | int, s: int) -> StepRecord:
        self._check_job(job)
        return self._records(self._interval_of(s))[s]

    def get_log(self, job: str | int, s: int) -> bytes:
        self._check_job(job)
        i = self._interval_of(s)
        records = self._records(i)
        first, n = self.ctx.interval_span(i)
        logs = {t: self._verified_logs.get(t) or self._step_log(t, records[t]) for t in range(first, first + n)}
        self._verified_logs.update({t: lg for t, lg in logs.items() if lg is not None})
        missing = [t for t, lg in logs.items() if lg is None]
        if missing:
            raise ArtifactUnavailable(f"rounding logs of steps {missing} demanded on-chain; waiting for the trainer")
        return encode_step_log(logs[s], s, self.ctx.job.graph)  # type: ignore[arg-type]

    def get_checkpoint(self, job: str | int, interval: int) -> bytes:
        raise ArtifactUnavailable(
            f"checkpoint of interval {interval}: not obtainable on-chain (a state is too large for calldata; "
            "replay from the initial state, or demand state chunks)"
        )

    def close_demands(self) -> int:
        """Close every open demand of a job that became Fraudulent (bonds refunded); returns how many."""
        if int(self.proto.chain.call(self.proto.registry.functions.jobStatus(self.job_id))) != JOB_FRAUDULENT:
            return 0
        closed = 0
        for d in self.events.demands():
            if d.status == STATUS_OPEN:
                self.proto.chain.send(
                    _da(self.proto).functions.closeDemand(d.id), self.account, what=f"demand {d.id}: closeDemand"
                )
                closed += 1
        return closed

    # -- internals -----------------------------------------------------------------------------------
    def _check_job(self, job: str | int) -> None:
        if str(job) != str(self.job_id):
            raise MissingArtifact(f"on-chain source of job {self.job_id} asked for job {job}")

    def _interval_of(self, s: int) -> int:
        return (s - 1) // self.ctx.spec.interval


    def _demand(self, fn: Any, what: str) -> None:
        # The demand pays the trainer's answer (its fee comes back if the trainer does not answer).
        value = self.bond + demand_fee(self.proto, fn)
        r = self.proto.chain.send(fn, self.account, value=value, what=f"job {self.job_id}: demand {what}")
        (ev,) = _da(self.proto).events.DemandCreated().process_receipt(r, errors=DISCARD)
        self.demanded.append(int(ev["args"]["id"]))
        log.info("job %d: demanded %s on-chain (demand %d)", self.job_id, what, self.demanded[-1])

    def _pending(self, match) -> bool:
        """True if an open demand matching ``match`` exists (claiming it first if it expired)."""
        now = self.proto.chain.now()
        for d in self.events.demands():
            if d.status != STATUS_OPEN or not match(d):
                continue
            if now > d.deadline:
                self.proto.chain.send(
                    _da(self.proto).functions.claimTimeout(d.id), self.account, what=f"demand {d.id}: claimTimeout"
                )
                self.close_demands()
                raise ArtifactUnavailable(
                    f"the trainer did not answer demand {d.id} (step {d.step}) by {d.deadline}: timeout claimed, "
                    "the trainer is convicted"
                )
            return True
        return False

    def _records(self, i: int) -> dict[int, StepRecord]:
        """The verified step records of interval ``i``: every step's StepPublished, whose leaves
        must rebuild the posted interval root."""
        if i in self._verified_records:
            return self._verified_records[i]
        first, n = self.ctx.interval_span(i)
        got: dict[int, StepRecord] = {}
        self.events.refresh()
        for a in self.events.steps:
            t = int(a["step"])
            if first <= t < first + n and t not in got:
                try:
                    comps = tuple(bytes(c) for c in a["components"])
                    got[t] = StepRecord(t, bytes(a["stateRoot"]), bytes(a["logRoot"]), comps)
                except ValueError as err:  # the contract computed stateRoot from components: never happens
                    raise CorruptArtifact(f"published step record of step {t}: {err}") from None
        missing = [t for t in range(first, first + n) if t not in got]
        for t in missing:
            if not self._pending(lambda d, t=t: d.kind == KIND_STEP and d.step == t and d.op == 0):
                self._demand(_da(self.proto).functions.demandStep(self.job_id, i, t, 0), f"step record {t}")
        if missing:
            raise ArtifactUnavailable(
                f"step records {missing} of interval {i} demanded on-chain; waiting for the trainer"
            )
        posted = bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0])
        if interval_root([got[t].leaf() for t in range(first, first + n)]) != posted:
            raise CorruptArtifact(f"published step records of interval {i} do not rebuild its posted root")
        self._verified_records[i] = got
        return got

    def _op_roots(self, s: int, rec: StepRecord) -> list[bytes] | None:
        """Every op log root of step ``s`` (all pages published), checked against logRoot_s."""
        n_ops = self.ctx.job.graph.n_ops
        pages: dict[int, list[bytes]] = {}
        for a in self.events.steps:
            if int(a["step"]) != s:
                continue
            pages.setdefault(int(a["firstOp"]), [bytes(r) for r in a["opLogRoots"]])
        roots: list[bytes] = []
        for first in range(0, n_ops, MAX_OP_ROOTS):
            if first not in pages:
                i = self._interval_of(s)
                if not self._pending(lambda d, f=first: d.kind == KIND_STEP and d.step == s and d.op == f):
                    fn = _da(self.proto).functions.demandStep(self.job_id, i, s, first)
                    self._demand(fn, f"op roots {first}+ of step {s}")
                return None
            roots += pages[first]
        if len(roots) != n_ops or step_log_root(roots) != rec.log_root:
            raise CorruptArtifact(f"published op log roots of step {s} do not rebuild its logRoot")
        return roots

    def _op_leaves(self, s: int, op: int, root: bytes) -> list[bytes] | None:
        """Op ``op``'s whole log at step ``s`` from runs chained by position, checked against ``root``."""
        if root == EMPTY_OP_LOG_ROOT:
            return op_log_leaves([])
        at: dict[int, bytes] = {}
        size = None
        for a in self.events.logs:
            if int(a["step"]) != s or int(a["op"]) != op or bytes(a["opLogRoot"]) != root:
                continue
            size = int(a["size"])  # one size per (job, step, op): the contract binds it
            data = bytes(a["leaves"])
            for k in range(len(data) // LOG_LEAF_SIZE):
                at.setdefault(int(a["position"]) + k, data[LOG_LEAF_SIZE * k : LOG_LEAF_SIZE * (k + 1)])
        have = 0
        while have in at:
            have += 1
        if size is not None and have >= size:
            leaves = [at[p] for p in range(size)]
            if merkle_root(leaves) != root:
                raise CorruptArtifact(f"published log runs of op {op} at step {s} do not rebuild its log root")
            return leaves
        start = have - 1 if have else 0
        key = decode_log_leaf(at[start])[0] if have else 0
        if key >= HIGH_KEY:
            raise CorruptArtifact(f"log of op {op} at step {s}: HIGH at position {start} of claimed size {size}")
        fr = min(key, MAX_TO_INDEX - 1)
        if not self._pending(lambda d: d.kind == KIND_LOG and d.step == s and d.op == op and d.start_position == start):
            i = self._interval_of(s)
            fn = _da(self.proto).functions.demandLog(self.job_id, i, s, op, fr, MAX_TO_INDEX, start)
            self._demand(fn, f"log of op {op} at step {s} from position {start}")
        return None

    def _step_log(self, s: int, rec: StepRecord) -> StepLog | None:
        if Mode(self.ctx.spec.mode) == Mode.PAPER:
            raise ArtifactUnavailable("paper-mode logs are dense and uncommitted: not obtainable on-chain")
        roots = self._op_roots(s, rec)
        if roots is None:
            return None
        out = StepLog(Mode(self.ctx.spec.mode))
        complete = True
        for op, root in enumerate(roots):
            leaves = self._op_leaves(s, op, root)
            if leaves is None:
                complete = False
                continue
            if len(leaves) > 2:
                keys, codes, values = zip(*(decode_log_leaf(leaf) for leaf in leaves[1:-1]), strict=True)
                out.sparse[op] = OpLog(
                    np.array(keys, np.int64) - 1,
                    np.array(codes, np.uint8),
                    np.array(values, np.uint32).view(np.float32),
                )
        return out if complete else None


class FallbackReader(ArtifactReader):
    """Reads from ``primary`` (the trainer's store); a step record or log it does not have (missing,
    unreachable) is obtained on-chain from ``onchain`` instead. Checkpoints come from ``primary`` only."""

    def __init__(self, primary: ArtifactReader, onchain: OnChainArtifacts) -> None:
        self.primary = primary
        self.onchain = onchain

    def __repr__(self) -> str:
        return f"FallbackReader({self.primary!r}, on-chain job {self.onchain.job_id})"

    def _read(self, job: str, rel: str) -> bytes:
        return self.primary._read(job, rel)

    def _where(self, job: str, rel: str) -> str:
        return self.primary._where(job, rel)

    def get_step(self, job: str | int, s: int) -> StepRecord:
        try:
            return self.primary.get_step(job, s)
        except (MissingArtifact, ArtifactUnavailable) as e:
            log.info("job %s: step record %d unavailable from %r (%s); trying on-chain", job, s, self.primary, e)
            return self.onchain.get_step(job, s)

    def get_log(self, job: str | int, s: int) -> bytes:
        try:
            return self.primary.get_log(job, s)
        except (MissingArtifact, ArtifactUnavailable) as e:
            log.info("job %s: log of step %d unavailable from %r (%s); trying on-chain", job, s, self.primary, e)
            return self.onchain.get_log(job, s)

    def get_checkpoint(self, job: str | int, interval: int) -> bytes:
        return self.primary.get_checkpoint(job, interval)

    def forget(self, kind: str, job: int, key: int) -> None:
        forget = getattr(self.primary, "forget", None)
        if forget is not None:
            forget(kind, job, key)
