"""Rigorous integer enclosures of ``exp``, ``log``, ``tanh`` and ``erf`` of an FP32 value.

Bit-for-bit mirror of ``contracts/Transcendental.sol`` (docs/numerics.md, "Transcendental ops
on-chain"). Every quantity is an integer; a fixed-point number ``X`` stands for ``X * 2^-F`` with
``F = 120`` fraction bits. Every rounding is directed (floor for a lower bound, ceiling for an
upper one) and every truncated series gets a bound of its tail, so the exact value ``e`` always
lies in the returned ``[lo, hi]``. All three functions are increasing, so a lower (upper) bound of
``f(x)`` is a lower (upper) bound of ``f`` at a lower (upper) bound of ``x``.

- ``exp``: ``|x| = n ln2 + r``, ``0 <= r < ln2 + 2^-110``, ``exp(r)`` by its Taylor series (34
  terms, all positive); ``exp(-|x|) = 1 / exp(|x|)``. ``x >= 89`` has no finite FP32 value
  (undefined, like a division by zero); ``x <= -110`` is enclosed in ``[0, 2^-158]`` (rounds to 0).
- ``log``: ``x = M 2^k``, ``M`` in ``[2^-1/2, 2^1/2)``, ``log M = 2 atanh(t)``, ``t = (M-1)/(M+1)``
  an exact rational, ``atanh(t) = t A(t^2)``, ``A(s) = sum s^j / (2j+1)`` (24 terms, ``s < 0.03``).
  The enclosure keeps ``t``'s denominator as its unit's denominator, so ``log`` near 1 keeps its
  relative precision. ``x <= 0`` is undefined.
- ``tanh``: odd. ``|x| < 1/2``: ``tanh x = x g / (1 + x g)``, ``g = expm1(2x) / 2x = sum
  (2x)^k / (k+1)!`` (relative precision down to the smallest subnormal); ``1/2 <= |x| < 40``:
  ``1 - 2 / (exp(2|x|) + 1)``; ``|x| >= 40``: ``[1 - 2^-110, 1]``.
- ``erf``: odd. ``|x| < 6``: ``erf x = (2/sqrt(pi)) x exp(-x^2) S(2x^2)``, ``S(z) = sum_n z^n /
  (1*3*...*(2n+1))`` (all terms positive; ``exp(-x^2)`` from the exp series at the fixed-point
  enclosure of ``x^2``, ``2/sqrt(pi)`` in ``(C, C + 1) * 2^-120``; ``S`` in units ``2^-96``, summed
  until the term ratio ``z/(2n+3)`` is at most 1/2 and the term is at most ``2^-88`` of the sum, the
  tail then at most the last term); ``|x| >= 6``: ``[1 - 2^-55, 1]`` (``erfc 6 < exp(-36) /
  (6 sqrt(pi)) < 2^-55.3``; no FP32 midpoint lies within ``2^-26`` of 1).

The bound is ``dc = 4u L (1 - 2^-40)`` (``u = 2^-53``, ``L`` the enclosure's lower bound of
``|e|``), floored to the unit: ``dc <= 4u |v|`` for any ``v`` within ``4u|v|`` of ``e``. ERF's
trainer allowance is twice that (``8u|v|``: CUDA documents 2 ulp for its double ``erf``), so its
``dc = 8u L (1 - 2^-40)``.
"""

from __future__ import annotations

from vtrain.errors import VtrainError
from vtrain.graph.step_graph import OpKind

__all__ = ["F", "LN2_F", "TWO_OVER_SQRT_PI_F", "enclose", "enclose_exp", "enclose_log", "enclose_tanh", "enclose_erf",
           "dc_of"]

