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

    /// @notice The dims of MATMUL `out [..., M, N] = a [..., M, K] x b [..., N, K]^T (+ bias [N])` with
    ///         input shapes `inShapes` (two, or three with the bias; the caller checks the count).
    /// @return bad The first input (0 a, 1 b, 2 bias) whose shape does not fit `shape`, in the order
    ///         checked; `type(uint256).max` when all fit (then M, N, K >= 1).
    function matmulDims(uint32[] memory shape, uint32[][] memory inShapes)
        internal
        pure
        returns (uint256 bad, uint256 m, uint256 nOut, uint256 kk)
    {
        uint256 r = shape.length;
        uint32[] memory a = inShapes[0];
        uint32[] memory b = inShapes[1];
        if (r < 2 || a.length != r) return (0, 0, 0, 0);
        if (b.length != r) return (1, 0, 0, 0);
        m = shape[r - 2];
        nOut = shape[r - 1];
        kk = a[r - 1];
        for (uint256 i = 0; i + 2 < r; ++i) {
            if (a[i] != shape[i]) return (0, 0, 0, 0);
            if (b[i] != shape[i]) return (1, 0, 0, 0);
        }
        if (a[r - 2] != m || kk == 0 || m == 0) return (0, 0, 0, 0);
        if (b[r - 2] != nOut || b[r - 1] != kk || nOut == 0) return (1, 0, 0, 0);
        if (inShapes.length == 3 && (inShapes[2].length != 1 || inShapes[2][0] != nOut)) return (2, 0, 0, 0);
        bad = type(uint256).max;
    }

    /// @notice The row length n of a reduction over the last axis, `a [..., n]` to `out [..., 1]`;
    ///         0 when `inShape` and `outShape` do not fit that (n >= 1 otherwise).
    function reducedLength(uint32[] memory outShape, uint32[] memory inShape) internal pure returns (uint256) {
        uint256 r = outShape.length;
        if (r == 0 || !sameExcept(inShape, outShape, r - 1) || outShape[r - 1] != 1) return 0;
        return inShape[r - 1];
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
