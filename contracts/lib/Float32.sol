// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Float32
/// @notice IEEE-754 binary32 bit patterns (and binary64 inputs) as exact dyadic values, with
///         round-to-nearest-even of any rational `num * 2^exp / den` to binary32.
/// @dev Value encoding used throughout: a finite pattern `b` is `(-1)^neg * mant * 2^exp` with
///      `mant < 2^24` and `exp = max(biasedExp, 1) - 150`. The +-infinity patterns decode by the
///      same formula to `+-2^128`, the virtual neighbours of `+-FLT_MAX` (the overflow threshold
///      `FLT_MAX + ulp/2` is their midpoint); NaN patterns are never decoded (callers check).
///      Zero is canonical: every rounding returns `0x00000000` for a zero result, never `-0`.
library Float32 {
    /// @notice Thrown when an FP32 value that must be finite is a NaN or an infinity.
    error NonFinite(uint32 bits);
    /// @notice Thrown when an FP64 value that must be finite is a NaN or an infinity.
    error NonFinite64(uint64 bits);
    /// @notice Thrown when a strict rounding overflows the FP32 range (|x| >= FLT_MAX + ulp/2).
    error Overflow(bool negative);
    /// @notice Thrown when a rational's denominator is too wide for the exact quotient (an internal bound).
    error DenominatorTooWide(uint256 bitLength);

    uint32 internal constant SIGN = 0x80000000;
    uint32 internal constant EXP_MASK = 0x7F800000;
    uint32 internal constant FRAC_MASK = 0x007FFFFF;
    uint32 internal constant POS_INF = 0x7F800000;
    uint32 internal constant NEG_INF = 0xFF800000;
    uint32 internal constant ONE = 0x3F800000;
    /// @dev Widest denominator `round` accepts: the shifted numerator must stay below 2^256.
    uint256 internal constant MAX_DEN_BITS = 224;

    /// @notice True unless `b` is a NaN or an infinity.
    function isFinite(uint32 b) internal pure returns (bool) {
        return b & EXP_MASK != EXP_MASK;
    }

    /// @notice Reverts with `NonFinite` when `b` is a NaN or an infinity.
    function requireFinite(uint32 b) internal pure {
        if (b & EXP_MASK == EXP_MASK) revert NonFinite(b);
    }

    /// @notice `b` as `(-1)^neg * mant * 2^exp` (see the library note; +-inf decode to +-2^128).
    function decode(uint32 b) internal pure returns (bool neg, uint256 mant, int256 exp) {
        neg = b & SIGN != 0;
        uint256 be = (b >> 23) & 0xFF;
        mant = b & FRAC_MASK;
        if (be == 0) {
            exp = -149;
        } else {
            mant |= 0x800000;
            exp = int256(be) - 150;
        }
    }

    /// @notice A finite binary64 pattern as `(-1)^neg * mant * 2^exp`; reverts on NaN/inf.
    function decode64(uint64 b) internal pure returns (bool neg, uint256 mant, int256 exp) {
        uint256 be = (b >> 52) & 0x7FF;
        if (be == 0x7FF) revert NonFinite64(b);
        neg = b >> 63 != 0;
        mant = b & 0xFFFFFFFFFFFFF;
        if (be == 0) {
            exp = -1074;
        } else {
            mant |= 1 << 52;
            exp = int256(be) - 1075;
        }
    }

    /// @notice RN32 of a finite binary64 value (the trainer's FP64 -> FP32 cast, -0 canonicalised).
    function fromFloat64(uint64 b) internal pure returns (uint32) {
        (bool neg, uint256 mant, int256 exp) = decode64(b);
        return roundStrict(neg, mant, exp, 1);
    }

    /// @notice Position in the total order of FP32 values: +-0 map to 0, adjacent values differ by 1.
    function toOrdered(uint32 b) internal pure returns (int256) {
        int256 m = int256(uint256(b & 0x7FFFFFFF));
        return b & SIGN != 0 ? -m : m;
    }

    /// @notice Inverse of `toOrdered` (0 maps to +0).
    function fromOrdered(int256 o) internal pure returns (uint32) {
        // SAFETY: callers stay within +-0x7F800000, so the casts are exact.
        return o < 0 ? uint32(uint256(-o)) | SIGN : uint32(uint256(o));
    }

    /// @notice The next FP32 value above (`up`) or below `b`; from +-FLT_MAX this is the +-inf pattern.
    function neighbour(uint32 b, bool up) internal pure returns (uint32) {
        return fromOrdered(toOrdered(b) + (up ? int256(1) : int256(-1)));
    }

    /// @notice The midpoint `m` between finite `c` and its upper (`above`) or lower neighbour, and
    ///         the spacing `s` of that pair: `m = mNum * 2^mExp`, `s = sNum * 2^sExp`.
    /// @dev Next to +-FLT_MAX the neighbour is the virtual +-2^128 (the overflow threshold is `m`).
    function midpoint(uint32 c, bool above)
        internal
        pure
        returns (int256 mNum, int256 mExp, uint256 sNum, int256 sExp)
    {
        uint32 n = neighbour(c, above);
        (int256 lo, int256 loExp) = signedOf(above ? c : n);
        (int256 hi, int256 hiExp) = signedOf(above ? n : c);
        // INVARIANT: adjacent FP32 values have exponents at most 1 apart, so the alignment is one bit.
        sExp = loExp < hiExp ? loExp : hiExp;
        lo <<= uint256(loExp - sExp);
        hi <<= uint256(hiExp - sExp);
        mNum = lo + hi;
        mExp = sExp - 1;
        sNum = uint256(hi - lo);
    }

    /// @notice `b` as a signed integer times a power of two.
    function signedOf(uint32 b) internal pure returns (int256 v, int256 exp) {
        (bool neg, uint256 mant, int256 e) = decode(b);
        v = neg ? -int256(mant) : int256(mant);
        exp = e;
    }

    /// @notice RN32 (round to nearest, ties to even) of `(-1)^neg * num * 2^exp / den`, with
    ///         subnormals; saturates to the +-inf pattern on overflow; a zero result is +0.
    /// @param den Positive denominator below 2^MAX_DEN_BITS.
    function round(bool neg, uint256 num, int256 exp, uint256 den) internal pure returns (uint32) {
        if (num == 0) return 0;
        uint256 db = bitLength(den);
        // INVARIANT: num << sh below has bitLength(den) + 27 bits, which must fit in a word.
        if (db > MAX_DEN_BITS || db == 0) revert DenominatorTooWide(db);
        // Quotient q = floor(num * 2^sh / den) with 27 or 28 bits; `sticky` records a non-zero rest.
        int256 sh = 27 - (int256(bitLength(num)) - int256(db));
        uint256 q;
        bool sticky;
        if (sh >= 0) {
            uint256 n2 = num << uint256(sh);
            q = n2 / den;
            sticky = n2 % den != 0;
        } else {
            uint256 d2 = den << uint256(-sh);
            q = num / d2;
            sticky = num % d2 != 0;
        }
        return _roundQuotient(neg, q, exp - sh, sticky);
    }

    /// @notice As `round`, but reverts with `Overflow` instead of returning an infinity.
    function roundStrict(bool neg, uint256 num, int256 exp, uint256 den) internal pure returns (uint32 r) {
        r = round(neg, num, exp, den);
        if (r & EXP_MASK == EXP_MASK) revert Overflow(neg);
    }

    /// @dev Rounds `(q + f) * 2^e`, `0 <= f < 1`, `f > 0` iff `sticky`, `2^26 <= q < 2^28`.
    function _roundQuotient(bool neg, uint256 q, int256 e, bool sticky) private pure returns (uint32) {
        uint256 top = bitLength(q) - 1;
        int256 lsbExp = int256(top) + e - 23;
        if (lsbExp < -149) lsbExp = -149; // subnormal range: fixed quantum 2^-149
        // INVARIANT: shift >= top - 23 >= 3, so the round and guard bits are inside q.
        uint256 shift = uint256(lsbExp - e);
        // Below half the quantum: rounds to (canonical) zero.
        if (shift > top + 1) return 0;
        uint256 mant = q >> shift;
        uint256 rest = q & ((1 << shift) - 1);
        uint256 half = 1 << (shift - 1);
        if (rest > half || (rest == half && (sticky || mant & 1 == 1))) ++mant;
        if (mant == 0) return 0;
        // The exponent field follows from the quantum; a mantissa carry to 2^24 (or 2^23 from the
        // subnormal range) moves into the exponent field by the addition itself.
        uint256 bits = (uint256(lsbExp + 149) << 23) + mant;
        if (bits >= POS_INF) return neg ? NEG_INF : POS_INF;
        // SAFETY: bits < 0x7F800000 here.
        return neg ? uint32(bits) | SIGN : uint32(bits);
    }

    /// @notice Sign of `a * 2^aExp / aDen - b * 2^bExp` as -1, 0 or 1 (exact).
    /// @param aDen Positive; `|b| * aDen` must fit in 256 bits.
    function compare(int256 a, int256 aExp, uint256 aDen, int256 b, int256 bExp) internal pure returns (int256) {
        int256 sa = a > 0 ? int256(1) : (a < 0 ? int256(-1) : int256(0));
        int256 sb = b > 0 ? int256(1) : (b < 0 ? int256(-1) : int256(0));
        if (sa != sb) return sa > sb ? int256(1) : int256(-1);
        if (sa == 0) return 0;
        uint256 ma = uint256(sa * a);
        uint256 mb = uint256(sb * b) * aDen;
        int256 c = compareMagnitude(ma, aExp, mb, bExp);
        return sa > 0 ? c : -c;
    }

    /// @notice Sign of `x * 2^xe - y * 2^ye` for positive `x`, `y`.
    function compareMagnitude(uint256 x, int256 xe, uint256 y, int256 ye) internal pure returns (int256) {
        int256 lx = int256(bitLength(x)) + xe;
        int256 ly = int256(bitLength(y)) + ye;
        if (lx != ly) return lx < ly ? int256(-1) : int256(1);
        // INVARIANT: equal top-bit positions, so the left shift below stays within 256 bits.
        if (xe >= ye) x <<= uint256(xe - ye);
        else y <<= uint256(ye - xe);
        return x < y ? int256(-1) : (x > y ? int256(1) : int256(0));
    }

    /// @notice floor(sqrt(a)) (Newton's method from a power-of-two estimate, as OpenZeppelin's Math.sqrt).
    function isqrt(uint256 a) internal pure returns (uint256 r) {
        if (a == 0) return 0;
        r = 1 << ((bitLength(a) - 1) >> 1);
        // The estimate is within a factor 2 of the root; each step doubles the correct bits (7 > log2 256).
        unchecked {
            r = (r + a / r) >> 1;
            r = (r + a / r) >> 1;
            r = (r + a / r) >> 1;
            r = (r + a / r) >> 1;
            r = (r + a / r) >> 1;
            r = (r + a / r) >> 1;
            r = (r + a / r) >> 1;
        }
        uint256 q = a / r;
        return r < q ? r : q;
    }

    /// @notice Number of significant bits of `x` (0 for 0).
    function bitLength(uint256 x) internal pure returns (uint256 r) {
        // Branch-free binary search on the stack (no memory access); a shift loop takes up to 256 rounds.
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            r := shl(7, lt(0xffffffffffffffffffffffffffffffff, x))
            r := or(r, shl(6, lt(0xffffffffffffffff, shr(r, x))))
            r := or(r, shl(5, lt(0xffffffff, shr(r, x))))
            r := or(r, shl(4, lt(0xffff, shr(r, x))))
            r := or(r, shl(3, lt(0xff, shr(r, x))))
            r := or(r, shl(2, lt(0xf, shr(r, x))))
            r := or(r, shl(1, lt(0x3, shr(r, x))))
            r := or(r, lt(0x1, shr(r, x)))
            r := add(r, iszero(iszero(x)))
        }
    }
}