#: Fraction bits of the fixed-point numbers.
F = 120
ONE_F = 1 << F
#: floor(ln2 * 2^120); ln 2 lies strictly inside (LN2_F, LN2_F + 1) * 2^-120 (it is irrational).
LN2_F = 921350637599661305226344307672478454
#: Terms of the exp / expm1 series (34! > 2^127) and of the atanh series (0.0295^24 < 2^-122).
SERIES_TERMS = 34
ATANH_TERMS = 24
#: exp: at or above this input there is no finite FP32 value; at or below -EXP_LOW the result
#: is enclosed in [0, 2^-158].
EXP_HIGH = 89
EXP_LOW = 110
#: tanh: saturation threshold (1 - tanh 40 < 2^-114) and the unit of its enclosure.
TANH_SAT = 40
TANH_SAT_BITS = 110
#: dc = floor(L * (2^40 - 1) / 2^91): 4u (1 - 2^-40) L.
_DC_MUL = (1 << 40) - 1
_DC_SHIFT = 91
#: ERF: dc = floor(L * (2^40 - 1) / 2^90) = 8u (1 - 2^-40) L (the trainer's allowance is 8u|v|).
_DC_SHIFT_ERF = 90
#: floor(2/sqrt(pi) * 2^120); 2/sqrt(pi) lies strictly inside (C, C + 1) * 2^-120 (it is irrational).
TWO_OVER_SQRT_PI_F = 1499873178763820871004525654118497670
#: erf: saturation threshold (erfc 6 < 2^-55.3) and the unit of the saturated enclosure.
ERF_SAT = 6
ERF_SAT_BITS = 55
#: erf: fraction bits of the series S(2x^2) (its largest term times 2x^2 stays below 2^248).
ERF_G = 96
#: erf: at most this many series terms (the ratio 2x^2 / (2n+3) <= 1/2 from n = 71 on for |x| < 6;
#: tests check the stopping test below always ends the loop earlier).
ERF_TERMS = 160
#: erf: the series stops once its term is at most 2^-ERF_STOP_BITS of the sum.
ERF_STOP_BITS = 88
#: erf: products are renormalised to at most this many bits before the next multiplication.
ERF_NORM_BITS = 128

Enc = tuple[int, int, int, int, int]
"""``(lo, hi, dc, exp, den)``: ``e`` in ``[lo, hi] * 2^exp / den``, bound ``dc`` in the same unit."""


def _decode(b: int) -> tuple[bool, int, int]:
    be = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    if be == 0:
        return bool(b & 0x80000000), mant, -149
    return bool(b & 0x80000000), mant | 0x800000, be - 150


def _cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for a >= 0, b > 0."""
    return -(-a // b)


def _at_least(m: int, ex: int, c: int) -> bool:
    """True when m * 2^ex >= c (m, c >= 0)."""
    return (m << ex) >= c if ex >= 0 else m >= (c << -ex)


def _fixed(m: int, ex: int) -> tuple[int, int]:
    """floor and ceil of m * 2^ex * 2^F."""
    s = ex + F
    if s >= 0:
        v = m << s
        return v, v
    lo = m >> -s
    return lo, lo + (1 if (lo << -s) != m else 0)


def dc_of(lo: int, hi: int, shift: int = _DC_SHIFT) -> int:
    """4u (1 - 2^-40) times the enclosure's lower bound of |e|, floored (same unit); ``shift`` 90
    (ERF) doubles it."""
    low = lo if lo > 0 else (-hi if hi < 0 else 0)
    return (low * _DC_MUL) >> shift


def _series(z: int, up: bool, shift: int) -> int:
    """sum_{k>=0} z^k / (k + shift)! * shift! in fixed point, for 0 <= z < 2^F (z in units 2^-F):
    shift 0 is exp(z), shift 1 is expm1(z) / z. Rounded down, or up with the tail bound
    (terms after the last one sum to at most the last one, as z / (k + 1) <= 1/2)."""
    term = ONE_F
    total = ONE_F
    for k in range(1, SERIES_TERMS):
        d = (k + shift) << F
        term = _cdiv(term * z, d) if up else term * z // d
        total += term
    return total + term if up else total


def _exp_pos(ylo: int, yhi: int) -> tuple[int, int, int]:
    """exp of a value in [ylo, yhi] * 2^-F (0 <= ylo <= yhi < 2^128): ``(n, lo, hi)`` with the
    value's exp in [lo, hi] * 2^(n - F)."""
    n = ylo // (LN2_F + 1)
    rlo = ylo - n * (LN2_F + 1)  # <= ylo 2^-F - n ln2
    rhi = yhi - n * LN2_F  # >= yhi 2^-F - n ln2
    return n, _series(rlo, False, 0), _series(rhi, True, 0)


