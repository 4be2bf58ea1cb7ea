"""A certified MATMUL's FP64 products from its FP32 operands in one native call (``csrc/numerics/gemm.c``).

``v = A.double() @ B.double().T`` over the batch: the operands are widened (exactly) into buffers
this object keeps, then torch's own BLAS ``dgemm`` (MKL, taken from ``libtorch_cpu``) multiplies them,
the routine ``torch.matmul`` calls for the same FP64 tensors. On the small MATMULs of a small model the
two ``Tensor.double()`` copies and the ``torch.matmul``, each with torch's dispatch and a fresh
buffer, cost more than the arithmetic; here they are one call into reused memory.

No value depends on the summation order: the certified rule bounds the error of any FP64 evaluation
(``executor._norm_bound``) and decides candidates from exact values. The bits are the same as
``torch.matmul``'s all the same where both call the same dgemm (``tests/test_native_gemm.py``).

Where torch has no MKL (or ``VTRAIN_NATIVE_GEMM=0``, or the kernels are not built) :meth:`Products.__call__`
returns None and the caller takes torch's path.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import torch

from vtrain.numerics import native

log = logging.getLogger(__name__)


def _dgemm_address() -> int | None:
    """The address of torch's BLAS ``dgemm_`` (LP64), or None where torch is not built with MKL."""
    if os.environ.get("VTRAIN_NATIVE_GEMM", "1") == "0" or not torch.backends.mkl.is_available():
        return None
    try:
        blas = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        return ctypes.cast(blas.dgemm_, ctypes.c_void_p).value
    except (OSError, AttributeError) as e:
        log.info("torch's dgemm_ not found (%s); MATMUL products through torch.matmul", e)
        return None


def _bind():
    lib = native.lib()
    if lib is None or not hasattr(lib, "vt_matmul_products"):
        return None, None
    dgemm = _dgemm_address()
    if dgemm is None:
        return None, None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.vt_matmul_products.argtypes = [p, p, i64, i64, i64, i64, p, p, p, p]
    lib.vt_matmul_products.restype = ctypes.c_int
    return lib.vt_matmul_products, dgemm


_PRODUCTS, _DGEMM = _bind()
#: int sizes of an LP64 dgemm
_INT_MAX = 2**31 - 1
_F32 = torch.float32
#: The largest FP64 operand or product buffer :class:`Products` keeps (the buffer pool's threshold).
MAX_BYTES = 4 << 20


def available() -> bool:
    """True where :class:`Products` computes (the kernels built, torch's MKL dgemm found)."""
    return _PRODUCTS is not None


class Products:
    """FP64 products of FP32 MATMUL operands into buffers reused call after call (one per executor;
    not thread-safe). The ``v`` a call returns is valid until the next call. Only small MATMULs are
    taken (each buffer at most :data:`MAX_BYTES`): on large ones the arithmetic dwarfs the fixed
    costs saved, and their buffers come from the executor's pool (kept, they would be held twice)."""

    __slots__ = ("_a64", "_b64", "_v", "_views")

    def __init__(self) -> None:
        self._a64 = self._b64 = self._v = torch.empty(0, dtype=torch.float64)
        self._views: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
        """``v = a.double() @ b.double().transpose(-1, -2)`` (FP64, C-contiguous ``[..., m, n]``) for
        C-contiguous FP32 CPU ``a`` ``[..., m, k]`` and ``b`` ``[..., n, k]`` with the same batch dims;
        None where the kernel does not take them (the caller uses torch)."""
        if _PRODUCTS is None:
            return None
        sa, sb = a.shape, b.shape
        if len(sa) < 2 or len(sb) != len(sa) or sa[:-2] != sb[:-2] or sa[-1] != sb[-1]:
            return None
        m, k, n = sa[-2], sa[-1], sb[-2]
        na, nb = a.numel(), b.numel()
        if not (na and nb) or max(m, k, n) > _INT_MAX or a.dtype is not _F32 or b.dtype is not _F32:
            return None
        if not (a.is_cpu and b.is_cpu and a.is_contiguous() and b.is_contiguous()):
            return None
        batches = na // (m * k)
        nv = batches * m * n
        if max(na, nb, nv) * 8 > MAX_BYTES:
            return None
        if na > self._a64.numel():
            self._a64 = torch.empty(na, dtype=torch.float64)
        if nb > self._b64.numel():
            self._b64 = torch.empty(nb, dtype=torch.float64)
        if nv > self._v.numel():
            self._v = torch.empty(nv, dtype=torch.float64)
            self._views.clear()
        out_shape = (*sa[:-1], n)
        v = self._views.get(out_shape)
        if v is None:
            v = self._views[out_shape] = self._v[:nv].view(out_shape)
        if _PRODUCTS(a.data_ptr(), b.data_ptr(), batches, m, k, n, self._a64.data_ptr(), self._b64.data_ptr(),
                     v.data_ptr(), _DGEMM) != 0:
            return None
        return v
