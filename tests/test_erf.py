"""ERF, the error function as a transcendental op (docs/numerics.md, "Transcendental ops on-chain").

- ``vtrain.numerics.transcendental.enclose_erf`` against mpmath at 400 bits on special and random FP32
  inputs: ``lo <= erf(x) <= hi``, width ``<= 2^-80 |e|`` below saturation (``2^-55 <= 2^-54 |e|`` at it, where no
  midpoint is near), and the soundness inequalities against the trainer's real ``torch.erf``:
  ``|v - e| <= d = 8u|v|``, ``dc <= d <= 4/3 dc``;
- the shared vectors ``tests/vectors/erf.json``: the Python mirror, mpmath's ``RN32(erf x)``, the
  ``Transcendental`` contract and the rule, on the same cases (non-finite inputs revert);
- the Adjudicator with real proofs: honest claims stand (including the rare honest elements with an
  ``up``/``down`` entry, found by scanning ~2*10^8 FP32 inputs), tampered ones lose;
- the auditor's resolver overrules a wrong unlogged value;
- the step graph's ERF backward is ``(2/sqrt(pi)) exp(-x^2) g``.

Slower sweeps: ``pytest tests/test_erf.py -m slow``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import mpmath
import numpy as np
import pytest
import torch
from revert_helpers import expect_revert
from test_adjudicator import Case, adjudicator_errors, check, deploy_adjudicator, honest, variant

from protocol.auditor import exact_resolver
from protocol.build import load_artifact
from vtrain.commit.roots import LogEntry
from vtrain.graph.fp64 import evaluate_fp64
from vtrain.graph.step_graph import GraphBuilder, OpKind, OpNode
from vtrain.numerics import exact, transcendental

K = OpKind
U = Fraction(1, 1 << 53)
D_MUL = 8  # the trainer's allowance for ERF: d = 8u|v|
REL_WIDTH = Fraction(1, 1 << 80)
SAT_WIDTH = Fraction(1, 1 << 54)  # 2^-55 over e < 1
SIGN = exact.SIGN
VECTORS = Path(__file__).resolve().parent / "vectors" / "erf.json"

#: Honest elements with an ``up`` entry (their negatives: ``down``): the trainer's value lies within 2d of
#: an FP32 midpoint. Found by running torch.erf and the canonical decision on every FP32 input in
#: [2^-20, 3.93]; the tests check the canonical claim on each, so they are not vacuous.
HARD = [0x358E9D2D, 0x36AEA466, 0x3940EAD6, 0x39C0057D, 0x3B25A39D]


def bits(x: float) -> int:
    return exact.bits_of(x)


def special() -> list[int]:
    six = bits(6.0)
    out = [0, SIGN, 1, SIGN | 1, 2, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F7FFFFF | SIGN]
    out += [bits(x) for x in (1e-30, -3e-20, 2.0**-12, 0.1, 0.5, 1.0, 2.5, 3.9, 3.9192, 3.925, 4.0, 10.0, 1e10)]
    out += [exact.from_ordered(exact.to_ordered(six) + i) for i in range(-3, 4)]
    out += [exact.from_ordered(exact.to_ordered(bits(3.92)) + i) for i in range(-3, 4)]
    return out + [b | SIGN for b in out] + HARD + [b | SIGN for b in HARD]


def random_bits(rng: np.random.Generator, n: int) -> list[int]:
    """Uniform in [-7, 7], log-uniform magnitudes down to the smallest subnormal, and any finite pattern."""
    out: list[int] = []
    while len(out) < n:
        pick = rng.integers(0, 3)
        if pick == 0:
            b = bits(rng.uniform(-7.0, 7.0))
        elif pick == 1:
            mag = 2.0 ** rng.uniform(-149, 3)
            b = bits(mag if rng.random() < 0.5 else -mag)
        else:
            b = int(rng.integers(0, 1 << 32))
            if not exact.is_finite(b):
                continue
        out.append(b)
    return out


def mp_erf(b: int) -> Fraction:
    x = exact.value_of(b)
    with mpmath.workprec(400):
        y = mpmath.erf(mpmath.mpf(x.numerator) / x.denominator)
        sign, man, e, _ = y._mpf_
    if man == 0:
        return Fraction(0)
    v = Fraction(int(man)) * Fraction(2) ** int(e)
    return -v if sign else v


def torch_erf(b: int) -> float:
    return float(torch.erf(torch.tensor(float(exact.value_of(b)), dtype=torch.float64)))


def check_enclosure(b: int) -> str:
    lo, hi, dc = exact.Enclosure(*transcendental.enclose_erf(b)).bounds
    e = mp_erf(b)
    assert lo <= e <= hi, (hex(b), float(lo), float(e), float(hi))
    v = Fraction(torch_erf(b))
    d = D_MUL * U * abs(v)
    assert abs(v - e) <= d, ("torch.erf is outside the certified bound", hex(b))
    if e == 0:
        assert lo == hi == dc == d == 0
        return "zero"
    assert dc <= d <= Fraction(4, 3) * dc, (hex(b), float(dc), float(d))
    saturated = abs(exact.value_of(b)) >= 6
    assert hi - lo <= (SAT_WIDTH if saturated else REL_WIDTH) * abs(e), (hex(b), float((hi - lo) / abs(e)))
    assert hi - lo <= d
    return "saturated" if saturated else "series"


def run_enclosures(n_random: int, seed: int) -> dict[str, int]:
    seen: dict[str, int] = {}
    for b in special() + random_bits(np.random.default_rng(seed), n_random):
        r = check_enclosure(b)
        seen[r] = seen.get(r, 0) + 1
    return seen


def test_erf_enclosures_contain_the_value_and_satisfy_the_bound_inequalities() -> None:
    seen = run_enclosures(400, 1)
    assert seen["series"] > 250 and seen["saturated"] > 50 and seen["zero"] >= 2


@pytest.mark.slow
def test_erf_enclosures_thousands() -> None:
    """``pytest tests/test_erf.py -m slow -k thousands``"""
    assert run_enclosures(8000, 2)["series"] > 4000


def series_terms(b: int) -> int:
    """How many terms ``_erf_series`` sums for input ``b`` (its loop, replayed)."""
    neg, m, ex = transcendental._decode(b)
    s = 2 * ex + transcendental.ERF_G + 1
    zm = m * m
    zlo = zm << s if s >= 0 else zm >> -s
    zhi = zlo if s >= 0 else zlo + (1 if (zlo << -s) != zm else 0)
    g = transcendental.ERF_G
    thi = shi = 1 << g
    for n in range(1, transcendental.ERF_TERMS):
        thi = -(-(thi * zhi) // ((2 * n + 1) << g))
        shi += thi
        assert thi * zhi < 1 << 256  # no uint256 overflow in the contract
        if ((2 * n + 3) << g) >= 2 * zhi and (thi << transcendental.ERF_STOP_BITS) <= shi:
            return n
    return transcendental.ERF_TERMS


def test_erf_series_stops_by_its_test_well_before_the_loop_bound() -> None:
    """The largest series input (just below 6) needs the most terms; the loop bound is never reached, and
    its tail bound (the ratio 2x^2 / (2n+3) <= 1/2) holds wherever it stops."""
    worst = exact.neighbour(bits(6.0), False)
    assert series_terms(worst) < transcendental.ERF_TERMS - 30
    assert max(series_terms(b) for b in (bits(1.0), bits(3.9), bits(5.0), worst)) == series_terms(worst)


def test_erf_constants() -> None:
    with mpmath.workprec(400):
        c = 2 / mpmath.sqrt(mpmath.pi)
        assert mpmath.floor(c * mpmath.mpf(2) ** 120) == transcendental.TWO_OVER_SQRT_PI_F
        # erfc(6) < exp(-36) / (6 sqrt(pi)) < 2^-55: the saturated enclosure [1 - 2^-55, 1] holds
        assert mpmath.exp(-36) / (6 * mpmath.sqrt(mpmath.pi)) < mpmath.mpf(2) ** -transcendental.ERF_SAT_BITS
        assert mpmath.erfc(6) < mpmath.mpf(2) ** -transcendental.ERF_SAT_BITS


def test_the_rule_picks_the_correctly_rounded_erf() -> None:
    rng = np.random.default_rng(4)
    for b in random_bits(rng, 60) + special():
        want = exact.rn32(mp_erf(b))
        e = exact.Enclosure(*transcendental.enclose_erf(b))
        assert exact.judge(e, want, exact.NONE)
        assert not exact.judge(e, exact.neighbour(want, True), exact.NONE)
        assert not exact.judge(e, exact.neighbour(want, False), exact.NONE)


# ---------------------------------------------------------------------------------------------
# Shared vectors


def vector_cases() -> list[dict]:
    return json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]


def enc_of(case: dict) -> tuple[int, int, int, int, int]:
    e = case["enclosure"]
    return int(e["lo"]), int(e["hi"]), int(e["dc"]), int(e["exp"]), int(e["den"])


def test_erf_vectors_match_the_mirror_and_mpmath() -> None:
    cases = vector_cases()
    names = {c["name"] for c in cases}
    assert {"+0", "-0", "smallest subnormal", "0.5", "1", "2.5", "3.9", "4", "6 (saturated)", "FLT_MAX", "NaN",
            "+inf", "-inf"} <= names
    for c in cases:
        if not c["finite"]:
            assert not exact.is_finite(c["bits"])
            desc = exact.OpDesc(int(K.ERF), (0,), (1,), ((1,),), ())
            with pytest.raises(exact.NonFiniteValue):
                exact.enclosure(desc, [np.array([c["bits"]], np.uint32).view(np.float32)], 0)
            continue
        assert enc_of(c) == transcendental.enclose_erf(c["bits"]), c["name"]
        assert c["rn32"] == exact.rn32(mp_erf(c["bits"])), c["name"]
        enc = exact.Enclosure(*enc_of(c))
        for cl in c["claims"]:
            assert exact.judge(enc, cl["bits"], cl["code"], cl["value"]) == cl["stands"], c["name"]
            assert cl["stands"] == (cl["bits"] == c["rn32"])


# ---------------------------------------------------------------------------------------------
# The contracts


@pytest.fixture(scope="module")
def adj():
    return deploy_adjudicator()


@pytest.fixture(scope="module")
def tr(adj):
    art = load_artifact("Transcendental")
    return adj.w3.eth.contract(address=adj.functions.transcendental().call(), abi=art.abi)


def test_erf_vectors_on_chain(adj, tr) -> None:
    """Transcendental.enclose(ERF) equals every vector's enclosure (non-finite inputs revert NonFinite),
    and the Adjudicator rules every vector claim as the vector says."""
    sel = adjudicator_errors(adj)
    cases = vector_cases()
    ruled = 0
    for c in cases:
        call = tr.functions.enclose(int(K.ERF), c["bits"]).call
        if not c["finite"]:
            assert expect_revert(call, sel, "NonFinite") == (c["bits"],)
            continue
        got, defined = call()
        assert defined and tuple(got) == enc_of(c), c["name"]
        if c["name"] in ("smallest subnormal", "0.5", "3.92 (below the rounds-to-1 threshold)", "-FLT_MAX"):
            case = elementwise_case([c["bits"]])
            for cl in c["claims"]:
                assert check(adj, case, 0, cl["bits"], []) == cl["stands"], c["name"]
                ruled += 1
    assert ruled == 12


def test_contract_erf_equals_the_mirror_on_random_inputs(tr) -> None:
    rng = np.random.default_rng(5)
    for b in random_bits(rng, 16):
        (lo, hi, dc, e, den), defined = tr.functions.enclose(int(K.ERF), b).call()
        assert defined and (lo, hi, dc, e, den) == transcendental.enclose_erf(b), hex(b)


def elementwise_case(xs: list[int]) -> Case:
    a = np.array(xs, np.uint32).view(np.float32)
    return Case(exact.OpDesc(int(K.ERF), (0,), a.shape, (a.shape,), ()), (a,))


def test_honest_erf_claims_stand_and_tampers_lose_on_chain(adj) -> None:
    rng = np.random.default_rng(7)
    xs = random_bits(rng, 6)
    case = elementwise_case(xs)
    for i in range(len(xs)):
        claimed, entries = honest(case, i)
        assert claimed == exact.rn32(mp_erf(xs[i]))
        assert check(adj, case, i, claimed, entries), "an honest claim must stand"
        c, e = variant(rng, case, i, claimed, entries)
        check(adj, case, i, c, e)
        assert not check(adj, case, i, exact.neighbour(claimed, True), entries)


def test_honest_logged_erf_element_stands_and_a_cheat_is_convicted_on_chain(adj) -> None:
    """An honest ERF element with an ``up`` entry (and its negative, ``down``) stands on-chain; the
    cheating trainer's other neighbour, unlogged, logged the other way or explicit, is convicted."""
    xs = [HARD[0], HARD[0] | SIGN]
    case = elementwise_case(xs)
    codes = []
    for i in range(2):
        claimed, entries = honest(case, i)
        assert claimed == exact.rn32(mp_erf(xs[i]))
        assert entries and entries[0].code in (exact.UP, exact.DOWN)
        codes.append(entries[0].code)
        assert check(adj, case, i, claimed, entries), "an honest logged ERF claim must stand"
        cheat = exact.neighbour(claimed, entries[0].code == exact.DOWN)  # the other side of the midpoint
        assert not check(adj, case, i, cheat, [LogEntry(i, 3 - entries[0].code, 0)])
        assert not check(adj, case, i, cheat, [LogEntry(i, exact.EXPLICIT, cheat)])
        assert not check(adj, case, i, cheat, [])
    assert codes == [exact.UP, exact.DOWN]


