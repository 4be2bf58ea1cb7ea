"""Rigorous integer enclosures of ``exp``, ``log`` and ``tanh`` of an FP32 value.

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

The bound is ``dc = 4u L (1 - 2^-40)`` (``u = 2^-53``, ``L`` the enclosure's lower bound of
``|e|``), floored to the unit: ``dc <= 4u |v|`` for any ``v`` within ``4u|v|`` of ``e``.
"""

from __future__ import annotations

from vtrain.errors import VtrainError
from vtrain.graph.step_graph import OpKind

__all__ = ["F", "LN2_F", "enclose", "enclose_exp", "enclose_log", "enclose_tanh", "dc_of"]

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


def dc_of(lo: int, hi: int) -> int:
    """4u (1 - 2^-40) times the enclosure's lower bound of |e|, floored (same unit)."""
    low = lo if lo > 0 else (-hi if hi < 0 else 0)
    return (low * _DC_MUL) >> _DC_SHIFT


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


def enclose(kind: int, b: int) -> Enc | None:
    """The enclosure of op ``kind`` (EXP, LOG or TANH) at FP32 bits ``b``; None where undefined."""
    if kind == OpKind.EXP:
        return enclose_exp(b)
    if kind == OpKind.LOG:
        return enclose_log(b)
    if kind == OpKind.TANH:
        return enclose_tanh(b)
    raise VtrainError(f"op kind {kind} is not a transcendental op (expected EXP, LOG or TANH)")
