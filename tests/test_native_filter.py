"""The native rounding + candidate filter (csrc/numerics/filter.c) against its numpy reference
(``rounding.midpoint_candidates_np``) on adversarial values, for each form of the reach and both
SIMD levels; and whole steps with the library on and off: the same losses, states, logs and
replay checks."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vtrain.graph import executor as E
from vtrain.graph.step_graph import OpKind
from vtrain.numerics import native
from vtrain.numerics import native_filter as NF
from vtrain.numerics.canonical import _BAND, candidates
from vtrain.numerics.rounding import _CMP_SLACK, OpLog, U, apply_log, midpoint_candidates_np, round_output

pytestmark = pytest.mark.skipif(not native.available(), reason="native numerics kernels not built (make native)")

F32 = np.float32
SCALES = (_BAND, 2.0 * _CMP_SLACK)


@pytest.fixture(params=[0, 1, 2], ids=["base", "avx2", "avx512"])
def simd(request: pytest.FixtureRequest):
    """Run the test with the base-ISA loops, the AVX2 ones and the AVX-512 ones (where the CPU has them)."""
    f = native.lib().vt_filter_set_simd
    f.restype, f.argtypes = ctypes.c_int, [ctypes.c_int]
    f(request.param)
    yield request.param
    f(2)  # the best level the CPU has


def _adversarial(seed: int = 0) -> np.ndarray:
    """FP64 values at and around FP32 midpoints and the awkward places of the FP32 grid."""
    rng = np.random.default_rng(seed)
    r = np.concatenate([
        rng.standard_normal(300).astype(F32),
        (rng.standard_normal(100) * 1e-40).astype(F32),  # FP32 subnormals
        np.array([0, 2.0**-149, 2**-148, 2.0**-126, 2.0**-126 - 2.0**-149, 1, 2, 0.5, 2.0**127, 2.0**-125,
                  np.finfo(F32).max, np.finfo(F32).tiny, 3.0, 1.5, 65504], dtype=F32),
        np.ldexp(1.0, rng.integers(-149, 128, 100)).astype(F32),  # powers of two: the asymmetric gap
    ])
    r = np.concatenate([r, -r])
    inf = F32(np.inf)
    with np.errstate(over="ignore"):
        up, dn = np.nextafter(r, inf), np.nextafter(r, -inf)
    r64, up64, dn64 = r.astype(np.float64), up.astype(np.float64), dn.astype(np.float64)
    m_hi, m_lo = (r64 + up64) / 2, (r64 + dn64) / 2  # exact FP32 midpoints (inf beyond FP32 max)
    parts = [r64, m_hi, m_lo]
    for m in (m_hi, m_lo):
        parts += [np.nextafter(m, np.inf), np.nextafter(m, -np.inf)]  # one FP64 ulp either side
    gap = up64 - r64
    parts.append(r64 + gap * rng.uniform(-0.5, 0.5, len(r)))
    parts.append(np.array([0.0, -0.0, 5e-324, -5e-324, 2.0**-150, -(2.0**-150), 3 * 2.0**-150, 2.0**-151,
                           np.inf, -np.inf, np.nan, 1e300, -1e300, 3.4028235677973366e38, 3.4028235677973362e38,
                           float(np.finfo(F32).max) + 2.0**103, 2.0**128, 1e-320]))
    v = np.concatenate(parts)
    return v[np.isfinite(v) | ~np.isfinite(v)]  # keep NaN/Inf on purpose


def _reach_scales(v: np.ndarray, seed: int = 1) -> np.ndarray:
    """Bounds ``d`` from none to huge: 0, subnormal, relative to |v| at several sizes, inf, NaN."""
    rng = np.random.default_rng(seed)
    with np.errstate(invalid="ignore", over="ignore"):
        rel = np.abs(v) * np.ldexp(1.0, rng.integers(-60, -20, len(v)))
    pick = rng.integers(0, 6, len(v))
    d = np.where(pick == 0, 0.0, rel)
    d = np.where(pick == 1, 5e-324, d)
    d = np.where(pick == 2, 2.0**-140, d)
    d = np.where(pick == 3, 1e300, d)
    d[::97] = np.inf
    d[::101] = np.nan
    return d


def _reference(v: np.ndarray, reach: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(over="ignore"):
        r = v.astype(F32) + F32(0.0)
    return r, midpoint_candidates_np(v, r, reach)


def _check(v: np.ndarray, r: torch.Tensor, cand: np.ndarray, finite: bool, reach: np.ndarray) -> None:
    r_ref, cand_ref = _reference(v, reach)
    assert np.array_equal(r.numpy().reshape(-1).view(np.uint32), r_ref.view(np.uint32))
    np.testing.assert_array_equal(cand, cand_ref)
    assert finite == bool(np.isfinite(r_ref).all())


@pytest.mark.parametrize("scale", SCALES)
def test_dense_reach_gives_the_reference_rounding_and_candidates(simd, scale: float) -> None:
    v = _adversarial()
    d = _reach_scales(v)
    for dd in (d, np.zeros_like(d), np.full_like(d, 2.0**-200)):
        r, cand, finite = NF.round_filter(torch.from_numpy(v), torch.from_numpy(dd), scale)
        _check(v, r, cand, finite, dd * scale)
    assert 0 < len(cand) < len(v)  # the values are adversarial: some are in reach, others are not


def _around_reach(c: float, seed: int = 3) -> np.ndarray:
    """FP64 values ``k`` FP64 ulps from FP32 midpoints, ``k`` up to 64: for a relative bound ``c |v|``
    (``c = 4u``) the reach ``c |v| scale`` is 8-16 ulps at ``scale = 4`` and 4-8 at ``scale = 2``, so
    these fall below, between and beyond 1x-4x the reach, where a wrong scale moves the candidate set."""
    rng = np.random.default_rng(seed)
    r = np.concatenate([rng.standard_normal(200), np.ldexp(1.0, rng.integers(-120, 120, 50))]).astype(F32)
    r = np.concatenate([r, -r])
    m = (r.astype(np.float64) + np.nextafter(r, F32(np.inf)).astype(np.float64)) / 2
    k = rng.integers(-64, 65, len(m)).astype(np.float64)
    return m + k * np.spacing(np.abs(m))


@pytest.mark.parametrize("scale", SCALES)
def test_relative_reach_is_the_executors_transcendental_bound(simd, scale: float) -> None:
    c = 4.0 * U
    v = np.concatenate([_adversarial(2), _around_reach(c)])
    bound = NF.RelativeBound(torch.from_numpy(v), c)
    with np.errstate(invalid="ignore"):
        dense = c * np.abs(v)
    assert np.array_equal(bound.dense().numpy(), dense, equal_nan=True)
    idx = np.arange(len(v))
    assert np.array_equal(NF.bound_at(bound, idx), dense, equal_nan=True)
    r, cand, finite = NF.round_filter(torch.from_numpy(v), bound, scale)
    _check(v, r, cand, finite, dense * scale)
    # the values can tell the scale: 1/2, 4/5, 5/4 or 2 times it gives another candidate set
    for wrong in (scale / 2, scale * 0.8, scale * 1.25, scale * 2, 1.0):
        assert not np.array_equal(_reference(v, dense * wrong)[1], cand), wrong


@pytest.mark.parametrize("k", [1, 7, 8, 9, 64, 127, 128, 129, 300, 1000])
def test_row_norms_are_numpys_pairwise_norms(k: int) -> None:
    """``vt_row_norms`` gives numpy's ``sqrt((x * x).sum(-1))`` bit for bit (its pairwise summation,
    at the widths where the blocking changes), also on a transposed view and on wide-range values."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((5, 13, k)) * np.ldexp(1.0, rng.integers(-140, 120, (5, 13, 1)))).astype(F32)
    x64 = torch.from_numpy(x.astype(np.float64))
    x32 = torch.from_numpy(x)
    for t in (x64, x64.transpose(0, 1), x32, x32.transpose(0, 1)):  # read as FP64 and as FP32
        ref = np.sqrt((np.ascontiguousarray(t.numpy(), dtype=np.float64) ** 2).sum(axis=-1, keepdims=True))
        got = NF.row_norms(t)
        assert got.shape == (*t.shape[:-1], 1)
        assert np.array_equal(got.numpy(), ref)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("batched", ["no", "same", "broadcast"])
