"""The certified rounding rule: bounds hold against exact arithmetic, and a replay with the log
reproduces the trainer's FP32 outputs bit for bit under any admissible FP64 difference."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtrain.errors import CorruptLog, NonFiniteValue
from vtrain.graph.executor import StepLog, _compute_fp64
from vtrain.graph.step_graph import OpKind, OpNode
from vtrain.numerics.logfile import decode_step_log, encode_step_log
from vtrain.numerics.rounding import Code, Mode, OpLog, U, apply_log, gamma, pack_trits, round_output, unpack_trits

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def f32(mant: int, exp: int, sign: int) -> np.float32:
    """An FP32 value from parts; exponents span subnormals to near overflow."""
    return np.float32(((-1) ** sign) * np.ldexp(np.float64(mant), exp))


fp32s = st.builds(f32, st.integers(0, 2**24 - 1), st.integers(-149, 30), st.integers(0, 1))
moderate = st.builds(f32, st.integers(0, 2**24 - 1), st.integers(-60, 10), st.integers(0, 1))


def _exact_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    return sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)), Fraction(0))


def _op(kind: OpKind, shape, inputs=(0, 1)) -> OpNode:
    return OpNode(2, kind, tuple(inputs), tuple(shape))


@SETTINGS
@given(st.lists(st.tuples(fp32s, fp32s), min_size=1, max_size=40), st.booleans())
def test_matmul_fp64_value_is_within_the_certified_bound_of_the_exact_dot(pairs, cancel) -> None:
    a = np.array([p[0] for p in pairs], np.float32)
    b = np.array([p[1] for p in pairs], np.float32)
    if cancel:  # add the exact negation of every product: the exact result is 0 plus one term
        a = np.concatenate([a, -a, a[:1]])
        b = np.concatenate([b, b, b[:1]])
    A = torch.from_numpy(a).reshape(1, -1)
    B = torch.from_numpy(b).reshape(1, -1)
    v, d = _compute_fp64(_op(OpKind.MATMUL, (1, 1)), [A, B])
    e = _exact_dot(a, b)
    s_exact = sum((abs(Fraction(float(x)) * Fraction(float(y))) for x, y in zip(a, b)), Fraction(0))
    dc = Fraction(gamma(len(a))) * s_exact  # the contract's bound
    assert abs(Fraction(float(v.item())) - e) <= dc
    assert Fraction(float(d.item())) >= dc  # the trainer's bound covers the contract's
    from vtrain.graph.executor import bound_is_tight

    if bool(bound_is_tight(_op(OpKind.MATMUL, (1, 1)), d).all()):
        assert Fraction(float(d.item())) <= Fraction(5, 4) * dc


@SETTINGS
@given(st.lists(st.tuples(fp32s, fp32s), min_size=1, max_size=40), st.booleans(), st.booleans(), st.booleans())
def test_matmul_norm_bound_covers_the_exact_error_and_the_tight_bound(pairs, cancel, bias, sparse) -> None:
    """The canonical trainer's Cauchy-Schwarz bound (``bound="norm"``): the same FP64 value, and on
    every element what the candidate filter needs (vtrain.numerics.canonical): ``|v - e| <= d`` and
    ``Dc <= 1.5 d`` (``Dc = 5/4 gamma_n (S + n 2^-149)``, ``S = sum |t|`` exact), with a bias, exact
    cancellation, subnormals and one-hot-like sparse rows (where it is loosest)."""
    a = np.array([p[0] for p in pairs], np.float32)
    b = np.array([p[1] for p in pairs], np.float32)
    if cancel:
        a = np.concatenate([a, -a, a[:1]])
        b = np.concatenate([b, b, b[:1]])
    A = np.stack([a, a[::-1].copy(), np.where(np.arange(a.size) % 3 == 0, a, 0) if sparse else -a])  # [3, K]
    B = np.stack([b, np.roll(b, 1)])  # [2, K]
    ins = [torch.from_numpy(A), torch.from_numpy(B)]
    if bias:
        ins.append(torch.from_numpy(np.array([b[0], -a[0]], np.float32)))
    op = OpNode(len(ins), OpKind.MATMUL, tuple(range(len(ins))), (3, 2))
    v, d = _compute_fp64(op, ins)
    v_norm, d_norm = _compute_fp64(op, ins, "norm")
    v_none, d_none = _compute_fp64(op, ins, "none")
    assert torch.equal(v, v_norm) and torch.equal(v, v_none) and d_none is None
    for i in range(3):
        for j in range(2):
            t = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(A[i], B[j], strict=True)]
            if bias:
                t.append(Fraction(float(ins[2][j])))
            n, dn = len(t), Fraction(float(d_norm[i, j]))
            g = Fraction(n, 2**53 - n)  # gamma_n, exactly
            big_s = sum((abs(x) for x in t), Fraction(0))
            assert abs(Fraction(float(v_norm[i, j])) - sum(t, Fraction(0))) <= g * big_s <= dn
            assert Fraction(5, 4) * g * (big_s + n * Fraction(1, 2**149)) <= Fraction(3, 2) * dn


@SETTINGS
@given(st.lists(moderate, min_size=1, max_size=64), st.sampled_from([OpKind.SUM, OpKind.MEAN]))
def test_sum_and_mean_are_within_their_bounds(xs, kind) -> None:
    a = np.array(xs, np.float32)
    v, d = _compute_fp64(_op(kind, (1, 1), (0,)), [torch.from_numpy(a).reshape(1, -1)])
    e = sum((Fraction(float(x)) for x in a), Fraction(0))
    n = len(a)
    s = sum((abs(Fraction(float(x))) for x in a), Fraction(0))
    if kind == OpKind.MEAN:
        e /= n
        dc = (Fraction(gamma(n)) + 2 * Fraction(U)) * s / n
    else:
        dc = Fraction(gamma(n)) * s
    assert abs(Fraction(float(v.item())) - e) <= dc <= Fraction(float(d.item()))


@SETTINGS
@given(st.floats(-80, 80, width=32), st.sampled_from([OpKind.EXP, OpKind.TANH, OpKind.LOG, OpKind.ERF]))
def test_transcendentals_are_within_four_ulps_of_the_exact_function(x, kind) -> None:
    """Within the trainer's bound ``d`` (``4u|v|``; ERF ``8u|v|``)."""
    if kind == OpKind.LOG:
        x = abs(x) + 1e-30
    a = torch.tensor([np.float32(x)], dtype=torch.float32)
    v, d = _compute_fp64(_op(kind, (1,), (0,)), [a])
    mpmath.mp.prec = 200
    fn = {OpKind.EXP: mpmath.exp, OpKind.TANH: mpmath.tanh, OpKind.LOG: mpmath.log, OpKind.ERF: mpmath.erf}[kind]
    e = fn(mpmath.mpf(float(a.item())))
    assert abs(mpmath.mpf(float(v.item())) - e) <= mpmath.mpf(float(d.item()))


