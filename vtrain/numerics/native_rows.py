"""Native decisions of candidate rows (``csrc/numerics/rows.c``): one C call per op.

The C kernels perform exactly the IEEE operations of the numpy path in :mod:`vtrain.numerics.canonical`
(``_terms``, ``np.abs(t).sum(axis=1)``, ``_tight_candidates``, ``grid_exact``, ``_dd_sum``/``_decide_dd``
and the double-double comparison of ``is_exact_rounding``), one row at a time, so they give its bits;
the numpy path stays the specification and the fallback (``tests/test_native_rows.py`` compares them).

Each function returns None when the kernels are not loaded (``native.available()`` False) or the
inputs are not the FP32 CPU tensors the kernels read; callers then run the numpy path.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from vtrain.graph.step_graph import OpKind
from vtrain.numerics import native
from vtrain.numerics.rounding import Code

_KIND = {OpKind.MATMUL: 0, OpKind.SUM: 1, OpKind.MEAN: 2}
_SRC_MATMUL, _SRC_ROWS32, _SRC_TERMS64 = 0, 1, 2
#: ``status`` bits of :func:`decide`.
DECIDED, DROPPED = 1, 2
#: Verdicts of :func:`is_rn32`.
NO, YES, UNDECIDED = 0, 1, 2
assert (int(Code.NONE), int(Code.DOWN), int(Code.UP), int(Code.EXPLICIT)) == (0, 1, 2, 3)  # rows.c's CODE_*


class _Source(ctypes.Structure):
    """``Src`` of rows.c: where the terms of a row come from."""

    _fields_ = [
        ("src", ctypes.c_int32),
        ("has_bias", ctypes.c_int32),
        ("a", ctypes.c_void_p),
        ("b", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("m", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("ncols", ctypes.c_int64),
        ("x", ctypes.c_void_p),
        ("t", ctypes.c_void_p),
        ("n", ctypes.c_int64),
    ]


def _bind() -> ctypes.CDLL | None:
    lib = native.lib()
    if lib is None or not hasattr(lib, "vt_rows_decide"):
        return None
    p, i32, i64, f64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
    src = ctypes.POINTER(_Source)
    lib.vt_rows_decide.argtypes = [src, i32, p, i64, p, p, f64, f64, p, p, p]
    lib.vt_rows_is_rn32.argtypes = [src, i32, p, i64, p, p]
    lib.vt_rows_grid.argtypes = [src, i32, p, i64, p]
    for f in (lib.vt_rows_decide, lib.vt_rows_is_rn32, lib.vt_rows_grid):
        f.restype = ctypes.c_int
    return lib


_LIB = _bind()


def available() -> bool:
    """True when the row kernels are loaded."""
    return _LIB is not None


class _Operands:
    """The term source of an op's candidates, with the numpy arrays it points into kept alive."""

    def __init__(self, kind: OpKind, ins: list[torch.Tensor] | None = None, rows: np.ndarray | None = None):
        self.keep: list[np.ndarray] = []
        if rows is not None:
            t = self._hold(rows, np.float64)
            self.src = _Source(_SRC_TERMS64, 0, None, None, None, 0, 0, 0, None, t.ctypes.data, t.shape[1])
            self.n = t.shape[1]
        elif kind == OpKind.MATMUL:
            a, b = (self._hold(x.detach().numpy(), np.float32) for x in ins[:2])
            bias = self._hold(ins[2].detach().numpy().reshape(-1), np.float32) if len(ins) == 3 else None
            m, k, ncols = a.shape[-2], a.shape[-1], b.shape[-2]
            self.src = _Source(_SRC_MATMUL, bias is not None, a.ctypes.data, b.ctypes.data,
                               None if bias is None else bias.ctypes.data, m, k, ncols, None, None, 0)
            self.n = k + (bias is not None)
        else:
            x = self._hold(ins[0].detach().numpy(), np.float32)
            self.src = _Source(_SRC_ROWS32, 0, None, None, None, 0, 0, 0, x.ctypes.data, None, x.shape[-1])
            self.n = x.shape[-1]

    def _hold(self, x: np.ndarray, dtype: type) -> np.ndarray:
        if x.dtype != dtype:
            raise TypeError(f"native rows: expected {np.dtype(dtype).name} operands, got {x.dtype}")
        x = np.ascontiguousarray(x)
        self.keep.append(x)
        return x