def test_norm_reach_is_the_executors_norm_bound_never_materialised(simd, bias: bool, batched: str) -> None:
    rng = np.random.default_rng(3)
    m, n, k = 37, 45, 19
    lead = (3,) if batched == "same" else ()
    lead_b = (2, 3) if batched == "broadcast" else lead  # [M, K] @ [2, 3, N, K]^T
    a = torch.from_numpy((rng.standard_normal((*lead, m, k)) * rng.choice([1.0, 1e-30, 1e20], (*lead, m, 1)))
                         .astype(F32)).double()
    b = torch.from_numpy(rng.standard_normal((*lead_b, n, k)).astype(F32)).double()
    x = [a, b] + ([torch.from_numpy(rng.standard_normal(n).astype(F32)).double()] if bias else [])
    v = torch.matmul(x[0], x[1].transpose(-1, -2))
    # plant exact midpoints and their FP64 neighbours so the filter has something to find
    flat = v.reshape(-1)
    pos = rng.choice(flat.numel(), 200, replace=False)
    r = flat[pos].float()
    mids = (r.double() + torch.nextafter(r, torch.full_like(r, np.inf)).double()) / 2
    flat[pos[:100]] = mids[:100]
    flat[pos[100:]] = torch.nextafter(mids[100:], torch.full_like(mids[100:], -np.inf))
    v_ref = v.clone()
    d_ref = E._norm_bound([t.clone() for t in x], v_ref)  # the dense bound (adds the bias to v_ref)
    v_lazy = v.clone()
    bound = E._norm_bound(x, v_lazy, lazy=True)
    assert isinstance(bound, NF.NormBound)
    assert torch.equal(v_lazy, v_ref)
    assert np.array_equal(bound.dense().numpy(), d_ref.numpy())
    idx = np.arange(v.numel())
    assert np.array_equal(bound.at(idx), d_ref.numpy().reshape(-1))
    for scale in SCALES:
        r, cand, finite = NF.round_filter(v_lazy, bound, scale)
        _check(v_ref.numpy().reshape(-1), r, cand, finite, d_ref.numpy().reshape(-1) * scale)
        assert len(cand) > 0


