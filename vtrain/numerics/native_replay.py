"""The replay's tight MATMUL bound at a few elements in C (``csrc/numerics/replay.c``).

:func:`matmul_abs_sums` gives ``fl(S) = np.abs(t).sum(axis=1)`` of the exact FP64 terms of MATMUL elements
(``canonical._terms``): the same operations in the same order, so the same bits (tested), without
gathering the ``[C, K]`` term rows. None where the kernel is not loaded or does not take the inputs:
the caller runs numpy.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from vtrain.numerics import native


def _bind():
    lib = native.lib()
    if lib is None or not hasattr(lib, "vt_replay_matmul_abs_sums"):
        return None
    f = lib.vt_replay_matmul_abs_sums
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    f.argtypes = [p, p, p, i64, i64, i64, i64, p, i64, p]
    f.restype = ctypes.c_int
    return f


_FN = _bind()


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