def _usable(ins: list[torch.Tensor]) -> bool:
    return _LIB is not None and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ins)


def _index(cand: np.ndarray | None) -> tuple[np.ndarray | None, int | None]:
    if cand is None:
        return None, None
    c = np.ascontiguousarray(cand, dtype=np.int64)
    return c, c.ctypes.data


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise MemoryError(f"native rows: {what} could not allocate its scratch rows")


def decide(
    kind: OpKind,
    ins: list[torch.Tensor] | None,
    cand: np.ndarray | None,
    *,
    rows: np.ndarray | None = None,
    tight: tuple[np.ndarray, np.ndarray, float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(bits int64, codes int64, decided bool, dropped bool)`` per candidate of a MATMUL/SUM/MEAN op:
    from the op's FP32 inputs ``ins`` at flat element indices ``cand``, or from given FP64 term rows
    ``rows [C, n]`` (``cand`` None). ``tight = (v, r, coef, band)`` (the op's flat FP64 values and FP32
    outputs, ``TRAINER_BOUND_SLACK * gamma(n)`` and the candidate band) runs the MATMUL tight
    re-filter first; the rows it drops are ``dropped`` and undecided. None: use the numpy path."""
    if rows is None and not _usable(ins):
        return None
    if _LIB is None:
        return None
    ops = _Operands(kind, ins, rows)
    c_arr, c_ptr = _index(cand)
    c = len(c_arr) if c_arr is not None else rows.shape[0]
    bits = np.empty(c, dtype=np.int64)
    codes = np.empty(c, dtype=np.int64)
    status = np.empty(c, dtype=np.uint8)
    v_ptr = r_ptr = None
    coef = band = 0.0
    if tight is not None:
        v, r, coef, band = tight
        v, r = np.ascontiguousarray(v, np.float64), np.ascontiguousarray(r, np.float32)
        v_ptr, r_ptr = v.ctypes.data, r.ctypes.data
    _check(_LIB.vt_rows_decide(ctypes.byref(ops.src), _KIND[kind], c_ptr, c, v_ptr, r_ptr, coef, band,
                               bits.ctypes.data, codes.ctypes.data, status.ctypes.data), "decide")
    return bits, codes, (status & DECIDED) != 0, (status & DROPPED) != 0


def is_rn32(kind: OpKind, ins: list[torch.Tensor], cand: np.ndarray, claimed: np.ndarray) -> np.ndarray | None:
    """Per element at flat ``cand``: ``YES`` when the claimed FP32 bits are RN32 of its exact value by the
    double-double comparison, ``NO`` when they are not, ``UNDECIDED`` when too close to call. None:
    use the numpy path."""
    if not _usable(ins):
        return None
    ops = _Operands(kind, ins)
    c_arr, c_ptr = _index(cand)
    claim = np.ascontiguousarray(claimed, dtype=np.uint32)
    verdict = np.empty(len(c_arr), dtype=np.uint8)
    _check(_LIB.vt_rows_is_rn32(ctypes.byref(ops.src), _KIND[kind], c_ptr, len(c_arr), claim.ctypes.data,
                                verdict.ctypes.data), "is_rn32")
    return verdict


def grid(kind: OpKind, ins: list[torch.Tensor], cand: np.ndarray) -> np.ndarray | None:
    """The exact-grid rule (``canonical.grid_exact``) of the elements at flat ``cand``; None: numpy."""
    if not _usable(ins):
        return None
    ops = _Operands(kind, ins)
    c_arr, c_ptr = _index(cand)
    out = np.empty(len(c_arr), dtype=np.uint8)
    _check(_LIB.vt_rows_grid(ctypes.byref(ops.src), _KIND[kind], c_ptr, len(c_arr), out.ctypes.data), "grid")
    return out.astype(bool)
