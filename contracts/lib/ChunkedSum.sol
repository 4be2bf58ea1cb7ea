// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ExactSum} from "contracts/lib/ExactSum.sol";
import {Partial} from "contracts/lib/GameTypes.sol";

/// @title ChunkedSum
/// @notice The chunk level of a long reduction (docs/protocol.md, "Chunk level"): the element's
///         ExactSum accumulation split into per-chunk partials that add up to exactly what
///         `ExactSum.accumulate` computes over all terms at once.
/// @dev All chunks use the element's scale `E = max est` (the largest posted `maxExp`), so each
///      term is floored to the same quantum as in the one-transaction accumulation and the sums,
///      |sums|, inexact counts and exact tails (`ExactSum.tailAt`, limb by limb) are additive. Mirror: `vtrain/numerics/exact.py` (`chunk_partial`,
///      `partials_accumulation`).
library ChunkedSum {
    /// @notice Thrown when the number of partials is not the element's chunk count.
    error ChunkCount(uint256 given, uint256 expected);
    /// @notice Thrown when a posted partial is outside what its chunk's terms can produce.
    error PartialOutOfBounds(uint256 chunk);

    /// @dev Reductions of more terms than this are ruled through the chunk level (the threshold).
    uint256 internal constant MAX_DIRECT_TERMS = 4096;
    /// @dev Terms per chunk (the last chunk may be short).
    uint256 internal constant CHUNK_TERMS = 2048;
    /// @dev Most chunks of one element: the accumulator's headroom over the chunk size.
    uint256 internal constant MAX_CHUNKS = ExactSum.MAX_TERMS / CHUNK_TERMS;
    /// @dev Largest term exponent of finite FP32 products (254 + 254).
    uint256 internal constant MAX_EST = 508;
    /// @dev Quanta of one term are below 2^120 (ExactSum.GUARD + 48-bit products).
    uint256 internal constant TERM_QUANTA_BITS = 120;
    /// @dev One term's value in a tail limb is below 2^238 (ExactSum.tailAt).
    uint256 internal constant TAIL_VALUE_BITS = 238;

    /// @notice Number of chunks of an `n`-term element.
    function chunkCount(uint256 n) internal pure returns (uint256) {
        return (n + CHUNK_TERMS - 1) / CHUNK_TERMS;
    }

    /// @notice Terms in chunk `c` of an `n`-term element.
    function chunkTerms(uint256 n, uint256 c) internal pure returns (uint256) {
        uint256 lo = c * CHUNK_TERMS;
        return n - lo < CHUNK_TERMS ? n - lo : CHUNK_TERMS;
    }

    /// @notice Reverts unless `p` holds one partial per chunk of an `n`-term element, each within
    ///         what its chunk's terms can produce (so later sums cannot overflow).
    function check(Partial[] memory p, uint256 n) internal pure {
        uint256 nc = chunkCount(n);
        // SAFETY: bounds every loop over the partials.
        if (n > ExactSum.MAX_TERMS) revert ExactSum.TooManyTerms(n, ExactSum.MAX_TERMS);
        if (p.length != nc) revert ChunkCount(p.length, nc);
        for (uint256 c = 0; c < nc; ++c) {
            uint256 t = chunkTerms(n, c);
            uint256 cap = t << TERM_QUANTA_BITS;
            Partial memory q = p[c];
            bool bad = q.maxExp > MAX_EST || q.absSum >= cap || q.inexact > t || q.sum > int256(cap)
                || q.sum < -int256(cap);
            // SAFETY: limb 0 counts negative floored terms, limbs 1..3 hold t values below 2^238 each,
            // so the sums over MAX_CHUNKS chunks stay below 2^254 (ExactSum.roundOf's bound).
            int256 tcap = int256(t << TAIL_VALUE_BITS);
            bad = bad || q.tail[0] < 0 || uint256(q.tail[0]) > q.inexact;
            for (uint256 j = 1; j < ExactSum.TAIL_LIMBS; ++j) {
                bad = bad || q.tail[j] >= tcap || q.tail[j] <= -tcap;
            }
            if (bad) revert PartialOutOfBounds(c);
        }
    }

    /// @notice The element's scale: the largest `maxExp` of the partials.
    function scale(Partial[] memory p) internal pure returns (uint256 top) {
        for (uint256 c = 0; c < p.length; ++c) {
            if (p[c].maxExp > top) top = p[c].maxExp;
        }
    }

    /// @notice The accumulation of the whole element from its partials (what `ExactSum.accumulate`
    ///         returns over all terms when the partials are right).
    function total(Partial[] memory p) internal pure returns (ExactSum.Accumulation memory acc) {
        uint256 top = scale(p);
        if (top == 0) return acc;
        for (uint256 c = 0; c < p.length; ++c) {
            acc.sum += p[c].sum;
            acc.absSum += p[c].absSum;
            acc.inexact += p[c].inexact;
        }
        acc.lsbExp = int256(top) - ExactSum.LSB_OFFSET;
    }

    /// @notice The element's exact tail: the partials' tails summed limb by limb (what
    ///         `ExactSum.tailAt` returns over all terms when the partials are right).
    function tailTotal(Partial[] memory p) internal pure returns (int256[4] memory tail) {
        for (uint256 c = 0; c < p.length; ++c) {
            for (uint256 j = 0; j < ExactSum.TAIL_LIMBS; ++j) {
                tail[j] += p[c].tail[j];
            }
        }
    }

    /// @notice One chunk's partial of packed terms at the element's scale `top`.
    /// @dev A chunk whose own largest exponent exceeds `top` returns only that exponent: it differs
    ///      from any posted partial (each posted `maxExp` is at most `top`).
    function partialAt(uint256[] memory terms, uint256 top) internal pure returns (Partial memory p) {
        uint256 mine = ExactSum.maxEst(terms);
        p.maxExp = mine;
        if (mine == 0 || mine > top) return p;
        // The same exact accumulation as ExactSum.accumulate, over this chunk only, at the element's scale.
        (p.sum, p.absSum, p.inexact) = ExactSum.sumAt(terms, top);
        // The second pass only where a term was floored (the tail is zero otherwise).
        if (p.inexact != 0) p.tail = ExactSum.tailAt(terms, top);
    }
}
