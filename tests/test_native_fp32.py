"""The native FP32-exact kernel (csrc/numerics/fp32.c) against torch, bit for bit, and the executor
with it against the executor without it (the torch path).

The kernel computes one IEEE binary32 add/sub/mul/div per element, adds +0.0 (canonical zeros) and
reports finiteness in one pass; torch's ``op(a, b) + 0.0`` is the reference. Hard cases: subnormal
inputs and results, signed zeros, overflow to Inf, NaN, values at the extremes, random bit patterns,
broadcast and strided (view) operands, a scalar on either side.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vtrain.graph.executor as E
from vtrain.errors import NonFiniteValue
from vtrain.graph.executor import StepExecutor, state_tensors
from vtrain.graph.step_graph import GraphBuilder
from vtrain.models.nn import GPTConfig
from vtrain.models.optim import AdamWConfig
from vtrain.numerics import fp32_native as F
from vtrain.numerics.logfile import encode_step_log
from vtrain.training.loop import batch_for
from vtrain.training.spec import TrainSpec, build_job

pytestmark = pytest.mark.skipif(not F.available(), reason="native numerics kernels not built (make native)")

_TORCH = {F.ADD: torch.add, F.SUB: torch.sub, F.MUL: torch.mul, F.DIV: torch.div}
_NAMES = {F.ADD: "add", F.SUB: "sub", F.MUL: "mul", F.DIV: "div"}


def _hard_values(n: int, seed: int) -> torch.Tensor:
    """FP32 values mixing the edge cases with random bit patterns (all exponents, incl. subnormals)."""
    rng = np.random.default_rng(seed)
    f = np.float32
    special = np.array(
        [0.0, -0.0, 1.0, -1.0, f(2.0**-149), -f(2.0**-149), f(2.0**-126), f(2.0**-126) - f(2.0**-149),
         np.finfo(f).max, -np.finfo(f).max, f(3e38), f(1e-38), f(1.5), f(2.0**-75), f(2.0**64), f(2.0**-64),
         np.inf, -np.inf, np.nan, f(1.0) + f(2.0**-23), f(1.0) - f(2.0**-24), f(3.0), f(0.1)],
        dtype=f,
    )
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(f).copy()
    # a quarter near 1 (ties and near-ties of sums), a quarter subnormal
    q = n // 4
    x[:q] = (1.0 + rng.standard_normal(q) * 2.0**-20).astype(f)
    x[q : 2 * q] = (rng.integers(-(2**23), 2**23, q).astype(np.int32)).astype(np.float64).astype(f) * f(2.0**-149)
    x[2 * q : 2 * q + len(special)] = special
    return torch.from_numpy(rng.permutation(x))


def _same_bits(got: torch.Tensor, ref: torch.Tensor) -> None:
    ref = ref.contiguous()
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    g = got.view(torch.int32)[~nan]
    r = ref.view(torch.int32)[~nan]
    bad = (g != r).nonzero()
    assert not len(bad), f"{len(bad)} elements differ, first {got[~nan][bad[0]].item()} vs {ref[~nan][bad[0]].item()}"


@pytest.mark.parametrize("code", [F.ADD, F.SUB, F.MUL, F.DIV])
def test_the_kernel_gives_torch_bits_on_hard_values(code: int) -> None:
    n = 50_000
    a, b = _hard_values(n, 1 + code), _hard_values(n, 11 + code)
    # b's subnormals meet a's subnormals and ones, so products and quotients under/overflow
    got, finite = F.binary(code, a, b, (n,))
    ref = _TORCH[code](a, b) + 0.0
    _same_bits(got, ref)
    assert finite == bool(torch.isfinite(ref).all())
    assert not finite  # the hard values include Inf and NaN


@pytest.mark.parametrize("code", [F.ADD, F.SUB, F.MUL, F.DIV])
def test_finite_inputs_report_finite_and_match_torch(code: int) -> None:
    a, b = _hard_values(20_000, 3), _hard_values(20_000, 4)
    ok = torch.isfinite(a) & torch.isfinite(b) & (a.abs() < 1e18) & (b.abs() < 1e18) & (b.abs() > 1e-18)
    a, b = a[ok], b[ok]
    got, finite = F.binary(code, a, b, tuple(a.shape))
    ref = _TORCH[code](a, b) + 0.0
    _same_bits(got, ref)
    assert finite and bool(torch.isfinite(ref).all())


def test_division_is_rn32_of_the_exact_quotient() -> None:
    """Correctly rounded FP32 division = FP64 division rounded to FP32 (53 >= 2*24 + 2)."""
    a, b = _hard_values(50_000, 21), _hard_values(50_000, 22)
    got, _ = F.binary(F.DIV, a, b, tuple(a.shape))
    ref = (a.double() / b.double()).float() + 0.0
    _same_bits(got, ref)


def test_sqrt_gives_the_fp64_paths_bits() -> None:
    """RN32 of the FP64 square root (what _compute_fp64 + RN32 give) on every exponent, subnormals,
    -0, Inf, negatives (NaN, not finite)."""
    a = _hard_values(60_000, 31)
    got, finite = F.sqrt(a)
    ref = a.double().sqrt().to(torch.float32) + 0.0
    _same_bits(got, ref)
    assert not finite
    pos = a[torch.isfinite(a) & (a >= 0)].contiguous()
    got, finite = F.sqrt(pos)
    _same_bits(got, pos.double().sqrt().to(torch.float32) + 0.0)
    assert finite
    assert F.sqrt(torch.tensor([-0.0, 0.0]))[0].view(torch.int32).tolist() == [0, 0]
    assert F.sqrt(pos[::2]) is None  # strided: the caller takes the FP64 path


def test_negative_zero_results_are_canonical() -> None:
    t = torch.tensor
    m = F.binary(F.MUL, t([-0.0, 0.0, -(2.0**-149), -1.0]), t([1.0, -3.0, 2.0**-149, 0.0]), (4,))[0]
    a = F.binary(F.ADD, t([-0.0, -0.0]), t([-0.0, 0.0]), (2,))[0]
    s = F.binary(F.SUB, t([-0.0, 1.0]), t([0.0, 1.0]), (2,))[0]
    d = F.binary(F.DIV, t([-0.0, 2.0**-149, 0.0]), t([5.0, -(2.0**100), -1.0]), (3,))[0]
    for out in (m, a, s, d):
        assert out.view(torch.int32).tolist() == [0] * out.numel()
    # the reference itself has -0 before the +0.0
    assert torch.mul(t([-0.0]), t([1.0])).view(torch.int32).item() != 0


def test_broadcast_strided_and_scalar_operands() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 5, 6, generator=g)
    row = torch.randn(1, 1, 1, 6, generator=g)
    col = torch.randn(3, 1, 5, 1, generator=g)
    view = torch.randn(3, 5, 4, 6, generator=g).permute(0, 2, 1, 3)  # non-contiguous
    expanded = torch.randn(3, 1, 5, 6, generator=g).expand(3, 4, 5, 6)
    c = torch.tensor(0.37, dtype=torch.float32)
    shape = (3, 4, 5, 6)
    for code in (F.ADD, F.SUB, F.MUL, F.DIV):
        for a, b in ((x, row), (col, x), (x, view), (view, expanded), (x, c), (c, view), (row, col)):
            got, finite = F.binary(code, a, b, shape)
            assert got.is_contiguous() and tuple(got.shape) == shape and finite
            _same_bits(got, _TORCH[code](a, b).expand(shape) + 0.0)


def test_the_kernel_does_not_apply_to_other_dtypes() -> None:
    a = torch.ones(3, dtype=torch.float64)
    assert F.binary(F.ADD, a, a, (3,)) is None


# -- the executor with and without the kernel -------------------------------------------------------
def _bits(ts: list[torch.Tensor]) -> list[bytes]:
    return [t.contiguous().view(torch.int32).numpy().tobytes() for t in ts]


def _without_kernel(monkeypatch, graph, mode) -> StepExecutor:
    with monkeypatch.context() as m:
        m.setattr(F, "_FN", None)
        ex = StepExecutor(graph, mode)
    assert all(p.native is None for p in ex._plan)
    return ex


@pytest.mark.parametrize("mode", ["certified", "round-nolog"])
def test_executor_steps_are_the_same_with_and_without_the_kernel(monkeypatch, mode: str) -> None:
    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    fast = StepExecutor(job.graph, mode)
    assert any(p.native is not None for p in fast._plan)
    slow = _without_kernel(monkeypatch, job.graph, mode)
    sa = sb = state_tensors(job.initial_state)
    for s in (1, 2):
        data = batch_for(job, s)
        a, b = fast.run(sa, data, step=s), slow.run(sb, data, step=s)
        assert _bits(a.state) == _bits(b.state) and a.loss == b.loss
        if mode == "certified":
            assert encode_step_log(a.log, s, job.graph) == encode_step_log(b.log, s, job.graph)
            assert _bits(fast.run(sa, data, log_in=b.log, step=s).state) == _bits(a.state)
        sa, sb = a.state, b.state


def _overflowing_mul_graph():
    gb = GraphBuilder()
    x = gb.input("x", (2, 3))
    y = gb.mul_s(x, 2.0)  # op 1 overflows
    z = gb.mul(y, x)
    loss = gb.sum(gb.reshape(z, (1, 6)))
    gb.output(x, 0)
    return gb.build(loss)


def _negative_sqrt_graph():
    gb = GraphBuilder()
    x = gb.input("x", (2, 3))
    y = gb.sqrt(gb.mul_s(x, -1.0))  # op 2: NaN where x > 0
    loss = gb.sum(gb.reshape(y, (1, 6)))
    gb.output(x, 0)
    return gb.build(loss)


@pytest.mark.parametrize("make, first", [(_overflowing_mul_graph, "op 1 (MUL_S"), (_negative_sqrt_graph, "op 2 (SQRT")])
def test_a_non_finite_result_names_its_op_with_and_without_the_kernel(monkeypatch, make, first) -> None:
    g = make()
    state = [torch.tensor([[1.0, 2.0, 3e38], [4.0, 5.0, 6.0]], dtype=torch.float32)]
    msgs = []
    for ex in (StepExecutor(g, "certified"), _without_kernel(monkeypatch, g, "certified")):
        for hook in (None, lambda op, ins, out, log: out):  # deferred and eager paths
            with pytest.raises(NonFiniteValue) as e:
                ex.run(state, torch.zeros(g.data_shape), step=3, op_hook=hook)
            msgs.append(str(e.value))
    assert len(set(msgs)) == 1, msgs
    assert msgs[0].startswith(f"step 3, {first}") and "expected finite values" in msgs[0]


def test_nested_concats_are_copied_once_with_the_same_bits() -> None:
    """The flat optimizer buffers (a CONCAT of CONCATs) are built in one copy on the plain path and
    in two on the eager path (an op hook sees every op's tensor); same state, loss and log."""
    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    ex = StepExecutor(job.graph, "certified")
    inner = {p.op.id for p in ex._plan if p.cls == E._PLAN_PARTS}
    assert len(inner) >= 2
    seen = []

    def spy(op, ins, out, log):
        if op.id in inner:
            seen.append(isinstance(out, torch.Tensor))
        return out

    state = state_tensors(job.initial_state)
    data = batch_for(job, 1)
    plain, eager = ex.run(state, data, step=1), ex.run(state, data, step=1, op_hook=spy)
    assert seen and all(seen)
    assert _bits(plain.state) == _bits(eager.state) and plain.loss == eager.loss
    assert encode_step_log(plain.log, 1, job.graph) == encode_step_log(eager.log, 1, job.graph)


def test_recycled_buffers_give_the_same_bits(monkeypatch) -> None:
    """Dead native outputs read only by rounding ops are reused by later native ops (here from one
    element on, not 1M); the steps keep the bits of the executor without the kernel."""
    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    monkeypatch.setattr(E, "_RECYCLE_MIN", 1)
    fast = StepExecutor(job.graph, "certified")
    assert sum(len(p.recycle) for p in fast._plan) >= 20
    slow = _without_kernel(monkeypatch, job.graph, "certified")
    reused = []
    binary = F.binary

    def spy(code, a, b, shape, out=None):
        reused.append(out is not None)
        return binary(code, a, b, shape, out)

    monkeypatch.setattr(F, "binary", spy)
    sa = sb = state_tensors(job.initial_state)
    for s in (1, 2):
        data = batch_for(job, s)
        a, b = fast.run(sa, data, step=s), slow.run(sb, data, step=s)
        assert _bits(a.state) == _bits(b.state) and a.loss == b.loss
        assert encode_step_log(a.log, s, job.graph) == encode_step_log(b.log, s, job.graph)
        sa, sb = a.state, b.state
    assert sum(reused) >= 20


def test_a_buffer_still_viewed_is_never_recycled(monkeypatch) -> None:
    """x's only consumer is a RESHAPE (a view of x): x's buffer must outlive it, though a later
    native op of the same size (y) looks for a free one. (Two guards: the plan recycles only values
    read by rounding ops alone, and a live view keeps the tensor's refcount above 2; this test and
    the one above fail with both removed.)"""
    gb = GraphBuilder()
    a, b = gb.input("a", (4, 6)), gb.input("b", (4, 6))
    x = gb.mul(a, b)
    view = gb.reshape(x, (6, 4))
    y = gb.add(a, b)
    z = gb.sub(gb.reshape(y, (6, 4)), view)
    loss = gb.sum(gb.reshape(z, (1, 24)))
    gb.output(a, 0)
    gb.output(b, 1)
    g = gb.build(loss)
    monkeypatch.setattr(E, "_RECYCLE_MIN", 1)
    state = [torch.arange(24, dtype=torch.float32).reshape(4, 6) + 1, torch.full((4, 6), 0.5)]
    got = StepExecutor(g, "certified").run(state, torch.zeros(g.data_shape), step=1)
    ref = _without_kernel(monkeypatch, g, "certified").run(state, torch.zeros(g.data_shape), step=1)
    assert got.loss == ref.loss == float(((state[0] + 0.5) - state[0] * 0.5).sum())



@pytest.fixture(params=[0, 1], ids=["tiles", "avx2"])
def transpose_simd(request: pytest.FixtureRequest):
    """Run with the scalar tiles and with the AVX2 8 x 8 blocks (where the CPU has them)."""
    import ctypes

    from vtrain.numerics import native

    f = native.lib().vt_transpose_set_simd
    f.restype, f.argtypes = ctypes.c_int, [ctypes.c_int]
    f(request.param)
    yield request.param
    f(1)


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (16, 16), (17, 33), (256, 64), (3, 2, 31, 18), (0, 4), (2, 0, 3),
                                   (8, 8), (9, 8), (8, 9), (2, 24, 40), (64, 7), (7, 64)])
