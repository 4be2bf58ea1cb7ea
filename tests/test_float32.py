"""Float32 / ExactSum / RoundingRule (Solidity) against vtrain.numerics.exact, and vtrain.numerics.exact against
numpy's IEEE casts: RNE with ties, subnormals, exponent extremes, signed zero and overflow."""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from revert_helpers import error_table, expect_revert
from web3 import Web3

import nodes
from protocol.build import load_artifact
from vtrain.errors import NonFiniteValue
from vtrain.numerics import exact

CALL_GAS = 16_000_000
FLT_MAX = 0x7F7FFFFF


@pytest.fixture(scope="module")
def harness():
    w3: Web3 = nodes.eth_tester_w3()
    return nodes.deploy(w3, load_artifact("Float32Harness"), gas=5_000_000)


def call(fn):
    return fn.call({"gas": CALL_GAS})


def f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def np_rn32_bits(x: float) -> int:
    """numpy's binary64 -> binary32 cast (IEEE RNE), -0 canonicalised to +0."""
    with np.errstate(over="ignore"):
        b = exact.bits_of(np.float64(x).astype(np.float32))
    return 0 if b == exact.SIGN else b


def interesting_doubles(rng: random.Random, n: int) -> list[float]:
    """Doubles over the FP32 range and beyond: random, exact FP32 ties (midpoints) and their
    neighbours, subnormals, the overflow threshold, signed zeros."""
    out = [
        0.0,
        -0.0,
        2.0**-149,
        -(2.0**-149),
        2.0**-150,
        2.0**-151,
        3 * 2.0**-151,
        2.0**-126,
        (2 - 2.0**-23) * 2.0**127,
        2.0**128 - 2.0**103,
        -(2.0**128 - 2.0**103),
    ]
    out.append(math.nextafter(2.0**128 - 2.0**103, 0.0))
    out.append(math.nextafter(2.0**128 - 2.0**103, math.inf))
    while len(out) < n:
        kind = rng.randrange(4)
        if kind == 0:
            x = rng.uniform(1, 2) * 2.0 ** rng.randint(-160, 130)
        elif kind == 1:  # an exact midpoint between two FP32 values
            c = rng.randrange(0, 0x7F800000)
            m, _ = exact.midpoint(c, True)
            x = float(m)
        elif kind == 2:  # one double-ulp off a midpoint
            c = rng.randrange(0, 0x7F800000)
            x = math.nextafter(float(exact.midpoint(c, True)[0]), rng.choice([0.0, math.inf]))
        else:  # subnormal range
            x = rng.randrange(1, 1 << 30) * 2.0 ** rng.randint(-180, -150)
        out.append(-x if rng.random() < 0.5 else x)
    return out


# ---------------------------------------------------------------------------------------------
# vtrain.numerics.exact.rn32 against numpy


def test_rn32_matches_numpy_cast_on_thousands_of_doubles():
    rng = random.Random(1)
    checked = overflow = ties = 0
    for x in interesting_doubles(rng, 6000):
        want = np_rn32_bits(x)
        if want & 0x7F800000 == 0x7F800000:
            overflow += 1
            with pytest.raises(NonFiniteValue):
                exact.rn32(Fraction(x))
            assert exact.rn32(Fraction(x), saturate=True) == want
            continue
        assert exact.rn32(Fraction(x)) == want, (x, hex(want))
        checked += 1
        ties += Fraction(x) == exact.midpoint(want, True)[0] or Fraction(x) == exact.midpoint(want, False)[0]
    assert checked > 5000 and overflow > 2 and ties > 1000


def test_rn32_negative_zero_and_tiny_results_are_canonical_plus_zero():
    assert exact.rn32(Fraction(0)) == 0
    assert exact.rn32(Fraction(-1, 1 << 151)) == 0  # rounds to -0 in IEEE, canonical +0 here
    assert exact.rn32(-Fraction(1, 1 << 150)) == 0  # tie between -0 and -2^-149: even is zero
    assert exact.rn32(-Fraction(3, 1 << 151)) == exact.SIGN | 1


def test_midpoint_and_neighbour_at_the_edges():
    m, s = exact.midpoint(0, True)
    assert (m, s) == (Fraction(1, 1 << 150), Fraction(1, 1 << 149))
    m, s = exact.midpoint(0, False)
    assert (m, s) == (-Fraction(1, 1 << 150), Fraction(1, 1 << 149))
    m, s = exact.midpoint(FLT_MAX, True)  # virtual neighbour 2^128: the overflow threshold
    assert m == 2**128 - 2**103 and s == 2**104
    m, s = exact.midpoint(0x00800000, False)  # just below the smallest normal
    assert s == Fraction(1, 1 << 149)
    assert exact.neighbour(exact.SIGN | 1, True) == 0


# ---------------------------------------------------------------------------------------------
# Solidity Float32 against vtrain.numerics.exact / numpy