def test_every_hard_erf_element_is_logged_and_stands_in_the_mirror() -> None:
    case = elementwise_case(HARD + [b | SIGN for b in HARD])
    for i in range(case.numel):
        claimed, entries = honest(case, i)
        assert entries and claimed == exact.rn32(mp_erf(int(case.inputs[0].view(np.uint32)[i])))
        entry = entries[0]
        assert exact.judge_element(case.desc, case.inputs, i, claimed, entry)
        other = exact.neighbour(claimed, entry.code == exact.DOWN)
        assert not exact.judge_element(case.desc, case.inputs, i, other, LogEntry(i, 3 - entry.code, 0))


# ---------------------------------------------------------------------------------------------
# The auditor's resolver and the graph


def test_auditor_resolver_overrules_a_wrong_unlogged_erf_value() -> None:
    rng = np.random.default_rng(9)
    xs = random_bits(rng, 8) + HARD[:2]
    case = elementwise_case(xs)
    want = [exact.rn32(mp_erf(b)) for b in xs]
    ctx = SimpleNamespace(graph=SimpleNamespace(descriptors={0: case.desc.encode()}))
    op = OpNode(0, K.ERF, (0,), case.desc.shape, ())
    overruled: list[tuple[int, int]] = []
    resolve = exact_resolver(ctx, overruled)(op, [torch.from_numpy(case.inputs[0])])
    proposed = np.array([exact.neighbour(w, not w & SIGN) if i % 2 else w for i, w in enumerate(want)],
                        np.uint32).view(np.float32)
    got = resolve(np.arange(len(xs), dtype=np.int64), proposed, np.zeros(len(xs), np.uint8)).view(np.uint32)
    assert [int(g) for g in got] == want
    assert overruled == [(0, i) for i in range(1, len(xs), 2)]


