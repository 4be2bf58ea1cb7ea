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
from vtrain.errors import NonFiniteValue, VtrainError, nonfinite_origin
from vtrain.graph.executor import StepExecutor, StepLog, StepResult, state_tensors
from vtrain.graph.step_graph import ROUNDING_KINDS, Graph
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

    def run(self, ex: StepExecutor, state: list[torch.Tensor], data: torch.Tensor, step: int,
            keep_trace: bool) -> StepResult:
        """Execute step ``step`` (the honest call with :meth:`op_hook`; a cheat may run it otherwise)."""
        return ex.run(state, data, step=step, op_hook=self.op_hook(step), keep_trace=keep_trace)


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
        if cheat is None:
            res = ex.run(state, data, step=s, keep_trace=keep_trace)
        else:
            res = cheat.run(ex, state, cheat.data(s, data), s, keep_trace)
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


@dataclass(frozen=True)
class NonFiniteSite:
    """The first element of a step whose correct value has no finite FP32 value: op ``op``'s flat
    output element ``index`` of step ``step``, computed from ``outputs`` (every op before ``op``,
    flat FP32, as the replay computed them). The honest trainer stops there (NonFiniteValue), so
    any step the trainer posted from here on is a fraud, and this element is where it is proven."""

    step: int
    op: int
    index: int
    outputs: tuple[np.ndarray, ...]


#: Elements of the failing op checked exactly, in order, for one whose value is not finite.
MAX_NONFINITE_CANDIDATES = 256


def locate_nonfinite(
    job: Job,
    state: list[torch.Tensor],
    step: int,
    log_in: StepLog,
    resolver_factory=None,
    device: str | None = None,
) -> NonFiniteSite | None:
    """Replay step ``step`` of ``job`` from ``state`` with ``log_in`` (checked, as the auditor does)
    and, if it stops with NonFiniteValue, the element where (:func:`locate_nonfinite_in`)."""
    ex = executor_for(job, job.spec.mode, device)
    if not isinstance(ex, StepExecutor):
        return None  # plain FP32 (torch): no rounding rule, nothing the contract rules on
    return locate_nonfinite_in(ex, state, batch_for(job, step), step, log_in, resolver_factory)


def locate_nonfinite_in(
    ex: StepExecutor,
    state: list[torch.Tensor],
    data: torch.Tensor,
    step: int,
    log_in: StepLog,
    resolver_factory=None,
) -> NonFiniteSite | None:
    """Replay one step on ``ex`` with ``log_in`` (checked) and, if it stops with NonFiniteValue,
    the element where: the failing op is the one after the last output the replay produced; its
    element is the one the raiser named (a resolver overruling a claim whose exact value has no
    finite value) or else the first, in index order among those whose FP64 value is not finite or
    within 2^-20 of FLT_MAX, whose exact value has no finite FP32 value
    (:func:`vtrain.numerics.exact.no_finite_value`, the contract's rule). None when the step
    replays, or no such element is found (e.g. an op kind the contract does not rule on)."""
    from vtrain.graph.executor import _compute_fp64
    from vtrain.numerics import exact as X
    from vtrain.numerics.canonical import op_desc

    outs: list[np.ndarray] = []
    ids: list[int] = []

    def keep(op, ins, out, _log):
        ids.append(op.id)
        outs.append(out.detach().cpu().reshape(-1).numpy().astype(np.float32, copy=True))
        return out

    try:
        ex.run(state, data, log_in=log_in, check=True, resolver_factory=resolver_factory, step=step, op_hook=keep)
    except NonFiniteValue as e:
        origin = nonfinite_origin(e)
        graph = ex.graph
        if len(outs) >= graph.n_ops or ids != list(range(len(ids))):
            return None  # (an executor that runs ops out of id order: the failing op is not known here)
        op = graph.ops[len(outs)]
        if op.kind not in ROUNDING_KINDS:
            return None
        ins = [outs[i].reshape(graph.ops[i].shape) for i in op.inputs]
        desc = op_desc(graph, op)
        if origin is not None and origin.op in (None, op.id):
            candidates = np.array([origin.index], dtype=np.int64)
        else:
            with np.errstate(all="ignore"):
                v = _compute_fp64(op, [torch.from_numpy(a).double() for a in ins], "none")[0]
                v = v.detach().cpu().reshape(-1).numpy()
                near = ~np.isfinite(v) | (np.abs(v) >= np.float64(np.finfo(np.float32).max) * (1 - 2.0**-20))
            candidates = np.flatnonzero(near)[:MAX_NONFINITE_CANDIDATES]
        for i in candidates.tolist():
            try:
                if X.no_finite_value(desc, ins, int(i)):
                    log.info("step %d: op %d (%s) element %d has no finite value", step, op.id, op.kind.name, i)
                    return NonFiniteSite(step, op.id, int(i), tuple(outs))
            except VtrainError:
                return None  # a kind or input the rule does not take: not provable this way
        return None
    return None
