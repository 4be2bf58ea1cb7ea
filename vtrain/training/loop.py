"""The training loop and the replay loop, top to bottom.

``train_steps`` is what a trainer runs; ``replay_steps`` is what an auditor runs with the
trainer's logs. Both yield one :class:`StepOutcome` per step with the state root that goes into
the step leaf, so the two sides can be compared step by step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from vtrain.commit.roots import (
    batch_indices,
    state_root,
    step_log_root,
    tensor_roots,
)
from vtrain.graph.executor import StepLog, StepResult, state_tensors
from vtrain.graph.step_graph import Graph
from vtrain.numerics.rounding import Mode
from vtrain.torch_ref import executor_for
from vtrain.training.spec import Job

log = logging.getLogger(__name__)


@dataclass
class StepOutcome:
    """One executed step: the new state, its commitments and the rounding log."""

    step: int
    loss: float
    state: list[torch.Tensor]
    component_roots: list[bytes]
    state_root: bytes
    log: StepLog
    log_root: bytes
    result: StepResult


class Cheat:
    """Hooks of a dishonest trainer. The base class is honest; subclasses override one hook."""

    def data(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        return batch

    def op_hook(self, step: int):
        return None

    def after_step(self, step: int, result: StepResult) -> None:
        return None


def batch_for(job: Job, step: int) -> torch.Tensor:
    """The batch of ``step`` (1-based), fixed by the data-order seed (see docs/protocol.md)."""
    idx = batch_indices(job.spec.data_seed, step, job.spec.batch_size, job.dataset.n)
    return torch.from_numpy(job.dataset.samples[np.asarray(idx, dtype=np.int64)])


def component_roots(state: list[torch.Tensor]) -> list[bytes]:
    """The state's component tensor roots, hashed in one threaded call (C builder)."""
    return list[bytes](tensor_roots([t.detach().numpy() for t in state], "state"))


def step_log_root_of(log_: StepLog, graph: Graph) -> bytes:
    """logRoot_s: one leaf per op, each the root of that op's sparse log (empty for most ops)."""
    from vtrain.commit.trace import op_log_roots

    return step_log_root(op_log_roots(log_, graph))


def initial_commitment(job: Job) -> tuple[list[bytes], bytes]:
    roots = component_roots(state_tensors(job.initial_state))
    return roots, state_root(roots)


def _outcome(step: int, res: StepResult, graph: Graph) -> StepOutcome:
    roots = component_roots(res.state)
    lr = step_log_root_of(res.log, graph) if res.log.mode == Mode.CERTIFIED else b"\x00" * 32
    return StepOutcome(step, res.loss, res.state, roots, state_root(roots), res.log, lr, res)


def train_steps(
    job: Job,
    state: list[torch.Tensor],
    first: int,
    last: int,
    mode: Mode | str | None = None,
    cheat: Cheat | None = None,
    keep_trace: bool = False,
    device: str | None = None,
) -> Iterator[StepOutcome]:
    """Train steps ``first..last`` (inclusive, 1-based) from ``state`` (the state after ``first-1``).

    ``cheat`` lets tests and demos play a dishonest trainer (see :class:`Cheat`). ``device``:
    where the step computes (``cpu``, ``cuda``; the log and the roots do not depend on it).
    """
    ex = executor_for(job, mode or job.spec.mode, device)  # fp32: plain torch (TorchReference)
    for s in range(first, last + 1):
        data = batch_for(job, s)
        hook = None
        if cheat is not None:
            data = cheat.data(s, data)
            hook = cheat.op_hook(s)
        res = ex.run(state, data, step=s, op_hook=hook, keep_trace=keep_trace)
        if cheat is not None:
            cheat.after_step(s, res)
        out = _outcome(s, res, job.graph)
        log.debug("step %d loss %.6f logged %d", s, res.loss, res.log.n_entries)
        yield out
        state = out.state


def replay_steps(
    job: Job,
    state: list[torch.Tensor],
    first: int,
    last: int,
    logs: Callable[[int], StepLog],
    mode: Mode | str | None = None,
    check: bool = False,
    resolver_factory=None,
    keep_trace: bool = False,
    device: str | None = None,
) -> Iterator[StepOutcome]:
    """Replay steps ``first..last`` with the trainer's logs; bit-identical to an honest trainer
    on any ``device``."""
    ex = executor_for(job, mode or job.spec.mode, device)  # fp32: plain torch (TorchReference)
    for s in range(first, last + 1):
        log_in = logs(s) if ex.mode in (Mode.CERTIFIED, Mode.PAPER) else StepLog(ex.mode)
        res = ex.run(
            state,
            batch_for(job, s),
            log_in=log_in if ex.mode in (Mode.CERTIFIED, Mode.PAPER) else None,
            check=check,
            resolver_factory=resolver_factory,
            step=s,
            keep_trace=keep_trace,
        )
        if ex.mode in (Mode.CERTIFIED, Mode.PAPER):
            res.log = log_in
        yield _outcome(s, res, job.graph)
        state = res.state