@pytest.mark.parametrize("bias", [False, True])
def test_tight_reach_is_the_executors_tight_matmul_bound_never_materialised(simd, bias: bool) -> None:
    rng = np.random.default_rng(9)
    ins = [torch.from_numpy(rng.standard_normal(s).astype(F32)) for s in ((2, 33, 17), (2, 41, 17))]
    ins[0][0, :5] *= 1e-42  # products that underflow in the FP32 |A| @ |B|
    if bias:
        ins.append(torch.from_numpy(rng.standard_normal(41).astype(F32)))
    op = SimpleNamespace(kind=OpKind.MATMUL)
    v_ref, d_ref = E._compute_fp64(op, ins)  # type: ignore[arg-type]
    v, bound = E._compute_fp64(op, ins, lazy=True)  # type: ignore[arg-type]
    assert isinstance(bound, NF.TightBound) and torch.equal(v, v_ref)
    assert np.array_equal(bound.dense().numpy(), d_ref.numpy())
    assert np.array_equal(bound.at(np.arange(v.numel())), d_ref.numpy().reshape(-1))
    flat = v.reshape(-1)  # plant exact midpoints and one FP64 ulp below them
    r = flat[::7].float()
    mids = (r.double() + torch.nextafter(r, torch.full_like(r, np.inf)).double()) / 2
    flat[::7] = torch.where(torch.arange(len(r)) % 2 == 0, mids, torch.nextafter(mids, torch.zeros_like(mids)))
    for scale in SCALES:
        r, cand, finite = NF.round_filter(v, bound, scale)
        _check(v.numpy().reshape(-1), r, cand, finite, d_ref.numpy().reshape(-1) * scale)
        assert len(cand) > 0


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN])
def test_sum_and_mean_reach_is_the_executors_bound_never_materialised(simd, kind: OpKind) -> None:
    rng = np.random.default_rng(10)
    x = rng.standard_normal((64, 16)).astype(F32)
    x[:3] = 0.0
    x[0, :2] = [16.0, 2.0**-20]  # sums (and means) at FP32 midpoints: candidates
    x[1, :2] = [16.0, -(2.0**-21)]
    x[3:6] *= 1e-40
    op = SimpleNamespace(kind=kind)
    v_ref, d_ref = E._compute_fp64(op, [torch.from_numpy(x)])  # type: ignore[arg-type]
    v, bound = E._compute_fp64(op, [torch.from_numpy(x)], lazy=True)  # type: ignore[arg-type]
    assert isinstance(bound, NF.TightBound) and torch.equal(v, v_ref)
    assert np.array_equal(bound.dense().numpy().view(np.uint64), d_ref.numpy().view(np.uint64))
    assert np.array_equal(bound.at(np.arange(v.numel())).view(np.uint64), d_ref.numpy().reshape(-1).view(np.uint64))
    for scale in SCALES:
        r, cand, finite = NF.round_filter(v, bound, scale)
        _check(v.numpy().reshape(-1), r, cand, finite, d_ref.numpy().reshape(-1) * scale)
        assert len(cand) >= 2


