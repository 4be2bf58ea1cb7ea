"""The fused FP32 rounding and midpoint-candidate filter in C (``csrc/numerics/filter.c``).

One pass per element of an FP64 output ``v``: ``r = RN32(v)`` with canonical zero, and the flat
indices where ``fl(fl(h - |v - r|) - reach) <= 0`` (NaN included): exactly the IEEE operations of
:func:`vtrain.numerics.rounding.midpoint_candidates_np`, so the same candidate set (tested). The
numpy/torch path stays the fallback (``native.available()`` False, CUDA tensors, non-contiguous ones).

``reach`` is ``d * scale``, where the bound ``d`` is a dense FP64 tensor or a lazy bound evaluated
inside the kernel with the same operations the dense one would take: :class:`RelativeBound`
(``c |v|``, EXP/LOG/TANH/ERF), :class:`NormBound` (MATMUL's norm bound: the smallest of the
Cauchy-Schwarz and the two Hoelder products of row norms, ``executor._norm_bound``) and
:class:`TightBound` (MATMUL's tight bound from the FP32 ``|A| @ |B|``). Consumers read a lazy bound
at their few candidates (:func:`bound_at`).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import numpy as np
import torch

from vtrain.numerics import native
from vtrain.numerics.scratch import Scratch


@dataclass(frozen=True)
class RelativeBound:
    """``d = c |v|`` (the trainer bound of EXP/LOG/TANH, ``c = 4u``; ERF ``c = 8u``), not materialized."""

    v: torch.Tensor
    c: float

    def dense(self) -> torch.Tensor:
        return self.c * self.v.abs()  # the executor's dense bound, the same product

    def at(self, index: np.ndarray) -> np.ndarray:
        return self.c * np.abs(self.v.reshape(-1).numpy()[index])


@dataclass(frozen=True)
class NormBound:
    """``executor._norm_bound`` of a MATMUL output ``[..., M, N]``, not materialized:
    ``d = (((s_ij) + |bias_j|) + sub) * factor`` with ``s_ij`` the smallest (:func:`norm_products`) of
    ``na_i nb_j`` (Euclidean row norms: Cauchy-Schwarz) and, where given, ``na1_i nbi_j`` and
    ``nai_i nb1_j`` (1- and inf-norms: Hoelder), each at least ``sum_k |a_ik b_jk|``. The FP64 norms
    ``na``, ``na1``, ``nai`` have one value per output row (C-contiguous), ``nb``, ``nb1``, ``nbi`` are
    ``[batches, N]``; ``bias`` FP64 ``[N]`` or None."""

    na: torch.Tensor
    nb: torch.Tensor
    bias: torch.Tensor | None
    m: int
    sub: float
    factor: float
    shape: tuple[int, ...]
    na1: torch.Tensor | None = None
    nai: torch.Tensor | None = None
    nb1: torch.Tensor | None = None
    nbi: torch.Tensor | None = None

    def dense(self) -> torch.Tensor:
        n = self.nb.shape[-1]

        def rows(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1, self.m, 1)

        def cols(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1, 1, n)

        s = rows(self.na) * cols(self.nb)
        if self.na1 is not None:
            s = norm_products(s, rows(self.na1) * cols(self.nbi), rows(self.nai) * cols(self.nb1))
        if self.bias is not None:
            s.add_(self.bias.abs())
        return s.add_(self.sub).mul_(self.factor).reshape(self.shape)

    def at(self, index: np.ndarray) -> np.ndarray:
        n = self.nb.shape[-1]
        row, j = index // n, index % n
        col = (row // self.m) * n + j
        s = self.na.numpy()[row] * self.nb.reshape(-1).numpy()[col]
        if self.na1 is not None:
            s = norm_products(s, self.na1.numpy()[row] * self.nbi.reshape(-1).numpy()[col],  # type: ignore[union-attr]
                              self.nai.numpy()[row] * self.nb1.reshape(-1).numpy()[col])  # type: ignore[union-attr]
        if self.bias is not None:
            s = s + np.abs(self.bias.numpy()[j])
        return (s + self.sub) * self.factor


def norm_products(s2, s1, si):
    """The norm bound's ``s``: ``filter.c``'s ``vt_mask_norm3`` operations, ``s12 = s2 < s1 ? s2 : s1``
    then ``s12 < si ? s12 : si`` (numpy or torch arrays; a NaN picks the later operand, as in C)."""
    where = torch.where if isinstance(s2, torch.Tensor) else np.where
    s12 = where(s2 < s1, s2, s1)
    return where(s12 < si, s12, si)


@dataclass(frozen=True)
class TightBound:
    """``d = (fl64(s) + sub) * factor`` from an FP32 ``s``, not materialized in FP64 (``executor._compute_fp64``):
    MATMUL's tight bound (``s = |A| @ |B| (+ |bias|)``) and the SUM/MEAN bound (``s = sum|x|``, ``sub = 0``)."""

    s: torch.Tensor
    sub: float
    factor: float

    def dense(self) -> torch.Tensor:
        return self.s.double().add_(self.sub).mul_(self.factor)  # the executor's dense bound, the same ops

    def at(self, index: np.ndarray) -> np.ndarray:
        return (self.s.reshape(-1).numpy()[index].astype(np.float64) + self.sub) * self.factor