def random_rationals(rng: random.Random, n: int) -> list[tuple[bool, int, int, int]]:
    out = []
    for _ in range(n):
        kind = rng.randrange(5)
        if kind == 0:  # dyadic near the FP32 range, often exactly at a tie
            c = rng.randrange(1, 0x7F800000)
            m, _ = exact.midpoint(c, True)
            num, den = m.numerator, m.denominator
            exp = 0
            if den > 1:
                exp = -(den.bit_length() - 1)
                den = 1
            out.append((rng.random() < 0.5, num, exp, 1))
            continue
        if kind == 1:  # wide numerators (accumulator sums), subnormal to overflow
            num = rng.getrandbits(rng.randint(1, 250)) | 1
            exp = rng.randint(-400, 130) - num.bit_length()
            den = 1
        elif kind == 2:  # quotients (DIV, MEAN-like denominators)
            num = rng.getrandbits(rng.randint(1, 200)) or 1
            den = rng.getrandbits(rng.randint(1, 122)) or 1
            exp = rng.randint(-330, 260) - num.bit_length() + den.bit_length()
        elif kind == 3:  # tiny: below half the smallest subnormal and around it
            num = rng.randint(1, 8)
            den = rng.choice([1, 3, 5])
            exp = rng.randint(-155, -148)
        else:  # around the overflow threshold
            num = (1 << 128) - (1 << 103) + rng.randint(-3, 3)
            den = 1
            exp = 0
        out.append((rng.random() < 0.5, num, exp, den))
    return out


def test_solidity_round_matches_rn32_on_thousands_of_rationals(harness):
    rng = random.Random(2)
    cases = random_rationals(rng, 3000)
    got = []
    for lo in range(0, len(cases), 500):
        part = cases[lo : lo + 500]
        got += call(harness.functions.roundMany(*(list(col) for col in zip(*part, strict=True))))
    for (neg, num, exp, den), bits in zip(cases, got, strict=True):
        x = Fraction(num) * exact._pow2(exp) / den
        assert bits == exact.rn32(-x if neg else x, saturate=True), (neg, num, exp, den)


def test_solidity_from_float64_matches_numpy(harness):
    rng = random.Random(3)
    xs = [x for x in interesting_doubles(rng, 3000) if np_rn32_bits(x) & 0x7F800000 != 0x7F800000]
    got = []
    for lo in range(0, len(xs), 600):
        got += call(harness.functions.fromFloat64Many([f64_bits(x) for x in xs[lo : lo + 600]]))
    assert got == [np_rn32_bits(x) for x in xs]


def test_solidity_round_strict_reverts_on_overflow_and_nan(harness):
    errors = error_table(harness.abi)
    args = expect_revert(
        lambda: call(harness.functions.roundStrict(True, (1 << 128) - (1 << 103), 0, 1)), errors, "Overflow"
    )
    assert args == (True,)
    assert call(harness.functions.roundStrict(False, (1 << 128) - (1 << 103) - 1, 0, 1)) == FLT_MAX
    nan = 0x7FF8000000000000
    args = expect_revert(lambda: call(harness.functions.fromFloat64Many([nan])), errors, "NonFinite64")
    assert args == (nan,)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c=st.integers(0, 0x7F7FFFFF), neg=st.booleans(), above=st.booleans())
def test_solidity_midpoint_matches_python(harness, c, neg, above):
    bits = c | (exact.SIGN if neg and c else 0)
    m_num, m_exp, s_num, s_exp = call(harness.functions.midpoint(bits, above))
    m, s = exact.midpoint(bits, above)
    assert Fraction(m_num) * exact._pow2(m_exp) == m
    assert Fraction(s_num) * exact._pow2(s_exp) == s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    a=st.integers(-(1 << 200), 1 << 200),
    ae=st.integers(-400, 300),
    den=st.integers(1, 1 << 120),
    b=st.integers(-(1 << 26), 1 << 26),
    be=st.integers(-300, 130),
)
def test_solidity_compare_is_exact(harness, a, ae, den, b, be):
    x = Fraction(a) * exact._pow2(ae) / den
    y = Fraction(b) * exact._pow2(be)
    assert call(harness.functions.compare(a, ae, den, b, be)) == (x > y) - (x < y)


def test_solidity_compare_at_equality(harness):
    # 3/3 * 2^5 == 1 * 2^5 and 6 * 2^-1 / 3 == 1
    assert call(harness.functions.compare(3, 5, 3, 1, 5)) == 0
    assert call(harness.functions.compare(6, -1, 3, 1, 0)) == 0
    assert call(harness.functions.compare(-6, -1, 3, -1, 0)) == 0
    assert call(harness.functions.compare(0, 0, 1, 0, 7)) == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.one_of(st.integers(0, 1 << 256 - 1), st.integers(0, 1 << 64)))
def test_solidity_isqrt_is_floor_sqrt(harness, a):
    assert call(harness.functions.isqrt(a)) == math.isqrt(a)


# ---------------------------------------------------------------------------------------------
# ExactSum and RoundingRule