def test_exact_ops_round_with_canonical_zeros_and_report_non_finite(simd) -> None:
    v = _adversarial(4)
    r, finite = NF.round_fp32(torch.from_numpy(v))
    with np.errstate(over="ignore"):
        ref = v.astype(F32) + F32(0.0)
    assert np.array_equal(r.numpy().view(np.uint32), ref.view(np.uint32))
    assert not finite
    r, finite = NF.round_fp32(torch.tensor([-0.0, 1.0, -(2.0**-151)], dtype=torch.float64))
    assert finite and r.numpy().view(np.uint32).tolist() == [0, 0x3F800000, 0]


def test_random_values_and_every_block_boundary(simd) -> None:
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 8, 9, 511, 512, 513, 1030, 5000):
        v = rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-140, 120, n))
        d = np.abs(v) * 2.0**-26  # wide reach: about one in ten elements is a candidate
        r, cand, finite = NF.round_filter(torch.from_numpy(v), torch.from_numpy(d), _BAND)
        _check(v, r, cand, finite, d * _BAND)


def test_the_base_and_simd_loops_agree(simd) -> None:
    v = _adversarial(6)
    d = _reach_scales(v, 7)
    r, cand, finite = NF.round_filter(torch.from_numpy(v), torch.from_numpy(d), _BAND)
    _check(v, r, cand, finite, d * _BAND)


def _without_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "_LIB", None)


def test_candidates_and_round_output_and_apply_log_are_the_numpy_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for on in (True, False):
        rng = np.random.default_rng(8)
        if not on:
            _without_native(monkeypatch)
        assert NF.usable(torch.zeros(1, dtype=torch.float64)) is on
        got = []
        for n in (300, 20000):  # the small (numpy) and the large (torch) paths of the fallback
            r = rng.standard_normal(n).astype(F32)
            mids = (r.astype(np.float64) + np.nextafter(r, F32(np.inf)).astype(np.float64)) / 2
            v = np.where(rng.random(n) < 0.05, mids, rng.standard_normal(n))
            v = torch.from_numpy(v)
            d = v.abs() * 2.0**-45
            got.append(candidates(v, d).numpy())
            out, log = round_output(v, d, "t", directed_floor=2.0**-120)
            got += [out.numpy().view(np.uint32), log.index, log.code, log.value.view(np.uint32)]
            out, log = round_output(v, NF.RelativeBound(v, 4.0 * U) if on else 4.0 * U * v.abs(), "t")
            got += [out.numpy().view(np.uint32), log.index, log.code]
            viol: list = []
            seen: list = []

            def resolver(keys, proposed, codes, flagged, seen=seen):
                seen.append((keys.copy(), proposed.view(np.uint32).copy(), codes.copy(), flagged.copy()))
                return proposed

            out_a = apply_log(v, d, log, "t", resolver, viol)
            got += [out_a.numpy().view(np.uint32), [(x.index, x.code) for x in viol]]
            got += [x for s in seen for x in s]
            forged = OpLog(np.array([3, 17], np.int64), np.array([1, 3], np.uint8), np.array([0, -0.0], F32))
            got.append(apply_log(v, d, forged, "t").numpy().view(np.uint32))
            got.append(apply_log(v, None, OpLog.empty(), "t").numpy().view(np.uint32))
            unlogged: list = []  # every near-tie unlogged: each one is reported
            got.append(apply_log(v, d, OpLog.empty(), "t", violations=unlogged).numpy().view(np.uint32))
            got.append([(x.index, x.code) for x in unlogged])
            assert len(unlogged) > 0
        results.append(got)
    for a, b in zip(*results, strict=True):
        if isinstance(a, list):
            assert a == b
        else:
            np.testing.assert_array_equal(a, b)


