"""Can the chain rule on every op of a job? A job with an op it cannot rule on must not be
created, accepted or audited: a game that reaches that op ends on a clock, not on the truth (the
trainer cannot produce a ruling it would win, so even an honest trainer loses, and an honest
auditor cannot win against a cheat there).

The chain rules on one element of an op (docs/protocol.md, "Op kinds", "Chunk level") when

- its kind is one the deployed contracts rule: the Adjudicator's per-kind semantics
  (``ADJUDICATED_KINDS``, the kinds ``Adjudicator._exactValue`` handles) or a bind the DisputeGame
  checks itself (``GAME_BOUND_KINDS``); ``tests/test_rulability.py`` ties both lists to
  ``contracts/lib/OpKinds.sol`` and to the deployed Adjudicator;
- a reduction (MATMUL: K terms, +1 with a bias; SUM, MEAN: the reduced length) has at most
  ``ExactSum.MAX_TERMS`` = 65,536 terms, the chunk level's limit (longer than ``CHUNK_TERMS`` =
  2,048 they go through the chunk level, so no ruling reads more than 2,048 of their terms);
- an op whose ruling reads a whole row with no chunk level (MAX, MAX_GRAD: the row ``x[..., :]``;
  DATA: the whole sample) reads at most ``Adjudicator.MAX_ROW`` = 16,384 elements (MAX,
  MAX_GRAD: about 570 gas an element, 9.3M gas at the limit) or ``Adjudicator.MAX_SAMPLE`` =
  65,536 (DATA: about 160 gas an element), so the ruling fits the 16,777,216 gas cap of one
  transaction. (Softmax-like rows are MAX, SUB, EXP, SUM, DIV: their MAX is this bound; every
  other kind reads O(1) elements per ruling: GATHER, TAKE, SELECT read one element of each input.)

``check_rulable`` is the one check the client (``vtrain client create-job``), the trainer and
the auditor all run.
"""

from __future__ import annotations

from dataclasses import dataclass

from vtrain.errors import VtrainError
from vtrain.graph.step_graph import MAX_CONCAT_INPUTS, Graph, OpKind, OpNode
from vtrain.graph.step_graph import MAX_ROW_ELEMENTS as GRAPH_MAX_ROW
from vtrain.numerics.exact import MAX_TERMS, OpDesc, reduction_terms

#: Kinds the deployed Adjudicator rules on (``Adjudicator._exactValue``; any other code reverts
#: with ``UnsupportedOp``).
ADJUDICATED_KINDS = frozenset(
    {
        OpKind.OUTPUT,
        OpKind.DATA,
        OpKind.ADD,
        OpKind.SUB,
        OpKind.MUL,
        OpKind.DIV,
        OpKind.ADD_S,
        OpKind.MUL_S,
        OpKind.DIV_S,
        OpKind.RSUB_S,
        OpKind.SQRT,
        OpKind.EXP,
        OpKind.LOG,
        OpKind.TANH,
        OpKind.ERF,
        OpKind.MATMUL,
        OpKind.SUM,
        OpKind.MEAN,
        OpKind.MAX,
        OpKind.RELU,
        OpKind.RELU_GRAD,
        OpKind.RESHAPE,
        OpKind.PERMUTE,
        OpKind.SLICE,
        OpKind.PAD,
        OpKind.EXPAND,
        OpKind.ONE_HOT,
        OpKind.GATHER,
        OpKind.TAKE,
        OpKind.SELECT,
        OpKind.MAX_GRAD,
        OpKind.DROPOUT_MASK,
        OpKind.STEP,
        OpKind.CONCAT,
    }
)
#: Kinds the DisputeGame binds itself (``openOp``: to stateRoot_{s-1}, stateRoot_s, a constant root).
GAME_BOUND_KINDS = frozenset({OpKind.INPUT, OpKind.OUTPUT, OpKind.CONST})
#: Every kind a game can end on with a ruling.
RULED_KINDS = ADJUDICATED_KINDS | GAME_BOUND_KINDS
#: Reductions of more terms than this cannot be ruled (``ExactSum.MAX_TERMS``, the chunk level's limit).
MAX_REDUCTION_TERMS = MAX_TERMS
#: Longest row a MAX / MAX_GRAD ruling reads (``Adjudicator.MAX_ROW``; the graph builder cuts longer
#: rows into a tree of MAX ops of at most this, so it is vtrain's constant).
MAX_ROW_ELEMENTS = GRAPH_MAX_ROW
#: Longest sample a DATA ruling opens (``Adjudicator.MAX_SAMPLE``).
MAX_SAMPLE_ELEMENTS = 65_536
#: The transaction gas cap (Osaka) the row bounds keep a ruling under.
TX_GAS_CAP = 16_777_216


