"""The canonical rounding log: the trainer's log as a function of the exact values alone.

The certified rule (``rounding.round_output``) decides from the trainer's own FP64 value ``v``:
two honest trainers whose FP64 sums differ in the last bits (another summation order, another
device, a data-parallel all-reduce) may log a near-tie on different sides, or store different
explicit values, and then produce different bits. Here every decision is taken on the exact value
``e`` instead, so the output and the log are the same for every FP64 evaluation that meets the
certified bound: on any hardware, in any summation order, at any world size.

For one output element with exact value ``e``, contract bound ``dc`` and canonical bound ``Dc``
(an upper bound of every honest FP64 evaluation's bound ``d``, a function of the exact terms):

* ``c = RN32(e)`` is the output (always the correctly rounded value);
* no entry when neither midpoint next to ``c`` is within ``2 Dc`` of ``e``;
* ``down``/``up`` when exactly one is, ``16 Dc <= s`` (its pair's spacing) and ``Dc <= 2 dc``
  (the contract's window ``4 dc`` then covers ``2 Dc``); the code names the side ``c`` is on;
* ``explicit`` (value ``c``) otherwise;
* except that an *exact-grid* sum (:func:`grid_exact`: all terms on one grid ``2^q`` with
  ``sum|t_k| < 2^(53+q)``) never has an entry: every honest FP64 evaluation of it is exact, so
  ``RN32(v) = c`` even at an exact midpoint.

The trainer finds the elements that may need an entry from its own ``v`` and ``d``: any element
with a midpoint within ``2 Dc`` of ``e`` has one within ``d + 2 Dc <= 4 d`` of ``v`` (``Dc <= 1.5 d``,
docs/numerics.md), so only elements within ``4 d`` of a midpoint are evaluated exactly; for all
others ``RN32(v) = RN32(e)`` and no entry is due (MATMUL candidates are filtered again with the tight
bound from their own terms). Exact-grid candidates are decided from their exact FP64 sum; the others
by a vectorised double-double sum (one C call per op where the native kernels are loaded,
:mod:`vtrain.numerics.native_rows`; the numpy path is its reference) whose error bound decides
almost every comparison; an undecided one (an exact
tie, or ``e`` closer to a threshold than about ``n u^2 S``) falls back to exact rational arithmetic
(:mod:`vtrain.numerics.exact`). Replay is unchanged (``rounding.apply_log``), and every entry is
one the contract upholds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from vtrain.errors import NonFiniteValue
from vtrain.graph.step_graph import Graph, OpKind, OpNode
from vtrain.numerics import exact as X
from vtrain.numerics import fp32_native, native_replay, native_rows
from vtrain.numerics import native_filter as NF
from vtrain.numerics.rounding import (
    _CMP_SLACK,
    _SMALL,
    FAR_REACH,
    NO_ENTRIES,
    REPLAY_SCALE,
    TRAINER_BOUND_SLACK,
    Code,
    OpLog,
    U,
    _check_finite,
    _neighbours,
    gamma,
    midpoint_candidates,
    midpoint_candidates_np,
)
from vtrain.numerics.scratch import Scratch

#: Candidates: elements whose FP64 value is within this many bounds ``d`` of a midpoint.
CANDIDATE_BAND = 4.0
#: The canonical bound over the contract's for sums (covers the trainer's FP32 estimate of ``S``
#: times 1.01 plus the rounding of that estimate, for ``n < 2^20``: docs/numerics.md).
_SUM_RATIO = Fraction(5, 4)
#: Transcendental ops: ``Dc = 4u |e| (1 + 2^-40)`` bounds the trainer's ``4u |v|`` (ERF: ``8u``).
_TRANS_RATIO = 1 + Fraction(1, 1 << 40)
_SUBNORMAL = Fraction(1, 1 << 149)
_KINDS = {OpKind.MATMUL, OpKind.SUM, OpKind.MEAN, OpKind.EXP, OpKind.LOG, OpKind.TANH, OpKind.ERF}


@dataclass(frozen=True)
class ExactElement:
    """What the canonical decision needs of one element: ``e``, ``dc`` and ``Dc``."""

    value: Fraction
    dc: Fraction
    Dc: Fraction
    grid: bool = False  # an exact-grid sum (:func:`on_grid`): every honest evaluation is exact


def on_grid(kind: OpKind, terms: list[Fraction]) -> bool:
    """The exact-grid rule on exact rational terms (the reference of :func:`grid_exact`): every
    non-zero term a multiple of ``2^q`` and ``sum|t_k| < 2^(53+q)``; MEAN only for ``n = 2^k``."""
    n = len(terms)
    if kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN) or (kind == OpKind.MEAN and n & (n - 1)):
        return False
    nz = [t for t in terms if t]
    if not nz:
        return True

    def v2(x: int) -> int:
        return (x & -x).bit_length() - 1

    q = min(v2(abs(t.numerator)) - v2(t.denominator) for t in nz)  # FP values: power-of-two denominators
    s = sum((abs(t) for t in nz), Fraction(0))
    return s < (Fraction(2) ** (53 + q))


def op_desc(graph: Graph, op: OpNode) -> X.OpDesc:
    """The op's descriptor as :mod:`vtrain.numerics.exact` reads it (no CONST roots needed here)."""
    return X.OpDesc(int(op.kind), tuple(op.inputs), tuple(op.shape),
                    tuple(tuple(s) for s in graph.in_shapes(op)), tuple(op.attrs))


def exact_element(desc: X.OpDesc, tensors: list[np.ndarray], index: int) -> ExactElement:
    """``e``, ``dc`` and ``Dc`` of element ``index``, in exact rational arithmetic."""
    e = X.exact_value(desc, tensors, index)
    dc = X.contract_bound(desc, tensors, index)
    kind = OpKind(desc.kind)
    if kind in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
        terms = X._terms(X._semantics(X.OpDesc.of(desc), tensors, index, None))
        grid = on_grid(kind, terms)
    else:
        grid = False
    if kind in (OpKind.EXP, OpKind.LOG, OpKind.TANH, OpKind.ERF):
        big = (8 if kind == OpKind.ERF else 4) * abs(e) * _TRANS_RATIO / X.TWO53
        return ExactElement(e, dc, max(big, dc))
    if kind == OpKind.MATMUL:
        n = desc.in_shapes[0][-1] + (len(desc.inputs) == 3)
        g = Fraction(n, X.TWO53 - n)
        s = dc / g if g else Fraction(0)
        return ExactElement(e, dc, _SUM_RATIO * g * (s + n * _SUBNORMAL), grid)
    return ExactElement(e, dc, _SUM_RATIO * dc, grid)


def decide(el: ExactElement) -> tuple[int, int]:
    """``(bits, code)``: the canonical output (RN32 of ``e``) and its log code (docs above)."""
    c = X.rn32(el.value)
    if el.grid:
        return c, int(Code.NONE)
    m_lo, s_lo = X.midpoint(c, above=False)
    m_hi, s_hi = X.midpoint(c, above=True)
    reach = 2 * el.Dc
    near_lo = el.value - m_lo <= reach
    near_hi = m_hi - el.value <= reach
    if not (near_lo or near_hi):
        return c, int(Code.NONE)
    if near_lo and near_hi:
        return c, int(Code.EXPLICIT)
    s = s_hi if near_hi else s_lo
    if 16 * el.Dc <= s and el.Dc <= 2 * el.dc:
        return c, int(Code.DOWN if near_hi else Code.UP)  # near_hi: c is the lower of the pair
    return c, int(Code.EXPLICIT)


