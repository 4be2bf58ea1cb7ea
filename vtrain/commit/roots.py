"""Commitments: every root the protocol posts or proves against, exactly per docs/protocol.md.

One format, shared with Solidity (``contracts/lib/Merkle.sol``, ``contracts/lib/Encoding.sol``)
through the vectors in ``tests/vectors`` (written by ``scripts/gen_vectors.py``). Trees are the
RFC 9162 trees of :mod:`vtrain.commit.merkle`; indices are 0-based everywhere.

| commitment | leaves | function |
|---|---|---|
| tensor root | FP32 LE bytes of 64-element chunks | :func:`tensor_root`, :func:`tensor_roots`, :func:`tensor_tree` |
| state root | component tensor roots | :func:`state_root` |
| step leaf | ``uint64be(s) || stateRoot || logRoot`` | :func:`step_leaf` |
| interval root | step leaves | :func:`interval_root` |
| op log root | ``[LOW, entries..., HIGH]``, 9 bytes each | :func:`op_log_root` |
| step log root | op log roots | :func:`step_log_root` |
| trace root | op output tensor roots | :func:`trace_root` |
| dataset root | FP32 LE bytes of each sample | :func:`dataset_root` |
| graph root | ABI-encoded op descriptors | :func:`graph_root` |
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vtrain.commit import native as _native
from vtrain.commit.merkle import (
    EMPTY_ROOT,
    InclusionProof,
    MerkleTree,
    chunked_root,
    leaf_hash,
    merkle_root,
    reference_chunked_root,
    verify_inclusion,
)
from vtrain.errors import InvalidProof
from vtrain.types import Digest, Root

log = logging.getLogger(__name__)

__all__ = [
    "CHUNK_ELEMS",
    "DESCRIPTOR_TYPES",
    "EMPTY_OP_LOG_ROOT",
    "EMPTY_ROOT",
    "HIGH_KEY",
    "LOG_LEAF_SIZE",
    "LOW_KEY",
    "MAX_LOG_INDEX",
    "STEP_LEAF_SIZE",
    "LogEntry",
    "LogEntryProof",
    "batch_indices",
    "canonical_json",
    "canonical_zero",
    "chunk_bytes",
    "dataset_root",
    "dataset_tree",
    "decode_log_leaf",
    "decode_op_descriptor",
    "decode_step_leaf",
    "encode_op_descriptor",
    "graph_root",
    "graph_tree",
    "interval_position",
    "interval_root",
    "interval_tree",
    "log_leaf",
    "n_chunks",
    "op_log_leaves",
    "op_log_root",
    "op_log_root_arrays",
    "op_log_root_unchecked",
    "op_log_tree",
    "prove_log_entry",
    "roots_tree",
    "sample_index",
    "spec_hash",
    "state_root",
    "step_leaf",
    "step_log_root",
    "reference_tensor_root",
    "tensor_root",
    "tensor_roots",
    "tensor_tree",
    "trace_root",
    "validate_finite",
    "validate_float32",
    "validate_root",
    "verify_log_entry",
]

#: Elements per tensor leaf.
CHUNK_ELEMS = 64
_CHUNK_BYTES = 4 * CHUNK_ELEMS
#: Bytes of a step leaf: ``uint64be(s) || stateRoot || logRoot``.
STEP_LEAF_SIZE = 72
#: Bytes of an op log leaf: ``uint32be(key) || uint8(code) || uint32be(valueBits)``.
LOG_LEAF_SIZE = 9
#: Key of the LOW sentinel (first leaf of every op log).
LOW_KEY = 0
#: Key of the HIGH sentinel (last leaf of every op log).
HIGH_KEY = 0xFFFFFFFF
#: Largest loggable element index (its key ``index + 1`` must stay below ``HIGH_KEY``).
MAX_LOG_INDEX = HIGH_KEY - 2

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_U256 = (1 << 256) - 1


# ---------------------------------------------------------------------------------------------
# Validation helpers ("expected X, got Y")


def _int(x: Any, what: str, lo: int, hi: int) -> int:
    """``x`` as a Python int in ``[lo, hi]`` (numpy integers accepted, bools and floats not)."""
    if isinstance(x, bool | np.bool_):
        raise TypeError(f"{what}: expected an int, got {x!r}")
    try:
        v = operator.index(x)
    except TypeError:
        raise TypeError(f"{what}: expected an int, got {type(x).__name__} {x!r:.40}") from None
    if not lo <= v <= hi:
        raise ValueError(f"{what}: expected an int in [{lo}, {hi}], got {v}")
    return v


def validate_root(x: Any, what: str = "root") -> Root:
    """``x`` if it is a 32-byte digest; raises TypeError/ValueError otherwise."""
    if not isinstance(x, bytes):
        raise TypeError(f"{what}: expected 32 bytes, got {type(x).__name__}")
    if len(x) != 32:
        raise ValueError(f"{what}: expected 32 bytes, got {len(x)}")
    return Root(x)


def validate_float32(arr: Any, what: str = "arr") -> np.ndarray:
    """``arr`` as a C-contiguous little-endian float32 array (a view when it already is one).

    Raises TypeError unless ``arr`` is a numpy array of dtype float32 (either byte order).
    """
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{what}: expected a numpy float32 array, got {type(arr).__name__}")
    if arr.dtype.kind != "f" or arr.dtype.itemsize != 4:
        raise TypeError(f"{what}: expected dtype float32, got {arr.dtype}")
    return np.ascontiguousarray(arr, dtype="<f4")


def validate_finite(arr: np.ndarray, what: str = "arr") -> None:
    """Raises ValueError if ``arr`` holds a NaN or an infinity (never valid protocol values)."""
    finite = np.isfinite(arr)
    if not finite.all():
        bad = np.flatnonzero(~finite.reshape(-1))
        raise ValueError(
            f"{what}: expected finite values, got {len(bad)} NaN/Inf "
            f"(first at flat index {int(bad[0])}: {arr.reshape(-1)[bad[0]]})"
        )


def canonical_zero(arr: np.ndarray) -> np.ndarray:
    """A copy of float32 ``arr`` with every ``-0.0`` replaced by ``+0.0``; other bits unchanged.

    Works on the bit patterns, so it is immune to flush-to-zero/denormals-are-zero modes.
    """
    a = validate_float32(arr)
    bits = a.view(np.uint32)
    return np.where(bits == 0x80000000, np.uint32(0), bits).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Tensors


def n_chunks(n_elems: int) -> int:
    """Number of leaves of a tensor of ``n_elems`` elements."""
    return -(-_int(n_elems, "n_elems", 0, _U64) // CHUNK_ELEMS)


def _tensor(arr: Any, what: str) -> np.ndarray:
    a = validate_float32(arr, what)
    validate_finite(a, what)
    return a.reshape(-1)


def chunk_bytes(arr: np.ndarray, c: int) -> bytes:
    """Leaf data of chunk ``c``: FP32 LE bytes of elements ``[64c, min(64c + 64, n))``."""
    a = validate_float32(arr).reshape(-1)
    c = _int(c, "chunk", 0, max(n_chunks(a.size) - 1, -1))
    return a[CHUNK_ELEMS * c : CHUNK_ELEMS * (c + 1)].tobytes()


def tensor_root(arr: np.ndarray, *, threads: int | None = None) -> Root:
    """Root of a float32 tensor: FP32 LE, row-major, 64-element chunks per leaf.

    The shape is not committed here (it is in the graph). Zero elements give ``EMPTY_ROOT``.
    Raises TypeError for a non-float32 array and ValueError for NaN/Inf; ``-0.0`` is hashed as
    is (see :func:`canonical_zero`). ``threads``: see :func:`tensor_roots`.
    """
    return _tensor_roots([arr], ["tensor"], threads)[0]


def tensor_roots(arrs: Sequence[np.ndarray], what: str = "tensors", *, threads: int | None = None) -> list[Root]:
    """:func:`tensor_root` of each tensor (a state's components, a step's op outputs).

    With the C builder (:mod:`vtrain.commit.native`) every tensor is hashed in one call on
    ``threads`` threads (None: every CPU this process may use), the NaN/Inf check fused into it;
    without it, by the pure-Python reference builder. Errors name ``what[i]``.
    """
    return _tensor_roots(arrs, [f"{what}[{i}]" for i in range(len(arrs))], threads)


def _tensor_roots(arrs: Sequence[np.ndarray], names: list[str], threads: int | None) -> list[Root]:
    flat = [validate_float32(a, name).reshape(-1) for a, name in zip(arrs, names, strict=True)]
    if not _native.available():
        for a, name in zip(flat, names, strict=True):
            validate_finite(a, name)
        return [reference_chunked_root(a, _CHUNK_BYTES) for a in flat]
    u8s = [a.view(np.uint8) for a in flat]
    roots, bad = _native.chunked_roots(u8s, _CHUNK_BYTES, check_f32=True, threads=threads)
    for a, name, is_bad in zip(flat, names, bad, strict=True):
        if is_bad:
            validate_finite(a, name)  # raises, naming the first NaN/Inf
            raise AssertionError(f"{name}: the C builder saw a NaN/Inf that numpy did not")
    return [Root(r) for r in roots]


def reference_tensor_root(arr: np.ndarray) -> Root:
    """:func:`tensor_root` by the pure-Python reference builder (one ``hashlib`` call per hash)."""
    return reference_chunked_root(_tensor(arr, "tensor"), _CHUNK_BYTES)


def tensor_tree(arr: np.ndarray, *, threads: int | None = None) -> MerkleTree:
    """The full tree of :func:`tensor_root`, for chunk proofs (leaf ``c`` = chunk ``c``)."""
    return MerkleTree.from_chunks(_tensor(arr, "tensor"), _CHUNK_BYTES, threads=threads)


# ---------------------------------------------------------------------------------------------
# Trees over 32-byte roots: state, step log, trace


def _roots(roots: Iterable[bytes], what: str) -> list[bytes]:
    out = list(roots)
    for i, r in enumerate(out):
        validate_root(r, f"{what}[{i}]")
    return out


def roots_tree(roots: Sequence[bytes], what: str = "roots") -> MerkleTree:
    """Tree whose leaf ``i`` holds the 32-byte root ``roots[i]`` (state, step log, trace)."""
    return MerkleTree.from_leaves(_roots(roots, what))


def state_root(component_roots: Sequence[bytes]) -> Root:
    """stateRoot: tree over the state components' tensor roots, in the graph's slot order."""
    return merkle_root(_roots(component_roots, "component_roots"))


def step_log_root(op_log_roots: Sequence[bytes]) -> Root:
    """logRoot_s: tree over every op's log root, in op order (``EMPTY_OP_LOG_ROOT`` if none)."""
    return merkle_root(_roots(op_log_roots, "op_log_roots"))