def test_a_non_finite_value_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain.errors import NonFiniteValue

    v = torch.from_numpy(np.array([1.0, np.nan, 2.0] * 2000))
    d = torch.full_like(v, 2.0**-60)
    for fn in (lambda: round_output(v, d, "t"), lambda: round_output(v, None, "t"),
               lambda: apply_log(v, d, OpLog.empty(), "t", violations=[]), lambda: apply_log(v, d, OpLog.empty(), "t")):
        with pytest.raises(NonFiniteValue):
            fn()
    sums: list = []
    round_output(v, d, "t", check_finite=sums)
    assert not bool(torch.isfinite(torch.stack(sums)).all())


def _steps(job, n: int, resolver_factory=None) -> list:
    from vtrain.graph.executor import state_tensors
    from vtrain.numerics.logfile import encode_step_log
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for

    ex = executor_for(job, "certified", "cpu")
    state = state_tensors(job.initial_state)
    out = []
    for s in range(1, n + 1):
        data = batch_for(job, s)
        res = ex.run(state, data, step=s)
        aud = ex.run(state, data, log_in=res.log, step=s, check=True, resolver_factory=resolver_factory)
        plain = ex.run(state, data, log_in=res.log, step=s)
        assert [t.numpy().tobytes() for t in plain.state] == [t.numpy().tobytes() for t in res.state]
        out += [res.stats.logged, res.loss, encode_step_log(res.log, s, job.graph),
                [t.numpy().tobytes() for t in res.state], [t.numpy().tobytes() for t in aud.state],
                [(o, x.index, x.code) for o, x in aud.violations]]
        state = res.state
    return out


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_training_and_checked_replay_are_the_same_with_and_without_the_library(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    from protocol.auditor import exact_resolver
    from vtrain.commit.trace import GraphCommitment
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.training.spec import TrainSpec, build_job

    if model == "gpt":
        spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4, steps=3, mode="certified",
                         gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16))
    else:
        spec = TrainSpec(model="mlp", batch_size=8, steps=3, mode="certified")
    job = build_job(spec)
    factory = exact_resolver(SimpleNamespace(graph=GraphCommitment.of(job.graph)))  # type: ignore[arg-type]
    with_lib = _steps(job, 3, factory)
    _without_native(monkeypatch)
    without = _steps(job, 3, factory)
    assert with_lib == without
    assert model == "mlp" or sum(with_lib[0::6]) > 0  # the GPT's steps log entries (replayed and checked)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt", "resnet", "gpt2"])
