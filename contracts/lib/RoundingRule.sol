// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Float32} from "contracts/lib/Float32.sol";

/// @title RoundingRule
/// @notice The contract's rule for one output element (docs/numerics.md, "The contract's rule"):
///         given an enclosure `[lo, hi]` of the exact value `e`, the certified bound `dc` and the
///         committed log entry, decide whether the claimed FP32 value stands.
/// @dev Every quantity of an `Enclosure` is an integer in one unit `q = 2^exp / den`, so all checks
///      are exact integer comparisons: `e` lies in `[lo*q, hi*q]`, `dc = dcNum*q`.
///      - every code: RN32(lo) <= claimed <= RN32(hi) in the FP32 order, i.e. the claim is RN32(e)
///                  (RN32 is monotone; the enclosures are exact or ~2^-110 relative, so this leaves
///                  no choice unless e is that close to a midpoint). The trainer's log only tells an
///                  auditor which value that is; it never widens what stands.
///      - none:     claimed == RN32(lo) == RN32(hi).
///      - down/up:  m = midpoint of claimed and its upper (down) / lower (up) neighbour, s the pair's
///                  spacing; require `lo - 4dc <= m <= hi + 4dc` (some point of the enclosure is
///                  within 4dc of m) and `16dc <= s`, so a log inconsistent with the claim loses.
///      - explicit: claimed == the entry's value.
///      Ops with `dc = 0` (single IEEE ops, copies) use the same rule: a down/up entry then only
///      passes at an exact midpoint.
///      A claim that is NaN, an infinity or -0 never stands (zero is canonically +0).
library RoundingRule {
    uint8 internal constant NONE = 0;
    uint8 internal constant DOWN = 1;
    uint8 internal constant UP = 2;
    uint8 internal constant EXPLICIT = 3;

    /// @notice An enclosure of an exact value and its bound, in the unit `q = 2^exp / den`.
    /// @param lo Lower end of the enclosure of `e`, in units of q.
    /// @param hi Upper end (`hi >= lo`; `hi == lo` when `e` is exact).
    /// @param dc The certified bound `dc`, in units of q (0 for exact ops).
    /// @param exp Binary exponent of the unit.
    /// @param den Positive denominator of the unit.
    struct Enclosure {
        int256 lo;
        int256 hi;
        uint256 dc;
        int256 exp;
        uint256 den;
    }

    /// @notice The exact enclosure of an FP32 value (a copied element), with `dc = 0`.
    function exactly(uint32 bits) internal pure returns (Enclosure memory x) {
        Float32.requireFinite(bits);
        (int256 v, int256 exp) = Float32.signedOf(bits);
        x = Enclosure(v, v, 0, exp, 1);
    }

    /// @notice RN32 of `v * 2^exp / den` (saturating at +-inf).
    function roundAt(int256 v, int256 exp, uint256 den) internal pure returns (uint32) {
        return v < 0 ? Float32.round(true, uint256(-v), exp, den) : Float32.round(false, uint256(v), exp, den);
    }

    /// @notice True when `claimed` stands under the rule for enclosure `x`, log `code` and entry `value`.
    /// @param code The log code (0 none, 1 down, 2 up, 3 explicit); any other code never stands.
    /// @param value The entry's FP32 bits (explicit entries; ignored otherwise).
    function judge(Enclosure memory x, uint32 claimed, uint8 code, uint32 value) internal pure returns (bool) {
        (uint32 rLo, uint32 rHi) = ends(x);
        return judgeEnds(x, rLo, rHi, claimed, code, value);
    }

    /// @notice `RN32(lo)` and `RN32(hi)`: the values the enclosure leaves standing (one when they agree).
    function ends(Enclosure memory x) internal pure returns (uint32 rLo, uint32 rHi) {
        rLo = roundAt(x.lo, x.exp, x.den);
        rHi = x.hi == x.lo ? rLo : roundAt(x.hi, x.exp, x.den);
    }

    /// @notice `judge` with the ends given: `rLo == rHi == RN32(e)` where a second, exact pass
    ///         decided what the enclosure did not (ExactSum.roundExact), else `ends(x)`.
    function judgeEnds(Enclosure memory x, uint32 rLo, uint32 rHi, uint32 claimed, uint8 code, uint32 value)
        internal
        pure
        returns (bool)
    {
        // INVARIANT: outputs are finite and zero is canonical, so these patterns are never right.
        if (!Float32.isFinite(claimed) || claimed == Float32.SIGN) return false;
        int256 c = Float32.toOrdered(claimed);
        // INVARIANT: the claim is RN32(e) for any e in [lo, hi]: no log entry buys another value.
        if (c < Float32.toOrdered(rLo) || c > Float32.toOrdered(rHi)) return false;
        if (code == NONE) return rLo == claimed && rHi == claimed;
        if (code == DOWN || code == UP) {
            // SAFETY: dc and the ends stay below 2^250 (ExactSum bounds), so 4dc and 16dc cannot overflow.
            int256 w = 4 * int256(x.dc);
            (int256 mNum, int256 mExp, uint256 sNum, int256 sExp) = Float32.midpoint(claimed, code == DOWN);
            // 16dc <= s: the logged midpoint is the only one within reach of an honest replay.
            if (Float32.compare(4 * w, x.exp, x.den, int256(sNum), sExp) > 0) return false;
            // lo - 4dc <= m <= hi + 4dc: the midpoint is within 4dc of the exact value.
            if (Float32.compare(x.lo - w, x.exp, x.den, mNum, mExp) > 0) return false;
            return Float32.compare(x.hi + w, x.exp, x.den, mNum, mExp) >= 0;
        }
        // INVARIANT: an explicit entry stores the claimed value itself.
        if (code == EXPLICIT) return claimed == value;
        return false;
    }
}
