// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title TensorIndex
/// @notice Row-major index arithmetic for shapes of rank <= MAX_RANK: flat <-> multi-index,
///         broadcasting (a dim of size 1 reads index 0) and the shape checks the op kinds need.
library TensorIndex {
    /// @notice Thrown when a shape has more dimensions than supported.
    error RankTooLarge(uint256 rank, uint256 max);
    /// @notice Thrown when a flat index is not below the tensor's element count.
    error IndexOutOfRange(uint256 index, uint256 numel);

    uint256 internal constant MAX_RANK = 6;

    /// @notice Number of elements of `shape` (1 for rank 0).
    function numel(uint32[] memory shape) internal pure returns (uint256 n) {
        if (shape.length > MAX_RANK) revert RankTooLarge(shape.length, MAX_RANK);
        n = 1;
        // SAFETY: at most 6 factors below 2^32, so the product stays below 2^192.
        for (uint256 i = 0; i < shape.length; ++i) {
            n *= shape[i];
        }
    }

    /// @notice The multi-index of flat index `flat` in `shape`; reverts when out of range.
    function unravel(uint256 flat, uint32[] memory shape) internal pure returns (uint256[] memory idx) {
        uint256 n = numel(shape);
        if (flat >= n) revert IndexOutOfRange(flat, n);
        idx = new uint256[](shape.length);
        for (uint256 i = shape.length; i > 0; --i) {
            uint256 d = shape[i - 1];
            idx[i - 1] = flat % d;
            flat /= d;
        }
    }

    /// @notice Flat index in `shape` of multi-index `idx`, where dims of size 1 broadcast (read 0).
    /// @dev Callers check `idx[i] < shape[i]` or `shape[i] == 1` through `broadcastsTo`.
    function ravelBroadcast(uint256[] memory idx, uint32[] memory shape) internal pure returns (uint256 flat) {
        for (uint256 i = 0; i < shape.length; ++i) {
            uint256 d = shape[i];
            flat = flat * d + (d == 1 ? 0 : idx[i]);
        }
    }

    /// @notice True when `inShape` has the rank of `outShape` and each dim equals it or is 1.
    function broadcastsTo(uint32[] memory inShape, uint32[] memory outShape) internal pure returns (bool) {
        if (inShape.length != outShape.length) return false;
        for (uint256 i = 0; i < inShape.length; ++i) {
            if (inShape[i] != outShape[i] && inShape[i] != 1) return false;
        }
        return true;
    }

    /// @notice True when both shapes have the same rank and agree on every dim except `skip`
    ///         (pass `type(uint256).max` to compare all dims).
    function sameExcept(uint32[] memory a, uint32[] memory b, uint256 skip) internal pure returns (bool) {
        if (a.length != b.length) return false;
        for (uint256 i = 0; i < a.length; ++i) {
            if (i != skip && a[i] != b[i]) return false;
        }
        return true;
    }
}
