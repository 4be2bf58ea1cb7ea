"""Reading a file that may come from someone else (a run folder, a spec, a deployment file):
one guard, so that a device, a FIFO or a huge file is refused before a byte of it is read.

Each file is opened once and everything is checked on, and read from, that open descriptor (its
type and size by ``fstat``): a file swapped for another after the check is never read by name
again. Inside a folder (:func:`open_beneath`) no component is followed if it is a link, so a
link planted or swapped in after the folder was checked cannot lead the read, or a write
(:func:`write_beneath`, :func:`open_append_beneath`), anywhere else. Hard links: a read gets the
bytes of the file the name links (the same bytes a copy would hold, checked like any other);
writes replace names (a temp file and a rename, never writing into an existing file), and the
one file written in place (an append) must have no other name (docs/security.md).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path

from vtrain.errors import CorruptArtifact

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_LINKED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a file that may come from someone else: a regular file (never a
    device or a FIFO, which would be read without end; opened without blocking) of at most
    ``limit`` bytes, checked before a byte is read (CorruptArtifact naming the file and the limit).
    OSError (FileNotFoundError included) as raised. (A link named by the user is followed: this
    is a path someone gave; inside a folder use :func:`read_beneath`.)"""
    return _read_fd(os.open(path, os.O_RDONLY | os.O_NONBLOCK), path, limit, what)


def read_beneath(root: Path, rel: Path, limit: int, what: str) -> bytes:
    """:func:`read_regular` of ``root / rel`` through :func:`open_beneath` (no link followed)."""
    return _read_fd(open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK, what), root / rel, limit, what)


def hash_beneath(root: Path, rel: Path, what: str) -> str:
    """The sha256 (hex) of the regular file ``root / rel`` (:func:`open_beneath`), streamed from
    one descriptor and bounded by its size when opened: a file that grows while it is hashed is
    refused (CorruptArtifact), a device or a FIFO is never read."""
    path = root / rel
    with os.fdopen(open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK, what), "rb") as f:
        size = _regular_size(f.fileno(), path, what)
        h = hashlib.sha256()
        left = size
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise CorruptArtifact(f"{what} {path}: shrank while read (not used)")
            h.update(chunk)
            left -= len(chunk)
        if f.read(1):
            raise CorruptArtifact(f"{what} {path}: grew while read (not used)")
    return h.hexdigest()


def open_beneath(root: Path, rel: Path, flags: int, what: str, *, make_dirs: bool = False) -> int:
    """A descriptor of ``root / rel`` opened with ``flags`` following no link at any component of
    ``rel`` (each opened relative to its parent's descriptor with O_NOFOLLOW; ``root`` itself is
    opened as given). ``make_dirs`` creates missing folders on the way. A link met on the way is
    CorruptArtifact naming the path; other OSError as raised."""
    parts = Path(rel).parts
    if not parts or any(p in ("", ".", "..") for p in parts) or Path(rel).is_absolute():
        raise CorruptArtifact(f"{what} {rel!s}: expected a path inside {root}")
    fd = os.open(root, os.O_RDONLY | _DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not make_dirs:
                    raise
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                nxt = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | _NOFOLLOW, 0o600, dir_fd=fd)
    except OSError as e:
        if e.errno in _LINKED:
            raise CorruptArtifact(f"{what} {root / rel}: a link in the folder (not followed)") from None
        raise
    finally:
        os.close(fd)


def write_beneath(root: Path, rel: Path, data: bytes, what: str) -> None:
    """Write ``data`` to ``root / rel`` atomically, following no link inside ``root``: a new temp
    file in the same folder (O_EXCL, no link followed), fsync, then a rename over the name (a link
    or another name of the old file is replaced, never written through)."""
    rel = Path(rel)
    parent = rel.parent
    name = rel.name
    tmp = f".{name}.{secrets.token_hex(6)}"
    fd = open_beneath(root, parent / tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what, make_dirs=True)
    dfd = None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        dfd = open_dir_beneath(root, parent, what)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            if dfd is None:
                dfd = open_dir_beneath(root, parent, what)
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    finally:
        if dfd is not None:
            os.close(dfd)


def open_append_beneath(root: Path, rel: Path, what: str) -> int:
    """A read-write append descriptor of ``root / rel`` (created when absent), no link followed:
    a regular file with no other name (a hard link would carry the write into another file)."""
    fd = open_beneath(root, rel, os.O_RDWR | os.O_CREAT | os.O_APPEND, what, make_dirs=True)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names (hard links)"
        raise CorruptArtifact(f"{what} {root / rel}: {why}; not written")
    return fd


def open_dir_beneath(root: Path, rel: Path, what: str) -> int:
    """A descriptor of the folder ``root / rel`` (``rel`` may be empty), no link followed."""
    if not Path(rel).parts:
        return os.open(root, os.O_RDONLY | _DIRECTORY)
    return open_beneath(root, rel, os.O_RDONLY | _DIRECTORY, what)


def _regular_size(fd: int, path: Path, what: str) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise CorruptArtifact(f"{what} {path}: not a regular file (not read)")
    return st.st_size


def _read_fd(fd: int, path: Path, limit: int, what: str) -> bytes:
    with os.fdopen(fd, "rb") as f:
        size = _regular_size(f.fileno(), path, what)
        if size > limit:
            raise CorruptArtifact(f"{what} {path}: {size} bytes, more than the {limit} bytes it can "
                                  "have (not read)")
        data = _read_upto(f, limit + 1, size + 1)
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


#: Deepest nesting of arrays and objects :func:`loads_json` parses (the layouts read nest 4 deep).
MAX_JSON_DEPTH = 64


def json_depth(raw: bytes) -> int:
    """Deepest nesting of ``[``/``{`` outside strings in ``raw`` (an upper bound of what a JSON
    parser recurses into, valid JSON or not), counted without recursion in one pass."""
    import numpy as np

    # escapes first (left to right, as a parser reads them): every quote left opens or closes a string
    a = np.frombuffer(raw.replace(b"\\\\", b"__").replace(b'\\"', b"__"), dtype=np.uint8)
    if a.size == 0:
        return 0
    outside = (np.cumsum(a == ord('"')) & 1) == 0
    step = (((a == ord("[")) | (a == ord("{"))) & outside).astype(np.int64)
    step -= (((a == ord("]")) | (a == ord("}"))) & outside).astype(np.int64)
    return int(np.cumsum(step).max(initial=0))


def loads_json(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH):  # noqa: ANN201 (any JSON value)
    """``json.loads`` of bytes from someone else, refused (``json.JSONDecodeError``, like any bad
    JSON) when nested deeper than ``max_depth``. The C parser recurses once per level up to the
    interpreter's recursion limit, which a dependency raises to 100,000 (eth-keyfile): 200,000
    nested brackets in a 400 KB file then overflow the C stack and kill the process (SIGSEGV),
    where a ``RecursionError`` could have been caught."""
    import json

    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
    # fewer brackets than the bound cannot nest past it (the usual case: no scan at all)
    if data.count(b"[") + data.count(b"{") > max_depth and (depth := json_depth(data)) > max_depth:
        raise json.JSONDecodeError(f"nested {depth} deep, more than {max_depth}", data.decode("latin-1")[:64], 0)
    return json.loads(data)
