"""Game strategy shared by both agents: given the on-chain view of a game and what a party knows,
the next move. Strategies are stateless (everything is recomputed from the chain and local
artifacts), so an agent that restarts mid-game simply asks again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol.jobs import JobContext
from protocol.store import StepRecord
from vtrain.commit.merkle import MerkleTree
from vtrain.commit.roots import CHUNK_ELEMS, chunk_bytes, interval_tree, roots_tree
from vtrain.commit.trace import StepTrace, op_log_entries
from vtrain.graph.step_graph import OpKind
from vtrain.numerics.exact import Partial, element_partials, first_wrong_chunk, is_chunked

if TYPE_CHECKING:
    from vtrain.training.loop import NonFiniteSite

log = logging.getLogger(__name__)

# Enum values of contracts/lib/GameTypes.sol
PHASE_NONE, PHASE_STEPS, PHASE_TRACE_COMMIT, PHASE_TRACE, PHASE_ELEMENT, PHASE_PICK, PHASE_ONE_STEP, PHASE_DONE = range(
    8
)
# The chunk level of long reductions (after Done in the enum).
PHASE_PARTIALS, PHASE_CHUNK_CHECK, PHASE_PARTIALS_RULE = range(8, 11)
PARTY_NONE, PARTY_TRAINER, PARTY_CHALLENGER = range(3)
STATUS_NONE, STATUS_IN_PROGRESS, STATUS_TRAINER_WON, STATUS_CHALLENGER_WON, STATUS_CLOSED = range(5)
PHASE_NAMES = [
    "none",
    "steps",
    "trace-commit",
    "trace",
    "element",
    "pick",
    "one-step",
    "done",
    "partials",
    "chunk-check",
    "partials-rule",
]


@dataclass(frozen=True)
class GameView:
    """A decoded ``DisputeGame.getGame`` snapshot."""

    job: int
    interval: int
    trainer: str
    challenger: str
    phase: int
    status: int
    to_move: int
    deadline: int
    trainer_time: int
    challenger_time: int
    root: bytes
    lo: int
    size: int
    left: bytes
    right: bytes
    step: int
    prev_state_root: bytes
    state_root: bytes
    log_root: bytes
    trace_root: bytes
    op: int
    op_log_root: bytes
    numel: int
    index: int
    claimed: int
    chunk: int = 0  # the chunk disputed at the chunk level

    @staticmethod
    def decode(t: Any) -> GameView:
        return GameView(*[bytes(x) if isinstance(x, (bytes, bytearray)) else x for x in t])

    @property
    def revealed(self) -> bool:
        return self.left != b"\x00" * 32 or self.right != b"\x00" * 32


@dataclass(frozen=True)
class Move:
    """A contract call to make: function name and arguments."""

    fn: str
    args: tuple

    def __str__(self) -> str:
        return self.fn


@dataclass
class StepBook:
    """Step records of one party for one job, and the trees built from them."""

    ctx: JobContext
    records: dict[int, StepRecord] = field(default_factory=dict)

    def components(self, s: int) -> list[bytes]:
        return list(self.ctx.initial[0]) if s == 0 else list(self.records[s].components)

    def interval_tree(self, i: int) -> MerkleTree:
        first, n = self.ctx.interval_span(i)
        return interval_tree([self.records[s].leaf() for s in range(first, first + n)])

    def has_interval(self, i: int) -> bool:
        first, n = self.ctx.interval_span(i)
        return all(s in self.records for s in range(first, first + n))


def split(n: int) -> int:
    """Largest power of two strictly below ``n`` (the RFC 9162 split)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def _children(tree: MerkleTree, lo: int, size: int) -> tuple[bytes, bytes]:
    k = split(size)
    return tree.range_root(lo, lo + k), tree.range_root(lo + k, lo + size)


TraceSource = Callable[[int], StepTrace]
"""step -> that party's trace of the step (regenerated on demand, cached by the caller)."""


