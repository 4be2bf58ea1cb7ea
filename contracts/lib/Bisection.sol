// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Merkle} from "contracts/lib/Merkle.sol";
import {Descent, HashMismatch, NotBisectable, RevealState, ZeroRoot} from "contracts/lib/GameTypes.sol";

/// @title Bisection
/// @notice Descent over an RFC 9162 tree (the shape of `Merkle`): a node is (root, lo, size); a
///         node of `size > 1` splits at `k`, the largest power of two below `size`, into a left
///         node (lo, k) and a right node (lo + k, size - k). The trainer reveals both children of
///         the current node (checked by `Merkle.nodeHash`), the challenger chooses one, until the
///         node is a single leaf (size == 1) whose hash is `root`.
/// @dev Works on a `Descent` in storage so the game contract only does access checks and events.
library Bisection {
    /// @notice Starts a descent at the root of a tree of `size` leaves.
    function start(Descent storage d, bytes32 root, uint64 size) internal {
        d.root = root;
        d.left = bytes32(0);
        d.right = bytes32(0);
        d.lo = 0;
        d.size = size;
    }

    /// @notice The RFC 9162 split of a node of `size >= 2` leaves: the largest power of two below `size`.
    function split(uint64 size) internal pure returns (uint64 k) {
        if (size < 2) revert NotBisectable(size);
        k = 1;
        // SAFETY: at most 63 doublings for a uint64 size.
        while (k << 1 < size) {
            k <<= 1;
        }
    }

    /// @notice True when the current node is a single leaf.
    function isLeaf(Descent storage d) internal view returns (bool) {
        return d.size == 1;
    }

    /// @notice True when the children of the current node have been revealed and await a choice.
    function isRevealed(Descent storage d) internal view returns (bool) {
        return d.left != bytes32(0);
    }

    /// @notice Records the two children of the current node.
    /// @dev Reverts unless nodeHash(left, right) == root.
    function reveal(Descent storage d, bytes32 left, bytes32 right) internal {
        // INVARIANT: a leaf has no children; the leaf is opened instead.
        if (d.size < 2) revert NotBisectable(d.size);
        // INVARIANT: children are revealed once per node, then the challenger chooses.
        if (d.left != bytes32(0)) revert RevealState(true);
        // SAFETY: zero is the "not revealed" sentinel and never a hash.
        if (left == bytes32(0) || right == bytes32(0)) revert ZeroRoot();
        bytes32 parent = Merkle.nodeHash(left, right);
        // INVARIANT: the children are the ones committed to by the disputed node.
        if (parent != d.root) revert HashMismatch(d.root, parent);
        d.left = left;
        d.right = right;
    }

    /// @notice Descends into the revealed left (`right == false`) or right child.
    /// @return root The new node's hash.
    /// @return lo The new node's first leaf.
    /// @return size The new node's number of leaves.
    function choose(Descent storage d, bool right) internal returns (bytes32 root, uint64 lo, uint64 size) {
        // INVARIANT: the challenger chooses among revealed children only.
        if (d.left == bytes32(0)) revert RevealState(false);
        uint64 k = split(d.size);
        if (right) {
            root = d.right;
            lo = d.lo + k;
            size = d.size - k;
        } else {
            root = d.left;
            lo = d.lo;
            size = k;
        }
        d.root = root;
        d.lo = lo;
        d.size = size;
        d.left = bytes32(0);
        d.right = bytes32(0);
    }
}
