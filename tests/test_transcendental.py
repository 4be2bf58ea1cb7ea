"""EXP LOG TANH on-chain (docs/numerics.md, "Transcendental ops on-chain").

- ``vtrain.numerics.transcendental``'s enclosures against mpmath at 400 bits on random and special FP32
  inputs, with the soundness inequalities checked against the trainer's real torch values:
  ``|v - e| <= d``, ``dc <= d <= 4/3 dc``, width ``<= 2^-109 |e|`` (so far below ``d``);
- the ``Transcendental`` contract and the ``Adjudicator`` against the Python mirror, bit for bit;
- the honest trainer never loses (real executor values and log entries, including the rare
  elements with down/up entries), and every tamper is caught;
- the auditor's resolver settles an unlogged ambiguous element by the exact value.
"""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import mpmath
import numpy as np
import pytest
import torch
from test_adjudicator import Case, check, deploy_adjudicator, honest, variant

from protocol.auditor import exact_resolver
from protocol.build import load_artifact
from vtrain.commit.roots import LogEntry
from vtrain.graph.step_graph import OpKind, OpNode
from vtrain.numerics import exact, transcendental

K = OpKind
KINDS = (K.EXP, K.LOG, K.TANH)
MP = {K.EXP: mpmath.exp, K.LOG: mpmath.log, K.TANH: mpmath.tanh}
TORCH = {K.EXP: torch.exp, K.LOG: torch.log, K.TANH: torch.tanh}
U = Fraction(1, 1 << 53)
REL_WIDTH = Fraction(1, 1 << 109)
SIGN = exact.SIGN
FLT_MAX = 0x7F7FFFFF


def bits(x: float) -> int:
    return exact.bits_of(x)


def around(x: float, k: int) -> list[int]:
    """The 2k + 1 FP32 values centred on RN32(x)."""
    o = exact.to_ordered(bits(x))
    return [exact.from_ordered(o + i) for i in range(-k, k + 1)]


SPECIAL = {
    K.EXP: around(88.72283, 30)  # exp overflows FP32 just above
    + around(-103.97208, 30)  # exp(x) = 2^-150: the last midpoint before zero
    + around(-87.33655, 20)  # exp(x) = 2^-126: the subnormal boundary
    + around(-110.0, 2)
    + around(89.0, 2)
    + around(0.5 * np.log(2.0), 3)
    + [0, SIGN, 1, SIGN | 1, 0x00800000, 0x80800000, FLT_MAX, FLT_MAX | SIGN, bits(1.0), bits(-1.0)]
    + [bits(2.0**-k) for k in (20, 24, 25, 60, 120, 126)]
    + [bits(-(2.0**-k)) for k in (20, 24, 25, 60, 120, 126)],
    K.LOG: around(1.0, 40)
    + around(2.0**0.5, 3)
    + around(2.0**-0.5, 3)
    + around(2.0, 3)
    + [1, 2, 3, 0x7FFFFF, 0x800000, FLT_MAX, FLT_MAX - 1, bits(2.0**-140), bits(0.1), bits(3.0e38)]
    + [0, SIGN, bits(-1.0), SIGN | 1, FLT_MAX | SIGN],
    K.TANH: around(9.010913, 30)  # tanh rounds to 1.0 from here on
    + around(-9.010913, 10)
    + around(0.5, 3)
    + around(-0.5, 3)
    + around(40.0, 3)
    + around(2.0**-12, 3)
    + [0, SIGN, 1, SIGN | 1, 2, 0x7FFFFF, 0x800000, FLT_MAX, FLT_MAX | SIGN, bits(1e-20), bits(-3e-30)]
    + [bits(2.0**-k) for k in (1, 2, 24, 50, 51, 100)],
}

#: Inputs where the honest trainer's value lies within 2d of an FP32 midpoint, so it logs a
#: down/up entry (about one input in 2^26). Found by running the executor's FP64 torch functions
#: and ``round_output`` on ~10^9 FP32 inputs (exp: all of [2^-7, 88.7] and [-87, -2^-7]); the
#: tests below check the canonical claim on each (RN32(e), decided on the exact value), so they are not vacuous.
HARD: dict[OpKind, list[int]] = {
    K.EXP: [0x40315B33, 0x4001B249, 0xC16912CD],
    K.LOG: [0x464D5B2B, 0x4665A9A6, 0x44BC4360, 0x1A8446CB, 0x2423C085, 0x3E2B3421, 0x0F61FF63, 0x6F31A8EC]
    + [0x66A8C860, 0x22925AD4, 0x62B467BA, 0x064CB44B, 0x14907055, 0x4C5D65A5, 0x1B81AB52],
    K.TANH: [0x3AC37DE2, 0xBAC37DE2],
}