def test_transpose_is_torchs_copy_bit_for_bit(shape: tuple[int, ...], transpose_simd: int) -> None:
    """``vt_transpose32`` (PERMUTE of the last two axes) copies every bit pattern where torch's
    ``transpose(-1, -2).contiguous()`` puts it (NaN payloads and signed zeros included), at tile
    and 8 x 8 block edges and with leading batch axes, with and without AVX2; a non-contiguous
    input is left to torch."""
    rng = np.random.default_rng(len(shape) + sum(shape))
    a = torch.from_numpy(rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(np.float32))
    got = F.transpose(a)
    ref = a.transpose(-1, -2).contiguous()
    assert got is not None and got.shape == ref.shape and got.is_contiguous()
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
    view = a.transpose(-1, -2)
    if not view.is_contiguous():
        assert F.transpose(view) is None
    n = a.dim()
    assert F.swaps_last_two((*range(n - 2), n - 1, n - 2)) and not F.swaps_last_two(tuple(range(n)))


# -- fused chains (vt_fp32_chain) -------------------------------------------------------------------
def _chain_reference(steps, inputs: list[torch.Tensor], shape) -> tuple[list[torch.Tensor], bool]:
    """The chain's registers one op at a time through the single-op kernels (binary, sqrt)."""
    regs = list(inputs)
    finite = True
    for code, a, b in steps:
        if code == F.SQRT:
            out, ok = F.sqrt(regs[a].expand(shape).contiguous())
        else:
            out, ok = F.binary(code, regs[a], regs[b], shape)
        regs.append(out)
        finite = finite and ok
    return regs, finite


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_chain_gives_each_ops_bits(seed: int) -> None:
    """Random chains of add/sub/mul/div/sqrt over hard values, scalars (either side), one value per
    row, a repeated tile and a broadcast view, crossing the kernel's 1024-element blocks: every output
    the bits of the single-op kernels, the same finiteness."""
    rng = np.random.default_rng(seed)
    shape = (5, 7, 100)
    n = 3500
    full = [_hard_values(n, seed).reshape(shape), _hard_values(n, seed + 10).abs().reshape(shape)]
    rows = _hard_values(200, seed + 20)[:35].reshape(5, 7, 1)
    tile = _hard_values(700, seed + 30).reshape(1, 7, 100)
    view = _hard_values(200, seed + 40)[:5].reshape(5, 1, 1).expand(shape)
    inputs = [*full, torch.tensor([[[0.9]]], dtype=torch.float32), torch.tensor(1e-8).reshape(()), rows, tile, view]
    kinds = [(shape, F.FULL, n), (shape, F.FULL, n), ((1, 1, 1), F.SCALAR, 1), ((), F.SCALAR, 1),
             ((5, 7, 1), F.ROWS, 100), ((1, 7, 100), F.TILE, 700), ((5, 1, 1), F.ROWS, 700)]
    for src, kind, param in kinds:
        assert F.broadcast_kind(src, shape) == (kind, param) or src == ()
    scalars = {2, 3}
    steps = [(F.MUL, 0, 4), (F.SUB, 5, 1), (F.ADD, 6, 0), (F.DIV, 2, 0), (F.SUB, 3, 1)]  # every input read
    for k in range(5, 14):
        hi = len(inputs) + k
        code = int(rng.integers(0, 5))
        a = int(rng.integers(0, hi))
        while code == F.SQRT and a in scalars:
            a = int(rng.integers(0, hi))
        b = int(rng.integers(0, hi))
        if a in scalars and b in scalars:
            b = 0
        steps.append((code, a, b))
    outputs = sorted({len(inputs) + k for k in range(14) if k % 3 == 2 or k < 5} | {len(inputs) + 13})
    chain = F.Chain(shape, kinds, steps, outputs)
    got, finite = chain(inputs)
    regs, ref_finite = _chain_reference(steps, inputs, shape)
    for r, t in zip(outputs, got, strict=True):
        _same_bits(t, regs[r])  # (NaN payloads aside: a NaN never leaves a step, it reruns eagerly)
    assert finite == ref_finite
    assert chain([inputs[0].transpose(0, 1).contiguous().transpose(0, 1), *inputs[1:]]) is None  # strided