def test_the_demo_jobs_train_and_replay_the_same_with_and_without_the_library(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """The demo's GPT and the front end's ResNet and HF GPT-2 (a few steps each)."""
    from protocol.auditor import exact_resolver
    from protocol.demo import default_spec
    from vtrain.commit.trace import GraphCommitment
    from vtrain.training.spec import build_job

    job = build_job(default_spec(model))
    factory = exact_resolver(SimpleNamespace(graph=GraphCommitment.of(job.graph)))  # type: ignore[arg-type]
    with_lib = _steps(job, 3, factory)
    _without_native(monkeypatch)
    assert _steps(job, 3, factory) == with_lib


def test_lazy_bounds_only_where_the_filter_takes_v(monkeypatch: pytest.MonkeyPatch) -> None:
    op = SimpleNamespace(kind=OpKind.TANH)
    x = [torch.randn(4, 5)]
    _, d = E._compute_fp64(op, x, lazy=True)  # type: ignore[arg-type]
    assert isinstance(d, NF.RelativeBound)
    _, d = E._compute_fp64(op, x)  # type: ignore[arg-type]
    assert isinstance(d, torch.Tensor)  # the default (other callers do arithmetic on d)
    _without_native(monkeypatch)
    _, d = E._compute_fp64(op, x, lazy=True)  # type: ignore[arg-type]
    assert isinstance(d, torch.Tensor)


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN])
def test_sum_round_filter_is_its_numpy_reference(kind: OpKind) -> None:
    """``vt_sum_round_filter`` (the rows' FP64 pairwise sums, bound and filter in one pass) gives
    ``canonical.sum_round_filter_np``'s ``r`` and candidates bit for bit, at the widths where the
    pairwise blocking changes, on wide-range values, exact midpoints, cancellation and a NaN/Inf."""
    from vtrain.numerics.canonical import sum_bound_factor, sum_round_filter_np

    rng = np.random.default_rng(int(kind))
    for n in (1, 3, 7, 8, 9, 16, 127, 128, 129, 136, 257, 1000):
        x = (rng.standard_normal((41, n)) * np.ldexp(1.0, rng.integers(-140, 120, (41, 1)))).astype(F32)
        x[0] = 1.0
        x[2] = np.where(np.arange(n) % 2 == 0, F32(3e38), F32(-3e38))  # cancellation at the top of the range
        if n >= 3:  # value 1 + 2^-24 (a midpoint), and that plus 3/4 of the reach (MEAN: n times the terms)
            w = n if kind == OpKind.MEAN else 1
            x[1], x[5] = 0.0, 0.0
            x[1, :2] = x[5, :2] = (w, w * 2.0**-24)
            x[5, 2] = w * 0.75 * sum_bound_factor(kind, n) * w * _BAND
        if n > 3:
            x[3, 1], x[4, 2] = np.inf, np.nan
        ref_r, ref_c = sum_round_filter_np(x, kind)
        r, cand, finite = NF.sum_round_filter(torch.from_numpy(x.reshape(41, 1, n)), kind == OpKind.MEAN,
                                              sum_bound_factor(kind, n), _BAND)
        assert r.shape == (41, 1, 1)
        assert np.array_equal(r.numpy().reshape(-1).view(np.uint32), ref_r.view(np.uint32))
        assert np.array_equal(cand, ref_c)
        assert finite == bool(np.isfinite(ref_r).all())
        if n >= 3:
            assert {1, 5} <= set(cand.tolist())


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN], ids=["SUM", "MEAN"])
def test_sum_round_decide_is_the_filter_then_decide_into(kind: OpKind) -> None:
    """``sum_round_decide`` (one C call) against ``sum_round_filter`` then ``native_rows.decide_into``:
    the same ``r`` bits, candidates and finiteness, settled where ``decide_into`` settles (its bits
    written) and untouched where it does not (a midpoint needs an entry), not decided where some ``r``
    is not finite or there is no candidate; through a reused scratch as well."""
    from vtrain.numerics import native_rows
    from vtrain.numerics.canonical import sum_bound_factor
    from vtrain.numerics.scratch import Scratch

    rng = np.random.default_rng(11 + int(kind))
    scratch = Scratch()
    outcomes = set()
    for n in (1, 8, 9, 64, 200):
        for case in ("near", "tie", "inf", "plain"):
            x = (rng.standard_normal((23, n)) * np.ldexp(1.0, rng.integers(-20, 20, (23, 1)))).astype(F32)
            w = n if kind == OpKind.MEAN else 1
            if n >= 3 and case != "plain":  # a value near 1 + 2^-24 (decided), or on it (an entry is due)
                x[4], x[4, :3] = 0.0, (w, w * 2.0**-24, 0.0 if case == "tie" else w * 2.0**-60)
            if n >= 3 and case == "inf":
                x[7, 1] = np.inf
            t = torch.from_numpy(x)
            args = (t, kind == OpKind.MEAN, sum_bound_factor(kind, n), _BAND)
            r, cand, finite = NF.sum_round_filter(*args)
            want = None
            if finite and len(cand):
                want = native_rows.decide_into(kind, [t], torch.from_numpy(cand), r.reshape(-1))
            for s in (None, scratch):
                got_r, got_c, got_finite, attention = NF.sum_round_decide(*args, scratch=s)
                assert np.array_equal(got_c, cand) and got_finite == finite
                assert attention == (-1 if want is None else want), (n, case)
                assert torch.equal(got_r.view(torch.int32), r.view(torch.int32)), (n, case)  # (r: after decide_into)
            outcomes.add("settled" if want == 0 else "not decided" if want is None else "entry due")
    assert outcomes == {"settled", "not decided", "entry due"}