def random_bits(rng: np.random.Generator, kind: OpKind, n: int) -> list[int]:
    """A mix: any finite pattern, values uniform in the op's interesting range, log-uniform magnitudes."""
    out: list[int] = []
    lo, hi = {K.EXP: (-112.0, 90.0), K.LOG: (0.0, 4.0), K.TANH: (-12.0, 12.0)}[kind]
    while len(out) < n:
        pick = rng.integers(0, 3)
        if pick == 0:
            b = int(rng.integers(0, 1 << 32))
            if not exact.is_finite(b):
                continue
        elif pick == 1:
            b = bits(rng.uniform(lo, hi))
        else:
            mag = 2.0 ** rng.uniform(-149, 7 if kind != K.LOG else 128)
            b = bits(mag if kind == K.LOG or rng.random() < 0.5 else -mag)
        out.append(b)
    return out


# ---------------------------------------------------------------------------------------------
# The enclosures against mpmath and the trainer's torch values


def mp_value(kind: OpKind, b: int) -> Fraction:
    """kind(x) to 400 bits (clamped to +-2^-1100 below that magnitude)."""
    x = exact.value_of(b)
    with mpmath.workprec(400):
        y = MP[kind](mpmath.mpf(x.numerator) / x.denominator)
        sign, man, e, _ = y._mpf_
    if man == 0:
        return Fraction(0)
    if e + int(man).bit_length() < -1100:
        return Fraction(-1 if sign else 1, 1 << 1100)
    v = Fraction(int(man)) * (Fraction(2) ** int(e))
    return -v if sign else v


def torch_value(kind: OpKind, b: int) -> float:
    x = torch.tensor(float(exact.value_of(b)), dtype=torch.float64)
    with np.errstate(all="ignore"):
        return float(TORCH[kind](x))


def check_enclosure(kind: OpKind, b: int) -> str:
    """Asserts the enclosure's soundness for one input; returns which regime it was."""
    enc = transcendental.enclose(kind, b)
    x = exact.value_of(b)
    v = torch_value(kind, b)
    if enc is None:
        assert (kind == K.LOG and x <= 0) or (kind == K.EXP and x >= 89), (kind, hex(b))
        with np.errstate(all="ignore"):
            assert not np.isfinite(np.float32(v)), "the honest trainer has no finite value there either"
        return "undefined"
    e = mp_value(kind, b)
    lo, hi, dc = exact.Enclosure(*enc).bounds
    assert lo <= e <= hi, (kind.name, hex(b), float(lo), float(e), float(hi))
    if kind == K.EXP and x <= -110:  # FP64 itself underflows below -745: only RN32 = 0 matters
        assert lo == 0 and exact.rn32(hi) == 0 and exact.rn32(Fraction(v)) == 0 and dc == 0
        return "underflow"
    d = 4 * U * abs(Fraction(v))
    assert abs(Fraction(v) - e) <= d, ("torch is outside the certified bound", kind.name, hex(b))
    if e == 0:  # log 1, tanh 0
        assert lo == hi == dc == d == 0
        return "exact"
    assert dc <= d <= Fraction(4, 3) * dc, (kind.name, hex(b), float(dc), float(d))
    assert hi - lo <= REL_WIDTH * abs(e), (kind.name, hex(b), float((hi - lo) / abs(e)))
    assert hi - lo <= d
    return "ok"


