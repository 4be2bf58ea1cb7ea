"""Exact reference of the one-step check (``contracts/Adjudicator.sol``), chain-free.

For one output element of one op (a descriptor, its FP32 input tensors and a flat index):

- :func:`exact_value` -- the exact real value ``e`` (a :class:`~fractions.Fraction`);
- :func:`contract_bound` -- the certified bound ``dc`` of docs/numerics.md, on the exact ``S``;
- :func:`enclosure` -- the enclosure ``[lo, hi]`` of ``e`` and the bound the contract actually
  works with (``contracts/lib/ExactSum.sol``: one int256 accumulator; exact unless terms span more
  than ~2^72, width <= 2^-19 * dc, and where an FP32 midpoint then lies inside, ``rounded`` holds
  ``RN32(e)`` of the exact second pass; its bound uses an upper bound of ``S`` within 2^-19; EXP LOG
  TANH: ``vtrain.numerics.transcendental``, width about 2^-110 relative, ``dc = 4u (1 - 2^-40) |e|_low``;
  ERF: width at most 2^-80 relative below saturation, 2^-55 at it, ``dc = 8u (1 - 2^-40) |e|_low``);
- :func:`judge_element` -- the contract's rule on a claimed value and the committed log entry,
  bit for bit what ``Adjudicator.adjudicate`` returns for a well-formed proof;
- :func:`reads` -- the input elements the contract reads, in the order the proof opens them
  (used by ``protocol/proofs.py``).
- the chunk level of long reductions (``ChunkAdjudicator``, docs/protocol.md "Chunk level"):
  :func:`element_partials` (what the trainer posts), :func:`first_wrong_chunk` (what a challenger
  disputes), :func:`chunk_reads` (the chunk check's openings) and :func:`judge_partials` (the
  ruling from the partials, bit for bit the one-step ruling when the partials are right).

Conventions shared with Solidity: an FP32 value is its bit pattern (an int); zero is canonical
(``+0``: a zero result is bits 0, a claimed ``-0`` never stands); NaN/inf inputs raise
:class:`~vtrain.errors.NonFiniteValue` where the contract reverts ``NonFinite``; a malformed
descriptor raises :class:`MalformedOp` where the contract reverts.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from vtrain.commit.roots import LogEntry, decode_op_descriptor, encode_op_descriptor, sample_index
from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.graph.step_graph import MAX_CONCAT_INPUTS, OpKind
from vtrain.numerics.transcendental import enclose as _enclose_transcendental

__all__ = [
    "CHUNK_TERMS",
    "DATA_INPUT",
    "MAX_CHUNKS",
    "MAX_DIRECT_TERMS",
    "Partial",
    "chunk_count",
    "chunk_partial",
    "chunk_reads",
    "element_partials",
    "first_wrong_chunk",
    "is_chunked",
    "judge_partials",
    "partials_enclosure",
    "partials_scale",
    "reduction_terms",
    "DataContext",
    "dropout_u",
    "Enclosure",
    "MalformedOp",
    "OpDesc",
    "Read",
    "UnsupportedOp",
    "bits_of",
    "contract_bound",
    "enclosure",
    "exact_value",
    "judge",
    "judge_element",
    "midpoint",
    "neighbour",
    "rn32",
    "value_of",
]

SIGN = 0x80000000
POS_INF = 0x7F800000
NEG_INF = 0xFF800000
ONE = 0x3F800000
TWO53 = 1 << 53
#: ExactSum: accumulator headroom, guard bits and quantum offset (see contracts/lib/ExactSum.sol).
MAX_TERMS = 1 << 16
_GUARD = 72
_LSB_OFFSET = 372
#: Log codes (docs/numerics.md).
NONE, DOWN, UP, EXPLICIT = 0, 1, 2, 3
#: ``Read.input`` of a DATA op's sample (read against the dataset root, not an input tensor).
DATA_INPUT = -1


class MalformedOp(VtrainError):
    """Raised when a descriptor does not fit its op kind (the contract reverts)."""


class UnsupportedOp(VtrainError):
    """Raised for op kinds the adjudicator does not rule on (INPUT, CONST, unknown codes)."""


# ---------------------------------------------------------------------------------------------
# FP32 bits


def bits_of(x: Any) -> int:
    """Bit pattern of a float32 scalar (numpy or Python float, rounded to float32 first)."""
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def is_finite(b: int) -> bool:
    return b & POS_INF != POS_INF


def _require_finite(b: int) -> None:
    if not is_finite(b):
        raise NonFiniteValue(f"expected a finite FP32 value, got bits {b:#010x}")


def decode(b: int) -> tuple[bool, int, int]:
    """``(neg, mant, exp)`` with value ``(-1)^neg * mant * 2^exp`` (inf patterns decode to 2^128)."""
    be = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    if be == 0:
        return bool(b & SIGN), mant, -149
    return bool(b & SIGN), mant | 0x800000, be - 150


def value_of(b: int) -> Fraction:
    """The exact value of a finite FP32 bit pattern (also the virtual +-2^128 of the inf patterns)."""
    neg, mant, exp = decode(b)
    v = Fraction(mant) * Fraction(2) ** exp
    return -v if neg else v


def to_ordered(b: int) -> int:
    """Position in the total order of FP32 values (+-0 -> 0, neighbours differ by 1)."""
    m = b & 0x7FFFFFFF
    return -m if b & SIGN else m


def from_ordered(o: int) -> int:
    return (-o) | SIGN if o < 0 else o


def neighbour(b: int, up: bool) -> int:
    """The next FP32 value above (``up``) or below ``b`` (from +-FLT_MAX: the +-inf pattern)."""
    return from_ordered(to_ordered(b) + (1 if up else -1))


def midpoint(c: int, above: bool) -> tuple[Fraction, Fraction]:
    """``(m, s)``: the midpoint between ``c`` and its upper (``above``) or lower neighbour, and the
    spacing of that pair (next to FLT_MAX the neighbour is the virtual 2^128)."""
    n = neighbour(c, above)
    lo, hi = (c, n) if above else (n, c)
    vl, vh = value_of(lo), value_of(hi)
    return (vl + vh) / 2, vh - vl


def _pow2(e: int) -> Fraction:
    return Fraction(1 << e) if e >= 0 else Fraction(1, 1 << -e)


def rn32(x: Fraction, saturate: bool = False) -> int:
    """RN32(x): round to nearest FP32, ties to even, with subnormals; a zero result is +0.

    Overflow (``|x| >= FLT_MAX + ulp/2``) raises :class:`NonFiniteValue`, or returns the +-inf
    pattern with ``saturate`` (how the contract evaluates window bounds).
    """
    x = Fraction(x)
    if x == 0:
        return 0
    neg = x < 0
    a = -x if neg else x
    n, d = a.numerator, a.denominator
    top = n.bit_length() - d.bit_length()  # floor(log2 a) is top or top - 1
    if _pow2(top) > a:
        top -= 1
    lsb = max(top - 23, -149)
    q = a / _pow2(lsb)
    mant = q.numerator // q.denominator
    rest = q - mant
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and mant & 1):
        mant += 1
    if mant == 0:
        return 0
    bits = ((lsb + 149) << 23) + mant
    if bits >= POS_INF:
        if not saturate:
            raise NonFiniteValue(f"RN32 overflows: {float(x):.6g} is beyond FLT_MAX + ulp/2")
        return NEG_INF if neg else POS_INF
    return bits | SIGN if neg else bits


# ---------------------------------------------------------------------------------------------
# Descriptors and reads


@dataclass(frozen=True)
class OpDesc:
    """An op descriptor: ``(kind, inputs, shape, in_shapes, attrs)`` as in the graph leaf."""

    kind: int
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    in_shapes: tuple[tuple[int, ...], ...]
    attrs: tuple[int, ...]

    @classmethod
    def of(cls, desc: Any) -> OpDesc:
        """From encoded bytes, an ``OpDesc`` or a 5-sequence ``(kind, inputs, shape, in_shapes, attrs)``."""
        if isinstance(desc, OpDesc):
            return desc
        if isinstance(desc, bytes):
            desc = decode_op_descriptor(desc)
        kind, inputs, shape, in_shapes, attrs = desc
        return cls(
            int(kind),
            tuple(int(i) for i in inputs),
            tuple(int(s) for s in shape),
            tuple(tuple(int(s) for s in sh) for sh in in_shapes),
            tuple(int(a) for a in attrs),
        )

    def encode(self) -> bytes:
        """The ABI encoding (the graph leaf and ``ElementClaim.descriptor``)."""
        return encode_op_descriptor(self.kind, self.inputs, self.shape, self.in_shapes, self.attrs)


@dataclass(frozen=True)
class DataContext:
    """The job's data seed and the step (DATA, DROPOUT_MASK, STEP) and the dataset ``[nSamples, L]``
    a DATA op reads (None where no DATA op is ruled)."""

    dataset: np.ndarray | None
    seed: bytes
    step: int


def dropout_u(seed: bytes, step: int, salt: int, i: int) -> int:
    """DROPOUT_MASK's draw for flat element ``i``: the first 4 bytes, big-endian, of
    ``sha256(seed32 || uint64be(step) || uint32be(salt) || uint64be(i))``; the element is kept
    (``scale``) when it is ``>= threshold``, else +0."""
    if len(seed) != 32:
        raise MalformedOp(f"dropout seed: expected 32 bytes, got {len(seed)}")
    pre = seed + step.to_bytes(8, "big") + salt.to_bytes(4, "big") + i.to_bytes(8, "big")
    return int.from_bytes(hashlib.sha256(pre).digest()[:4], "big")


@dataclass(frozen=True)
class Read:
    """One opening of the proof: elements ``[start, start + length)`` of input ``input``
    (``DATA_INPUT``: sample ``start`` of the dataset, ``length`` its elements)."""

    input: int
    start: int
    length: int


@dataclass(frozen=True)
class _Sem:
    """One element's exact semantics: the reads and what is computed from them."""

    reads: tuple[Read, ...]
    op: str  # copy | sum | mul | div | sqrt | dot | mean | exp | log | tanh | erf | count (bits[0] an integer)
    bits: tuple[int, ...] = ()  # operands (FP32 bits); dot: a0, b0, a1, b1, ... (+ bias)
    negate: tuple[bool, ...] = ()  # sum (dc = 0): negate operand i
    n: int = 0  # reductions: the bound's term count
    bias: bool = False
    bound: bool = False  # dot/sum/mean with the certified bound (else dc = 0)


