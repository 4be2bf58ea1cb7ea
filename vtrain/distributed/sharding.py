"""Sharding analysis of the static step graph: which axis of each op's tensor runs over the batch.

Data parallelism splits the batch (axis 0 of the DATA op) into contiguous shards, one per rank.
The analysis propagates the batch axis from DATA through every op and classifies each op as

* **replicated** (``Placement`` None): the same full tensor on every rank (state, constants, and
  everything computed from them or from a batch reduction);
* **sharded** on ``axis`` with ``block``: the tensor's ``axis`` has ``batch * block`` entries and a
  rank holds the ``block`` entries of each of its samples (``[o * block, (o + b) * block)``);
* a **batch reduction**: a sharded input is summed over its batch axis (MATMUL whose K runs over
  the batch, SUM/MEAN over a batch axis) or maximised (MAX). Its output is replicated; each rank
  computes FP64 partial sums of its shard and :mod:`vtrain.distributed.collective` combines them.

A replicated input that meets a sharded one at full batch size (e.g. the EXPAND of the loss
gradient over the batch) is sliced to the rank's shard (``slice_inputs``). A MAX row tree
(``GraphBuilder._row_tree``: a row longer than one ruling reads, cut into chunks) over a row whose
axis runs over the batch starts from the whole row, all-gathered (``gather_inputs``): the tree's
SLICE, PAD and RESHAPE move entries between samples, so it runs replicated. Anything the analysis
cannot place (a state slot written from one shard, a SLICE across samples, two inputs sharded on
different axes) raises :class:`~vtrain.errors.GraphError` naming the op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from vtrain.errors import GraphError
from vtrain.graph.step_graph import GENERATED_KINDS, Graph, OpKind, OpNode, Shape


@dataclass(frozen=True)
class Placement:
    """A sharded tensor: ``axis`` runs over the batch in blocks of ``block`` entries per sample."""

    axis: int
    block: int


@dataclass(frozen=True)
class Shard:
    """Rank ``rank`` of ``world`` holds samples ``[start, start + size)`` of a batch of ``batch``."""

    rank: int
    world: int
    batch: int
    start: int
    size: int


def shards(batch: int, world: int) -> list[Shard]:
    """Contiguous, as even as possible: the first ``batch % world`` ranks get one sample more."""
    if world < 1:
        raise GraphError(f"world size: expected at least 1, got {world}")
    if batch < world:
        raise GraphError(f"batch of {batch} samples cannot be split over {world} ranks (one sample each at least)")
    base, extra = divmod(batch, world)
    out, start = [], 0
    for r in range(world):
        size = base + (r < extra)
        out.append(Shard(r, world, batch, start, size))
        start += size
    return out


@dataclass
class ShardingPlan:
    """Placement of every op, the batch reductions, and the inputs to slice."""

    graph: Graph
    batch: int
    placement: list[Placement | None]
    reductions: set[int] = field(default_factory=set)
    """Ops that reduce over the batch (output replicated, combined across ranks)."""
    slice_inputs: dict[int, list[tuple[int, Placement]]] = field(default_factory=dict)
    """op -> (input position, placement) of replicated inputs to cut to the rank's shard."""
    gather_inputs: dict[int, list[tuple[int, Placement]]] = field(default_factory=dict)
    """op -> (input position, placement) of sharded inputs every rank all-gathers whole before the op
    (which then runs replicated): where a MAX row tree starts on a row whose axis runs over the batch."""
    tree_reads: dict[int, list[int]] = field(default_factory=dict)
    """op -> input positions where a MAX row tree (``GraphBuilder._row_tree``) reads its row."""

    def local_shape(self, shape: Shape, p: Placement | None, shard: Shard) -> Shape:
        if p is None:
            return shape
        s = list(shape)
        s[p.axis] = shard.size * p.block
        return tuple(s)

    def local_graph(self, shard: Shard) -> Graph:
        """The graph a rank runs: the same ops, ids and attributes, with its shard's shapes."""
        g = self.graph
        ops = [replace(op, shape=self.local_shape(op.shape, self.placement[op.id], shard)) for op in g.ops]
        data_shape = self.local_shape(g.data_shape, Placement(0, 1), shard)
        return Graph(ops, list(g.slots), dict(g.consts), data_shape, g.loss_op, dict(g.grad_ops))

    @property
    def n_sharded(self) -> int:
        return sum(p is not None for p in self.placement)


def analyse(graph: Graph) -> ShardingPlan:
    """Propagate the batch axis from DATA (axis 0) through the graph (see the module docstring)."""
    if not graph.data_shape:
        raise GraphError("sharding: the graph has no DATA op")
    batch = graph.data_shape[0]
    plan = ShardingPlan(graph, batch, [None] * graph.n_ops, tree_reads=_row_tree_reads(graph))
    for op in graph.ops:
        plan.placement[op.id] = _place(plan, op)
    if plan.placement[graph.loss_op] is not None:
        raise GraphError(f"sharding: the loss (op {graph.loss_op}) is per sample; expected a reduction over the batch")
    return plan