@dataclass
class TrainerStrategy:
    """The trainer answers every question with its own commitments (honest or not)."""

    ctx: JobContext
    book: StepBook
    trace: TraceSource

    def move(self, v: GameView) -> Move | None:
        if v.status != STATUS_IN_PROGRESS or v.to_move != PARTY_TRAINER:
            return None
        if v.phase == PHASE_STEPS:
            first, _ = self.ctx.interval_span(v.interval)
            if v.size == 1:
                return self._open_step(first + v.lo)
            return Move("reveal", _children(self.book.interval_tree(v.interval), v.lo, v.size))
        if v.phase == PHASE_TRACE_COMMIT:
            return Move("commitTrace", (self.trace(v.step).root,))
        if v.phase == PHASE_TRACE:
            t = self.trace(v.step)
            if v.size == 1:
                return self._open_op(t, v.lo)
            return Move("reveal", _children(t.tree, v.lo, v.size))
        if v.phase == PHASE_ELEMENT:
            t = self.trace(v.step)
            if v.size == 1:
                return Move("openChunk", (chunk_bytes(t.outputs[v.op], v.lo),))
            return Move("reveal", _children(t.tensor_tree(v.op), v.lo, v.size))
        if v.phase == PHASE_ONE_STEP:
            return one_step_move(self.ctx, self.trace(v.step), v)
        if v.phase in (PHASE_CHUNK_CHECK, PHASE_PARTIALS_RULE):
            return settle_partials_move(self.ctx, self.trace(v.step), v)
        return None

    def _open_step(self, s: int) -> Move:
        prev = self.book.components(s - 1)
        cur = self.book.records[s]
        if s == 1:
            return Move("openStep", (prev, list(cur.components), cur.log_root, b"\x00" * 32, []))
        pi = (s - 2) // self.ctx.spec.interval
        first, _ = self.ctx.interval_span(pi)
        proof = self.book.interval_tree(pi).prove(s - 1 - first)
        return Move(
            "openStep", (prev, list(cur.components), cur.log_root, self.book.records[s - 1].log_root, list(proof.path))
        )

    def _open_op(self, t: StepTrace, j: int) -> Move:
        op = self.ctx.job.graph.ops[j]
        g = self.ctx.graph
        bind: list[bytes] = []
        if op.kind == OpKind.INPUT:
            bind = list(roots_tree(self.book.components(t.step - 1)).prove(op.attrs[0]).path)
        elif op.kind == OpKind.OUTPUT:
            bind = list(roots_tree(self.book.components(t.step)).prove(op.attrs[0]).path)
        opening = (
            t.op_roots[j],
            g.descriptors[j],
            list(g.tree.prove(j).path),
            t.log_roots[j],
            list(t.log_tree.prove(j).path),
            [t.op_roots[i] for i in op.inputs],
            [list(t.tree.prove(i).path) for i in op.inputs],
            bind,
        )
        return Move("openOp", (opening,))


def one_step_move(ctx: JobContext, t: StepTrace, v: GameView) -> Move:
    """The adjudication call for the picked element: inputs from the (agreed) trace, the log entry.
    For a reduction longer than ``MAX_DIRECT_TERMS`` terms: the element's partials (chunk level)."""
    from protocol.proofs import build_element_proof

    j = v.op
    op = ctx.job.graph.ops[j]
    desc = ctx.graph.descriptors[j]
    inputs = t.inputs_of(j)
    if is_chunked(desc):
        partials = element_partials(desc, inputs, v.index)
        return Move("postPartials", (desc, [p.as_tuple() for p in partials]))
    kw: dict[str, Any] = {}
    if op.kind == OpKind.DATA:
        kw = {"dataset": ctx.job.dataset.samples, "seed": ctx.spec.data_seed, "step": v.step}
    proof = build_element_proof(desc, inputs, v.index, op_log_entries(t.log, j), **kw)
    return Move("oneStep", (desc, [t.op_roots[i] for i in op.inputs], proof))


def settle_partials_move(ctx: JobContext, t: StepTrace, v: GameView) -> Move:
    """The chunk level's ruling call: the disputed chunk's input rows (ChunkCheck) or the element's
    log entry (PartialsRule), with the partials this trace gives (the ones its trainer posted)."""
    from protocol.proofs import build_chunk_proof, build_log_proof

    j = v.op
    op = ctx.job.graph.ops[j]
    desc = ctx.graph.descriptors[j]
    inputs = t.inputs_of(j)
    partials = [p.as_tuple() for p in element_partials(desc, inputs, v.index)]
    if v.phase == PHASE_CHUNK_CHECK:
        proof = build_chunk_proof(desc, inputs, v.index, v.chunk)
    else:
        proof = build_log_proof(op_log_entries(t.log, j), v.index)
    return Move("settlePartials", (desc, [t.op_roots[i] for i in op.inputs], partials, proof))


def partials_move(ctx: JobContext, t: StepTrace, v: GameView, posted: list[Partial], honest: bool = True) -> Move:
    """The challenger's answer to posted partials: dispute the first chunk whose partial differs
    from its recomputation at the posted scale, else accept (``honest=False``: always dispute
    chunk 0, a false challenge)."""
    tuples = [p.as_tuple() for p in posted]
    if not honest:
        return Move("disputeChunk", (tuples, 0))
    desc = ctx.graph.descriptors[v.op]
    bad = first_wrong_chunk(desc, t.inputs_of(v.op), v.index, posted)
    if bad is None:
        return Move("acceptPartials", ())
    return Move("disputeChunk", (tuples, bad))