def _numel(shape: Sequence[int]) -> int:
    if len(shape) > 6:
        raise MalformedOp(f"rank: expected at most 6, got {len(shape)}")
    return math.prod(shape)


def _unravel(flat: int, shape: Sequence[int]) -> list[int]:
    idx = [0] * len(shape)
    for i in range(len(shape) - 1, -1, -1):
        flat, idx[i] = divmod(flat, shape[i])
    return idx


def _ravel_b(idx: Sequence[int], shape: Sequence[int]) -> int:
    flat = 0
    for i, d in enumerate(shape):
        flat = flat * d + (0 if d == 1 else idx[i])
    return flat


def _broadcasts(s: Sequence[int], out: Sequence[int]) -> bool:
    return len(s) == len(out) and all(a == b or a == 1 for a, b in zip(s, out, strict=True))


def _same_except(a: Sequence[int], b: Sequence[int], skip: int = -1) -> bool:
    return len(a) == len(b) and all(i == skip or x == y for i, (x, y) in enumerate(zip(a, b, strict=True)))


def _positive(b: int) -> bool:
    return not b & SIGN and b != 0


def _as_index(b: int) -> int | None:
    """The non-negative integer < 2^32 that FP32 ``b`` equals, or None."""
    neg, m, e = decode(b)
    if m == 0:
        return 0
    if neg:
        return None
    if e >= 0:
        return m << e if e < 9 else None
    if -e >= 24 or m & ((1 << -e) - 1):
        return None
    return m >> -e


class _Reader:
    """Reads input elements in the contract's order and records each opening."""

    def __init__(self, desc: OpDesc, tensors: Sequence[np.ndarray]):
        self.desc = desc
        self.flat = [np.ascontiguousarray(t, dtype=np.float32).reshape(-1).view(np.uint32) for t in tensors]
        if len(self.flat) != len(desc.in_shapes):
            raise MalformedOp(f"tensors: expected {len(desc.in_shapes)}, got {len(self.flat)}")
        for i, (t, s) in enumerate(zip(self.flat, desc.in_shapes, strict=True)):
            if t.size != _numel(s):
                raise MalformedOp(f"input {i}: expected {_numel(s)} elements for shape {s}, got {t.size}")
        self.reads: list[Read] = []

    def row(self, i: int, start: int, length: int) -> list[int]:
        self.reads.append(Read(i, start, length))
        vals = [int(v) for v in self.flat[i][start : start + length]]
        for v in vals:
            _require_finite(v)
        return vals

    def one(self, i: int, flat: int) -> int:
        return self.row(i, flat, 1)[0]


_TRANSCENDENTAL = {OpKind.EXP: "exp", OpKind.LOG: "log", OpKind.TANH: "tanh", OpKind.ERF: "erf"}
_TRANSCENDENTAL_KIND = {v: k for k, v in _TRANSCENDENTAL.items()}
#: Working precision (bits) of the auditor's reference value of exp/log/tanh (mpmath).
MP_PREC = 400