def candidates(v: torch.Tensor, d: NF.Bound, rf: torch.Tensor | None = None) -> torch.Tensor:
    """Flat indices of elements whose ``v`` may be within ``CANDIDATE_BAND * d`` of a midpoint: a
    superset of those with ``fl(m - v) <= reach`` for either midpoint ``m`` (the rounding module's
    fast filter, ``midpoint_candidates``: ``fl(h - |v - RN32(v)|)`` with ``h`` the smaller half gap is at
    most either ``fl(m - v)``; about 3x faster than comparing against both neighbours). Extra
    candidates are decided exactly too, so they never change an output or an entry. ``rf``: ``v`` in
    FP32 when the caller has it. Small CPU tensors run the same IEEE operations in numpy (torch's
    fixed cost per call dominates there); the native filter (``native_filter``) where it takes ``v``."""
    if NF.usable(v):
        return torch.from_numpy(NF.round_filter(v, d, _BAND)[1])
    d = NF.dense(d)
    vf, df = v.reshape(-1), d.reshape(-1)
    rf = vf.to(torch.float32) if rf is None else rf.reshape(-1)
    n = vf.numel()
    if vf.device.type == "cpu" and n <= _SMALL:
        return torch.from_numpy(_candidates_np(vf.numpy(), df.numpy(), rf.numpy()))
    if vf.device.type == "cpu" and n > 2 * _CHUNK:  # in cache-sized pieces: elementwise, the same set
        parts = []
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            found = midpoint_candidates(vf[lo:hi], rf[lo:hi], df[lo:hi] * _BAND)
            if found is not None:
                parts.append(found.add_(lo))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    found = midpoint_candidates(vf, rf, df * _BAND)
    return torch.zeros(0, dtype=torch.int64, device=v.device) if found is None else found


#: Elements per piece of the CPU candidate filter on large ops: its dozen elementwise passes then
#: run in cache on reused buffers instead of faulting in fresh pages (about 5x faster at 10^6).
_CHUNK = 1 << 15


#: ``CANDIDATE_BAND (1 + 2^-30)``: one product per element (the band's doubling is exact).
_BAND = CANDIDATE_BAND * (1.0 + 2.0**-30)


_NO_ENTRIES = NO_ENTRIES  # (the trainer's hot paths return it instead of a fresh OpLog.empty())


def _candidates_np(vf: np.ndarray, df: np.ndarray, rf: np.ndarray) -> np.ndarray:
    """:func:`midpoint_candidates` in numpy on flat arrays: ``fl(fl(h - |v - r|) - reach) <= 0``."""
    return midpoint_candidates_np(vf, rf, df * _BAND)