@dataclass(frozen=True)
class PointBound:
    """A bound known at a few flat indices only (``values[i]`` at ``index[i]``): the checked replay's
    ``min(NormBound, tight)`` at its candidates and entries, computed with the filter in one native call
    (``native_replay.matmul_norm_filter``). Read only at those points (never dense)."""

    index: np.ndarray
    values: np.ndarray
    grid: np.ndarray | None = None  # the exact-grid rule there (canonical.grid_elements), where known

    def dense(self) -> torch.Tensor:
        raise TypeError("PointBound: a bound at a few points only has no dense form")

    def _positions(self, index: np.ndarray) -> np.ndarray:
        order = np.argsort(self.index, kind="stable")
        keys = self.index[order]
        pos = np.minimum(np.searchsorted(keys, index), max(len(keys) - 1, 0))
        if len(index) and (not len(keys) or not bool((keys[pos] == index).all())):
            raise ValueError("PointBound: read at an index it does not hold")
        return order[pos]

    def at(self, index: np.ndarray) -> np.ndarray:
        return self.values[self._positions(index)] if len(index) else np.zeros(0, dtype=np.float64)

    def grid_at(self, index: np.ndarray) -> np.ndarray:
        """``canonical.grid_elements`` at ``index`` (held points only; ``grid`` must be known)."""
        if self.grid is None:
            raise ValueError("PointBound: no exact-grid rule held")
        return self.grid[self._positions(index)] if len(index) else np.zeros(0, dtype=bool)


Bound = torch.Tensor | RelativeBound | NormBound | TightBound | PointBound
"""A certified bound ``d``: dense, or lazy (evaluated inside the filter and at candidates only)."""


def dense(d: Bound) -> torch.Tensor:
    """``d`` as a dense tensor (the numpy/torch path's form; a tensor is returned as is)."""
    return d if isinstance(d, torch.Tensor) else d.dense()


def bound_at(d: Bound, index: np.ndarray) -> np.ndarray:
    """``d`` at flat indices (FP64 numpy), the same bits as ``dense(d).reshape(-1)[index]``."""
    if isinstance(d, torch.Tensor):
        return d.reshape(-1).cpu().numpy()[index]
    return d.at(index)


def usable(v: torch.Tensor) -> bool:
    """Whether the kernels take ``v``: the library is loaded and ``v`` is a C-contiguous FP64 CPU tensor."""
    return native.available() and v.device.type == "cpu" and v.dtype == torch.float64 and v.is_contiguous()


_P = ctypes.c_void_p
_I = ctypes.c_int64
_D = ctypes.c_double
_SIGNATURES = {
    "vt_round_filter_dense": (_I, [_P, _P, _I, _D, _P, _P, _P]),
    "vt_round_filter_relative": (_I, [_P, _I, _D, _D, _P, _P, _P]),
    "vt_round_filter_norm": (_I, [_P, _I, _I, _I, _P, _P, _P, _D, _D, _D, _P, _P, _P]),
    "vt_round_filter_scaled32": (_I, [_P, _P, _I, _D, _D, _D, _P, _P, _P]),
    "vt_round_fp32": (ctypes.c_uint32, [_P, _I, _P]),
    "vt_row_norms": (ctypes.c_int, [_P, _I, _I, _P]),
    "vt_row_norms32": (None, [_P, _I, _I, _P]),
    "vt_row_norms1inf32": (None, [_P, _I, _I, _P, _P]),
    "vt_round_filter_norm3": (_I, [_P, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _D, _D, _D, _P, _P, _P]),
    "vt_sum_round_filter": (_I, [_P, _I, _I, ctypes.c_int32, _D, _D, _P, _P, _P]),
    "vt_sum_values_filter": (_I, [_P, _I, _I, ctypes.c_int32, _D, _D, _P, _P, _P, _P, _P]),
    "vt_sum_round_decide": (_I, [_P, _I, _I, ctypes.c_int32, _D, _D, _P, _P, _P]),
}