def trace_root(op_output_roots: Sequence[bytes]) -> Root:
    """traceRoot_s: tree over every op's output tensor root, in op order."""
    return merkle_root(_roots(op_output_roots, "op_output_roots"))


# ---------------------------------------------------------------------------------------------
# Steps and intervals


def step_leaf(s: int, state_root: bytes, log_root: bytes) -> bytes:
    """Step leaf data: ``uint64be(s) || stateRoot_s || logRoot_s`` (72 bytes, ``s >= 1``)."""
    s = _int(s, "s", 1, _U64)
    return (
        s.to_bytes(8, "big")
        + validate_root(state_root, "state_root")
        + validate_root(log_root, "log_root")
    )


def decode_step_leaf(data: bytes) -> tuple[int, Root, Root]:
    """``(s, state_root, log_root)`` of a step leaf; raises ValueError unless it is 72 bytes."""
    if not isinstance(data, bytes) or len(data) != STEP_LEAF_SIZE:
        raise ValueError(f"step leaf: expected {STEP_LEAF_SIZE} bytes, got {data!r:.40}")
    return int.from_bytes(data[:8], "big"), Root(data[8:40]), Root(data[40:72])


def _step_leaves(step_leaves: Sequence[bytes]) -> list[bytes]:
    leaves = list(step_leaves)
    if not leaves:
        raise ValueError("step_leaves: expected at least one step leaf, got none")
    first = decode_step_leaf(leaves[0])[0]
    for p, leaf in enumerate(leaves):
        s = decode_step_leaf(leaf)[0]
        if s != first + p:
            raise ValueError(f"step_leaves[{p}]: expected step {first + p}, got {s}")
    return leaves