def test_sum_ops_of_the_canonical_trainer_match_the_fp64_path() -> None:
    """A SUM/MEAN op through the one-pass kernel (``round_canonical_sum``) and through ``_compute_fp64``
    with ``round_canonical``: the same outputs, entries and values, on rows with near-ties."""
    from vtrain.graph.step_graph import OpNode
    from vtrain.numerics.canonical import round_canonical, round_canonical_sum

    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 64)).astype(F32)
    x[:100, 1:] *= F32(2.0**-30)  # sums next to x[:, 0]
    x[:50] = 0.0  # 1 + 2^-24 + 2^-80 (k 2^-81): next to a midpoint, off the exact grid: entries
    x[:50, :3] = (1.0, 2.0**-24, 2.0**-80)
    x[:50, 3] = np.arange(50) * F32(2.0**-81)
    ins = [torch.from_numpy(x)]
    for kind in (OpKind.SUM, OpKind.MEAN):
        op = OpNode(1, kind, (0,), (300, 1))
        got = round_canonical_sum(None, op, ins, "op")  # type: ignore[arg-type]
        assert got is not None
        v, d = E._compute_fp64(op, ins, "norm", lazy=True)
        ref = round_canonical(None, op, ins, v, d, "op")  # type: ignore[arg-type]
        assert torch.equal(got[0].view(torch.int32), ref[0].view(torch.int32))
        assert len(ref[1]) > 0
        for field in ("index", "code", "value"):
            assert np.array_equal(getattr(got[1], field), getattr(ref[1], field))


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN])
def test_sum_values_are_their_numpy_reference(kind: OpKind) -> None:
    """``vt_sum_values_filter`` (the checked replay's SUM/MEAN ``v``, ``d`` and filter in one pass) gives
    ``canonical.sum_values_np``'s bits and ``midpoint_candidates_np``'s candidates of them at the widths
    where the pairwise blocking changes, on wide-range values, cancellation, near-ties and a NaN/Inf;
    and its ``r`` is ``vt_sum_round_filter``'s."""
    from vtrain.numerics.canonical import sum_bound_factor, sum_values_np

    rng = np.random.default_rng(10 + int(kind))
    for n in (1, 3, 7, 8, 9, 16, 127, 128, 129, 136, 257, 1000):
        x = (rng.standard_normal((41, n)) * np.ldexp(1.0, rng.integers(-140, 120, (41, 1)))).astype(F32)
        x[0] = 0.0
        x[2] = np.where(np.arange(n) % 2 == 0, F32(3e38), F32(-3e38))
        if n > 3:
            x[3, 1], x[4, 2] = np.inf, np.nan
        if n >= 3:  # near a midpoint: candidates
            x[5], x[6] = 0.0, 0.0
            x[5, :2] = x[6, :2] = (1.0, 2.0**-24)
            x[6, 2] = 2.0**-52  # within 2 d of the midpoint (d >= 1.01 g(3))
        ref_v, ref_d = sum_values_np(x, kind)
        for scale in SCALES:
            got = NF.sum_values_filter(torch.from_numpy(x.reshape(41, 1, n)), kind == OpKind.MEAN,
                                       sum_bound_factor(kind, n), scale)
            assert got is not None
            v, d, r, cand, finite = got
            assert v.shape == d.shape == r.shape == (41, 1, 1)
            assert np.array_equal(v.numpy().reshape(-1).view(np.uint64), ref_v.view(np.uint64))
            assert np.array_equal(d.numpy().reshape(-1).view(np.uint64), ref_d.view(np.uint64))
            with np.errstate(over="ignore", invalid="ignore"):
                ref_r = ref_v.astype(F32) + F32(0.0)
            assert np.array_equal(r.numpy().reshape(-1).view(np.uint32), ref_r.view(np.uint32))
            assert np.array_equal(cand, midpoint_candidates_np(ref_v, ref_r, ref_d * scale))
            assert finite == bool(np.isfinite(ref_r).all())
            if n >= 3 and kind == OpKind.SUM:
                assert {5, 6} <= set(cand.tolist())
        r2, _, _ = NF.sum_round_filter(torch.from_numpy(x), kind == OpKind.MEAN, sum_bound_factor(kind, n), _BAND)
        assert np.array_equal(ref_r.view(np.uint32), r2.numpy().reshape(-1).view(np.uint32))


