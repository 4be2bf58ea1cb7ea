"""Large CPU buffers recycled across a step's ops and across steps (:class:`BufferPool`).

A certified step at GPT-2 shapes makes and frees gigabytes of large tensors every step: the FP64
copies of each MATMUL's operands and its FP64 products, the rounded outputs, the flat optimizer's
new state. glibc serves every allocation above its mmap threshold (32 MiB at most) with fresh pages
from the kernel, so each of those bytes is page-faulted and zeroed again in every step: at GPT-2
117M shapes about 2.5 GB and a quarter of the step's CPU time (``scripts/bench_buffers.py``).

The pool keeps such buffers and hands one out again once nothing holds it any more: a buffer is
free when its storage's only owner is the pool (``torch._C._storage_Use_Count``), so a tensor a
caller keeps (a state slot, a trace entry, a view of either) is never written to. No value depends
on which buffer an op writes into. Buffers not taken again in a step are released at its end
(:meth:`BufferPool.retire`), so the pool holds at most one step's working set beyond what the step
itself holds; the free ones it keeps are marked lazily freeable (Linux ``MADV_FREE``): under memory
pressure the kernel takes their pages back (a later write faults in zeroed pages, as fresh memory
would), otherwise the next step writes them without a fault.
"""

from __future__ import annotations

import ctypes
import logging
import math
import sys
import threading
from dataclasses import dataclass, field

import torch

log = logging.getLogger(__name__)

POOL_MIN_BYTES = 4 << 20
"""Smaller requests go to ``torch.empty``: glibc's heap recycles those without page faults."""

POOL_SLACK = 1.25
"""A free buffer serves a request of at least ``1 / POOL_SLACK`` of its capacity."""

_PAGE = 4096

_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


_MADV_FREE = 8  # (Linux)
_PAGE_MASK = _PAGE - 1


def _madvise():
    """libc's ``madvise`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        f = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return f


_MADVISE = _madvise()


def _lazy_free(owner: torch.Tensor, capacity: int) -> None:
    """Mark the whole pages of a free buffer lazily freeable (its contents are never read again)."""
    if _MADVISE is None:
        return
    start = owner.data_ptr()
    lo, hi = (start + _PAGE_MASK) & ~_PAGE_MASK, (start + capacity) & ~_PAGE_MASK
    if hi > lo:
        _MADVISE(lo, hi - lo, _MADV_FREE)  # (a failure leaves the pages as they are: harmless)


def _free(owner: torch.Tensor) -> bool:
    """Whether nothing but the pool holds ``owner``'s storage (the pool's tensor and the temporary
    storage object of this call: 2)."""
    return _USE_COUNT(owner.untyped_storage()._cdata) <= 2  # type: ignore[misc]


@dataclass
class _Buffer:
    owner: torch.Tensor  # 1-D uint8, the pool's reference
    capacity: int
    taken: bool = True  # handed out since the last retire


@dataclass
class BufferPool:
    """Recycled large CPU buffers (see the module's docstring). ``enabled`` False, or a torch
    without the storage use count, makes :meth:`empty` plain ``torch.empty``."""

    min_bytes: int = POOL_MIN_BYTES
    enabled: bool = True
    _buffers: list[_Buffer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if _USE_COUNT is None:
            self.enabled = False

    def empty(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype``: a recycled buffer where
        one is free and fits, else a new one the pool keeps."""
        nbytes = math.prod(shape) * dtype.itemsize if self.enabled else 0
        if nbytes < self.min_bytes:
            return torch.empty(shape, dtype=dtype)
        with self._lock:
            best = None
            for b in self._buffers:
                if nbytes <= b.capacity <= nbytes * POOL_SLACK and (best is None or b.capacity < best.capacity) \
                        and _free(b.owner):
                    best = b
            if best is None:
                capacity = -(-nbytes // _PAGE) * _PAGE
                best = _Buffer(torch.empty(capacity, dtype=torch.uint8), capacity)
                self._buffers.append(best)
            best.taken = True
            return best.owner[:nbytes].view(dtype).view(shape)

    def retire(self) -> int:
        """End of a step: release the free buffers not handed out since the last call (still-held ones
        stay, and are dropped by the pool once they are free and unused for a step); returns the bytes
        released."""
        with self._lock:
            keep, released = [], 0
            for b in self._buffers:
                free = _free(b.owner)
                if not b.taken and free:
                    released += b.capacity
                    continue
                if free:
                    _lazy_free(b.owner, b.capacity)
                b.taken = False
                keep.append(b)
            self._buffers = keep
        if released:
            log.debug("buffer pool: released %d bytes, holds %d buffers", released, len(keep))
        return released

    def clear(self) -> None:
        """Drop every buffer (the held ones live on with their holders)."""
        with self._lock:
            self._buffers = []

    @property
    def held_bytes(self) -> int:
        """Bytes of the buffers the pool references (free or held)."""
        return sum(b.capacity for b in self._buffers)
