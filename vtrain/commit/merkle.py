"""RFC 9162 Merkle trees over SHA-256, the shape pymerkle 7 builds, with 0-based positional proofs.

- leaf hash ``H(0x00 || data)``, node hash ``H(0x01 || left || right)``;
- a tree of ``n > 1`` leaves splits at ``k``, the largest power of two ``< n``, and a lone right
  subtree is promoted (never duplicated). Pairing nodes bottom-up, level by level, and promoting
  the odd last node of a level gives exactly this shape, which is how :class:`MerkleTree` and the
  fast builders work;
- the empty tree's root is ``H("")`` (as in RFC 9162, pymerkle and ``Merkle.rootOf``);
- an inclusion proof is ``(index, size, path)`` with ``path`` the RFC 9162 audit path (siblings,
  bottom-up), checked against ``(index, size)`` so the position is part of what is proven;
- a consistency proof is RFC 9162's ``PROOF(m, D[n])``.

Two builders give the same bits: the C library of :mod:`vtrain.commit.native` (every leaf and
node of a buffer in one call, SHA extensions, threads; used when it is built) and the pure-Python
``reference_*`` functions here (one ``hashlib`` call per hash; the reference, and the fallback).

The Solidity side is ``contracts/lib/Merkle.sol``; the shared vectors are in ``tests/vectors``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vtrain.commit import native as _native
from vtrain.errors import InvalidProof
from vtrain.types import Digest, Root

log = logging.getLogger(__name__)

__all__ = [
    "DIGEST_SIZE",
    "EMPTY_ROOT",
    "MAX_SIZE",
    "ConsistencyProof",
    "InclusionProof",
    "MerkleTree",
    "chunked_root",
    "chunked_roots",
    "hash_chunks",
    "leaf_hash",
    "merkle_root",
    "node_hash",
    "reference_chunked_root",
    "reference_hash_chunks",
    "root_from_path",
    "root_of_leaf_hashes",
    "verify_consistency",
    "verify_inclusion",
]

DIGEST_SIZE = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
#: Largest tree size a proof may claim (the Solidity side accepts paths of up to 64 hashes).
MAX_SIZE = 1 << 64
#: Root of the tree with no leaves: ``sha256(b"")``.
EMPTY_ROOT: Root = Root(hashlib.sha256(b"").digest())

_sha256 = hashlib.sha256
# Leaves hashed per block by the fast builders (bounds their temporary memory to ~2 blocks).
_BLOCK_LEAVES = 1 << 14


def leaf_hash(data: bytes | bytearray | memoryview) -> Digest:
    """``sha256(0x00 || data)``: the hash of one leaf's data."""
    return Digest(_sha256(LEAF_PREFIX + data).digest())


def node_hash(left: bytes, right: bytes) -> Digest:
    """``sha256(0x01 || left || right)``: the hash of an inner node."""
    return Digest(_sha256(NODE_PREFIX + left + right).digest())


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


def _unhex(s: Any, what: str, size: int | None = DIGEST_SIZE) -> bytes:
    """Parse a ``0x``-prefixed hex string (the JSON form of every byte string here)."""
    if not isinstance(s, str) or not s.startswith("0x"):
        raise ValueError(f"{what}: expected a 0x-prefixed hex string, got {s!r}")
    try:
        b = bytes.fromhex(s[2:])
    except ValueError:
        raise ValueError(f"{what}: expected a 0x-prefixed hex string, got {s!r}") from None
    if size is not None and len(b) != size:
        raise ValueError(f"{what}: expected {size} bytes, got {len(b)}")
    return b


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# ---------------------------------------------------------------------------------------------
# Building


def _level_up(level: list[bytes]) -> list[bytes]:
    """The next level up: pairs hashed left to right, an odd last node promoted."""
    it = iter(level)
    sha, prefix = _sha256, NODE_PREFIX
    nxt = [sha(prefix + left + right).digest() for left, right in zip(it, it, strict=False)]
    if len(level) & 1:
        nxt.append(level[-1])
    return nxt