class UnrulableJob(VtrainError):
    """Raised when a job's step graph has an op the chain cannot rule on; the message names it."""


@dataclass(frozen=True)
class Unrulable:
    """One op the chain cannot rule on, and why."""

    op: int
    kind: str
    name: str
    reason: str

    def __str__(self) -> str:
        named = f" {self.name!r}" if self.name else ""
        return f"op {self.op} ({self.kind}{named}): {self.reason}"


def reduction_length(graph: Graph, op: OpNode) -> int:
    """Terms of one element of ``op`` (MATMUL K, +1 with a bias; SUM/MEAN the reduced length; 0
    for every other kind), as ``ChunkAdjudicator.terms`` counts them."""
    return reduction_terms(OpDesc(int(op.kind), op.inputs, op.shape, tuple(graph.in_shapes(op)), op.attrs))


def row_length(graph: Graph, op: OpNode) -> tuple[int, int]:
    """(elements one ruling of ``op`` reads whole, the limit) for the row-reading kinds (MAX,
    MAX_GRAD: the reduced row; DATA: the sample), (0, 0) for every other kind."""
    if op.kind == OpKind.MAX:
        shape = graph.in_shapes(op)[0]
        return (int(shape[-1]) if shape else 1), MAX_ROW_ELEMENTS
    if op.kind == OpKind.MAX_GRAD:
        return (int(op.shape[-1]) if op.shape else 1), MAX_ROW_ELEMENTS
    if op.kind == OpKind.DATA:
        return (int(op.shape[-1]) if op.shape else 1), MAX_SAMPLE_ELEMENTS
    return 0, 0


def unrulable_ops(graph: Graph) -> list[Unrulable]:
    """Every op of ``graph`` the chain cannot rule on (empty: the job is rulable)."""
    bad = []
    for op in graph.ops:
        kind = op.kind.name if isinstance(op.kind, OpKind) else str(op.kind)
        if op.kind not in RULED_KINDS:
            bad.append(Unrulable(op.id, kind, op.name, "the deployed Adjudicator has no rule for this op kind"))
            continue
        if len(op.inputs) > MAX_CONCAT_INPUTS:
            bad.append(Unrulable(op.id, kind, op.name, f"{len(op.inputs)} inputs, more than the DisputeGame's "
                                 f"limit of {MAX_CONCAT_INPUTS} (MAX_OP_INPUTS)"))
            continue
        n = reduction_length(graph, op)
        if n > MAX_REDUCTION_TERMS:
            bad.append(Unrulable(op.id, kind, op.name, f"a reduction of {n:,} terms, more than the chunk level's "
                                 f"limit of {MAX_REDUCTION_TERMS:,} (ExactSum.MAX_TERMS)"))
        row, limit = row_length(graph, op)
        if row > limit:
            what, const = ("a sample", "MAX_SAMPLE") if op.kind == OpKind.DATA else ("a row", "MAX_ROW")
            bad.append(Unrulable(op.id, kind, op.name, f"{what} of {row:,} elements read whole by one ruling, more "
                                 f"than the limit of {limit:,} (Adjudicator.{const}) that keeps a ruling under the "
                                 f"{TX_GAS_CAP:,} gas cap"))
    return bad


def check_rulable(graph: Graph) -> None:
    """Raise :class:`UnrulableJob` naming the first op the chain cannot rule on (and how many more)."""
    bad = unrulable_ops(graph)
    if bad:
        more = f" (and {len(bad) - 1} more op(s))" if len(bad) > 1 else ""
        raise UnrulableJob(f"the chain cannot rule on this job: {bad[0]}{more}")
