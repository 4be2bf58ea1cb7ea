"""The replay's work at a few elements in C (``csrc/numerics/replay.c``): the tight MATMUL bound and
the application of rounding-log entries.

:func:`matmul_abs_sums` gives ``fl(S) = np.abs(t).sum(axis=1)`` of the exact FP64 terms of MATMUL elements
(``canonical._terms``): the same operations in the same order, so the same bits (tested), without
gathering the ``[C, K]`` term rows. None where the kernel is not loaded or does not take the inputs:
the caller runs numpy.
"""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from vtrain.numerics import native
from vtrain.numerics.scratch import ThreadScratch


def _bind(name: str, argtypes: list, restype):
    """The kernel ``name`` of the native library with its C signature; None where it is not loaded."""
    lib = native.lib()
    if lib is None or not hasattr(lib, name):
        return None
    f = getattr(lib, name)
    f.argtypes = argtypes
    f.restype = restype
    return f


_p, _i64 = ctypes.c_void_p, ctypes.c_int64
_FN = _bind("vt_replay_matmul_abs_sums", [_p, _p, _p, _i64, _i64, _i64, _i64, _p, _i64, _p], ctypes.c_int)
_ENTRIES = _bind("vt_replay_apply_entries",
                 [_p, _p, _i64, _i64, _p, _p, _p, _p, ctypes.c_double, ctypes.c_int32, _p, _p], _i64)


def apply_entries(
    vf: np.ndarray, rf: np.ndarray, index: np.ndarray, code: np.ndarray, value: np.ndarray,
    di: np.ndarray | None, far_reach: float, exact_op: bool,
) -> tuple[np.ndarray, np.ndarray] | None:
    """``rounding._apply_entries_np`` in C: ``(applied, positions of entries far from the replayed
    value)`` for flat FP64 ``vf`` and FP32 ``rf`` and the entries (codes 1-3: the caller checks them;
    an index outside ``vf`` raises ``IndexError``), ``di`` the bound at the entries (None: not
    checking). None: use numpy."""
    if _ENTRIES is None or not native.available() or vf.dtype != np.float64 or rf.dtype != np.float32:
        return None
    if not (vf.flags.c_contiguous and rf.flags.c_contiguous) or len(vf) != len(rf):
        return None
    c = len(index)
    idx = np.ascontiguousarray(index, dtype=np.int64)
    cd = np.ascontiguousarray(code, dtype=np.uint8)
    val = np.ascontiguousarray(value, dtype=np.float32)
    d = None if di is None else np.ascontiguousarray(di, dtype=np.float64)
    applied = np.empty(c, dtype=np.float32)
    bad = np.zeros(c, dtype=np.uint8)
    rc = _ENTRIES(vf.ctypes.data, rf.ctypes.data, len(vf), c, idx.ctypes.data, cd.ctypes.data, val.ctypes.data,
                  None if d is None else d.ctypes.data, far_reach, int(exact_op), applied.ctypes.data, bad.ctypes.data)
    if rc == -2:
        raise IndexError(f"native replay: expected entry indices in [0, {len(vf)}), got one outside")
    return applied, (np.flatnonzero(bad) if d is not None else np.zeros(0, dtype=np.int64))


def matmul_abs_sums(ins: list[torch.Tensor], index: np.ndarray) -> np.ndarray | None:
    """FP64 ``fl(sum_k |t_k|)`` of a MATMUL's elements at flat ``index`` (``ins``: ``a [.., M, K]``,
    ``b [.., N, K]``, optional bias ``[N]``, FP32 CPU tensors); None: use numpy."""
    if _FN is None or not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ins):
        return None
    a, b = ins[0], ins[1]
    if a.dim() < 2 or b.dim() < 2 or b.shape[-1] != a.shape[-1]:
        return None
    m, k, ncols = a.shape[-2], a.shape[-1], b.shape[-2]
    if a.numel() // max(1, m * k) != b.numel() // max(1, ncols * k) or (len(ins) == 3 and ins[2].numel() != ncols):
        return None  # broadcast batches, or a bias of another length: numpy's path
    keep = [t.contiguous() for t in ins]
    idx = torch.from_numpy(np.ascontiguousarray(index, dtype=np.int64))
    out = torch.empty(len(idx), dtype=torch.float64)
    total = a.numel() // max(1, k) * ncols
    bias = keep[2].data_ptr() if len(ins) == 3 else None
    rc = _FN(keep[0].data_ptr(), keep[1].data_ptr(), bias, m, k, ncols, total, idx.data_ptr(), len(idx), out.data_ptr())
    if rc == -2:
        raise IndexError(f"native replay: expected element indices in [0, {total}), got one outside")
    if rc:
        raise MemoryError("native replay: could not allocate a term row")
    return out.numpy()