def interval_root(step_leaves: Sequence[bytes]) -> Root:
    """Root of an interval: tree over its consecutive step leaves (steps ``iK+1 .. iK+K``)."""
    return merkle_root(_step_leaves(step_leaves))


def interval_tree(step_leaves: Sequence[bytes]) -> MerkleTree:
    """The full tree of :func:`interval_root` (leaf ``p`` = step ``iK + 1 + p``)."""
    return MerkleTree.from_leaves(_step_leaves(step_leaves))


def interval_position(s: int, k: int) -> tuple[int, int]:
    """``(interval, position)`` of step ``s`` (1-based) with ``k`` steps per interval."""
    s = _int(s, "s", 1, _U64)
    k = _int(k, "k", 1, _U64)
    return (s - 1) // k, (s - 1) % k


# ---------------------------------------------------------------------------------------------
# Op rounding logs


def log_leaf(key: int, code: int, value_bits: int) -> bytes:
    """Leaf data ``uint32be(key) || uint8(code) || uint32be(valueBits)`` (9 bytes)."""
    return (
        _int(key, "key", 0, _U32).to_bytes(4, "big")
        + _int(code, "code", 0, 255).to_bytes(1, "big")
        + _int(value_bits, "value_bits", 0, _U32).to_bytes(4, "big")
    )