def round_candidates(v: torch.Tensor, d: NF.Bound) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(r, candidates, finite)``: ``r = RN32(v)`` with canonical zeros, :func:`candidates`, and
    True only where every ``r`` is known finite (the native filter says so in the same pass; the
    caller checks otherwise). One fused pass where the native filter takes ``v``."""
    if NF.usable(v):
        r, cand, finite = NF.round_filter(v, d, _BAND)
        return r, torch.from_numpy(cand), finite
    r = v.to(torch.float32).add_(0.0)  # canonical zeros in place (the filter reads -0 as +0)
    return r, candidates(v, NF.dense(d), r), False


def round_canonical(
    graph: Graph, op: OpNode, ins: list[torch.Tensor], v: torch.Tensor, d: NF.Bound, what: str
) -> tuple[torch.Tensor, OpLog, int]:
    """Trainer side: the canonical FP32 output and log entries of a logging op (``v``, ``d`` its FP64
    value and certified bound, dense or lazy: only the candidate filter reads it); also returns how
    many candidates fell back to exact arithmetic."""
    r, cand, finite = round_candidates(v, d)
    return _round_canonical_at(graph, op, ins, v, r, cand, finite, what)


def sum_bound_factor(kind: OpKind, n: int) -> float:
    """The trainer bound of a SUM/MEAN over ``n`` terms is this times ``sum|x|`` (``executor._compute_fp64``)."""
    if kind == OpKind.SUM:
        return TRAINER_BOUND_SLACK * gamma(n)
    return TRAINER_BOUND_SLACK * (gamma(n) + 2 * U) / n


def round_canonical_sum(
    graph: Graph, op: OpNode, ins: list[torch.Tensor], what: str, scratch: Scratch | None = None
) -> tuple[torch.Tensor, OpLog, int] | None:
    """:func:`round_canonical` of a SUM/MEAN op from its FP32 input alone, its FP64 values, bound,
    candidates and their decisions in one native call (``native_filter.sum_round_decide``: pairwise FP64 sums, a valid
    evaluation within the bound, so the same outputs and log as from torch's ``v``); None where the
    kernel does not apply. ``scratch``: the caller's reusable index buffer."""
    x = ins[0]
    if x.dim() == 0:
        return None
    # the filter and, every r finite, _round_canonical_at's common case (every candidate decided, none
    # due an entry: their bits written) in one native call
    got = NF.sum_round_decide(x, op.kind == OpKind.MEAN, sum_bound_factor(op.kind, x.shape[-1]), _BAND, scratch)
    if got is None:
        return None
    r, cand, finite, attention = got
    if r.shape != op.shape:  # (r: [..., 1], the op's shape where it keeps the summed axis)
        r = r.reshape(op.shape)
    if not len(cand) or attention == 0:  # (no candidate: every r finite; or every one decided, its bits in r)
        return r, _NO_ENTRIES, 0
    return _round_canonical_at(graph, op, ins, None, r, torch.from_numpy(cand.copy()), finite, what,
                               into=False)  # (the decisions, where taken, settled nothing: nothing written)


def sum_round_filter_np(x: np.ndarray, kind: OpKind) -> tuple[np.ndarray, np.ndarray]:
    """The numpy reference of ``native_filter.sum_round_filter`` (``x`` FP32): ``(r, candidates)``."""
    n = x.shape[-1]
    x64 = np.ascontiguousarray(x, dtype=np.float64).reshape(-1, n)
    v = x64.sum(axis=1)
    if kind == OpKind.MEAN:
        v = v / n
    reach = ((np.abs(x64).sum(axis=1) + 0.0) * sum_bound_factor(kind, n)) * _BAND
    with np.errstate(over="ignore", invalid="ignore"):
        rf = v.astype(np.float32) + np.float32(0.0)
    return rf, midpoint_candidates_np(v, rf, reach)


def sum_values_np(x: np.ndarray, kind: OpKind) -> tuple[np.ndarray, np.ndarray]:
    """The numpy reference of ``native_filter.sum_values_filter``'s ``v`` and ``d`` (``x`` FP32): flat
    FP64 arrays, the same pairwise sums as :func:`sum_round_filter_np`."""
    n = x.shape[-1]
    x64 = np.ascontiguousarray(x, dtype=np.float64).reshape(-1, n)
    v = x64.sum(axis=1)
    if kind == OpKind.MEAN:
        v = v / n
    return v, (np.abs(x64).sum(axis=1) + 0.0) * sum_bound_factor(kind, n)


ReplayFiltered = tuple[torch.Tensor, np.ndarray, bool]
"""``(r, candidates, finite)`` of the native filter (``native_filter.round_filter``'s result)."""


class ReplaySum(NamedTuple):
    """What :func:`replay_sum_values` gives: the op's FP64 ``v`` and dense ``d``, the filter's
    ``(r, candidates, finite)``, :func:`grid_elements` of the op (``exact``), the candidates' near-tie
    flags (None where the pass did not make them) and ``settled``: the pass settled the op with its
    entries (``native_replay.sum_values_grid``'s; ``r`` is then the op's final output, and nothing else
    is read: ``v`` and ``d`` keep the kernel's ``[..., 1]`` shape, ``exact`` is None, the candidates
    and flags empty)."""

    v: torch.Tensor
    d: torch.Tensor
    filtered: ReplayFiltered
    exact: Callable[[np.ndarray], np.ndarray] | None
    near: np.ndarray | None
    settled: bool


def replay_sum_values(
    op: OpNode, ins: list[torch.Tensor], entries: OpLog | None = None, mode: int = native_replay.CANDIDATES
) -> ReplaySum | None:
    """The checked replay's FP64 ``v``, dense ``d`` and filter (reach ``d * REPLAY_SCALE``, what
    ``rounding.apply_log`` takes as ``filtered``) of a SUM/MEAN op from its FP32
    input in one native pass (``native_filter.sum_values_filter``: the canonical trainer's sums and
    bound, one value per output element), and :func:`grid_elements` of the op (``rounding.apply_log``'s
    ``exact``), read from that pass at its candidates where it computed them there
    (``native_replay.sum_values_grid``), with the near-tie flags of the candidates (``apply_log``'s
    ``near``; else None) and, with the op's log ``entries``, whether that pass settled the op as
    ``mode`` allows (``native_replay``'s modes); None where the kernel does not apply (the caller
    computes them with torch)."""
    x = ins[0]
    if x.dim() == 0:
        return None
    factor = sum_bound_factor(op.kind, x.shape[-1])
    log = None if entries is None or not len(entries) else (entries.index, entries.code, entries.value)
    got = native_replay.sum_values_grid(x, op.kind == OpKind.MEAN, factor, REPLAY_SCALE, _CMP_SLACK, log, mode,
                                        FAR_REACH)
    near: np.ndarray | None = None
    settled = False
    if got is not None:
        v, d, r, cand, finite, grid, near, settled = got
        if settled:  # (r is the op's output: the checks read nothing)
            return ReplaySum(v, d, (r.reshape(op.shape), cand, finite), None, near, True)
        exact: Callable[[np.ndarray], np.ndarray] = _GridAt(op, ins, cand, grid)
    else:
        fil = NF.sum_values_filter(x, op.kind == OpKind.MEAN, factor, REPLAY_SCALE)
        if fil is None:
            return None
        v, d, r, cand, finite = fil
        exact = partial(grid_elements, op, ins)
    return ReplaySum(v.reshape(op.shape), d.reshape(op.shape), (r.reshape(op.shape), cand, finite), exact, near,
                     settled)


class _GridAt:
    """:func:`grid_elements` of ``op`` read from ``grid`` (its values at the sorted flat indices ``at``),
    :func:`grid_elements` itself at any other index (the same function)."""

    def __init__(self, op: OpNode, ins: list[torch.Tensor], at: np.ndarray, grid: np.ndarray) -> None:
        self.op, self.ins, self.at, self.grid = op, ins, at, grid

    def __call__(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, np.int64)
        if not len(index) or not len(self.at):
            return grid_elements(self.op, self.ins, index)
        pos = np.minimum(np.searchsorted(self.at, index), len(self.at) - 1)
        held = self.at[pos] == index
        if bool(held.all()):
            return self.grid[pos]
        out = np.zeros(len(index), dtype=bool)
        out[held] = self.grid[pos[held]]
        out[~held] = grid_elements(self.op, self.ins, index[~held])
        return out


#: The smallest FP32 subnormal as a float (the trainer bounds' ``n * 2^-149`` underflow term).
SUBNORMAL_F32 = 2.0**-149


def norm_bound_factor(n: int) -> float:
    """The factor of the trainer's Cauchy-Schwarz MATMUL bound over ``n`` terms (bias included): the
    tight bound's ``TRAINER_BOUND_SLACK * gamma(n)`` times ``1 + (n + 4) 2^-52`` for the FP64 norms'
    own rounding (``executor._norm_bound``, :func:`round_canonical_matmul`)."""
    return TRAINER_BOUND_SLACK * gamma(n) * (1.0 + (n + 4) * 2.0**-52)


class ReplayMatmul(NamedTuple):
    """What :func:`replay_matmul_norm` gives: the bound ``d`` the checks read, the filter's ``(r,
    candidates, finite)``, the candidates' near-tie flags (None where the kernel did not make them) and
    ``settled``: the kernel settled the op with its entries (``r`` is then the op's final output, and
    nothing else is read: ``d`` None, the candidates empty)."""

    d: NF.PointBound | NF.NormBound | None
    filtered: ReplayFiltered
    near: np.ndarray | None
    settled: bool


def replay_matmul_norm(
    ins: list[torch.Tensor], v: torch.Tensor, entries: OpLog, mode: int = native_replay.CANDIDATES
) -> ReplayMatmul | None:
    """The checked replay's MATMUL bound and filter from its FP64 products ``v`` (C-contiguous,
    *without* the bias: added here in place, as ``v.add_(bias.double())``) in one native call
    (``native_replay.matmul_norm_filter``): ``(d, (r, candidates, finite))`` with ``r = RN32(v)``, the
    candidates of the norm bound ``executor._norm_bound`` at reach ``d_norm * REPLAY_SCALE`` and ``d``
    the bound the checks read, ``min(d_norm, tight_bound_at)``, at the candidates and the ``entries``'
    indices: the same bits as the lazy ``NormBound`` with ``tight=tight_bound_at`` (tested), with
    :func:`grid_elements` there (``PointBound.grid_at``), the near-tie flags of the candidates
    under that ``d`` (``apply_log``'s ``near``) and whether the kernel settled the op with its entries
    as ``mode`` allows (``native_replay``'s modes; ``r`` then holds the entries' values). Where there are
    more points than the kernel keeps, ``d`` is that lazy ``NormBound`` (the caller reads
    ``tight_bound_at`` itself; no flags, not settled). None where the kernel does not take the tensors
    (``v`` untouched)."""
    shape = native_rows.matmul_operands(ins, v) if NF.usable(v) else None  # apply_log's native path takes v
    if shape is None:
        return None
    n = ins[0].shape[-1] + (len(ins) == 3)
    log = (entries.index, entries.code, entries.value) if len(entries) else None
    sub, factor, coef = _matmul_consts(n)  # (n SUBNORMAL_F32, norm_bound_factor(n), the tight bound's coefficient)
    got = native_replay.matmul_norm_filter(ins, v, shape, log, sub, factor, REPLAY_SCALE, coef, n * 2.0**-149,
                                           _CMP_SLACK, mode, FAR_REACH)
    if got is None:
        return None
    r, cand, finite, points, settled = got
    if settled:  # (r is the op's output: the checks read nothing)
        return ReplayMatmul(None, (r, cand, finite), None, True)
    if points is None:  # more points than the kernel keeps: the lazy norm bound (v has its bias now)
        x = [*ins[:2], *(t.double() for t in ins[2:])]  # the norms read ins; only the bias is read as FP64
        return ReplayMatmul(NF.norm_bound(x, v, norm_bound_factor(n), n * SUBNORMAL_F32, ins), (r, cand, finite),
                            None, False)
    at = np.concatenate([cand, np.asarray(entries.index, dtype=np.int64)])
    return ReplayMatmul(NF.PointBound(at, points[0], points[1]), (r, cand, finite), points[2], settled)


_MATMUL_CONSTS: dict[int, tuple[float, float, float]] = {}
"""``(sub, factor, coef)`` of :func:`round_canonical_matmul` by term count (a graph has a few)."""


class MatmulPlan(NamedTuple):
    """What :func:`round_canonical_matmul` works out for a MATMUL of fixed operand shapes, once
    (:func:`matmul_plan`): ``native_rows.matmul_operands``' ``(batches, m, k, ncols)`` and the bound's
    ``(sub, factor, coef)``."""

    shape: tuple[int, int, int, int]
    consts: tuple[float, float, float]


def _matmul_consts(n: int) -> tuple[float, float, float]:
    consts = _MATMUL_CONSTS.get(n)
    if consts is None:
        consts = _MATMUL_CONSTS[n] = (n * SUBNORMAL_F32, norm_bound_factor(n), TRAINER_BOUND_SLACK * gamma(n))
    return consts


def matmul_plan(shapes: list[tuple[int, ...]]) -> MatmulPlan | None:
    """The :class:`MatmulPlan` of a MATMUL whose operands have ``shapes`` (``[..., M, K]``, ``[..., N, K]``,
    optional bias ``[N]``): ``native_rows.matmul_operands``' conditions on the shapes (its products
    ``v``, ``[..., M, N]``, follow from them); None where they fail or the kernels are not loaded."""
    if len(shapes) not in (2, 3) or not native_rows.available():
        return None
    sa, sb = tuple(shapes[0]), tuple(shapes[1])
    nd = len(sa)
    if nd < 2 or len(sb) != nd or sa[:-2] != sb[:-2]:
        return None
    m, k, ncols = sa[-2], sa[-1], sb[-2]
    batches = math.prod(sa[:-2])
    if sb[-1] != k or k == 0 or batches * m * ncols == 0:
        return None
    if len(shapes) == 3 and tuple(shapes[2]) != (ncols,):
        return None
    return MatmulPlan((batches, m, k, ncols), _matmul_consts(k + (len(shapes) == 3)))


def _as_planned(plan: MatmulPlan, ins: list[torch.Tensor], v: torch.Tensor) -> bool:
    """Whether ``ins`` and ``v`` are what ``plan`` was made for, as far as the kernel reads them: FP32
    CPU operands and FP64 C-contiguous CPU products of the planned sizes (their shapes are the
    caller's: the planned ones)."""
    f32 = torch.float32
    for t in ins:
        if t.dtype is not f32 or not t.is_cpu:
            return False
    if v.dtype is not torch.float64 or not v.is_cpu or not v.is_contiguous():
        return False
    batches, m, k, ncols = plan.shape
    return (v.numel() == batches * m * ncols and ins[0].numel() == batches * m * k
            and ins[1].numel() == batches * ncols * k and (len(ins) == 2 or ins[2].numel() == ncols))


def round_canonical_matmul(
    graph: Graph, op: OpNode, ins: list[torch.Tensor], v: torch.Tensor, what: str, plan: MatmulPlan | None = None,
    empty: fp32_native.Empty | None = None, scratch: Scratch | None = None,
) -> tuple[torch.Tensor, OpLog, int] | None:
    """:func:`round_canonical` of a MATMUL under the trainer's norm bound (``executor._norm_bound``)
    from its FP64 products ``v`` (C-contiguous, *without* the bias: it is added here, in place, as
    ``v.add_(bias.double())`` would), the row norms, bias add, filter and decisions in one native call
    (``native_rows.matmul_round_norm``: the same kernels in the same order, so the same bits); the
    rest of :func:`_round_canonical_at` only where a candidate needs it. None where the kernel does
    not take these tensors (``v`` untouched). ``plan``: :func:`matmul_plan` of the operands' shapes
    where the caller has it (then only their dtypes, devices and sizes are checked here). ``empty(shape,
    dtype)`` makes the output buffer (None: ``torch.empty``); ``scratch``: the caller's reusable
    index buffer (:class:`~vtrain.numerics.scratch.Scratch`)."""
    if plan is not None and _as_planned(plan, ins, v):
        shape, consts = plan.shape, plan.consts
    else:
        operands = native_rows.matmul_operands(ins, v)
        if operands is None:
            return None
        shape, consts = operands, _matmul_consts(operands[2] + (len(ins) == 3))
    got = native_rows.matmul_round_norm(ins, v, shape, True, consts[0], consts[1], _BAND, consts[2], empty, scratch)
    if not len(got.cand) or (got.finite and not got.attention):
        return got.r, _NO_ENTRIES, 0
    if got.entries is not None:  # every candidate decided, their bits in r: the entries due
        return got.r, got.entries, 0
    return _round_canonical_at(graph, op, ins, v, got.r, torch.from_numpy(got.cand), got.finite, what,
                               decided=got.decided if got.finite else None, into=False)


def _entries_of(cand: np.ndarray, vals: np.ndarray, codes: np.ndarray) -> OpLog:
    """The log entries of decided candidates (flat indices ``cand``, their FP32 values and codes):
    those with a code, an explicit one storing its value."""
    keep = codes != _CODE_NONE
    if keep.all():  # (the common case: every decided candidate has an entry; no selection to make)
        code = codes.astype(np.uint8)
        value = np.where(code == _CODE_EXPLICIT, vals, _ZERO32)
        return OpLog(cand.astype(np.int64), code, value.astype(np.float32, copy=False))
    if not keep.any():
        return _NO_ENTRIES
    code = codes[keep].astype(np.uint8)
    value = np.where(code == _CODE_EXPLICIT, vals[keep], _ZERO32).astype(np.float32, copy=False)
    return OpLog(cand[keep].astype(np.int64), code, value)


_CODE_NONE, _CODE_EXPLICIT, _ZERO32 = int(Code.NONE), int(Code.EXPLICIT), np.float32(0.0)


def _round_canonical_at(
    graph: Graph, op: OpNode, ins: list[torch.Tensor], v: torch.Tensor | None, r: torch.Tensor,
    cand: torch.Tensor, finite: bool, what: str, decided: native_rows.Decisions | None = None, into: bool = True,
) -> tuple[torch.Tensor, OpLog, int]:
    """:func:`round_canonical` from ``r = RN32(v)`` and the candidates (``v`` read by MATMUL only).
    ``decided``: the candidates' native decisions where the caller has them (:func:`native_rows.decide`'s
    result); ``into`` False: the caller knows that :func:`native_rows.decide_into` would not settle them."""
    if cand.numel() == 0:  # also proves every element finite (a NaN/Inf margin is never > 0)
        return r, _NO_ENTRIES, 0
    overflow = _overflows_to_decide(op, v, r, cand, what) if not finite else None
    if overflow is not None:  # fail fast where the first one truly overflows (a diverged run: many do)
        _decide_exactly(graph, op, ins, overflow[:1], what)
    out = r.reshape(-1)
    got = None
    if into and finite and op.kind in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN) and cand.device.type == "cpu":
        # the common case in one native call: every kept candidate decided, none due an entry
        if native_rows.decide_into(op.kind, ins, cand, out, tight=_tight_args(op, ins, v, out)) == 0:
            return out.reshape(r.shape), _NO_ENTRIES, 0
    if op.kind in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
        got = _decide_candidates(op, ins, v, out, cand, decided)
        if got is None:  # the MATMUL tight bound cleared every candidate
            return out.reshape(r.shape), _NO_ENTRIES, 0
        cand, bits, codes, undecided = got
        slow = np.flatnonzero(undecided)
    else:
        n_c = cand.numel()
        bits = np.zeros(n_c, dtype=np.int64)
        codes = np.zeros(n_c, dtype=np.int64)
        slow = np.arange(n_c)
    cand_np = cand.cpu().numpy()
    if len(slow):
        desc = op_desc(graph, op)
        tensors = [t.detach().cpu().numpy() for t in ins]
        got = _decide_exactly(graph, op, ins, cand_np[slow], what, desc, tensors)
        bits[slow], codes[slow] = got[:, 0], got[:, 1]
    vals = bits.astype(np.uint32).view(np.float32) + np.float32(0.0)  # canonical zeros
    if out.device.type == "cpu":
        out.numpy()[cand_np] = vals  # (out: the fresh contiguous RN32 output, written in place)
    else:
        out[cand] = torch.from_numpy(vals).to(out.device)
    if overflow is not None:  # every FP32 overflow was a candidate and is now RN32(e), finite (else raised above)
        _check_finite(out, what)
    return out.reshape(r.shape), _entries_of(cand_np, vals, codes), len(slow)


