"""FP32-exact elementwise ops in one native pass (``csrc/numerics/fp32.c``).

``binary(code, a, b, shape)`` computes ``a OP b`` (one IEEE binary32 add, sub, mul or div per
element, broadcast to ``shape``), adds ``+0.0`` (canonical zeros) and reports whether every result
is finite, in one pass: the bits of ``torch.<op>(a, b) + 0.0`` on the CPU (both are one correctly
rounded FP32 operation per element), without torch's two extra passes (the zero and the min/max
probe) and its fixed cost per call. ``sqrt(a)``: ``RN32(sqrt(a)) + 0.0`` and finiteness, the bits
of the FP64 path (``torch.sqrt`` of the FP64 input rounded to FP32: both square roots are correctly
rounded and the double rounding is innocuous).

The torch / FP64 paths stay the fallback (:func:`available` False: library absent or
``VTRAIN_NATIVE_NUMERICS=0``); tests compare the two bit for bit (``tests/test_native_fp32.py``).
"""

from __future__ import annotations

import ctypes

import torch

from vtrain.numerics import native

ADD, SUB, MUL, DIV = 0, 1, 2, 3
"""Op codes of ``vt_fp32_binary``."""

_MAX_DIMS = 16
_MAX_LAYOUTS = 4096

_LIB = native.lib()
_FN = getattr(_LIB, "vt_fp32_binary", None) if _LIB is not None else None
if _FN is not None:
    _FN.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_int]
    _FN.restype = ctypes.c_int
_SQRT = getattr(_LIB, "vt_fp32_sqrt", None) if _LIB is not None else None
if _SQRT is not None:
    _SQRT.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    _SQRT.restype = ctypes.c_int
_TRANSPOSE = getattr(_LIB, "vt_transpose32", None) if _LIB is not None else None
if _TRANSPOSE is not None:
    _TRANSPOSE.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    _TRANSPOSE.restype = None

# (shape, a's shape and strides, b's shape and strides) -> the kernel's int64 arrays (kept alive here)
_LAYOUTS: dict[tuple, tuple[int, int, int, int, tuple]] = {}


def available() -> bool:
    """True when the native kernels are loaded."""
    return _FN is not None and _SQRT is not None


def _broadcast_strides(t: torch.Tensor, shape: tuple[int, ...]) -> list[int]:
    if t.dim() == 0:
        return [0] * len(shape)
    if t.dim() != len(shape):
        raise ValueError(f"fp32 kernel: expected rank {len(shape)} or a scalar, got shape {tuple(t.shape)}")
    out = []
    for n, m, s in zip(t.shape, shape, t.stride(), strict=True):
        if n == m:
            out.append(s)
        elif n == 1:
            out.append(0)
        else:
            raise ValueError(f"fp32 kernel: shape {tuple(t.shape)} does not broadcast to {shape}")
    return out


def _layout(shape: tuple[int, ...], a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, int, tuple]:
    key = (shape, a.shape, a.stride(), b.shape, b.stride())
    got = _LAYOUTS.get(key)
    if got is None:
        if len(shape) > _MAX_DIMS:
            raise ValueError(f"fp32 kernel: expected at most {_MAX_DIMS} dims, got {len(shape)}")
        arr = ctypes.c_int64 * max(1, len(shape))
        sa, sb, sh = arr(*_broadcast_strides(a, shape)), arr(*_broadcast_strides(b, shape)), arr(*shape)
        got = (ctypes.addressof(sa), ctypes.addressof(sb), ctypes.addressof(sh), len(shape), (sa, sb, sh))
        if len(_LAYOUTS) >= _MAX_LAYOUTS:  # a graph has a few dozen; never grow without bound
            _LAYOUTS.clear()
        _LAYOUTS[key] = got
    return got


def binary(
    code: int, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...], out: torch.Tensor | None = None
) -> tuple[torch.Tensor, bool] | None:
    """``(a OP b + 0.0, all finite)`` as a contiguous FP32 CPU tensor of ``shape``; None when the
    kernel does not apply (not loaded, or an input not an FP32 CPU tensor): use torch then.

    ``a`` and ``b``: FP32 tensors of ``shape``'s rank broadcasting to it, or 0-dim (a scalar),
    with any strides (views are read in place). ``out``: a contiguous FP32 CPU buffer of as many
    elements to write into (it must not overlap ``a`` or ``b``); a fresh tensor when None."""
    if _FN is None or a.dtype is not torch.float32 or b.dtype is not torch.float32 or not (a.is_cpu and b.is_cpu):
        return None
    pa, pb, psh, nd, _ = _layout(shape, a, b)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    else:
        if out.dtype is not torch.float32 or not out.is_cpu or not out.is_contiguous():
            raise ValueError(f"fp32 kernel: out must be a contiguous float32 CPU tensor, got {out.dtype} {out.device}")
        out = out.view(shape)
    ok = _FN(code, a.data_ptr(), pa, b.data_ptr(), pb, out.data_ptr(), psh, nd)
    if ok < 0:
        raise ValueError(f"fp32 kernel: bad arguments (op {code}, {nd} dims)")
    return out, ok == 1


def sqrt(a: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, bool] | None:
    """``(RN32(sqrt(a)) + 0.0, all finite)`` for a contiguous FP32 CPU tensor ``a`` (None when the
    kernel does not apply: use the FP64 path then); ``out`` as in :func:`binary`."""
    if _SQRT is None or a.dtype is not torch.float32 or not a.is_cpu or not a.is_contiguous():
        return None
    if out is None:
        out = torch.empty(a.shape, dtype=torch.float32)
    else:
        if out.dtype is not torch.float32 or not out.is_cpu or not out.is_contiguous():
            raise ValueError(f"fp32 kernel: out must be a contiguous float32 CPU tensor, got {out.dtype} {out.device}")
        out = out.view(a.shape)
    ok = _SQRT(a.data_ptr(), out.data_ptr(), a.numel())
    return out, ok == 1


def swaps_last_two(perm: tuple[int, ...]) -> bool:
    """Whether ``perm`` keeps the leading axes and swaps the last two (what :func:`transpose` moves)."""
    n = len(perm)
    return n >= 2 and tuple(perm) == (*range(n - 2), n - 1, n - 2)


def transpose(a: torch.Tensor) -> torch.Tensor | None:
    """``a`` with its last two axes swapped, as a fresh contiguous tensor: the bits of
    ``a.transpose(-1, -2).contiguous()`` (a copy), in cache-sized tiles. ``a``: a C-contiguous FP32
    CPU tensor of at least 2 dims; None when the kernel does not apply (use torch then)."""
    if _TRANSPOSE is None or a.dtype is not torch.float32 or not a.is_cpu or a.dim() < 2 or not a.is_contiguous():
        return None
    rows, cols = a.shape[-2], a.shape[-1]
    out = torch.empty((*a.shape[:-2], cols, rows), dtype=torch.float32)
    if out.numel():
        _TRANSPOSE(a.data_ptr(), a.numel() // (rows * cols), rows, cols, out.data_ptr())
    return out
