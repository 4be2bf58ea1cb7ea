"""vtrain.torch_ref: plain torch FP32 training computes the same model as the step graph.

The reference uses fused torch kernels and torch.optim, so it agrees with the controlled modes
only to FP32 accuracy (never bit for bit); these tests pin the math (layout, init, data, loss,
optimizer) and the slot-order state interface, and that ``mode='fp32'`` runs through it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.errors import VtrainError
from vtrain.graph.executor import StepExecutor, state_tensors
from vtrain.models.nn import GPTConfig, MLPConfig
from vtrain.models.optim import AdamWConfig, SGDConfig
from vtrain.numerics.rounding import Mode
from vtrain.torch_ref import TorchReference, _adam_step_count, executor_for
from vtrain.training.loop import batch_for, replay_steps, train_steps
from vtrain.training.spec import TrainSpec, build_job

STEPS = 3
LOSS_RTOL = 1e-5
GPT = GPTConfig(n_layer=2, n_head=4, d_model=32, context=16)


def _spec(model: str, opt: SGDConfig | AdamWConfig, **kw) -> TrainSpec:
    return TrainSpec(model=model, optimizer=opt, batch_size=8, steps=STEPS, gpt=GPT,
                     mlp=MLPConfig(hidden=(32, 16)), **kw)


def _param_tolerance(name: str, ref: torch.Tensor, ctl: torch.Tensor, job, steps: int) -> None:
    """Parameters agree to FP32 accuracy. AdamW exception: the key part of ``attn.b``.

    Its exact gradient is zero (softmax ignores a shift shared by every key), so each side's
    gradient is rounding noise that AdamW normalises to an update of up to ``lr``.
    """
    opt = job.spec.optimizer
    if isinstance(opt, AdamWConfig) and name.endswith("attn.b"):
        C = job.spec.gpt.d_model
        k_ref, k_ctl = ref[C : 2 * C], ctl[C : 2 * C]
        assert float((k_ref - k_ctl).abs().max()) <= opt.lr * steps * 1.01
        ref, ctl = torch.cat([ref[:C], ref[2 * C :]]), torch.cat([ctl[:C], ctl[2 * C :]])
    torch.testing.assert_close(ref, ctl, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")


CASES = [
    ("mlp", SGDConfig()),
    ("mlp", SGDConfig(weight_decay=0.01)),
    ("mlp", AdamWConfig()),
    ("gpt", SGDConfig()),
    ("gpt", AdamWConfig()),
]


@pytest.mark.parametrize("model,opt", CASES, ids=lambda c: getattr(c, "name", c))
def test_matches_controlled_math(model: str, opt: SGDConfig | AdamWConfig) -> None:
    """Loss and updated state within FP32 accuracy of ``round-nolog`` for the first steps."""
    job = build_job(_spec(model, opt))
    ref = TorchReference(job)
    names = [s.name for s in job.graph.slots]
    state = state_tensors(job.initial_state)
    for o in train_steps(job, state_tensors(job.initial_state), 1, STEPS, mode="round-nolog"):
        state, loss = ref.step(state, batch_for(job, o.step))
        assert loss == pytest.approx(o.loss, rel=LOSS_RTOL), f"step {o.step}"
        assert len(state) == len(o.state)
        for i, (name, a, b) in enumerate(zip(names, state, o.state, strict=True)):
            assert a.dtype == torch.float32 and a.shape == b.shape, name
            if i < ref.n_params:
                _param_tolerance(name, a, b, job, o.step)
            elif a.numel() == 1 and name.startswith("adam."):
                assert float(a) == pytest.approx(float(b), rel=1e-6), name  # beta^t
            else:  # momentum, m, v: relative to the slot's scale
                tol = 1e-4 * float(b.abs().max()) + 1e-30
                torch.testing.assert_close(a, b, rtol=1e-3, atol=tol,
                                           msg=lambda m, n=name: f"{n}: {m}")


def test_state_round_trip_keeps_optimizer_state() -> None:
    """Loading the slot tensors after N steps and stepping once equals N+1 uninterrupted steps."""
    job = build_job(_spec("gpt", AdamWConfig()))
    ref = TorchReference(job)
    state = state_tensors(job.initial_state)
    for s in range(1, 5):
        state, _ = ref.step(state, batch_for(job, s))
    n = ref.n_params
    assert float(state[3 * n]) == np.float32(0.9**4)
    assert float(state[3 * n + 1]) == np.float32(0.99**4)
    fresh = TorchReference(job)  # a second instance (as after reading a checkpoint)
    a, la = ref.step([t.clone() for t in state], batch_for(job, 5))
    b, lb = fresh.step([t.clone() for t in state], batch_for(job, 5))
    assert la == lb
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_step_count_from_controlled_beta_powers() -> None:
    """The graph's beta^t chains (one FP32 rounding per step) give back t, past beta1 underflow."""
    cfg = AdamWConfig()
    b1 = b2 = np.float32(1.0)
    assert _adam_step_count(1.0, 1.0, cfg) == 0
    for t in range(1, 3001):
        b1, b2 = np.float32(b1 * np.float32(cfg.beta1)), np.float32(b2 * np.float32(cfg.beta2))
        assert _adam_step_count(float(b1), float(b2), cfg) == t
    with pytest.raises(VtrainError, match="step count"):
        _adam_step_count(0.0, 0.0, cfg)


