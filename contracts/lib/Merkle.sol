// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Merkle
/// @notice RFC 9162 Merkle trees over SHA-256, the shape pymerkle builds:
///         leaf = sha256(0x00 || data), node = sha256(0x01 || left || right),
///         split at the largest power of two below n, lone right subtree promoted.
///         Proofs are positional: (index, size) are bound by the verification.
library Merkle {
    /// @notice Thrown when an inclusion proof does not lead to the expected root.
    error InvalidProof(bytes32 root, uint256 index, uint256 size);
    /// @notice Thrown when a proof or leaf list is longer than the library accepts.
    error TooLarge(uint256 length, uint256 max);

    /// @dev Deepest proof accepted: trees of up to 2^64 leaves.
    uint256 internal constant MAX_DEPTH = 64;
    /// @dev Most leaves `rootOf` hashes in one call (a bounded loop).
    uint256 internal constant MAX_LEAVES = 1024;

    /// @notice Hash of one leaf's data.
    function leafHash(bytes memory data) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(bytes1(0x00), data));
    }

    /// @notice Hash of an inner node.
    function nodeHash(bytes32 left, bytes32 right) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(bytes1(0x01), left, right));
    }

    /// @notice The RFC 9162 root implied by `leaf` at `index` in a tree of `size` leaves.
    /// @dev Returns bytes32(0) when the path has the wrong length for (index, size).
    function rootFrom(bytes32 leaf, uint256 index, uint256 size, bytes32[] memory path)
        internal
        pure
        returns (bytes32)
    {
        if (path.length > MAX_DEPTH) revert TooLarge(path.length, MAX_DEPTH);
        if (index >= size) return bytes32(0);
        uint256 fn = index;
        uint256 sn = size - 1;
        bytes32 r = leaf;
        for (uint256 i = 0; i < path.length; ++i) {
            if (sn == 0) return bytes32(0);
            if (fn & 1 == 1 || fn == sn) {
                r = nodeHash(path[i], r);
                if (fn & 1 == 0) {
                    // SAFETY: bounded by the 256 bits of fn.
                    while (fn & 1 == 0 && fn != 0) {
                        fn >>= 1;
                        sn >>= 1;
                    }
                }
            } else {
                r = nodeHash(r, path[i]);
            }
            fn >>= 1;
            sn >>= 1;
        }
        if (sn != 0) return bytes32(0);
        return r;
    }

    /// @notice Reverts with `InvalidProof` unless `leaf` sits at `index` of the `size`-leaf tree `root`.
    function verify(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] memory path)
        internal
        pure
    {
        // INVARIANT: the zero hash is never a root (sha256 preimage), so a failed walk never matches.
        if (rootFrom(leaf, index, size, path) != root || root == bytes32(0)) {
            revert InvalidProof(root, index, size);
        }
    }

    /// @notice True when `leaf` sits at `index` of the `size`-leaf tree `root`.
    function isIncluded(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] memory path)
        internal
        pure
        returns (bool)
    {
        return root != bytes32(0) && rootFrom(leaf, index, size, path) == root;
    }

    /// @notice Root of a small tree whose leaves are the given 32-byte values (each hashed as leaf data).
    /// @dev Bottom-up pairing with the odd last node promoted equals the RFC 9162 split shape.
    function rootOf(bytes32[] memory values) internal pure returns (bytes32) {
        uint256 n = values.length;
        if (n > MAX_LEAVES) revert TooLarge(n, MAX_LEAVES);
        if (n == 0) return sha256("");
        bytes32[] memory level = new bytes32[](n);
        for (uint256 i = 0; i < n; ++i) {
            level[i] = leafHash(abi.encodePacked(values[i]));
        }
        while (n > 1) {
            uint256 half = n / 2;
            for (uint256 i = 0; i < half; ++i) {
                level[i] = nodeHash(level[2 * i], level[2 * i + 1]);
            }
            if (n % 2 == 1) {
                level[half] = level[n - 1];
                n = half + 1;
            } else {
                n = half;
            }
        }
        return level[0];
    }
}
