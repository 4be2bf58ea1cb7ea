"""Native decisions of candidate rows (``csrc/numerics/rows.c``): one C call per op.

The C kernels perform exactly the IEEE operations of the numpy path in :mod:`vtrain.numerics.canonical`
(``_terms``, ``np.abs(t).sum(axis=1)``, ``_tight_candidates``, ``grid_exact``, ``_dd_sum``/``_decide_dd``
and the double-double comparison of ``is_exact_rounding``), one row at a time, so they give its bits;
the numpy path stays the specification and the fallback (``tests/test_native_rows.py`` compares them).

Each function returns None when the kernels are not loaded (``native.available()`` False) or the
inputs are not the FP32 CPU tensors the kernels read; callers then run the numpy path. Pointers are
taken with ``Tensor.data_ptr()`` (a numpy array's ``.ctypes`` costs about 1.6 us each, ``torch.empty``
3 us: most calls are made for a handful of candidates, where such fixed costs are the whole price).
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from vtrain.graph.step_graph import OpKind
from vtrain.numerics import fp32_native, native
from vtrain.numerics.rounding import Code, OpLog
from vtrain.numerics.scratch import Scratch

_KIND = {OpKind.MATMUL: 0, OpKind.SUM: 1, OpKind.MEAN: 2}
_SRC_MATMUL, _SRC_ROWS32, _SRC_TERMS64 = 0, 1, 2
#: Verdicts of :func:`is_rn32`.
NO, YES, UNDECIDED = 0, 1, 2
assert (int(Code.NONE), int(Code.DOWN), int(Code.UP), int(Code.EXPLICIT)) == (0, 1, 2, 3)  # rows.c's CODE_*


def _bind() -> ctypes.CDLL | None:
    lib = native.lib()
    names = ("vt_rows_decide", "vt_rows_decide_into", "vt_rows_is_rn32", "vt_rows_grid", "vt_matmul_round_norm",
             "vt_free")
    if lib is None or not all(hasattr(lib, n) for n in names):
        return None
    p, i32, i64, f64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
    src = [i32, p, p, p, i64, i64, i64, p, i64, i64]  # SRC_ARGS of rows.c
    lib.vt_rows_decide.argtypes = [*src, i32, p, i64, p, p, f64, f64, p]
    lib.vt_rows_decide.restype = i64
    lib.vt_rows_decide_into.argtypes = [*src, i32, p, i64, p, p, f64, f64, p]
    lib.vt_rows_decide_into.restype = i64
    lib.vt_rows_is_rn32.argtypes = [*src, i32, p, i64, p, p]
    lib.vt_rows_is_rn32.restype = ctypes.c_int
    lib.vt_rows_grid.argtypes = [*src, i32, p, i64, p]
    lib.vt_rows_grid.restype = ctypes.c_int
    lib.vt_matmul_round_norm.argtypes = [p, p, p, p, i64, i64, i64, i64, i32, f64, f64, f64, f64, p, p, i64, p, p]
    lib.vt_matmul_round_norm.restype = i64
    lib.vt_free.argtypes = [p]
    lib.vt_free.restype = None
    return lib


_LIB = _bind()


def available() -> bool:
    """True when the row kernels are loaded."""
    return _LIB is not None


def _usable(ins: list[torch.Tensor]) -> bool:
    f32 = torch.float32
    return _LIB is not None and all(t.is_cpu and t.dtype is f32 for t in ins)


def _contiguous(t: torch.Tensor, keep: list[torch.Tensor]) -> int:
    t = t if t.is_contiguous() else t.contiguous()
    keep.append(t)
    return t.data_ptr()


def _source(kind: OpKind, ins: list[torch.Tensor] | None, rows: torch.Tensor | None, keep: list[torch.Tensor]):
    """``SRC_ARGS`` of rows.c for the op's inputs or for FP64 term rows (pointers into ``keep``)."""
    if rows is not None:
        return (_SRC_TERMS64, None, None, None, 0, 0, 0, _contiguous(rows, keep), rows.shape[1], rows.shape[0])
    if kind == OpKind.MATMUL:
        a, b = ins[0], ins[1]
        if a.dim() < 2 or b.dim() < 2 or b.shape[-1] != a.shape[-1]:
            return None  # shapes the kernel does not read: the numpy path decides (or names the problem)
        m, k, ncols = a.shape[-2], a.shape[-1], b.shape[-2]
        if a.numel() // max(1, m * k) != b.numel() // max(1, ncols * k) or (len(ins) == 3 and ins[2].numel() != ncols):
            return None  # broadcast batches, or a bias of another length
        bias = _contiguous(ins[2], keep) if len(ins) == 3 else None
        return (_SRC_MATMUL, _contiguous(a, keep), _contiguous(b, keep), bias, m, k, ncols, None, 0,
                a.numel() // max(1, k) * ncols)
    x = ins[0]
    n = x.shape[-1] if x.dim() else 1
    return (_SRC_ROWS32, None, None, None, 0, 0, 0, _contiguous(x, keep), n, x.numel() // max(1, n))


def _index(cand: torch.Tensor | np.ndarray, keep: list[torch.Tensor]) -> tuple[int, int]:
    if isinstance(cand, np.ndarray):
        cand = torch.from_numpy(np.ascontiguousarray(cand, dtype=np.int64))
    if cand.dtype != torch.int64:
        raise TypeError(f"native rows: expected int64 candidate indices, got {cand.dtype}")
    return _contiguous(cand, keep), cand.numel()


def _ptr(a: np.ndarray) -> int:
    """The data address of a fresh (C-contiguous) numpy array, through torch (cheaper than ``.ctypes``)."""
    return torch.from_numpy(a).data_ptr()


def _check(rc: int, what: str, limit: int) -> None:
    if rc == -2:
        raise IndexError(f"native rows: {what}: expected element indices in [0, {limit}), got one outside")
    if rc < 0 or rc > 0 and what != "decide":
        raise MemoryError(f"native rows: {what} could not allocate its scratch rows")


def _tight_args(tight: tuple[torch.Tensor, torch.Tensor, float, float] | None, keep: list[torch.Tensor]):
    """``(v, r, coef, band)`` of the MATMUL tight re-filter as the kernels take them (null pointers and
    zeros without one); None when its tensors are not CPU FP64 values and FP32 outputs."""
    if tight is None:
        return None, None, 0.0, 0.0
    v, r, coef, band = tight
    if v.device.type != "cpu" or v.dtype != torch.float64 or r.device.type != "cpu" or r.dtype != torch.float32:
        return None
    return _contiguous(v, keep), _contiguous(r, keep), coef, band


def decide(
    kind: OpKind,
    ins: list[torch.Tensor] | None,
    cand: torch.Tensor | np.ndarray | None,
    *,
    rows: torch.Tensor | None = None,
    tight: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(kept, bits, codes, decided)`` of a MATMUL/SUM/MEAN op's candidates: from the op's FP32
    inputs ``ins`` at flat element indices ``cand``, or from FP64 term rows ``rows [C, n]`` (``cand``
    None; ``kept`` then indexes rows). ``tight = (v, r, coef, band)`` (the op's flat FP64 values and
    FP32 outputs, ``TRAINER_BOUND_SLACK * gamma(n)`` and the candidate band) runs the MATMUL tight
    re-filter first: only the candidates it keeps are returned, in order (``kept``: their element
    indices; int64 arrays, ``decided`` bool). None: use the numpy path."""
    if _LIB is None or (rows is None and not _usable(ins)):
        return None
    if rows is not None and (rows.device.type != "cpu" or rows.dtype != torch.float64):
        return None
    keep: list[torch.Tensor] = []
    src = _source(kind, ins, rows, keep)
    if src is None:
        return None
    if cand is None:
        c_ptr, c = None, rows.shape[0]
    else:
        c_ptr, c = _index(cand, keep)
    targs = _tight_args(tight, keep)
    if targs is None:
        return None
    o = np.empty((4, c), dtype=np.int64)
    kept = _LIB.vt_rows_decide(*src, _KIND[kind], c_ptr, c, *targs, _ptr(o))
    _check(kept, "decide", src[-1])
    return o[0, :kept], o[1, :kept], o[2, :kept], o[3, :kept] != 0


def decide_into(
    kind: OpKind,
    ins: list[torch.Tensor],
    cand: torch.Tensor,
    out: torch.Tensor,
    tight: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
) -> int | None:
    """:func:`decide`'s common case in one call: where every candidate the tight re-filter keeps is
    decided with no entry due, their decided bits (canonical zeros) are written into ``out`` (the
    op's flat FP32 output, C-contiguous, the ``r`` of ``tight``) and 0 is returned; else nothing is
    written and the count of candidates that need :func:`decide`'s full path comes back. None: the
    kernel does not take these tensors (the caller uses :func:`decide`)."""
    if _LIB is None or out.device.type != "cpu" or out.dtype != torch.float32 or not out.is_contiguous():
        return None
    at = _rows_at(kind, ins, cand)
    if at is None:
        return None
    src, c_ptr, c, keep = at
    targs = _tight_args(tight, keep)
    if targs is None:
        return None
    got = _LIB.vt_rows_decide_into(*src, _KIND[kind], c_ptr, c, *targs, out.data_ptr())
    _check(got, "decide", src[-1])
    return got


def _rows_at(kind: OpKind, ins: list[torch.Tensor], cand: np.ndarray):
    """``(source args, candidate pointer, count, kept tensors)`` for a kernel reading the rows of the
    elements at flat ``cand`` (``keep`` holds what the pointers point into); None: use numpy."""
    if not _usable(ins):
        return None
    keep: list[torch.Tensor] = []
    src = _source(kind, ins, None, keep)
    if src is None:
        return None
    c_ptr, c = _index(cand, keep)
    return src, c_ptr, c, keep


def is_rn32(kind: OpKind, ins: list[torch.Tensor], cand: np.ndarray, claimed: np.ndarray) -> np.ndarray | None:
    """Per element at flat ``cand``: ``YES`` when the claimed FP32 bits are RN32 of its exact value by the
    double-double comparison, ``NO`` when they are not, ``UNDECIDED`` when too close to call. None:
    use the numpy path."""
    got = _rows_at(kind, ins, cand)
    if got is None:
        return None
    src, c_ptr, c, keep = got
    claim = torch.from_numpy(np.ascontiguousarray(claimed, dtype=np.uint32).view(np.int32))
    verdict = np.empty(c, dtype=np.uint8)
    _check(_LIB.vt_rows_is_rn32(*src, _KIND[kind], c_ptr, c, claim.data_ptr(), _ptr(verdict)), "is_rn32", src[-1])
    return verdict


def grid(kind: OpKind, ins: list[torch.Tensor], cand: np.ndarray) -> np.ndarray | None:
    """The exact-grid rule (``canonical.grid_exact``) of the elements at flat ``cand``; None: numpy."""
    got = _rows_at(kind, ins, cand)
    if got is None:
        return None
    src, c_ptr, c, keep = got
    out = np.empty(c, dtype=np.bool_)
    _check(_LIB.vt_rows_grid(*src, _KIND[kind], c_ptr, c, _ptr(out)), "grid", src[-1])
    return out


Decisions = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""``(kept, bits, codes, decided)`` of candidates, as :func:`decide` returns them."""

#: Candidates whose decisions :func:`matmul_round_norm` hands back (more: the caller decides again).
_KEEP_DECISIONS = 4096


class MatmulRound(NamedTuple):
    """What :func:`matmul_round_norm` gives: ``r`` (RN32 of ``v``, canonical zeros, the decided bits
    written where no candidate needs more), the candidates (sorted flat int64 indices), whether every
    ``r`` is finite, ``decided`` (``(kept, bits, codes, decided)`` as :func:`decide` returns them, or
    None where the kernel did not keep them) and ``attention`` (how many kept candidates are
    undecided or due an entry: 0 means ``r`` is final); ``entries``: where every kept candidate is
    decided and some are due an entry, their log entries (their bits are in ``r``, which is final;
    ``decided`` is then None), else None."""

    r: torch.Tensor
    cand: np.ndarray
    finite: bool
    decided: Decisions | None
    attention: int
    entries: OpLog | None = None


def matmul_operands(ins: list[torch.Tensor], v: torch.Tensor) -> tuple[int, int, int, int] | None:
    """``(batches, m, k, ncols)`` where :func:`matmul_round_norm` takes a MATMUL's FP32 CPU operands
    ``ins`` (``[..., M, K]``, ``[..., N, K]``, optional bias ``[N]``) and its FP64 values ``v``
    (C-contiguous ``[..., M, N]``): the same batch shape on both operands and ``v``, ``K > 0``; else None."""
    if len(ins) not in (2, 3) or not _usable(ins):
        return None
    if not v.is_cpu or v.dtype is not torch.float64 or not v.is_contiguous():
        return None
    sa, sb, sv = ins[0].shape, ins[1].shape, v.shape
    nd = len(sa)
    if nd < 2 or len(sb) != nd or len(sv) != nd or sa[:-2] != sb[:-2] or sa[:-2] != sv[:-2]:
        return None
    m, k, ncols = sa[-2], sa[-1], sb[-2]
    if sb[-1] != k or k == 0 or sv[-2] != m or sv[-1] != ncols or v.numel() == 0:
        return None
    if len(ins) == 3 and (ins[2].dim() != 1 or ins[2].shape[0] != ncols):
        return None
    return v.numel() // (m * ncols), m, k, ncols


def _decisions(dec: np.ndarray, kept: int, n_entries: int) -> tuple[Decisions | None, OpLog | None]:
    """``(decided, entries)`` of :class:`MatmulRound` from the kernel's decisions ``dec`` ``[4, count]``
    (copied out): the entries alone where it compacted them (``n_entries >= 0``), else the decisions."""
    if n_entries >= 0:
        return None, OpLog(dec[0, :n_entries].copy(), dec[2, :n_entries].astype(np.uint8),
                           dec[1, :n_entries].astype(np.uint32).view(np.float32))
    return (dec[0, :kept].copy(), dec[1, :kept].copy(), dec[2, :kept].copy(), dec[3, :kept] != 0), None


def matmul_round_norm(
    ins: list[torch.Tensor], v: torch.Tensor, shape: tuple[int, int, int, int], add_bias: bool,
    sub: float, factor: float, band: float, coef: float, empty: fp32_native.Empty | None = None,
    scratch: Scratch | None = None,
) -> MatmulRound:
    """A MATMUL's norm-bound rounding, filter and decisions in one C call (``csrc/numerics/matmul.c``):
    the row norms of ``ins[0]`` and ``ins[1]`` (:func:`native_filter.row_norms`,
    :func:`native_filter.row_norms1inf`), with ``add_bias`` ``v += bias`` in place,
    ``native_filter.round_filter`` of ``v`` under their ``NormBound`` at scale ``band``, then (every
    ``r`` finite) :func:`decide_into`'s tight re-filter (``coef``, ``band``) and decisions, written
    into ``r`` where none needs more. ``shape``:
    :func:`matmul_operands` of ``ins`` and ``v``. Decisions of more than ``_KEEP_DECISIONS``
    candidates come back from the kernel's own buffer (copied, then freed) instead of being taken
    again by the caller. ``empty(shape, dtype)`` makes ``r`` (a buffer pool's; None: ``torch.empty``).
    ``scratch``: the caller's reusable index buffer; where ``r`` is final (no candidate, or every
    one decided with none due an entry) ``cand`` is then a view into it, valid until its next use."""
    batches, m, k, ncols = shape
    a, b = ins[0], ins[1]
    a = a if a.is_contiguous() else a.contiguous()  # (the names hold the copies until the call returns)
    b = b if b.is_contiguous() else b.contiguous()
    bias = None
    if len(ins) == 3:
        bias = ins[2] if ins[2].is_contiguous() else ins[2].contiguous()
    n = v.numel()
    r = torch.empty(v.shape, dtype=torch.float32) if empty is None else empty(v.shape, torch.float32)
    cap = min(n, _KEEP_DECISIONS)
    # one buffer: the kernel's status (5, every one written by the kernel), the candidates (n; fresh
    # pages are touched only where candidates land) and the handed-back decisions (4 cap)
    whole, at = (scratch or Scratch()).get("matmul", 5 + n + 4 * cap)
    pbias = None if bias is None else bias.data_ptr()
    count = _LIB.vt_matmul_round_norm(v.data_ptr(), a.data_ptr(), b.data_ptr(), pbias, batches, m, k, ncols,
                                      int(add_bias), sub, factor, band, coef, r.data_ptr(), at + 40, cap,
                                      at + 8 * (5 + n), at)
    if count < 0:
        raise MemoryError("native rows: the MATMUL epilogue could not allocate its scratch rows")
    nonfinite, kept, attention, spill, n_entries = whole[:5].tolist()
    cand = whole[5 : 5 + count]
    if scratch is None or nonfinite or (attention and n_entries < 0):
        cand = cand.copy()
    decided = entries = None
    if spill:  # more decisions than the buffer holds: in the kernel's own, handed over
        try:
            dec = np.ctypeslib.as_array((ctypes.c_int64 * (4 * count)).from_address(spill)).reshape(4, count)
            decided, entries = _decisions(dec, kept, n_entries)
        finally:
            _LIB.vt_free(spill)
    elif kept >= 0 and attention:
        decided, entries = _decisions(whole[5 + n : 5 + n + 4 * count].reshape(4, count), kept, n_entries)
    return MatmulRound(r, cand, not nonfinite, decided, attention, entries)
