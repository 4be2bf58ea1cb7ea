"""One lowering per ATen op: how each core-ATen node of an exported program becomes primitive ops.

Registered like ``torch._decomp``'s ``@register_decomposition``: ``@lowering(aten.op.overload, ...)``
adds a function ``fn(L, node, *args, **kwargs)`` to :data:`LOWERINGS`; its docstring's first line
states its exact semantics in primitives (``docs/frontend.md`` lists them all). Every value a
lowering sees is a :class:`Sym` (a tensor of the step graph), a concrete ``torch.Tensor`` (a value
known at build time: folded constants, non-trainable buffers) or a plain Python value.

Conventions: booleans are FP32 0.0/1.0; integer tensors hold exact integers (|x| < 2^24); a 0-dim
tensor is a graph tensor of shape (1,); an infinite constant becomes +-2^100 (every value of the
graph is finite: ``x - 2^100`` rounds to ``-2^100`` for any |x| < 2^76, so masks keep their meaning).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vtrain.frontend.errors import UnsupportedOp, node_origin
from vtrain.graph.step_graph import GraphBuilder, OpKind, T

aten = torch.ops.aten

BIG = 2.0**100
"""What an infinite constant becomes (a finite stand-in for -inf in attention masks)."""

MOVEMENT_KINDS = frozenset({OpKind.RESHAPE, OpKind.PERMUTE, OpKind.SLICE, OpKind.EXPAND, OpKind.TAKE})


@dataclass(frozen=True)
class Sym:
    """A tensor of the step graph (its torch dtype is tracked for integer/bool semantics)."""

    t: T
    dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> tuple[int, ...]:
        return self.t.shape


Lowering = Callable[..., Any]
LOWERINGS: dict[Any, Lowering] = {}


def lowering(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register ``fn`` as the lowering of each ATen overload in ``ops``."""

    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return deco


def supported_ops() -> list[str]:
    """Names of every ATen overload with a lowering (sorted)."""
    return sorted({str(op) for op in LOWERINGS} | {"aten.arange.*", "aten.full.*", "aten.scalar_tensor.*"})


def finite(c: float) -> float:
    """A scalar as the graph stores it: infinities become +-2^100; NaN is refused."""
    c = float(c)
    if math.isnan(c):
        raise UnsupportedOp("a NaN constant has no place in a step graph (every value must be finite)")
    if math.isinf(c):
        return math.copysign(BIG, c)
    return c


class Lowerer:
    """Builds primitive ops on a :class:`GraphBuilder` for the nodes of one exported program."""

    def __init__(self, g: GraphBuilder) -> None:
        self.g = g
        self._small: dict[tuple[float, int], T] = {}
        self.node = None  # the node being lowered (for error messages)

    # -- values --------------------------------------------------------------------------------
    def t(self, v: Any) -> T:
        """The graph tensor of ``v`` (a concrete tensor or a number becomes a CONST)."""
        if isinstance(v, Sym):
            return v.t
        if isinstance(v, bool | int | float):
            return self.scalar_const(float(v), 1)
        if isinstance(v, torch.Tensor):
            arr = v.detach().to(torch.float64).numpy()
            if np.isnan(arr).any():
                raise UnsupportedOp("a constant tensor holds NaN")
            arr = np.where(np.isinf(arr), np.copysign(BIG, arr), arr).astype(np.float32)
            return self.g.const(arr.reshape(arr.shape or (1,)), "const")
        raise UnsupportedOp(f"expected a tensor, got {type(v).__name__}")

    def scalar_const(self, c: float, rank: int) -> T:
        """A CONST of shape (1,)*rank holding ``c`` (shared by every use in the graph)."""
        key = (finite(c), rank)
        if key not in self._small:
            self._small[key] = self.g.const(np.full((1,) * max(rank, 1), key[0], np.float32), f"c{key[0]:g}")
        return self._small[key]

    def perm(self, t: T, perm: Sequence[int]) -> T:
        """PERMUTE, or the input of a PERMUTE that this one undoes (no op then)."""
        perm = [p % max(t.rank, 1) for p in perm]
        node = self.g.ops[t.op]
        if node.kind == OpKind.PERMUTE and len(node.attrs) == len(perm):
            composed = [node.attrs[p] for p in perm]
            if composed == list(range(len(perm))):
                return T(node.inputs[0], self.g.ops[node.inputs[0]].shape)
        return self.g.permute(t, perm)

    def transpose(self, t: T) -> T:
        p = list(range(t.rank))
        p[-1], p[-2] = p[-2], p[-1]
        return self.perm(t, p)

    def reshape(self, t: T, shape: Sequence[int]) -> T:
        shape = tuple(shape) or (1,)
        node = self.g.ops[t.op]
        if node.kind == OpKind.RESHAPE and tuple(self.g.ops[node.inputs[0]].shape) == shape:
            return T(node.inputs[0], shape)
        return self.g.reshape(t, shape)

    def from_data(self, t: T) -> bool:
        """True when ``t`` is the data batch moved around (views, slices, permutes) and nothing else."""
        op = self.g.ops[t.op]
        while op.kind in MOVEMENT_KINDS and op.kind != OpKind.TAKE:
            op = self.g.ops[op.inputs[0]]
        return op.kind == OpKind.DATA

    def to01(self, x: Any) -> T:
        """A boolean-valued tensor (0/1) from any tensor: 1.0 where ``x != 0``."""
        if isinstance(x, Sym) and x.dtype == torch.bool:
            return x.t
        t = self.t(x)
        return self.g.select(t, self.scalar_const(1.0, t.rank), self.scalar_const(0.0, t.rank))

    def reduce(self, x: T, dims: Sequence[int] | None, keepdim: bool, kind: str) -> T:
        """SUM / MEAN / MAX (``kind``: sum, mean, max, max_const) over ``dims`` as one reduction per output element."""
        r = x.rank
        dims = sorted({d % r for d in dims}) if dims else list(range(r))
        keep = [i for i in range(r) if i not in dims]
        p = self.perm(x, keep + dims)
        kept = tuple(x.shape[i] for i in keep)
        flat = self.reshape(p, kept + (math.prod(x.shape[i] for i in dims),))
        if kind == "sum":
            out = self.g.sum(flat)
        elif kind == "mean":
            out = self.g.mean(flat)
        else:  # "max": its gradient to the first maximum (MAX_GRAD); "max_const": no gradient
            out = self.g.max(flat, differentiable=kind == "max")
        shape = tuple(1 if i in dims else x.shape[i] for i in range(r)) if keepdim else kept
        return self.reshape(out, shape)

    def to_last(self, x: T, dim: int) -> tuple[T, list[int] | None]:
        """``x`` with axis ``dim`` moved last, and the permutation that moves it back (or None)."""
        dim %= x.rank
        if dim == x.rank - 1:
            return x, None
        perm = [i for i in range(x.rank) if i != dim] + [dim]
        inv = [0] * x.rank
        for i, p in enumerate(perm):
            inv[p] = i
        return self.perm(x, perm), inv


def out_shape(node) -> tuple[int, ...]:
    """The torch shape of a node's (first) output, from its export metadata."""
    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        val = val[0]
    return tuple(int(s) for s in val.shape)


def _used_outputs(node) -> set[int]:
    """Indices ``i`` of a multi-output node that some ``getitem(node, i)`` reads."""
    return {int(u.args[1]) for u in node.users}


def _scalar_of(v: Any) -> float | None:
    """``v`` as a Python number when it is one (or a 1-element concrete tensor), else None."""
    if isinstance(v, bool | int | float):
        return float(v)
    if isinstance(v, torch.Tensor) and v.numel() == 1 and v.dim() == 0:
        return float(v)
    return None


# === elementwise arithmetic ==========================================================================
def _additive_mask(v: Any) -> np.ndarray | None:
    """A known tensor whose entries are all 0 or <= -2^100 (an additive attention mask), as FP32."""
    if not isinstance(v, torch.Tensor) or v.dim() == 0 or not v.is_floating_point():
        return None
    arr = v.detach().to(torch.float64).numpy()
    if np.isnan(arr).any():
        return None
    arr = np.where(np.isinf(arr), np.copysign(BIG, arr), arr)
    if not np.all((arr == 0) | (arr <= -BIG)) or np.all(arr == 0):
        return None
    return arr.astype(np.float32)


@lowering(aten.add.Tensor, aten.add.Scalar)
def _add(L: Lowerer, node, a, b, alpha=1):
    """``a + alpha*b``: ADD (broadcast), or ADD_S for a scalar operand (alpha: MUL_S first); a known
    additive mask ``m`` (entries 0 or <= -2^100) is SELECT(m == 0, x, m): equal to ``x + m`` for |x| < 2^76."""
    if alpha != 1:
        b = _mul(L, node, b, alpha)
    for x, m in ((a, b), (b, a)):
        mask = _additive_mask(m) if isinstance(x, Sym) else None
        if mask is not None:
            keep = L.g.const((mask == 0).astype(np.float32), "mask_keep")
            return Sym(L.g.select(keep, L.t(x), L.g.const(mask, "mask_value")))
    sa, sb = _scalar_of(a), _scalar_of(b)
    if sb is not None:
        return Sym(L.g.add_s(L.t(a), finite(sb)))
    if sa is not None:
        return Sym(L.g.add_s(L.t(b), finite(sa)))
    return Sym(L.g.add(L.t(a), L.t(b)))


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def _sub(L: Lowerer, node, a, b, alpha=1):
    """``a - alpha*b``: SUB, ADD_S(a, -c) for a scalar ``b`` (exact: the same rounding), RSUB_S for a scalar ``a``."""
    if alpha != 1:
        b = _mul(L, node, b, alpha)
    sa, sb = _scalar_of(a), _scalar_of(b)
    if sb is not None:
        return Sym(L.g.add_s(L.t(a), -finite(sb)))
    if sa is not None:
        return Sym(L.g.rsub_s(finite(sa), L.t(b)))
    return Sym(L.g.sub(L.t(a), L.t(b)))


@lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(L: Lowerer, node, a, b, alpha=1):
    """``b - alpha*a``: as :func:`_sub` with the operands swapped."""
    return _sub(L, node, b, a, alpha)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def _mul(L: Lowerer, node, a, b):
    """``a * b``: MUL (broadcast), or MUL_S for a scalar operand."""
    sa, sb = _scalar_of(a), _scalar_of(b)
    if sb is not None:
        return Sym(L.g.mul_s(L.t(a), finite(sb)))
    if sa is not None:
        return Sym(L.g.mul_s(L.t(b), finite(sa)))
    return Sym(L.g.mul(L.t(a), L.t(b)))


@lowering(aten.div.Tensor, aten.div.Scalar)
def _div(L: Lowerer, node, a, b):
    """``a / b``: DIV (broadcast), or DIV_S for a scalar divisor (true division only)."""
    sb = _scalar_of(b)
    if sb is not None:
        return Sym(L.g.div_s(L.t(a), finite(sb)))
    return Sym(L.g.div(L.t(a), L.t(b)))


@lowering(aten.div.Tensor_mode)
def _div_mode(L: Lowerer, node, a, b, rounding_mode=None):
    """``a / b``; ``rounding_mode`` ``'floor'`` / ``'trunc'``: the `floor` / `trunc` lowering of the rounded
    quotient (exact for integers below 2^24)."""
    if rounding_mode is None:
        return _div(L, node, a, b)
    if rounding_mode not in ("floor", "trunc"):
        raise UnsupportedOp(f"div with rounding_mode={rounding_mode!r}")
    q = _div(L, node, a, b).t
    return Sym(_floor_t(L, q) if rounding_mode == "floor" else _trunc_t(L, q), _out_dtype(node))


FLOOR_RANGE = 2**23
"""FP32 values of this magnitude or more are integers: `floor` searches ``[-2^23, 2^23)`` only."""


def _out_dtype(node) -> torch.dtype:
    """The torch dtype of a node's output (integer results stay integer ids for later casts)."""
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else torch.float32


def _floor_t(L: Lowerer, t: T) -> T:
    """``floor(t)`` by binary search over the integers: ``acc = -2^23``, then for ``k = 23..0`` ``acc += 2^k``
    where ``acc + 2^k <= t`` (ADD_S, SUB, RELU, SELECT: every value an integer, every comparison the sign of a
    difference, so exact in FP32 and FP64); ``|t| >= 2^23`` is already an integer. No gradient (as torch)."""
    r = t.rank
    acc = L.scalar_const(-float(FLOOR_RANGE), r)
    for k in range(FLOOR_RANGE.bit_length() - 1, -1, -1):
        cand = L.g.add_s(acc, float(2**k))
        acc = L.g.select(L.g.relu(L.g.sub(cand, t)), acc, cand)
    frozen = L.g._op(OpKind.RESHAPE, [t], t.shape)  # t itself where it is already an integer, without a gradient
    L.g.no_grad.add(frozen.op)
    mag = L.g.add(L.g.relu(t), L.g.relu(L.g.neg(t)))
    return L.g.select(L.g.relu(L.g.rsub_s(float(FLOOR_RANGE), mag)), acc, frozen)