def run_enclosures(n_random: int, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    seen: dict[str, int] = {}
    for kind in KINDS:
        for b in SPECIAL[kind] + HARD[kind] + random_bits(rng, kind, n_random):
            r = check_enclosure(kind, b)
            seen[r] = seen.get(r, 0) + 1
    return seen


def test_enclosures_contain_the_value_and_satisfy_the_bound_inequalities():
    seen = run_enclosures(300, 1)
    assert seen["ok"] > 1000 and seen["undefined"] > 10 and seen["exact"] >= 3 and seen["underflow"] > 10


@pytest.mark.slow
def test_enclosures_thousands():
    seen = run_enclosures(6000, 2)
    assert seen["ok"] > 15000


def test_exact_value_and_contract_bound_follow_the_enclosure():
    rng = np.random.default_rng(3)
    for kind in KINDS:
        for b in random_bits(rng, kind, 30) + SPECIAL[kind][:5]:
            desc = exact.OpDesc(int(kind), (0,), (1,), ((1,),), ())
            t = [np.array([b], np.uint32).view(np.float32)]
            enc = exact.enclosure(desc, t, 0)
            if enc is None:
                with pytest.raises(exact.NonFiniteValue):
                    exact.exact_value(desc, t, 0)
                assert exact.contract_bound(desc, t, 0) == 0
                continue
            lo, hi, dc = enc.bounds
            assert lo <= exact.exact_value(desc, t, 0) <= hi
            assert exact.contract_bound(desc, t, 0) == dc


def test_the_rule_picks_the_correctly_rounded_value():
    """An unlogged claim stands exactly when it is RN32(e) (the enclosure never straddles a midpoint)."""
    rng = np.random.default_rng(4)
    for kind in KINDS:
        for b in random_bits(rng, kind, 40) + SPECIAL[kind]:
            enc = transcendental.enclose(kind, b)
            if enc is None or (kind == K.EXP and exact.value_of(b) <= -110):
                continue
            want = exact.rn32(mp_value(kind, b), saturate=True)
            if not exact.is_finite(want):
                continue
            e = exact.Enclosure(*enc)
            assert exact.judge(e, want, exact.NONE)
            assert not exact.judge(e, exact.neighbour(want, True), exact.NONE)
            assert not exact.judge(e, exact.neighbour(want, False), exact.NONE)


# ---------------------------------------------------------------------------------------------
# The contracts against the mirror


@pytest.fixture(scope="module")
def adj():
    return deploy_adjudicator()


@pytest.fixture(scope="module")
def tr(adj):
    art = load_artifact("Transcendental")
    return adj.w3.eth.contract(address=adj.functions.transcendental().call(), abi=art.abi)


def on_chain_enclosure(tr, kind: OpKind, b: int) -> tuple[int, int, int, int, int] | None:
    (lo, hi, dc, e, den), defined = tr.functions.enclose(int(kind), b).call()
    return (lo, hi, dc, e, den) if defined else None


def run_contract_enclosures(tr, n_random: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    n = 0
    for kind in KINDS:
        special = [b for b in SPECIAL[kind] if rng.random() < max(0.2, n_random / 400)]
        for b in special + HARD[kind] + random_bits(rng, kind, n_random):
            assert on_chain_enclosure(tr, kind, b) == transcendental.enclose(kind, b), (kind.name, hex(b))
            n += 1
    return n


def test_contract_enclosures_equal_the_mirror(tr):
    assert run_contract_enclosures(tr, 60, 5) > 200


@pytest.mark.slow
def test_contract_enclosures_equal_the_mirror_thousands(tr):
    assert run_contract_enclosures(tr, 1500, 6) > 4500


def elementwise_case(kind: OpKind, xs: list[int]) -> Case:
    a = np.array(xs, np.uint32).view(np.float32)
    return Case(exact.OpDesc(int(kind), (0,), a.shape, (a.shape,), ()), (a,))


def run_adjudicated(adj, n: int, seed: int, variants: int) -> int:
    """Random elements through the Adjudicator with real proofs: the honest claim stands (or, with no
    finite value, nothing does) and contract == mirror on nearby tampered claims."""
    rng = np.random.default_rng(seed)
    ruled = 0
    for kind in KINDS:
        xs = random_bits(rng, kind, n)
        case = elementwise_case(kind, xs)
        for i in range(n):
            h = honest(case, i)
            if h is None:
                assert transcendental.enclose(kind, xs[i]) is None or kind == K.EXP
                claimed, entries = FLT_MAX, []
                assert not check(adj, case, i, claimed, entries)
            else:
                claimed, entries = h
                assert check(adj, case, i, claimed, entries), "an honest claim must stand"
            for _ in range(variants):
                c, e = variant(rng, case, i, claimed, entries)
                check(adj, case, i, c, e)
            ruled += 1 + variants
    return ruled


def test_adjudicator_rules_like_the_mirror_and_honest_claims_stand(adj):
    assert run_adjudicated(adj, 24, 7, 1) == 144


@pytest.mark.slow
def test_adjudicator_rules_like_the_mirror_thousands(adj):
    assert run_adjudicated(adj, 400, 8, 2) == 3600


# ---------------------------------------------------------------------------------------------
# Logged elements: the honest trainer never loses, tampers are caught


def ruling(adj, case: Case, i: int, claimed: int, entries: list[LogEntry]) -> bool:
    """The contract's ruling (asserted equal to the mirror's) with ``adj``, else the mirror's."""
    if adj is not None:
        return check(adj, case, i, claimed, entries)
    entry = next((e for e in entries if e.index == i), None)
    return exact.judge_element(case.desc, case.inputs, i, claimed, entry)


def run_logged(adj_or_none, per_kind: int | None) -> int:
    checked = 0
    for kind in KINDS:
        xs = HARD[kind][:per_kind]
        assert xs, f"no logged {kind.name} inputs"
        case = elementwise_case(kind, xs)
        for i in range(len(xs)):
            h = honest(case, i)
            assert h is not None
            claimed, entries = h
            assert claimed == exact.rn32(mp_value(kind, xs[i])), (kind.name, hex(xs[i]))  # the canonical output
            code = entries[0].code if entries else exact.NONE
            assert ruling(adj_or_none, case, i, claimed, entries), "an honest logged claim must stand"
            # the honest value with an explicit entry stands too
            assert ruling(adj_or_none, case, i, claimed, [LogEntry(i, exact.EXPLICIT, claimed)])
            for up in (True, False):  # a one-ulp tamper under the same entry, or logged explicitly
                other = exact.neighbour(claimed, up)
                assert not ruling(adj_or_none, case, i, other, entries)
                assert not ruling(adj_or_none, case, i, other, [LogEntry(i, exact.EXPLICIT, other)])
            if code in (exact.DOWN, exact.UP):  # the other side of the same midpoint, logged as such
                assert not ruling(adj_or_none, case, i, claimed, [LogEntry(i, 3 - code, 0)])  # wrong direction
                other = exact.neighbour(claimed, code == exact.DOWN)
                assert not ruling(adj_or_none, case, i, other, [LogEntry(i, 3 - code, 0)])  # wrong side
            assert not ruling(adj_or_none, case, i, claimed, [LogEntry(i, 4, 0)])  # no such code
            for k in (-2, 2, 5):  # forged explicit values further away
                forged = exact.from_ordered(exact.to_ordered(claimed) + k)
                assert not ruling(adj_or_none, case, i, forged, [LogEntry(i, exact.EXPLICIT, forged)])
            # unlogged, the claim stands exactly when it is the correctly rounded value
            assert ruling(adj_or_none, case, i, claimed, []) == (claimed == exact.rn32(mp_value(kind, xs[i])))
            checked += 1
    return checked


def test_honest_logged_elements_stand_and_tampers_fail_in_the_mirror():
    assert run_logged(None, None) == sum(len(v) for v in HARD.values())


def test_honest_logged_elements_stand_and_tampers_fail_on_chain(adj):
    assert run_logged(adj, 2) == 6


@pytest.mark.slow
def test_honest_logged_elements_all_on_chain(adj):
    assert run_logged(adj, None) == sum(len(v) for v in HARD.values())


# ---------------------------------------------------------------------------------------------
# The auditor's resolver


def test_auditor_resolver_overrules_a_wrong_unlogged_value_and_keeps_a_right_one():
    rng = np.random.default_rng(9)
    for kind in KINDS:
        xs = [b for b in random_bits(rng, kind, 12) if transcendental.enclose(kind, b) is not None]
        xs = [b for b in xs if honest(elementwise_case(kind, [b]), 0) is not None] + HARD[kind][:2]
        case = elementwise_case(kind, xs)
        want = [exact.rn32(mp_value(kind, b)) for b in xs]
        ctx = SimpleNamespace(graph=SimpleNamespace(descriptors={0: case.desc.encode()}))
        op = OpNode(0, kind, (0,), case.desc.shape, ())
        overruled: list[tuple[int, int]] = []
        resolve = exact_resolver(ctx, overruled)(op, [torch.from_numpy(case.inputs[0])])
        idx = np.arange(len(xs), dtype=np.int64)
        # every other proposal off by one ulp (away from zero, so it stays a valid pattern)
        proposed = np.array(
            [exact.neighbour(w, not w & SIGN) if i % 2 else w for i, w in enumerate(want)], np.uint32
        ).view(np.float32)
        got = resolve(idx, proposed, np.zeros(len(xs), np.uint8)).view(np.uint32)
        assert [int(g) for g in got] == want, kind.name
        assert overruled == [(0, i) for i in range(1, len(xs), 2)]