def _decide_exactly(
    graph: Graph, op: OpNode, ins: list[torch.Tensor], index: np.ndarray, what: str,
    desc: X.OpDesc | None = None, tensors: list[np.ndarray] | None = None,
) -> np.ndarray:
    """``[len(index), 2]`` int64: :func:`decide` of each element in exact rationals; an element whose
    ``RN32(e)`` overflows raises :class:`NonFiniteValue` naming the op and the element."""
    desc = op_desc(graph, op) if desc is None else desc
    tensors = [t.detach().cpu().numpy() for t in ins] if tensors is None else tensors
    out = np.zeros((len(index), 2), dtype=np.int64)
    for k, i in enumerate(np.asarray(index).tolist()):
        try:
            out[k] = decide(exact_element(desc, tensors, int(i)))
        except NonFiniteValue as e:
            raise NonFiniteValue(f"{what}: expected finite values, got NaN/Inf (element {int(i)}: {e})") from None
    return out


def _overflows_to_decide(
    op: OpNode, v: torch.Tensor | None, r: torch.Tensor, cand: torch.Tensor, what: str
) -> np.ndarray | None:
    """The flat positions (sorted) of the non-finite elements of ``r = RN32(v)`` where they are all
    FP32 overflows of a sum that the exact decision settles, else raise :class:`NonFiniteValue` as
    before (a NaN, a non-finite ``v``, another op kind; None: none after all). A MATMUL/SUM/MEAN of
    finite FP32 values never overflows FP64 (``|t_k| <= 2^256``, ``n < 2^52``), but its ``v`` may
    round to or past the RN32 boundary ``2^128 - 2^103`` while ``e`` is below it (or the reverse):
    ``RN32(v)`` is then no evidence, and ``RN32(e)`` decides. Each such element is a candidate (an
    infinite margin is never > 0), so the decision sets it to ``RN32(e)`` or raises where that
    overflows too."""
    rf = r.reshape(-1)
    if op.kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
        _check_finite(rf, what)
        return None
    bad = (~torch.isfinite(rf)).nonzero().reshape(-1)
    if not bad.numel():
        return None
    if bool(torch.isnan(rf[bad]).any()) or (v is not None and not bool(torch.isfinite(v.reshape(-1)[bad]).all())):
        _check_finite(rf, what)
    if not bool(torch.isin(bad, cand.to(bad.device)).all()):  # pragma: no cover - the filter flags every one
        _check_finite(rf, what)
    return bad.cpu().numpy().astype(np.int64)