def decode_log_leaf(data: bytes) -> tuple[int, int, int]:
    """``(key, code, value_bits)`` of a log leaf; raises ValueError unless it is 9 bytes."""
    if not isinstance(data, bytes) or len(data) != LOG_LEAF_SIZE:
        raise ValueError(f"log leaf: expected {LOG_LEAF_SIZE} bytes, got {data!r:.40}")
    return int.from_bytes(data[:4], "big"), data[4], int.from_bytes(data[5:], "big")


LOW_LEAF = log_leaf(LOW_KEY, 0, 0)
HIGH_LEAF = log_leaf(HIGH_KEY, 0, 0)


@dataclass(frozen=True)
class LogEntry:
    """One sparse rounding-log entry of an op: output element ``index`` (0-based, flat).

    ``code`` is the rounding code (see docs/numerics.md) and ``value_bits`` the FP32 bit pattern
    stored with it (0 unless the code carries a value). Committed with key ``index + 1``.
    """

    index: int
    code: int
    value_bits: int

    def __post_init__(self) -> None:
        _int(self.index, "index", 0, MAX_LOG_INDEX)
        _int(self.code, "code", 0, 255)
        _int(self.value_bits, "value_bits", 0, _U32)

    @property
    def key(self) -> int:
        """The committed key, ``index + 1`` (0 and ``0xFFFFFFFF`` are the sentinels)."""
        return self.index + 1

    def leaf(self) -> bytes:
        """The entry's 9-byte leaf data."""
        return log_leaf(self.key, self.code, self.value_bits)

    @classmethod
    def from_leaf(cls, data: bytes) -> LogEntry:
        """The entry of a non-sentinel leaf; raises ValueError for a sentinel."""
        key, code, value = decode_log_leaf(data)
        if key in (LOW_KEY, HIGH_KEY):
            raise ValueError(f"log leaf: expected an entry, got the sentinel with key {key:#x}")
        return cls(key - 1, code, value)