def _trunc_t(L: Lowerer, t: T) -> T:
    """``trunc(t)``: ``floor(|t|)`` with t's sign (SELECT on RELU(t))."""
    pos = L.g.relu(t)
    f = _floor_t(L, L.g.add(pos, L.g.relu(L.g.neg(t))))
    return L.g.select(pos, f, L.g.neg(f))


@lowering(aten.floor.default, aten.ceil.default, aten.trunc.default)
def _floor(L: Lowerer, node, a):
    """``floor(a)`` by binary search over the integers in ``[-2^23, 2^23)`` (24 rounds of ADD_S, SUB, RELU, SELECT;
    exact); ``ceil(a) = -floor(-a)``; ``trunc(a) = sign(a) floor(|a|)``. No gradient (as torch)."""
    t = L.t(a)
    if node.target == aten.ceil.default:
        return Sym(L.g.neg(_floor_t(L, L.g.neg(t))), _out_dtype(node))
    return Sym((_floor_t if node.target == aten.floor.default else _trunc_t)(L, t), _out_dtype(node))


@lowering(aten.round.default)
def _round(L: Lowerer, node, a):
    """``round(a)``, halves to even (as torch): ``f = floor(a)``, ``d = a - f`` (exact), then ``f + 1`` where
    ``d > 1/2``, or ``d = 1/2`` and ``f`` is odd (``f - 2 floor(f / 2)``): the `floor` lowering twice, SUB, ADD_S,
    RELU, SELECT, ADD (exact). No gradient (as torch)."""
    t = L.t(a)
    r = t.rank
    f = _floor_t(L, t)
    half = L.g.add_s(L.g.sub(t, f), -0.5)  # d - 1/2: its sign and zero are exact
    odd = L.g.sub(f, L.g.mul_s(_floor_t(L, L.g.mul_s(f, 0.5)), 2.0))  # 0 or 1
    up = L.g.select(L.g.relu(half), L.scalar_const(1.0, r), L.g.select(half, L.scalar_const(0.0, r), odd))
    return Sym(L.g.add(f, up), _out_dtype(node))


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(L: Lowerer, node, a, b):
    """``a // b``: the `floor` lowering of the rounded quotient ``a / b`` (exact for integers below 2^24)."""
    return Sym(_floor_t(L, _div(L, node, a, b).t), _out_dtype(node))


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, aten.fmod.Tensor,
          aten.fmod.Scalar)
def _remainder(L: Lowerer, node, a, b):
    """``remainder(a, b) = a - b floor(a / b)`` (fmod: ``trunc``) with the `floor` lowering of the rounded
    quotient: DIV, floor, MUL, SUB (gradients 1 and ``-floor(a / b)``, as torch; equal to torch in FP64 except
    where ``a / b`` rounds onto an integer, exact for integers below 2^24)."""
    q = _div(L, node, a, b).t
    f = _trunc_t(L, q) if node.target in (aten.fmod.Tensor, aten.fmod.Scalar) else _floor_t(L, q)
    return Sym(_sub(L, node, a, _mul(L, node, b, Sym(f))).t, _out_dtype(node))


@lowering(aten.neg.default)
def _neg(L: Lowerer, node, a):
    """``-a``: MUL_S by -1 (exact)."""
    return Sym(L.g.neg(L.t(a)))


@lowering(aten.relu.default)
def _relu(L: Lowerer, node, a):
    """``max(a, 0)``: RELU (gradient: RELU_GRAD)."""
    return Sym(L.g.relu(L.t(a)))


@lowering(aten.abs.default)
def _abs(L: Lowerer, node, a):
    """``|a|``: RELU(a) + RELU(-a) (one of the two is zero, so the ADD is exact)."""
    t = L.t(a)
    return Sym(L.g.add(L.g.relu(t), L.g.relu(L.g.neg(t))))


@lowering(aten.tanh.default)
def _tanh(L: Lowerer, node, a):
    """``tanh(a)``: TANH."""
    return Sym(L.g.tanh(L.t(a)))


@lowering(aten.erf.default)
def _erf(L: Lowerer, node, a):
    """``erf(a)``: ERF."""
    return Sym(L.g.erf(L.t(a)))


@lowering(aten.erfc.default)
def _erfc(L: Lowerer, node, a):
    """``erfc(a) = 1 - erf(a)``: ERF, RSUB_S. Accurate to about 2^-24 absolutely, not relatively: for
    ``a`` above about 3.9 ERF rounds to 1 and the result is 0 (torch's FP32 erfc keeps the tail)."""
    return Sym(L.g.rsub_s(1.0, L.g.erf(L.t(a))))


@lowering(aten.exp.default)
def _exp(L: Lowerer, node, a):
    """``exp(a)``: EXP."""
    return Sym(L.g.exp(L.t(a)))


@lowering(aten.log.default)
def _log(L: Lowerer, node, a):
    """``log(a)``: LOG."""
    return Sym(L.g.log(L.t(a)))


@lowering(aten.sqrt.default)
def _sqrt(L: Lowerer, node, a):
    """``sqrt(a)``: SQRT."""
    return Sym(L.g.sqrt(L.t(a)))


@lowering(aten.rsqrt.default)
def _rsqrt(L: Lowerer, node, a):
    """``1 / sqrt(a)``: DIV(CONST 1, SQRT(a)) (two roundings)."""
    t = L.t(a)
    return Sym(L.g.div(L.scalar_const(1.0, t.rank), L.g.sqrt(t)))


@lowering(aten.reciprocal.default)
def _reciprocal(L: Lowerer, node, a):
    """``1 / a``: DIV(CONST 1, a)."""
    t = L.t(a)
    return Sym(L.g.div(L.scalar_const(1.0, t.rank), t))


@lowering(aten.pow.Tensor_Scalar)
def _pow(L: Lowerer, node, a, e):
    """``a ** e`` for e in {0, 0.5, -0.5} and the integers -8..8: products of ``a`` (MUL, left to right), SQRT and
    DIV (a negative integer: 1 / a^|e|)."""
    t = L.t(a)
    e = float(e)
    if e == 1.0:
        return Sym(t)
    if e == 2.0:
        return Sym(L.g.mul(t, t))
    if e == 3.0:
        return Sym(L.g.mul(L.g.mul(t, t), t))
    if e == 0.5:
        return Sym(L.g.sqrt(t))
    if e == -1.0:
        return _reciprocal(L, node, a)
    if e == -0.5:
        return _rsqrt(L, node, a)
    if e == 0.0:
        return Sym(L.g.expand(L.scalar_const(1.0, t.rank), t.shape))
    if e.is_integer() and 4 <= abs(e) <= 8 or e in (-2.0, -3.0):
        prod = t
        for _ in range(int(abs(e)) - 1):
            prod = L.g.mul(prod, t)
        return Sym(prod if e > 0 else L.g.div(L.scalar_const(1.0, t.rank), prod))
    raise UnsupportedOp(f"pow with exponent {e} (supported: 0, 0.5, -0.5 and the integers -8..8; use sqrt, exp "
                        "and log for others)")


@lowering(aten.exp2.default)
def _exp2(L: Lowerer, node, a):
    """``2^a = exp(a ln 2)``: MUL_S, EXP (the product rounds: equal to torch in FP64)."""
    return Sym(L.g.exp(L.g.mul_s(L.t(a), math.log(2.0))))


@lowering(aten.log2.default, aten.log10.default)
def _log_base(L: Lowerer, node, a):
    """``log(a) / ln(base)``: LOG, DIV_S (equal to torch in FP64)."""
    base = 2.0 if node.target == aten.log2.default else 10.0
    return Sym(L.g.div_s(L.g.log(L.t(a)), math.log(base)))


@lowering(aten.isnan.default, aten.isinf.default, aten.isfinite.default)
def _isnan(L: Lowerer, node, a):
    """isnan / isinf: false, isfinite: true (every value of a step graph is finite: a non-finite one stops the
    step): a constant, no op."""
    val = node.meta["val"]
    return torch.full(tuple(val.shape), node.target == aten.isfinite.default, dtype=torch.bool)


@lowering(aten.sigmoid.default)
def _sigmoid(L: Lowerer, node, a):
    """``sigmoid(a) = 0.5 * (1 + tanh(a / 2))``: MUL_S, TANH, ADD_S, MUL_S (no overflow for any a)."""
    t = L.g.tanh(L.g.mul_s(L.t(a), 0.5))
    return Sym(L.g.mul_s(L.g.add_s(t, 1.0), 0.5))


@lowering(aten.silu.default)
def _silu(L: Lowerer, node, a):
    """``a * sigmoid(a)``: MUL of ``a`` and :func:`_sigmoid`."""
    return Sym(L.g.mul(L.t(a), _sigmoid(L, node, a).t))


#: ``1/sqrt(2)``, stored as the FP32 constant of a MUL_S (0.70710677).
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@lowering(aten.gelu.default)
def _gelu(L: Lowerer, node, a, approximate="none"):
    """``approximate='none'`` (torch's default, erf): ``0.5 a (1 + erf(a * c))`` with ``c`` the FP32
    constant nearest ``1/sqrt(2)``: MUL_S, ERF, ADD_S, MUL_S, MUL, one rounding each. This is vtrain's
    definition of exact GELU; it is within FP32 rounding of torch's (the constant and each op round to
    FP32, torch's FP32 kernel rounds its own way), and equal to it in FP64 but for the constant.
    ``approximate='tanh'``: ``0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))`` as single ops."""
    if approximate not in ("none", "tanh"):
        raise UnsupportedOp(f"gelu with approximate={approximate!r} (supported: 'none', 'tanh')")
    x = L.t(a)
    if approximate == "none":
        e = L.g.erf(L.g.mul_s(x, _INV_SQRT2))
        return Sym(L.g.mul(L.g.mul_s(x, 0.5), L.g.add_s(e, 1.0)))
    x3 = L.g.mul(L.g.mul(x, x), x)
    inner = L.g.mul_s(L.g.add(x, L.g.mul_s(x3, 0.044715)), math.sqrt(2.0 / math.pi))
    return Sym(L.g.mul(L.g.mul_s(x, 0.5), L.g.add_s(L.g.tanh(inner), 1.0)))


def _positive(L: Lowerer, t: T) -> T:
    """RELU(t): nonzero exactly where ``t > 0`` (a SELECT condition; no gradient flows through it)."""
    return L.g.relu(t)


@lowering(aten.leaky_relu.default)
def _leaky_relu(L: Lowerer, node, a, negative_slope=0.01):
    """``a if a > 0 else slope * a``: SELECT(RELU(a), a, MUL_S(a, slope)) (gradient at 0: slope, as torch)."""
    t = L.t(a)
    return Sym(L.g.select(_positive(L, t), t, L.g.mul_s(t, finite(negative_slope))))


def _nonpositive_part(L: Lowerer, t: T, pos: T) -> T:
    """``min(t, 0)`` as SELECT(t > 0, 0, t): its gradient is 1 at ``t = 0`` (torch's negative branch)."""
    return L.g.select(pos, L.scalar_const(0.0, t.rank), t)


@lowering(aten.elu.default)
def _elu(L: Lowerer, node, a, alpha=1.0, scale=1.0, input_scale=1.0):
    """``scale a`` for a > 0, else ``scale alpha (exp(input_scale min(a, 0)) - 1)``: SELECT, EXP, ADD_S,
    MUL_S (the EXP never sees a positive value, so it never overflows; gradient at 0: the negative branch's)."""
    t = L.t(a)
    pos = _positive(L, t)
    e = L.g.exp(L.g.mul_s(_nonpositive_part(L, t, pos), finite(input_scale)))
    neg = L.g.mul_s(L.g.add_s(e, -1.0), finite(alpha) * finite(scale))
    return Sym(L.g.select(pos, L.g.mul_s(t, finite(scale)) if scale != 1 else t, neg))