# -- the vectorised path: MATMUL, SUM, MEAN --------------------------------------------------------
_Decided = tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]


def _decide_candidates(
    op: OpNode, ins: list[torch.Tensor], v: torch.Tensor, out: torch.Tensor, cand: torch.Tensor,
    decided: native_rows.Decisions | None = None,
) -> _Decided | None:
    """``(cand, bits, codes, undecided)`` of a MATMUL/SUM/MEAN op's candidates (``out`` its FP32
    outputs, ``v`` its FP64 values): MATMUL candidates the tight bound clears are dropped (None when
    none is left); the double-double decision, then ``math.fsum`` on the rows it leaves undecided;
    ``undecided`` rows go to exact rationals. The C kernels (:mod:`vtrain.numerics.native_rows`) on
    CPU tensors when loaded, else the numpy path (the same bits); ``decided``: their result where the
    caller has it."""
    got = decided
    if got is None and cand.device.type == "cpu":
        got = native_rows.decide(op.kind, ins, cand, tight=_tight_args(op, ins, v, out))
    if got is None:
        return _decide_candidates_np(op, ins, v, out, cand)
    kept, bits, codes, ok = got
    if not len(kept):
        return None
    if len(kept) < cand.numel():
        cand = torch.from_numpy(kept)
    undecided = ~ok
    rest = np.flatnonzero(undecided)
    if len(rest):
        tn = _terms(op, ins, cand[torch.from_numpy(rest)])[0].numpy()
        for pos, k in enumerate(rest.tolist()):
            fs = _decide_fsum(op, tn[pos].tolist())
            if fs is not None:
                bits[k], codes[k] = fs
                undecided[k] = False
    return cand, bits, codes, undecided


def _tight_args(op: OpNode, ins: list[torch.Tensor], v: torch.Tensor | None, out: torch.Tensor):
    """``native_rows.decide``'s ``tight`` (the MATMUL re-filter with the tight bound), None for sums."""
    if op.kind != OpKind.MATMUL:
        return None
    n = ins[0].shape[-1] + (len(ins) == 3)
    return (v.reshape(-1), out, TRAINER_BOUND_SLACK * gamma(n), _BAND)


def _decide_candidates_np(
    op: OpNode, ins: list[torch.Tensor], v: torch.Tensor, out: torch.Tensor, cand: torch.Tensor
) -> _Decided | None:
    """:func:`_decide_candidates` in numpy (the specification of the C kernels)."""
    n_c = cand.numel()
    bits = np.zeros(n_c, dtype=np.int64)
    codes = np.zeros(n_c, dtype=np.int64)
    t, n = _terms(op, ins, cand)
    tn = t.numpy()
    s_abs = np.abs(tn).sum(axis=1)
    if op.kind == OpKind.MATMUL:  # drop what the tight bound clears (the trainer's d is the norm bound)
        still = _tight_candidates(tn, n, s_abs, v.reshape(-1)[cand].cpu().numpy(), out[cand].cpu().numpy())
        if len(still) < n_c:
            if not len(still):
                return None
            cand, tn, s_abs = cand[torch.from_numpy(still).to(cand.device)], tn[still], s_abs[still]
            n_c = len(still)
            bits, codes = bits[:n_c], codes[:n_c]
    b, c, ok = _decide_rows_np(op.kind, tn, n, s_abs)
    bits[ok], codes[ok], undecided = b[ok], c[ok], ~ok
    for k in np.flatnonzero(undecided).tolist():
        got = _decide_fsum(op, tn[k].tolist())
        if got is not None:
            bits[k], codes[k] = got
            undecided[k] = False
    return cand, bits, codes, undecided