def _sorted_entries(entries: Iterable[LogEntry]) -> list[LogEntry]:
    out = list(entries)
    for i, e in enumerate(out):
        if not isinstance(e, LogEntry):
            raise TypeError(f"entries[{i}]: expected a LogEntry, got {type(e).__name__}")
    out.sort(key=lambda e: e.index)
    for i, e in enumerate(out):
        if i and out[i - 1].index == e.index:
            raise ValueError(f"entries: expected distinct indices, got {e.index} twice")
    return out


def op_log_leaves(entries: Iterable[LogEntry]) -> list[bytes]:
    """Leaf data of an op log: ``[LOW, entries sorted by index..., HIGH]``."""
    return [LOW_LEAF, *(e.leaf() for e in _sorted_entries(entries)), HIGH_LEAF]


def op_log_tree(entries: Iterable[LogEntry]) -> MerkleTree:
    """The full tree of an op log (leaf 0 is LOW, leaf ``len + 1`` is HIGH)."""
    return MerkleTree.from_leaves(op_log_leaves(entries))


def op_log_root(entries: Iterable[LogEntry]) -> Root:
    """Root of an op log (``EMPTY_OP_LOG_ROOT`` for an op without entries)."""
    return merkle_root(op_log_leaves(entries))


#: Log root of an op without entries: the tree ``[LOW, HIGH]``.
EMPTY_OP_LOG_ROOT: Root = merkle_root([LOW_LEAF, HIGH_LEAF])

_LEAF_DTYPE = np.dtype([("key", ">u4"), ("code", "u1"), ("value", ">u4")])  # packed, 9 bytes


def op_log_root_arrays(indices: np.ndarray, codes: np.ndarray, value_bits: np.ndarray) -> Root:
    """:func:`op_log_root` of entries given as arrays (``indices`` strictly increasing).

    The fast path for large logs: the leaves are packed by numpy and hashed by the chunk builder.
    """
    idx = np.asarray(indices)
    cod = np.asarray(codes)
    val = np.asarray(value_bits)
    n = idx.shape[0] if idx.ndim == 1 else -1
    if n < 0 or cod.shape != (n,) or val.shape != (n,):
        raise ValueError(
            f"expected three 1-D arrays of one length, got {idx.shape}, {cod.shape}, {val.shape}"
        )
    if n:
        for a, what in ((idx, "indices"), (cod, "codes"), (val, "value_bits")):
            if a.dtype.kind not in "iu":
                raise TypeError(f"{what}: expected an integer array, got {a.dtype}")
        if int(idx.min()) < 0 or int(idx.max()) > MAX_LOG_INDEX:
            raise ValueError(f"indices: expected values in [0, {MAX_LOG_INDEX}]")
        if n > 1 and not bool(np.all(np.diff(idx.astype(np.int64)) > 0)):
            raise ValueError("indices: expected strictly increasing values")
        if int(cod.min()) < 0 or int(cod.max()) > 255:
            raise ValueError("codes: expected values in [0, 255]")
        if int(val.min()) < 0 or int(val.max()) > _U32:
            raise ValueError(f"value_bits: expected values in [0, {_U32}]")
    return op_log_root_unchecked(idx, cod, val)


def op_log_root_unchecked(indices: np.ndarray, codes: np.ndarray, value_bits: np.ndarray) -> Root:
    """Root of the op log whose leaves are exactly these entries, in this order, between the
    sentinels: no check that the indices increase or the codes are valid (keys are ``index + 1``
    mod 2^32, codes mod 2^8, values mod 2^32). This is what a commitment to a *malformed* log hashes;
    :func:`op_log_root_arrays` is the same root after those checks."""
    idx = np.asarray(indices).astype(np.int64)
    n = idx.shape[0]
    rec = np.zeros(n + 2, dtype=_LEAF_DTYPE)
    rec["key"][1:-1] = (idx + 1) & _U32
    rec["code"][1:-1] = np.asarray(codes).astype(np.int64) & 0xFF
    rec["value"][1:-1] = np.asarray(value_bits).astype(np.int64) & _U32
    rec["key"][-1] = HIGH_KEY
    return chunked_root(rec.view(np.uint8), LOG_LEAF_SIZE)