def _softplus_of(L: Lowerer, t: T) -> T:
    """``log(1 + exp(t))`` as ``max(t, 0) + log(1 + exp(-|t|))``: finite for every t (the EXP sees
    ``-|t| <= 0``); ``-|t|`` is SELECT(t > 0, -t, t), so the gradient at 0 is 1/2, as torch's."""
    pos = _positive(L, t)
    minus_abs = L.g.select(pos, L.g.neg(t), t)
    return L.g.add(pos, L.g.log(L.g.add_s(L.g.exp(minus_abs), 1.0)))


@lowering(aten.softplus.default)
def _softplus(L: Lowerer, node, a, beta=1.0, threshold=20.0):
    """``a`` where ``beta a > threshold``, else ``(max(b, 0) + log(1 + exp(-|b|))) / beta`` with ``b = beta a``:
    MUL_S, RELU, SELECT, EXP, ADD_S, LOG, ADD, DIV_S (finite for every a, as torch's threshold)."""
    t = L.t(a)
    b = L.g.mul_s(t, finite(beta)) if beta != 1 else t
    sp = _softplus_of(L, b)
    if beta != 1:
        sp = L.g.div_s(sp, finite(beta))
    return Sym(L.g.select(L.g.relu(L.g.add_s(b, -finite(threshold))), t, sp))


@lowering(aten.mish.default)
def _mish(L: Lowerer, node, a):
    """``a tanh(softplus(a))`` with the `softplus` lowering (no threshold, as torch's mish): MUL, TANH."""
    t = L.t(a)
    return Sym(L.g.mul(t, L.g.tanh(_softplus_of(L, t))))


def _clamp_t(L: Lowerer, t: T, lo: Any, hi: Any, strict: bool) -> T:
    """``min(max(t, lo), hi)`` by two SELECTs on the sign of the rounded difference (zero only at a tie).
    ``strict``: a value equal to a bound takes the bound (no gradient), as hardtanh; else it keeps t's
    gradient, as clamp."""
    for bound, upper in ((lo, False), (hi, True)):
        if bound is None:
            continue
        c = L.t(bound) if not isinstance(bound, int | float) else L.scalar_const(finite(bound), t.rank)
        if strict:  # keep t where it is strictly inside
            inside = L.g.relu(L.g.sub(c, t) if upper else L.g.sub(t, c))
            t = L.g.select(inside, t, c)
        else:  # replace t where it is strictly outside
            outside = L.g.relu(L.g.sub(t, c) if upper else L.g.sub(c, t))
            t = L.g.select(outside, c, t)
    return t


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
          aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _clamp(L: Lowerer, node, a, min=None, max=None):  # noqa: A002 - torch's argument names
    """``min(max(a, lo), hi)``: per bound SELECT(RELU(a - bound), bound, a) (gradient 1 at a tie, as torch)."""
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        min, max = None, min
    return Sym(_clamp_t(L, L.t(a), min, max, strict=False))


@lowering(aten.hardtanh.default)
def _hardtanh(L: Lowerer, node, a, min_val=-1.0, max_val=1.0):
    """``min(max(a, lo), hi)`` (ReLU6 is hardtanh(0, 6)): per bound SELECT(RELU(a - lo), a, lo) (gradient 0 at a
    tie, as torch)."""
    return Sym(_clamp_t(L, L.t(a), min_val, max_val, strict=True))


def _max_min(L: Lowerer, a, b, take_max: bool) -> Sym:
    ta, tb = L.t(a), L.t(b)
    first = L.g.relu(L.g.sub(ta, tb) if take_max else L.g.sub(tb, ta))
    second = L.g.relu(L.g.sub(tb, ta) if take_max else L.g.sub(ta, tb))
    tie = L.g.mul_s(L.g.add(ta, tb), 0.5)  # a == b: (a + a) / 2 is a exactly; each gets half the gradient
    return Sym(L.g.select(first, ta, L.g.select(second, tb, tie)))


@lowering(aten.maximum.default)
def _maximum(L: Lowerer, node, a, b):
    """``max(a, b)``: SELECT(RELU(a - b), a, SELECT(RELU(b - a), b, (a + b) * 0.5)) (at a tie each gets half the
    gradient, as torch)."""
    return _max_min(L, a, b, True)


@lowering(aten.minimum.default)
def _minimum(L: Lowerer, node, a, b):
    """``min(a, b)``: SELECT(RELU(b - a), a, SELECT(RELU(a - b), b, (a + b) * 0.5)) (at a tie each gets half the
    gradient, as torch)."""
    return _max_min(L, a, b, False)


@lowering(aten.sign.default)
def _sign(L: Lowerer, node, a):
    """``sign(a)`` (0 at 0): SELECT(RELU(a), 1, SELECT(RELU(-a), -1, 0)) (no gradient, as torch)."""
    t = L.t(a)
    r = t.rank
    neg = L.g.select(L.g.relu(L.g.neg(t)), L.scalar_const(-1.0, r), L.scalar_const(0.0, r))
    return Sym(L.g.select(L.g.relu(t), L.scalar_const(1.0, r), neg))


@lowering(aten.log1p.default)
def _log1p(L: Lowerer, node, a):
    """``log(1 + a)``: ADD_S, LOG (the sum rounds: within 2^-24 of torch's log1p in FP32, equal in FP64)."""
    return Sym(L.g.log(L.g.add_s(L.t(a), 1.0)))


@lowering(aten.expm1.default)
def _expm1(L: Lowerer, node, a):
    """``exp(a) - 1``: EXP, ADD_S (the difference rounds: within 2^-24 of torch's expm1 in FP32, equal in FP64)."""
    return Sym(L.g.add_s(L.g.exp(L.t(a)), -1.0))


# === comparisons and selection (booleans are 0.0 / 1.0) ==============================================
def _difference(L: Lowerer, a, b) -> T:
    """``a - b`` rounded: zero exactly when ``a == b`` (subnormals are kept), its sign the order's."""
    sb = _scalar_of(b)
    sa = _scalar_of(a)
    if sb is not None:
        return L.g.add_s(L.t(a), -finite(sb))
    if sa is not None:
        return L.g.rsub_s(finite(sa), L.t(b))
    return L.g.sub(L.t(a), L.t(b))


def _pick(L: Lowerer, cond: T, if_nonzero: float, if_zero: float) -> Sym:
    r = cond.rank
    return Sym(L.g.select(cond, L.scalar_const(if_nonzero, r), L.scalar_const(if_zero, r)), torch.bool)


@lowering(aten.eq.Tensor, aten.eq.Scalar)
def _eq(L: Lowerer, node, a, b):
    """``a == b``: SELECT(a - b, 0, 1)."""
    return _pick(L, _difference(L, a, b), 0.0, 1.0)


@lowering(aten.ne.Tensor, aten.ne.Scalar)
def _ne(L: Lowerer, node, a, b):
    """``a != b``: SELECT(a - b, 1, 0)."""
    return _pick(L, _difference(L, a, b), 1.0, 0.0)


@lowering(aten.gt.Tensor, aten.gt.Scalar)
def _gt(L: Lowerer, node, a, b):
    """``a > b``: SELECT(RELU(a - b), 1, 0)."""
    return _pick(L, L.g.relu(_difference(L, a, b)), 1.0, 0.0)


@lowering(aten.lt.Tensor, aten.lt.Scalar)
def _lt(L: Lowerer, node, a, b):
    """``a < b``: SELECT(RELU(b - a), 1, 0)."""
    return _pick(L, L.g.relu(_difference(L, b, a)), 1.0, 0.0)


@lowering(aten.ge.Tensor, aten.ge.Scalar)
def _ge(L: Lowerer, node, a, b):
    """``a >= b``: SELECT(RELU(b - a), 0, 1)."""
    return _pick(L, L.g.relu(_difference(L, b, a)), 0.0, 1.0)


@lowering(aten.le.Tensor, aten.le.Scalar)
def _le(L: Lowerer, node, a, b):
    """``a <= b``: SELECT(RELU(a - b), 0, 1)."""
    return _pick(L, L.g.relu(_difference(L, a, b)), 0.0, 1.0)


@lowering(aten.logical_not.default, aten.bitwise_not.default)
def _not(L: Lowerer, node, a):
    """``not a`` (booleans): SELECT(a, 0, 1)."""
    if isinstance(a, Sym) and a.dtype not in (torch.bool,) and node.target == aten.bitwise_not.default:
        raise UnsupportedOp("bitwise_not of an integer tensor")
    return _pick(L, L.t(a), 0.0, 1.0)


@lowering(aten.logical_and.default, aten.bitwise_and.Tensor)
def _and(L: Lowerer, node, a, b):
    """``a and b``: SELECT(a, b != 0, 0)."""
    ta = L.t(a)
    return Sym(L.g.select(ta, L.to01(b), L.scalar_const(0.0, ta.rank)), torch.bool)


@lowering(aten.logical_or.default, aten.bitwise_or.Tensor)
def _or(L: Lowerer, node, a, b):
    """``a or b``: SELECT(a, 1, b != 0)."""
    ta = L.t(a)
    return Sym(L.g.select(ta, L.scalar_const(1.0, ta.rank), L.to01(b)), torch.bool)


@lowering(aten.any.dim, aten.any.dims, aten.any.default)
def _any(L: Lowerer, node, a, dim=None, keepdim=False):
    """``any`` over ``dim``: MAX of the 0/1 values."""
    dims = [dim] if isinstance(dim, int) else dim
    return Sym(L.reduce(L.to01(a), dims, keepdim, "max"), torch.bool)


@lowering(aten.where.self)
def _where(L: Lowerer, node, cond, a, b):
    """``a if cond else b``: SELECT (broadcast); a known all-true / all-false ``cond`` whose other branch is a
    known NaN (torch's ``where(isnan(x), nan, ..)``) picks its branch (no op)."""
    if isinstance(cond, torch.Tensor) and cond.numel() and bool((cond == cond.flatten()[0]).all()):
        keep, other = (a, b) if bool(cond.flatten()[0]) else (b, a)
        if isinstance(other, torch.Tensor | float) and bool(torch.isnan(torch.as_tensor(other)).any()):
            return keep if isinstance(keep, Sym) else Sym(L.t(keep))
    return Sym(L.g.select(L.t(cond), L.t(a), L.t(b)))


# === reductions ======================================================================================
@lowering(aten.sum.dim_IntList, aten.sum.default)
def _sum(L: Lowerer, node, a, dim=None, keepdim=False, dtype=None):
    """Sum over ``dim``: the axes moved last and merged (PERMUTE, RESHAPE), then one SUM."""
    return Sym(L.reduce(L.t(a), dim, keepdim, "sum"))


@lowering(aten.mean.dim, aten.mean.default)
def _mean(L: Lowerer, node, a, dim=None, keepdim=False, dtype=None):
    """Mean over ``dim``: as :func:`_sum` with one MEAN (sum / n, one rounding)."""
    return Sym(L.reduce(L.t(a), dim, keepdim, "mean"))


def _variance(L: Lowerer, t: T, dim, correction, keepdim: bool) -> tuple[T, T]:
    """(var, mean) over ``dim``: MEAN, SUB, MUL, SUM, DIV_S by ``n - correction`` (one reduction each)."""
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim else None)
    r = t.rank
    axes = sorted({d % r for d in dims}) if dims else list(range(r))
    n = math.prod(t.shape[d] for d in axes)
    c = 1.0 if correction is None else float(correction)
    if n - c <= 0:
        raise UnsupportedOp(f"var/std over {n} element(s) with correction {c:g} (the divisor n - correction is "
                            "not positive: torch gives inf/NaN)")
    mu = L.reduce(t, axes, True, "mean")
    xc = L.g.sub(t, mu)
    var = L.g.div_s(L.reduce(L.g.mul(xc, xc), axes, keepdim, "sum"), n - c)
    return var, (mu if keepdim else L.reshape(mu, tuple(t.shape[i] for i in range(r) if i not in axes)))