_FNS: dict[str, ctypes._CFuncPtr] = {}


def _fn(name: str):
    f = _FNS.get(name)
    if f is None:
        f = getattr(native.lib(), name)
        f.restype, f.argtypes = _SIGNATURES[name]
        _FNS[name] = f
    return f


def _addr(t: torch.Tensor) -> int:
    if not t.is_contiguous():
        raise ValueError("native filter: expected a C-contiguous tensor")
    return t.data_ptr()


def round_filter(v: torch.Tensor, d: Bound, scale: float) -> tuple[torch.Tensor, np.ndarray, bool]:
    """``(r, candidates, finite)`` of ``v`` (:func:`usable`): ``r = RN32(v)`` (canonical zero, ``v``'s
    shape), the sorted int64 flat indices with ``fl(fl(h - |v - r|) - d * scale) <= 0``, and whether
    every ``r`` is finite (a non-finite one is always a candidate)."""
    n = v.numel()
    r = torch.empty(v.shape, dtype=torch.float32)
    idx = np.empty(max(n, 1), dtype=np.int64)  # pages are touched only where candidates land
    flag = ctypes.c_uint32(0)
    out = (r.data_ptr(), idx.ctypes.data, ctypes.addressof(flag))
    if isinstance(d, RelativeBound):
        k = _fn("vt_round_filter_relative")(_addr(v), n, d.c, scale, *out)
    elif isinstance(d, TightBound):
        s32 = d.s if d.s.is_contiguous() else d.s.contiguous()
        k = _fn("vt_round_filter_scaled32")(_addr(v), _addr(s32), n, d.sub, d.factor, scale, *out)
    elif isinstance(d, NormBound):
        n_cols = d.nb.shape[-1]
        bias = None if d.bias is None else _addr(d.bias)
        if d.na1 is None:
            k = _fn("vt_round_filter_norm")(_addr(v), n // max(n_cols, 1), d.m, n_cols, _addr(d.na),
                                            _addr(d.nb), bias, d.sub, d.factor, scale, *out)
        else:
            k = _fn("vt_round_filter_norm3")(_addr(v), n // max(n_cols, 1), d.m, n_cols, _addr(d.na), _addr(d.nb),
                                             _addr(d.na1), _addr(d.nai), _addr(d.nb1), _addr(d.nbi),  # type: ignore[arg-type]
                                             bias, d.sub, d.factor, scale, *out)
    else:
        dd = d if d.dtype == torch.float64 and d.shape == v.shape and d.is_contiguous() else (
            torch.broadcast_to(d.double(), v.shape).contiguous())
        k = _fn("vt_round_filter_dense")(_addr(v), _addr(dd), n, scale, *out)
    return r, idx[:k].copy(), not flag.value


def _sum_rows(x: torch.Tensor) -> tuple[torch.Tensor, int, int] | None:
    """``(contiguous x, rows, row length)`` of a SUM/MEAN kernel's FP32 CPU input over its last axis;
    None where the kernels do not apply (not loaded, another device or dtype, a scalar, an empty row)."""
    if not native.available() or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() == 0:
        return None
    n = x.shape[-1]
    if n == 0:
        return None
    xc = x if x.is_contiguous() else x.contiguous()
    return xc, xc.numel() // n, n


def sum_round_filter(
    x: torch.Tensor, mean: bool, factor: float, scale: float, scratch: Scratch | None = None
) -> tuple[torch.Tensor, np.ndarray, bool] | None:
    """SUM (MEAN: ``mean``) over the last axis of an FP32 CPU ``x``, its bound and the filter in one
    pass: ``(r, candidates, finite)`` as :func:`round_filter` gives them for ``v`` = the rows' FP64
    sums (``/ n`` for MEAN) and ``d = (sum|x| + 0) * factor``, all sums numpy's pairwise ones
    (reference: ``canonical.sum_round_filter_np``); ``r`` has shape ``[..., 1]``. None where the
    kernel does not apply (not loaded, another device or dtype, an empty row). ``scratch``: the
    caller's reusable index buffer; the candidates are then a view into it, valid until its next use."""
    got = _sum_call("vt_sum_round_filter", x, mean, factor, scale, scratch)
    return None if got is None else got[:3]