def f32_pattern(rng: random.Random) -> int:
    kind = rng.randrange(6)
    if kind == 0:
        return 0
    if kind == 1:  # subnormal
        b = rng.randrange(1, 1 << 23)
    elif kind == 2:  # extreme exponents
        b = (rng.choice([1, 2, 253, 254]) << 23) | rng.getrandbits(23)
    else:
        b = (rng.randint(100, 150) << 23) | rng.getrandbits(23)
    return b | (exact.SIGN if rng.random() < 0.5 else 0)


@pytest.mark.parametrize("products", [False, True])
def test_solidity_accumulate_matches_mirror_and_encloses_exact_sum(harness, products):
    rng = random.Random(4 + products)
    for trial in range(12):
        n = rng.choice([1, 2, 3, 17, 64, 200])
        xs = [f32_pattern(rng) for _ in range(2 * n if products else n)]
        if trial % 3 == 0:  # wide dynamic range with cancellation
            xs[0] = 0x7E000000
            xs.append(0xFE000000)
            if products:
                xs.append(0x3F800000)
            n += 1
        got = tuple(call(harness.functions.accumulate(xs, products)))
        if products:
            terms = [exact._product(xs[2 * i], xs[2 * i + 1]) for i in range(n)]
            exact_sum = sum((exact.value_of(xs[2 * i]) * exact.value_of(xs[2 * i + 1]) for i in range(n)), Fraction(0))
        else:
            terms = [exact._product(x, exact.ONE) for x in xs]
            exact_sum = sum((exact.value_of(x) for x in xs), Fraction(0))
        want = exact._accumulate(terms)
        assert got == want
        total, _, inexact, lsb = want
        q = exact._pow2(lsb)
        assert total * q <= exact_sum <= (total + inexact) * q


def test_solidity_fill_packs_like_product_and_rejects_non_finite(harness):
    rng = random.Random(6)
    for count in (1, 7, 64, 300):
        a = [f32_pattern(rng) for _ in range(count)]
        b = [f32_pattern(rng) for _ in range(count)]
        le = lambda xs: b"".join(x.to_bytes(4, "little") for x in xs)  # noqa: E731
        for other in (le(b), b""):
            filled, packed = call(harness.functions.fillTerms(le(a), other, count))
            assert filled == packed
            want = [exact._product(x, y if other else exact.ONE) for x, y in zip(a, b, strict=True)]
            assert [((t >> 255) == 1, t & ((1 << 64) - 1), (t >> 64) & 0xFFFF) for t in filled] == [
                (neg and m != 0, m, est if m else 0) for neg, m, est in want
            ]
    errors = error_table(harness.abi, load_artifact("Float32").abi)
    bad = (1.0, float("nan"), 2.0)
    a = np.array(bad, np.float32).tobytes()
    got = expect_revert(lambda: call(harness.functions.fillTerms(a, b"", 3)), errors, "NonFinite")
    assert got == (0x7FC00000,)
    inf_b = np.array([1.0, 1.0, np.inf], np.float32).tobytes()
    got = expect_revert(lambda: call(harness.functions.fillTerms(a[:4] * 3, inf_b, 3)), errors, "NonFinite")
    assert got == (0x7F800000,)


def test_solidity_judge_matches_python_on_random_enclosures(harness):
    rng = random.Random(5)
    for _ in range(120):
        claimed = rng.randrange(0, 0x7F800000) | (exact.SIGN if rng.random() < 0.5 else 0)
        if claimed == exact.SIGN:
            claimed = 0
        m, s = exact.midpoint(claimed, rng.random() < 0.5)
        # an enclosure around the claim, its midpoint, or somewhere near
        centre = rng.choice([exact.value_of(claimed), m, m + s * Fraction(rng.randint(-8, 8), 64)])
        exp = exact.decode(claimed)[2] - 100  # the unit sits ~100 bits below the claim's ulp
        den = rng.choice([1, 3, (1 << 53) - 7])
        lo = math.floor(centre / exact._pow2(exp) * den)
        hi = lo + rng.choice([0, 0, 1, 1 << rng.randint(0, 40)])
        dc = rng.choice([0, 1, 1 << rng.randint(0, 100), rng.randint(0, 1 << (96 + den.bit_length()))])
        enc = exact.Enclosure(lo, hi, dc, exp, den)
        code = rng.choice([0, 1, 2, 3, 3, 4])
        value = claimed if rng.random() < 0.8 else claimed ^ 1
        got = call(harness.functions.judge((lo, hi, dc, exp, den), claimed, code, value))
        assert got == exact.judge(enc, claimed, code, value), (enc, hex(claimed), code)


def test_judge_rejects_non_canonical_or_non_finite_claims(harness):
    enc = (0, 0, 0, 0, 1)
    assert call(harness.functions.judge(enc, 0, 0, 0)) is True
    for bad in (exact.SIGN, exact.POS_INF, 0x7FC00000):
        assert call(harness.functions.judge(enc, bad, 0, 0)) is False
        assert exact.judge(exact.Enclosure(*enc), bad, 0) is False
