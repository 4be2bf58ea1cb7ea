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
@given(st.floats(-80, 80, width=32), st.sampled_from([OpKind.EXP, OpKind.TANH, OpKind.LOG]))
def test_transcendentals_are_within_four_ulps_of_the_exact_function(x, kind) -> None:
    if kind == OpKind.LOG:
        x = abs(x) + 1e-30
    a = torch.tensor([np.float32(x)], dtype=torch.float32)
    v, d = _compute_fp64(_op(kind, (1,), (0,)), [a])
    mpmath.mp.prec = 200
    fn = {OpKind.EXP: mpmath.exp, OpKind.TANH: mpmath.tanh, OpKind.LOG: mpmath.log}[kind]
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
    garbled[30] ^= 0xFF
    with pytest.raises(CorruptLog):
        decode_step_log(bytes(garbled), 7, g)


@pytest.mark.parametrize("kind", [OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.ADD_S, OpKind.MUL_S, OpKind.RSUB_S])
def test_direct_fp32_single_ops_equal_fp64_then_round_bit_for_bit(kind: OpKind) -> None:
    """The executor's FP32 fast path for single IEEE ops gives exactly RN32 of the exact value."""
    from vtrain.graph.executor import compute_exact_fp32
    from vtrain.graph.step_graph import f32_bits

    rng = np.random.default_rng(7)
    n = 20000
    mant = rng.integers(0, 2**24, n)
    a = (mant * np.exp2(rng.integers(-160, 100, n)) * rng.choice([-1, 1], n)).astype(np.float32)
    b = (rng.integers(0, 2**24, n) * np.exp2(rng.integers(-160, 100, n)) * rng.choice([-1, 1], n)).astype(np.float32)
    b[:2000] = np.nextafter(a[:2000], np.float32(np.inf))  # near-cancellation
    b[2000:4000] = a[2000:4000] * np.float32(2.0**-24)  # exact ties for ADD
    ok = np.isfinite(a) & np.isfinite(b) & np.isfinite(a.astype(np.float64) * b.astype(np.float64))
    A, B = torch.from_numpy(a[ok]), torch.from_numpy(b[ok])
    scalar = kind in (OpKind.ADD_S, OpKind.MUL_S, OpKind.RSUB_S)
    op = OpNode(2, kind, (0,) if scalar else (0, 1), tuple(A.shape), (f32_bits(-0.7071067811865476),) if scalar else ())
    ins = [A] if scalar else [A, B]
    fast = compute_exact_fp32(op, ins) + 0.0
    v, d = _compute_fp64(op, ins)
    finite = torch.isfinite(v.to(torch.float32))
    ref, _ = round_output(v[finite], None, "ref")
    assert d is None
    assert torch.equal(fast[finite].view(torch.int32), ref.view(torch.int32))