def _near_midpoint_values(n: int, rng: np.random.Generator) -> torch.Tensor:
    """FP64 values sitting very close to FP32 rounding midpoints (the hard cases)."""
    r = rng.standard_normal(n).astype(np.float32)
    up = np.nextafter(r, np.float32(np.inf))
    mid = (r.astype(np.float64) + up.astype(np.float64)) / 2
    off = rng.standard_normal(n) * np.abs(mid) * 2.0**-45
    off[: n // 10] = 0.0  # exact ties
    return torch.from_numpy(mid + off)


@pytest.mark.parametrize("rel_bound", [0.0, 2.0**-50, 2.0**-40, 2.0**-30, 2.0**-26])
def test_replay_reproduces_the_trainer_for_any_difference_within_two_bounds(rel_bound: float) -> None:
    rng = np.random.default_rng(1)
    v = torch.cat([_near_midpoint_values(4000, rng), torch.from_numpy(rng.standard_normal(4000))])
    d = v.abs() * rel_bound
    out, entries = round_output(v, d, "test")
    for trial in range(6):
        frac = [1.0, -1.0, 0.0][trial] if trial < 3 else None
        delta = (2.0 * d) * (torch.from_numpy(rng.uniform(-1, 1, v.numel())) if frac is None else frac)
        vp = v + delta
        while bool(((vp - v).abs() > 2.0 * d).any()):  # keep the FP64 sum inside the admissible range
            vp = torch.where((vp - v).abs() > 2.0 * d, torch.nextafter(vp, v), vp)
        replayed = apply_log(vp, d, entries, "test")
        assert torch.equal(replayed.view(torch.int32), out.view(torch.int32)), f"trial {trial}"
    if rel_bound > 0:
        assert len(entries) > 0
        assert set(np.unique(entries.code)) <= {1, 2, 3}


def test_replay_without_the_log_diverges_on_the_same_inputs() -> None:
    """The control: the same perturbations without the log flip some roundings."""
    rng = np.random.default_rng(2)
    v = _near_midpoint_values(4000, rng)
    d = v.abs() * 2.0**-40
    out, _ = round_output(v, d, "test")
    flipped = (v + 2.0 * d).to(torch.float32) != out
    assert int(flipped.sum()) > 0


def test_split_k_and_permuted_sums_replay_bit_exactly_with_the_log() -> None:
    """Other reduction orders (split-K, reversed, blocked) stand in for other hardware."""
    rng = np.random.default_rng(3)
    M, N, K = 64, 48, 512
    a = (rng.standard_normal((M, K)) * np.exp(rng.uniform(-8, 8, (M, K)))).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    b[:, : K // 2] = -b[:, K // 2 :]  # heavy cancellation for many elements
    a[:, : K // 2] = a[:, K // 2 :]
    a[:, 0] += np.float32(1e-3)
    A, B = torch.from_numpy(a), torch.from_numpy(b)
    op = _op(OpKind.MATMUL, (M, N))
    v, d = _compute_fp64(op, [A, B])
    out, entries = round_output(v, d, "matmul")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    orders = {
        "split-k-4": sum(a64[:, i::4] @ b64[:, i::4].T for i in range(4)),
        "reversed": a64[:, ::-1] @ b64[:, ::-1].T,
        "sequential": np.add.reduce(a64[:, None, :] * b64[None, :, :], axis=2),
    }
    differs = 0
    for name, alt in orders.items():
        vt = torch.from_numpy(np.ascontiguousarray(alt))
        differs += int((vt != v).sum())
        rep = apply_log(vt, d, entries, name)
        assert torch.equal(rep.view(torch.int32), out.view(torch.int32)), name
    assert differs > 0  # the orders really produce different FP64 values


def test_exact_ops_never_log_and_ties_go_to_even() -> None:
    a = torch.tensor([1.0, 1.0 + 2.0**-23], dtype=torch.float64)
    tie = a + 2.0**-24  # exactly halfway between FP32 neighbours
    out, entries = round_output(tie, None, "add")
    assert len(entries) == 0
    assert out.tolist() == [1.0, 1.0 + 2.0**-22]


def test_two_midpoints_in_reach_force_an_explicit_entry() -> None:
    v = torch.tensor([1.0 + 2.0**-24], dtype=torch.float64)
    d = torch.tensor([2.0**-24], dtype=torch.float64)  # reach covers both neighbours' midpoints
    out, entries = round_output(v, d, "wide")
    assert entries.code.tolist() == [Code.EXPLICIT]
    assert entries.value.tolist() == out.tolist()


def test_negative_zero_is_canonicalised() -> None:
    out, _ = round_output(torch.tensor([-0.0], dtype=torch.float64), None, "z")
    assert out.view(torch.int32).item() == 0


def test_non_finite_values_are_rejected_with_the_op_named() -> None:
    with pytest.raises(NonFiniteValue, match="EXP op 7"):
        round_output(torch.tensor([np.inf], dtype=torch.float64), None, "EXP op 7")


def test_trits_pack_five_per_byte_and_round_trip() -> None:
    t = np.random.default_rng(0).integers(0, 3, 1003).astype(np.uint8)
    packed = pack_trits(t)
    assert len(packed) == 201
    assert np.array_equal(unpack_trits(packed, 1003), t)


def _toy_graph():
    from vtrain.training.spec import TrainSpec, build_job

    return build_job(TrainSpec(model="mlp", batch_size=4)).graph


def test_step_log_round_trips_and_names_the_step_when_damaged() -> None:
    g = _toy_graph()
    mm = next(o.id for o in g.ops if o.kind == OpKind.MATMUL)
    log = StepLog(
        Mode.CERTIFIED,
        {mm: OpLog(np.array([1, 5, 9]), np.array([1, 2, 3], np.uint8), np.array([0, 0, 1.5], np.float32))},
    )
    data = encode_step_log(log, 7, g)
    back = decode_step_log(data, 7, g)
    assert back.sparse[mm].index.tolist() == [1, 5, 9]
    assert back.sparse[mm].code.tolist() == [1, 2, 3]
    assert back.sparse[mm].value.tolist() == [0, 0, 1.5]
    with pytest.raises(CorruptLog, match="step 7"):
        decode_step_log(data[:-3], 7, g)
    with pytest.raises(CorruptLog, match="expected step 8"):
        decode_step_log(data, 8, g)
    garbled = bytearray(data)
    garbled[len(data) // 2] ^= 0xFF  # the op table
    with pytest.raises(CorruptLog):
        decode_step_log(bytes(garbled), 7, g)


@pytest.mark.parametrize("kind", [OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.ADD_S, OpKind.MUL_S, OpKind.RSUB_S,
                                  OpKind.DIV, OpKind.DIV_S])
def test_direct_fp32_single_ops_equal_fp64_then_round_bit_for_bit(kind: OpKind) -> None:
    """The executor's FP32 fast path for single IEEE ops gives exactly RN32 of the exact value (for
    DIV on the CPU too: FP64 carries 53 >= 2*24 + 2 bits, so RN32(RN64(a/b)) = RN32(a/b), and torch's
    FP32 CPU division is correctly rounded, so both paths give the same bits; its FP32 sqrt is not,
    see the test below)."""
    from vtrain.graph.executor import compute_exact_fp32
    from vtrain.graph.step_graph import f32_bits

    rng = np.random.default_rng(7)
    n = 20000
    mant = rng.integers(0, 2**24, n)
    a = (mant * np.exp2(rng.integers(-160, 100, n)) * rng.choice([-1, 1], n)).astype(np.float32)
    b = (rng.integers(0, 2**24, n) * np.exp2(rng.integers(-160, 100, n)) * rng.choice([-1, 1], n)).astype(np.float32)
    b[:2000] = np.nextafter(a[:2000], np.float32(np.inf))  # near-cancellation
    b[2000:4000] = a[2000:4000] * np.float32(2.0**-24)  # exact ties for ADD
    b[4000:6000] = np.exp2(rng.integers(1, 30, 2000)).astype(np.float32)  # DIV: exact quotients, subnormal ties
    a[4000:5000] = (rng.integers(1, 2**10, 1000) * 2.0**-149).astype(np.float32)
    b[6000:7000] = (rng.integers(1, 2**12, 1000) * 2.0**-149).astype(np.float32)  # subnormal divisors
    with np.errstate(all="ignore"):
        q = a.astype(np.float64) / b.astype(np.float64)
    ok = np.isfinite(a) & np.isfinite(b) & np.isfinite(a.astype(np.float64) * b.astype(np.float64)) & np.isfinite(q)
    A, B = torch.from_numpy(a[ok]), torch.from_numpy(b[ok])
    scalar = kind in (OpKind.ADD_S, OpKind.MUL_S, OpKind.RSUB_S, OpKind.DIV_S)
    attrs = (f32_bits(-0.7071067811865476),) if scalar else ()
    op = OpNode(2, kind, (0,) if scalar else (0, 1), tuple(A.shape), attrs)
    ins = [A] if scalar else [A, B]
    fast = compute_exact_fp32(op, ins) + 0.0
    v, d = _compute_fp64(op, ins)
    finite = torch.isfinite(v.to(torch.float32))
    ref, _ = round_output(v[finite], None, "ref")
    assert d is None
    assert torch.equal(fast[finite].view(torch.int32), ref.view(torch.int32))


def test_sqrt_stays_on_the_fp64_path_because_torch_fp32_sqrt_is_not_correctly_rounded() -> None:
    """Why SQRT is not in the FP32 fast path: torch's FP32 CPU sqrt (MKL VML) differs from RN32(sqrt)."""
    from vtrain.graph.executor import FP32_EXACT_CPU_KINDS

    rng = np.random.default_rng(7)
    a = torch.from_numpy((rng.integers(0, 2**24, 20000) * np.exp2(rng.integers(-160, 100, 20000))).astype(np.float32))
    ref, _ = round_output(torch.sqrt(a.double()), None, "ref")
    assert OpKind.SQRT not in FP32_EXACT_CPU_KINDS
    assert torch.equal(ref, torch.from_numpy(np.sqrt(a.numpy())))  # numpy's FP32 sqrt is the IEEE one
    if torch.equal(torch.sqrt(a), ref):
        pytest.skip("this torch build's FP32 sqrt is correctly rounded here")


# --- the fast path equals the reference rule, bit for bit ---------------------------------------

def _assert_same_rounding(v: torch.Tensor, d: torch.Tensor | None, floor: float | None = None) -> None:
    from vtrain.numerics.rounding import round_output_reference

    ok = None if (floor is None or d is None) else d > floor
    out_ref, log_ref = round_output_reference(v, d, "ref", directed_ok=ok)
    out_fast, log_fast = round_output(v, d, "fast", directed_floor=floor)
    out_mask, log_mask = round_output(v, d, "fast", directed_ok=ok)
    for out, lg in ((out_fast, log_fast), (out_mask, log_mask)):
        assert torch.equal(out.view(torch.int32), out_ref.view(torch.int32))
        assert lg.index.tolist() == log_ref.index.tolist()
        assert lg.code.tolist() == log_ref.code.tolist()
        assert lg.value.view(np.int32).tolist() == log_ref.value.view(np.int32).tolist()
        assert lg.index.dtype == log_ref.index.dtype and lg.code.dtype == log_ref.code.dtype


def _adversarial_values(rng: np.random.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP64 values on, next to and around FP32 midpoints, powers of two, subnormals, zero and the
    largest finite FP32, with bounds from 0 to many spacings."""
    exps = rng.integers(-152, 128, n)
    mant = rng.integers(2**23, 2**24, n).astype(np.float64)
    mant[rng.random(n) < 0.2] = 2.0**23  # powers of two
    r = np.ldexp(mant, exps - 23).astype(np.float32)
    r[rng.random(n) < 0.05] = np.float32(0.0)
    r[rng.random(n) < 0.02] = np.float32(3.4028234663852886e38)
    r[rng.random(n) < 0.05] = np.float32(2.0**-126)
    sub = (rng.integers(1, 2**23, n) * 2.0**-149).astype(np.float32)
    r = np.where(rng.random(n) < 0.05, sub, r)  # subnormals
    r = np.where(rng.random(n) < 0.5, -r, r).astype(np.float32)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    r64 = r.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        mids = np.where(rng.random(n) < 0.5, (r64 + up) / 2, (r64 + dn) / 2)
    mids = np.where(np.isfinite(mids), mids, r64)
    pick = rng.random(n)
    v = np.where(pick < 0.3, mids, r64)
    ulp64 = np.abs(v) * 2.0**-52 + 2.0**-1074
    steps = rng.integers(-4, 5, n)
    v = np.where((pick >= 0.3) & (pick < 0.6), mids + steps * ulp64, v)  # a few FP64 ulps off a tie
    frac = rng.uniform(-0.6, 0.6, n)
    v = np.where(pick >= 0.85, r64 + frac * (up - r64), v)
    v = np.where(np.isfinite(v) & (np.abs(v) < 3.4028235e38), v, r64)
    spacing = np.abs(up - r64)
    spacing = np.where(np.isfinite(spacing), spacing, np.abs(r64 - dn))
    scale = np.exp2(rng.uniform(-60, 6, n)) * rng.choice([0.0, 1.0], n, p=[0.1, 0.9])
    d = spacing * scale
    d[rng.random(n) < 0.05] = np.exp2(rng.uniform(-1074, -900, 1))[0]
    return torch.from_numpy(v), torch.from_numpy(d)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1000, 20000])  # the numpy path for small ops and the torch filter
def test_fast_rounding_equals_the_reference_rule_on_adversarial_values(seed: int, n: int) -> None:
    rng = np.random.default_rng(100 + seed)
    v, d = _adversarial_values(rng, n)
    assert bool(torch.isfinite(v.to(torch.float32)).all())
    _assert_same_rounding(v, d)
    _assert_same_rounding(v, d, floor=float(d.median()))
    _assert_same_rounding(v, None)


@SETTINGS
@given(st.lists(st.tuples(fp32s, st.integers(-3, 3), st.floats(0, 64)), min_size=1, max_size=60))
def test_fast_rounding_equals_the_reference_rule_near_ties(items) -> None:
    """Values a few FP64 ulps from FP32 midpoints (and on them), reaches up to 64 spacings."""
    r = np.array([x[0] for x in items], np.float32)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    ok = np.isfinite(up)
    r, up = r[ok], up[ok]
    if not len(r):
        return
    mid = (r.astype(np.float64) + up) / 2
    k = np.array([x[1] for x in items])[ok]
    v = mid + k * np.abs(mid) * 2.0**-52
    v = np.where(np.abs(v) < 3.4028235e38, v, r.astype(np.float64))
    d = (up - r.astype(np.float64)) * np.exp2(-np.array([x[2] for x in items])[ok])
    _assert_same_rounding(torch.from_numpy(v), torch.from_numpy(d))


def test_fast_rounding_equals_the_reference_rule_on_real_matmuls() -> None:
    """The 512-term cancelling matmul above and the executor's MATMUL floor."""
    from vtrain.graph.executor import tight_floor

    rng = np.random.default_rng(3)
    a = (rng.standard_normal((64, 512)) * np.exp(rng.uniform(-30, 8, (64, 512)))).astype(np.float32)
    b = rng.standard_normal((48, 512)).astype(np.float32)
    b[:, :256] = -b[:, 256:]
    a[:, :256] = a[:, 256:]
    op = _op(OpKind.MATMUL, (64, 48))
    v, d = _compute_fp64(op, [torch.from_numpy(a), torch.from_numpy(b)])
    _assert_same_rounding(v, d, floor=tight_floor(op))


@pytest.mark.parametrize("n", [3, 10000])  # the numpy path and the torch filter
def test_fast_filter_reports_non_finite_values(n: int) -> None:
    for bad, at in ((np.nan, 1), (1e300, n - 1), (-np.inf, 0)):  # NaN, FP32 overflow, Inf
        v = torch.linspace(1.0, 2.0, n, dtype=torch.float64)
        v[at] = bad
        with pytest.raises(NonFiniteValue, match=f"MATMUL op 3: .*first flat index {at}"):
            round_output(v, torch.full((n,), 1e-20, dtype=torch.float64), "MATMUL op 3")
        later: list[torch.Tensor] = []
        round_output(v, torch.full((n,), 1e-20, dtype=torch.float64), "x", check_finite=later)
        assert later and not bool(torch.isfinite(torch.stack(later)).all())  # deferred: the step check fails
    later = []
    round_output(torch.linspace(1.0, 2.0, n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64), "x",
                 check_finite=later)
    assert all(bool(torch.isfinite(t)) for t in later)


def test_min_half_spacing_is_the_smaller_half_gap_everywhere() -> None:
    from vtrain.numerics.rounding import min_half_spacing

    rng = np.random.default_rng(5)
    bits = np.concatenate([rng.integers(0, 0x7F800000, 200000), [0, 1, 0x007FFFFF, 0x00800000, 0x00800001,
                                                                   0x01000000, 0x3F800000, 0x7F7FFFFF]])
    r = bits.astype(np.uint32).view(np.float32)
    r = np.concatenate([r, -r])
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    r64 = r.astype(np.float64)
    want = np.minimum(up - r64, r64 - dn) / 2  # inf at +-max finite is never the smaller
    got = min_half_spacing(torch.from_numpy(r)).numpy()
    assert np.array_equal(got, want)


def test_fast_near_tie_search_equals_the_reference() -> None:
    from vtrain.numerics.rounding import unlogged_near_ties, unlogged_near_ties_reference

    rng = np.random.default_rng(9)
    v, d = _adversarial_values(rng, 20000)
    rf = v.to(torch.float32)
    _, entries = round_output(v, d, "x")
    for log in (entries, OpLog.empty()):
        assert np.array_equal(unlogged_near_ties(v, d, rf, log), unlogged_near_ties_reference(v, d, rf, log))


def test_finite_probe_is_finite_exactly_when_every_element_is() -> None:
    """The deferred NaN/Inf check (min and max): no false alarm on huge finite values (a -FLT_MAX
    attention mask over millions of elements, where an FP32 sum would overflow), and any NaN or
    infinity anywhere, in FP32 or FP64, makes it fail."""
    from vtrain.numerics.rounding import all_finite, finite_probe

    big = torch.full((1 << 20,), -3.4028234663852886e38, dtype=torch.float32)
    big[::3] = 3.4028234663852886e38
    assert all_finite(big) and bool(torch.isfinite(torch.stack(finite_probe(big))).all())
    assert all_finite(torch.zeros(0))
    for dtype in (torch.float32, torch.float64):
        for bad in (float("nan"), float("inf"), -float("inf")):
            for at in (0, 777, (1 << 16) - 1):
                x = torch.linspace(-1.0, 1.0, 1 << 16, dtype=dtype)
                x[at] = bad
                assert not all_finite(x)
                assert not bool(torch.isfinite(torch.stack(finite_probe(x))).all())