@dataclass(frozen=True)
class LogEntryProof:
    """Proof of the log entry of element ``index`` of one op, or of its absence.

    Membership: one leaf (the entry, key ``index + 1``) with its inclusion proof.
    Absence: two adjacent leaves at positions ``p``, ``p + 1`` of the same tree, with
    ``key_p < index + 1 < key_{p+1}``; sorted keys between the LOW and HIGH sentinels make
    this prove that the op has no entry for ``index``.
    """

    index: int
    leaves: tuple[bytes, ...]
    proofs: tuple[InclusionProof, ...]

    @property
    def is_member(self) -> bool:
        """True for a membership proof, False for an absence proof."""
        return len(self.leaves) == 1

    @property
    def entry(self) -> LogEntry | None:
        """The proven entry, or None for an absence proof (not verified: see verify_log_entry)."""
        return LogEntry.from_leaf(self.leaves[0]) if self.is_member else None

    def to_json(self) -> dict[str, Any]:
        """``{"index": int, "leaves": ["0x..."], "proofs": [InclusionProof.to_json()...]}``."""
        return {
            "index": self.index,
            "leaves": ["0x" + leaf.hex() for leaf in self.leaves],
            "proofs": [p.to_json() for p in self.proofs],
        }

    @classmethod
    def from_json(cls, obj: Any) -> LogEntryProof:
        """Parse :meth:`to_json` output. Raises InvalidProof when malformed."""
        try:
            index, leaves, proofs = obj["index"], obj["leaves"], obj["proofs"]
            if not isinstance(leaves, list) or not isinstance(proofs, list):
                raise ValueError("expected lists of leaves and proofs")
            parsed = []
            for i, h in enumerate(leaves):
                if not isinstance(h, str) or not h.startswith("0x"):
                    raise ValueError(f"leaves[{i}]: expected a 0x-prefixed hex string, got {h!r}")
                parsed.append(bytes.fromhex(h[2:]))
            return cls(index, tuple(parsed), tuple(InclusionProof.from_json(p) for p in proofs))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidProof(f"malformed log entry proof: {e}") from None


def prove_log_entry(entries: Iterable[LogEntry], index: int) -> LogEntryProof:
    """Proof of the entry for element ``index`` of an op's log, or of its absence."""
    index = _int(index, "index", 0, MAX_LOG_INDEX)
    leaves = op_log_leaves(entries)
    tree = MerkleTree.from_leaves(leaves)
    keys = [decode_log_leaf(leaf)[0] for leaf in leaves]
    key = index + 1
    p = bisect.bisect_left(keys, key)  # keys[p-1] < key <= keys[p]; 1 <= p <= len - 1
    if keys[p] == key:
        return LogEntryProof(index, (leaves[p],), (tree.prove(p),))
    return LogEntryProof(index, (leaves[p - 1], leaves[p]), (tree.prove(p - 1), tree.prove(p)))