def _fold(level: list[bytes]) -> bytes:
    """The root over ``level`` by the pure-Python reference builder."""
    if not level:
        return EMPTY_ROOT
    while len(level) > 1:
        level = _level_up(level)
    return level[0]


def _fold_fast(level: list[bytes]) -> bytes:
    """:func:`_fold` by the C builder when it is loaded."""
    if not _native.available() or len(level) < 2:
        return _fold(level)
    joined = b"".join(level)
    if len(joined) != DIGEST_SIZE * len(level):  # not all digests: keep the reference's result
        return _fold(level)
    while len(joined) > DIGEST_SIZE:
        joined = _native.level_up(joined, threads=1)
    return joined


def _as_u8(buf: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """A flat uint8 view of ``buf`` (no copy for contiguous buffers)."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("buf: expected a C-contiguous array, got a strided view")
        return buf.reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def _hash_full_chunks(u8: np.ndarray, size: int) -> list[bytes]:
    """Leaf hashes of ``len(u8) // size`` equal chunks of ``size`` bytes (``len(u8)`` a multiple).

    The fastest pure-Python way measured here (scripts/bench_commit.py): copy the chunks into
    rows of ``1 + size`` bytes whose first byte is the leaf prefix, then hash slices of one
    memoryview in a list comprehension. The cost is one ``hashlib`` call per leaf.
    """
    n = len(u8) // size
    rec = size + 1
    out: list[bytes] = []
    sha = _sha256
    for lo in range(0, n, _BLOCK_LEAVES):
        hi = min(n, lo + _BLOCK_LEAVES)
        buf = np.empty((hi - lo, rec), dtype=np.uint8)
        buf[:, 0] = LEAF_PREFIX[0]
        buf[:, 1:] = u8[lo * size : hi * size].reshape(hi - lo, size)
        mv = buf.data.cast("B")
        out += [sha(mv[i : i + rec]).digest() for i in range(0, (hi - lo) * rec, rec)]
    return out


def _check_chunk_size(chunk_size: int) -> None:
    if not _is_int(chunk_size) or chunk_size <= 0:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")


def _chunk_hashes(u8: np.ndarray, chunk_size: int) -> list[bytes]:
    full = len(u8) // chunk_size
    hashes = _hash_full_chunks(u8[: full * chunk_size], chunk_size)
    if len(u8) > full * chunk_size:
        hashes.append(_sha256(LEAF_PREFIX + u8[full * chunk_size :].tobytes()).digest())
    return hashes


Buffer = bytes | bytearray | memoryview | np.ndarray


def _split_digests(joined: bytes) -> list[bytes]:
    return [joined[i : i + DIGEST_SIZE] for i in range(0, len(joined), DIGEST_SIZE)]


def hash_chunks(buf: Buffer, chunk_size: int, *, threads: int | None = None) -> list[Digest]:
    """Leaf hashes of ``buf`` cut into ``chunk_size``-byte chunks (the last one may be short).

    ``threads``: for the C builder (None: :func:`vtrain.commit.native.default_threads`).
    """
    _check_chunk_size(chunk_size)
    u8 = _as_u8(buf)
    if _native.available():
        return [Digest(h) for h in _split_digests(_native.hash_chunks(u8, chunk_size, threads=threads))]
    return [Digest(h) for h in _chunk_hashes(u8, chunk_size)]


def reference_hash_chunks(buf: Buffer, chunk_size: int) -> list[Digest]:
    """:func:`hash_chunks` by the pure-Python reference builder (one ``hashlib`` call per leaf)."""
    _check_chunk_size(chunk_size)
    return [Digest(h) for h in _chunk_hashes(_as_u8(buf), chunk_size)]


def chunked_root(buf: Buffer, chunk_size: int, *, threads: int | None = None) -> Root:
    """Root of the tree whose leaves are ``buf`` cut into ``chunk_size``-byte chunks.

    Same result as ``MerkleTree.from_chunks(buf, chunk_size).root`` without keeping the tree.
    ``threads``: for the C builder (None: :func:`vtrain.commit.native.default_threads`).
    """
    return chunked_roots([buf], chunk_size, threads=threads)[0]


def chunked_roots(bufs: Sequence[Buffer], chunk_size: int, *, threads: int | None = None) -> list[Root]:
    """:func:`chunked_root` of each buffer; the C builder hashes them all in one threaded call."""
    _check_chunk_size(chunk_size)
    u8s = [_as_u8(b) for b in bufs]
    if _native.available():
        roots, _ = _native.chunked_roots(u8s, chunk_size, threads=threads)
        return [Root(r) for r in roots]
    return [_reference_chunked_root(u8, chunk_size) for u8 in u8s]


def reference_chunked_root(buf: Buffer, chunk_size: int) -> Root:
    """:func:`chunked_root` by the pure-Python reference builder.

    Holds only one block of leaf hashes at a time: blocks of ``2^14`` leaves are aligned
    subtrees, so their roots are the nodes of level 14 and the rest of the tree is built on top.
    """
    _check_chunk_size(chunk_size)
    return _reference_chunked_root(_as_u8(buf), chunk_size)


def _reference_chunked_root(u8: np.ndarray, chunk_size: int) -> Root:
    step = _BLOCK_LEAVES * chunk_size
    if len(u8) <= step:
        return Root(_fold(_chunk_hashes(u8, chunk_size)))
    blocks = [
        _fold(_chunk_hashes(u8[lo : lo + step], chunk_size)) for lo in range(0, len(u8), step)
    ]
    return Root(_fold(blocks))


def root_of_leaf_hashes(hashes: Sequence[bytes]) -> Root:
    """Root of the tree with the given leaf hashes (``EMPTY_ROOT`` for none)."""
    return Root(_fold_fast(list(hashes)))


def merkle_root(leaves: Iterable[bytes]) -> Root:
    """Root of the tree whose leaves hold the given data."""
    sha, prefix = _sha256, LEAF_PREFIX
    return Root(_fold_fast([sha(prefix + d).digest() for d in leaves]))


def _split(n: int) -> int:
    """``k``: the largest power of two ``< n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


class MerkleTree:
    """An RFC 9162 tree that keeps every level, so proofs cost ``O(log n)``.

    Level 0 holds the leaf hashes; node ``i`` of level ``j`` covers leaves
    ``[i * 2^j, min((i+1) * 2^j, n))``. Each level is stored as one ``bytes`` of concatenated
    32-byte digests (about ``64 n`` bytes for the whole tree).
    """

    __slots__ = ("_levels", "_size")

    def __init__(self, leaf_hashes: Sequence[bytes]) -> None:
        """Build from leaf hashes (already ``H(0x00 || data)``); see also the ``from_*`` helpers."""
        level = list(leaf_hashes)
        for i, h in enumerate(level):
            if not isinstance(h, bytes) or len(h) != DIGEST_SIZE:
                raise ValueError(f"leaf_hashes[{i}]: expected {DIGEST_SIZE} bytes, got {h!r:.80}")
        self._build(level)

    def _build(self, level: list[bytes]) -> None:
        if _native.available():
            self._build_joined(b"".join(level), len(level))
            return
        self._size = len(level)
        levels = [b"".join(level)]
        while len(level) > 1:
            level = _level_up(level)
            levels.append(b"".join(level))
        self._levels: tuple[bytes, ...] = tuple(levels)

    def _build_joined(self, leaves: bytes, n: int, threads: int | None = None) -> None:
        """Build from ``n`` concatenated leaf hashes with the C builder."""
        self._size = n
        levels = [leaves]
        while n > 1:
            levels.append(_native.level_up(levels[-1], threads=threads))
            n = (n + 1) // 2
        self._levels = tuple(levels)

    @classmethod
    def _of_hashes(cls, hashes: list[bytes]) -> MerkleTree:
        """Build from leaf hashes this module computed (skips the per-leaf type checks)."""
        tree = cls.__new__(cls)
        tree._build(hashes)
        return tree

    @classmethod
    def from_leaves(cls, leaves: Iterable[bytes]) -> MerkleTree:
        """Build from leaf data (each leaf hashed as ``H(0x00 || data)``)."""
        sha, prefix = _sha256, LEAF_PREFIX
        return cls._of_hashes([sha(prefix + d).digest() for d in leaves])

    @classmethod
    def from_leaf_hashes(cls, hashes: Sequence[bytes]) -> MerkleTree:
        """Build from leaf hashes."""
        return cls(hashes)

    @classmethod
    def from_chunks(cls, buf: Buffer, chunk_size: int, *, threads: int | None = None) -> MerkleTree:
        """Build from ``buf`` cut into ``chunk_size``-byte leaves (the last one may be short)."""
        _check_chunk_size(chunk_size)
        u8 = _as_u8(buf)
        if _native.available():
            tree = cls.__new__(cls)
            tree._build_joined(_native.hash_chunks(u8, chunk_size, threads=threads), -(-len(u8) // chunk_size), threads)
            return tree
        return cls._of_hashes(_chunk_hashes(u8, chunk_size))

    @property
    def size(self) -> int:
        """Number of leaves."""
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def root(self) -> Root:
        """The tree's root (``EMPTY_ROOT`` when it has no leaves)."""
        if self._size == 0:
            return EMPTY_ROOT
        return Root(self._levels[-1])

    @property
    def depth(self) -> int:
        """Number of levels above the leaves (0 for one leaf)."""
        return len(self._levels) - 1

    def _node(self, level: int, i: int) -> bytes:
        return self._levels[level][DIGEST_SIZE * i : DIGEST_SIZE * (i + 1)]

    def leaf_hash(self, index: int) -> Digest:
        """The hash of leaf ``index`` (0-based)."""
        self._check_index(index)
        return Digest(self._node(0, index))

    def leaf_hashes(self) -> list[Digest]:
        """Every leaf hash, in order."""
        return [Digest(self._node(0, i)) for i in range(self._size)]

    def _check_index(self, index: int) -> None:
        if not _is_int(index) or not 0 <= index < self._size:
            raise IndexError(f"index: expected an int in [0, {self._size}), got {index!r}")

    def range_root(self, start: int, end: int) -> Digest:
        """``MTH(D[start:end])``, the RFC 9162 root of the leaves ``[start, end)``."""
        if not (_is_int(start) and _is_int(end) and 0 <= start < end <= self._size):
            raise ValueError(
                f"range: expected 0 <= start < end <= {self._size}, got [{start}, {end})"
            )
        width = end - start
        j = (width - 1).bit_length()  # smallest j with 2^j >= width
        # INVARIANT: node i of level j covers [i * 2^j, min((i+1) * 2^j, n)) and is its MTH.
        if start % (1 << j) == 0 and (width == 1 << j or end == self._size):
            return Digest(self._node(j, start >> j))
        k = _split(width)
        return node_hash(self.range_root(start, start + k), self.range_root(start + k, end))

    def prove(self, index: int) -> InclusionProof:
        """The inclusion proof of leaf ``index`` in this tree."""
        self._check_index(index)
        path = []
        i = index
        for level in range(self.depth):
            sibling = i ^ 1
            if sibling < len(self._levels[level]) // DIGEST_SIZE:
                path.append(self._node(level, sibling))
            # else: i is the odd last node of this level, promoted without a sibling.
            i >>= 1
        return InclusionProof(index, self._size, tuple(path))

    def prove_consistency(self, prior_size: int) -> ConsistencyProof:
        """RFC 9162 ``PROOF(prior_size, D[n])``: the first ``prior_size`` leaves are a prefix."""
        n = self._size
        if not _is_int(prior_size) or not 1 <= prior_size <= n:
            raise ValueError(f"prior_size: expected an int in [1, {n}], got {prior_size!r}")
        path: list[bytes] = []
        # SUBPROOF(m, D[start:end], b), unrolled; appended siblings are collected top-down.
        m, start, end, whole = prior_size, 0, n, True
        while m != end - start:
            k = _split(end - start)
            if m <= k:
                path.append(self.range_root(start + k, end))
                end = start + k
            else:
                path.append(self.range_root(start, start + k))
                m -= k
                start += k
                whole = False
        if not whole:
            path.append(self.range_root(start, end))
        path.reverse()
        return ConsistencyProof(prior_size, n, tuple(path))


# ---------------------------------------------------------------------------------------------
# Proofs


def _check_path(path: Any, what: str) -> tuple[bytes, ...]:
    if not isinstance(path, tuple):
        raise InvalidProof(f"{what}: expected a tuple of digests, got {type(path).__name__}")
    for i, h in enumerate(path):
        if not isinstance(h, bytes) or len(h) != DIGEST_SIZE:
            raise InvalidProof(f"{what}[{i}]: expected {DIGEST_SIZE} bytes, got {h!r:.80}")
    return path


def root_from_path(leaf: bytes, index: int, size: int, path: Sequence[bytes]) -> Digest:
    """The root implied by leaf hash ``leaf`` at ``index`` of a ``size``-leaf tree.

    RFC 9162 section 2.1.3.2, the same walk as ``Merkle.rootFrom`` in Solidity.
    Raises InvalidProof when the path does not fit ``(index, size)``.
    """
    if not (_is_int(index) and _is_int(size) and 0 <= index < size <= MAX_SIZE):
        raise InvalidProof(f"expected 0 <= index < size <= 2^64, got index {index}, size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            raise InvalidProof(f"path too long for index {index} in a tree of {size} leaves")
        if fn & 1 or fn == sn:
            r = _sha256(NODE_PREFIX + p + r).digest()
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = _sha256(NODE_PREFIX + r + p).digest()
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise InvalidProof(f"path too short for index {index} in a tree of {size} leaves")
    return Digest(r)


@dataclass(frozen=True)
class InclusionProof:
    """Leaf ``index`` (0-based) of a ``size``-leaf tree; ``path`` = RFC 9162 audit path."""

    index: int
    size: int
    path: tuple[bytes, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"index": int, "size": int, "path": ["0x...", ...]}``."""
        return {"index": self.index, "size": self.size, "path": [_hex(p) for p in self.path]}

    @classmethod
    def from_json(cls, obj: Any) -> InclusionProof:
        """Parse :meth:`to_json` output. Raises InvalidProof when malformed."""
        try:
            index, size, path = obj["index"], obj["size"], obj["path"]
            if not (_is_int(index) and _is_int(size) and isinstance(path, list)):
                raise ValueError(f"expected index:int, size:int, path:list, got {obj!r:.200}")
            return cls(index, size, tuple(_unhex(p, f"path[{i}]") for i, p in enumerate(path)))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidProof(f"malformed inclusion proof: {e}") from None

    def root_from(self, leaf: bytes) -> Digest:
        """The root this proof implies for the leaf hash ``leaf``. Raises InvalidProof."""
        _check_path(self.path, "path")
        if not isinstance(leaf, bytes) or len(leaf) != DIGEST_SIZE:
            raise InvalidProof(f"leaf: expected a {DIGEST_SIZE}-byte hash, got {leaf!r:.80}")
        return root_from_path(leaf, self.index, self.size, self.path)

    def verify(self, root: bytes, leaf: bytes) -> None:
        """Raises InvalidProof unless leaf hash ``leaf`` sits at ``(index, size)`` of ``root``."""
        verify_inclusion(root, leaf, self)


def verify_inclusion(
    root: bytes,
    leaf: bytes,
    proof: InclusionProof,
    *,
    index: int | None = None,
    size: int | None = None,
) -> None:
    """Check that leaf hash ``leaf`` sits at ``proof.index`` of the ``proof.size``-leaf ``root``.

    Pass ``index``/``size`` to also pin the position and tree size the caller expects.
    Raises InvalidProof otherwise (digests are compared in constant time).
    """
    if not isinstance(proof, InclusionProof):
        raise InvalidProof(f"expected an InclusionProof, got {type(proof).__name__}")
    if index is not None and proof.index != index:
        raise InvalidProof(f"expected index {index}, got {proof.index}")
    if size is not None and proof.size != size:
        raise InvalidProof(f"expected size {size}, got {proof.size}")
    got = proof.root_from(leaf)
    if not isinstance(root, bytes) or not hmac.compare_digest(got, root):
        raise InvalidProof(
            f"leaf {index if index is not None else proof.index} of {proof.size}: "
            f"expected root {_hex(root) if isinstance(root, bytes) else root!r}, got {_hex(got)}"
        )


@dataclass(frozen=True)
class ConsistencyProof:
    """RFC 9162 consistency proof: the ``prior_size``-leaf tree is a prefix of the ``size`` one."""

    prior_size: int
    size: int
    path: tuple[bytes, ...]

    def to_json(self) -> dict[str, Any]:
        """``{"prior_size": int, "size": int, "path": ["0x...", ...]}``."""
        return {
            "prior_size": self.prior_size,
            "size": self.size,
            "path": [_hex(p) for p in self.path],
        }

    @classmethod
    def from_json(cls, obj: Any) -> ConsistencyProof:
        """Parse :meth:`to_json` output. Raises InvalidProof when malformed."""
        try:
            m, n, path = obj["prior_size"], obj["size"], obj["path"]
            if not (_is_int(m) and _is_int(n) and isinstance(path, list)):
                raise ValueError(f"expected prior_size:int, size:int, path:list, got {obj!r:.200}")
            return cls(m, n, tuple(_unhex(p, f"path[{i}]") for i, p in enumerate(path)))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidProof(f"malformed consistency proof: {e}") from None

    def verify(self, prior_root: bytes, root: bytes) -> None:
        """Raises InvalidProof unless the proof links ``prior_root`` to ``root``."""
        verify_consistency(prior_root, root, self)


def verify_consistency(prior_root: bytes, root: bytes, proof: ConsistencyProof) -> None:
    """Check an RFC 9162 consistency proof (section 2.1.4.2). Raises InvalidProof."""
    if not isinstance(proof, ConsistencyProof):
        raise InvalidProof(f"expected a ConsistencyProof, got {type(proof).__name__}")
    m, n = proof.prior_size, proof.size
    path = list(_check_path(proof.path, "path"))
    if not (_is_int(m) and _is_int(n) and 1 <= m <= n <= MAX_SIZE):
        raise InvalidProof(f"expected 1 <= prior_size <= size <= 2^64, got {m}, {n}")
    if not (isinstance(prior_root, bytes) and isinstance(root, bytes)):
        raise InvalidProof("roots: expected bytes")
    if m == n:
        if path:
            raise InvalidProof(f"expected an empty path for equal sizes, got {len(path)} hashes")
        if not hmac.compare_digest(prior_root, root):
            raise InvalidProof("equal sizes: expected equal roots")
        return
    if m & (m - 1) == 0:  # the prior tree is a complete left subtree: its root starts the walk
        path.insert(0, prior_root)
    if not path:
        raise InvalidProof("expected a non-empty path")
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise InvalidProof(f"path too long for sizes {m} -> {n}")
        if fn & 1 or fn == sn:
            fr = _sha256(NODE_PREFIX + c + fr).digest()
            sr = _sha256(NODE_PREFIX + c + sr).digest()
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = _sha256(NODE_PREFIX + sr + c).digest()
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise InvalidProof(f"path too short for sizes {m} -> {n}")
    if not hmac.compare_digest(fr, prior_root):
        raise InvalidProof(f"sizes {m} -> {n}: prior root does not match")
    if not hmac.compare_digest(sr, root):
        raise InvalidProof(f"sizes {m} -> {n}: root does not match")
