"""One-step proofs: the ``proof`` bytes ``Adjudicator.adjudicate`` expects for one output element.

Encoding (docs/protocol.md, "One-step proof encoding"; Adjudicator's NatSpec)::

    proof = abi.encode(Opening[] openings, LogOpening log)
    Opening    = (bytes data, bytes32[] siblings)
    LogOpening = (uint256 position, uint256 size, bytes leaves, bytes32[] siblings)

Each opening is a *range opening* of an RFC 9162 tree: the data of consecutive leaves plus the
roots of the maximal subtrees outside the range, depth-first, left to right (see
``contracts/lib/TensorProof.sol``). Input openings hold whole 64-element chunks, in the order of
:func:`vtrain.numerics.exact.reads`; the log opening holds the two adjacent log leaves around the
element's key.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from vtrain.commit.merkle import MerkleTree
from vtrain.commit.roots import (
    CHUNK_ELEMS,
    LogEntry,
    decode_log_leaf,
    op_log_leaves,
)
from vtrain.numerics.exact import DATA_INPUT, DataContext, OpDesc, Read, chunk_reads, reads

__all__ = [
    "CHUNK_PROOF_TYPES",
    "LOG_PROOF_TYPES",
    "OPENING_TYPES",
    "build_chunk_proof",
    "build_element_proof",
    "build_log_proof",
    "element_openings",
    "encode_proof",
    "log_opening",
    "range_siblings",
]

#: ``abi.encode`` types of the proof: ``(Opening[] openings, LogOpening log)``.
OPENING_TYPES = ("(bytes,bytes32[])[]", "(uint256,uint256,bytes,bytes32[])")
#: Chunk level (``ChunkAdjudicator``): ``checkChunk``'s proof ``abi.encode(Opening[])`` and
#: ``ruleFromPartials``'s ``abi.encode(LogOpening)``.
CHUNK_PROOF_TYPES = ("(bytes,bytes32[])[]",)
LOG_PROOF_TYPES = ("(uint256,uint256,bytes,bytes32[])",)


def _split(n: int) -> int:
    return 1 << ((n - 1).bit_length() - 1)


def range_siblings(tree: MerkleTree, first: int, end: int) -> list[bytes]:
    """The sibling hashes of a range opening of leaves ``[first, end)`` of ``tree``: the roots of
    the maximal subtrees disjoint from the range, depth-first, left to right."""
    if not 0 <= first < end <= tree.size:
        raise ValueError(f"range: expected 0 <= first < end <= {tree.size}, got [{first}, {end})")
    out: list[bytes] = []

    def walk(s: int, e: int) -> None:
        if e <= first or s >= end:
            out.append(tree.range_root(s, e))
            return
        if e - s == 1:
            return
        k = _split(e - s)
        walk(s, s + k)
        walk(s + k, e)

    walk(0, tree.size)
    return out


def log_opening(entries: Sequence[LogEntry], index: int) -> tuple[int, int, bytes, list[bytes]]:
    """``(position, size, leaves, siblings)``: the adjacent log leaves ``p, p+1`` with
    ``key_p < index + 1 <= key_{p+1}`` and their range opening."""
    leaves = op_log_leaves(entries)
    keys = [decode_log_leaf(leaf)[0] for leaf in leaves]
    p = bisect.bisect_left(keys, index + 1) - 1
    tree = MerkleTree.from_leaves(leaves)
    return p, len(leaves), leaves[p] + leaves[p + 1], range_siblings(tree, p, p + 2)


def encode_proof(
    openings: Sequence[tuple[bytes, Sequence[bytes]]], log: tuple[int, int, bytes, Sequence[bytes]]
) -> bytes:
    """ABI-encode openings and a log opening (for tests that tamper with the parts)."""
    from eth_abi import encode

    return bytes(
        encode(list(OPENING_TYPES), [[(d, list(s)) for d, s in openings], (log[0], log[1], log[2], list(log[3]))])
    )


class _Trees:
    """Chunk trees of the inputs, built on first use (the proof may not read every input)."""

    def __init__(self, inputs: Sequence[np.ndarray]):
        self.flat = [np.ascontiguousarray(t, dtype="<f4").reshape(-1) for t in inputs]
        self._trees: dict[int, MerkleTree] = {}

    def tree(self, i: int) -> MerkleTree:
        if i not in self._trees:
            # Built from the raw bytes (no finiteness check), so malformed inputs can be opened too.
            self._trees[i] = MerkleTree.from_chunks(self.flat[i].view(np.uint8), 4 * CHUNK_ELEMS)
        return self._trees[i]


Openings = list[tuple[bytes, list[bytes]]]
LogOpening = tuple[int, int, bytes, list[bytes]]


def build_element_proof(
    descriptor: Any,
    inputs: Sequence[np.ndarray],
    index: int,
    log_entries: Sequence[LogEntry],
    dataset: np.ndarray | None = None,
    seed: bytes | None = None,
    step: int | None = None,
) -> bytes:
    """The ``proof`` argument of ``Adjudicator.adjudicate`` for output element ``index``.

    ``descriptor`` is the encoded descriptor (or an :class:`~vtrain.numerics.exact.OpDesc`), ``inputs``
    the op's input tensors (float32, descriptor order), ``log_entries`` the op's rounding log.
    DATA ops also need ``dataset`` (``[nSamples, L]`` float32), ``seed`` (32 bytes) and ``step``;
    DROPOUT_MASK and STEP open nothing (``seed`` and ``step`` may be given, the dataset left None).
    """
    return encode_proof(*element_openings(descriptor, inputs, index, log_entries, dataset, seed, step))


def element_openings(
    descriptor: Any,
    inputs: Sequence[np.ndarray],
    index: int,
    log_entries: Sequence[LogEntry],
    dataset: np.ndarray | None = None,
    seed: bytes | None = None,
    step: int | None = None,
) -> tuple[Openings, LogOpening]:
    """The parts of :func:`build_element_proof` before encoding: ``(openings, log)``."""
    desc = OpDesc.of(descriptor)
    data = None
    if dataset is not None or seed is not None or step is not None:
        if seed is None or step is None:
            raise ValueError("DATA/DROPOUT_MASK/STEP proofs: expected both seed and step")
        ds = None if dataset is None else np.ascontiguousarray(dataset, dtype="<f4")
        data = DataContext(ds, seed, step)
    trees = _Trees(inputs)
    openings: list[tuple[bytes, list[bytes]]] = []
    for r in reads(desc, inputs, index, data):
        if r.input != DATA_INPUT:
            openings.append(_range_opening(trees, r))
            continue
        assert data is not None and data.dataset is not None
        tree = MerkleTree.from_chunks(data.dataset.view(np.uint8), 4 * data.dataset.shape[1])
        openings.append((data.dataset[r.start].tobytes(), range_siblings(tree, r.start, r.start + 1)))
    return openings, log_opening(list(log_entries), index)


def _range_opening(trees: _Trees, r: Read) -> tuple[bytes, list[bytes]]:
    """The whole 64-element chunks of input ``r.input`` holding elements ``[start, start + length)``."""
    flat = trees.flat[r.input]
    c0 = r.start // CHUNK_ELEMS
    c1 = (r.start + r.length - 1) // CHUNK_ELEMS + 1
    return flat[CHUNK_ELEMS * c0 : CHUNK_ELEMS * c1].tobytes(), range_siblings(trees.tree(r.input), c0, c1)


def build_chunk_proof(descriptor: Any, inputs: Sequence[np.ndarray], index: int, chunk: int) -> bytes:
    """``ChunkAdjudicator.checkChunk``'s proof for chunk ``chunk`` of element ``index`` of a long
    reduction: ``abi.encode(Opening[])`` of the reads of :func:`vtrain.numerics.exact.chunk_reads`."""
    from eth_abi import encode

    trees = _Trees(inputs)
    openings = [_range_opening(trees, r) for r in chunk_reads(OpDesc.of(descriptor), inputs, index, chunk)]
    return bytes(encode(list(CHUNK_PROOF_TYPES), [[(d, list(s)) for d, s in openings]]))


def build_log_proof(log_entries: Sequence[LogEntry], index: int) -> bytes:
    """``ChunkAdjudicator.ruleFromPartials``'s proof: ``abi.encode(LogOpening)`` of element ``index``."""
    from eth_abi import encode

    p, size, leaves, sib = log_opening(list(log_entries), index)
    return bytes(encode(list(LOG_PROOF_TYPES), [(p, size, leaves, list(sib))]))
