"""Artifact store: what a trainer publishes for auditors, content-addressed and verified on read.

Layout of one job under the store's root folder (all writes atomic: temp file in the same folder,
fsync, ``os.replace``; readers ignore ``.tmp-*`` leftovers of a crash)::

    <root>/<job>/objects/<sha256 hex>           blobs: rounding logs, checkpoints
    <root>/<job>/steps/<s>.json                 StepRecord: s, state_root, log_root, components
    <root>/<job>/logs/<s>.json                  {"digest": "0x..", "size": n} -> objects/
    <root>/<job>/checkpoints/<interval>.json    {"digest": "0x..", "size": n} -> objects/

Every read is verified: a blob must hash to its name, a step record's state root must be the tree
of its components, an index's size must match its blob. :class:`ArtifactStore` reads and writes a
local folder; :func:`serve_store` serves the same layout read-only over HTTP and
:class:`HttpArtifactReader` reads it with the same API. Rounding-log bytes are opaque here (their
format belongs to ``vtrain.numerics.logfile``); checkpoints are safetensors bytes made by
:func:`save_checkpoint`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import http.server
import json
import logging
import os
import re
import socket
import stat
import struct
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vtrain.commit.roots import state_root as _state_root
from vtrain.commit.roots import step_leaf
from vtrain.errors import CorruptArtifact, CorruptCheckpoint, CorruptStepRecord, MissingArtifact, VtrainError
from vtrain.training.untrusted import loads_json
from vtrain.types import Digest, Root

log = logging.getLogger(__name__)

__all__ = [
    "ArtifactReader",
    "ArtifactStore",
    "ArtifactTooLarge",
    "ArtifactUnavailable",
    "BlobRef",
    "HttpArtifactReader",
    "StepRecord",
    "load_checkpoint",
    "save_checkpoint",
    "serve_store",
]

#: Folder of a job's local work files (the trainer's dispute cache): never served, not artifacts.
LOCAL_DIR = "local"
_LOCAL_RE = re.compile(r"local(?:/[a-z0-9][a-z0-9._-]{0,127}){1,3}")
_JOB_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_PATH_RE = re.compile(
    r"/(?P<job>[A-Za-z0-9][A-Za-z0-9._-]{0,127})/"
    r"(?P<rel>objects/[0-9a-f]{64}|(?:steps|logs|checkpoints)/(?:0|[1-9][0-9]{0,19})\.json)"
)


class ArtifactUnavailable(VtrainError):
    """Raised when an artifact server cannot be reached or answers with an error after retries."""


#: Least average rate (bytes per second) an artifact server must keep, past the socket timeout, for
#: a read to go on (see :class:`HttpArtifactReader`).
MIN_READ_RATE = 1 << 20

#: Most bytes of a JSON file of the layout read (a step record of ~250,000 components; an index is
#: ~100 bytes): a server cannot make a reader hold more in memory before anything is checked.
MAX_JSON_BYTES = 16 << 20
#: Most bytes of a blob (log, checkpoint) a reader takes by default; an auditor sets its job's own
#: bound (``protocol.auditor.artifact_bound``). A blob is also never read past its index's size.
DEFAULT_MAX_BLOB_BYTES = 1 << 30


class ArtifactTooLarge(CorruptArtifact):
    """A served file is larger than a reader takes (named with its size and the limit): refused
    before its bytes are read into memory."""


def _job(job: str | int) -> str:
    if isinstance(job, int) and not isinstance(job, bool) and job >= 0:
        return str(job)
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job):
        raise ValueError(
            f"job: expected a non-negative int or a name matching {_JOB_RE.pattern}, got {job!r}"
        )
    return job


def _nonneg(x: Any, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ValueError(f"{what}: expected a non-negative int, got {x!r}")
    return x


def _digest(x: Any) -> Digest:
    if not isinstance(x, bytes) or len(x) != 32:
        raise ValueError(f"digest: expected 32 bytes, got {x!r:.80}")
    return Digest(x)


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


def _unhex32(s: Any, what: str) -> bytes:
    if not isinstance(s, str) or not re.fullmatch(r"0x[0-9a-f]{64}", s):
        raise ValueError(f"{what}: expected 0x and 64 lowercase hex digits, got {s!r:.80}")
    return bytes.fromhex(s[2:])


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()


# ---------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class StepRecord:
    """The published fields of step leaf ``s`` plus the state components behind its state root.

    Construction checks that ``state_root`` is the tree of ``components``, so a record read back
    from a store is self-consistent (the leaf itself is checked against the chain by the caller).
    """

    s: int
    state_root: Root
    log_root: Root
    components: tuple[Root, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.components, tuple) or not self.components:
            raise ValueError(
                f"components: expected a non-empty tuple of roots, got {self.components!r:.80}"
            )
        step_leaf(self.s, self.state_root, self.log_root)  # validates s >= 1 and both roots
        computed = _state_root(self.components)
        if not hmac.compare_digest(computed, self.state_root):
            raise ValueError(
                f"state_root: expected the tree of the components {_hex(computed)}, "
                f"got {_hex(self.state_root)}"
            )

    def leaf(self) -> bytes:
        """Step leaf data ``uint64be(s) || state_root || log_root``."""
        return step_leaf(self.s, self.state_root, self.log_root)

    def to_json(self) -> dict[str, Any]:
        """``{"s", "state_root", "log_root", "components"}`` with 0x-hex roots."""
        return {
            "s": self.s,
            "state_root": _hex(self.state_root),
            "log_root": _hex(self.log_root),
            "components": [_hex(c) for c in self.components],
        }

    @classmethod
    def from_json(cls, obj: Any) -> StepRecord:
        """Parse :meth:`to_json` output; raises ValueError when malformed or inconsistent."""
        if not isinstance(obj, dict) or set(obj) != {"s", "state_root", "log_root", "components"}:
            raise ValueError(
                f"step record: expected keys s, state_root, log_root, components, got {obj!r:.120}"
            )
        comps = obj["components"]
        if not isinstance(comps, list):
            raise ValueError(f"components: expected a list, got {type(comps).__name__}")
        return cls(
            obj["s"],
            Root(_unhex32(obj["state_root"], "state_root")),
            Root(_unhex32(obj["log_root"], "log_root")),
            tuple(Root(_unhex32(c, f"components[{i}]")) for i, c in enumerate(comps)),
        )


@dataclass(frozen=True)
class BlobRef:
    """Index entry naming a blob: its sha256 and length."""

    digest: Digest
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"digest": _hex(self.digest), "size": self.size}

    @classmethod
    def from_json(cls, obj: Any) -> BlobRef:
        if not isinstance(obj, dict) or set(obj) != {"digest", "size"}:
            raise ValueError(f"blob index: expected keys digest, size, got {obj!r:.120}")
        return cls(Digest(_unhex32(obj["digest"], "digest")), _nonneg(obj["size"], "size"))


# ---------------------------------------------------------------------------------------------
# Checkpoints

_CKPT_META_KEY = "vtrain_sha256"


def _tensor_dict_digest(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode() + b"\n")
        h.update(a.data)
    return h.hexdigest()


def save_checkpoint(tensors: dict[str, np.ndarray]) -> bytes:
    """safetensors bytes of ``tensors``, with a sha256 of the content in the header metadata.

    Deterministic: the same dict gives the same bytes. :func:`load_checkpoint` checks the digest,
    so a garbled header or body is caught even outside a content-addressed store.
    """
    from safetensors.numpy import save

    if not isinstance(tensors, dict) or not tensors:
        raise ValueError(
            f"tensors: expected a non-empty dict of arrays, got {type(tensors).__name__}"
        )
    arrays = {}
    for name, a in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(
                f"tensor name: expected a non-empty str other than __metadata__, got {name!r}"
            )
        if not isinstance(a, np.ndarray):
            raise TypeError(f"tensors[{name!r}]: expected a numpy array, got {type(a).__name__}")
        arrays[name] = np.ascontiguousarray(a)
    return bytes(save(arrays, metadata={_CKPT_META_KEY: _tensor_dict_digest(arrays)}))


def load_checkpoint(data: bytes) -> dict[str, np.ndarray]:
    """Tensors of a checkpoint made by :func:`save_checkpoint`.

    Raises CorruptCheckpoint when the bytes are truncated, garbled or lack the content digest.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load

    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    try:
        if len(data) < 8:
            raise ValueError(f"expected at least 8 bytes, got {len(data)}")
        (hlen,) = struct.unpack("<Q", data[:8])
        if hlen > len(data) - 8:
            raise ValueError(f"header length {hlen} exceeds the {len(data) - 8} bytes after it")
        header = loads_json(data[8 : 8 + hlen])
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        want = meta.get(_CKPT_META_KEY) if isinstance(meta, dict) else None
        if not isinstance(want, str):
            raise ValueError(f"expected a {_CKPT_META_KEY} digest in the header metadata")
        tensors = load(data)
    except (SafetensorError, ValueError, UnicodeDecodeError, struct.error, RecursionError, OverflowError) as e:
        raise CorruptCheckpoint(
            f"checkpoint ({len(data)} bytes) is not a valid vtrain checkpoint: {e}"
        ) from None
    got = _tensor_dict_digest(tensors)
    if not hmac.compare_digest(got, want):
        raise CorruptCheckpoint(f"checkpoint content digest: expected {want}, got {got}")
    return tensors


