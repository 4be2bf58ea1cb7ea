"""A reusable int64 scratch buffer for the native kernels' index and status outputs.

A certified step calls the MATMUL and SUM kernels about a hundred times, each with a buffer of
candidate indices (room for every element), decisions and a status word that the caller reads and
copies out at once. A fresh ``torch.empty`` and its numpy view cost about 5 us per call on the CPU,
more than the kernel itself on the small ops that most calls are; one :class:`Scratch` per executor
hands out the same memory instead, grown when a call needs more.

A scratch is not shared between threads: each executor owns its own, and each call takes it whole
(the previous call's contents are dead once that call has copied out what it keeps). Calls that
need more than :data:`MAX_ITEMS` (a GPT-2 logits MATMUL: 13 M) get ``None`` and allocate their own,
as before: a buffer that large is touched only where candidates land, and kept it would grow the
resident memory by whatever they touched over the run.
"""

from __future__ import annotations

import numpy as np

#: The largest buffer a scratch keeps (int64 items: 8 MiB).
MAX_ITEMS = 1 << 20


class Scratch:
    """One int64 buffer reused call after call (:meth:`take`); not thread-safe (one per executor)."""

    __slots__ = ("_buf", "_addr")

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.int64)
        self._addr = 0

    def take(self, n: int) -> tuple[np.ndarray, int] | None:
        """``(buffer, address)`` of at least ``n`` int64 items (its contents undefined), valid until
        the next :meth:`take`; None where ``n`` is above :data:`MAX_ITEMS` (the caller allocates)."""
        if n > len(self._buf):
            if n > MAX_ITEMS:
                return None
            self._buf = np.empty(min(max(n, 2 * len(self._buf)), MAX_ITEMS), dtype=np.int64)
            self._addr = self._buf.ctypes.data
        return self._buf, self._addr