def _row_tree_reads(graph: Graph) -> dict[int, list[int]]:
    """The ops that read the row of a MAX row tree (``GraphBuilder._row_tree``): a MAX over the last
    axis of ``RESHAPE(row, (..., m, c))``, ``row`` of shape ``(..., n)`` with ``c < n <= m c``, where
    ``row`` is the tree's input ``x`` (``m c = n``) or its padding ``SELECT(CONST, PAD(x), SLICE(x))``
    (copies of ``x``'s element 0 past ``n``). Those ops cut ``x``'s last axis into chunks or copy
    its first element to the end: when that axis runs over the batch they need the whole row."""
    ops = graph.ops
    out: dict[int, list[int]] = {}
    for mx in ops:
        if mx.kind != OpKind.MAX or ops[mx.inputs[0]].kind != OpKind.RESHAPE:
            continue
        rs = ops[mx.inputs[0]]
        row = ops[rs.inputs[0]]
        if len(rs.shape) < 2 or rs.shape[:-2] != row.shape[:-1]:
            continue
        m, c = rs.shape[-2], rs.shape[-1]
        if row.shape[-1] != m * c or m < 2:
            continue
        if row.kind == OpKind.SELECT and len(row.inputs) == 3 and ops[row.inputs[0]].kind == OpKind.CONST:
            pad, first = ops[row.inputs[1]], ops[row.inputs[2]]
            if pad.kind == OpKind.PAD and first.kind == OpKind.SLICE and pad.inputs[0] == first.inputs[0]:
                if c < ops[pad.inputs[0]].shape[-1] < m * c:  # x's row of n, padded to m c
                    out[pad.id] = [0]
                    out[first.id] = [0]
                continue
        out[rs.id] = [0]  # x itself, cut into m chunks of c
    return out


def _err(op: OpNode, why: str) -> GraphError:
    return GraphError(f"sharding: op {op.id} ({op.kind.name} {op.name}) {why}")


def _check(plan: ShardingPlan, op: OpNode, shape: Shape, p: Placement) -> Placement:
    if not 0 <= p.axis < len(shape) or shape[p.axis] != plan.batch * p.block:
        raise _err(op, f"expected axis {p.axis} of {shape} to have {plan.batch} x {p.block} entries")
    return p


def _join(plan: ShardingPlan, op: OpNode, positions: list[int]) -> Placement | None:
    """Elementwise rule (inputs of the output's rank, axes aligned): the sharded inputs at
    ``positions`` must agree; replicated ones of full batch size there are sliced, size 1 broadcasts."""
    got: Placement | None = None
    for pos in positions:
        p = plan.placement[op.inputs[pos]]
        if p is None:
            continue
        if got is not None and p != got:
            raise _err(op, f"combines inputs sharded as {got} and {p}")
        got = p
    if got is None:
        return None
    for pos in positions:
        i = op.inputs[pos]
        if plan.placement[i] is not None:
            continue
        size = plan.graph.ops[i].shape[got.axis]
        if size == plan.batch * got.block:
            plan.slice_inputs.setdefault(op.id, []).append((pos, got))
        elif size != 1:
            raise _err(op, f"input {i} has {size} entries on the batch axis {got.axis}")
    return got


def _place(plan: ShardingPlan, op: OpNode) -> Placement | None:  # noqa: C901 (one rule per kind)
    """The op's placement from its inputs' (the rule of its kind), or a GraphError saying why the
    op mixes samples in a way that is not a batch reduction."""
    K = OpKind
    k = op.kind
    g = plan.graph
    ins = [plan.placement[i] for i in op.inputs]
    if k == K.DATA:
        return _check(plan, op, op.shape, Placement(0, 1))
    if k in (K.INPUT, K.CONST) or k in GENERATED_KINDS:
        # a DROPOUT_MASK is generated whole (every element at its global index) and cut to the
        # shard where it meets a sharded tensor, so its bits cannot depend on the split
        return None
    if all(p is None for p in ins):
        return None
    if k == K.OUTPUT:
        raise _err(op, "writes a state slot from one shard of the batch (the state must not depend on the split)")
    tree = plan.tree_reads.get(op.id)
    if tree is not None:  # a MAX row tree over a batch axis: its row gathered whole, the tree replicated
        gathered: list[tuple[int, Placement]] = []
        for pos in tree:
            p = ins[pos]
            if p is not None and p.axis == len(g.ops[op.inputs[pos]].shape) - 1:
                gathered.append((pos, p))
        if gathered and len(gathered) == sum(p is not None for p in ins):
            plan.gather_inputs[op.id] = gathered
            return None
    if k in (K.SUM, K.MEAN, K.MAX):
        p = ins[0]
        assert p is not None
        if p.axis == len(op.shape) - 1:  # the reduced axis runs over the batch: combined across ranks
            plan.reductions.add(op.id)
            return None
        return p
    if k == K.MATMUL:
        return _place_matmul(plan, op, ins)
    if k == K.RESHAPE:
        return _check(plan, op, op.shape, _reshape(op, g.ops[op.inputs[0]].shape, op.shape, ins[0], plan.batch))
    if k == K.PERMUTE:
        p = ins[0]
        assert p is not None
        return _check(plan, op, op.shape, Placement(list(op.attrs).index(p.axis), p.block))
    if k in (K.SLICE, K.PAD):
        p = ins[0]
        assert p is not None
        if op.attrs[0] == p.axis:
            raise _err(op, f"{'slices' if k == K.SLICE else 'pads'} the batch axis {p.axis} (it would move "
                       "entries between samples)")
        return p
    if k in (K.EXPAND, K.ONE_HOT):  # the sharded axis keeps its size and position
        return _check(plan, op, op.shape, ins[0])  # type: ignore[arg-type]
    if k == K.TAKE:
        return _place_take(plan, op, ins)
    if k == K.GATHER and ins[0] is not None and ins[0].axis == len(op.shape) - 1:
        raise _err(op, "gathers along the batch axis (an index may pick another rank's sample)")
    if k == K.MAX_GRAD and ins[0] is not None and ins[0].axis == len(op.shape) - 1:
        raise _err(op, "routes a gradient to the first maximum over the batch axis (the first maximum "
                   "may lie on another rank); not a supported batch reduction")
    # elementwise (unary, binary and SELECT with broadcast, RELU_GRAD, GATHER and MAX_GRAD along a
    # per-sample axis): inputs of the output's rank, axes aligned
    got = _join(plan, op, list(range(len(op.inputs))))
    return _check(plan, op, op.shape, got) if got is not None else None


