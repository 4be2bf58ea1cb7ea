// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title TensorProof
/// @notice Range openings of RFC 9162 trees (docs/protocol.md "Merkle trees"): the data of the
///         consecutive leaves `[first, first + count)` of a `size`-leaf tree, plus the roots of the
///         maximal subtrees outside the range, which rebuild the tree's root. Used for tensor chunks
///         (one element or a whole row), dataset samples and pairs of adjacent log leaves.
/// @dev Sibling order: depth-first, left to right, over the tree's RFC 9162 shape (split at the
///      largest power of two below the node's size), one hash for every maximal subtree disjoint
///      from the range. For one leaf this is the RFC 9162 audit path, top-down. Leaves and nodes are
///      hashed as in `Merkle.leafHash`/`Merkle.nodeHash` (0x00 / 0x01 prefixes), without copying
///      the leaf data. Positions are bound by the shape, so the opening proves where each leaf is.
library TensorProof {
    /// @notice Thrown when opened data has the wrong length for the leaves it must hold.
    error OpeningLength(uint256 actual, uint256 expected);
    /// @notice Thrown when the opening does not carry exactly the sibling hashes its range needs.
    error SiblingCount(uint256 actual, uint256 needed);
    /// @notice Thrown when an opening does not rebuild the expected root.
    error RangeMismatch(bytes32 root, uint256 first, uint256 count, uint256 size);
    /// @notice Thrown when a range is empty or does not fit in the tree.
    error BadRange(uint256 first, uint256 count, uint256 size);

    /// @notice Elements per tensor leaf (chunk).
    uint256 internal constant CHUNK = 64;
    /// @notice Bytes per full tensor leaf.
    uint256 internal constant CHUNK_BYTES = 256;
    /// @notice Largest tree size an opening may claim.
    uint256 internal constant MAX_SIZE = 1 << 64;

    /// @dev Walk state: the range, the leaf hashes and the next unread sibling.
    struct Walk {
        uint256 first;
        uint256 end;
        uint256 next;
        bytes32[] leaves;
        bytes32[] siblings;
    }

    /// @notice Reverts unless `data` holds leaves `[first, first + count)` of the `size`-leaf tree
    ///         `root`, each `leafLen` bytes except a shorter last leaf of the tree.
    /// @param data Concatenated leaf data; `count = ceil(data.length / leafLen)`.
    function verifyRange(
        bytes32 root,
        uint256 first,
        uint256 size,
        bytes memory data,
        uint256 leafLen,
        bytes32[] memory siblings
    ) internal view {
        uint256 count = (data.length + leafLen - 1) / leafLen;
        // SAFETY: trees of up to 2^64 leaves (as Merkle.MAX_DEPTH) bound the walk's recursion depth.
        if (count == 0 || first + count > size || size > MAX_SIZE) revert BadRange(first, count, size);
        Walk memory w = Walk(first, first + count, 0, new bytes32[](count), siblings);
        for (uint256 i = 0; i < count; ++i) {
            uint256 off = i * leafLen;
            uint256 len = data.length - off < leafLen ? data.length - off : leafLen;
            w.leaves[i] = _leafHash(data, off, len);
        }
        bytes32 r = _subtree(0, size, w);
        // INVARIANT: every supplied sibling is used, so an opening has one canonical form.
        if (w.next != siblings.length) revert SiblingCount(siblings.length, w.next);
        if (r != root) revert RangeMismatch(root, first, count, size);
    }

    /// @notice Verifies the chunks holding tensor elements `[start, start + len)` of a tensor of
    ///         `numel` elements and returns the flat index of the first opened element.
    /// @dev `data` must be exactly the FP32 LE bytes of chunks `start/64 .. (start+len-1)/64`.
    function verifyElements(
        bytes32 root,
        uint256 numel,
        uint256 start,
        uint256 len,
        bytes memory data,
        bytes32[] memory siblings
    ) internal view returns (uint256 base) {
        if (len == 0 || start + len > numel) revert BadRange(start, len, numel);
        uint256 c0 = start / CHUNK;
        uint256 c1 = (start + len - 1) / CHUNK;
        base = c0 * CHUNK;
        uint256 endElem = (c1 + 1) * CHUNK < numel ? (c1 + 1) * CHUNK : numel;
        uint256 expected = (endElem - base) * 4;
        if (data.length != expected) revert OpeningLength(data.length, expected);
        verifyRange(root, c0, (numel + CHUNK - 1) / CHUNK, data, CHUNK_BYTES, siblings);
    }

    /// @notice The FP32 bits of the `j`-th little-endian element of `data` (unchecked bound: the
    ///         caller reads only elements it has verified).
    function f32At(bytes memory data, uint256 j) internal pure returns (uint32 r) {
        uint256 v;
        // One word load instead of four bounds-checked byte reads (hot path of every opening).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            v := shr(224, mload(add(add(data, 32), shl(2, j))))
        }
        // Byte swap of the 4-byte little-endian word.
        r = uint32(((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | (v >> 24));
    }

    /// @dev Root of the subtree over leaves [s, e), reading siblings for parts outside the range.
    function _subtree(uint256 s, uint256 e, Walk memory w) private view returns (bytes32) {
        if (e <= w.first || s >= w.end) {
            if (w.next >= w.siblings.length) revert SiblingCount(w.siblings.length, w.next + 1);
            return w.siblings[w.next++];
        }
        if (e - s == 1) return w.leaves[s - w.first];
        uint256 k = 1;
        while (k << 1 < e - s) k <<= 1;
        bytes32 left = _subtree(s, s + k, w);
        return _nodeHash(left, _subtree(s + k, e, w));
    }

    /// @dev sha256(0x00 || data[off:off+len]) without a copy: the prefix byte is written over the
    ///      byte before the slice and restored.
    function _leafHash(bytes memory data, uint256 off, uint256 len) private view returns (bytes32 h) {
        // Hashes a slice of memory in place; Solidity would copy it first (no memory slices).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            let p := add(add(data, 32), off)
            let saved := mload(sub(p, 32))
            mstore8(sub(p, 1), 0)
            if iszero(staticcall(gas(), 2, sub(p, 1), add(len, 1), 0x00, 0x20)) { revert(0, 0) }
            mstore(sub(p, 32), saved)
            h := mload(0x00)
        }
    }

    /// @dev sha256(0x01 || left || right), in the free memory past the pointer (not allocated).
    function _nodeHash(bytes32 left, bytes32 right) private view returns (bytes32 h) {
        // sha256(abi.encodePacked(..)) allocates per node; this uses scratch memory (no allocation).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            let p := mload(0x40)
            mstore8(p, 1)
            mstore(add(p, 1), left)
            mstore(add(p, 33), right)
            if iszero(staticcall(gas(), 2, p, 65, 0x00, 0x20)) { revert(0, 0) }
            h := mload(0x00)
        }
    }
}
