"""A training step as a static graph of primitive ops, and reverse-mode autodiff over it.

Models, losses and optimizers are written against :class:`GraphBuilder`; the result is a
:class:`Graph`: a topologically ordered list of :class:`OpNode` (kind, inputs, output shape,
attributes). The same graph runs every step; it is committed (graph root) and each node can be
adjudicated on its own. Op kinds and semantics: ``docs/protocol.md``.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vtrain.errors import GraphError


class OpKind(enum.IntEnum):
    """Primitive op codes (identical in ``contracts/lib/OpKinds.sol``)."""

    INPUT = 0
    OUTPUT = 1
    DATA = 2
    CONST = 3
    ADD = 10
    SUB = 11
    MUL = 12
    DIV = 13
    ADD_S = 14
    MUL_S = 15
    DIV_S = 16
    RSUB_S = 17
    SQRT = 20
    EXP = 21
    LOG = 22
    TANH = 23
    ERF = 24
    MATMUL = 30
    SUM = 31
    MEAN = 32
    MAX = 40
    RELU = 41
    RELU_GRAD = 42
    RESHAPE = 50
    PERMUTE = 51
    SLICE = 52
    PAD = 53
    EXPAND = 54
    ONE_HOT = 55
    GATHER = 56
    TAKE = 57
    SELECT = 58
    MAX_GRAD = 59
    DROPOUT_MASK = 60
    STEP = 61
    CONCAT = 62


ROUNDING_KINDS = frozenset(
    {
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
    }
)
"""Kinds whose FP64 result is rounded to FP32 (the rest copy FP32 values exactly)."""

MAX_CONCAT_INPUTS = 16
"""Inputs of one CONCAT op (the DisputeGame's ``MAX_OP_INPUTS``: each input root is proven in ``openOp``)."""

MAX_ROW_ELEMENTS = 16_384
"""Longest row one MAX / MAX_GRAD op reduces: a ruling reads the whole row, so this equals the
Adjudicator's ``MAX_ROW`` (the longest row a ruling reads under the transaction gas cap; a test ties
the two). :class:`GraphBuilder` lowers a longer row as a tree of MAX ops over chunks of at most this."""

GENERATED_KINDS = frozenset({OpKind.DROPOUT_MASK, OpKind.STEP})
"""Kinds without inputs whose output follows from the job's data seed and the step number."""

LOGGING_KINDS = frozenset(
    {OpKind.EXP, OpKind.LOG, OpKind.TANH, OpKind.ERF, OpKind.MATMUL, OpKind.SUM, OpKind.MEAN}
)
"""Kinds with a non-zero certified bound: the only ones that can have rounding-log entries."""


def f32_bits(x: float) -> int:
    """Bit pattern of the FP32 rounding of ``x`` (how scalar constants are stored in attrs)."""
    b = struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]
    return 0 if b == 0x80000000 else b


def bits_f32(b: int) -> float:
    """The FP32 value of a bit pattern, as a Python float."""
    return struct.unpack("<f", struct.pack("<I", b))[0]


Shape = tuple[int, ...]


@dataclass(frozen=True)
class OpNode:
    """One primitive op of the step graph; ``id`` is its position (also its trace and log leaf)."""

    id: int
    kind: OpKind
    inputs: tuple[int, ...]
    shape: Shape
    attrs: tuple[int, ...] = ()
    name: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Slot:
    """A state component (parameter or optimizer state), in canonical state-root order."""

    name: str
    shape: Shape


@dataclass
class Graph:
    """The static step graph: ops in topological order, state slots, constants, data shape."""

    ops: list[OpNode]
    slots: list[Slot]
    consts: dict[int, np.ndarray]
    data_shape: Shape
    loss_op: int
    grad_ops: dict[int, int] = field(default_factory=dict)
    """Slot of a parameter -> op computing its gradient (for tests and debugging)."""
    weight_grad_ops: frozenset[int] = frozenset()
    """Backward ops that only compute gradients of parameters (``wrt`` of :meth:`GraphBuilder.grad`),
    not of activations: where the seed paper's hooks do not log (``vtrain.numerics.paper``)."""

    @property
    def n_ops(self) -> int:
        return len(self.ops)

    def in_shapes(self, op: OpNode) -> list[Shape]:
        return [self.ops[i].shape for i in op.inputs]

    def input_op(self, slot: int) -> int:
        return next(o.id for o in self.ops if o.kind == OpKind.INPUT and o.attrs[0] == slot)


