// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Float32} from "contracts/lib/Float32.sol";
import {RoundingRule} from "contracts/lib/RoundingRule.sol";

/// @title ExactSum
/// @notice Tight enclosures of sums of FP32 products (dot products, sums, means) in one int256
///         fixed-point accumulator, the certified bounds `dc` of docs/numerics.md, and where an
///         enclosure holds an FP32 midpoint, `RN32(e)` exactly from a second pass (`tailAt`: the
///         floored bits in three more int256 limbs; `roundOf`).
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
    /// @dev Bits per limb of the exact tail (tailAt): `2^16` values below `2^238` fit in an int256.
    uint256 internal constant TAIL_BITS = 191;
    /// @dev Limbs of the exact tail: limb 0 at the quantum, three below it.
    uint256 internal constant TAIL_LIMBS = 4;
    /// @dev Bits kept when the exact value is rounded (roundOf): at least 26 + 16 + 2 are needed.
    uint256 internal constant EXACT_BITS = 140;

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

    /// @notice Fills `terms[0 .. count)` with the packed products `a[aOff + t] * b[bOff + t]` of
    ///         FP32 little-endian elements (`b` empty: `a[aOff + t] * 1.0`, the values themselves);
    ///         reverts `Float32.NonFinite` on a NaN/inf element.
    /// @dev The hot loop of MATMUL/SUM/MEAN, in assembly: the same packing as `product`.
    function fill(bytes memory a, uint256 aOff, bytes memory b, uint256 bOff, uint256[] memory terms, uint256 count)
        internal
        pure
    {
        bool ones = b.length == 0;
        // SAFETY: the loop reads without bounds checks, so the ranges are checked once here.
        if ((aOff + count) * 4 > a.length || (!ones && (bOff + count) * 4 > b.length) || count > terms.length) {
            revert TooManyTerms(count, terms.length);
        }
        bytes4 nonFinite = Float32.NonFinite.selector;
        // The per-term inner loop of every dot product: unchecked packed reads, ranges checked above.
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            let pa := add(add(a, 32), shl(2, aOff))
            let pb := add(add(b, 32), shl(2, bOff))
            let out := add(terms, 32)
            for { let i := 0 } lt(i, count) { i := add(i, 1) } {
                let x := shr(224, mload(add(pa, shl(2, i))))
                x := or(or(shl(24, and(x, 0xff)), shl(8, and(x, 0xff00))), or(and(shr(8, x), 0xff00), shr(24, x)))
                let y := 0x3f800000
                if iszero(ones) {
                    y := shr(224, mload(add(pb, shl(2, i))))
                    y := or(or(shl(24, and(y, 0xff)), shl(8, and(y, 0xff00))), or(and(shr(8, y), 0xff00), shr(24, y)))
                }
                let ea := and(shr(23, x), 0xff)
                let eb := and(shr(23, y), 0xff)
                if or(eq(ea, 0xff), eq(eb, 0xff)) {
                    mstore(0, nonFinite)
                    mstore(4, x)
                    if iszero(eq(ea, 0xff)) { mstore(4, y) }
                    revert(0, 36)
                }
                // Implicit bit for normals; subnormals count as biased exponent 1.
                let ma := or(and(x, 0x7fffff), shl(23, iszero(iszero(ea))))
                let mb := or(and(y, 0x7fffff), shl(23, iszero(iszero(eb))))
                let m := mul(ma, mb)
                let t := 0
                if m {
                    let est := add(add(ea, iszero(ea)), add(eb, iszero(eb)))
                    t := or(or(m, shl(64, est)), shl(255, shr(31, xor(x, y))))
                }
                mstore(add(out, shl(5, i)), t)
            }
        }
    }

    /// @notice Accumulates packed terms (two passes: the scale, then the sum).
    function accumulate(uint256[] memory terms) internal pure returns (Accumulation memory acc) {
        uint256 n = terms.length;
        if (n > MAX_TERMS) revert TooManyTerms(n, MAX_TERMS);
        uint256 top = maxEst(terms);
        if (top == 0) return acc;
        (int256 sum, uint256 absSum, uint256 inexact) = sumAt(terms, top);
        acc = Accumulation(sum, absSum, inexact, int256(top) - LSB_OFFSET);
    }

    /// @notice The scale `E`: the largest `est` of the packed terms (0 when every term is zero).
    function maxEst(uint256[] memory terms) internal pure returns (uint256 top) {
        // Read-only pass over the packed terms without per-element bounds checks (bounded by their length).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            let n := mload(terms)
            let p := add(terms, 32)
            for { let i := 0 } lt(i, n) { i := add(i, 1) } {
                // A zero term packs to 0 (est 0), so it never raises the scale.
                let est := and(shr(64, mload(add(p, shl(5, i)))), 0xffff)
                if gt(est, top) { top := est }
            }
        }
    }

    /// @notice The sums of the packed terms in quanta `2^(top - LSB_OFFSET)`: `sum` of the floored
    ///         terms, `absSum` of their magnitudes and the count `inexact` of floored terms.
    /// @dev Callers guarantee `est <= top` for every term and at most MAX_TERMS terms (accumulate:
    ///      `top = maxEst`; ChunkedSum.partialAt: the chunk's own maxEst is at most `top`).
    function sumAt(uint256[] memory terms, uint256 top)
        internal
        pure
        returns (int256 sum, uint256 absSum, uint256 inexact)
    {
        // SAFETY: q < 2^120 per term and n <= 2^16, so the sums stay below 2^137 (no wrap-around).
        // Unchecked arithmetic is deliberate (bound above); the loop reads only terms[0..n).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            let n := mload(terms)
            let p := add(terms, 32)
            let mask := sub(shl(64, 1), 1)
            for { let i := 0 } lt(i, n) { i := add(i, 1) } {
                let t := mload(add(p, shl(5, i)))
                let m := and(t, mask)
                if m {
                    // Quanta of the term: m * 2^(est + GUARD - top); floored when that is negative.
                    let d := add(and(shr(64, t), 0xffff), GUARD)
                    let q := 0
                    let lost := 0
                    switch lt(d, top)
                    case 0 { q := shl(sub(d, top), m) }
                    default {
                        let sh := sub(top, d)
                        q := shr(sh, m)
                        lost := iszero(eq(shl(sh, q), m))
                    }
                    absSum := add(absSum, q)
                    inexact := add(inexact, lost)
                    switch shr(255, t)
                    case 0 { sum := add(sum, q) }
                    default { sum := sub(sum, add(q, lost)) }
                }
            }
        }
    }

    /// @notice The exact rest `e - sum * 2^L` of the accumulation at scale `top` (`L = top - 372`):
    ///         the bits the first pass floored away, in `TAIL_LIMBS` signed limbs, limb 0 in quanta
    ///         `2^L` and limb `j >= 1` in quanta `2^(L - TAIL_BITS * j)`. All zero when no term was floored.
    /// @dev The second pass of a ruling the first pass does not decide. A floored term
    ///      `t = (-1)^s * (q * 2^sh + low) * 2^(est - 300)` (`sh = top - 72 - est > 0`, `0 < low < 2^sh`)
    ///      was counted as `q` (s = 0) or `-(q + 1)` (s = 1) quanta; its rest is `+low` or
    ///      `2^L - low` at `2^(est - 300)`: `low` goes to limb `j = ceil(sh / TAIL_BITS)` shifted left
    ///      by `TAIL_BITS * j - sh` (0 .. 190), so below `2^238`; a negative term adds 1 to limb 0.
    ///      `sh <= 508 - 72 - 2 = 434`, so `j <= 3`. Same callers' guarantees as `sumAt`.
    function tailAt(uint256[] memory terms, uint256 top) internal pure returns (int256[4] memory tail) {
        int256 l0;
        int256 l1;
        int256 l2;
        int256 l3;
        // SAFETY: every limb-j value is below 2^238 and n <= 2^16, so no limb wraps (|l_j| < 2^254);
        // the loop reads only terms[0..n) (as sumAt).
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            let n := mload(terms)
            let p := add(terms, 32)
            let mask := sub(shl(64, 1), 1)
            for { let i := 0 } lt(i, n) { i := add(i, 1) } {
                let t := mload(add(p, shl(5, i)))
                let m := and(t, mask)
                let d := add(and(shr(64, t), 0xffff), GUARD)
                if and(iszero(iszero(m)), lt(d, top)) {
                    let sh := sub(top, d)
                    // shl(sh, 1) is 0 for sh >= 256, so the mask is then all ones (low = m).
                    let low := and(m, sub(shl(sh, 1), 1))
                    if low {
                        let j := div(add(sh, sub(TAIL_BITS, 1)), TAIL_BITS)
                        let v := shl(sub(mul(TAIL_BITS, j), sh), low)
                        let neg := shr(255, t)
                        if neg {
                            l0 := add(l0, 1)
                            v := sub(0, v)
                        }
                        switch j
                        case 1 { l1 := add(l1, v) }
                        case 2 { l2 := add(l2, v) }
                        default { l3 := add(l3, v) }
                    }
                }
            }
        }
        tail = [l0, l1, l2, l3];
    }

    /// @notice RN32 of the exact `e / den` of terms whose first pass left a midpoint in `[lo, hi]`:
    ///         both passes at the terms' own scale (`den` 1 for MATMUL/SUM, `n` for MEAN).
    function roundExact(uint256[] memory terms, uint256 den) internal pure returns (uint32) {
        return roundAccumulated(accumulate(terms), terms, den);
    }

    /// @notice `roundExact` given the first pass `acc = accumulate(terms)`: only the tail's pass.
    function roundAccumulated(Accumulation memory acc, uint256[] memory terms, uint256 den)
        internal
        pure
        returns (uint32)
    {
        // The widest term alone is at least 2^72 quanta, so absSum is 0 only when every term is zero.
        if (acc.absSum == 0) return 0;
        return roundOf(acc.sum, tailAt(terms, uint256(acc.lsbExp + LSB_OFFSET)), acc.lsbExp, den);
    }

    /// @notice RN32 (ties to even, +0 for zero) of the exact `(sum * 2^lsbExp + tail) / den`, `tail`
    ///         the limbs of `tailAt` (or their sums over chunks), `den <= MAX_TERMS`.
    /// @dev The value `V = (sum + l0) * B^3 + l1 * B^2 + l2 * B + l3` in units `2^(lsbExp - 573)`,
    ///      `B = 2^TAIL_BITS`, is carried into limbs `l1..l3` in `[0, B)` (its sign is then limb 0's),
    ///      its magnitude rounded to odd at `EXACT_BITS` bits: `T = floor(|V| / 2^k)`, point
    ///      `2T + (rest != 0)` in units `2^(k - 1)`. That point rounds as `|V| / den` does: when
    ///      `k > 0`, `T >= 2^139`, so every FP32 midpoint near `|V| / den` (an odd multiple of half an
    ///      ulp, at most 2^-25 of it) times `den <= 2^16` is a multiple of `2^k` and none lies strictly
    ///      between the point and `|V|`, which share one open cell `(T, T + 1) * 2^k` or are equal.
    function roundOf(int256 sum, int256[4] memory tail, int256 lsbExp, uint256 den) internal pure returns (uint32) {
        // SAFETY: |sum| < 2^138 and |l_j| < 2^254 (tailAt, ChunkedSum.check), so no carry overflows.
        int256[4] memory v = [sum + tail[0], tail[1], tail[2], tail[3]];
        _carry(v);
        bool neg = v[0] < 0;
        if (neg) {
            for (uint256 i = 0; i < 4; ++i) {
                v[i] = -v[i];
            }
            _carry(v);
        }
        // INVARIANT: v[0] >= 0 and v[1..3] in [0, B): |V| = sum v[i] * B^(3 - i).
        uint256 bl;
        for (uint256 i = 0; i < 4 && bl == 0; ++i) {
            if (v[i] != 0) bl = Float32.bitLength(uint256(v[i])) + TAIL_BITS * (3 - i);
        }
        if (bl == 0) return 0;
        uint256 k = bl > EXACT_BITS ? bl - EXACT_BITS : 0;
        uint256 top;
        bool sticky;
        for (uint256 i = 0; i < 4; ++i) {
            uint256 x = uint256(v[i]);
            uint256 pos = TAIL_BITS * (3 - i);
            if (pos >= k) {
                top += x << (pos - k); // below 2^EXACT_BITS in all
            } else {
                uint256 kept = x >> (k - pos);
                top += kept;
                if (kept << (k - pos) != x) sticky = true;
            }
        }
        uint256 point = 2 * top + (sticky ? 1 : 0);
        return Float32.round(neg, point, lsbExp - int256(3 * TAIL_BITS) + int256(k) - 1, den);
    }

    /// @dev Carries limbs 3..1 into `[0, B)` (floor division by B), the rest into limb 0.
    function _carry(int256[4] memory v) private pure {
        for (uint256 i = 3; i > 0; --i) {
            int256 c = v[i] >> TAIL_BITS; // arithmetic shift: floor
            v[i] -= c << TAIL_BITS;
            v[i - 1] += c;
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