# ---------------------------------------------------------------------------------------------
# Readers


class ArtifactReader(ABC):
    """The read API shared by the local store and the HTTP reader; every read is verified, and
    bounded in size before it is read (:data:`MAX_JSON_BYTES`, :attr:`max_blob_bytes`)."""

    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    """Most bytes of one blob this reader takes (an index naming a larger one is refused unread)."""

    @abstractmethod
    def _read(self, job: str, rel: str) -> bytes:
        """Bytes at ``<job>/<rel>``; raises MissingArtifact when absent."""

    @abstractmethod
    def _where(self, job: str, rel: str) -> str:
        """Where ``<job>/<rel>`` lives (a path or a URL), for messages."""

    def _read_at_most(self, job: str, rel: str, limit: int) -> bytes:
        """Bytes at ``<job>/<rel>``, refused with :class:`ArtifactTooLarge` when more than ``limit``.
        Readers of a server or a disk override it to check before reading (this one reads first)."""
        data = self._read(job, rel)
        _check_size(len(data), limit, self._where(job, rel))
        return data

    def get_blob(self, job: str | int, digest: bytes, size: int | None = None) -> bytes:
        """The blob named ``digest`` (of at most ``size`` bytes, else :attr:`max_blob_bytes`); raises
        MissingArtifact, ArtifactTooLarge, or CorruptArtifact if it does not hash to its name."""
        job = _job(job)
        rel = f"objects/{_digest(digest).hex()}"
        data = self._read_at_most(job, rel, self.max_blob_bytes if size is None else size)
        got = hashlib.sha256(data).digest()
        if not hmac.compare_digest(got, digest):
            raise CorruptArtifact(
                f"object {digest.hex()} at {self._where(job, rel)}: expected sha256 {digest.hex()}, content "
                f"({len(data)} bytes) hashes to {got.hex()} (corrupt or truncated; not used)"
            )
        return data

    def _json(self, job: str, rel: str, error: type[CorruptArtifact] = CorruptArtifact) -> Any:
        raw = self._read_at_most(job, rel, MAX_JSON_BYTES)
        try:
            return loads_json(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise error(f"{self._where(job, rel)}: expected JSON, got {type(e).__name__}: {e}") from None

    def get_step(self, job: str | int, s: int) -> StepRecord:
        """The step record of step ``s``; raises MissingArtifact or CorruptStepRecord."""
        job, s = _job(job), _nonneg(s, "s")
        rel = f"steps/{s}.json"
        obj = self._json(job, rel, CorruptStepRecord)
        try:
            rec = StepRecord.from_json(obj)
        except (ValueError, TypeError, OverflowError) as e:
            raise CorruptStepRecord(f"{self._where(job, rel)}: {e}") from None
        if rec.s != s:
            raise CorruptStepRecord(f"{self._where(job, rel)}: expected step {s}, got {rec.s}")
        return rec

    def _get_ref(self, job: str, rel: str) -> bytes:
        try:
            ref = BlobRef.from_json(self._json(job, rel))
        except ValueError as e:
            raise CorruptArtifact(f"{self._where(job, rel)}: {e}") from None
        if ref.size > self.max_blob_bytes:  # refused before a byte of the blob is fetched
            raise ArtifactTooLarge(f"{self._where(job, rel)}: names a blob of {ref.size} bytes, more than the "
                                   f"{self.max_blob_bytes} bytes this reader takes (not fetched)")
        data = self.get_blob(job, ref.digest, ref.size)
        if len(data) != ref.size:
            raise CorruptArtifact(
                f"{self._where(job, rel)}: expected {ref.size} bytes (sha256 {ref.digest.hex()}), got {len(data)}"
            )
        return data

    def get_log(self, job: str | int, s: int) -> bytes:
        """The rounding-log bytes of step ``s`` (opaque here), hash-verified."""
        return self._get_ref(_job(job), f"logs/{_nonneg(s, 's')}.json")

    def get_checkpoint(self, job: str | int, interval: int) -> bytes:
        """The checkpoint bytes at the start of ``interval`` (see :func:`load_checkpoint`)."""
        return self._get_ref(_job(job), f"checkpoints/{_nonneg(interval, 'interval')}.json")


def _check_size(size: int, limit: int, where: str) -> None:
    if size > limit:
        raise ArtifactTooLarge(f"{where}: expected at most {limit} bytes, got {size} (not used)")


def _read_bounded(f: Any, limit: int, chunk: int = 1 << 20, deadline: float | None = None,
                  where: str = "") -> bytes:
    """At most ``limit + 1`` bytes of the stream ``f``, read a chunk at a time (never a buffer of
    ``limit`` bytes up front: the limit may be far larger than what is there). With ``deadline``
    (``time.monotonic()``), a stream still sending then is cut off (ArtifactUnavailable): a server
    that drips a byte at a time cannot hold the reader past it."""
    read = getattr(f, "read1", f.read)  # read1: one underlying read, so the deadline is seen
    parts, got = [], 0
    while got <= limit:
        if deadline is not None and time.monotonic() > deadline:
            raise ArtifactUnavailable(f"{where}: still sending after the read's deadline ({got} bytes so far; "
                                      "not used)")
        part = read(min(chunk, limit + 1 - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing: temp file in the same folder, fsync, replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


class ArtifactStore(ArtifactReader):
    """A local artifact store rooted at ``path`` (created on first write)."""

    max_blob_bytes = 1 << 40  # one's own disk: a blob is bounded by its index (an auditor sets its job's bound)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(path)

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r})"

    def _path(self, job: str, rel: str) -> Path:
        return self.root / job / rel

    def _where(self, job: str, rel: str) -> str:
        return str(self._path(job, rel))

    def _read(self, job: str, rel: str) -> bytes:
        path = self._path(job, rel)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise MissingArtifact(f"job {job}: {rel} not found at {path}") from None

    def _read_at_most(self, job: str, rel: str, limit: int) -> bytes:
        path = self._path(job, rel)
        try:  # O_NONBLOCK: a FIFO planted in a store folder does not hold the open
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):  # a device (/dev/zero) or a FIFO: never read
                    raise CorruptArtifact(f"{path}: not a regular file (not read)")
                _check_size(st.st_size, limit, str(path))
                data = _read_bounded(f, limit)
        except FileNotFoundError:
            raise MissingArtifact(f"job {job}: {rel} not found at {path}") from None
        _check_size(len(data), limit, str(path))  # grew while read
        return data

    def put_blob(self, job: str | int, data: bytes) -> Digest:
        """Store ``data`` under its sha256 and return the digest (idempotent)."""
        job = _job(job)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data: expected bytes, got {type(data).__name__}")
        data = bytes(data)
        digest = Digest(hashlib.sha256(data).digest())
        path = self._path(job, f"objects/{digest.hex()}")
        if path.exists():
            try:
                self.get_blob(job, digest)
                return digest
            except CorruptArtifact:
                log.warning("replacing corrupt object %s at %s", digest.hex(), path)
        _atomic_write(path, data)
        log.debug("stored object %s (%d bytes) for job %s", digest.hex(), len(data), job)
        return digest

    def _put_index(self, job: str, rel: str, body: bytes, replace: bool = False) -> None:
        path = self._path(job, rel)
        if path.exists() and not replace:
            old = path.read_bytes()
            if old == body:
                return
            try:
                json.loads(old)
            except (json.JSONDecodeError, UnicodeDecodeError):
                log.warning("replacing unreadable index %s", path)
            else:
                raise ValueError(
                    f"job {job}: {rel} is already stored with different content at {path}"
                )
        _atomic_write(path, body)

    def put_step(self, job: str | int, record: StepRecord, replace: bool = False) -> None:
        """Publish a step record (immutable: a different record for the same step is refused,
        unless ``replace``: a repair of a damaged store with a record checked against the chain)."""
        if not isinstance(record, StepRecord):
            raise TypeError(f"record: expected a StepRecord, got {type(record).__name__}")
        self._put_index(_job(job), f"steps/{record.s}.json", _dumps(record.to_json()), replace)

    def _put_ref(self, job: str | int, rel: str, data: bytes, replace: bool = False) -> Digest:
        job = _job(job)
        digest = self.put_blob(job, data)  # the object first, so no index ever names a missing one
        self._put_index(job, rel, _dumps(BlobRef(digest, len(data)).to_json()), replace)
        return digest

    def put_log(self, job: str | int, s: int, data: bytes, replace: bool = False) -> Digest:
        """Publish the rounding-log bytes of step ``s``; returns their digest."""
        return self._put_ref(job, f"logs/{_nonneg(s, 's')}.json", data, replace)

    def put_checkpoint(self, job: str | int, interval: int, data: bytes, replace: bool = False) -> Digest:
        """Publish the checkpoint bytes at the start of ``interval``; returns their digest."""
        return self._put_ref(job, f"checkpoints/{_nonneg(interval, 'interval')}.json", data, replace)

    def fingerprint(self, job: str | int, rels: list[str]) -> tuple | None:
        """What shows the files ``<job>/<rel>`` unchanged since they were last checked, without
        reading any blob: the bytes of each (small) file named (step records, log and checkpoint
        references, local work files) and, for a reference, the size, mtime and inode of the blob
        it names. None when one is missing or unreadable. A blob is content-addressed, so it
        changes only when rewritten under its own name: a repair writes a new file (new inode),
        an edit in place changes its mtime; bit rot changes neither (``TrainerAgent.repair``
        checks every byte at start-up, an auditor checks every hash)."""
        job = _job(job)
        out: list[Any] = []
        try:
            for rel in rels:
                path = self._local_path(job, rel) if rel.startswith(LOCAL_DIR + "/") else self._path(job, rel)
                raw = path.read_bytes()
                out.append(raw)
                if rel.startswith(("logs/", "checkpoints/")):
                    ref = BlobRef.from_json(loads_json(raw))
                    st = os.stat(self._path(job, f"objects/{ref.digest.hex()}"))
                    out.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except (OSError, ValueError, TypeError, RecursionError):
            return None
        return tuple(out)

    # -- the owner's local work files (never served: outside _PATH_RE) ----------------------------
    def _local_path(self, job: str | int, rel: str) -> Path:
        if not isinstance(rel, str) or _LOCAL_RE.fullmatch(rel) is None:
            raise ValueError(f"local file name: expected {LOCAL_DIR}/<name>[/<name>] of [a-z0-9._-], got {rel!r}")
        return self._path(_job(job), rel)

    def put_local(self, job: str | int, rel: str, data: bytes) -> None:
        """Write a local work file ``<job>/<rel>`` (``rel`` under :data:`LOCAL_DIR`) atomically,
        replacing any; the caller checks what it reads back (a crash leaves the old file or none)."""
        _atomic_write(self._local_path(job, rel), bytes(data))

    def get_local(self, job: str | int, rel: str) -> bytes:
        """A local work file's bytes; MissingArtifact when absent."""
        path = self._local_path(job, rel)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise MissingArtifact(f"job {job}: {rel} not found at {path}") from None

    def local_names(self, job: str | int, folder: str) -> list[tuple[str, float]]:
        """(name, modification time) of the local work files in ``folder`` (under :data:`LOCAL_DIR`)."""
        path = self._local_path(job, folder)
        try:
            return sorted((e.name, e.stat().st_mtime) for e in os.scandir(path)
                          if e.is_file() and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def remove_local(self, job: str | int, rel: str) -> None:
        """Delete a local work file (absent: nothing to do)."""
        with contextlib.suppress(FileNotFoundError):
            self._local_path(job, rel).unlink()


# ---------------------------------------------------------------------------------------------
# HTTP


class _StoreHandler(http.server.BaseHTTPRequestHandler):
    """Read-only GET/HEAD of the store layout; anything else is 404 or 405."""

    server_version = "vtrain-store/1"
    root: Path  # set on the subclass made by serve_store

    def _send(self, head_only: bool) -> None:
        m = _PATH_RE.fullmatch(self.path)
        if m is None:
            self.send_error(404, "not an artifact path")
            return
        path = self.root / m["job"] / m["rel"]
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            self.send_error(404, "no such artifact")
            return
        self.send_response(200)
        ctype = "application/json" if m["rel"].endswith(".json") else "application/octet-stream"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head_only:
            self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._send(head_only=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._send(head_only=True)

    def _refuse(self) -> None:
        self.send_error(405, "read-only store")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)


def serve_store(
    path: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 0
) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve the store at ``path`` read-only over HTTP from a daemon thread.

    Returns ``(server, url)``; ``port=0`` picks a free port. Stop it with ``server.shutdown()``
    then ``server.server_close()``.
    """
    handler = type("StoreHandler", (_StoreHandler,), {"root": Path(path)})
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="store-http", daemon=True
    ).start()
    bound_port = server.server_address[1]
    url = f"http://{host}:{bound_port}"
    log.info("serving artifact store %s at %s", path, url)
    return server, url


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, the port made explicit (None when it is malformed)."""
    u = urllib.parse.urlsplit(url)
    try:
        port = u.port or {"http": 80, "https": 443}.get(u.scheme.lower())
    except ValueError:
        port = None
    return u.scheme.lower(), (u.hostname or "").lower(), port


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the store's own scheme, host and port: the URL the user named
    may answer with a redirect to an internal address or another host (SSRF), never followed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001, ANN201 (urllib's)
        if _origin(newurl) != _origin(req.full_url) or _origin(newurl)[2] is None:
            fp.close()
            raise ArtifactUnavailable(f"{req.full_url}: the server redirects (HTTP {code}) to another host, "
                                      f"scheme or port ({newurl[:200]}); not followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Watchdog:
    """The deadline of one HTTP read, headers included: past it, the sockets of the read are shut
    down, which wakes any blocked ``recv`` (a server dripping its status line or headers a byte at a
    time, each within the socket timeout, is otherwise waited for without end by ``http.client``)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline  # time.monotonic()
        self.expired = False
        self._socks: list[Any] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def track(self, sock: Any) -> None:
        with self._lock:
            self._socks.append(sock)
            late = self.expired
        if late:
            self._shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for sock in socks:
            self._shut(sock)

    @staticmethod
    def _shut(sock: Any) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _watched_handlers(watch: _Watchdog) -> list[urllib.request.BaseHandler]:
    """HTTP and HTTPS handlers whose connections report their socket to ``watch`` once connected."""

    def watched(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
        class Watched(base):  # type: ignore[valid-type, misc]
            def connect(self) -> None:
                super().connect()
                watch.track(self.sock)

        return Watched

    http_conn, https_conn = watched(http.client.HTTPConnection), watched(http.client.HTTPSConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):  # noqa: ANN001, ANN201 (urllib's)
            return self.do_open(http_conn, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):  # noqa: ANN001, ANN201 (urllib's)
            return self.do_open(https_conn, req, context=self._context)

    return [Http(), Https()]


class HttpArtifactReader(ArtifactReader):
    """Reads a store served by :func:`serve_store` (or any static server of the same layout).

    Connection errors, timeouts and 5xx answers are retried ``retries`` times with exponential
    backoff; then ArtifactUnavailable. A 404 is MissingArtifact at once. Every read is verified
    exactly as for a local store, and bounded: at most the reader's size limit, within
    ``read_deadline`` seconds in all (a server dripping bytes is cut off, not waited for). A
    redirect is followed only within the store's scheme, host and port (another one is refused:
    ArtifactUnavailable, not retried). ``read_deadline`` bounds the whole read of one artifact,
    retries, status line and headers included (a watchdog shuts the socket down past it), and so
    does its size: a read of at most ``limit`` bytes may take ``timeout + limit / min_rate`` seconds
    (a server sending each small artifact just inside a fixed deadline would otherwise hold the
    auditor for that deadline per artifact: an interval's hundreds of artifacts outlast its window).
    """

    def __init__(
        self, url: str, *, timeout: float = 10.0, retries: int = 3, backoff: float = 0.2,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES, read_deadline: float = 600.0,
        min_rate: float = float(MIN_READ_RATE),
    ) -> None:
        if not isinstance(url, str) or not re.match(r"https?://", url):
            raise ValueError(f"url: expected an http(s) URL, got {url!r}")
        self.max_blob_bytes = _nonneg(max_blob_bytes, "max_blob_bytes")
        self.read_deadline = read_deadline  # seconds one body may take in all (``timeout``: each socket read)
        if not min_rate > 0:
            raise ValueError(f"min_rate: expected a positive number of bytes per second, got {min_rate!r}")
        self.min_rate = min_rate  # bytes per second a read must keep up, on average, past its first ``timeout``
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = _nonneg(retries, "retries")
        self.backoff = backoff
        self._opener = urllib.request.build_opener(_SameOriginRedirects)

    def __repr__(self) -> str:
        return f"HttpArtifactReader({self.url!r})"

    def _where(self, job: str, rel: str) -> str:
        return f"{self.url}/{job}/{rel}"

    def _read(self, job: str, rel: str) -> bytes:
        return self._read_at_most(job, rel, max(MAX_JSON_BYTES, self.max_blob_bytes))

    def _read_at_most(self, job: str, rel: str, limit: int) -> bytes:
        """The body at ``<url>/<job>/<rel>``: refused when its Content-Length says more than ``limit``,
        and never read past ``limit + 1`` bytes (a server streaming without end is cut off there)."""
        url = self._where(job, rel)
        last: Exception | None = None
        allowed = min(self.read_deadline, (self.timeout or 0.0) + limit / self.min_rate)
        deadline = time.monotonic() + allowed
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff * 2 ** (attempt - 1), max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
            with _Watchdog(deadline) as watch:
                try:
                    opener = urllib.request.build_opener(_SameOriginRedirects, *_watched_handlers(watch))
                    with opener.open(url, timeout=self.timeout) as resp:
                        # ASCII digits only: str.isdigit() takes '²' and int() refuses it, or a
                        # number of 5,000 digits int() refuses (a ValueError the auditor did not catch)
                        length = resp.headers.get("Content-Length")
                        if length is not None and re.fullmatch(r"[0-9]{1,20}", length.strip()):
                            _check_size(int(length), limit, url)
                        data = _read_bounded(resp, limit, deadline=deadline, where=url)
                    if watch.expired:  # the body was cut short by the watchdog: not an answer
                        raise ArtifactUnavailable(f"{url}: still sending after the read's deadline ({len(data)} "
                                                  "bytes so far; not used)")
                    _check_size(len(data), limit, url)
                    return data
                except urllib.error.HTTPError as e:
                    e.close()
                    if e.code == 404:
                        raise MissingArtifact(f"job {job}: {rel} not found at {url}") from None
                    if e.code < 500:
                        raise ArtifactUnavailable(f"{url}: HTTP {e.code} {e.reason}") from None
                    last = e
                except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
                    # ValueError: an answer the HTTP stack cannot parse (never one of ours: VtrainError)
                    if watch.expired:
                        break
                    last = e
            log.warning(
                "reading %s failed (attempt %d of %d): %s", url, attempt + 1, self.retries + 1, last
            )
        if time.monotonic() >= deadline or last is None:
            raise ArtifactUnavailable(f"{url}: no complete answer within the read's deadline of {allowed:.3g} s "
                                      f"(status line, headers and body, all attempts; not used)")
        raise ArtifactUnavailable(f"{url}: unavailable after {self.retries + 1} attempts: {last}")
