"""Reading a file that may come from someone else (a run folder, a spec, a deployment file):
one guard, so that a device, a FIFO or a huge file is refused before a byte of it is read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vtrain.errors import CorruptArtifact


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a file that may come from someone else: a regular file (never a
    device or a FIFO, which would be read without end; opened without blocking) of at most
    ``limit`` bytes, checked before a byte is read (CorruptArtifact naming the file and the limit).
    OSError (FileNotFoundError included) as raised."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CorruptArtifact(f"{what} {path}: not a regular file (not read)")
        if st.st_size > limit:
            raise CorruptArtifact(f"{what} {path}: {st.st_size} bytes, more than the {limit} bytes it can "
                                  "have (not read)")
        data = _read_upto(f, limit + 1, st.st_size + 1)
    if len(data) > limit:
        raise CorruptArtifact(f"{what} {path}: more than the {limit} bytes it can have (grew while read; not used)")
    return data


def _read_upto(f, cap: int, hint: int) -> bytes:
    """At most ``cap`` bytes of ``f`` up to its end, without ever asking for more memory than the
    file holds: a first read of ``hint`` bytes (its size when checked, plus one), then 1 MiB at a
    time while it grows (``cap`` may be far above any memory: a job's bound on its largest log)."""
    parts = [f.read(min(cap, hint))]
    total = len(parts[0])
    while total < cap and len(parts[-1]):
        parts.append(f.read(min(cap - total, 1 << 20)))
        total += len(parts[-1])
    return b"".join(parts)