@dataclass
class ChallengerStrategy:
    """The challenger descends towards the first commitment that differs from its own replay.

    ``honest=False`` plays a false challenger that disputes blindly (always the left child, the
    first element): it must lose against an honest trainer.
    """

    ctx: JobContext
    book: StepBook
    trace: TraceSource
    opened_components: Callable[[int], list[bytes] | None]  # game -> the trainer's stateRoot_s components
    chunk_of: Callable[[int], bytes | None]  # game -> the opened chunk bytes
    honest: bool = True
    target_step: Callable[[int], int | None] | None = None  # interval -> a step with an overruled log entry
    partials_of: Callable[[int], list[Partial] | None] | None = None  # game -> the posted partials
    nonfinite_of: Callable[[int], NonFiniteSite | None] | None = None
    """interval -> the element of it whose correct value has no finite FP32 value (the replay stopped
    there): every step from its step on, every op from its op on, is disagreed, and its chunk and
    element are picked; ``trace`` of its step holds the ops before it only."""

    def move(self, gid: int, v: GameView) -> Move | None:
        if v.status != STATUS_IN_PROGRESS or v.to_move != PARTY_CHALLENGER:
            return None
        if v.phase in (PHASE_STEPS, PHASE_TRACE, PHASE_ELEMENT):
            if not self.honest:
                return Move("choose", (False,))
            return Move("choose", (self._go_right(gid, v),))
        if v.phase == PHASE_PICK:
            chunk = self.chunk_of(gid)
            if chunk is None:
                return None
            off = 0
            site = self._site(v)
            if self.honest and site is not None and v.step == site.step and v.op == site.op:
                off = site.index - v.lo * CHUNK_ELEMS
            elif self.honest:
                theirs = np.frombuffer(chunk, "<u4")
                mine = self.trace(v.step).outputs[v.op].view(np.uint32)
                c0 = v.lo * CHUNK_ELEMS  # the opened chunk is the leaf the descent ended on
                diff = np.nonzero(theirs != mine[c0 : c0 + len(theirs)])[0]
                off = int(diff[0]) if len(diff) else 0
            return Move("pickElement", (chunk, off))
        if v.phase == PHASE_PARTIALS and self.partials_of is not None:
            posted = self.partials_of(gid)
            if posted is None:
                return None
            return partials_move(self.ctx, self.trace(v.step), v, posted, self.honest)
        return None

    def _site(self, v: GameView) -> NonFiniteSite | None:
        return self.nonfinite_of(v.interval) if self.nonfinite_of is not None else None

    def _toward_nonfinite(self, v: GameView, site: NonFiniteSite) -> bool | None:
        """The choice towards ``site`` (True: the right half), or None where it does not decide.
        Steps and ops before the site's are compared as usual (the first differing one is disputed
        instead: it comes first); from the site's on there is nothing to compare: disagree."""
        k = split(v.size)
        if v.phase == PHASE_STEPS:
            first, _ = self.ctx.interval_span(v.interval)
            target = site.step - first
            if v.lo + k > target:
                return False
            leaves = [self.book.records[s].leaf() for s in range(first, site.step)]
            return v.left == interval_tree(leaves).range_root(v.lo, v.lo + k)
        if v.step != site.step:
            return None
        if v.phase == PHASE_TRACE:
            if v.lo + k > site.op:
                return False
            return v.left == self.trace(v.step).tree.range_root(v.lo, v.lo + k)
        if v.phase == PHASE_ELEMENT and v.op == site.op:
            return site.index // CHUNK_ELEMS >= v.lo + k
        return None

    def _go_right(self, gid: int, v: GameView) -> bool:
        k = split(v.size)
        site = self._site(v)
        if site is not None:
            toward = self._toward_nonfinite(v, site)
            if toward is not None:
                return toward
        if v.phase == PHASE_STEPS:
            mine = self.book.interval_tree(v.interval)
        elif v.phase == PHASE_TRACE:
            mine = self.trace(v.step).tree
        else:
            mine = self.trace(v.step).tensor_tree(v.op)
        if v.left != mine.range_root(v.lo, v.lo + k):
            return False
        if v.right != mine.range_root(v.lo + k, v.lo + v.size):
            return True
        if v.phase == PHASE_STEPS and self.target_step is not None:
            # Same step leaves, but one step's trace holds a value the log cannot justify.
            s = self.target_step(v.interval)
            if s is not None:
                first, _ = self.ctx.interval_span(v.interval)
                return s - first >= v.lo + k
        if v.phase == PHASE_TRACE:
            # The trainer's trace equals ours, so its state root is what is wrong: head for the
            # OUTPUT op of the first state slot whose component differs.
            target = self._bad_output_op(gid, v)
            if target is not None:
                return target >= v.lo + k
        return True

    def _bad_output_op(self, gid: int, v: GameView) -> int | None:
        theirs = self.opened_components(gid)
        if theirs is None:
            return None
        mine = self.book.components(v.step)
        g = self.ctx.job.graph
        for slot, (a, b) in enumerate(zip(theirs, mine, strict=False)):
            if a != b:
                return next(o.id for o in g.ops if o.kind == OpKind.OUTPUT and o.attrs[0] == slot)
        return None