def sum_round_decide(
    x: torch.Tensor, mean: bool, factor: float, scale: float, scratch: Scratch | None = None
) -> tuple[torch.Tensor, np.ndarray, bool, int] | None:
    """:func:`sum_round_filter`, then (every ``r`` finite) ``native_rows.decide_into`` of its candidates,
    in one C call (``csrc/numerics/sums.c``): ``(r, candidates, finite, attention)``, ``attention`` -1
    where the candidates were not decided (none, or some ``r`` not finite), 0 where their decided bits
    are in ``r`` (final), more where ``decide_into`` would have written nothing (neither does this)."""
    return _sum_call("vt_sum_round_decide", x, mean, factor, scale, scratch)


def _sum_call(kernel: str, x: torch.Tensor, mean: bool, factor: float, scale: float,
              scratch: Scratch | None) -> tuple[torch.Tensor, np.ndarray, bool, int] | None:
    """:func:`sum_round_filter` or :func:`sum_round_decide` through ``kernel`` (their C functions take
    the same arguments; status: two int64 slots before the candidates, the second -1 for the filter)."""
    got = _sum_rows(x)
    if got is None:
        return None
    xc, rows, n = got
    r = torch.empty((*x.shape[:-1], 1), dtype=torch.float32)
    # the status (the NaN/Inf flag: zeroed, as the filter's uint32 store makes it nonzero iff the flag
    # is, in either byte order; the decisions' count), then the candidates (fresh pages touched only
    # where they land)
    idx, at = (scratch or Scratch()).get("sum", rows + 2)
    idx[0], idx[1] = 0, -1
    k = _fn(kernel)(xc.data_ptr(), rows, n, int(mean), factor, scale, r.data_ptr(), at + 16, at)
    if k < 0:
        raise MemoryError("native filter: a SUM row could not be allocated")
    cand = idx[2 : 2 + k]
    return r, (cand if scratch is not None else cand.copy()), not idx[0], int(idx[1])


def sum_values_filter(
    x: torch.Tensor, mean: bool, factor: float, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, bool] | None:
    """SUM (MEAN: ``mean``) over the last axis of an FP32 CPU ``x``, its bound and the filter in one pass,
    for the checked replay: ``(v, d, r, candidates, finite)``, ``v`` the rows' FP64 sums (``/ n`` for
    MEAN) and ``d = (sum|x| + 0) * factor`` (FP64, shape ``[..., 1]``), the sums numpy's pairwise ones
    as :func:`sum_round_filter` computes them (reference: ``canonical.sum_values_np``), and
    :func:`round_filter`'s ``(r, candidates, finite)`` of ``v`` and dense ``d`` at ``scale``. None where
    the kernel does not apply (not loaded, another device or dtype, an empty row)."""
    got = _sum_rows(x)
    if got is None:
        return None
    xc, rows, n = got
    shape = (*x.shape[:-1], 1)
    v = torch.empty(shape, dtype=torch.float64)
    d = torch.empty(shape, dtype=torch.float64)
    r = torch.empty(shape, dtype=torch.float32)
    idx = np.empty(max(rows, 1), dtype=np.int64)
    flag = ctypes.c_uint32(0)
    k = _fn("vt_sum_values_filter")(xc.data_ptr(), rows, n, int(mean), factor, scale, v.data_ptr(), d.data_ptr(),
                                    r.data_ptr(), idx.ctypes.data, ctypes.addressof(flag))
    return v, d, r, idx[:k].copy(), not flag.value