def test_a_chain_reports_a_non_finite_inner_value() -> None:
    """An Inf that only an inner (never written) value holds still makes the chain report non-finite."""
    a = torch.tensor([1.0, 3e38, 2.0], dtype=torch.float32)
    c = torch.tensor(10.0).reshape(())
    chain = F.Chain((3,), [((3,), F.FULL, 3), ((), F.SCALAR, 1)], [(F.MUL, 0, 1), (F.DIV, 2, 2)], [3])
    (out,), finite = chain([a, c])  # (a*10) / (a*10): Inf/Inf inside
    assert not finite and torch.isnan(out[1]) and out[0] == 1.0


def test_fused_groups_keep_the_steps_bits(monkeypatch) -> None:
    """The trainer's plain steps run chains of FP32-exact ops fused (most of AdamW's update, the
    elementwise backward); the same states, losses and logs as the op-by-op loop (a trace turns
    fusion off), and as the executor without the kernels."""
    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    ex = StepExecutor(job.graph, "certified")
    fused = [p.group for p in ex._plan if p.group is not None and p.group is not E._FUSED_MEMBER]
    assert len(fused) >= 20 and max(len(x.members) for x in fused) >= 16
    calls = []
    run_group = ex._run_group
    monkeypatch.setattr(ex, "_run_group", lambda *a: (calls.append(1), run_group(*a))[1])
    slow = _without_kernel(monkeypatch, job.graph, "certified")
    sa = sb = sc = state_tensors(job.initial_state)
    for s in (1, 2, 3):
        data = batch_for(job, s)
        a, b = ex.run(sa, data, step=s), ex.run(sb, data, step=s, keep_trace=True)
        c = slow.run(sc, data, step=s)
        assert _bits(a.state) == _bits(b.state) == _bits(c.state) and a.loss == b.loss == c.loss
        assert encode_step_log(a.log, s, job.graph) == encode_step_log(b.log, s, job.graph)
        assert a.stats.values == b.stats.values
        sa, sb, sc = a.state, b.state, c.state
    assert len(calls) == 3 * len(fused)


