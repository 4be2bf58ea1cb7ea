// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Float32} from "contracts/lib/Float32.sol";
import {OpKinds} from "contracts/lib/OpKinds.sol";
import {RoundingRule} from "contracts/lib/RoundingRule.sol";

/// @title Transcendental
/// @notice Rigorous enclosures of exp, log, tanh and erf of one FP32 value, in integer arithmetic
///         (docs/numerics.md, "Transcendental ops on-chain"; mirrored bit for bit by
///         `vtrain/numerics/transcendental.py`). Deployed by the Adjudicator's constructor and called with a
///         staticcall, so the Adjudicator's runtime code stays small.
/// @dev Fixed point: `X` stands for `X * 2^-F`, F = 120. Every rounding is directed and every
///      truncated series carries a bound of its tail, so the exact value lies in `[lo, hi]`; the
///      three functions are increasing, so bounds at bounds of `x` are bounds of `f(x)`.
///      - exp: |x| = n ln2 + r, 0 <= r < ln2 + 2^-110, Taylor series of exp(r) (34 positive terms);
///        exp(-|x|) = 1 / exp(|x|). x >= 89: no finite FP32 value; x <= -110: [0, 2^-158].
///      - log: x = M 2^k, M in [2^-1/2, 2^1/2), log M = 2 t A(t^2), t = (M - 1)/(M + 1) exact,
///        A(s) = sum s^j / (2j + 1) (24 terms); t's denominator is the unit's denominator.
///        x <= 0: no finite value.
///      - tanh: odd; |x| < 1/2: x g / (1 + x g), g = expm1(2x) / 2x = sum (2x)^k / (k + 1)!;
///        1/2 <= |x| < 40: 1 - 2 / (exp(2|x|) + 1); |x| >= 40: [1 - 2^-110, 1].
///      - erf: odd; |x| < 6: (2/sqrt(pi)) x exp(-x^2) S(2x^2), S(z) = sum z^n / (1*3*...*(2n+1)) (positive
///        terms, units 2^-96, stopped once the term ratio is <= 1/2 and the term <= 2^-88 of the sum; the
///        tail is then at most the last term); |x| >= 6: [1 - 2^-55, 1] (erfc 6 < 2^-55.3).
///      The bound is dc = floor(L (2^40 - 1) / 2^91) = 4u (1 - 2^-40) L, L the lower bound of |e|
///      (erf: / 2^90, 8u (1 - 2^-40) L, as the trainer's allowance for erf is 8u|v|).
contract Transcendental {
    /// @notice Thrown for op kinds other than EXP, LOG, TANH and ERF.
    error NotTranscendental(uint8 kind);

    uint256 private constant F = 120;
    uint256 private constant ONE_F = 1 << 120;
    /// @dev floor(ln2 * 2^120); ln2 lies strictly inside (LN2_F, LN2_F + 1) * 2^-120.
    uint256 private constant LN2_F = 921350637599661305226344307672478454;
    uint256 private constant SERIES_TERMS = 34;
    uint256 private constant ATANH_TERMS = 24;
    uint256 private constant EXP_HIGH = 89;
    uint256 private constant EXP_LOW = 110;
    uint256 private constant TANH_SAT = 40;
    uint256 private constant TANH_SAT_BITS = 110;
    uint256 private constant DC_MUL = (1 << 40) - 1;
    uint256 private constant DC_SHIFT = 91;
    uint256 private constant DC_SHIFT_ERF = 90;
    /// @dev floor(2/sqrt(pi) * 2^120); 2/sqrt(pi) lies strictly inside (C, C + 1) * 2^-120.
    uint256 private constant TWO_OVER_SQRT_PI_F = 1499873178763820871004525654118497670;
    uint256 private constant ERF_SAT = 6;
    uint256 private constant ERF_SAT_BITS = 55;
    uint256 private constant ERF_G = 96;
    uint256 private constant ERF_TERMS = 160;
    uint256 private constant ERF_STOP_BITS = 88;
    uint256 private constant ERF_NORM_BITS = 128;

    /// @notice The enclosure of `kind(x)` (EXP, LOG, TANH or ERF) for the finite FP32 `bits`;
    ///         `defined` is false where the value has no finite FP32 value (exp >= 89, log <= 0).
    function enclose(uint8 kind, uint32 bits) external pure returns (RoundingRule.Enclosure memory x, bool defined) {
        Float32.requireFinite(bits);
        (bool neg, uint256 m, int256 ex) = Float32.decode(bits);
        if (kind == OpKinds.EXP) return _exp(neg, m, ex);
        if (kind == OpKinds.LOG) return _log(neg, m, ex);
        if (kind == OpKinds.TANH) return (_tanh(neg, m, ex), true);
        if (kind == OpKinds.ERF) return (_erf(neg, m, ex), true);
        revert NotTranscendental(kind);
    }

    function _exp(bool neg, uint256 m, int256 ex) private pure returns (RoundingRule.Enclosure memory x, bool) {
        if (!neg && _atLeast(m, ex, EXP_HIGH)) return (x, false);
        if (neg && _atLeast(m, ex, EXP_LOW)) return (RoundingRule.Enclosure(0, 1, 0, -158, 1), true);
        (uint256 ylo, uint256 yhi) = _fixed(m, ex);
        (uint256 n, uint256 lo, uint256 hi) = _expPos(ylo, yhi);
        int256 e = int256(n) - int256(F);
        if (neg) {
            (lo, hi) = ((1 << (2 * F)) / hi, _cdiv(1 << (2 * F), lo));
            e = -int256(n) - int256(F);
        }
        // SAFETY: lo, hi < 2^122 here, so the int256 casts are exact.
        return (RoundingRule.Enclosure(int256(lo), int256(hi), _dc(lo), e, 1), true);
    }

    function _log(bool neg, uint256 m, int256 ex) private pure returns (RoundingRule.Enclosure memory x, bool) {
        if (neg || m == 0) return (x, false);
        uint256 sh = 24 - Float32.bitLength(m);
        m <<= sh;
        ex -= int256(sh);
        uint256 p = m * m >= 1 << 47 ? 24 : 23; // M = m / 2^p in [2^-1/2, 2^1/2)
        int256 k = ex + int256(p);
        int256 tn = int256(m) - int256(1 << p);
        uint256 td = m + (1 << p);
        if (tn == 0 && k == 0) return (RoundingRule.Enclosure(0, 0, 0, 0, 1), true);
        (uint256 alo, uint256 ahi) = _atanhSeries(uint256(tn * tn), td);
        // k ln2 td + 2 tn A, in units 2^-F / td (|k| <= 150, so every term stays below 2^160).
        int256 kl = k * int256(LN2_F);
        (int256 klo, int256 khi) = k >= 0 ? (kl, kl + k) : (kl + k, kl);
        (int256 tlo, int256 thi) =
            tn >= 0 ? (2 * tn * int256(alo), 2 * tn * int256(ahi)) : (2 * tn * int256(ahi), 2 * tn * int256(alo));
        int256 lo = klo * int256(td) + tlo;
        int256 hi = khi * int256(td) + thi;
        uint256 low = lo > 0 ? uint256(lo) : (hi < 0 ? uint256(-hi) : 0);
        return (RoundingRule.Enclosure(lo, hi, _dc(low), -int256(F), td), true);
    }

    /// @dev A(s) = sum_j s^j / (2j + 1) for s = t2 / td^2 (< 0.03), rounded down and up (with the
    ///      tail bound sum_{j >= J} s^j / (2j + 1) <= s^J).
    function _atanhSeries(uint256 t2, uint256 td) private pure returns (uint256 alo, uint256 ahi) {
        uint256 num = t2 << F;
        uint256 den = td * td;
        uint256 slo = num / den;
        uint256 shi = _cdiv(num, den);
        alo = ONE_F;
        ahi = ONE_F;
        uint256 plo = ONE_F;
        uint256 phi = ONE_F;
        for (uint256 j = 1; j < ATANH_TERMS; ++j) {
            plo = (plo * slo) >> F;
            phi = _cdiv(phi * shi, ONE_F);
            alo += plo / (2 * j + 1);
            ahi += _cdiv(phi, 2 * j + 1);
        }
        ahi += _cdiv(phi * shi, ONE_F);
    }

    function _tanh(bool neg, uint256 m, int256 ex) private pure returns (RoundingRule.Enclosure memory x) {
        if (m == 0) return RoundingRule.Enclosure(0, 0, 0, 0, 1);
        uint256 lo;
        uint256 hi;
        int256 e;
        if (int256(Float32.bitLength(m)) + ex <= -1) {
            // |x| < 1/2: tanh x = x g / (1 + x g), g = expm1(2x) / 2x.
            (uint256 ylo, uint256 yhi) = _fixed(m, ex + 1);
            uint256 glo = _series(ylo, false, 1);
            uint256 ghi = _series(yhi, true, 1);
            uint256 sh = uint256(-ex); // ex <= -2 here
            uint256 xgUp = _cdiv(m * glo, 1 << sh);
            uint256 xgDn = (m * ghi) >> sh;
            lo = m * ((glo * ONE_F) / (ONE_F + xgUp));
            hi = m * _cdiv(ghi * ONE_F, ONE_F + xgDn);
            e = ex - int256(F);
        } else if (!_atLeast(m, ex, TANH_SAT)) {
            // 1/2 <= |x| < 40: 1 - 2 / (exp(2|x|) + 1); 2|x| is exact in fixed point.
            (uint256 y,) = _fixed(m, ex + 1);
            (uint256 n, uint256 elo, uint256 ehi) = _expPos(y, y);
            uint256 two = 1 << (2 * F + 1);
            lo = ONE_F - _cdiv(two, (elo << n) + ONE_F);
            hi = ONE_F - two / ((ehi << n) + ONE_F);
            e = -int256(F);
        } else {
            (lo, hi, e) = ((1 << TANH_SAT_BITS) - 1, 1 << TANH_SAT_BITS, -int256(TANH_SAT_BITS));
        }
        // SAFETY: lo, hi < 2^145, so the int256 casts are exact.
        x = neg
            ? RoundingRule.Enclosure(-int256(hi), -int256(lo), _dc(lo), e, 1)
            : RoundingRule.Enclosure(int256(lo), int256(hi), _dc(lo), e, 1);
    }

    function _erf(bool neg, uint256 m, int256 ex) private pure returns (RoundingRule.Enclosure memory x) {
        if (m == 0) return RoundingRule.Enclosure(0, 0, 0, 0, 1);
        uint256 lo;
        uint256 hi;
        int256 e;
        if (_atLeast(m, ex, ERF_SAT)) {
            (lo, hi, e) = ((1 << ERF_SAT_BITS) - 1, 1 << ERF_SAT_BITS, -int256(ERF_SAT_BITS));
        } else {
            // (2/sqrt(pi)) exp(-x^2) in [qlo, qhi] * 2^(-n - F), from exp(x^2) in [elo, ehi] * 2^(n - F).
            (uint256 ylo, uint256 yhi) = _fixed(m * m, 2 * ex);
            (uint256 n, uint256 elo, uint256 ehi) = _expPos(ylo, yhi);
            uint256 qlo = (TWO_OVER_SQRT_PI_F * ((1 << (2 * F)) / ehi)) >> F;
            uint256 qhi = _cdiv((TWO_OVER_SQRT_PI_F + 1) * _cdiv(1 << (2 * F), elo), ONE_F);
            (uint256 slo, uint256 shi) = _erfSeries(m * m, 2 * ex + int256(ERF_G) + 1);
            uint256 k1;
            (slo, shi, k1) = _normalize(slo, shi);
            uint256 k2;
            (lo, hi, k2) = _normalize(qlo * slo, qhi * shi);
            lo *= m;
            hi *= m;
            e = ex - int256(n) - int256(F) - int256(ERF_G) + int256(k1 + k2);
        }
        // SAFETY: lo, hi < 2^152, so the int256 casts are exact.
        x = neg
            ? RoundingRule.Enclosure(-int256(hi), -int256(lo), _dcErf(lo), e, 1)
            : RoundingRule.Enclosure(int256(lo), int256(hi), _dcErf(lo), e, 1);
    }

    /// @dev S(z) = sum_n z^n / (1*3*...*(2n+1)) for z = zm * 2^s (< 72) in units 2^-G, rounded down and up;
    ///      once the next term's ratio z / (2n+3) is at most 1/2 the terms after term n sum to at most term n.
    function _erfSeries(uint256 zm, int256 s) private pure returns (uint256 slo, uint256 shi) {
        uint256 zlo;
        uint256 zhi;
        if (s >= 0) {
            zlo = zm << uint256(s);
            zhi = zlo;
        } else {
            uint256 r = uint256(-s);
            zlo = zm >> r;
            zhi = (zlo << r) != zm ? zlo + 1 : zlo;
        }
        uint256 tlo = 1 << ERF_G;
        uint256 thi = tlo;
        slo = tlo;
        shi = tlo;
        for (uint256 n = 1; n < ERF_TERMS; ++n) {
            uint256 d = (2 * n + 1) << ERF_G;
            tlo = (tlo * zlo) / d;
            thi = _cdiv(thi * zhi, d);
            slo += tlo;
            shi += thi;
            if (((2 * n + 3) << ERF_G) >= 2 * zhi && (thi << ERF_STOP_BITS) <= shi) break;
        }
        shi += thi;
    }

    /// @dev [lo, hi] within [lo', hi'] * 2^k, hi' < 2^ERF_NORM_BITS.
    function _normalize(uint256 lo, uint256 hi) private pure returns (uint256, uint256, uint256 k) {
        uint256 b = Float32.bitLength(hi);
        if (b <= ERF_NORM_BITS) return (lo, hi, 0);
        k = b - ERF_NORM_BITS;
        return (lo >> k, _cdiv(hi, 1 << k), k);
    }

    /// @dev exp of a value in [ylo, yhi] * 2^-F (ylo < 2^128): (n, lo, hi), exp in [lo, hi] * 2^(n - F).
    function _expPos(uint256 ylo, uint256 yhi) private pure returns (uint256 n, uint256 lo, uint256 hi) {
        n = ylo / (LN2_F + 1);
        uint256 rlo = ylo - n * (LN2_F + 1);
        uint256 rhi = yhi - n * LN2_F;
        lo = _series(rlo, false, 0);
        hi = _series(rhi, true, 0);
    }

    /// @dev sum_k z^k shift! / (k + shift)! for 0 <= z < 2^F (units 2^-F): shift 0 is exp(z),
    ///      shift 1 is expm1(z) / z; rounded down, or up with the tail bound (the last term).
    function _series(uint256 z, bool up, uint256 shift) private pure returns (uint256 total) {
        uint256 term = ONE_F;
        total = ONE_F;
        for (uint256 k = 1; k < SERIES_TERMS; ++k) {
            uint256 d = (k + shift) << F;
            term = up ? _cdiv(term * z, d) : (term * z) / d;
            total += term;
        }
        if (up) total += term;
    }

    /// @dev floor and ceil of m * 2^ex * 2^F.
    function _fixed(uint256 m, int256 ex) private pure returns (uint256 lo, uint256 hi) {
        int256 s = ex + int256(F);
        if (s >= 0) {
            lo = m << uint256(s);
            return (lo, lo);
        }
        uint256 r = uint256(-s);
        lo = m >> r;
        hi = (lo << r) != m ? lo + 1 : lo;
    }

    /// @dev True when m * 2^ex >= c.
    function _atLeast(uint256 m, int256 ex, uint256 c) private pure returns (bool) {
        return ex >= 0 ? (m << uint256(ex)) >= c : m >= (c << uint256(-ex));
    }

    function _dc(uint256 low) private pure returns (uint256) {
        return (low * DC_MUL) >> DC_SHIFT;
    }

    function _dcErf(uint256 low) private pure returns (uint256) {
        return (low * DC_MUL) >> DC_SHIFT_ERF;
    }

    function _cdiv(uint256 a, uint256 b) private pure returns (uint256) {
        return a == 0 ? 0 : (a - 1) / b + 1;
    }
}