def _terms(op: OpNode, ins: list[torch.Tensor], cand: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The exact FP64 terms ``[C, n]`` of each candidate element (products of FP32 are exact in FP64)."""
    if op.kind == OpKind.MATMUL:
        a, b = ins[0], ins[1]
        m, kk = a.shape[-2], a.shape[-1]
        n_cols = b.shape[-2]
        a2 = a.reshape(-1, kk)
        b2 = b.reshape(-1, kk)
        j = cand % n_cols
        row = cand // n_cols
        batch = row // m
        t = a2[row].double() * b2[batch * n_cols + j].double()
        if len(ins) == 3:
            t = torch.cat([t, ins[2].reshape(-1)[j].double().unsqueeze(1)], dim=1)
        return t.cpu(), kk + (len(ins) == 3)  # decisions run on the host: only the candidates' rows move
    a = ins[0]
    n = a.shape[-1]
    return a.reshape(-1, n)[cand].double().cpu(), n


def _two_sum(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = x + y
    bp = s - x
    return s, (x - (s - bp)) + (y - bp)


def _dd_sum(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``t`` summed as ``hi + lo`` with an absolute error bound (pairwise TwoSum tree; the
    rounding errors are summed in FP64, whose own error is bounded by ``gamma(n) * sum|err|``)."""
    errs = np.zeros(t.shape[0])
    abs_errs = np.zeros(t.shape[0])
    x = t
    while x.shape[1] > 1:
        if x.shape[1] % 2:
            x = np.concatenate([x, np.zeros((x.shape[0], 1))], axis=1)
        s, e = _two_sum(x[:, 0::2], x[:, 1::2])
        errs = errs + e.sum(axis=1)
        abs_errs = abs_errs + np.abs(e).sum(axis=1)
        x = s
    hi, lo = _two_sum(x[:, 0], errs)
    n = max(2, t.shape[1])
    bound = abs_errs * (4 * n * U) + np.abs(lo) * (4 * U) + 2.0**-1070
    return hi, lo, bound


# -- the exact-grid rule: sums every FP64 evaluation computes exactly --------------------------------
def grid_exact(kind: OpKind, t: torch.Tensor | np.ndarray, s_abs: np.ndarray | None = None) -> torch.Tensor:
    """Rows of exact FP64 terms ``t [C, n]`` (a MATMUL bias is a term) that every honest FP64
    evaluation computes *exactly*: every non-zero term a multiple of ``2^q`` (``q`` the lowest set
    bit over the row) and ``S = sum|t_k| < 2^(53+q)``. Then every partial sum, in any order and
    bracketing (FMA included), is a multiple of ``2^q`` of magnitude ``<= S``, hence an FP64 number,
    so ``v = e`` and ``RN32(v) = RN32(e)`` even at an exact midpoint: no entry is due
    (docs/numerics.md, "The exact-grid rule"). MEAN rows qualify only when ``n`` is a power of two
    (then ``/ n`` and ``* (1/n)`` are exact too).

    Computed as: every term a multiple of ``2^q0``, ``q0 = floor(log2 S) - 52`` (the coarsest grid
    the limit allows: ``S < 2^(53+q)`` means ``q >= q0``), tested as ``t_k / 2^q0`` an integer: the
    division by a power of two is exact (``|t_k| <= fl(S) < 2^(53+q0)``, no overflow; an underflow to
    zero is caught by ``t_k = 0``, any other underflow is not an integer), 40x faster than ``fmod``. ``S`` is the
    FP64 sum ``s_abs`` of ``|t_k|`` in any order: exact when the rule holds; when it does not and
    ``fl(S)`` rounds, ``fl(S) >= 2^(53+q)`` for every grid ``2^q`` of the terms (monotone rounding
    past a power of two), so no row is admitted wrongly. A function of the exact terms alone.
    (numpy inside: the rows are few, torch's fixed cost per call would dominate.)"""
    tn = t.numpy() if isinstance(t, torch.Tensor) else t
    c, n = tn.shape
    if c == 0 or (kind == OpKind.MEAN and n & (n - 1)):
        return torch.zeros(c, dtype=torch.bool)
    if n == 0:
        return torch.ones(c, dtype=torch.bool)
    if s_abs is None:
        s_abs = np.abs(tn).sum(axis=1)
    _, e = np.frexp(s_abs)  # S = m 2^e, 1/2 <= m < 1: floor(log2 S) = e - 1 (e = 0 for S = 0)
    unit = np.ldexp(1.0, e - 53)  # 2^q0 (0 only for S < 2^-1021: then no row qualifies, as fmod by 0 says)
    with np.errstate(invalid="ignore", divide="ignore", under="ignore"):
        x = tn / unit[:, None]
        ok = ((x == np.trunc(x)) & ((x != 0) | (tn == 0))).all(axis=1) & np.isfinite(s_abs) & (unit > 0)
    return torch.from_numpy(ok)


def grid_elements(op: OpNode, ins: list[torch.Tensor], index: np.ndarray) -> np.ndarray:
    """For flat element indices of a MATMUL/SUM/MEAN op (False elsewhere): whether the exact-grid
    rule holds, i.e. every honest FP64 value of the element is its exact value. The replay's
    fallback asks this before it treats an unlogged element near a midpoint as suspect."""
    if op.kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN) or not len(index):
        return np.zeros(len(index), dtype=bool)
    index = np.asarray(index, np.int64)
    got = native_rows.grid(op.kind, ins, index)
    if got is not None:
        return got
    t, _ = _terms(op, ins, torch.from_numpy(index).to(ins[0].device))
    return grid_exact(op.kind, t).numpy()


def tight_bound_at(op: OpNode, ins: list[torch.Tensor], index: np.ndarray) -> np.ndarray:
    """The tight bound ``d' = 1.01 g(n) (fl(S) + n 2^-149)`` of a MATMUL's elements at flat ``index``
    (FP64), ``fl(S)`` the FP64 pairwise sum of ``|t_k|`` over the exact terms (``np.abs(t).sum(axis=1)``
    of :func:`_terms`, as :func:`_tight_candidates`): a function of the exact terms alone, with
    ``|v - e| <= g(n) S <= d'`` and ``Dc <= 1.5 d'``. The checked replay reads it at its candidates
    and entries instead of an FP32 ``|A| @ |B|`` (whose summation order is the BLAS's)."""
    index = np.asarray(index, np.int64)
    n = ins[0].shape[-1] + (len(ins) == 3)
    s_abs = native_replay.matmul_abs_sums(ins, index) if len(index) else np.zeros(0)
    if s_abs is None:
        t, _ = _terms(op, ins, torch.from_numpy(index).to(ins[0].device))
        s_abs = np.abs(t.numpy()).sum(axis=1)
    return (TRAINER_BOUND_SLACK * gamma(n)) * (s_abs + n * 2.0**-149)


def _decide_sums(op: OpNode, ins: list[torch.Tensor], cand: torch.Tensor):
    """Canonical ``(bits, codes, decided)`` of MATMUL/SUM/MEAN candidates; ``decided`` False where
    the double-double estimate is too close to a threshold (those go to exact arithmetic)."""
    t, n = _terms(op, ins, cand)
    return _decide_rows(op.kind, t, n)


def _decide_rows(kind: OpKind, t: torch.Tensor, n: int):
    """:func:`_decide_sums` on the exact terms ``t [C, n]`` of each candidate (any order of terms)."""
    b, c, ok = _decide_rows_np(kind, t.numpy(), n)
    return torch.from_numpy(b), torch.from_numpy(c), torch.from_numpy(ok), t


def _tight_candidates(t: np.ndarray, n: int, s_abs: np.ndarray, vc: np.ndarray, rc: np.ndarray) -> np.ndarray:
    """Positions among MATMUL candidates (exact terms ``t``, their FP64 ``sum|t_k|`` ``s_abs``, FP64
    values ``vc``, FP32 outputs ``rc``) that stay candidates under the tight bound ``d' = 1.01 g(n)
    (fl(S) + n 2^-149)``: ``|v - e| <= g(n) S <= d'`` and ``Dc <= 1.5 d'`` (docs/numerics.md), so the
    others need no entry and keep ``RN32(v) = RN32(e)``: two valid candidate sets, intersected."""
    d = (TRAINER_BOUND_SLACK * gamma(n)) * (s_abs + n * 2.0**-149)
    return _candidates_np(vc, d, rc)