def test_a_fused_group_falls_back_to_its_ops_on_a_strided_input(monkeypatch) -> None:
    """Where the chain kernel does not take an input (here: none at all), the group's members run one
    by one: the same bits."""
    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    ex = StepExecutor(job.graph, "certified")
    state, data = state_tensors(job.initial_state), batch_for(job, 1)
    ref = ex.run(state, data, step=1)
    monkeypatch.setattr(F.Chain, "__call__", lambda self, inputs, empty=None: None)
    got = ex.run(state, data, step=1)
    assert _bits(got.state) == _bits(ref.state) and got.loss == ref.loss
    assert encode_step_log(got.log, 1, job.graph) == encode_step_log(ref.log, 1, job.graph)


def test_a_fused_groups_fallback_still_finds_a_non_finite_value(monkeypatch) -> None:
    """A group (MUL_S then MUL, its Inf only written to the state) through its members one by one and
    torch's FP32 ops (chain and single-op kernels refused): the deferred NaN/Inf probes still catch
    the Inf and the eager rerun names op 1."""
    gb = GraphBuilder()
    x = gb.input("x", (2, 3))
    z = gb.mul(gb.mul_s(x, 2.0), x)  # op 1 overflows; z is only written to the state (no later check)
    gb.output(z, 0)
    g = gb.build(gb.sum(gb.reshape(x, (1, 6))))
    ex = StepExecutor(g, "certified")
    assert any(p.group is not None and p.group is not E._FUSED_MEMBER for p in ex._plan)
    monkeypatch.setattr(F.Chain, "__call__", lambda self, inputs, empty=None: None)
    monkeypatch.setattr(F, "binary", lambda *a, **k: None)
    state = [torch.tensor([[1.0, 2.0, 3e38], [4.0, 5.0, 6.0]], dtype=torch.float32)]
    with pytest.raises(NonFiniteValue) as e:
        ex.run(state, torch.zeros(g.data_shape), step=3)
    assert str(e.value).startswith("step 3, op 1 (MUL_S")