@dataclass(frozen=True)
class T:
    """A symbolic tensor: the op that produces it and its shape."""

    op: int
    shape: Shape

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class _RowTree:
    """The first level of the MAX tree of a long row: the (padded) row viewed as ``(..., m, c)``
    chunks, and the chunk maxima ``(..., m)``."""

    chunks: T
    maxima: T


def _broadcast(a: Shape, b: Shape) -> Shape:
    if len(a) != len(b):
        raise GraphError(f"broadcast needs equal ranks: expected {len(a)}, got {len(b)}")
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            raise GraphError(f"shapes {a} and {b} do not broadcast")
        out.append(max(x, y))
    return tuple(out)


@dataclass
class GraphBuilder:
    """Records primitive ops; every method returns the symbolic output of one new op."""

    ops: list[OpNode] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    consts: dict[int, np.ndarray] = field(default_factory=dict)
    data_shape: Shape = ()
    no_grad: set[int] = field(default_factory=set)
    weight_grad_ops: set[int] = field(default_factory=set)
    max_row: int = MAX_ROW_ELEMENTS
    """Longest row one MAX / MAX_GRAD op reduces (longer rows become a tree; tests use a small one)."""
    _row_trees: dict[int, _RowTree] = field(default_factory=dict, init=False, repr=False)
    _max_roots: dict[int, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_row < 2:
            raise GraphError(f"max_row: expected a row limit of at least 2, got {self.max_row}")

    def _op(self, kind: OpKind, inputs: Sequence[T], shape: Shape, attrs: Sequence[int] = (), name: str = "") -> T:
        if any(s <= 0 for s in shape):
            raise GraphError(f"{kind.name}: empty shape {shape}")
        node = OpNode(len(self.ops), kind, tuple(t.op for t in inputs), tuple(shape), tuple(attrs), name)
        self.ops.append(node)
        return T(node.id, node.shape)

    # -- binds ---------------------------------------------------------------------------------
    def input(self, name: str, shape: Shape) -> T:
        self.slots.append(Slot(name, tuple(shape)))
        return self._op(OpKind.INPUT, [], shape, [len(self.slots) - 1], name)

    def output(self, x: T, slot: int) -> T:
        """Bind ``x`` to state slot ``slot``: a copy in the slot's shape (``x`` may be any shape with the
        slot's element count, e.g. a 1-D slice of a flat optimizer buffer: tensor roots are of the flat bytes)."""
        shape = self.slots[slot].shape
        if math.prod(shape) != math.prod(x.shape) or (x.rank != 1 and x.shape != shape):
            raise GraphError(f"output slot {slot}: expected shape {shape}, got {x.shape}")
        return self._op(OpKind.OUTPUT, [x], shape, [slot], self.slots[slot].name)

    def data(self, shape: Shape) -> T:
        self.data_shape = tuple(shape)
        t = self._op(OpKind.DATA, [], shape, [], "data")
        self.no_grad.add(t.op)
        return t

    def const(self, value: np.ndarray, name: str = "const") -> T:
        arr = np.ascontiguousarray(value, dtype=np.float32) + np.float32(0.0)
        t = self._op(OpKind.CONST, [], arr.shape, [0], name)  # attrs[0] (the root) is filled in at commit time
        self.consts[t.op] = arr
        self.no_grad.add(t.op)
        return t

    # -- elementwise ---------------------------------------------------------------------------
    def _binary(self, kind: OpKind, a: T, b: T) -> T:
        a, b = self._same_rank(a, b)
        return self._op(kind, [a, b], _broadcast(a.shape, b.shape))

    def _same_rank(self, a: T, b: T) -> tuple[T, T]:
        if a.rank < b.rank:
            a = self.reshape(a, (1,) * (b.rank - a.rank) + a.shape)
        elif b.rank < a.rank:
            b = self.reshape(b, (1,) * (a.rank - b.rank) + b.shape)
        return a, b

    def add(self, a: T, b: T) -> T:
        return self._binary(OpKind.ADD, a, b)

    def sub(self, a: T, b: T) -> T:
        return self._binary(OpKind.SUB, a, b)

    def mul(self, a: T, b: T) -> T:
        return self._binary(OpKind.MUL, a, b)

    def div(self, a: T, b: T) -> T:
        return self._binary(OpKind.DIV, a, b)

    def add_s(self, a: T, c: float) -> T:
        return self._op(OpKind.ADD_S, [a], a.shape, [f32_bits(c)])

    def mul_s(self, a: T, c: float) -> T:
        return self._op(OpKind.MUL_S, [a], a.shape, [f32_bits(c)])

    def div_s(self, a: T, c: float) -> T:
        return self._op(OpKind.DIV_S, [a], a.shape, [f32_bits(c)])

    def rsub_s(self, c: float, a: T) -> T:
        return self._op(OpKind.RSUB_S, [a], a.shape, [f32_bits(c)])

    def neg(self, a: T) -> T:
        return self.mul_s(a, -1.0)

    def sqrt(self, a: T) -> T:
        return self._op(OpKind.SQRT, [a], a.shape)

    def exp(self, a: T) -> T:
        return self._op(OpKind.EXP, [a], a.shape)

    def log(self, a: T) -> T:
        return self._op(OpKind.LOG, [a], a.shape)

    def tanh(self, a: T) -> T:
        return self._op(OpKind.TANH, [a], a.shape)

    def erf(self, a: T) -> T:
        """The error function ``erf(a)``, certified-rounded to FP32 (one rounding)."""
        return self._op(OpKind.ERF, [a], a.shape)

    def relu(self, a: T) -> T:
        return self._op(OpKind.RELU, [a], a.shape)

    def relu_grad(self, x: T, g: T) -> T:
        return self._op(OpKind.RELU_GRAD, [x, g], x.shape)

    # -- reductions ----------------------------------------------------------------------------
    def matmul(self, a: T, b: T, bias: T | None = None) -> T:
        """``out[..., i, j] = sum_k a[..., i, k] * b[..., j, k] (+ bias[j])`` (both operands row-contiguous)."""
        if a.rank < 2 or a.rank != b.rank or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-1]:
            raise GraphError(f"matmul: expected a[...,M,K] and b[...,N,K], got {a.shape} and {b.shape}")
        ins = [a, b]
        if bias is not None:
            if bias.shape != (b.shape[-2],):
                raise GraphError(f"matmul bias: expected shape {(b.shape[-2],)}, got {bias.shape}")
            ins.append(bias)
        return self._op(OpKind.MATMUL, ins, a.shape[:-1] + (b.shape[-2],))

    def sum(self, a: T) -> T:
        return self._op(OpKind.SUM, [a], a.shape[:-1] + (1,))

    def mean(self, a: T) -> T:
        return self._op(OpKind.MEAN, [a], a.shape[:-1] + (1,))

    def max(self, a: T, differentiable: bool = False) -> T:
        """Row maximum. By default a constant for autodiff (it only shifts softmax inputs); with
        ``differentiable`` (max pooling) its VJP is MAX_GRAD: the gradient goes to the first maximum.
        A row longer than :attr:`max_row` becomes a tree (see :meth:`_row_tree`), bit-identical."""
        if a.shape[-1] <= self.max_row:
            t = self._op(OpKind.MAX, [a], a.shape[:-1] + (1,))
        else:
            tree = self._row_tree(a)
            t = self.max(tree.maxima, differentiable=True)
            self._max_roots[t.op] = a.op  # its VJP routes to ``a`` (see :meth:`max_grad`)
        if not differentiable:
            self.no_grad.add(t.op)
        return t

    def max_grad(self, x: T, g: T) -> T:
        """``out[..., k] = g[..., 0]`` at the first index attaining the row maximum of ``x``, else +0.

        A row longer than :attr:`max_row` goes down its tree: MAX_GRAD of the chunk maxima gives
        ``g`` to the first chunk attaining the row maximum and +0 to the others, then each chunk's
        MAX_GRAD gives its share to its own first maximum. This is the one-level result: the chunks
        before the first maximum ``i*`` hold no element equal to the maximum (else ``i*`` would not be
        first), so the first chunk attaining it is ``i*``'s, and within it ``i*`` is first; every other
        element gets +0 (from ``g = +0`` or from not being its chunk's first maximum), the padding
        (a copy of element 0, never first before ``i*``) is cut off, and no ADD touches a value (so
        ``g = -0`` passes through unchanged)."""
        if g.shape != x.shape[:-1] + (1,):
            raise GraphError(f"max_grad: expected g shape {x.shape[:-1] + (1,)}, got {g.shape}")
        if x.shape[-1] <= self.max_row:
            return self._op(OpKind.MAX_GRAD, [x, g], x.shape)
        tree = self._row_tree(x)
        m, c = tree.chunks.shape[-2:]
        pre = x.shape[:-1]
        gm = self.reshape(self.max_grad(tree.maxima, g), pre + (m, 1))
        gc = self.reshape(self._op(OpKind.MAX_GRAD, [tree.chunks, gm], tree.chunks.shape), pre + (m * c,))
        return gc if m * c == x.shape[-1] else self.slice(gc, x.rank - 1, 0, x.shape[-1])

    def _row_tree(self, x: T) -> _RowTree:
        """The first level of the MAX tree of a row longer than :attr:`max_row` (built once per ``x``).

        The ``n`` elements of a row are cut into ``m = ceil(n / max_row)`` chunks of ``c = ceil(n / m)``
        (padding the row to ``m c`` with copies of its element 0: PAD, then SELECT by a CONST mask, so
        neither the maximum nor the first index attaining it moves), viewed as ``(..., m, c)``; one MAX
        op gives the chunk maxima ``(..., m)``, whose MAX (a tree again if ``m > max_row``) is the row's.
        MAX is exact and returns the first element attaining the maximum, so the tree's value is the
        element at the row's first maximum: bit-identical to one MAX over the row."""
        if x.op in self._row_trees:
            return self._row_trees[x.op]
        n, pre, axis = x.shape[-1], x.shape[:-1], x.rank - 1
        m = -(-n // self.max_row)
        c = -(-n // m)
        row = x
        if m * c > n:
            mask = np.zeros((1,) * axis + (m * c,), np.float32)
            mask[..., :n] = 1.0
            first = self.slice(x, axis, 0, 1)
            row = self.select(self.const(mask, "max_row_pad_mask"), self.pad(x, axis, 0, m * c), first)
        chunks = self.reshape(row, pre + (m, c))
        maxima = self.reshape(self._op(OpKind.MAX, [chunks], pre + (m, 1)), pre + (m,))
        tree = _RowTree(chunks, maxima)
        self._row_trees[x.op] = tree
        return tree

    # -- data movement -------------------------------------------------------------------------
    def reshape(self, a: T, shape: Shape) -> T:
        if math.prod(shape) != math.prod(a.shape):
            raise GraphError(f"reshape: {a.shape} has {math.prod(a.shape)} elements, {shape} has {math.prod(shape)}")
        if tuple(shape) == a.shape:
            return a
        return self._op(OpKind.RESHAPE, [a], tuple(shape))

    def permute(self, a: T, perm: Sequence[int]) -> T:
        if sorted(perm) != list(range(a.rank)):
            raise GraphError(f"permute: {list(perm)} is not a permutation of {a.rank} axes")
        if list(perm) == list(range(a.rank)):
            return a
        return self._op(OpKind.PERMUTE, [a], tuple(a.shape[p] for p in perm), list(perm))

    def transpose(self, a: T) -> T:
        """Swap the last two axes."""
        perm = list(range(a.rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return self.permute(a, perm)

    def slice(self, a: T, axis: int, start: int, length: int) -> T:
        if not 0 <= start < start + length <= a.shape[axis]:
            raise GraphError(f"slice: [{start}, {start + length}) outside axis {axis} of {a.shape}")
        shape = list(a.shape)
        shape[axis] = length
        return self._op(OpKind.SLICE, [a], tuple(shape), [axis, start])

    def pad(self, a: T, axis: int, start: int, size: int) -> T:
        shape = list(a.shape)
        shape[axis] = size
        return self._op(OpKind.PAD, [a], tuple(shape), [axis, start])

    def expand(self, a: T, shape: Shape) -> T:
        _broadcast(a.shape, tuple(shape))
        if tuple(shape) == a.shape:
            return a
        return self._op(OpKind.EXPAND, [a], tuple(shape))

    def concat(self, xs: Sequence[T]) -> T:
        """The elements of ``xs`` one after another (each in row-major order) as one 1-D tensor; more
        than :data:`MAX_CONCAT_INPUTS` tensors become a tree of CONCAT ops (one tensor: a RESHAPE)."""
        if not xs:
            raise GraphError("concat: expected at least one tensor, got none")
        xs = list(xs)
        if len(xs) == 1:
            return self.reshape(xs[0], (math.prod(xs[0].shape),))
        while len(xs) > MAX_CONCAT_INPUTS:
            xs = [self.concat(xs[i : i + MAX_CONCAT_INPUTS]) for i in range(0, len(xs), MAX_CONCAT_INPUTS)]
        return self._op(OpKind.CONCAT, xs, (sum(math.prod(x.shape) for x in xs),))

    def one_hot(self, idx: T, classes: int) -> T:
        t = self._op(OpKind.ONE_HOT, [idx], idx.shape + (classes,), [classes])
        self.no_grad.add(t.op)
        return t

    def gather(self, x: T, idx: T) -> T:
        if idx.shape != x.shape[:-1] + (1,):
            raise GraphError(f"gather: expected idx shape {x.shape[:-1] + (1,)}, got {idx.shape}")
        return self._op(OpKind.GATHER, [x, idx], idx.shape)

    def take(self, x: T, idx: T, axis: int = 0) -> T:
        """``out[pre, j..., post] = x[pre, idx[j...], post]`` (+0.0 where ``idx[j...]`` is not an
        integer in ``[0, x.shape[axis])``): embedding lookups, patch gathers, index_select."""
        if not 0 <= axis < x.rank:
            raise GraphError(f"take: axis {axis} outside the {x.rank} axes of {x.shape}")
        return self._op(OpKind.TAKE, [x, idx], x.shape[:axis] + idx.shape + x.shape[axis + 1 :], [axis])

    def select(self, cond: T, a: T, b: T) -> T:
        """``out[i] = a[i] if cond[i] != 0 else b[i]`` (each input's dims equal the output's or 1)."""
        r = max(cond.rank, a.rank, b.rank)
        cond, a, b = (self.reshape(t, (1,) * (r - t.rank) + t.shape) for t in (cond, a, b))
        shape = _broadcast(_broadcast(cond.shape, a.shape), b.shape)
        return self._op(OpKind.SELECT, [cond, a, b], shape)

    def dropout_mask(self, shape: Shape, p: float) -> T:
        """Keep-mask times ``1/(1-p)``: ``RN32(1/(1-p))`` where the element's hash >= ``round(p 2^32)``,
        else +0.0. The hash is of the job's data seed, the step, a per-op salt and the element index."""
        if not 0.0 <= p < 1.0:
            raise GraphError(f"dropout_mask: expected a drop probability in [0, 1), got {p}")
        threshold = round(p * 2**32)
        if threshold >= 2**32:
            raise GraphError(f"dropout_mask: drop probability {p} rounds to 1 (threshold 2^32)")
        salt = sum(1 for o in self.ops if o.kind == OpKind.DROPOUT_MASK)
        t = self._op(OpKind.DROPOUT_MASK, [], tuple(shape), [threshold, f32_bits(1.0 / (1.0 - p)), salt], "dropout")
        self.no_grad.add(t.op)
        return t

    def step(self) -> T:
        """The step number (1-based) as one FP32 value, shape (1,)."""
        t = self._op(OpKind.STEP, [], (1,), [], "step")
        self.no_grad.add(t.op)
        return t

    # -- helpers -------------------------------------------------------------------------------
    def reduce_to(self, g: T, shape: Shape) -> T:
        """Sum ``g`` over the axes where ``shape`` broadcasts (size 1), giving ``shape``."""
        if g.shape == tuple(shape):
            return g
        if len(shape) != g.rank:
            raise GraphError(f"reduce_to: expected rank {g.rank}, got {shape}")
        red = [i for i in range(g.rank) if shape[i] == 1 and g.shape[i] != 1]
        keep = [i for i in range(g.rank) if i not in red]
        p = self.permute(g, keep + red)
        kept_shape = tuple(g.shape[i] for i in keep)
        r = self.reshape(p, kept_shape + (math.prod(g.shape[i] for i in red),))
        return self.reshape(self.sum(r), tuple(shape))

    def build(self, loss: T, grad_ops: dict[int, int] | None = None) -> Graph:
        return Graph(
            list(self.ops), list(self.slots), dict(self.consts), self.data_shape, loss.op, dict(grad_ops or {}),
            frozenset(self.weight_grad_ops),
        )

    # -- autodiff ------------------------------------------------------------------------------
    def grad(self, loss: T, wrt: Sequence[T]) -> list[T]:
        """Reverse-mode gradients of a single-element ``loss`` w.r.t. ``wrt``, as new primitive ops."""
        if math.prod(loss.shape) != 1:
            raise GraphError(f"grad: loss must have one element, got shape {loss.shape}")
        adj: dict[int, T] = {loss.op: self.const(np.ones(loss.shape, np.float32), "dloss")}
        needed = self._needed(loss.op, {t.op for t in wrt})
        for node in reversed(self.ops[: loss.op + 1]):
            g = adj.pop(node.id, None)
            if g is None or node.id not in needed:
                continue
            if node.id in {t.op for t in wrt}:
                adj[node.id] = g  # keep for the caller
                continue
            start = len(self.ops)
            contribs = self._vjp(node, g)
            self._mark_weight_grads(start, contribs, {t.op for t in wrt})
            for inp, gi in contribs:
                if inp in self.no_grad or inp not in needed:
                    continue
                if inp not in adj:
                    adj[inp] = gi
                    continue
                adj[inp] = self.add(adj[inp], gi)
                if inp in {t.op for t in wrt}:
                    self.weight_grad_ops.add(adj[inp].op)
        missing = [t.op for t in wrt if t.op not in adj]
        if missing:
            raise GraphError(f"grad: ops {missing} do not influence the loss")
        return [adj[t.op] for t in wrt]

    def _mark_weight_grads(self, start: int, contribs: list[tuple[int, T]], wrt: set[int]) -> None:
        """Of the ops one VJP just created (ids from ``start``), those that only feed contributions
        to the gradient of a ``wrt`` leaf (a parameter), not any other input's."""
        def closure(roots: list[int]) -> set[int]:
            seen: set[int] = set()
            todo = [r for r in roots if r >= start]
            while todo:
                o = todo.pop()
                if o in seen:
                    continue
                seen.add(o)
                todo.extend(i for i in self.ops[o].inputs if i >= start)
            return seen

        weight = closure([gi.op for inp, gi in contribs if inp in wrt])
        other = closure([gi.op for inp, gi in contribs if inp not in wrt])
        self.weight_grad_ops |= weight - other

    def _needed(self, loss: int, leaves: set[int]) -> set[int]:
        """Ops on some path from a ``wrt`` leaf to the loss (only those get adjoints)."""
        reach: set[int] = set()
        for node in self.ops[: loss + 1]:
            if node.id in leaves or any(i in reach for i in node.inputs):
                if node.id not in self.no_grad:
                    reach.add(node.id)
        return reach

    def _vjp(self, n: OpNode, g: T) -> list[tuple[int, T]]:
        ins = [T(i, self.ops[i].shape) for i in n.inputs]
        out = T(n.id, n.shape)
        k = n.kind
        K = OpKind
        if k == K.ADD:
            return [(ins[0].op, self.reduce_to(g, ins[0].shape)), (ins[1].op, self.reduce_to(g, ins[1].shape))]
        if k == K.SUB:
            return [
                (ins[0].op, self.reduce_to(g, ins[0].shape)),
                (ins[1].op, self.reduce_to(self.neg(g), ins[1].shape)),
            ]
        if k == K.MUL:
            a, b = ins
            return [(a.op, self.reduce_to(self.mul(g, b), a.shape)), (b.op, self.reduce_to(self.mul(g, a), b.shape))]
        if k == K.DIV:
            a, b = ins
            ga = self.div(g, b)
            gb = self.neg(self.div(self.mul(g, out), b))
            return [(a.op, self.reduce_to(ga, a.shape)), (b.op, self.reduce_to(gb, b.shape))]
        c = bits_f32(n.attrs[0]) if k in (K.ADD_S, K.MUL_S, K.DIV_S, K.RSUB_S) else 0.0
        if k == K.ADD_S:
            return [(ins[0].op, g)]
        if k == K.MUL_S:
            return [(ins[0].op, self.mul_s(g, c))]
        if k == K.DIV_S:
            return [(ins[0].op, self.div_s(g, c))]
        if k == K.RSUB_S:
            return [(ins[0].op, self.neg(g))]
        if k == K.SQRT:
            return [(ins[0].op, self.div(g, self.mul_s(out, 2.0)))]
        if k == K.EXP:
            return [(ins[0].op, self.mul(g, out))]
        if k == K.LOG:
            return [(ins[0].op, self.div(g, ins[0]))]
        if k == K.TANH:
            return [(ins[0].op, self.mul(g, self.rsub_s(1.0, self.mul(out, out))))]
        if k == K.ERF:  # d erf(x)/dx = (2/sqrt(pi)) exp(-x^2): MUL, MUL_S -1, EXP, MUL_S 2/sqrt(pi), MUL
            x = ins[0]
            slope = self.mul_s(self.exp(self.neg(self.mul(x, x))), 2.0 / math.sqrt(math.pi))
            return [(x.op, self.mul(g, slope))]
        if k == K.RELU:
            return [(ins[0].op, self.relu_grad(ins[0], g))]
        if k == K.MATMUL:
            a, b = ins[0], ins[1]
            res = [
                (a.op, self.matmul(g, self.transpose(b))),  # [...,M,K] = g[...,M,N] . b^T
                (b.op, self.matmul(self.transpose(g), self.transpose(a))),  # [...,N,K]
            ]
            if len(ins) == 3:
                flat = self.reshape(g, (math.prod(g.shape[:-1]), g.shape[-1]))
                res.append((ins[2].op, self.reshape(self.sum(self.transpose(flat)), ins[2].shape)))
            return res
        if k == K.SUM:
            return [(ins[0].op, self.expand(g, ins[0].shape))]
        if k == K.MEAN:
            return [(ins[0].op, self.expand(self.div_s(g, float(ins[0].shape[-1])), ins[0].shape))]
        if k in (K.RESHAPE, K.OUTPUT):
            return [(ins[0].op, self.reshape(g, ins[0].shape))]
        if k == K.PERMUTE:
            inv = [0] * len(n.attrs)
            for i, p in enumerate(n.attrs):
                inv[p] = i
            return [(ins[0].op, self.permute(g, inv))]
        if k == K.SLICE:
            axis, start = n.attrs
            return [(ins[0].op, self.pad(g, axis, start, ins[0].shape[axis]))]
        if k == K.PAD:
            axis, start = n.attrs
            return [(ins[0].op, self.slice(g, axis, start, ins[0].shape[axis]))]
        if k == K.EXPAND:
            return [(ins[0].op, self.reduce_to(g, ins[0].shape))]
        if k == K.CONCAT:
            res, off = [], 0
            for x in ins:
                n = math.prod(x.shape)
                res.append((x.op, self.reshape(self.slice(g, 0, off, n), x.shape)))
                off += n
            return res
        if k == K.GATHER:
            x, idx = ins
            oh = self.one_hot(self.reshape(idx, idx.shape[:-1]), x.shape[-1])
            return [(x.op, self.mul(oh, g))]
        if k == K.TAKE:
            return [(ins[0].op, self._take_vjp(ins[0], ins[1], n.attrs[0], g))]
        if k == K.SELECT:
            cond, a, b = ins
            zero = self.const(np.zeros((1,) * g.rank, np.float32), "zero")
            return [
                (a.op, self.reduce_to(self.select(cond, g, zero), a.shape)),
                (b.op, self.reduce_to(self.select(cond, zero, g), b.shape)),
            ]
        if k == K.MAX and n.id in self._max_roots:  # the root of a long row's tree: to the row itself
            x = self._max_roots[n.id]
            return [(x, self.max_grad(T(x, self.ops[x].shape), g))]
        if k == K.MAX:
            return [(ins[0].op, self.max_grad(ins[0], g))]
        raise GraphError(f"no gradient rule for {k.name} (op {n.id})")

    def _take_vjp(self, x: T, idx: T, axis: int, g: T) -> T:
        """Gradient of TAKE w.r.t. ``x``. A CONST index table: TAKE of ``g`` by the inverse table
        (for each source position, the output positions reading it, -1 padded), then one SUM per
        element. A data-dependent index (embedding): ``ONE_HOT(idx)^T`` times ``g`` (one MATMUL)."""
        n = x.shape[axis]
        pre, post = x.shape[:axis], x.shape[axis + 1 :]
        J = math.prod(idx.shape)
        gf = self.reshape(g, pre + (J,) + post)
        table = self.consts.get(idx.op) if self.ops[idx.op].kind == OpKind.CONST else None
        if table is not None:
            flat = table.reshape(-1)
            valid = (flat >= 0) & (flat < n) & (flat == np.floor(flat))
            cols: list[list[int]] = [[] for _ in range(n)]
            for j in np.nonzero(valid)[0]:
                cols[int(flat[j])].append(int(j))
            R = max(1, max(len(c) for c in cols))
            inv = np.full((n, R), -1.0, np.float32)
            for i, c in enumerate(cols):
                inv[i, : len(c)] = c
            got = self.take(gf, self.const(inv, "take_inverse"), axis)  # pre + (n, R) + post
            if R == 1:
                return self.reshape(got, x.shape)
            r = len(pre) + 1  # the R axis
            order = [i for i in range(got.rank) if i != r] + [r]
            summed = self.sum(self.permute(got, order))  # pre + (n,) + post + (1,)
            return self.reshape(summed, x.shape)
        P = math.prod(pre) * math.prod(post)
        # g as (P, J): the positions of idx last, the rest of x's axes first
        gp = self.permute(gf, [i for i in range(gf.rank) if i != axis] + [axis])
        gp = self.reshape(gp, (P, J))
        oh_t = self.transpose(self.one_hot(self.reshape(idx, (J,)), n))  # (n, J)
        gx = self.matmul(oh_t, gp)  # (n, P)
        gx = self.reshape(gx, (n,) + pre + post)
        return self.permute(gx, list(range(1, axis + 1)) + [0] + list(range(axis + 1, gx.rank)))
