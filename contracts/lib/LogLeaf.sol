// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {TensorProof} from "contracts/lib/TensorProof.sol";

/// @title LogLeaf
/// @notice Reads one element's entry of an op's rounding log (docs/protocol.md, "One-step proof
///         encoding"): the log is a sorted list of 9-byte leaves `uint32be key || uint8 code ||
///         uint32be value` (key = element index + 1), and two adjacent leaves `position, position + 1`
///         with `key_p < index + 1 <= key_{p+1}` prove the entry (leaf p+1 when its key is `index + 1`,
///         otherwise none: code 0). Used by Adjudicator and ChunkAdjudicator.
library LogLeaf {
    /// @notice Two adjacent leaves of the op log tree and the range proof of them.
    struct Opening {
        uint256 position;
        uint256 size;
        bytes leaves;
        bytes32[] siblings;
    }

    /// @notice Thrown when the opened log leaves do not bracket the element's key.
    error LogBracket(uint256 keyBelow, uint256 keyAbove, uint256 key);
    /// @notice Thrown when the output index is beyond the log's key space.
    error IndexOutOfRange(uint256 index, uint256 limit);

    /// @notice Bytes of one log leaf.
    uint256 internal constant LEAF = 9;
    uint256 private constant HIGH_KEY = 0xFFFFFFFF;

    /// @notice The log entry of `index` from two adjacent leaves of the op log tree `root`.
    function entry(bytes32 root, uint256 index, Opening memory o) internal view returns (uint8 code, uint32 value) {
        uint256 key = index + 1;
        if (key >= HIGH_KEY) revert IndexOutOfRange(index, HIGH_KEY - 1);
        if (o.leaves.length != 2 * LEAF) revert TensorProof.OpeningLength(o.leaves.length, 2 * LEAF);
        TensorProof.verifyRange(root, o.position, o.size, o.leaves, LEAF, o.siblings);
        bytes memory l = o.leaves;
        uint256 below = _be(l, 0, 4);
        uint256 above = _be(l, LEAF, 4);
        // INVARIANT: the leaves are adjacent (positions are bound by the range opening), so in a
        // sorted log they are the unique pair around the key.
        if (!(below < key && key <= above)) revert LogBracket(below, above, key);
        if (above == key) {
            code = uint8(_be(l, LEAF + 4, 1));
            value = uint32(_be(l, LEAF + 5, 4));
        }
    }

    /// @dev Big-endian unsigned integer of `len` bytes at `off` in `b` (bounds checked by the caller).
    function _be(bytes memory b, uint256 off, uint256 len) private pure returns (uint256 r) {
        // One word load instead of `len` bounds-checked byte reads; read-only, in bounds (see @dev).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            r := shr(sub(256, shl(3, len)), mload(add(add(b, 32), off)))
        }
    }
}