def enclose_exp(b: int) -> Enc | None:
    """Enclosure of exp(x) for FP32 bits ``b`` (finite); None when it has no finite FP32 value."""
    neg, m, ex = _decode(b)
    if not neg and _at_least(m, ex, EXP_HIGH):
        return None
    if neg and _at_least(m, ex, EXP_LOW):
        return 0, 1, 0, -158, 1
    ylo, yhi = _fixed(m, ex)
    n, lo, hi = _exp_pos(ylo, yhi)
    if neg:
        lo, hi = (1 << (2 * F)) // hi, _cdiv(1 << (2 * F), lo)
        n = -n
    return lo, hi, dc_of(lo, hi), n - F, 1


def enclose_log(b: int) -> Enc | None:
    """Enclosure of log(x) for FP32 bits ``b`` (finite); None for x <= 0 (no finite value)."""
    neg, m, ex = _decode(b)
    if neg or m == 0:
        return None
    sh = 24 - m.bit_length()
    m <<= sh
    ex -= sh
    p = 24 if m * m >= 1 << 47 else 23  # M = m / 2^p in [2^-1/2, 2^1/2)
    k = ex + p
    tn = m - (1 << p)
    td = m + (1 << p)
    if tn == 0 and k == 0:
        return 0, 0, 0, 0, 1
    num = tn * tn << F
    den = td * td
    slo, shi = num // den, _cdiv(num, den)
    alo = ahi = ONE_F
    plo = phi = ONE_F
    for j in range(1, ATANH_TERMS):
        plo = plo * slo >> F
        phi = _cdiv(phi * shi, ONE_F)
        alo += plo // (2 * j + 1)
        ahi += _cdiv(phi, 2 * j + 1)
    ahi += _cdiv(phi * shi, ONE_F)  # tail: sum_{j>=J} s^j / (2j+1) <= s^J
    # k ln2 td + 2 tn A, in units 2^-F / td.
    klo, khi = (k * LN2_F, k * (LN2_F + 1)) if k >= 0 else (k * (LN2_F + 1), k * LN2_F)
    tlo, thi = (2 * tn * alo, 2 * tn * ahi) if tn >= 0 else (2 * tn * ahi, 2 * tn * alo)
    lo = klo * td + tlo
    hi = khi * td + thi
    return lo, hi, dc_of(lo, hi), -F, td