def verify_log_entry(
    root: bytes, proof: LogEntryProof, index: int | None = None
) -> LogEntry | None:
    """Check ``proof`` against an op's log root; return the entry, or None if there is none.

    Pass ``index`` to pin the element the caller asks about. Raises InvalidProof.
    """
    if not isinstance(proof, LogEntryProof):
        raise InvalidProof(f"expected a LogEntryProof, got {type(proof).__name__}")
    if index is not None and proof.index != index:
        raise InvalidProof(f"expected a proof for element {index}, got {proof.index}")
    if not _is_index(proof.index):
        raise InvalidProof(f"index: expected an int in [0, {MAX_LOG_INDEX}], got {proof.index!r}")
    n = len(proof.leaves)
    if n not in (1, 2) or len(proof.proofs) != n:
        raise InvalidProof(
            f"expected 1 or 2 leaves with as many proofs, got {n}, {len(proof.proofs)}"
        )
    keys = []
    for leaf, inc in zip(proof.leaves, proof.proofs, strict=True):
        try:
            keys.append(decode_log_leaf(leaf)[0])
        except ValueError as e:
            raise InvalidProof(str(e)) from None
        verify_inclusion(root, leaf_hash(leaf), inc)
    key = proof.index + 1
    if n == 1:
        if keys[0] != key:
            raise InvalidProof(f"element {proof.index}: expected key {key}, got {keys[0]}")
        return LogEntry.from_leaf(proof.leaves[0])
    lo, hi = proof.proofs
    if hi.index != lo.index + 1 or hi.size != lo.size:
        raise InvalidProof(
            f"absence: expected adjacent positions p, p+1 of one tree, got "
            f"{lo.index}/{lo.size} and {hi.index}/{hi.size}"
        )
    if not keys[0] < key < keys[1]:
        raise InvalidProof(
            f"absence of element {proof.index}: keys {keys[0]}, {keys[1]} do not bracket {key}"
        )
    return None