def _semantics(desc: OpDesc, tensors: Sequence[np.ndarray], index: int, data: DataContext | None) -> _Sem:
    k, shape, ins, attrs = desc.kind, desc.shape, desc.in_shapes, desc.attrs
    if len(desc.inputs) != len(ins):
        raise MalformedOp(f"in_shapes: expected one per input ({len(desc.inputs)}), got {len(ins)}")
    n_out = _numel(shape)
    if not 0 <= index < n_out:
        raise MalformedOp(f"index: expected 0 <= index < {n_out}, got {index}")
    rd = _Reader(desc, tensors)

    def need(n: int) -> None:
        if len(ins) != n:
            raise MalformedOp(f"{OpKind(k).name}: expected {n} inputs, got {len(ins)}")

    def done(op: str, *bits: int, **kw: Any) -> _Sem:
        return _Sem(tuple(rd.reads), op, tuple(bits), **kw)

    def arith(op: int, a: int, b: int) -> _Sem:
        if op == OpKind.DIV:
            return done("div", a, b)
        if op == OpKind.MUL:
            return done("mul", a, b)
        return done("sum", a, b, negate=(False, op == OpKind.SUB))

    if k in (OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.RELU_GRAD):
        need(2)
        idx = _unravel(index, shape)
        for i in (0, 1):
            if not _broadcasts(ins[i], shape):
                raise MalformedOp(f"input {i}: shape {ins[i]} does not broadcast to {shape}")
        a = rd.one(0, _ravel_b(idx, ins[0]))
        if k == OpKind.RELU_GRAD:
            return done("copy", rd.one(1, _ravel_b(idx, ins[1])) if _positive(a) else 0)
        return arith(k, a, rd.one(1, _ravel_b(idx, ins[1])))
    if OpKind.ADD_S <= k <= OpKind.RSUB_S:
        need(1)
        if not _same_except(ins[0], shape):
            raise MalformedOp(f"input 0: expected shape {shape}, got {ins[0]}")
        if len(attrs) != 1 or attrs[0] > 0xFFFFFFFF or not is_finite(attrs[0]):
            raise MalformedOp(f"attrs: expected one finite FP32 constant, got {attrs}")
        c = attrs[0]
        a = rd.one(0, index)
        if k == OpKind.RSUB_S:
            return arith(OpKind.SUB, c, a)
        return arith({OpKind.ADD_S: OpKind.ADD, OpKind.MUL_S: OpKind.MUL}.get(OpKind(k), OpKind.DIV), a, c)
    if k in (OpKind.SQRT, OpKind.RELU):
        need(1)
        if not _same_except(ins[0], shape):
            raise MalformedOp(f"input 0: expected shape {shape}, got {ins[0]}")
        a = rd.one(0, index)
        if k == OpKind.SQRT:
            return done("sqrt", a)
        return done("copy", a if _positive(a) else 0)
    if k in _TRANSCENDENTAL:
        need(1)
        if not _same_except(ins[0], shape):
            raise MalformedOp(f"input 0: expected shape {shape}, got {ins[0]}")
        return done(_TRANSCENDENTAL[OpKind(k)], rd.one(0, index))
    if k == OpKind.MATMUL:
        if len(ins) not in (2, 3):
            raise MalformedOp(f"MATMUL: expected 2 or 3 inputs, got {len(ins)}")
        r = len(shape)
        sa, sb = ins[0], ins[1]
        if r < 2 or len(sa) != r or len(sb) != r or sa[:-2] != shape[:-2] or sb[:-2] != shape[:-2]:
            raise MalformedOp(f"MATMUL: shapes {sa}, {sb} do not fit {shape}")
        m, n_cols, kk = shape[-2], shape[-1], sa[-1]
        if sa[-2] != m or kk == 0 or sb[-2] != n_cols or sb[-1] != kk:
            raise MalformedOp(f"MATMUL: shapes {sa}, {sb} do not fit {shape}")
        bias = len(ins) == 3
        if bias and tuple(ins[2]) != (n_cols,):
            raise MalformedOp(f"MATMUL: bias shape {ins[2]}, expected ({n_cols},)")
        j = index % n_cols
        row = index // n_cols
        batch = row // m
        a_row = rd.row(0, row * kk, kk)
        b_row = rd.row(1, (batch * n_cols + j) * kk, kk)
        ops = [x for pair in zip(a_row, b_row, strict=True) for x in pair]
        if bias:
            ops.append(rd.one(2, j))
        return done("dot", *ops, n=kk + bias, bias=bias, bound=True)
    if k in (OpKind.SUM, OpKind.MEAN, OpKind.MAX):
        need(1)
        if not shape or not _same_except(ins[0], shape, len(shape) - 1) or shape[-1] != 1 or ins[0][-1] == 0:
            raise MalformedOp(f"{OpKind(k).name}: shape {ins[0]} does not reduce to {shape}")
        n = ins[0][-1]
        vals = rd.row(0, index * n, n)
        if k == OpKind.MAX:
            return done("copy", max(vals, key=to_ordered))
        return done("mean" if k == OpKind.MEAN else "sum", *vals, n=n, bound=True)
    if k == OpKind.CONCAT:
        if not 1 <= len(ins) <= MAX_CONCAT_INPUTS or len(shape) != 1 or shape[0] != sum(_numel(s) for s in ins):
            raise MalformedOp(f"CONCAT: {len(ins)} inputs of shapes {list(ins)} do not concatenate to {shape}")
        off = 0
        for i, si in enumerate(ins):  # the input holding the element, read at its offset there
            if index < off + _numel(si):
                return done("copy", rd.one(i, index - off))
            off += _numel(si)
    if k in (OpKind.OUTPUT, OpKind.RESHAPE, OpKind.PERMUTE, OpKind.SLICE, OpKind.PAD, OpKind.EXPAND):
        need(1)
        si = ins[0]
        if k in (OpKind.OUTPUT, OpKind.RESHAPE):
            if _numel(si) != n_out:
                raise MalformedOp(f"{OpKind(k).name}: {si} and {shape} differ in size")
            return done("copy", rd.one(0, index))
        idx = _unravel(index, shape)
        if k == OpKind.EXPAND:
            if not _broadcasts(si, shape):
                raise MalformedOp(f"EXPAND: {si} does not broadcast to {shape}")
            return done("copy", rd.one(0, _ravel_b(idx, si)))
        r = len(shape)
        if k == OpKind.PERMUTE:
            if len(si) != r or sorted(attrs) != list(range(r)):
                raise MalformedOp(f"PERMUTE: {attrs} is not a permutation of {r} axes")
            if any(si[p] != shape[d] for d, p in enumerate(attrs)):
                raise MalformedOp(f"PERMUTE: {si} permuted by {attrs} is not {shape}")
            in_idx = [0] * r
            for d, p in enumerate(attrs):
                in_idx[p] = idx[d]
            return done("copy", rd.one(0, _ravel_b(in_idx, si)))
        if len(attrs) != 2 or attrs[0] >= r:
            raise MalformedOp(f"{OpKind(k).name}: expected attrs [axis, start], got {attrs}")
        axis, start = attrs
        if not _same_except(si, shape, axis):
            raise MalformedOp(f"{OpKind(k).name}: {si} and {shape} differ off axis {axis}")
        if k == OpKind.SLICE:
            if start + shape[axis] > si[axis]:
                raise MalformedOp(f"SLICE: [{start}, {start + shape[axis]}) beyond {si[axis]}")
            idx[axis] += start
        else:
            if start + si[axis] > shape[axis]:
                raise MalformedOp(f"PAD: [{start}, {start + si[axis]}) beyond {shape[axis]}")
            t = idx[axis]
            if not start <= t < start + si[axis]:
                return done("copy", 0)
            idx[axis] = t - start
        return done("copy", rd.one(0, _ravel_b(idx, si)))
    if k == OpKind.ONE_HOT:
        need(1)
        if len(attrs) != 1 or not shape or attrs[0] != shape[-1] or attrs[0] == 0:
            raise MalformedOp(f"ONE_HOT: attrs {attrs} do not fit {shape}")
        if tuple(ins[0]) != tuple(shape[:-1]):
            raise MalformedOp(f"ONE_HOT: input {ins[0]} does not fit {shape}")
        classes = attrs[0]
        got = _as_index(rd.one(0, index // classes))
        return done("copy", ONE if got == index % classes else 0)
    if k == OpKind.GATHER:
        need(2)
        sx = ins[0]
        if not shape or not _same_except(sx, shape, len(shape) - 1) or sx[-1] == 0:
            raise MalformedOp(f"GATHER: x {sx} does not fit {shape}")
        if not _same_except(ins[1], shape) or shape[-1] != 1:
            raise MalformedOp(f"GATHER: idx {ins[1]} does not fit {shape}")
        n = sx[-1]
        got = _as_index(rd.one(1, index))
        if got is None or got >= n:
            return done("copy", 0)
        return done("copy", rd.one(0, index * n + got))
    if k == OpKind.TAKE:
        need(2)
        sx, si = ins
        if len(attrs) != 1 or attrs[0] >= len(sx):
            raise MalformedOp(f"TAKE: expected attrs [axis < {len(sx)}], got {attrs}")
        axis = attrs[0]
        if tuple(shape) != tuple(sx[:axis]) + tuple(si) + tuple(sx[axis + 1 :]):
            raise MalformedOp(f"TAKE: x {sx} by idx {si} on axis {axis} does not give {shape}")
        q = _numel(sx[axis + 1 :])
        jn = _numel(si)
        got = _as_index(rd.one(1, (index // q) % jn))
        n = sx[axis]
        if got is None or got >= n:
            return done("copy", 0)
        return done("copy", rd.one(0, ((index // (q * jn)) * n + got) * q + index % q))
    if k == OpKind.SELECT:
        need(3)
        for i in range(3):
            if not _broadcasts(ins[i], shape):
                raise MalformedOp(f"SELECT: input {i} shape {ins[i]} does not broadcast to {shape}")
        idx = _unravel(index, shape)
        pick = 1 if rd.one(0, _ravel_b(idx, ins[0])) & ~SIGN else 2  # -0 counts as zero
        return done("copy", rd.one(pick, _ravel_b(idx, ins[pick])))
    if k == OpKind.MAX_GRAD:
        need(2)
        if not _same_except(ins[0], shape):
            raise MalformedOp(f"MAX_GRAD: x {ins[0]} does not fit {shape}")
        if not shape or not _same_except(ins[1], shape, len(shape) - 1) or ins[1][-1] != 1:
            raise MalformedOp(f"MAX_GRAD: g {ins[1]} does not fit {shape}")
        n = shape[-1]
        row = index // n
        vals = rd.row(0, row * n, n)
        ordered = [to_ordered(v) for v in vals]
        best = ordered.index(max(ordered))  # the first maximum (+0 and -0 are equal)
        if best != index % n:
            return done("copy", 0)
        return done("copy", rd.one(1, row))
    if k == OpKind.DROPOUT_MASK:
        need(0)
        if len(attrs) != 3 or any(a > 0xFFFFFFFF for a in attrs):
            raise MalformedOp(f"DROPOUT_MASK: expected attrs [threshold, scaleBits, salt] (uint32), got {attrs}")
        if index >= 1 << 64:
            raise MalformedOp(f"DROPOUT_MASK: element index {index} beyond 2^64")
        if data is None:
            raise MalformedOp("DROPOUT_MASK: expected a DataContext (seed, step)")
        threshold, scale, salt = attrs
        if dropout_u(data.seed, data.step, salt, index) < threshold:
            return done("copy", 0)
        _require_finite(scale)
        return done("copy", scale)
    if k == OpKind.STEP:
        need(0)
        if tuple(shape) != (1,) or attrs:
            raise MalformedOp(f"STEP: expected shape (1,) and no attrs, got {shape}, {attrs}")
        if data is None:
            raise MalformedOp("STEP: expected a DataContext (seed, step)")
        return done("count", data.step)
    if k == OpKind.DATA:
        need(0)
        if len(shape) != 2:
            raise MalformedOp(f"DATA: expected shape [B, L], got {shape}")
        if data is None or data.dataset is None:
            raise MalformedOp("DATA: expected a DataContext (dataset, seed, step)")
        ds = np.ascontiguousarray(data.dataset, dtype=np.float32)
        length = shape[1]
        if ds.ndim != 2 or ds.shape[1] != length:
            raise MalformedOp(f"DATA: dataset shape {ds.shape} does not fit samples of {length}")
        j, col = divmod(index, length)
        s = sample_index(data.seed, data.step, j, ds.shape[0])
        rd.reads.append(Read(DATA_INPUT, s, length))
        v = int(ds[s].view(np.uint32)[col])
        _require_finite(v)
        return done("copy", v)
    raise UnsupportedOp(f"op kind {k} is not ruled by the adjudicator")


# ---------------------------------------------------------------------------------------------
# Exact value and bound (independent of the accumulator)


def _dc(n: int, s: Fraction, mean: bool) -> Fraction:
    g = Fraction(n, TWO53 - n)
    return (g + Fraction(2, TWO53)) * s / n if mean else g * s


def _terms(sem: _Sem) -> list[Fraction]:
    v = [value_of(b) for b in sem.bits]
    if sem.op == "dot":
        ts = [v[2 * i] * v[2 * i + 1] for i in range(len(v) // 2)]
        return ts + ([v[-1]] if sem.bias else [])
    return v


def _exact(sem: _Sem) -> Fraction | None:
    """The exact value, or None where it is undefined (division by zero, sqrt of a negative)."""
    if sem.op in _TRANSCENDENTAL_KIND:
        return _transcendental_value(sem.op, sem.bits[0])
    if sem.op == "count":
        return Fraction(sem.bits[0])
    v = [value_of(b) for b in sem.bits]
    if sem.op == "copy":
        return v[0]
    if sem.op == "sum" and not sem.bound:
        return sum((-x if neg else x for x, neg in zip(v, sem.negate, strict=True)), Fraction(0))
    if sem.op == "mul":
        return v[0] * v[1]
    if sem.op == "div":
        return None if v[1] == 0 else v[0] / v[1]
    if sem.op == "sqrt":
        if v[0] < 0:
            return None
        neg, m, e = decode(sem.bits[0])
        s = 200 + (e & 1)
        return Fraction(math.isqrt(m << s)) * _pow2((e - s) // 2)  # exact when a square
    total = sum(_terms(sem), Fraction(0))
    return total / sem.n if sem.op == "mean" else total


def _transcendental_value(op: str, b: int) -> Fraction | None:
    """exp/log/tanh/erf of FP32 ``b`` rounded to MP_PREC bits (mpmath), or None where the contract has
    no finite value (exp(x) for x >= 89, log(x) for x <= 0). Exact where the value is rational
    (exp 0 = 1, log 1 = 0, tanh 0 = erf 0 = 0). Below 2^-1100 (exp of x < -762) the result is clamped to
    2^-1100, which rounds to the same FP32 zero."""
    import mpmath

    if _enclose_transcendental(_TRANSCENDENTAL_KIND[op], b) is None:
        return None
    x = value_of(b)
    with mpmath.workprec(MP_PREC):
        y = getattr(mpmath, op)(mpmath.mpf(x.numerator) / x.denominator)
        sign, man, exp, _ = y._mpf_
    if man == 0:
        return Fraction(0)
    if exp + int(man).bit_length() < -1100:
        return Fraction(-1 if sign else 1, 1 << 1100)
    v = Fraction(int(man)) * _pow2(int(exp))
    return -v if sign else v


def exact_value(desc: Any, tensors: Sequence[np.ndarray], index: int, data: DataContext | None = None) -> Fraction:
    """The exact real value ``e`` of output element ``index`` (docs/protocol.md op semantics).

    For SQRT of a non-square the value is irrational: this returns ``sqrt`` truncated to about
    2^-100 relative (:func:`enclosure` brackets it rigorously); EXP LOG TANH: the value rounded to
    400 bits (mpmath). Raises NonFiniteValue where ``e`` is undefined (division by zero, square root
    or log of a negative number, log 0, exp(x) for x >= 89) or an input is NaN/inf.
    """
    sem = _semantics(OpDesc.of(desc), tensors, index, data)
    e = _exact(sem)
    if e is None:
        raise NonFiniteValue(f"op {OpKind(OpDesc.of(desc).kind).name}: element {index} has no finite value")
    return e


def contract_bound(desc: Any, tensors: Sequence[np.ndarray], index: int, data: DataContext | None = None) -> Fraction:
    """The certified bound ``dc`` on the exact ``S = sum|t_k|`` (0 for exact ops and copies):
    MATMUL/SUM ``g(n) S``, MEAN ``(g(n) + 2u) S / n``, ``g(n) = n u / (1 - n u)``, ``u = 2^-53``,
    ``n`` the number of terms (MATMUL: ``K``, plus 1 with a bias); EXP LOG TANH: the enclosure's
    ``dc`` (0 where the value is undefined)."""
    sem = _semantics(OpDesc.of(desc), tensors, index, data)
    if sem.op in _TRANSCENDENTAL_KIND:
        enc = _enclose(sem)  # dc = 4u (1 - 2^-40) times the enclosure's lower bound of |e|
        return Fraction(0) if enc is None else enc.value(enc.dc)
    if not sem.bound:
        return Fraction(0)
    return _dc(sem.n, sum((abs(t) for t in _terms(sem)), Fraction(0)), sem.op == "mean")


# ---------------------------------------------------------------------------------------------
# The contract's enclosure (mirror of ExactSum / Adjudicator)


@dataclass(frozen=True)
class Enclosure:
    """``e`` in ``[lo, hi]``, bound ``dc``, all as integers in the unit ``2^exp / den``; ``rounded``:
    ``RN32(e)`` from the contract's exact second pass (``ExactSum.roundExact``), set only for a
    MATMUL/SUM/MEAN whose first-pass ends round apart (``RN32(lo) != RN32(hi)``), else None."""

    lo: int
    hi: int
    dc: int
    exp: int
    den: int
    rounded: int | None = None

    def value(self, v: int) -> Fraction:
        return Fraction(v) * _pow2(self.exp) / self.den

    @property
    def bounds(self) -> tuple[Fraction, Fraction, Fraction]:
        """``(lo, hi, dc)`` as exact rationals."""
        return self.value(self.lo), self.value(self.hi), self.value(self.dc)


def _product(a: int, b: int) -> tuple[bool, int, int]:
    """ExactSum.product: ``(neg, M, est)``; M = 0 for a zero product."""
    ea, eb = (a >> 23) & 0xFF, (b >> 23) & 0xFF
    ma, mb = a & 0x7FFFFF, b & 0x7FFFFF
    ma, ea = (ma, 1) if ea == 0 else (ma | 0x800000, ea)
    mb, eb = (mb, 1) if eb == 0 else (mb | 0x800000, eb)
    return bool((a ^ b) & SIGN), ma * mb, ea + eb


def _accumulate(terms: Sequence[tuple[bool, int, int]]) -> tuple[int, int, int, int]:
    """ExactSum.accumulate: ``(sum, absSum, inexact, lsbExp)``."""
    if len(terms) > MAX_TERMS:
        raise MalformedOp(f"reduction: expected at most {MAX_TERMS} terms, got {len(terms)}")
    top = _max_est(terms)
    if top == 0:
        return 0, 0, 0, 0
    return (*_sum_at(terms, top), top - _LSB_OFFSET)


def _max_est(terms: Sequence[tuple[bool, int, int]]) -> int:
    """ExactSum.maxEst: the scale, the largest ``est`` of the non-zero terms (0 when there are none)."""
    return max((est for _, m, est in terms if m), default=0)


def _sum_at(terms: Sequence[tuple[bool, int, int]], top: int) -> tuple[int, int, int]:
    """ExactSum.sumAt: ``(sum, absSum, inexact)`` in quanta ``2^(top - 372)``; every ``est <= top``."""
    total = abs_sum = inexact = 0
    for neg, m, est in terms:
        if not m:
            continue
        d = est + _GUARD - top
        if d >= 0:
            q, lost = m << d, 0
        else:
            q = m >> -d
            lost = int(q << -d != m)
        abs_sum += q
        inexact += lost
        total += -(q + lost) if neg else q
    return total, abs_sum, inexact


#: Bits per limb of the exact tail (ExactSum.TAIL_BITS); limbs of the tail (ExactSum.tailAt).
_TAIL_BITS = 191
_TAIL_LIMBS = 4


def _tail_at(terms: Sequence[tuple[bool, int, int]], top: int) -> tuple[int, int, int, int]:
    """ExactSum.tailAt: the exact rest ``e - sum * 2^L`` (``L = top - 372``) in limbs, limb 0 in
    quanta ``2^L``, limb ``j`` in ``2^(L - 191 j)``: a floored term's bits below the quantum
    (``+low``; a negative one ``2^L - low``: 1 in limb 0, ``-low`` in limb ``ceil(sh / 191)``)."""
    limbs = [0] * _TAIL_LIMBS
    for neg, m, est in terms:
        sh = top - _GUARD - est
        if not m or sh <= 0:
            continue
        low = m & ((1 << sh) - 1)
        if not low:
            continue
        j = -(-sh // _TAIL_BITS)
        v = low << (_TAIL_BITS * j - sh)
        if neg:
            limbs[0] += 1
            v = -v
        limbs[j] += v
    return (limbs[0], limbs[1], limbs[2], limbs[3])


def _tail_value(total: int, tail: Sequence[int], lsb: int) -> Fraction:
    """The exact ``sum * 2^L + tail`` (ExactSum.roundOf's value before ``/ den``)."""
    v = Fraction(total + tail[0]) * _pow2(lsb)
    return v + sum((Fraction(t) * _pow2(lsb - _TAIL_BITS * j) for j, t in enumerate(tail) if j), Fraction(0))


def _enclose(sem: _Sem) -> Enclosure | None:
    if sem.op in _TRANSCENDENTAL_KIND:
        enc = _enclose_transcendental(_TRANSCENDENTAL_KIND[sem.op], sem.bits[0])
        return None if enc is None else Enclosure(*enc)
    if sem.op == "copy":
        neg, m, e = decode(sem.bits[0])
        return Enclosure(-m if neg else m, -m if neg else m, 0, e, 1)
    if sem.op == "count":
        return Enclosure(sem.bits[0], sem.bits[0], 0, 0, 1)
    if sem.op == "div":
        na, ma, xa = decode(sem.bits[0])
        nb, mb, xb = decode(sem.bits[1])
        if mb == 0:
            return None
        v = -ma if na != nb else ma
        return Enclosure(v, v, 0, xa - xb, mb)
    if sem.op == "sqrt":
        neg, m, e = decode(sem.bits[0])
        if m == 0:
            return Enclosure(0, 0, 0, -149, 1)
        if neg:
            return None
        s = 200 + (e & 1)
        big = m << s
        r = math.isqrt(big)
        return Enclosure(r, r if r * r == big else r + 1, 0, (e - s) // 2, 1)
    terms = _packed_terms(sem)
    total, abs_sum, inexact, lsb = _accumulate(terms)
    if not sem.bound:
        return Enclosure(total, total + inexact, 0, lsb, 1)
    enc = _bound_enclosure(sem.op, sem.n, total, abs_sum, inexact, lsb)
    if not inexact:  # lo == hi: the first pass is exact
        return enc
    r_lo, r_hi = _ends(enc)
    if r_lo == r_hi:
        return enc
    return replace(enc, rounded=rn32(_exact_sum(terms) / (sem.n if sem.op == "mean" else 1), True))


def _ends(enc: Enclosure) -> tuple[int, int]:
    """RoundingRule.ends: ``(RN32(lo), RN32(hi))``, saturating."""
    lo, hi, _ = enc.bounds
    return rn32(lo, True), rn32(hi, True)


def _exact_sum(terms: Sequence[tuple[bool, int, int]]) -> Fraction:
    """The exact sum of packed terms ``(-1)^neg * M * 2^(est - 300)`` (the contract's second pass
    computes its RN32 from the floored remainders in limbs; this is the value it rounds)."""
    live = [(neg, m, est) for neg, m, est in terms if m]
    if not live:
        return Fraction(0)
    low = min(est for _, _, est in live)
    total = sum((-m if neg else m) << (est - low) for neg, m, est in live)
    return Fraction(total) * _pow2(low - 300)


def _packed_terms(sem: _Sem) -> list[tuple[bool, int, int]]:
    """The ExactSum terms ``(neg, M, est)`` of a mul/dot/sum/mean element, in term order."""
    if sem.op == "mul":
        return [_product(*sem.bits)]
    if sem.op == "dot":
        b = sem.bits
        terms = [_product(b[2 * i], b[2 * i + 1]) for i in range(len(b) // 2)]
        if sem.bias:
            terms.append(_product(b[-1], ONE))
        return terms
    negs = sem.negate or (False,) * len(sem.bits)
    terms = []
    for x, flip in zip(sem.bits, negs, strict=True):
        neg, m, est = _product(x, ONE)
        terms.append((neg != flip and m != 0, m, est))
    return terms


def _bound_enclosure(op: str, n: int, total: int, abs_sum: int, inexact: int, lsb: int) -> Enclosure:
    """ExactSum.sumEnclosure / meanEnclosure of an accumulation of ``n`` terms."""
    if n > MAX_TERMS:
        raise MalformedOp(f"reduction: expected at most {MAX_TERMS} terms, got {n}")
    if op == "mean":
        f = TWO53 * (TWO53 - n)
        return Enclosure(
            total * f,
            (total + inexact) * f,
            (abs_sum + inexact) * (n * TWO53 + 2 * (TWO53 - n)),
            lsb - 53,
            n * (TWO53 - n),
        )
    den = TWO53 - n
    return Enclosure(total * den, (total + inexact) * den, n * (abs_sum + inexact), lsb, den)


def enclosure(
    desc: Any, tensors: Sequence[np.ndarray], index: int, data: DataContext | None = None
) -> Enclosure | None:
    """The contract's enclosure of ``e`` and its bound; None where ``e`` is undefined."""
    return _enclose(_semantics(OpDesc.of(desc), tensors, index, data))


def reads(desc: Any, tensors: Sequence[np.ndarray], index: int, data: DataContext | None = None) -> list[Read]:
    """The openings the contract expects, in proof order (see Adjudicator's NatSpec). DROPOUT_MASK
    and STEP read nothing (and need no context here)."""
    d = OpDesc.of(desc)
    if d.kind in (OpKind.DROPOUT_MASK, OpKind.STEP) and data is None:
        data = DataContext(None, bytes(32), 1)
    return list(_semantics(d, tensors, index, data).reads)


# ---------------------------------------------------------------------------------------------
# The rule


def judge(enc: Enclosure | None, claimed: int, code: int, value: int = 0) -> bool:
    """The contract's rule (RoundingRule.judge) for an enclosure, a claim and a log entry.

    Every claim must be ``RN32(e)``: ``RN32(lo) <= claimed <= RN32(hi)`` in the FP32 order, whatever
    the code (both ends ``enc.rounded`` where the exact second pass decided); the code's own check
    then says whether the log is consistent with it."""
    if enc is None or not is_finite(claimed) or claimed == SIGN:
        return False
    lo, hi, dc = enc.bounds
    r_lo, r_hi = (enc.rounded, enc.rounded) if enc.rounded is not None else _ends(enc)
    if not to_ordered(r_lo) <= to_ordered(claimed) <= to_ordered(r_hi):
        return False
    if code == NONE:
        return r_lo == claimed and r_hi == claimed
    if code in (DOWN, UP):
        m, s = midpoint(claimed, code == DOWN)
        return 16 * dc <= s and lo - 4 * dc <= m <= hi + 4 * dc
    if code == EXPLICIT:
        return claimed == value
    return False


def has_no_finite_value(enc: Enclosure | None) -> bool:
    """True when no finite claim can stand for enclosure ``enc`` (None: ``e`` is undefined, e.g. a
    division by zero, log of x <= 0, sqrt of a negative, exp(x) for x >= 89): ``e`` is undefined or
    ``RN32(e)`` overflows to +-inf at both ends (the exact second pass's value where it decided).
    The honest trainer never posts such an element (it stops with NonFiniteValue), so an auditor
    disputes it: the rule (:func:`judge`, RoundingRule.judgeEnds) rejects every claim there."""
    if enc is None:
        return True
    r_lo, r_hi = (enc.rounded, enc.rounded) if enc.rounded is not None else _ends(enc)
    return r_lo == r_hi and not is_finite(r_lo)


def no_finite_value(
    desc: Any, tensors: Sequence[np.ndarray], index: int, data: DataContext | None = None
) -> bool:
    """:func:`has_no_finite_value` of element ``index``: its correct value is not a finite FP32 value."""
    return has_no_finite_value(enclosure(desc, tensors, index, data))


def judge_element(
    desc: Any,
    tensors: Sequence[np.ndarray],
    index: int,
    claimed_bits: int,
    entry: LogEntry | None,
    data: DataContext | None = None,
) -> bool:
    """What ``Adjudicator.adjudicate`` returns for element ``index`` with a well-formed proof:
    True when ``claimed_bits`` stands under the rule with the log ``entry`` (None: no entry)."""
    if entry is not None and entry.index != index:
        raise ValueError(f"entry: expected one for element {index}, got {entry.index}")
    code, value = (entry.code, entry.value_bits) if entry is not None else (NONE, 0)
    return judge(enclosure(desc, tensors, index, data), claimed_bits, code, value)


# ---------------------------------------------------------------------------------------------
# Chunk level of long reductions (mirror of contracts/lib/ChunkedSum.sol and ChunkAdjudicator.sol)

#: Reductions (MATMUL, SUM, MEAN) of more terms than this are ruled from per-chunk partials.
MAX_DIRECT_TERMS = 4096
#: Terms per chunk of the chunk level (the last chunk may be short).
CHUNK_TERMS = 2048
#: Most chunks of one element (the accumulator's headroom over the chunk size).
MAX_CHUNKS = MAX_TERMS // CHUNK_TERMS


@dataclass(frozen=True)
class Partial:
    """One chunk's share of an element's ExactSum accumulation, in quanta ``2^(E - 372)`` with
    ``E`` the largest ``max_exp`` of the element's chunks (``GameTypes.Partial``); ``tail``: the
    exact rest of its floored terms (ExactSum.tailAt, four limbs; zeros when ``inexact`` is 0)."""

    max_exp: int
    sum: int
    abs_sum: int
    inexact: int
    tail: tuple[int, int, int, int] = (0, 0, 0, 0)

    def as_tuple(self) -> tuple[int, int, int, int, list[int]]:
        """The ABI tuple ``(maxExp, sum, absSum, inexact, tail)``."""
        return (self.max_exp, self.sum, self.abs_sum, self.inexact, list(self.tail))

    @classmethod
    def of(cls, t: Any) -> Partial:
        """From the ABI tuple or a decoded struct (a mapping with the Solidity field names)."""
        if isinstance(t, Mapping):
            t = (t["maxExp"], t["sum"], t["absSum"], t["inexact"], t["tail"])
        if len(t) != 5 or len(t[4]) != _TAIL_LIMBS:
            raise MalformedOp(f"partial: expected (maxExp, sum, absSum, inexact, tail[{_TAIL_LIMBS}]), got {t!r}")
        tail = tuple(int(x) for x in t[4])
        return cls(int(t[0]), int(t[1]), int(t[2]), int(t[3]), (tail[0], tail[1], tail[2], tail[3]))


def reduction_terms(desc: Any) -> int:
    """``ChunkAdjudicator.terms``: the term count of a well-formed MATMUL (K, +1 with a bias), SUM or
    MEAN descriptor; 0 for other kinds and malformed descriptors."""
    d = OpDesc.of(desc)
    k, shape, ins = d.kind, d.shape, d.in_shapes
    if k not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN) or len(ins) != len(d.inputs):
        return 0
    if not shape or len(shape) > 6:
        return 0
    r = len(shape)
    if k != OpKind.MATMUL:
        if len(ins) != 1 or not _same_except(ins[0], shape, r - 1) or shape[-1] != 1 or ins[0][-1] == 0:
            return 0
        return ins[0][-1]
    if len(ins) not in (2, 3) or r < 2:
        return 0
    sa, sb = ins[0], ins[1]
    if len(sa) != r or len(sb) != r or sa[:-2] != shape[:-2] or sb[:-2] != shape[:-2]:
        return 0
    m, n_cols, kk = shape[-2], shape[-1], sa[-1]
    if sa[-2] != m or kk == 0 or sb[-2] != n_cols or sb[-1] != kk or m == 0 or n_cols == 0:
        return 0
    if len(ins) == 3 and tuple(ins[2]) != (n_cols,):
        return 0
    return kk + (len(ins) == 3)


def is_chunked(desc: Any) -> bool:
    """True when an element of this op is ruled through the chunk level (more than MAX_DIRECT_TERMS terms)."""
    return reduction_terms(desc) > MAX_DIRECT_TERMS


def chunk_count(n: int) -> int:
    """Number of chunks of an ``n``-term element."""
    return (n + CHUNK_TERMS - 1) // CHUNK_TERMS


def _partial_at(terms: Sequence[tuple[bool, int, int]], top: int) -> Partial:
    """ChunkedSum.partialAt: the chunk's partial at the element's scale ``top``."""
    mine = _max_est(terms)
    if mine == 0 or mine > top:
        return Partial(mine, 0, 0, 0)
    total, abs_sum, inexact = _sum_at(terms, top)
    return Partial(mine, total, abs_sum, inexact, _tail_at(terms, top) if inexact else (0, 0, 0, 0))


def _reduction_sem(desc: Any, tensors: Sequence[np.ndarray], index: int) -> tuple[OpDesc, _Sem]:
    d = OpDesc.of(desc)
    if reduction_terms(d) == 0:
        raise MalformedOp(f"chunk level: op kind {d.kind} is not a well-formed MATMUL/SUM/MEAN")
    return d, _semantics(d, tensors, index, None)


def element_partials(desc: Any, tensors: Sequence[np.ndarray], index: int, scale: int | None = None) -> list[Partial]:
    """The partials of element ``index``, one per chunk of CHUNK_TERMS terms, at the element's own
    scale (``scale=None``: what an honest trainer posts) or at a given one (what the contract
    recomputes against posted partials whose largest ``max_exp`` is ``scale``)."""
    _, sem = _reduction_sem(desc, tensors, index)
    terms = _packed_terms(sem)
    if len(terms) > MAX_TERMS:
        raise MalformedOp(f"reduction: expected at most {MAX_TERMS} terms, got {len(terms)}")
    top = max((est for _, m, est in terms if m), default=0) if scale is None else scale
    return [_partial_at(terms[c * CHUNK_TERMS : (c + 1) * CHUNK_TERMS], top) for c in range(chunk_count(len(terms)))]


def partials_scale(partials: Sequence[Partial]) -> int:
    """ChunkedSum.scale: the largest posted ``max_exp``."""
    return max((p.max_exp for p in partials), default=0)


def chunk_partial(desc: Any, tensors: Sequence[np.ndarray], index: int, chunk: int, scale: int) -> Partial:
    """``ChunkAdjudicator.checkChunk``'s recomputation of chunk ``chunk`` at ``scale``."""
    _, sem = _reduction_sem(desc, tensors, index)
    terms = _packed_terms(sem)
    return _partial_at(terms[chunk * CHUNK_TERMS : (chunk + 1) * CHUNK_TERMS], scale)


def first_wrong_chunk(desc: Any, tensors: Sequence[np.ndarray], index: int, posted: Sequence[Partial]) -> int | None:
    """The first posted partial that differs from its recomputation at the posted scale (what a
    challenger disputes), or None when every chunk stands."""
    mine = element_partials(desc, tensors, index, partials_scale(posted))
    if len(mine) != len(posted):
        raise MalformedOp(f"partials: expected {len(mine)}, got {len(posted)}")
    return next((c for c, (a, b) in enumerate(zip(mine, posted, strict=True)) if a != b), None)


def partials_enclosure(desc: Any, partials: Sequence[Partial]) -> Enclosure:
    """``ChunkAdjudicator.ruleFromPartials``'s enclosure: the partials summed (ChunkedSum.total) and
    bounded as the one-transaction ruling would (MEAN: meanEnclosure, else sumEnclosure); where its
    ends round apart, ``rounded`` is RN32 of the exact value the partials' tails give."""
    d = OpDesc.of(desc)
    n = reduction_terms(d)
    if n == 0 or len(partials) != chunk_count(n):
        raise MalformedOp(f"partials: expected {chunk_count(n)} for {n} terms, got {len(partials)}")
    top = partials_scale(partials)
    if top == 0:
        total = abs_sum = inexact = lsb = 0
    else:
        total = sum(p.sum for p in partials)
        abs_sum = sum(p.abs_sum for p in partials)
        inexact = sum(p.inexact for p in partials)
        lsb = top - _LSB_OFFSET
    mean = d.kind == OpKind.MEAN
    enc = _bound_enclosure("mean" if mean else "sum", n, total, abs_sum, inexact, lsb)
    if not inexact:
        return enc
    r_lo, r_hi = _ends(enc)
    if r_lo == r_hi:
        return enc
    tail = [sum(p.tail[j] for p in partials) for j in range(_TAIL_LIMBS)]
    return replace(enc, rounded=rn32(_tail_value(total, tail, lsb) / (n if mean else 1), True))


def judge_partials(
    desc: Any, partials: Sequence[Partial], index: int, claimed_bits: int, entry: LogEntry | None
) -> bool:
    """What ``ChunkAdjudicator.ruleFromPartials`` returns for a well-formed log opening."""
    if entry is not None and entry.index != index:
        raise ValueError(f"entry: expected one for element {index}, got {entry.index}")
    code, value = (entry.code, entry.value_bits) if entry is not None else (NONE, 0)
    return judge(partials_enclosure(desc, partials), claimed_bits, code, value)


def chunk_reads(desc: Any, tensors: Sequence[np.ndarray], index: int, chunk: int) -> list[Read]:
    """The openings ``checkChunk`` expects for chunk ``chunk``, in proof order: the chunk's segment of
    a's row and of b's (MATMUL) or of the reduced row (SUM/MEAN), then bias[j] when the chunk
    holds the bias term."""
    d, sem = _reduction_sem(desc, tensors, index)
    n = reduction_terms(d)
    if not 0 <= chunk < chunk_count(n):
        raise MalformedOp(f"chunk: expected 0 <= chunk < {chunk_count(n)}, got {chunk}")
    lo = chunk * CHUNK_TERMS
    hi = min(lo + CHUNK_TERMS, n)
    rows = sem.reads[:2] if d.kind == OpKind.MATMUL else sem.reads[:1]
    k = rows[0].length
    out: list[Read] = []
    row_end = min(hi, k)
    if lo < row_end:
        out += [Read(r.input, r.start + lo, row_end - lo) for r in rows]
    if sem.bias and hi == n:
        out.append(sem.reads[2])
    return out