def test_erf_backward_is_two_over_sqrt_pi_exp_minus_x_squared() -> None:
    """The graph's gradient of sum(erf(w x)) w.r.t. w, evaluated in FP64, equals torch autograd's (the
    FP32 constant 2/sqrt(pi) costs at most 2^-24 relative)."""
    g = GraphBuilder()
    w = g.input("w", (5,))
    x = g.data((5,))
    loss = g.sum(g.reshape(g.erf(g.mul(w, x)), (1, 5)))
    (dw,) = g.grad(loss, [w])
    graph = g.build(loss, {0: dw.op})
    wt = torch.tensor([-2.0, -0.3, 0.1, 0.7, 3.0], dtype=torch.float64, requires_grad=True)
    xt = torch.tensor([1.0, 2.0, -1.5, 0.5, 1.25], dtype=torch.float64)
    vals = evaluate_fp64(graph, [wt.detach()], xt)
    torch.erf(wt * xt).sum().backward()
    got = vals[dw.op]
    assert torch.allclose(got, wt.grad, rtol=1e-7, atol=0)
    assert [op.kind for op in graph.ops].count(K.ERF) == 1 and K.EXP in [op.kind for op in graph.ops]


def test_the_adjudicator_and_transcendental_fit_eip170() -> None:
    """ERF's code lives in Transcendental, deployed by the Adjudicator's constructor: both runtimes stay under
    EIP-170 (24,576 bytes) and the Adjudicator's creation code, which embeds Transcendental's, under EIP-3860."""
    for name in ("Adjudicator", "Transcendental"):
        art = load_artifact(name)
        runtime = (len(art.deployed_bytecode) - 2) // 2
        assert 0 < runtime < 24_576, (name, runtime)
    assert (len(load_artifact("Adjudicator").bytecode) - 2) // 2 < 49_152
