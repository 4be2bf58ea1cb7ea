"""The optional C builder of SHA-256 Merkle trees (``csrc/sha256tree.c``, built by ``make native``).

It computes the same trees as the pure-Python builders of :mod:`vtrain.commit.merkle` (which stay
the reference and the fallback), but hashes every leaf and node of a buffer in one call: SHA
extensions when the CPU has them, else AVX2 (eight messages at once), else portable C (chosen at
load time), and a thread pool for large inputs. ctypes releases the GIL for the call.

``VTRAIN_NATIVE_HASH=0`` disables it; ``VTRAIN_NATIVE_HASH_LIB`` names another library file;
``VTRAIN_HASH_THREADS`` sets the default thread count (else the CPUs this process may use).
When the library is absent or unloadable, one warning is logged and the pure-Python path is used.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "LIB_PATH",
    "available",
    "chunked_roots",
    "default_threads",
    "hash_chunks",
    "implementation",
    "level_up",
    "select",
]

#: Where ``make native`` puts the library (next to this module).
LIB_PATH = Path(__file__).with_name("_sha256tree.so")
_ABI_VERSION = 2
_IMPLS = {0: "portable", 1: "sha-ni", 2: "avx2"}

_u64, _int, _ptr = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p


def _load() -> ctypes.CDLL | None:
    if os.environ.get("VTRAIN_NATIVE_HASH", "1") == "0":
        log.info("native SHA-256 trees disabled by VTRAIN_NATIVE_HASH=0; using the pure-Python path")
        return None
    path = Path(os.environ.get("VTRAIN_NATIVE_HASH_LIB", LIB_PATH))
    try:
        lib = ctypes.CDLL(str(path))
        version = lib.vt_abi_version()
    except (OSError, AttributeError) as e:
        log.warning(
            "native SHA-256 trees unavailable (%s); using the pure-Python path (same roots, ~10x "
            "slower). Build it with `make native` (needs a C compiler).",
            e,
        )
        return None
    if version != _ABI_VERSION:
        log.warning(
            "native SHA-256 trees: expected ABI version %d, got %d from %s; using the pure-Python "
            "path. Rebuild with `make native`.",
            _ABI_VERSION,
            version,
            path,
        )
        return None
    lib.vt_chunked_roots.argtypes = [_u64, _ptr, _ptr, _u64, _int, _int, _ptr, _ptr]
    lib.vt_chunked_roots.restype = _int
    lib.vt_hash_chunks.argtypes = [_ptr, _u64, _u64, _int, _ptr]
    lib.vt_hash_chunks.restype = _int
    lib.vt_level_up.argtypes = [_ptr, _u64, _int, _ptr]
    lib.vt_level_up.restype = _int
    lib.vt_select.argtypes = [_int]
    lib.vt_select.restype = _int
    lib.vt_impl.restype = _int
    log.debug("native SHA-256 trees loaded from %s (%s)", path, _IMPLS[lib.vt_impl()])
    return lib


_LIB = _load()


def available() -> bool:
    """True when the C library is loaded (the fast path is used)."""
    return _LIB is not None


def implementation() -> str:
    """``"sha-ni"``, ``"avx2"``, ``"portable"`` (the C library) or ``"python"`` (no library)."""
    return "python" if _LIB is None else _IMPLS[_LIB.vt_impl()]


def select(impl: str) -> str:
    """Use ``"sha-ni"``, ``"avx2"`` (each when the CPU has it, else portable), ``"portable"`` or
    ``"best"`` (the default: SHA-NI, then AVX2); returns the one in use.

    For tests and benchmarks: all give the same digests.
    """
    if _LIB is None:
        raise RuntimeError("native SHA-256 trees: expected the C library, got none loaded")
    codes = {"portable": 0, "sha-ni": 1, "avx2": 2, "best": -1}
    if impl not in codes:
        raise ValueError(f"impl: expected one of {sorted(codes)}, got {impl!r}")
    return _IMPLS[_LIB.vt_select(codes[impl])]


def default_threads() -> int:
    """``VTRAIN_HASH_THREADS``, else the number of CPUs this process may run on."""
    env = os.environ.get("VTRAIN_HASH_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"VTRAIN_HASH_THREADS: expected a positive int, got {env!r}") from None
        if n < 1:
            raise ValueError(f"VTRAIN_HASH_THREADS: expected a positive int, got {env!r}")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _threads(threads: int | None) -> int:
    if threads is None:
        return default_threads()
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads: expected a positive int or None, got {threads!r}")
    return threads


def _lib() -> ctypes.CDLL:
    if _LIB is None:
        raise RuntimeError("native SHA-256 trees: expected the C library, got none loaded")
    return _LIB


def _check(rc: int, what: str) -> None:
    if rc == -2:
        raise MemoryError(f"{what}: out of memory")
    if rc != 0:
        raise ValueError(f"{what}: the C library rejected the arguments (code {rc})")


def chunked_roots(
    bufs: Sequence[np.ndarray], chunk_size: int, *, check_f32: bool = False, threads: int | None = None
) -> tuple[list[bytes], list[bool]]:
    """Root of each C-contiguous uint8 array cut into ``chunk_size``-byte leaves, in one call.

    With ``check_f32`` the arrays hold float32 words and the second list flags each buffer that
    holds a NaN or an infinity (its root is then meaningless). Threads split the work across
    all buffers (aligned subtrees of up to 2^14 leaves each).
    """
    lib = _lib()
    n = len(bufs)
    ptrs = (ctypes.c_void_p * max(n, 1))()
    lens = (ctypes.c_uint64 * max(n, 1))()
    for i, b in enumerate(bufs):
        if b.dtype != np.uint8 or b.ndim != 1 or not b.flags.c_contiguous:
            raise ValueError(f"bufs[{i}]: expected a flat C-contiguous uint8 array, got {b.dtype} {b.shape}")
        ptrs[i] = b.ctypes.data
        lens[i] = b.nbytes
    out = ctypes.create_string_buffer(32 * max(n, 1))
    bad = ctypes.create_string_buffer(max(n, 1))
    rc = lib.vt_chunked_roots(n, ptrs, lens, chunk_size, int(check_f32), _threads(threads), out, bad)
    _check(rc, "chunked_roots")
    raw = out.raw
    return [raw[32 * i : 32 * i + 32] for i in range(n)], [bool(x) for x in bad.raw[:n]]


def hash_chunks(buf: np.ndarray, chunk_size: int, *, threads: int | None = None) -> bytes:
    """Leaf hashes of a flat uint8 array cut into ``chunk_size``-byte leaves, concatenated."""
    n = -(-buf.nbytes // chunk_size)
    out = np.empty(32 * n, dtype=np.uint8)
    rc = _lib().vt_hash_chunks(buf.ctypes.data, buf.nbytes, chunk_size, _threads(threads), out.ctypes.data)
    _check(rc, "hash_chunks")
    return out.tobytes()


def level_up(level: bytes, *, threads: int | None = None) -> bytes:
    """The level above ``level`` (concatenated 32-byte digests, at least one): pairs hashed, an
    odd last node promoted."""
    n = len(level) // 32
    out = np.empty(32 * ((n + 1) // 2), dtype=np.uint8)
    src = np.frombuffer(level, dtype=np.uint8)
    rc = _lib().vt_level_up(src.ctypes.data, n, _threads(threads), out.ctypes.data)
    _check(rc, "level_up")
    return out.tobytes()
