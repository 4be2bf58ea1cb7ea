"""Reusable output buffers of the native kernels (indices, flags, status words), by name.

A certified step or replay calls the MATMUL and SUM kernels about a hundred times, each with buffers
of candidate indices (room for every element), decisions, flags and a status word that the caller
reads and copies out at once. A fresh ``torch.empty`` or ``np.empty`` and its address cost several
microseconds per call on the CPU (``ndarray.ctypes.data`` alone about one), more than the kernel
itself on the small ops most calls are; a :class:`Scratch` hands out the same memory instead, grown
when a call needs more.

A buffer stays valid until the next :meth:`Scratch.get` of its name: each call copies out what it
keeps. A :class:`Scratch` is not shared between threads (the executor owns one; :class:`ThreadScratch`
is one per thread). Buffers above :data:`MAX_BYTES` (a GPT-2 logits MATMUL's indices: 100 MB) are made
per call and not kept: touched only where candidates land, kept they would grow the resident memory
by whatever the run's candidates touched.
"""

from __future__ import annotations

import threading

import numpy as np

#: The largest buffer a scratch keeps between calls (bytes).
MAX_BYTES = 32 << 20


class Scratch:
    """Named buffers reused call after call (:meth:`get`); one per owner, not thread-safe."""

    def __init__(self) -> None:
        self.bufs: dict[str, tuple[np.ndarray, int]] = {}

    def get(self, name: str, n: int, dtype: type = np.int64) -> tuple[np.ndarray, int]:
        """``(buffer, address)``: at least ``n`` elements of ``dtype`` (contents undefined), valid until
        the next call for ``name``; kept for later calls up to :data:`MAX_BYTES`."""
        got = self.bufs.get(name)
        if got is not None and len(got[0]) >= n:
            return got
        a = np.empty(max(n, 1), dtype=dtype)
        made = (a, a.ctypes.data)
        if a.nbytes <= MAX_BYTES:
            self.bufs[name] = made
        return made


class ThreadScratch(Scratch, threading.local):
    """A :class:`Scratch` per thread (a module's kernels called from any thread)."""