@pytest.mark.parametrize("shape", [(3, 4, 5, 2), (2, 0, 3), (8, 9, 16), (1, 17, 1, 9)])
def test_block_swap_permutes_are_torchs_copy_bit_for_bit(shape: tuple[int, ...], transpose_simd: int) -> None:
    """Every permutation that swaps two blocks of axes after kept leading ones (attention's head
    split and merge, ``(2, 0, 1)``, ``(2, 3, 0, 1)``) goes through the transpose kernel with torch's
    ``permute(...).contiguous()`` bits; the others are left to torch."""
    import itertools

    rng = np.random.default_rng(sum(shape))
    for n in range(1, len(shape) + 1):
        a = torch.from_numpy(rng.integers(0, 2**32, shape[:n], dtype=np.uint64).astype(np.uint32).view(np.float32))
        for perm in itertools.permutations(range(n)):
            got, ref = F.permute(a, perm), a.permute(*perm).contiguous()
            if F.block_swap(perm) is None:
                assert got is None
                continue
            assert got is not None and got.shape == ref.shape
            assert torch.equal(got.view(torch.int32), ref.view(torch.int32)), perm
    assert F.block_swap((2, 0, 1)) == (0, 2) and F.block_swap((0, 2, 1, 3)) is None


def test_replays_run_the_fused_groups_with_the_trainers_bits(monkeypatch) -> None:
    """Plain and checked replays run the fused groups too: the same states, losses and (no)
    violations as the op-by-op loop (a trace turns fusion off). A log with an entry on a direct-FP32
    op (only a tampered one has it) runs op by op, and that op is flagged as before."""
    from vtrain.numerics.rounding import Code, OpLog

    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    ex = StepExecutor(job.graph, "certified")
    n_groups = sum(1 for p in ex._plan if p.group is not None and p.group is not E._FUSED_MEMBER)
    calls = []
    run_group = ex._run_group
    monkeypatch.setattr(ex, "_run_group", lambda *a: (calls.append(1), run_group(*a))[1])
    state = state_tensors(job.initial_state)
    for s in (1, 2):
        data = batch_for(job, s)
        trained = ex.run(state, data, step=s)
        for check in (False, True):
            calls.clear()
            a = ex.run(state, data, log_in=trained.log, step=s, check=check)
            assert len(calls) == n_groups
            b = ex.run(state, data, log_in=trained.log, step=s, check=check, keep_trace=True)
            assert _bits(a.state) == _bits(b.state) == _bits(trained.state) and a.loss == b.loss == trained.loss
            assert a.violations == b.violations == []
        state = trained.state
    # a forged entry on a fused member: that step runs unfused and the entry is reported
    member = next(p.op for p in ex._plan if p.group is E._FUSED_MEMBER)
    data = batch_for(job, 3)
    trained = ex.run(state, data, step=3)
    forged = trained.log
    forged.sparse[member.id] = OpLog(np.array([0], dtype=np.int64), np.array([int(Code.UP)], dtype=np.uint8),
                                     np.zeros(1, dtype=np.float32))
    calls.clear()
    a = ex.run(state, data, log_in=forged, step=3, check=True)
    b = ex.run(state, data, log_in=forged, step=3, check=True, keep_trace=True)
    assert not calls and [op for op, _ in a.violations] == [member.id] and a.violations == b.violations
    assert _bits(a.state) == _bits(b.state)