def test_loads_controlled_state() -> None:
    """A state trained by the graph (beta^t from its FP32 chain) continues in the reference."""
    job = build_job(_spec("mlp", AdamWConfig()))
    *_, last = train_steps(job, state_tensors(job.initial_state), 1, 12, mode="round-nolog")
    ctl = next(train_steps(job, last.state, 13, 13, mode="round-nolog"))
    new, loss = TorchReference(job).step(last.state, batch_for(job, 13))
    assert loss == pytest.approx(ctl.loss, rel=LOSS_RTOL)
    n = len(job.graph.slots) // 3
    assert float(new[3 * n]) == np.float32(0.9**13)
    for a, b in zip(new[:n], ctl.state[:n], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_fp32_mode_runs_the_reference() -> None:
    """``train_steps``/``replay_steps`` with mode fp32 use TorchReference: no log, zero log root."""
    job = build_job(_spec("gpt", SGDConfig(), mode="fp32"))
    assert isinstance(executor_for(job, "fp32"), TorchReference)
    assert isinstance(executor_for(job, "certified"), StepExecutor)
    outs = list(train_steps(job, state_tensors(job.initial_state), 1, STEPS))
    ref = TorchReference(job)
    state = state_tensors(job.initial_state)
    for o in outs:
        assert o.log.mode == Mode.FP32 and o.log.n_entries == 0 and not o.log.dense
        assert o.log_root == b"\x00" * 32
        state, loss = ref.step(state, batch_for(job, o.step))
        assert loss == o.loss
        assert all(torch.equal(x, y) for x, y in zip(state, o.state, strict=True))

    def no_logs(step: int):
        raise AssertionError("fp32 replay must not read logs")

    again = list(replay_steps(job, state_tensors(job.initial_state), 1, STEPS, no_logs))
    assert [o.state_root for o in again] == [o.state_root for o in outs]  # same process, same bits


def test_rejects_bad_inputs() -> None:
    job = build_job(_spec("mlp", SGDConfig()))
    ref = TorchReference(job)
    state = state_tensors(job.initial_state)
    data = batch_for(job, 1)
    with pytest.raises(VtrainError, match="expected"):
        ref.step(state[:-1], data)
    with pytest.raises(VtrainError, match="slot 0"):
        ref.step([state[0].double(), *state[1:]], data)
    with pytest.raises(VtrainError, match="data"):
        ref.step(state, data[:4])