def enclose_tanh(b: int) -> Enc:
    """Enclosure of tanh(x) for FP32 bits ``b`` (finite)."""
    neg, m, ex = _decode(b)
    if m == 0:
        return 0, 0, 0, 0, 1
    if m.bit_length() + ex <= -1:  # |x| < 1/2
        ylo, yhi = _fixed(m, ex + 1)  # 2|x|
        glo, ghi = _series(ylo, False, 1), _series(yhi, True, 1)
        sh = -ex  # ex <= -2 here
        xg_up = _cdiv(m * glo, 1 << sh)  # >= |x| g_lo, units 2^-F
        xg_dn = (m * ghi) >> sh
        lo = m * (glo * ONE_F // (ONE_F + xg_up))
        hi = m * _cdiv(ghi * ONE_F, ONE_F + xg_dn)
        e = ex - F
    elif not _at_least(m, ex, TANH_SAT):
        y, _ = _fixed(m, ex + 1)  # 2|x| >= 1: exact
        n, elo, ehi = _exp_pos(y, y)
        two = 1 << (2 * F + 1)
        lo = ONE_F - _cdiv(two, (elo << n) + ONE_F)
        hi = ONE_F - two // ((ehi << n) + ONE_F)
        e = -F
    else:
        lo, hi, e = (1 << TANH_SAT_BITS) - 1, 1 << TANH_SAT_BITS, -TANH_SAT_BITS
    if neg:
        lo, hi = -hi, -lo
    return lo, hi, dc_of(lo, hi), e, 1


def _normalize(lo: int, hi: int) -> tuple[int, int, int]:
    """``(lo', hi', k)`` with ``[lo, hi] in [lo', hi'] * 2^k`` and ``hi' < 2^ERF_NORM_BITS`` (0 <= lo <= hi)."""
    k = max(0, hi.bit_length() - ERF_NORM_BITS)
    if k == 0:
        return lo, hi, 0
    return lo >> k, _cdiv(hi, 1 << k), k


def _erf_series(zlo: int, zhi: int) -> tuple[int, int]:
    """S(z) = sum_n z^n / (1*3*...*(2n+1)) for z in [zlo, zhi] * 2^-G (z < 72), rounded down and up
    (units 2^-G). Upper: once the ratio of the next term, z / (2n+3), is at most 1/2, the terms after
    term n sum to at most term n."""
    one = 1 << ERF_G
    tlo = thi = slo = shi = one
    for n in range(1, ERF_TERMS):
        d = (2 * n + 1) << ERF_G
        tlo = tlo * zlo // d
        thi = _cdiv(thi * zhi, d)
        slo += tlo
        shi += thi
        if ((2 * n + 3) << ERF_G) >= 2 * zhi and (thi << ERF_STOP_BITS) <= shi:
            break
    return slo, shi + thi


def enclose_erf(b: int) -> Enc:
    """Enclosure of erf(x) for FP32 bits ``b`` (finite)."""
    neg, m, ex = _decode(b)
    if m == 0:
        return 0, 0, 0, 0, 1
    if _at_least(m, ex, ERF_SAT):
        lo, hi, e = (1 << ERF_SAT_BITS) - 1, 1 << ERF_SAT_BITS, -ERF_SAT_BITS
    else:
        ylo, yhi = _fixed(m * m, 2 * ex)  # x^2, units 2^-F
        n, elo, ehi = _exp_pos(ylo, yhi)  # exp(x^2) in [elo, ehi] * 2^(n - F)
        # (2/sqrt(pi)) exp(-x^2) in [qlo, qhi] * 2^(-n - F)
        qlo = TWO_OVER_SQRT_PI_F * ((1 << (2 * F)) // ehi) >> F
        qhi = _cdiv((TWO_OVER_SQRT_PI_F + 1) * _cdiv(1 << (2 * F), elo), ONE_F)
        s = 2 * ex + ERF_G + 1  # 2 x^2 in units 2^-G
        zm = m * m
        if s >= 0:
            zlo = zhi = zm << s
        else:
            zlo = zm >> -s
            zhi = zlo + (1 if (zlo << -s) != zm else 0)
        slo, shi, k1 = _normalize(*_erf_series(zlo, zhi))
        plo, phi, k2 = _normalize(qlo * slo, qhi * shi)
        lo, hi = m * plo, m * phi
        e = ex - n - F - ERF_G + k1 + k2
    if neg:
        lo, hi = -hi, -lo
    return lo, hi, dc_of(lo, hi, _DC_SHIFT_ERF), e, 1


def enclose(kind: int, b: int) -> Enc | None:
    """The enclosure of op ``kind`` (EXP, LOG, TANH or ERF) at FP32 bits ``b``; None where undefined."""
    if kind == OpKind.EXP:
        return enclose_exp(b)
    if kind == OpKind.LOG:
        return enclose_log(b)
    if kind == OpKind.TANH:
        return enclose_tanh(b)
    if kind == OpKind.ERF:
        return enclose_erf(b)
    raise VtrainError(f"op kind {kind} is not a transcendental op (expected EXP, LOG, TANH or ERF)")