_NORM = _bind("vt_replay_matmul_norm",
              [_p, _p, _p, _p, _i64, _i64, _i64, _i64, ctypes.c_int32, ctypes.c_double, ctypes.c_double,
               ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_double, _p, _p, _p, _p, _p, _i64,
               ctypes.c_int32, ctypes.c_double, _i64, _p, _p, _p, _p], _i64)

#: Candidates plus entries whose bounds :func:`matmul_norm_filter` computes (more: the caller's lazy path).
_POINTS_CAP = 4096

#: How far a checked replay's native pass may settle an op by itself (replay.c's ``REPLAY_*``):
#: ``OFF`` none (the full path for every op: tests compare it with the others); ``CANDIDATES`` an op
#: without entries only; ``ENTRIES`` one with entries too, each applied and checked (not far or wild,
#: finite, no unlogged suspect: ``rounding._apply_log_checked``'s checks, for a replay without
#: resolver); ``VERDICTS`` as ``ENTRIES``, each applied value also ``RN32(e)`` by the double-double
#: verdict and not -0 (what a resolver that ``rounding.upholds_rn32_entries`` returns unchanged).
OFF, CANDIDATES, ENTRIES, VERDICTS = -1, 0, 1, 2

Entries = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A rounding log's entries of one op as arrays: ``(index, code, value)`` (``rounding.OpLog``'s)."""


def _entry_args(entries: Entries | None) -> tuple[int, int | None, int | None, int | None, list[np.ndarray]]:
    """``(count, index, code, value)`` of the entries as the kernels take them (null pointers for none) and
    the arrays the pointers point into (to keep)."""
    if entries is None or not len(entries[0]):
        return 0, None, None, None, []
    index, code, value = entries
    keep = [np.ascontiguousarray(index, dtype=np.int64), np.ascontiguousarray(code, dtype=np.uint8),
            np.ascontiguousarray(value, dtype=np.float32)]
    return len(keep[0]), keep[0].ctypes.data, keep[1].ctypes.data, keep[2].ctypes.data, keep


_scratch = ThreadScratch()  # (each call copies its few results out)
#: A settled op's candidates and flags: never read (read-only, shared).
_NO_INDEX, _NO_FLAGS = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.bool_)
_NO_INDEX.flags.writeable = _NO_FLAGS.flags.writeable = False


class MatmulFiltered(NamedTuple):
    """What :func:`matmul_norm_filter` gives: ``r`` (``RN32(v)``, or the op's final output where
    ``settled``), the candidates (sorted flat int64), whether every ``r`` is finite, ``points``
    (``(d, grid, near)``: the bound and exact-grid rule at the candidates then the entries, the near-tie
    flags of the candidates; None above :data:`_POINTS_CAP`) and ``settled``: the pass settled the op
    (no suspect, every entry applied and upheld as ``mode`` demands; ``r`` holds the entries' values,
    and nothing else is read: the candidates empty, no points)."""

    r: torch.Tensor
    cand: np.ndarray
    finite: bool
    points: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    settled: bool


def matmul_norm_filter(
    ins: list[torch.Tensor], v: torch.Tensor, shape: tuple[int, int, int, int], entries: Entries | None,
    sub: float, factor: float, scale: float, coef: float, subn: float, slack: float,
    mode: int = CANDIDATES, far_reach: float = 0.0,
) -> MatmulFiltered | None:
    """The checked replay's MATMUL filter in one C call (``vt_replay_matmul_norm``): with a bias
    ``v += bias`` in place, ``(r, candidates, finite)`` of ``native_filter.round_filter(v, NormBound,
    scale)`` and ``points`` = (``min(NormBound.at, canonical.tight_bound_at)`` and
    ``canonical.grid_elements`` at the candidates and then at the entries' indices (as given),
    ``rounding._near_midpoint_np`` at the candidates with that bound and ``slack``), or None where
    there are more than :data:`_POINTS_CAP` points; ``settled`` as ``mode`` (:data:`CANDIDATES`,
    :data:`ENTRIES`, :data:`VERDICTS`) allows, ``far_reach``: ``rounding.FAR_REACH`` (the default 0 leaves
    directed entries to the caller's full path). ``shape``:
    ``native_rows.matmul_operands(ins, v)``; ``sub``, ``factor`` the norm bound's, ``coef``, ``subn``
    the tight bound's (``coef * (fl(S) + subn)``). None where the kernel is not loaded (``v`` untouched)."""
    if _NORM is None or not native.available():
        return None
    batches, m, k, ncols = shape
    keep = [t if t.is_contiguous() else t.contiguous() for t in ins]
    bias = keep[2].data_ptr() if len(ins) == 3 else None
    n_ent, ent, code, value, _held = _entry_args(entries)
    n = v.numel()
    r = torch.empty(v.shape, dtype=torch.float32)
    idx, idx_p = _scratch.get("idx", n, np.int64)  # pages are touched only where candidates land
    cap = min(n, _POINTS_CAP) + n_ent
    d_at, d_p = _scratch.get("d", cap, np.float64)
    grid, grid_p = _scratch.get("grid", cap, np.bool_)
    near, near_p = _scratch.get("near", cap, np.bool_)
    status, status_p = _scratch.get("status", 3, np.int64)
    count = _NORM(v.data_ptr(), keep[0].data_ptr(), keep[1].data_ptr(), bias, batches, m, k, ncols, 1, sub,
                  factor, scale, coef, subn, slack, r.data_ptr(), idx_p, ent, code, value, n_ent, mode, far_reach, cap,
                  d_p, grid_p, near_p, status_p)
    if count < 0:
        raise MemoryError("native replay: the MATMUL filter could not allocate its scratch rows")
    if status[2]:  # settled: r is the op's output, and nothing else is read
        return MatmulFiltered(r, _NO_INDEX, not status[0], None, True)
    p = count + n_ent
    points = (d_at[:p].copy(), grid[:p].copy(), near[:count].copy()) if status[1] else None
    return MatmulFiltered(r, idx[:count].copy(), not status[0], points, bool(status[2]))


_SUM = _bind("vt_replay_sum_values",
             [_p, _i64, _i64, ctypes.c_int32, ctypes.c_double, ctypes.c_double, ctypes.c_double, _p, _p, _p, _p,
              _p, _p, _p, _p, _p, _p, _i64, ctypes.c_int32, ctypes.c_double, _p], _i64)


class SumFiltered(NamedTuple):
    """What :func:`sum_values_grid` gives: ``v``, ``d``, ``r`` (``RN32(v)``, or the op's final output
    where ``settled``), the candidates, whether every ``r`` is finite, ``grid`` and ``near`` at the
    candidates (empty where ``settled``), and ``settled`` (:class:`MatmulFiltered`'s)."""

    v: torch.Tensor
    d: torch.Tensor
    r: torch.Tensor
    cand: np.ndarray
    finite: bool
    grid: np.ndarray
    near: np.ndarray
    settled: bool


def sum_values_grid(
    x: torch.Tensor, mean: bool, factor: float, scale: float, slack: float,
    entries: Entries | None = None, mode: int = CANDIDATES, far_reach: float = 0.0,
) -> SumFiltered | None:
    """``native_filter.sum_values_filter``'s ``(v, d, r, candidates, finite)`` of the rows of an FP32 CPU
    ``x`` (``[..., n]``, SUM or MEAN: ``mean``) and, at the candidates, ``canonical.grid_elements``
    (the exact-grid rule of each row) and ``rounding._near_midpoint_np(v, r, 2.0 * d * slack)``, and
    whether the op is settled with ``entries`` as ``mode`` allows (:func:`matmul_norm_filter`'s), in
    one C call (``vt_replay_sum_values``). None where the kernel is not loaded or does not take ``x``
    (another device or dtype, a 0-dim or empty row)."""
    if _SUM is None or not native.available() or x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() == 0:
        return None
    n = x.shape[-1]
    if n == 0:
        return None
    xc = x if x.is_contiguous() else x.contiguous()
    rows = xc.numel() // n
    shape = (*x.shape[:-1], 1)
    n_ent, ent, code, value, _held = _entry_args(entries)
    v = torch.empty(shape, dtype=torch.float64)
    d = torch.empty(shape, dtype=torch.float64)
    r = torch.empty(shape, dtype=torch.float32)
    idx, idx_p = _scratch.get("idx", rows, np.int64)
    grid, grid_p = _scratch.get("grid", rows, np.bool_)
    near, near_p = _scratch.get("near", rows, np.bool_)
    nonfinite, nonfinite_p = _scratch.get("nonfinite", 1, np.uint32)
    settled, settled_p = _scratch.get("settled", 1, np.int64)
    k = _SUM(xc.data_ptr(), rows, n, int(mean), factor, scale, slack, v.data_ptr(), d.data_ptr(), r.data_ptr(),
             idx_p, nonfinite_p, grid_p, near_p, ent, code, value, n_ent, mode, far_reach, settled_p)
    if k < 0:
        raise MemoryError("native replay: a SUM row could not be allocated")
    if settled[0]:  # r is the op's output, and nothing else is read
        return SumFiltered(v, d, r, _NO_INDEX, not nonfinite[0], _NO_FLAGS, _NO_FLAGS, True)
    return SumFiltered(v, d, r, idx[:k].copy(), not nonfinite[0], grid[:k].copy(), near[:k].copy(), False)