def _place_take(plan: ShardingPlan, op: OpNode, ins: list[Placement | None]) -> Placement:
    """``out[pre, j..., post] = x[pre, idx[j...], post]``: a sharded ``x`` keeps its batch axis (moved
    by idx's rank) unless it is the taken axis; a sharded ``idx`` (token ids: an embedding lookup)
    puts the batch axis among the ``j`` axes."""
    g = plan.graph
    axis = op.attrs[0]
    px, pi = ins
    idx_rank = len(g.ops[op.inputs[1]].shape)
    if px is not None and pi is not None:
        raise _err(op, f"takes from a tensor sharded as {px} by indices sharded as {pi}")
    if px is not None:
        if px.axis == axis:
            raise _err(op, f"takes along the batch axis {axis} (an index may pick another rank's sample)")
        out_axis = px.axis if px.axis < axis else px.axis + idx_rank - 1
        return _check(plan, op, op.shape, Placement(out_axis, px.block))
    assert pi is not None
    return _check(plan, op, op.shape, Placement(axis + pi.axis, pi.block))


def _place_matmul(plan: ShardingPlan, op: OpNode, ins: list[Placement | None]) -> Placement | None:
    g = plan.graph
    r = len(op.shape)
    pa, pb = ins[0], ins[1]
    if len(ins) == 3 and ins[2] is not None:
        raise _err(op, "has a bias that depends on the batch")
    axes = [p.axis for p in (pa, pb) if p is not None]
    if any(a < r - 2 for a in axes):  # a leading (batched-matmul) axis: both sides cut the same way
        return _join(plan, op, [0, 1])
    if pa is not None and pb is not None:
        if pa.axis == r - 1 and pb.axis == r - 1 and pa.block == pb.block:
            plan.reductions.add(op.id)  # K runs over the batch
            return None
        raise _err(op, f"multiplies operands sharded as {pa} and {pb}")
    one = pa if pa is not None else pb
    assert one is not None
    if one.axis == r - 1:  # K runs over the batch; the replicated operand is cut along K
        other = 1 if pa is not None else 0
        size = g.ops[op.inputs[other]].shape[-1]
        if size != plan.batch * one.block:
            raise _err(op, f"contracts a sharded K with an operand of {size} entries")
        plan.slice_inputs.setdefault(op.id, []).append((other, one))
        plan.reductions.add(op.id)
        return None
    if pa is not None:  # rows M of a
        return _check(plan, op, op.shape, Placement(r - 2, one.block))
    if len(ins) == 3:  # b's rows are the output's columns: the bias would need cutting too
        raise _err(op, "has a bias on a batch-sharded column axis")
    return _check(plan, op, op.shape, Placement(r - 1, one.block))


def _reshape(op: OpNode, src: Shape, dst: Shape, p: Placement | None, batch: int) -> Placement:
    """Where the batch axis lands: the axes before it keep their product and a sample's entries
    stay one contiguous block of the new axis."""
    assert p is not None
    pre = math.prod(src[: p.axis])
    per_sample = p.block * math.prod(src[p.axis + 1 :])  # flat entries of one sample after `pre`
    for a in range(len(dst)):
        if math.prod(dst[:a]) != pre:
            continue
        if dst[a] % batch == 0 and (dst[a] // batch) * math.prod(dst[a + 1 :]) == per_sample:
            return Placement(a, dst[a] // batch)
    raise GraphError(f"sharding: op {op.id} (RESHAPE) reshapes {src} to {dst}, splitting the batch axis {p.axis}")