@lowering(aten.var.correction, aten.var.dim, aten.var.default)
def _var(L: Lowerer, node, a, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over ``dim``: ``sum((a - mean)^2) / (n - correction)`` (MEAN, SUB, MUL, SUM, DIV_S)."""
    if isinstance(dim, bool):  # var.default(a, unbiased)
        dim, unbiased = None, dim
    if correction is None and unbiased is not None:
        correction = 1.0 if unbiased else 0.0
    return Sym(_variance(L, L.t(a), dim, correction, keepdim)[0])


@lowering(aten.var_mean.correction)
def _var_mean(L: Lowerer, node, a, dim=None, *, correction=None, keepdim=False):
    """``(var, mean)`` over ``dim``: as the `var` lowering, the MEAN its own output."""
    var, mu = _variance(L, L.t(a), dim, correction, keepdim)
    return (Sym(var), Sym(mu))


@lowering(aten.linalg_vector_norm.default)
def _vector_norm(L: Lowerer, node, a, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """``ord`` 2: SQRT(SUM(a * a)); 1: SUM(|a|) over ``dim`` (an all-zero vector's 2-norm has a non-finite
    gradient, where torch gives 0: such a step stops as non-finite)."""
    t = L.t(a)
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim else None)
    o = float(ord)
    if o == 2.0:
        return Sym(L.g.sqrt(L.reduce(L.g.mul(t, t), dims, keepdim, "sum")))
    if o == 1.0:
        return Sym(L.reduce(_abs(L, node, a).t, dims, keepdim, "sum"))
    raise UnsupportedOp(f"vector norm of order {ord} (supported: 1, 2; torch splits the inf-norm's gradient "
                        "between tied maxima, MAX_GRAD gives it to the first)")


def _amax_split(L: Lowerer, t: T, dim, keepdim: bool) -> T:
    """``max`` over ``dim`` whose gradient is split evenly between tied maxima, as torch's amax."""
    r = t.rank
    dims = [dim] if isinstance(dim, int) else (list(dim) if dim else None)
    axes = sorted({d % r for d in dims}) if dims else list(range(r))
    m = L.reduce(t, axes, True, "max_const")
    d = L.g.sub(t, m)  # +0 exactly at the maxima
    zero, one = L.scalar_const(0.0, r), L.scalar_const(1.0, r)
    count = L.reduce(L.g.select(d, zero, one), axes, True, "sum")  # how many maxima (an exact integer)
    at_max = L.reduce(L.g.select(d, zero, d), axes, True, "sum")  # +0, with gradient 1 at each maximum
    out = L.g.add(m, L.g.div(at_max, count))
    return out if keepdim else L.reshape(out, tuple(t.shape[i] for i in range(r) if i not in axes))


@lowering(aten.amax.default, aten.max.default)
def _amax(L: Lowerer, node, a, dim=(), keepdim=False):
    """Maximum over ``dim``: MAX (no gradient) ``m``, then ``m + SUM(SELECT(a - m, 0, a - m)) / count`` (the
    added term is +0; its gradient 1/count at each of the ``count`` tied maxima, as torch)."""
    return Sym(_amax_split(L, L.t(a), list(dim) if dim else None, keepdim))


@lowering(aten.amin.default, aten.min.default)
def _amin(L: Lowerer, node, a, dim=(), keepdim=False):
    """Minimum over ``dim``: ``-amax(-a)`` (the `amax` lowering; tied minima share the gradient, as torch)."""
    return Sym(L.g.neg(_amax_split(L, L.g.neg(L.t(a)), list(dim) if dim else None, keepdim)))


@lowering(aten.max.dim, aten.min.dim)
def _max_dim(L: Lowerer, node, a, dim, keepdim=False):
    """``a.max(dim)`` (min: of ``-a``, negated): the values by one MAX (gradient: MAX_GRAD, to the first maximum,
    as torch's index); the indices, where used, as the `argmax` lowering."""
    t = L.t(a)
    neg = node.target == aten.min.dim
    v = L.reduce(L.g.neg(t) if neg else t, [dim], keepdim, "max")
    idx = _argmax_t(L, L.g.neg(t) if neg else t, dim, keepdim) if 1 in _used_outputs(node) else None
    return (Sym(L.g.neg(v) if neg else v), Sym(idx, torch.int64) if idx is not None else None)


def _argmax_t(L: Lowerer, t: T, dim: int | None, keepdim: bool) -> T:
    """The index of the first maximum along ``dim`` (all elements when None): ``m = MAX(a)``, then
    ``n - MAX(SELECT(a - m, 0, n - i))`` (``a - m`` is zero exactly at the maxima; every value an exact
    integer); no gradient (MAX as a constant)."""
    if dim is None:
        x, shape = L.reshape(t, (1, math.prod(t.shape))), (1,) * t.rank if keepdim else (1,)
    else:
        dim %= t.rank
        x, _ = L.to_last(t, dim)
        shape = tuple(1 if i == dim else s for i, s in enumerate(t.shape)) if keepdim else \
            tuple(s for i, s in enumerate(t.shape) if i != dim)
    n = x.shape[-1]
    m = L.g.max(x)
    desc = L.g.const(np.arange(n, 0, -1, dtype=np.float32).reshape((1,) * (x.rank - 1) + (n,)), "n_minus_index")
    score = L.g.select(L.g.sub(x, m), L.scalar_const(0.0, x.rank), desc)
    return L.reshape(L.g.rsub_s(float(n), L.g.max(score)), shape or (1,))


@lowering(aten.argmax.default, aten.argmin.default)
def _argmax(L: Lowerer, node, a, dim=None, keepdim=False):
    """``argmax`` (argmin: of ``-a``) along ``dim``: the index of the first maximum, as torch: MAX, SUB, SELECT of
    CONST ``n - i`` where ``a - max`` is zero, MAX, RSUB_S (exact integers; no gradient)."""
    t = L.t(a)
    return Sym(_argmax_t(L, L.g.neg(t) if node.target == aten.argmin.default else t, dim, keepdim), torch.int64)


def _softmax_last(L: Lowerer, x: T, log: bool) -> T:
    z = L.g.sub(x, L.g.max(x))  # a constant shift (no gradient): softmax is invariant to it
    ez = L.g.exp(z)
    s = L.g.sum(ez)
    return L.g.sub(z, L.g.log(s)) if log else L.g.div(ez, s)


@lowering(aten._softmax.default)
def _softmax(L: Lowerer, node, a, dim, half_to_float=False):
    """``exp(z) / sum(exp(z))`` with ``z = x - max(x)`` (MAX, SUB, EXP, SUM, DIV) over ``dim``."""
    x, back = L.to_last(L.t(a), dim)
    y = _softmax_last(L, x, log=False)
    return Sym(L.perm(y, back) if back else y)


@lowering(aten._log_softmax.default)
def _log_softmax(L: Lowerer, node, a, dim, half_to_float=False):
    """``z - log(sum(exp(z)))`` with ``z = x - max(x)`` (MAX, SUB, EXP, SUM, LOG, SUB) over ``dim``."""
    x, back = L.to_last(L.t(a), dim)
    y = _softmax_last(L, x, log=True)
    return Sym(L.perm(y, back) if back else y)


# === matrix products =================================================================================
@lowering(aten.mm.default)
def _mm(L: Lowerer, node, a, b):
    """``a[M,K] @ b[K,N]``: MATMUL(a, b^T) (one reduction per output element)."""
    return Sym(L.g.matmul(L.t(a), L.transpose(L.t(b))))


@lowering(aten.addmm.default)
def _addmm(L: Lowerer, node, bias, a, b, beta=1, alpha=1):
    """``bias + a @ b``: one MATMUL with the bias inside the reduction (a [N] bias), else MATMUL + ADD."""
    if beta != 1 or alpha != 1:
        raise UnsupportedOp(f"addmm with beta={beta}, alpha={alpha} (only 1, 1)")
    ta, tb, tc = L.t(a), L.transpose(L.t(b)), L.t(bias)
    if tc.shape == (tb.shape[0],):
        return Sym(L.g.matmul(ta, tb, tc))
    return Sym(L.g.add(L.g.matmul(ta, tb), tc))


@lowering(aten.bmm.default)
def _bmm(L: Lowerer, node, a, b):
    """``a[B,M,K] @ b[B,K,N]``: batched MATMUL(a, b^T)."""
    return Sym(L.g.matmul(L.t(a), L.transpose(L.t(b))))


def _flat_table(size: Sequence[int], grids: Sequence[np.ndarray]) -> np.ndarray:
    """Per-axis ``(out_d, k_d)`` tables of input positions (out of range or -1: none) -> one ``(prod(out),
    prod(k))`` table of flat input positions (row-major over the output positions, then over the taps), -1
    where any axis has none."""
    nsp = len(size)
    ok: np.ndarray | bool = True
    flat: np.ndarray | int = 0
    for d, (n, pos) in enumerate(zip(size, grids)):
        o, k = pos.shape
        p = pos.reshape([o if j == d else 1 for j in range(nsp)] + [k if j == d else 1 for j in range(nsp)])
        ok = ok & (p >= 0) & (p < n)
        flat = flat * n + p
    rows = math.prod(g.shape[0] for g in grids)
    return np.where(ok, flat, -1).reshape(rows, -1)


def _patch_table(size: Sequence[int], kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], out: Sequence[int] | None = None) -> tuple[np.ndarray, tuple[int, ...]]:
    """For each output position (row) and kernel tap (column) the flat input position it reads,
    -1 where it falls in the zero padding (or past the end: ``out`` given, ``ceil_mode``); and the output
    spatial size."""
    if out is None:
        out = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                    for n, k, s, p, d in zip(size, kernel, stride, padding, dilation))
    out = tuple(out)
    if any(o <= 0 for o in out):
        raise UnsupportedOp(f"window {tuple(kernel)} does not fit the input {tuple(size)}")
    grids = [np.arange(o)[:, None] * s - p + np.arange(k)[None, :] * d  # (o, k)
             for k, s, p, d, o in zip(kernel, stride, padding, dilation, out)]
    return _flat_table(size, grids).astype(np.float32), out


def _spatial(v, n: int) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * n if len(v) == 1 else v


def _gather_patches(L: Lowerer, x: T, kernel, stride, padding, dilation,
                    out: Sequence[int] | None = None) -> tuple[T, tuple[int, ...], np.ndarray]:
    """``x [N, C, *S]`` -> patches ``[N, C, prod(out), prod(kernel)]`` by one TAKE with a CONST table."""
    N, C, *S = x.shape
    table, out = _patch_table(S, kernel, stride, padding, dilation, out)
    flat = L.reshape(x, (N, C, math.prod(S)))
    return L.g.take(flat, L.g.const(table, "patch_table"), 2), out, table


@lowering(aten.convolution.default)
def _convolution(L: Lowerer, node, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """1-D/2-D/3-D conv: TAKE of the input patches by a CONST table (-1: zero padding), then one MATMUL with the
    weights (and bias) per output element; a 1x1 stride-1 conv skips the TAKE; groups > 1: one such conv per
    group (SLICEs), concatenated (PAD, ADD). Transposed (``nn.ConvTranspose1d/2d/3d``): the same with the table of
    the input element each tap scatters to each output position (-1 where none: the zeros a transposed conv
    inserts between inputs read +0)."""
    if L.t(x).rank not in (3, 4, 5):
        raise UnsupportedOp(f"{'transposed ' if transposed else ''}convolution of a rank-{L.t(x).rank} input (only "
                            "batched 1-D, 2-D and 3-D: N, C, *spatial)")
    if transposed:
        return _transposed_convolution(L, node, x, w, bias, stride, padding, dilation, output_padding, groups)
    if groups != 1:
        return _grouped_convolution(L, node, x, w, bias, stride, padding, dilation, groups)
    tx, tw = L.t(x), L.t(w)
    nsp = tx.rank - 2
    N, C, *S = tx.shape
    n_out, _, *K = tw.shape
    stride, padding, dilation = (_spatial(v, nsp) for v in (stride, padding, dilation))
    if any(p != 0 for p in _spatial(output_padding, nsp)):
        raise UnsupportedOp("convolution with output_padding")
    tb = L.t(bias) if bias is not None else None
    if all(k == 1 for k in K) and all(s == 1 for s in stride) and all(p == 0 for p in padding):
        out = tuple(S)
        cols = L.reshape(L.perm(L.reshape(tx, (N, C, math.prod(S))), [0, 2, 1]), (N * math.prod(S), C))
    else:
        patches, out, _ = _gather_patches(L, tx, K, stride, padding, dilation)  # (N, C, P, k)
        P, k = math.prod(out), math.prod(K)
        cols = L.reshape(L.perm(patches, [0, 2, 1, 3]), (N * P, C * k))
    y = L.g.matmul(cols, L.reshape(tw, (n_out, C * math.prod(K))), tb)  # (N*P, O)
    y = L.perm(L.reshape(y, (N, math.prod(out), n_out)), [0, 2, 1])
    return Sym(L.reshape(y, (N, n_out, *out)))


def _grouped_convolution(L: Lowerer, node, x, w, bias, stride, padding, dilation, groups: int):
    """``groups`` > 1 (depthwise, grouped): each group's channels SLICEd and convolved as one group=1
    convolution, the outputs concatenated along the channels (PAD, ADD: exact)."""
    tx, tw = L.t(x), L.t(w)
    C, n_out = tx.shape[1], tw.shape[0]
    if C % groups or n_out % groups:
        raise UnsupportedOp(f"convolution with groups={groups}: {C} input / {n_out} output channels do not divide")
    ci, co = C // groups, n_out // groups
    tb = L.t(bias) if bias is not None else None
    parts = []
    for k in range(groups):
        xk = Sym(L.g.slice(tx, 1, k * ci, ci))
        wk = Sym(L.g.slice(tw, 0, k * co, co))
        bk = Sym(L.g.slice(tb, 0, k * co, co)) if tb is not None else None
        parts.append(_convolution(L, node, xk, wk, bk, stride, padding, dilation, False, [0], 1).t)
    out = None
    for k, p in enumerate(parts):
        padded = L.g.pad(p, 1, k * co, n_out)
        out = padded if out is None else L.g.add(out, padded)
    return Sym(out)


def _transposed_table(size: Sequence[int], out: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int]) -> np.ndarray:
    """For each output position (row) and kernel tap (column) of a transposed convolution the flat input
    position it reads, -1 where none does: output ``o`` reads input ``i`` through tap ``t`` when
    ``o = i*stride - padding + t*dilation`` (the scatter of the forward, written as a gather)."""
    grids = []
    for n, o, k, s, p, d in zip(size, out, kernel, stride, padding, dilation):
        num = np.arange(o)[:, None] + p - np.arange(k)[None, :] * d  # (o, k): i * s
        i = np.floor_divide(num, s)
        grids.append(np.where((num % s == 0) & (i >= 0) & (i < n), i, -1))
    return _flat_table(size, grids).astype(np.float32)