def _is_index(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_LOG_INDEX


# ---------------------------------------------------------------------------------------------
# Dataset and data order


def _samples(samples: np.ndarray) -> np.ndarray:
    a = validate_float32(samples, "samples")
    if a.ndim != 2:
        raise ValueError(f"samples: expected a 2-D [N, L] array, got shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"samples: expected N >= 1 samples of L >= 1 values, got shape {a.shape}")
    validate_finite(a, "samples")
    return a


def dataset_root(samples: np.ndarray) -> Root:
    """Root of a dataset ``[N, L]`` float32: leaf ``i`` = FP32 LE bytes of sample ``i``."""
    a = _samples(samples)
    return chunked_root(a, 4 * a.shape[1])


def dataset_tree(samples: np.ndarray) -> MerkleTree:
    """The full tree of :func:`dataset_root`, for sample proofs."""
    a = _samples(samples)
    return MerkleTree.from_chunks(a, 4 * a.shape[1])


def _seed(seed: Any) -> bytes:
    if not isinstance(seed, bytes) or len(seed) != 32:
        raise ValueError(f"seed: expected 32 bytes, got {seed!r:.80}")
    return seed


def sample_index(seed: bytes, step: int, row: int, n_samples: int) -> int:
    """Sample of batch row ``row`` at ``step``: ``uint256(sha256(seed || u64be(step) ||
    u32be(row))) mod n_samples`` (the digest read big-endian, as Solidity's ``uint256(bytes32)``).
    """
    h = hashlib.sha256(
        _seed(seed)
        + _int(step, "step", 0, _U64).to_bytes(8, "big")
        + _int(row, "row", 0, _U32).to_bytes(4, "big")
    ).digest()
    return int.from_bytes(h, "big") % _int(n_samples, "n_samples", 1, _U256)


def batch_indices(seed: bytes, step: int, batch: int, n_samples: int) -> list[int]:
    """The sample indices of rows ``0..batch-1`` at ``step`` (sampling with replacement)."""
    batch = _int(batch, "batch", 0, _U32 + 1)
    return [sample_index(seed, step, j, n_samples) for j in range(batch)]


# ---------------------------------------------------------------------------------------------
# Graph descriptors

#: ``abi.encode`` parameter types of an op descriptor (five top-level parameters).
DESCRIPTOR_TYPES = ("uint8", "uint32[]", "uint32[]", "uint32[][]", "uint256[]")


def _uints(xs: Any, what: str, hi: int) -> list[int]:
    if isinstance(xs, str | bytes) or not isinstance(xs, Sequence | np.ndarray):
        raise TypeError(f"{what}: expected a sequence of ints, got {type(xs).__name__}")
    return [_int(x, f"{what}[{i}]", 0, hi) for i, x in enumerate(xs)]


def encode_op_descriptor(
    kind: int,
    inputs: Sequence[int],
    shape: Sequence[int],
    in_shapes: Sequence[Sequence[int]],
    attrs: Sequence[int],
) -> bytes:
    """The op's graph leaf: ``abi.encode(kind, inputs, shape, inShapes, attrs)``.

    Types ``(uint8, uint32[], uint32[], uint32[][], uint256[])`` as five top-level parameters
    (not one tuple), so Solidity decodes it with
    ``abi.decode(desc, (uint8, uint32[], uint32[], uint32[][], uint256[]))``.
    ``in_shapes[i]`` is the shape of input ``i``.
    """
    from eth_abi import encode  # a pure encoding library; imported lazily (~0.3 s)

    ins = _uints(inputs, "inputs", _U32)
    if isinstance(in_shapes, str | bytes) or not isinstance(in_shapes, Sequence):
        raise TypeError(f"in_shapes: expected a sequence of shapes, got {type(in_shapes).__name__}")
    shapes = [_uints(s, f"in_shapes[{i}]", _U32) for i, s in enumerate(in_shapes)]
    if len(shapes) != len(ins):
        raise ValueError(f"in_shapes: expected one shape per input ({len(ins)}), got {len(shapes)}")
    values = [_int(kind, "kind", 0, 255), ins, _uints(shape, "shape", _U32), shapes]
    values.append(_uints(attrs, "attrs", _U256))
    return bytes(encode(list(DESCRIPTOR_TYPES), values))


def decode_op_descriptor(
    desc: bytes,
) -> tuple[int, list[int], list[int], list[list[int]], list[int]]:
    """``(kind, inputs, shape, in_shapes, attrs)`` of an encoded descriptor.

    Raises ValueError unless ``desc`` is the canonical encoding (it must re-encode to itself).
    """
    from eth_abi import decode
    from eth_abi.exceptions import DecodingError

    if not isinstance(desc, bytes):
        raise TypeError(f"desc: expected bytes, got {type(desc).__name__}")
    try:
        kind, ins, shape, shapes, attrs = decode(list(DESCRIPTOR_TYPES), desc)
    except (DecodingError, OverflowError) as e:
        raise ValueError(f"desc: expected an ABI-encoded op descriptor, got {e}") from None
    out = (kind, list(ins), list(shape), [list(s) for s in shapes], list(attrs))
    if len(out[3]) != len(out[1]) or encode_op_descriptor(*out) != desc:
        raise ValueError("desc: expected the canonical encoding of an op descriptor")
    return out


def graph_root(descriptors: Sequence[bytes]) -> Root:
    """Graph root: tree over the ops' encoded descriptors, in op order."""
    return merkle_root(_descriptors(descriptors))


def graph_tree(descriptors: Sequence[bytes]) -> MerkleTree:
    """The full tree of :func:`graph_root`, for descriptor proofs (leaf ``j`` = op ``j``)."""
    return MerkleTree.from_leaves(_descriptors(descriptors))


def _descriptors(descriptors: Sequence[bytes]) -> list[bytes]:
    out = list(descriptors)
    for j, d in enumerate(out):
        if not isinstance(d, bytes):
            raise TypeError(f"descriptors[{j}]: expected bytes, got {type(d).__name__}")
    return out


# ---------------------------------------------------------------------------------------------
# Spec


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, no spaces, UTF-8 (not ASCII-escaped); NaN/Inf rejected."""
    try:
        text = json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except ValueError as e:
        raise ValueError(f"spec: expected finite JSON values, got {e}") from None
    return text.encode("utf-8")


def spec_hash(spec: dict[str, Any]) -> Digest:
    """``sha256`` of the spec's canonical JSON (see :func:`canonical_json`)."""
    if not isinstance(spec, dict):
        raise TypeError(f"spec: expected a dict, got {type(spec).__name__}")
    return Digest(hashlib.sha256(canonical_json(spec)).digest())