def test_an_eager_run_names_the_op_of_a_fused_groups_non_finite_value() -> None:
    """The chain kernel finds the Inf: the deferred run's caller reruns eagerly, where the group runs
    op by op and the error names op 1 as the unfused loop does (a checked replay is eager at once)."""
    gb = GraphBuilder()
    x = gb.input("x", (2, 3))
    z = gb.mul(gb.mul_s(x, 2.0), x)  # op 1 overflows
    gb.output(z, 0)
    g = gb.build(gb.sum(gb.reshape(x, (1, 6))))
    ex = StepExecutor(g, "certified")
    assert any(p.group is not None and p.group is not E._FUSED_MEMBER for p in ex._plan)
    state = [torch.tensor([[1.0, 2.0, 3e38], [4.0, 5.0, 6.0]], dtype=torch.float32)]
    with pytest.raises(NonFiniteValue) as e:
        ex.run(state, torch.zeros(g.data_shape), step=3)
    assert str(e.value).startswith("step 3, op 1 (MUL_S")


def test_a_chain_reads_rows_and_tiles_longer_than_its_blocks() -> None:
    """One value per row and a repeated tile whose rows and tiles span several 1024-element blocks (the
    kernel copies them run by run): the bits of torch's broadcast add."""
    shape = (3, 2500)
    rows = _hard_values(100, 50)[-3:].reshape(3, 1)
    tile = _hard_values(2500, 51).reshape(1, 2500)
    full = _hard_values(7500, 52).reshape(shape)
    kinds = [((3, 1), F.ROWS, 2500), ((1, 2500), F.TILE, 2500), (shape, F.FULL, 7500)]
    assert [F.broadcast_kind(src, shape) for src, _, _ in kinds] == [(k, p) for _, k, p in kinds]
    chain = F.Chain(shape, kinds, [(F.ADD, 0, 2), (F.ADD, 1, 2)], [3, 4])
    (got_rows, got_tile), _ = chain([rows, tile, full])
    _same_bits(got_rows, (rows.expand(shape) + full) + 0.0)
    _same_bits(got_tile, (tile.expand(shape) + full) + 0.0)