def round_fp32(v: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``(RN32(v) with canonical zero, whether every element is finite)`` of ``v`` (:func:`usable`)."""
    r = torch.empty(v.shape, dtype=torch.float32)
    nonfinite = _fn("vt_round_fp32")(_addr(v), v.numel(), r.data_ptr())
    return r, not nonfinite


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """FP64 Euclidean norms of the last axis of ``x`` (FP32 numbers, as FP32 or FP64, ``[..., R, K]``),
    keeping it as ``[..., R, 1]``: ``sqrt(sum_k x_k^2)`` with numpy's pairwise summation on the CPU
    (the C kernels ``vt_row_norms``/``vt_row_norms32`` of ``csrc/numerics/rows.c`` where loaded, numpy
    otherwise: the same bits), torch's elsewhere. Any summation order keeps ``executor._norm_bound``'s
    error bound."""
    if x.device.type != "cpu":
        x = x.double()
        return x.mul(x).sum(dim=-1, keepdim=True).sqrt_()
    k = x.shape[-1]
    if native.available() and x.dtype in (torch.float32, torch.float64) and x.numel():
        xc = x if x.is_contiguous() else x.contiguous()
        out = torch.empty((*x.shape[:-1], 1), dtype=torch.float64)
        rows = xc.numel() // max(k, 1)
        if x.dtype == torch.float32:
            _fn("vt_row_norms32")(xc.data_ptr(), rows, k, out.data_ptr())
        elif _fn("vt_row_norms")(xc.data_ptr(), rows, k, out.data_ptr()):
            raise MemoryError("native filter: row norms could not allocate a scratch row")
        return out
    xn = np.ascontiguousarray(x.numpy(), dtype=np.float64)  # rows in memory order: the kernel's order
    return torch.from_numpy(np.sqrt((xn * xn).sum(axis=-1, keepdims=True)))


def row_norms1inf(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP64 1-norms and inf-norms of the last axis of ``x`` (FP32 numbers, as FP32 or FP64,
    ``[..., R, K]``), each as ``[..., R, 1]``: on the CPU the sum of ``|x|`` in 16 lanes (lane ``l`` the
    elements ``j = l mod 16``, left to right, then the lanes in order; the C kernel
    ``vt_row_norms1inf32`` where loaded, numpy otherwise: the same bits) and the exact maximum;
    torch's elsewhere. Any summation order keeps ``executor._norm_bound``'s error bound."""
    k = x.shape[-1]
    lead = (*x.shape[:-1], 1)
    if x.device.type != "cpu":
        xa = x.double().abs()
        return xa.sum(dim=-1, keepdim=True), (xa.amax(dim=-1, keepdim=True) if k else xa.sum(-1, keepdim=True))
    rows = x.numel() // max(k, 1) if k else math.prod(x.shape[:-1])
    n1 = torch.empty(lead, dtype=torch.float64)
    ni = torch.empty(lead, dtype=torch.float64)
    if native.available() and x.dtype == torch.float32 and x.numel():
        xc = x if x.is_contiguous() else x.contiguous()
        _fn("vt_row_norms1inf32")(xc.data_ptr(), rows, k, n1.data_ptr(), ni.data_ptr())
        return n1, ni
    xa = np.abs(np.ascontiguousarray(x.numpy(), dtype=np.float64)).reshape(rows, k)
    lanes = np.zeros((rows, 16))
    full = k - k % 16
    for j in range(0, full, 16):
        lanes += xa[:, j : j + 16]
    lanes[:, : k - full] += xa[:, full:]
    total = np.zeros(rows)
    for lane in range(16):
        total = total + lanes[:, lane]
    n1.numpy().reshape(-1)[:] = total
    ni.numpy().reshape(-1)[:] = xa.max(axis=1) if k else 0.0
    return n1, ni


def norm_bound(
    x: list[torch.Tensor], v: torch.Tensor, factor: float, sub: float, ins: list[torch.Tensor] | None = None
) -> NormBound:
    """The lazy form of ``executor._norm_bound`` for FP64 inputs ``x`` (``[..., M, K]``,
    ``[..., N, K]``, bias ``[N]``; ``ins``: the same as FP32, where the norms are read from) and
    output ``v`` ``[..., M, N]``: the same row norms (:func:`row_norms`), expanded to one per output
    row and one row of ``nb`` per batch."""
    src = ins if ins is not None else x
    m, n_cols = v.shape[-2], v.shape[-1]

    def per_row(na: torch.Tensor) -> torch.Tensor:  # [..., M, 1] -> one per output row
        if na.shape[:-1] == v.shape[:-1]:
            return na.reshape(-1)
        return na.expand(*v.shape[:-1], 1).contiguous().reshape(-1)

    def per_col(nb: torch.Tensor) -> torch.Tensor:  # [..., N, 1] -> [batches, N]
        if nb.shape[:-2] == v.shape[:-2]:
            return nb.reshape(-1, n_cols)
        return nb.squeeze(-1).expand(*v.shape[:-2], n_cols).contiguous().reshape(-1, n_cols)

    a1, ai = row_norms1inf(src[0])
    b1, bi = row_norms1inf(src[1])
    bias = x[2].reshape(-1).contiguous() if len(x) == 3 else None
    return NormBound(per_row(row_norms(src[0])), per_col(row_norms(src[1])), bias, m, sub, factor, tuple(v.shape),
                     per_row(a1), per_row(ai), per_col(b1), per_col(bi))