def _decide_rows_np(
    kind: OpKind, t: np.ndarray, n: int, s_abs: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_decide_rows` in numpy: ``(bits int64, codes int64, decided bool)`` per row.

    Exact-grid rows first (:func:`grid_exact`): there any FP64 sum of the row is ``e`` exactly, so
    ``c = RN32(e)`` (``e / n`` for MEAN, exact for ``n = 2^k``) and no entry; the double-double
    comparison runs on the other rows only. Each decision is the exact one (docs/numerics.md)."""
    n_c = t.shape[0]
    scale = float(n) if kind == OpKind.MEAN else 1.0  # compare n*e with n*m for MEAN (n*m is exact in FP64)
    if s_abs is None:
        s_abs = np.abs(t).sum(axis=1)  # S within gamma(n) relative; exact on grid rows
    bits = np.zeros(n_c, dtype=np.int64)
    code = np.full(n_c, int(Code.NONE), dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        grid = np.asarray(grid_exact(kind, t, s_abs), dtype=bool).copy()
        if grid.any():
            g32 = (t[grid].sum(axis=1) / scale).astype(np.float32)  # exact sum on the grid
            fin = np.isfinite(g32)
            where = np.flatnonzero(grid)
            grid[where[~fin]] = False
            bits[where[fin]] = (g32[fin] + np.float32(0.0)).view(np.uint32).astype(np.int64)
        decided = grid.copy()
        rest = np.flatnonzero(~grid)
        if len(rest):
            b, c, ok = _decide_dd(kind, t[rest], s_abs[rest], n, scale)
            bits[rest], code[rest], decided[rest] = b, c, ok
    return bits, code, decided


def _decide_dd(kind: OpKind, t: np.ndarray, s_abs: np.ndarray, n: int, scale: float):
    """The double-double decision of rows ``t`` (``s_abs`` their FP64 ``sum|t_k|``): ``(bits, codes,
    decided)``, ``decided`` False where the estimate is too close to a threshold to call."""
    hi, lo, err = _dd_sum(t)  # the exact sum is hi + lo +- err
    s_rel = 2 * n * U
    g = n * U / (1 - n * U)
    if kind == OpKind.MATMUL:
        dc = g * s_abs
        big = 1.25 * g * (s_abs + n * 2.0**-149)
    elif kind == OpKind.SUM:
        dc = g * s_abs
        big = 1.25 * dc
    else:
        dc = (g + 2 * U) * s_abs / n
        big = 1.25 * dc
    est = (hi + lo) / scale
    c32 = est.astype(np.float32)
    inf = np.float32(np.inf)
    lo_n, hi_n = np.nextafter(c32, -inf), np.nextafter(c32, inf)
    c64 = c32.astype(np.float64)
    lo64, hi64 = lo_n.astype(np.float64), hi_n.astype(np.float64)
    m_lo = (c64 + lo64) * 0.5
    m_hi = (c64 + hi64) * 0.5
    # distances n*(e - m_lo) and n*(m_hi - e) from the double-double sum (exact differences where
    # Sterbenz applies; the bound covers the rest)
    d_lo = (hi - m_lo * scale) + lo
    d_hi = (m_hi * scale - hi) - lo
    derr = err + 4 * U * (np.maximum(np.abs(d_lo), np.abs(d_hi)) + np.abs(lo))
    reach = 2 * big * scale
    slack = reach * (s_rel + 2.0**-40)  # the bound estimates' own error, relative
    margin = derr + slack
    inside = (d_lo > margin) & (d_hi > margin)  # e strictly between the midpoints: c is RN32(e)
    near_lo = d_lo <= reach
    near_hi = d_hi <= reach
    clear = (np.abs(d_lo - reach) > margin) & (np.abs(d_hi - reach) > margin)
    spacing = np.where(near_hi, hi64 - c64, c64 - lo64)
    dir_ok = (16 * big <= spacing * (1 - 2.0**-30)) & (big <= 2 * dc * (1 - 2.0**-30))
    dir_clear = (np.abs(16 * big - spacing) > 16 * big * 2.0**-29) & (np.abs(big - 2 * dc) > big * 2.0**-29)
    decided = inside & clear & dir_clear & np.isfinite(c32)
    code = np.full(len(hi), int(Code.NONE), dtype=np.int64)
    code[near_lo & near_hi] = int(Code.EXPLICIT)
    single = near_lo ^ near_hi
    directed = np.where(near_hi, int(Code.DOWN), int(Code.UP))
    code = np.where(single, np.where(dir_ok, directed, int(Code.EXPLICIT)), code)
    bits = (c32 + np.float32(0.0)).view(np.uint32).astype(np.int64)
    return bits, code.astype(np.int64), decided


_FLT_MAX = float(np.finfo(np.float32).max)
#: The virtual FP32 neighbour beyond FLT_MAX (the contract's ``exact.midpoint``): RN32 overflows at
#: the midpoint ``2^128 - 2^103`` between it and FLT_MAX, so near-overflow decisions compare with that.
_VIRTUAL_INF = 2.0**128


def _neighbours_virtual(c: np.float32) -> tuple[float, float]:
    """The FP32 neighbours of finite ``c`` as FP64 numbers, ``+-2^128`` beyond ``+-FLT_MAX``."""
    inf = np.float32(np.inf)
    with np.errstate(over="ignore"):
        lo_n, hi_n = float(np.nextafter(c, -inf)), float(np.nextafter(c, inf))
    return max(lo_n, -_VIRTUAL_INF), min(hi_n, _VIRTUAL_INF)


def _decide_fsum(op: OpNode | OpKind, terms: list[float]) -> tuple[int, int] | None:
    """The canonical ``(bits, code)`` of one sum element from its exact FP64 terms, by correctly
    rounded sums (``math.fsum``: the sign of a sum of terms is exact): settles exact ties and values
    closer to a midpoint than the double-double bound; None where a bound comparison is too close
    to call in FP64 (then exact rationals decide). FP32 midpoints are exact FP64 numbers, and so
    are ``n`` times them for ``n < 2^28``."""
    kind = op if isinstance(op, OpKind) else op.kind
    n = len(terms)
    scale = float(n) if kind == OpKind.MEAN else 1.0
    with np.errstate(over="ignore"):
        c = np.float32(math.fsum(terms) / scale)
    if np.isinf(c):  # the FP64 sum overflows FP32: RN32(e) is FLT_MAX or beyond (the signs below say)
        c = np.float32(np.copysign(_FLT_MAX, c))
    inf = np.float32(np.inf)

    def mids(c: np.float32) -> tuple[float, float, float, float]:
        lo_n, hi_n = _neighbours_virtual(c)
        c64 = float(c)
        return (c64 + lo_n) / 2, (c64 + hi_n) / 2, c64 - lo_n, hi_n - c64

    def sign_minus(m: float) -> int:  # sign of (scale * e - scale * m), exact
        x = math.fsum([*terms, -m * scale])
        return (x > 0) - (x < 0)

    for _ in range(4):  # c is RN32(f / scale) or a neighbour of RN32(e)
        if not np.isfinite(c):
            return None
        m_lo, m_hi, _, _ = mids(c)
        below, above = sign_minus(m_lo), sign_minus(m_hi)
        with np.errstate(over="ignore"):
            if below < 0:
                c = np.nextafter(c, -inf)
            elif above > 0:
                c = np.nextafter(c, inf)
            else:
                if below == 0 or above == 0:  # e is exactly a midpoint: ties to even (numpy's RN32)
                    c = np.float32(m_lo if below == 0 else m_hi)  # the boundary 2^128 - 2^103 ties to inf
                break
    else:
        return None
    if not np.isfinite(c):
        return None
    c = np.float32(c + np.float32(0.0))  # -0 is +0
    if bool(grid_exact(kind, torch.tensor([terms], dtype=torch.float64).reshape(1, n))[0]):
        return int(c.view(np.uint32)), int(Code.NONE)
    s_abs = math.fsum(abs(t) for t in terms)
    g = n * U / (1 - n * U)
    if kind == OpKind.MATMUL:
        dc, big = g * s_abs, 1.25 * g * (s_abs + n * 2.0**-149)
    elif kind == OpKind.SUM:
        dc = g * s_abs
        big = 1.25 * dc
    else:
        dc = (g + 2 * U) * s_abs / n
        big = 1.25 * dc
    m_lo, m_hi, s_lo, s_hi = mids(c)
    reach = 2 * big * scale
    dist_lo = math.fsum([*terms, -m_lo * scale])
    dist_hi = -math.fsum([*terms, -m_hi * scale])
    tol = reach * 2.0**-40 + 2.0**-1070
    if abs(dist_lo - reach) <= tol or abs(dist_hi - reach) <= tol:
        return None
    bits = int(c.view(np.uint32))
    near_lo, near_hi = dist_lo <= reach, dist_hi <= reach
    if not (near_lo or near_hi):
        return bits, int(Code.NONE)
    if near_lo and near_hi:
        return bits, int(Code.EXPLICIT)
    spacing = s_hi if near_hi else s_lo
    if abs(16 * big - spacing) <= 16 * big * 2.0**-29 or abs(big - 2 * dc) <= big * 2.0**-29:
        return None
    if 16 * big <= spacing and big <= 2 * dc:
        return bits, int(Code.DOWN if near_hi else Code.UP)
    return bits, int(Code.EXPLICIT)


# -- decisions from term rows (data-parallel: the terms of one element come from several ranks) ----
def exact_element_of_terms(kind: OpKind, terms: list[float]) -> ExactElement:
    """``e``, ``dc`` and ``Dc`` of a MATMUL/SUM/MEAN element from its exact terms (all of them, any
    order), in exact rational arithmetic: the same values :func:`exact_element` reads off the tensors."""
    n = len(terms)
    fr = [Fraction(t) for t in terms]
    total = sum(fr, Fraction(0))
    s = sum((abs(t) for t in fr), Fraction(0))
    g = Fraction(n, X.TWO53 - n)
    grid = on_grid(kind, fr)
    if kind == OpKind.MEAN:
        dc = (g + Fraction(2, X.TWO53)) * s / n
        return ExactElement(total / n, dc, _SUM_RATIO * dc, grid)
    dc = g * s
    if kind == OpKind.MATMUL:
        return ExactElement(total, dc, _SUM_RATIO * g * (s + n * _SUBNORMAL), grid)
    return ExactElement(total, dc, _SUM_RATIO * dc, grid)


def decide_rows(kind: OpKind, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Canonical ``(bits, codes, slow)`` of sum elements given all their exact FP64 terms ``rows [C, n]``
    (products of FP32 values, or FP32 values; a MATMUL bias is one more term). The decision is a
    function of the exact sum and ``sum|t|`` alone, so any order of the terms gives the same result:
    double-double first, ``math.fsum`` next, exact rationals last (``slow`` counts those)."""
    if kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
        raise ValueError(f"decide_rows: expected MATMUL, SUM or MEAN, got {kind.name}")
    n = rows.shape[1]
    got = native_rows.decide(kind, None, None, rows=rows)
    if got is not None:
        bits, codes, ok = (torch.from_numpy(x) for x in got[1:])
    else:
        b, c, ok, _ = _decide_rows(kind, rows, n)
        bits, codes = b.clone(), c.clone()
    rest = (~ok).nonzero().reshape(-1)
    slow = 0
    for k, row in zip(rest.tolist(), rows[rest].tolist(), strict=True):
        got = _decide_fsum(kind, row)
        if got is None:
            got = decide(exact_element_of_terms(kind, row))
            slow += 1
        bits[k], codes[k] = got
    return bits, codes, slow


# -- the auditor's check of the entries it applies ---------------------------------------------------
def is_exact_rounding(
    op: OpNode, desc: X.OpDesc, ins: list[torch.Tensor], index: np.ndarray, claimed: np.ndarray
) -> np.ndarray:
    """True where ``claimed`` (FP32 bit patterns) is ``RN32(e)`` of the element at flat ``index`` of
    ``op``: the only value the contract's rule lets any claim take. The auditor checks every log
    entry it applies with this, so a near-tie logged on the wrong side or a wrong explicit value is
    caught where it is applied. Sums compare ``e`` with the claim's two midpoints: the double-double
    sum and its bound first (the comparison of :func:`_decide_rows`), ``math.fsum`` signs next, exact
    rationals last; other kinds use exact arithmetic (``exact.exact_value``). A ``-0`` claim is never
    ``RN32(e)`` (a zero result is +0, and the contract's rule rejects ``-0``), whatever the kind."""
    index = np.asarray(index, dtype=np.int64)
    claimed = np.asarray(claimed, dtype=np.uint32)
    if not len(index):
        return np.zeros(0, dtype=bool)
    return _is_exact_rounding(op, desc, ins, index, claimed) & (claimed != np.uint32(X.SIGN))


def _is_exact_rounding(
    op: OpNode, desc: X.OpDesc, ins: list[torch.Tensor], index: np.ndarray, claimed: np.ndarray
) -> np.ndarray:
    """:func:`is_exact_rounding` on at least one element, ``-0`` compared as ``+0``."""
    if op.kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
        tensors = [t.detach().cpu().numpy() for t in ins]
        exact = [X.rn32(X.exact_value(desc, tensors, int(i))) for i in index.tolist()]
        return np.array(exact, dtype=np.uint32) == claimed
    verdict = native_rows.is_rn32(op.kind, ins, index, claimed)
    if verdict is not None:
        return _is_exact_rounding_rest(op, desc, ins, index, claimed, verdict)
    t, n = _terms(op, ins, torch.from_numpy(index).to(ins[0].device))
    c32 = torch.from_numpy(claimed.view(np.float32).copy())
    hi, lo, err = (torch.from_numpy(x) for x in _dd_sum(t.numpy()))  # the exact sum is hi + lo +- err
    scale = float(n) if op.kind == OpKind.MEAN else 1.0  # n * m is exact in FP64 (n < 2^28)
    lo_n, hi_n = _neighbours(c32)
    c64 = c32.double()
    d_lo = (hi - (c64 + lo_n.double()) * 0.5 * scale) + lo  # n (e - m_lo)
    d_hi = ((c64 + hi_n.double()) * 0.5 * scale - hi) - lo  # n (m_hi - e)
    derr = err + 4 * U * (torch.maximum(d_lo.abs(), d_hi.abs()) + lo.abs())
    yes = (d_lo > derr) & (d_hi > derr)
    no = (d_lo < -derr) | (d_hi < -derr)
    out = yes.numpy().copy()
    tensors: list[np.ndarray] | None = None
    for k in (~(yes | no)).nonzero().reshape(-1).tolist():  # too close to call in FP64, or not finite
        got = _is_rn32_fsum(t[k].tolist(), scale, np.float32(c32[k].item()))
        if got is None:
            tensors = tensors if tensors is not None else [x.detach().cpu().numpy() for x in ins]
            got = X.rn32(X.exact_value(desc, tensors, int(index[k]))) == int(claimed[k])
        out[k] = got
    return out


def _is_exact_rounding_rest(
    op: OpNode, desc: X.OpDesc, ins: list[torch.Tensor], index: np.ndarray, claimed: np.ndarray, verdict: np.ndarray
) -> np.ndarray:
    """:func:`is_exact_rounding` from the C kernel's double-double verdicts: the undecided ones by
    ``math.fsum`` signs, then exact rationals (as the numpy path does)."""
    out = verdict == native_rows.YES
    rest = np.flatnonzero(verdict == native_rows.UNDECIDED)
    if not len(rest):
        return out
    t, n = _terms(op, ins, torch.from_numpy(index[rest]))
    scale = float(n) if op.kind == OpKind.MEAN else 1.0
    c32 = claimed.view(np.float32)
    tensors: list[np.ndarray] | None = None
    for pos, k in enumerate(rest.tolist()):
        got = _is_rn32_fsum(t[pos].tolist(), scale, np.float32(c32[k]))
        if got is None:
            tensors = tensors if tensors is not None else [x.detach().cpu().numpy() for x in ins]
            got = X.rn32(X.exact_value(desc, tensors, int(index[k]))) == int(claimed[k])
        out[k] = got
    return out


def _is_rn32_fsum(terms: list[float], scale: float, c: np.float32) -> bool | None:
    """Whether ``c`` is RN32 of ``sum(terms) / scale`` from exact signs (``math.fsum`` is correctly
    rounded, so its sign is the exact sum's; FP32 midpoints times ``scale`` are exact in FP64), ties
    to even; False for a non-finite ``c`` (no claim the contract takes). Next to +-FLT_MAX the
    neighbour is the virtual +-2^128 (the contract's), so RN32 overflows from ``2^128 - 2^103`` on."""
    if not np.isfinite(c):
        return False
    lo_n, hi_n = _neighbours_virtual(c)
    even = not int(c.view(np.uint32)) & 1

    def sign_minus(m: float) -> int:  # sign of (scale * e - scale * m), exact
        x = math.fsum([*terms, -m * scale])
        return (x > 0) - (x < 0)

    below = sign_minus((float(c) + lo_n) / 2)
    above = sign_minus((float(c) + hi_n) / 2)
    if below < 0 or above > 0:
        return False
    return even if below == 0 or above == 0 else True