def _tampered_sum_logs(log: OpLog, n_out: int, rng: np.random.Generator) -> list[OpLog]:
    """The honest log of a SUM op and ways to abuse it: each entry's code flipped, explicit values moved
    one FP32 step, entries dropped, and directed/explicit entries added on elements far from a tie."""
    logs = [log, OpLog.empty()]
    flip = log.code.copy()
    flip[flip == 1], flip[flip == 2] = 9, 1
    flip[flip == 9] = 2
    logs.append(OpLog(log.index, flip, log.value))
    moved = np.where(log.code == 3, np.nextafter(log.value, F32(np.inf)), log.value).astype(F32)
    logs.append(OpLog(log.index, log.code, moved))
    logs.append(OpLog(log.index[::2], log.code[::2], log.value[::2]))
    extra = np.setdiff1d(np.union1d(rng.choice(n_out, 40, replace=False), np.arange(60, 70)), log.index)
    for code in (1, 2, 3):
        idx = np.union1d(log.index, extra)
        codes = np.full(len(idx), code, np.uint8)
        vals = np.where(codes == 3, F32(0.5), F32(0.0)).astype(F32)
        pos = np.searchsorted(idx, log.index)
        codes[pos], vals[pos] = log.code, log.value
        logs.append(OpLog(idx.astype(np.int64), codes, vals))
    return logs


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN])
def test_the_checked_replay_of_a_sum_from_the_kernel_is_the_torch_paths(kind: OpKind) -> None:
    """A SUM/MEAN op's checked replay from ``replay_sum_values`` (one native pass, with its exact-grid
    rule and near-tie flags at the candidates) and from ``_compute_fp64`` (torch's FP64 sums, FP32
    ``sum|x|``): the same output bits, the same violations and the same calls to the resolver, on the
    honest log (near-ties, exact-grid rows) and on tampered ones."""
    from functools import partial

    from vtrain.graph.step_graph import OpNode
    from vtrain.numerics.canonical import grid_elements, replay_sum_values, round_canonical_sum, sum_values_np

    rng = np.random.default_rng(7)
    x = rng.standard_normal((300, 64)).astype(F32)
    x[:100, 1:] *= F32(2.0**-30)
    x[:50] = 0.0  # next to a midpoint, off the exact grid: entries
    x[:50, :3] = (1.0, 2.0**-24, 2.0**-80)
    x[:50, 3] = np.arange(50) * F32(2.0**-81)
    x[50:60] = 0.0  # an exact midpoint on the exact grid: no entry, and not a suspect
    x[50:60, :2] = (1.0, 2.0**-24)
    w = 64.0 if kind == OpKind.MEAN else 1.0  # 1 + 2^-24 + 1.5 d and + 3 d: within 2 d and 4 d of the midpoint
    x[60:70] = 0.0
    x[60:70, :2] = (w, w * 2.0**-24)
    x[60:70, 2] = w * sum_values_np(x[60:61], kind)[1][0] * np.repeat([1.5, 3.0], 5)
    ins = [torch.from_numpy(x)]
    op = OpNode(1, kind, (0,), (300, 1))
    honest = round_canonical_sum(None, op, ins, "op")  # type: ignore[arg-type]
    assert honest is not None and len(honest[1]) > 0
    got = replay_sum_values(op, ins)
    assert got is not None
    v_ref, d_ref = E._compute_fp64(op, ins, "tight", lazy=True)
    for log in _tampered_sum_logs(honest[1], 300, rng):
        seen = []
        for v, d, filtered, exact, near in (got[:5], (v_ref, d_ref, None, partial(grid_elements, op, ins), None)):
            calls: list[tuple[np.ndarray, ...]] = []

            def resolver(keys, proposed, codes, flagged, calls=calls):
                calls.append((keys.copy(), proposed.view(np.uint32).copy(), codes.copy(), flagged.copy()))
                return proposed

            viol: list = []
            out = apply_log(v, d, log, "op", resolver, viol, exact=exact, filtered=filtered, near=near)
            seen.append((out.view(torch.int32).numpy().copy(), [(x.index, x.code, x.detail) for x in viol], calls))
        (o1, v1, c1), (o2, v2, c2) = seen
        assert np.array_equal(o1, o2)
        assert v1 == v2
        assert len(c1) == len(c2)
        for a, b in zip(c1, c2, strict=True):
            assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert v1  # the last log (explicit entries far from a tie) is caught