def _transposed_convolution(L: Lowerer, node, x, w, bias, stride, padding, dilation, output_padding,
                            groups: int) -> Sym:
    """``conv_transpose1d/2d/3d`` (``nn.ConvTranspose1d/2d/3d``): TAKE of the input by a CONST table (output
    position x kernel tap -> the input element that tap scatters there, -1 where none: reads +0), then one
    MATMUL with the weights (and bias) per output element, as a convolution's; groups: one per group (SLICEs),
    concatenated (PAD, ADD). Its VJP is the convolution of the output gradient (TAKE's inverse table)."""
    tx, tw = L.t(x), L.t(w)
    nsp = tx.rank - 2
    N, C, *S = tx.shape
    out = tuple(out_shape(node)[2:])
    stride, padding, dilation = (_spatial(v, nsp) for v in (stride, padding, dilation))
    table = _transposed_table(S, out, tw.shape[2:], stride, padding, dilation)
    co, K = tw.shape[1], math.prod(tw.shape[2:])
    if C % groups:
        raise UnsupportedOp(f"transposed convolution with groups={groups}: {C} input channels do not divide")
    ci = C // groups
    tb = L.t(bias) if bias is not None else None
    flat = L.reshape(tx, (N, C, math.prod(S)))
    idx = L.g.const(table, "transposed_patch_table")
    P = math.prod(out)
    parts = []
    for k in range(groups):
        xk = flat if groups == 1 else L.g.slice(flat, 1, k * ci, ci)
        wk = tw if groups == 1 else L.g.slice(tw, 0, k * ci, ci)  # (ci, co, *K)
        bk = tb if groups == 1 or tb is None else L.g.slice(tb, 0, k * co, co)
        patches = L.g.take(xk, idx, 2)  # (N, ci, P, K)
        cols = L.reshape(L.perm(patches, [0, 2, 1, 3]), (N * P, ci * K))
        wmat = L.reshape(L.perm(L.reshape(wk, (ci, co, K)), [1, 0, 2]), (co, ci * K))
        y = L.g.matmul(cols, wmat, bk)  # (N*P, co)
        parts.append(L.perm(L.reshape(y, (N, P, co)), [0, 2, 1]))
    y = parts[0]
    for k, p in enumerate(parts[1:], 1):
        y = L.g.add(L.g.pad(y, 1, 0, co * groups) if k == 1 else y, L.g.pad(p, 1, k * co, co * groups))
    return Sym(L.reshape(y, (N, co * groups, *out)))


_POOLS_3D = (aten.max_pool3d_with_indices.default, aten.avg_pool3d.default)


def _pool_nsp(node, kernel_size) -> int:
    """Spatial axes of a pooling node: 3 for the ``*3d`` ops (or a 3-element kernel), else 2."""
    if getattr(node, "target", None) in _POOLS_3D:
        return 3
    return 3 if not isinstance(kernel_size, int) and len(kernel_size) == 3 else 2


def _pool_rank(node, tx: T, nsp: int) -> None:
    """Refuse a pooling input that is not ``N, C, *spatial`` (an unbatched one)."""
    if tx.rank != nsp + 2:
        name = str(node.target).removeprefix("aten.").split(".")[0] if hasattr(node, "target") else "pooling"
        raise UnsupportedOp(f"{name} of a rank-{tx.rank} input (only batched: N, C and {nsp} spatial axes)")


