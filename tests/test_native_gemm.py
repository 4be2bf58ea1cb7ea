"""A certified MATMUL's FP64 products in one native call (``csrc/numerics/gemm.c`` via
``vtrain.numerics.native_gemm``): the widened operands multiplied by torch's own dgemm give
``torch.matmul``'s FP64 bits, special values included; what the kernel does not take is refused,
not miscomputed; and certified steps are the same with it on and off (states, logs, replays)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.numerics import native_gemm

pytestmark = pytest.mark.skipif(not native_gemm.available(),
                                reason="native products unavailable (make native; torch without MKL)")

SHAPES = [
    ((1, 1), (1, 1)),
    ((7, 3), (5, 3)),
    ((256, 64), (192, 64)),  # the small GPT's attention input projection
    ((64, 256), (256, 256)),  # a weight gradient
    ((33, 65), (17, 65)),
    ((3, 9, 5), (3, 4, 5)),
    ((8, 4, 32, 16), (8, 4, 32, 16)),  # attention scores
    ((2, 2, 32, 32), (2, 2, 16, 32)),
]


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a.double(), b.double().transpose(-1, -2))


@pytest.mark.parametrize("sa,sb", SHAPES, ids=[f"{sa}x{sb}" for sa, sb in SHAPES])
def test_products_are_torch_matmuls_bits(sa, sb) -> None:
    """Bitwise ``torch.matmul`` of the widened operands, at 2-D and batched shapes, with wide exponents."""
    rng = np.random.default_rng(len(sa) * 100 + sa[-1] + sb[-2])
    a = torch.from_numpy((rng.standard_normal(sa) * 2.0 ** rng.integers(-30, 30, sa)).astype(np.float32))
    b = torch.from_numpy((rng.standard_normal(sb) * 2.0 ** rng.integers(-30, 30, sb)).astype(np.float32))
    got = native_gemm.Products()(a, b)
    want = _reference(a, b)
    assert got is not None and got.shape == want.shape and got.dtype == torch.float64 and got.is_contiguous()
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))


def test_special_values_give_torchs_products() -> None:
    """NaN, +-Inf, -0 and subnormal operands: the same NaN positions and the same bits elsewhere."""
    a = torch.tensor([[1.0, float("nan"), 0.0], [float("inf"), 1.0, -0.0], [1e-45, -1e-45, 3.0]])
    b = torch.tensor([[1.0, 0.0, 2.0], [-0.0, -0.0, -0.0], [1e-45, 1.0, float("-inf")]])
    got, want = native_gemm.Products()(a, b), _reference(a, b)
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(got[keep].view(torch.int64), want[keep].view(torch.int64))


def test_the_buffers_are_reused_and_grown() -> None:
    """One call's ``v`` lives in the buffers the next call writes (valid until then); a larger MATMUL
    grows them and still gives torch's bits."""
    p = native_gemm.Products()
    a, b = torch.randn(4, 3), torch.randn(5, 3)
    first = p(a, b)
    again = p(torch.randn(4, 3), b)
    assert first.data_ptr() == again.data_ptr()
    big_a, big_b = torch.randn(40, 30), torch.randn(50, 30)
    big = p(big_a, big_b)
    assert torch.equal(big, _reference(big_a, big_b))


def test_what_the_kernel_does_not_take_is_refused() -> None:
    """None (the caller's torch path) for non-contiguous or non-FP32 operands, different batch or
    inner sizes, empty operands and buffers past ``MAX_BYTES``; never a wrong product."""
    p = native_gemm.Products()
    a, b = torch.randn(6, 4), torch.randn(5, 4)
    assert p(a.t().contiguous().t(), b) is None  # (a transposed view)
    assert p(a.double(), b) is None
    assert p(a, torch.randn(5, 3)) is None
    assert p(torch.randn(2, 6, 4), torch.randn(3, 5, 4)) is None
    assert p(torch.randn(0, 4), b) is None
    side = int((native_gemm.MAX_BYTES // 8) ** 0.5) + 1
    assert p(torch.randn(side, 2), torch.randn(side, 2)) is None  # (v would pass MAX_BYTES)
    assert torch.equal(p(a, b), _reference(a, b))


def test_steps_are_the_same_with_the_native_products_on_and_off(monkeypatch) -> None:
    """Certified small-GPT steps (states, encoded logs) and their checked and plain replays with the
    native products and with torch's path alone; and the native path is the one taken."""
    from vtrain.graph.executor import state_tensors
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.numerics.logfile import encode_step_log
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for, component_roots
    from vtrain.training.spec import TrainSpec, build_job

    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4, steps=2, mode="certified",
                     gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16))
    job = build_job(spec)

    def steps() -> list:
        ex = executor_for(job, "certified")
        state, out = state_tensors(job.initial_state), []
        for s in (1, 2):
            res = ex.run(state, batch_for(job, s), step=s)
            rep = ex.run(state, batch_for(job, s), log_in=res.log, step=s, check=True)
            plain = ex.run(state, batch_for(job, s), log_in=res.log, step=s)  # (no bound: _run_op's products)
            out.append((component_roots(res.state), encode_step_log(res.log, s, job.graph),
                        component_roots(rep.state), len(rep.violations), component_roots(plain.state)))
            state = res.state
        return out

    calls = []
    real = native_gemm._PRODUCTS

    def counted(*args):
        calls.append(args[2:6])
        return real(*args)

    monkeypatch.setattr(native_gemm, "_PRODUCTS", counted)
    on = steps()
    n_matmuls = sum(op.kind.name == "MATMUL" for op in job.graph.ops)
    assert len(calls) == 2 * 3 * n_matmuls, "every MATMUL of the trainer and both replays takes the native products"
    monkeypatch.setattr(native_gemm, "_PRODUCTS", None)
    off = steps()
    assert on == off
    assert all(roots == rep == plain and violations == 0 for roots, _, rep, violations, plain in on)
