// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Float32} from "contracts/lib/Float32.sol";
import {RoundingRule} from "contracts/lib/RoundingRule.sol";

/// @title ExactSum
/// @notice Tight enclosures of sums of FP32 products (dot products, sums, means) in one int256
///         fixed-point accumulator, and the certified bounds `dc` of docs/numerics.md.
/// @dev Term: `t = (-1)^s * M * 2^(est - 300)`, `M = ma * mb < 2^48` (24-bit significands, implicit
///      bit included) and `est = ea + eb`, where `ea` is a's biased exponent with subnormals counted
///      as 1 (so `|t| < 2^(est - 252)`). A single value is a product with 1.0.
///      Packed in one word: bit 255 the sign, bits 64..79 `est`, bits 0..63 `M` (0 for a zero term).
///
///      Accumulation: `E = max est` over non-zero terms, quantum `2^L` with `L = E - 372`: each term
///      is `M * 2^(est - E + 72)` quanta (below 2^120 quanta). A term with bits below the quantum is
///      floored (towards -inf) and counted in `inexact`. Result, in quanta:
///        e in [sum, sum + inexact],   S = sum|t_k| in [absSum, absSum + inexact].
///      Width bound: the widest term is at least `2^(E - 300)` (its M >= 1), so
///      `dc >= n * 2^-53 * 2^(E-300) = n * 2^(L + 19)` while the width is at most `n * 2^L`:
///      width <= 2^-19 * dc. The bound uses `S_up = absSum + inexact` >= S, so it is at most
///      `2^-19` (relative) above the exact-S bound; both directions are absorbed by the trainer's
///      1.01 slack (docs/numerics.md: dc <= d <= 1.25 dc).
///      Sizes: |sum| < n * 2^120 < 2^137 for n <= MAX_TERMS; the mean scaling (x 2^106) stays < 2^244.
library ExactSum {
    /// @notice Thrown when a sum has more terms than the accumulator's headroom allows.
    error TooManyTerms(uint256 n, uint256 max);

    /// @dev Accumulator headroom: 2^16 terms of < 2^120 quanta each stay below 2^137.
    uint256 internal constant MAX_TERMS = 1 << 16;
    uint256 internal constant M_MASK = (1 << 64) - 1;
    /// @dev Quanta shift of the widest term: `M * 2^72 < 2^120`.
    uint256 internal constant GUARD = 72;
    /// @dev `L = E - LSB_OFFSET` (300 for the term exponent, 72 guard bits).
    int256 internal constant LSB_OFFSET = 372;
    uint256 internal constant TWO53 = 1 << 53;

    /// @notice Raw accumulation of packed terms: e in [sum, sum + inexact] * 2^lsbExp,
    ///         S in [absSum, absSum + inexact] * 2^lsbExp.
    struct Accumulation {
        int256 sum;
        uint256 absSum;
        uint256 inexact;
        int256 lsbExp;
    }

    /// @notice The packed exact product `a * b` of two finite FP32 values; reverts on NaN/inf.
    function product(uint32 a, uint32 b) internal pure returns (uint256 term) {
        uint256 ea = (a >> 23) & 0xFF;
        uint256 eb = (b >> 23) & 0xFF;
        if (ea == 0xFF) revert Float32.NonFinite(a);
        if (eb == 0xFF) revert Float32.NonFinite(b);
        uint256 ma = a & 0x7FFFFF;
        uint256 mb = b & 0x7FFFFF;
        if (ea == 0) ea = 1;
        else ma |= 0x800000;
        if (eb == 0) eb = 1;
        else mb |= 0x800000;
        unchecked {
            uint256 m = ma * mb;
            if (m == 0) return 0;
            term = m | ((ea + eb) << 64) | (uint256((a ^ b) >> 31) << 255);
        }
    }

    /// @notice The packed term of one FP32 value (its product with 1.0).
    function value(uint32 a) internal pure returns (uint256) {
        return product(a, Float32.ONE);
    }

    /// @notice The packed term with its sign flipped.
    function negated(uint256 term) internal pure returns (uint256) {
        return term == 0 ? 0 : term ^ (1 << 255);
    }

    /// @notice Accumulates packed terms (two passes: the scale, then the sum).
    function accumulate(uint256[] memory terms) internal pure returns (Accumulation memory acc) {
        uint256 n = terms.length;
        if (n > MAX_TERMS) revert TooManyTerms(n, MAX_TERMS);
        uint256 top;
        unchecked {
            for (uint256 i = 0; i < n; ++i) {
                uint256 t = terms[i];
                uint256 est = (t >> 64) & 0xFFFF;
                // A zero term packs to 0 (est 0), so it never raises the scale.
                if (est > top) top = est;
            }
            if (top == 0) return acc;
            int256 sum;
            uint256 absSum;
            uint256 inexact;
            for (uint256 i = 0; i < n; ++i) {
                uint256 t = terms[i];
                uint256 m = t & M_MASK;
                if (m == 0) continue;
                uint256 est = (t >> 64) & 0xFFFF;
                uint256 q;
                uint256 lost;
                if (est + GUARD >= top) {
                    q = m << (est + GUARD - top);
                } else {
                    uint256 sh = top - est - GUARD;
                    if (sh < 64) {
                        q = m >> sh;
                        lost = (q << sh) != m ? 1 : 0;
                    } else {
                        lost = 1;
                    }
                }
                // SAFETY: q < 2^120 and n <= 2^16, so neither sum can overflow.
                absSum += q;
                inexact += lost;
                sum = t >> 255 == 0 ? sum + int256(q) : sum - int256(q + lost);
            }
            acc = Accumulation(sum, absSum, inexact, int256(top) - LSB_OFFSET);
        }
    }

    /// @notice Enclosure of a sum of `n` terms with `dc = g(n) * S = n * S / (2^53 - n)`
    ///         (MATMUL with `n = K (+1 with bias)`, SUM).
    function sumEnclosure(Accumulation memory acc, uint256 n)
        internal
        pure
        returns (RoundingRule.Enclosure memory x)
    {
        if (n > MAX_TERMS) revert TooManyTerms(n, MAX_TERMS);
        int256 den = int256(TWO53 - n);
        x.lo = acc.sum * den;
        x.hi = (acc.sum + int256(acc.inexact)) * den;
        x.dc = n * (acc.absSum + acc.inexact);
        x.exp = acc.lsbExp;
        x.den = uint256(den);
    }

    /// @notice Enclosure of the mean `sum / n` with `dc = (g(n) + 2u) * S / n`
    ///         `= S * (n*2^53 + 2*(2^53 - n)) / (n * 2^53 * (2^53 - n))`.
    function meanEnclosure(Accumulation memory acc, uint256 n)
        internal
        pure
        returns (RoundingRule.Enclosure memory x)
    {
        if (n > MAX_TERMS || n == 0) revert TooManyTerms(n, MAX_TERMS);
        int256 f = int256(TWO53 * (TWO53 - n));
        x.lo = acc.sum * f;
        x.hi = (acc.sum + int256(acc.inexact)) * f;
        x.dc = (acc.absSum + acc.inexact) * (n * TWO53 + 2 * (TWO53 - n));
        x.exp = acc.lsbExp - 53;
        x.den = n * (TWO53 - n);
    }

    /// @notice Enclosure of an exactly rounded op's sum (`dc = 0`: ADD, SUB and the scalar forms).
    /// @dev Exact unless one value is below 2^-72 of the other; then `e` and the whole enclosure lie
    ///      within 2^-71 (relative) of the larger value, an FP32 value whose nearest midpoint is over
    ///      2^-26 (relative) away, so every decision of the rule is the exact one.
    function exactEnclosure(Accumulation memory acc) internal pure returns (RoundingRule.Enclosure memory x) {
        x.lo = acc.sum;
        x.hi = acc.sum + int256(acc.inexact);
        x.exp = acc.lsbExp;
        x.den = 1;
    }
}
