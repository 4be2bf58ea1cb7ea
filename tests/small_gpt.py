"""The small GPT of the replay tests (2 layers, d 64, 4 heads, ctx 32, batch 8, AdamW: the benchmark's),
ready for a certified step: its job context, job, certified executor and initial state."""

from __future__ import annotations

from typing import Any, NamedTuple


class SmallGPT(NamedTuple):
    ctx: Any  # protocol.jobs.JobContext
    job: Any  # vtrain.training.spec.Job
    ex: Any  # the certified StepExecutor
    state: list  # the initial state tensors


def small_gpt() -> SmallGPT:
    from protocol.jobs import JobContext
    from vtrain.graph.executor import state_tensors
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.torch_ref import executor_for
    from vtrain.training.spec import TrainSpec

    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=8,
                     gpt=GPTConfig(n_layer=2, d_model=64, n_head=4, context=32))
    ctx = JobContext.of(spec)
    return SmallGPT(ctx, ctx.job, executor_for(ctx.job, "certified"), state_tensors(ctx.job.initial_state))