@lowering(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool2d(L: Lowerer, node, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Max pool (2-D, 3-D): TAKE of the windows by a CONST table (padding, and past the end with ``ceil_mode``:
    SELECT to -2^100), then one MAX per output element (gradient: MAX_GRAD, to the first maximum in window order,
    as torch)."""
    if 1 in _used_outputs(node):
        op = "max_pool3d" if getattr(node, "target", None) in _POOLS_3D else "max_pool2d"
        raise UnsupportedOp(f"{op}'s indices output (return_indices=True)")
    return _max_pool_nd(L, node, x, _pool_nsp(node, kernel_size), kernel_size, stride, padding, dilation, ceil_mode)


def _max_pool_nd(L: Lowerer, node, x, nsp: int, kernel_size, stride=(), padding=0, dilation=1,
                 ceil_mode=False) -> tuple[Sym, None]:
    tx = L.t(x)
    _pool_rank(node, tx, nsp)
    N, C = tx.shape[:2]
    kernel = _spatial(kernel_size, nsp)
    stride = _spatial(stride, nsp) if stride else kernel
    padding, dilation = _spatial(padding, nsp), _spatial(dilation, nsp)
    patches, out, table = _gather_patches(L, tx, kernel, stride, padding, dilation,
                                          out_shape(node)[-nsp:] if ceil_mode else None)
    if (table < 0).any():
        valid = L.g.const((table >= 0).astype(np.float32)[None, None], "pool_valid")
        patches = L.g.select(valid, patches, L.scalar_const(-BIG, 4))
    m = L.g.max(patches, differentiable=True)  # (N, C, P, 1)
    return (Sym(L.reshape(m, (N, C, *out))), None)


def _adaptive_windows(L: Lowerer, x: T, out: Sequence[int], kind: str) -> T:
    """Adaptive pooling of ``x [N, C, *S]`` (2-D, 3-D) to ``out`` with torch's windows (along each axis
    ``floor(i n / o)`` to ``ceil((i + 1) n / o)``; windows of different sizes when ``out`` does not divide
    the input): TAKE by a CONST table padded to the longest window with -1, then ``mean``: SUM and DIV by the
    window sizes (a CONST); ``max``: SELECT of the padding to -2^100, then MAX (gradient to the first maximum)."""
    N, C, *S = x.shape
    grids, sizes = [], []
    for n, o in zip(S, out):
        lo = [(i * n) // o for i in range(o)]
        hi = [-(-((i + 1) * n) // o) for i in range(o)]
        k = max(b - a for a, b in zip(lo, hi))
        pos = np.array([[a + j if a + j < b else -1 for j in range(k)] for a, b in zip(lo, hi)])
        grids.append(pos)
        sizes.append(np.array([b - a for a, b in zip(lo, hi)], np.float32))
    table = _flat_table(S, grids).astype(np.float32)
    patches = L.g.take(L.reshape(x, (N, C, math.prod(S))), L.g.const(table, "adaptive_windows"), 2)  # (N, C, P, k)
    if kind == "max":
        valid = L.g.const((table >= 0).astype(np.float32)[None, None], "pool_valid")
        y = L.g.max(L.g.select(valid, patches, L.scalar_const(-BIG, 4)), differentiable=True)
    else:
        counts = functools.reduce(np.multiply.outer, sizes).reshape(1, 1, -1, 1)
        y = L.g.div(L.g.sum(patches), L.g.const(counts, "window_sizes"))
    return L.reshape(y, (N, C, *out))


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max_pool2d(L: Lowerer, node, x, output_size):
    """Adaptive max pool (2-D, 3-D): to a size dividing the input the `max_pool2d_with_indices` lowering with
    kernel = stride, else TAKE of torch's windows (``floor(i n / o)`` to ``ceil((i + 1) n / o)``) padded to the
    longest by SELECT to -2^100, one MAX each (gradient to the first maximum, as torch's index); the indices output
    is refused."""
    tx = L.t(x)
    nsp = 3 if node.target == aten.adaptive_max_pool3d.default else 2
    if 1 in _used_outputs(node):
        raise UnsupportedOp(f"adaptive_max_pool{nsp}d's indices output (return_indices=True)")
    _pool_rank(node, tx, nsp)
    S, osz = tx.shape[2:], [o if o is not None else n for o, n in zip(_spatial(output_size, nsp), tx.shape[2:])]
    if any(n % o for n, o in zip(S, osz)):
        return (Sym(_adaptive_windows(L, tx, osz, "max")), None)
    kernel = [n // o for n, o in zip(S, osz)]
    return _max_pool_nd(L, node, x, nsp, kernel, kernel)


@lowering(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default, aten._upsample_nearest_exact2d.vec,
          aten._upsample_nearest_exact2d.default, aten.upsample_nearest3d.vec, aten.upsample_nearest3d.default,
          aten._upsample_nearest_exact3d.vec, aten._upsample_nearest_exact3d.default)
def _upsample_nearest2d(L: Lowerer, node, x, output_size=None, scale_factors=None, *rest):
    """Nearest upsampling (``mode='nearest'`` or ``'nearest-exact'``, 2-D and 3-D): one TAKE per spatial axis by a
    CONST table of the source positions along it (the table is torch's own: the op on the positions)."""
    tx = L.t(x)
    nsp = 3 if "3d" in str(node.target) else 2
    _pool_rank(node, tx, nsp)
    S, out = tx.shape[2:], tuple(out_shape(node)[2:])
    pos = torch.arange(math.prod(S), dtype=torch.float64).reshape(1, 1, *S)
    src = node.target(pos, *((output_size, scale_factors) if node.target._overloadname == "vec"
                              else (output_size, scale_factors, *rest)))
    table = src.reshape(out).numpy().astype(np.int64)
    per_axis = [idx[tuple(slice(None) if j == d else 0 for j in range(nsp))]
                for d, idx in enumerate(np.unravel_index(table, S))]
    if not np.array_equal(table, np.ravel_multi_index(np.meshgrid(*per_axis, indexing="ij"), S)):
        raise UnsupportedOp(f"upsample_nearest{nsp}d whose table is not separable")
    names = ["upsample_depth", "upsample_rows", "upsample_cols"][-nsp:]
    t = tx
    for d, (rows, name) in enumerate(zip(per_axis, names)):
        t = L.g.take(t, L.g.const(rows.astype(np.float32), name), 2 + d)
    return Sym(t)


_LINEAR_UPSAMPLES = {
    aten.upsample_linear1d.vec: "linear",
    aten.upsample_linear1d.default: "linear",
    aten.upsample_bilinear2d.vec: "linear",
    aten.upsample_bilinear2d.default: "linear",
    aten.upsample_trilinear3d.vec: "linear",
    aten.upsample_trilinear3d.default: "linear",
    aten.upsample_bicubic2d.vec: "cubic",
    aten.upsample_bicubic2d.default: "cubic",
    aten._upsample_bilinear2d_aa.vec: "linear_aa",
    aten._upsample_bilinear2d_aa.default: "linear_aa",
    aten._upsample_bicubic2d_aa.vec: "cubic_aa",
    aten._upsample_bicubic2d_aa.default: "cubic_aa",
}


def _area_scale(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> float:
    """torch's ``area_pixel_compute_scale`` in FP64: input pixels per output pixel."""
    if align_corners:
        return float(n_in - 1) / float(n_out - 1) if n_out > 1 else 0.0
    return 1.0 / float(scale) if scale is not None and scale > 0 else float(n_in) / float(n_out)


def _floor_index(real: float, n_in: int) -> tuple[int, float]:
    """torch's ``guard_index_and_lambda``: ``floorf`` of the source index (C's float ``floorf``: the FP64 value
    rounded to FP32 first), at most ``n_in - 1``, and the fraction clamped to [0, 1]."""
    index = min(math.floor(float(np.float32(real))), n_in - 1)
    return index, min(max(real - float(index), 0.0), 1.0)


def _cubic1(x: float, a: float) -> float:
    """``((a + 2) x - (a + 3)) x x + 1`` (|x| <= 1), one rounding per operation."""
    return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0


def _cubic2(x: float, a: float) -> float:
    """``((a x - 5 a) x + 8 a) x - 4 a`` (1 <= |x| <= 2), one rounding per operation."""
    return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a


def _interpolation_matrix(kind: str, n_in: int, n_out: int, align_corners: bool,
                          scale: float | None) -> np.ndarray:
    """The ``(n_out, n_in)`` FP64 weights of one spatial axis of a separable resize, as torch's CPU kernels
    define them (``UpSample.h``, ``UpSampleKernel.cpp``) but computed here in Python floats, one IEEE rounding
    per operation and no fused multiply-add, so the same bits on every machine (torch's own kernel, compiled per
    vector ISA, contracts ``scale * (i + 0.5) - 0.5`` and the cubic coefficients differently under AVX2 and the
    default build). ``kind``: ``linear`` (source ``scale * (i + 0.5) - 0.5``, below 0 read as 0, or
    ``scale * i`` with ``align_corners``; two taps, the second clamped to the last input), ``cubic`` (the same
    index unclamped, Keys' cubic convolution with A = -0.75, four taps clamped to the borders and summed where
    they coincide, left to right), ``linear_aa`` / ``cubic_aa`` (antialiased: PIL's triangle / cubic A = -0.5
    filter stretched by the scale when downsampling, over ``center +- support``, normalised by its sum)."""
    A = np.zeros((n_out, n_in), np.float64)
    if n_in == n_out and kind != "cubic":  # torch copies (linear: ``compute_source_index_and_lambda``; the
        return np.eye(n_in)                # separable antialiased kernel skips an axis of unchanged size)
    s = _area_scale(n_in, n_out, align_corners, scale)
    for i in range(n_out):
        if kind in ("linear", "cubic"):
            real = s * float(i) if align_corners else s * (float(i) + 0.5) - 0.5
            if kind == "linear":
                real = 0.0 if real < 0 else real
                index, lam1 = _floor_index(real, n_in)
                taps = [(index, 1.0 - lam1), (index + (1 if index < n_in - 1 else 0), lam1)]
            else:
                index, t = _floor_index(real, n_in)
                c = (_cubic2(t + 1.0, -0.75), _cubic1(t, -0.75), _cubic1(1.0 - t, -0.75),
                     _cubic2((1.0 - t) + 1.0, -0.75))
                taps = [(max(min(index + j - 1, n_in - 1), 0), c[j]) for j in range(4)]
            row: dict[int, float] = {}
            for col, w in taps:
                row[col] = row[col] + w if col in row else w
            for col, w in row.items():
                A[i, col] = w
            continue
        support = (1.0 if kind == "linear_aa" else 2.0) * (s if s >= 1.0 else 1.0)
        max_taps = math.ceil(support) * 2 + 1
        center = s * (float(i) + 0.5)
        invscale = 1.0 / s if s >= 1.0 else 1.0
        lo = max(int(center - support + 0.5), 0)
        size = min(max(min(int(center + support + 0.5), n_in) - lo, 0), max_taps)
        ws = []
        for j in range(size):
            x = abs((float(j + lo) - center + 0.5) * invscale)
            if kind == "linear_aa":
                w = 1.0 - x if x < 1.0 else 0.0
            else:
                w = _cubic1(x, -0.5) if x < 1.0 else _cubic2(x, -0.5) if x < 2.0 else 0.0
            ws.append(w)
        total = 0.0
        for w in ws:
            total += w
        for j, w in enumerate(ws):
            A[i, lo + j] = w / total if total != 0.0 else w
    return A


@lowering(*_LINEAR_UPSAMPLES)
def _upsample_linear(L: Lowerer, node, x, output_size=None, align_corners=False, *scales):
    """Linear / bilinear / bicubic / trilinear resizing (``nn.Upsample``, ``F.interpolate``; either
    ``align_corners``, ``antialias``): a fixed linear map per spatial axis, one MATMUL per axis with a CONST
    ``(out, in)`` weight matrix: torch's weights (its CPU kernel's formulas) computed in FP64 one rounding per
    operation (no FMA), the same bits on every machine, rounded to FP32."""
    tx = L.t(x)
    nsp = tx.rank - 2
    out = tuple(out_shape(node)[2:])
    if node.target._overloadname == "vec":
        factors = scales[0] if scales else None
        per_axis = list(factors) if factors else [None] * nsp
    else:
        per_axis = list(scales) + [None] * (nsp - len(scales))
    kind = _LINEAR_UPSAMPLES[node.target]
    y = tx
    for axis in reversed(range(nsp)):  # the last spatial axis first, each moved last for its MATMUL
        n_in, n_out = tx.shape[2 + axis], out[axis]
        A = _interpolation_matrix(kind, n_in, n_out, bool(align_corners), per_axis[axis])
        if n_in == n_out and np.array_equal(A, np.eye(n_in)):
            continue
        t, back = L.to_last(y, 2 + axis)
        rows = L.reshape(t, (math.prod(t.shape[:-1]), n_in))
        r = L.reshape(L.g.matmul(rows, L.g.const(A.astype(np.float32), "interpolation_weights")),
                      t.shape[:-1] + (n_out,))
        y = L.perm(r, back) if back else r
    return Sym(y)


@lowering(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool2d(L: Lowerer, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    """Average pool (2-D, 3-D): TAKE of the windows by a CONST table (padding reads +0), then one MEAN each; with
    ``ceil_mode``, ``count_include_pad=False`` or ``divisor_override``: one SUM each, DIV by torch's divisor per
    window (a CONST)."""
    return _avg_pool_nd(L, node, x, _pool_nsp(node, kernel_size), kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override)


def _avg_pool_nd(L: Lowerer, node, x, nsp: int, kernel_size, stride=(), padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None) -> Sym:
    tx = L.t(x)
    _pool_rank(node, tx, nsp)
    kernel = _spatial(kernel_size, nsp)
    stride = _spatial(stride, nsp) if stride else kernel
    padding = _spatial(padding, nsp)
    N, C, *S = tx.shape
    if not (ceil_mode or divisor_override is not None or (any(padding) and not count_include_pad)):
        patches, out, _ = _gather_patches(L, tx, kernel, stride, padding, (1,) * nsp)
        return Sym(L.reshape(L.g.mean(patches), (N, C, *out)))
    out = tuple(out_shape(node)[-nsp:])
    patches, _, _ = _gather_patches(L, tx, kernel, stride, padding, (1,) * nsp, out)
    sizes = []
    for n, o, k, s_, p in zip(S, out, kernel, stride, padding):  # torch's avg_pool divisor, per axis
        lo = np.arange(o) * s_ - p
        hi = np.minimum(lo + k, n + p)
        sizes.append(hi - lo if count_include_pad else np.minimum(hi, n) - np.maximum(lo, 0))
    div = (np.full(out, float(divisor_override)) if divisor_override is not None
           else functools.reduce(np.multiply.outer, sizes))
    y = L.g.div(L.g.sum(patches), L.g.const(div.reshape(1, 1, -1, 1).astype(np.float32), "pool_divisors"))
    return Sym(L.reshape(y, (N, C, *out)))


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def _adaptive_avg_pool2d(L: Lowerer, node, x, output_size):
    """Adaptive average pool (2-D, 3-D): to a size dividing the input :func:`_avg_pool2d` with kernel = stride,
    else TAKE of torch's windows (``floor(i n / o)`` to ``ceil((i + 1) n / o)``, padded to the longest: reads +0),
    one SUM each, DIV by the window's size (a CONST)."""
    tx = L.t(x)
    nsp = 3 if node.target == aten._adaptive_avg_pool3d.default else 2
    S = tx.shape[-nsp:]
    osz = [o if o is not None else n for o, n in zip(_spatial(output_size, nsp), S)]
    uneven = any(n % o for n, o in zip(S, osz))
    if tx.rank == nsp + 2 and uneven:
        return Sym(_adaptive_windows(L, tx, osz, "mean"))
    if uneven:
        raise UnsupportedOp(f"adaptive_avg_pool{nsp}d of a rank-{tx.rank} input from {'x'.join(map(str, S))} to "
                            f"{'x'.join(map(str, osz))} (only N, C, *spatial when it does not divide the input)")
    if all(o == 1 for o in osz):
        return Sym(L.reduce(tx, list(range(-nsp, 0)), True, "mean"))
    kernel = [n // o for n, o in zip(S, osz)]
    return _avg_pool_nd(L, node, x, nsp, kernel, kernel)


# === normalisation ===================================================================================
@lowering(aten.native_layer_norm.default)
def _layer_norm(L: Lowerer, node, x, normalized_shape, w, b, eps):
    """``(x - mean) / sqrt(var + eps) * w + b`` over the last dims: MEAN, SUB, MUL, MEAN, ADD_S, SQRT, DIV, MUL, ADD."""
    tx = L.t(x)
    k = len(normalized_shape)
    n = math.prod(normalized_shape)
    lead = tx.shape[: tx.rank - k]
    xr = L.reshape(tx, lead + (n,))
    mu = L.g.mean(xr)
    xc = L.g.sub(xr, mu)
    var = L.g.mean(L.g.mul(xc, xc))
    std = L.g.sqrt(L.g.add_s(var, float(eps)))
    y = L.g.div(xc, std)
    if w is not None:
        y = L.g.mul(y, L.reshape(L.t(w), (n,)))
    if b is not None:
        y = L.g.add(y, L.reshape(L.t(b), (n,)))
    used = _used_outputs(node)
    stat_shape = lead + (1,) * k
    mean_out = Sym(L.reshape(mu, stat_shape)) if 1 in used else None
    rstd_out = Sym(L.reshape(L.g.div(L.scalar_const(1.0, std.rank), std), stat_shape)) if 2 in used else None
    return (Sym(L.reshape(y, tx.shape)), mean_out, rstd_out)


@lowering(aten.native_group_norm.default)
def _group_norm(L: Lowerer, node, x, w, b, N, C, HxW, group, eps):
    """Group norm: per (sample, group) MEAN, SUB, MUL, MEAN (biased var), ADD_S, SQRT, DIV; then MUL by the
    per-channel weight, ADD the bias (as `native_layer_norm`)."""
    tx = L.t(x)
    N, C, G = int(N), int(C), int(group)
    xr = L.reshape(tx, (N, G, (C // G) * int(HxW)))
    mu = L.g.mean(xr)
    xc = L.g.sub(xr, mu)
    var = L.g.mean(L.g.mul(xc, xc))
    std = L.g.sqrt(L.g.add_s(var, float(eps)))
    y = L.reshape(L.g.div(xc, std), (N, C, int(HxW)))
    if w is not None:
        y = L.g.mul(y, L.reshape(L.t(w), (C, 1)))
    if b is not None:
        y = L.g.add(y, L.reshape(L.t(b), (C, 1)))
    used = _used_outputs(node)
    mean_out = Sym(L.reshape(mu, (N, G))) if 1 in used else None
    rstd_out = Sym(L.reshape(L.g.div(L.scalar_const(1.0, std.rank), std), (N, G))) if 2 in used else None
    return (Sym(L.reshape(y, tx.shape)), mean_out, rstd_out)


def _batch_norm(L: Lowerer, node, x, w, b, rm, rv, training, momentum, eps):
    tx = L.t(x)
    N, C, *S = tx.shape
    M = N * math.prod(S)
    xt = L.reshape(L.perm(tx, [1, 0, *range(2, tx.rank)]), (C, M))  # (C, N*S)
    used = _used_outputs(node)
    mu = var = None
    if training:
        mu = L.g.mean(xt)  # (C, 1)
        xc = L.g.sub(xt, mu)
        var = L.g.mean(L.g.mul(xc, xc))  # biased, as torch normalises
        std = L.g.sqrt(L.g.add_s(var, float(eps)))
    else:
        xc = L.g.sub(xt, L.reshape(L.t(rm), (C, 1)))
        std = L.g.sqrt(L.g.add_s(L.reshape(L.t(rv), (C, 1)), float(eps)))
    y = L.g.div(xc, std)
    if w is not None:
        y = L.g.mul(y, L.reshape(L.t(w), (C, 1)))
    if b is not None:
        y = L.g.add(y, L.reshape(L.t(b), (C, 1)))
    y = L.perm(L.reshape(y, (C, N, *S)), [1, 0, *range(2, tx.rank)])
    outs: list[Any] = [Sym(y), None, None, None, None]
    if 1 in used and mu is not None:
        outs[1] = Sym(L.reshape(mu, (C,)))
    if 2 in used:
        outs[2] = Sym(L.reshape(L.g.div(L.scalar_const(1.0, 2), std), (C,)))
    if training and ({3, 4} & used):
        if momentum is None:
            raise UnsupportedOp("batch norm with momentum=None (cumulative average)")
        m = float(momentum)
        rm_t, rv_t = L.reshape(L.t(rm), (C, 1)), L.reshape(L.t(rv), (C, 1))
        new_rm = L.g.add(L.g.mul_s(rm_t, 1.0 - m), L.g.mul_s(mu, m))
        unbiased = L.g.mul_s(var, M / (M - 1)) if M > 1 else var
        new_rv = L.g.add(L.g.mul_s(rv_t, 1.0 - m), L.g.mul_s(unbiased, m))
        outs[3], outs[4] = Sym(L.reshape(new_rm, (C,))), Sym(L.reshape(new_rv, (C,)))
    return tuple(outs)


@lowering(aten._native_batch_norm_legit_functional.default)
def _bn_functional(L: Lowerer, node, x, w, b, rm, rv, training, momentum, eps):
    """Batch norm over (N, *S) per channel, training: MEAN, SUB, MUL, MEAN (biased var), ADD_S, SQRT,
    DIV, MUL, ADD; running stats ``(1-m) r + m s`` (unbiased var: MUL_S by n/(n-1)) as new buffer values."""
    return _batch_norm(L, node, x, w, b, rm, rv, training, momentum, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(L: Lowerer, node, x, w, b, training, momentum, eps):
    """Batch norm without running statistics (instance norm is one over (1, N*C, *S)): as
    `_native_batch_norm_legit_functional` with the batch's statistics and no buffers."""
    if not training:
        raise UnsupportedOp("batch norm without running statistics in eval mode")
    return _batch_norm(L, node, x, w, b, None, None, True, momentum, eps)[:3]


@lowering(aten._native_batch_norm_legit_no_training.default)
def _bn_eval(L: Lowerer, node, x, w, b, rm, rv, momentum, eps):
    """Batch norm with the running statistics (eval mode): SUB, ADD_S, SQRT, DIV, MUL, ADD."""
    return _batch_norm(L, node, x, w, b, rm, rv, False, momentum, eps)[:3]


@lowering(aten.native_dropout.default)
def _dropout(L: Lowerer, node, x, p, train):
    """``x * DROPOUT_MASK(p)`` (one MUL by the committed keep-mask times RN32(1/(1-p))); identity when
    not training or p = 0. The mask output is ``mask != 0``."""
    tx = L.t(x)
    if train is False or float(p) == 0.0:
        return (Sym(tx), Sym(L.g.expand(L.scalar_const(1.0, tx.rank), tx.shape), torch.bool))
    m = L.g.dropout_mask(tx.shape, float(p))
    return (Sym(L.g.mul(tx, m)), Sym(L.to01(Sym(m)), torch.bool) if 1 in _used_outputs(node) else None)


@lowering(aten.bernoulli.p)
def _bernoulli(L: Lowerer, node, a, p=0.5, generator=None):
    """A committed 0/1 sample of ``a``'s shape, 1 with probability ``p`` (channel dropout: ``nn.Dropout1d/2d/3d``):
    SELECT(DROPOUT_MASK(1 - p), 1, 0) (the mask of that op, not torch's generator)."""
    shape = out_shape(node) or (1,)
    q = 1.0 - float(p)  # the drop probability
    if q <= 0.0:
        return torch.ones(shape)
    if q >= 1.0:
        return torch.zeros(shape)
    return Sym(L.to01(Sym(L.g.dropout_mask(shape, q))))


# === data movement ===================================================================================
def _view_shape(t: T, size: Sequence[int]) -> tuple[int, ...]:
    size = list(size)
    if -1 in size:
        k = size.index(-1)
        rest = math.prod(s for i, s in enumerate(size) if i != k)
        size[k] = math.prod(t.shape) // max(rest, 1)
    return tuple(size)


@lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def _view(L: Lowerer, node, a, size):
    """Same elements, new shape: RESHAPE."""
    t = L.t(a)
    return Sym(L.reshape(t, _view_shape(t, size)))


@lowering(aten.permute.default, aten.permute_copy.default)
def _permute(L: Lowerer, node, a, dims):
    """Axes reordered: PERMUTE."""
    return Sym(L.perm(L.t(a), list(dims)))


@lowering(aten.t.default)
def _t(L: Lowerer, node, a):
    """Transpose of a matrix: PERMUTE [1, 0]."""
    t = L.t(a)
    return Sym(L.perm(t, [1, 0]) if t.rank == 2 else t)


@lowering(aten.transpose.int)
def _transpose(L: Lowerer, node, a, d0, d1):
    """Two axes swapped: PERMUTE."""
    t = L.t(a)
    p = list(range(t.rank))
    p[d0 % t.rank], p[d1 % t.rank] = p[d1 % t.rank], p[d0 % t.rank]
    return Sym(L.perm(t, p))


@lowering(aten.unsqueeze.default, aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default,
          aten.flatten.using_ints, aten.unflatten.int)
def _reshape_like(L: Lowerer, node, a, *args):
    """unsqueeze / squeeze / flatten / unflatten: RESHAPE to the exported shape."""
    return Sym(L.reshape(L.t(a), out_shape(node)))


@lowering(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.contiguous.default,
          aten.alias_copy.default)
def _identity(L: Lowerer, node, a, *args, **kwargs):
    """A copy: no op."""
    return a if isinstance(a, Sym) else Sym(L.t(a))


@torch.library.custom_op("vtrain::stop_gradient", mutates_args=())
def stop_gradient(x: torch.Tensor) -> torch.Tensor:
    """``x.detach()`` as an op that survives ``run_decompositions`` (which turns detach into alias)."""
    return x.clone()


@stop_gradient.register_fake
def _stop_gradient_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def mark_detaches(ep) -> None:
    """Before decomposing: every ``aten.detach`` node becomes ``vtrain::stop_gradient``."""
    changed = False
    for n in ep.graph.nodes:
        if n.op == "call_function" and n.target == aten.detach.default:
            n.target = torch.ops.vtrain.stop_gradient.default
            changed = True
    if changed:
        ep.graph_module.recompile()


def mark_no_grad_regions(ep) -> None:
    """Before decomposing: every value computed in a ``torch.no_grad()`` block (export's
    ``wrap_with_set_grad_enabled(False, ..)``) is read through ``vtrain::stop_gradient``, so no gradient
    flows back through it (decomposing inlines the block and would lose that). ``embedding_renorm_``
    (``nn.Embedding(max_norm=..)``: the weight renormalised in place inside the forward) is refused."""
    import operator

    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    changed = False
    for n in list(ep.graph.nodes):
        if n.op != "call_function":
            continue
        if n.target in (aten.embedding_renorm_.default, aten.embedding_renorm.default):
            where = node_origin(n)
            raise UnsupportedOp(f"ATen op {n.target}: nn.Embedding(max_norm=...) renormalises its weight in place "
                                "during the forward (a parameter update outside the optimizer); drop max_norm"
                                + (f" (from {where})" if where else ""))
        if hop is None or n.target is not hop or n.args[0] is not False:
            continue
        outs = [u for u in n.users if u.target is operator.getitem] if n.users else []
        for u in outs or [n]:
            with ep.graph.inserting_after(u):
                sg = ep.graph.call_function(torch.ops.vtrain.stop_gradient.default, (u,))
            sg.meta = dict(u.meta)
            u.replace_all_uses_with(sg, delete_user_cb=lambda user, sg=sg: user is not sg)
            changed = True
    if changed:
        ep.graph_module.recompile()


@lowering(aten.detach.default, torch.ops.vtrain.stop_gradient.default)
def _detach(L: Lowerer, node, a):
    """A copy that stops the gradient: a RESHAPE op marked as a constant for autodiff."""
    t = L.t(a)
    d = L.g._op(OpKind.RESHAPE, [t], t.shape)
    L.g.no_grad.add(d.op)
    return Sym(d)


_FLOATS = (torch.float32,)
_INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


@lowering(aten._to_copy.default, aten.to.dtype)
def _to_copy(L: Lowerer, node, a, *args, dtype=None, **kwargs):
    """dtype casts: float32 <-> integer ids (exact for the data batch), bool -> float: no op."""
    src = a.dtype if isinstance(a, Sym) else torch.float32
    dst = dtype if dtype is not None else (args[0] if args and isinstance(args[0], torch.dtype) else src)
    if dst not in _FLOATS + _INTS:
        raise UnsupportedOp(f"a cast to {dst} (the graph computes in FP32 only)")
    t = L.t(a)
    if dst in _INTS and src in _FLOATS and dst != torch.bool and not L.from_data(t):
        raise UnsupportedOp(f"a cast of a computed float tensor to {dst} (truncation has no exact "
                            "primitive; only the data batch may be read as integer ids)")
    if dst == torch.bool and src != torch.bool:
        return Sym(L.to01(a), torch.bool)
    return Sym(t, dst)


@lowering(aten.expand.default, aten.expand_copy.default)
def _expand(L: Lowerer, node, a, size, implicit=False):
    """Broadcast copy: RESHAPE (new leading axes of size 1) then EXPAND."""
    t = L.t(a)
    shape = out_shape(node)
    if t.rank < len(shape):
        t = L.reshape(t, (1,) * (len(shape) - t.rank) + t.shape)
    return Sym(L.g.expand(t, shape))


@lowering(aten.repeat.default)
def _repeat(L: Lowerer, node, a, repeats):
    """Tiling: RESHAPE to (1, s0, 1, s1, ..), EXPAND to (r0, s0, r1, s1, ..), RESHAPE to (r0 s0, r1 s1, ..)."""
    t = L.t(a)
    reps = list(repeats)
    shape = (1,) * (len(reps) - t.rank) + t.shape
    inter = tuple(v for s in shape for v in (1, s))
    big = tuple(v for r, s in zip(reps, shape) for v in (r, s))
    e = L.g.expand(L.reshape(t, inter), big)
    return Sym(L.reshape(e, tuple(r * s for r, s in zip(reps, shape))))


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(L: Lowerer, node, a, dim=0, start=None, end=None, step=1):
    """``a[start:end:step]`` along ``dim``: SLICE (step 1) or TAKE with a CONST index (step > 1)."""
    t = L.t(a)
    dim %= t.rank
    n = t.shape[dim]
    lo, hi, _ = slice(start, end, step).indices(n)
    if step == 1:
        if lo == 0 and hi == n:
            return Sym(t)
        return Sym(L.g.slice(t, dim, lo, hi - lo))
    idx = np.arange(lo, hi, step, dtype=np.float32)
    return Sym(L.g.take(t, L.g.const(idx, "slice_index"), dim))


@lowering(aten.flip.default)
def _flip(L: Lowerer, node, a, dims):
    """``a`` reversed along ``dims``: one TAKE per axis with a CONST reversed index."""
    t = L.t(a)
    for d in dims:
        d %= t.rank
        t = L.g.take(t, L.g.const(np.arange(t.shape[d] - 1, -1, -1, dtype=np.float32), "flip_index"), d)
    return Sym(t)


@lowering(aten.cumsum.default)
def _cumsum(L: Lowerer, node, a, dim, dtype=None):
    """Running sum along ``dim``: one MATMUL per element with a CONST 0/1 lower-triangular row (its
    reduction is over the prefix; equal to torch in FP64)."""
    x, back = L.to_last(L.t(a), dim)
    n = x.shape[-1]
    rows = x if x.rank == 2 else L.reshape(x, (math.prod(x.shape[:-1]), n))  # MATMUL's operands: equal ranks
    y = L.reshape(L.g.matmul(rows, L.g.const(np.tril(np.ones((n, n), np.float32)), "prefix")), x.shape)
    return Sym(L.perm(y, back) if back else y)


@lowering(aten.copy.default)
def _copy(L: Lowerer, node, a, src, non_blocking=False):
    """``a.copy_(src)`` made functional: ``src`` in ``a``'s shape (RESHAPE, EXPAND); ``a``'s values are unused."""
    t = L.t(src)
    shape = out_shape(node) or (1,)
    if t.rank < len(shape):
        t = L.reshape(t, (1,) * (len(shape) - t.rank) + t.shape)
    return Sym(L.g.expand(t, shape), _out_dtype(node))


@lowering(aten.slice_scatter.default, aten.select_scatter.default)
def _slice_scatter(L: Lowerer, node, a, src, dim=0, start=None, end=None, step=1):
    """``a`` with ``a[start:end:step]`` along ``dim`` replaced by ``src`` (select_scatter: one index): SELECT by a
    CONST mask of the slice between ``src`` PADded (step 1) or TAKEn by a CONST table (step > 1, -1 off the
    slice) to ``a``'s shape, and ``a`` (in-place slice assignment, circular padding)."""
    ta = L.t(a)
    dim %= ta.rank
    n = ta.shape[dim]
    if node.target == aten.select_scatter.default:
        index = start % n
        lo, hi, step = index, index + 1, 1
        ts = L.reshape(L.t(src), ta.shape[:dim] + (1,) + ta.shape[dim + 1:])
    else:
        lo, hi, _ = slice(start, end, step).indices(n)
        ts = L.t(src)
        if ts.rank < ta.rank:
            ts = L.reshape(ts, (1,) * (ta.rank - ts.rank) + ts.shape)
    picked = np.arange(lo, hi, step)
    if ts.shape[dim] != len(picked):
        raise UnsupportedOp(f"{node.target}: {ts.shape[dim]} values for {len(picked)} positions")
    if step == 1:
        placed = L.g.pad(ts, dim, lo, n) if len(picked) != n else ts
    else:
        table = np.full(n, -1.0, np.float32)
        table[picked] = np.arange(len(picked))
        placed = L.g.take(ts, L.g.const(table, "scatter_index"), dim)
    mask = np.zeros((1,) * dim + (n,) + (1,) * (ta.rank - dim - 1), np.float32)
    mask.reshape(-1)[picked] = 1.0
    return Sym(L.g.select(L.g.const(mask, "scatter_mask"), placed, ta), _out_dtype(node))


@lowering(aten.select.int, aten.select_copy.int)
def _select_int(L: Lowerer, node, a, dim, index):
    """``a[..., index, ...]``: SLICE of length 1, then RESHAPE (the axis dropped)."""
    t = L.t(a)
    dim %= t.rank
    index %= t.shape[dim]
    return Sym(L.reshape(L.g.slice(t, dim, index, 1), out_shape(node)))


@lowering(aten.cat.default)
def _cat(L: Lowerer, node, tensors, dim=0):
    """Concatenation: each part PADded to the full axis, the parts ADDed (exact: all but one are +0)."""
    parts = [L.t(x) for x in tensors if not (isinstance(x, torch.Tensor) and x.numel() == 0)]
    dim %= parts[0].rank
    total = sum(p.shape[dim] for p in parts)
    out, start = None, 0
    for p in parts:
        padded = L.g.pad(p, dim, start, total) if p.shape[dim] != total else p
        out = padded if out is None else L.g.add(out, padded)
        start += p.shape[dim]
    return Sym(out)


@lowering(aten.split_with_sizes.default, aten.split.Tensor, aten.split_with_sizes_copy.default)
def _split(L: Lowerer, node, a, sizes, dim=0):
    """Parts along ``dim``: one SLICE each."""
    t = L.t(a)
    dim %= t.rank
    n = t.shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    out, start = [], 0
    for s in sizes:
        out.append(Sym(L.g.slice(t, dim, start, s) if s != n else t))
        start += s
    return out


@lowering(aten.unbind.int)
def _unbind(L: Lowerer, node, a, dim=0):
    """Slices of length 1 along ``dim`` with the axis dropped: SLICE + RESHAPE each."""
    t = L.t(a)
    dim %= t.rank
    shape = t.shape[:dim] + t.shape[dim + 1 :]
    return [Sym(L.reshape(L.g.slice(t, dim, i, 1), shape)) for i in range(t.shape[dim])]


@lowering(aten.constant_pad_nd.default)
def _constant_pad(L: Lowerer, node, a, pad, value=0.0):
    """Padding (torch order: last axis first): PAD per axis (negative: SLICE); a nonzero value is
    ADDed as a CONST that is ``value`` on the border and +0 inside (exact)."""
    t = L.t(a)
    for i in range(len(pad) // 2):
        dim = t.rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            t = L.g.slice(t, dim, max(-lo, 0), t.shape[dim] + min(lo, 0) + min(hi, 0))
            lo, hi = max(lo, 0), max(hi, 0)
        if lo or hi:
            t = L.g.pad(t, dim, lo, t.shape[dim] + lo + hi)
    if float(value) != 0.0:
        inner = torch.zeros(L.t(a).shape)
        border = torch.nn.functional.pad(inner, list(pad), value=1.0)
        t = L.g.add(t, L.t(border * finite(value)))
    return Sym(t)


@lowering(aten.embedding.default)
def _embedding(L: Lowerer, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """``weight[indices]``: TAKE on axis 0 (gradient: ONE_HOT(indices)^T MATMUL g); with ``padding_idx`` the TAKE
    reads SELECT(row != padding_idx, weight, stop_gradient(weight)): the same values, no gradient to that row."""
    if scale_grad_by_freq:
        raise UnsupportedOp("embedding with scale_grad_by_freq=True")
    tw = L.t(weight)
    if padding_idx is not None and padding_idx >= 0:
        keep = np.ones((tw.shape[0], 1), np.float32)
        keep[padding_idx] = 0.0
        frozen = L.g._op(OpKind.RESHAPE, [tw], tw.shape)
        L.g.no_grad.add(frozen.op)
        tw = L.g.select(L.g.const(keep, "padding_row"), tw, frozen)
    return Sym(L.g.take(tw, L.t(indices), 0))


@lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(L: Lowerer, node, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Fixed-length bags (a 2-D input): TAKE of the rows, then one SUM / MEAN / MAX per bag and dimension."""
    if scale_grad_by_freq or per_sample_weights is not None or (padding_idx is not None and padding_idx >= 0):
        raise UnsupportedOp("embedding_bag with scale_grad_by_freq, per_sample_weights or padding_idx")
    if not isinstance(offsets, torch.Tensor):
        raise UnsupportedOp("embedding_bag with computed offsets (only fixed-length bags: a 2-D input)")
    ti = L.t(indices)
    n = int(ti.shape[0])
    offs = [int(v) for v in offsets.tolist()]
    if include_last_offset:
        offs = offs[:-1]
    k = n // max(len(offs), 1)
    if not offs or offs != list(range(0, n, k)) or k * len(offs) != n:
        raise UnsupportedOp("embedding_bag with bags of different lengths (only fixed-length bags: a 2-D input)")
    if 1 in _used_outputs(node) or 2 in _used_outputs(node) or 3 in _used_outputs(node):
        raise UnsupportedOp("embedding_bag's offset2bag / bag_size / max_indices outputs")
    rows = L.g.take(L.t(weight), L.reshape(ti, (len(offs), k)), 0)  # (bags, k, d)
    kind = {0: "sum", 1: "mean", 2: "max"}[int(mode)]
    return (Sym(L.reduce(rows, [1], False, kind)), None, None, None)


@lowering(aten.index_select.default)
def _index_select(L: Lowerer, node, a, dim, index):
    """``a`` at ``index`` along ``dim``: TAKE."""
    t = L.t(a)
    return Sym(L.g.take(t, L.t(index), dim % t.rank))


@lowering(aten.index.Tensor)
def _index(L: Lowerer, node, a, indices):
    """``a[idx]`` with one index tensor (other axes whole): TAKE on that axis."""
    real = [(i, x) for i, x in enumerate(indices) if x is not None]
    if len(real) != 1:
        raise UnsupportedOp("advanced indexing with more than one index tensor")
    dim, idx = real[0]
    if isinstance(idx, Sym) and idx.dtype == torch.bool or isinstance(idx, torch.Tensor) and idx.dtype == torch.bool:
        raise UnsupportedOp("boolean-mask indexing (its output shape depends on the data)")
    return Sym(L.g.take(L.t(a), L.t(idx), dim))


@lowering(aten.gather.default)
def _gather(L: Lowerer, node, a, dim, index, sparse_grad=False):
    """``a.gather(dim, index)``: ``dim`` moved last (PERMUTE), ``a`` SLICEd to the index's extent on the
    other axes; one index per row is one GATHER, ``k`` per row GATHER from ``a`` EXPANDed ``k`` times."""
    t, ti = L.t(a), L.t(index)
    dim %= t.rank
    if ti.rank != t.rank or any(ti.shape[d] > t.shape[d] for d in range(t.rank) if d != dim):
        raise UnsupportedOp(f"gather along dim {dim} with index shape {ti.shape} from shape {t.shape}")
    for d in range(t.rank):
        if d != dim and ti.shape[d] < t.shape[d]:
            t = L.g.slice(t, d, 0, ti.shape[d])
    x, back = L.to_last(t, dim)
    ix, _ = L.to_last(ti, dim)
    k, n = ix.shape[-1], x.shape[-1]
    if k == 1:
        out = L.g.gather(x, ix)
    else:
        rows = L.g.expand(L.reshape(x, x.shape[:-1] + (1, n)), x.shape[:-1] + (k, n))
        out = L.reshape(L.g.gather(rows, L.reshape(ix, ix.shape + (1,))), ix.shape)
    return Sym(L.perm(out, back) if back else out)


# === tensors known at build time =====================================================================
@lowering(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default)
def _full_like(L: Lowerer, node, a, fill_value=0.0, **kwargs):
    """A constant of ``a``'s shape: known at build time (no op until used)."""
    fill = {aten.zeros_like.default: 0.0, aten.ones_like.default: 1.0, aten.empty_like.default: 0.0}.get(
        node.target, fill_value)
    val = node.meta["val"]
    return torch.full(tuple(val.shape), float(fill), dtype=val.dtype)


@lowering(aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default)
def _assert(L: Lowerer, node, *args, **kwargs):
    """A shape/dtype assertion of export: nothing to compute."""
    return None


ZEROED = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                    aten.new_empty.default, aten.new_empty_strided.default})
"""Ops whose values are uninitialized memory: known at build time as zeros (never garbage in a CONST, which
would change the graph root from run to run)."""

NO_FOLD = frozenset({aten.native_dropout.default, aten.rand.default, aten.randn.default, aten.bernoulli.p,
                     aten.rand_like.default, aten.randn_like.default, aten.randint.default})
"""Ops never evaluated at build time even when every input is known (they are random)."""

KEPT_WHOLE = (aten.softplus.default, aten.mish.default, aten.upsample_bicubic2d.vec, aten.upsample_trilinear3d.vec,
              aten._upsample_nearest_exact2d.vec, aten.upsample_nearest3d.vec, aten._upsample_nearest_exact3d.vec)
"""Ops kept out of torch's decompositions: softplus' and mish's compute ``exp(a)`` for every ``a`` and select
the threshold branch afterwards (an overflow to inf in FP32), their lowerings here are finite for every input;
bicubic and trilinear upsampling and nearest (3-D) / nearest-exact gather with several index tensors, their
lowerings are one MATMUL / TAKE per axis."""


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """``torch.export.default_decompositions()`` without :data:`KEPT_WHOLE` (for ``run_decompositions``)."""
    table = torch.export.default_decompositions()
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return table


def lowering_of(target: Any) -> Lowering | None:
    """The lowering of an ATen overload, or None."""
    return LOWERINGS.get(target)


def lowering_table() -> str:
    """The markdown table of every lowering: ATen overloads and the first docstring line."""
    by_fn: dict[Lowering, list[str]] = {}
    for op, fn in LOWERINGS.items():
        by_fn.setdefault(fn, []).append(str(op).removeprefix("aten."))
    rows = ["| ATen op | exact semantics in primitives |", "|---|---|"]
    for fn, ops in sorted(by_fn.items(), key=lambda kv: sorted(kv[1])[0]):
        doc = (fn.__doc__ or "").strip().splitlines()
        first = " ".join(ln.strip() for ln in doc[: next((i for i, ln in enumerate(doc) if not ln.strip()), len(doc))])
        first = re.sub(r":func:`_?([a-z_0-9]+)`", r"the `\1` lowering", first).replace("``", "`")
        rows.append(f"| {', '.join(f'`{o}`' for o in sorted(ops))} | {first} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - prints the table for docs/frontend.md
    print(lowering_table())
