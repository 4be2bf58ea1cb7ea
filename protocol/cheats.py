"""Dishonest trainers for demos and tests. Each cheats once, at one step, in one way; the honest
auditor must catch every one of them and win the game."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vtrain.executor import StepLog, StepResult
from vtrain.graph import OpKind, OpNode, bits_f32
from vtrain.numerics import Code, OpLog
from vtrain.train import Cheat


@dataclass
class TamperWeight(Cheat):
    """Adds ``delta`` to one element of one state slot after step ``step``."""

    step: int
    slot: int = 0
    index: int = 0
    delta: float = 1e-3

    def after_step(self, step: int, result: StepResult) -> None:
        if step == self.step:  # a new tensor: the trace keeps the honest values it computed
            t = result.state[self.slot].clone()
            t.view(-1)[self.index] += self.delta
            result.state[self.slot] = t


@dataclass
class PoisonSample(Cheat):
    """Trains step ``step`` on a batch with one value changed (poisoned data)."""

    step: int
    row: int = 0
    col: int = 0
    delta: float = 0.5

    def data(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        if step != self.step:
            return batch
        b = batch.clone()
        b[self.row, self.col] += self.delta
        return b


@dataclass
class SkipStep(Cheat):
    """Does not train step ``step``: every state slot keeps its previous value."""

    step: int
    _inputs: dict[int, torch.Tensor] = field(default_factory=dict)

    def op_hook(self, step: int):
        if step != self.step:
            return None

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if op.kind == OpKind.INPUT:
                self._inputs[op.attrs[0]] = out
            if op.kind == OpKind.OUTPUT:
                return self._inputs[op.attrs[0]]
            return out

        return hook


@dataclass
class WrongLearningRate(Cheat):
    """Scales every update by ``factor`` at step ``step`` (a different learning rate than agreed)."""

    step: int
    lr: float
    factor: float = 2.0

    def op_hook(self, step: int):
        if step != self.step:
            return None
        lr_bits = int(np.array(self.lr, np.float32).view(np.uint32))

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if op.kind == OpKind.MUL_S and op.attrs[0] == lr_bits:
                return (ins[0].double() * (bits_f32(lr_bits) * self.factor)).to(torch.float32) + 0.0
            return out

        return hook


class _LogCheat(Cheat):
    """Edits one element of the first matmul without log entries at the cheating step, and writes
    the log entry that is meant to 'explain' the edit (subclasses say how)."""

    step: int
    element: int

    def edit(self, flat: torch.Tensor, log: StepLog, op: int) -> None:
        raise NotImplementedError

    def op_hook(self, step: int):
        if step != self.step:
            return None
        done: list[int] = []

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if done or op.kind != OpKind.MATMUL or len(log.sparse.get(op.id) or ()):
                return out
            done.append(op.id)
            flat = out.reshape(-1).clone()
            self.edit(flat, log, op.id)
            return flat.reshape(out.shape)

        return hook


@dataclass
class AbuseLog(_LogCheat):
    """Forces one rounding direction far from any midpoint: moves the element up by one ulp and
    logs an 'up' entry for it."""

    step: int
    element: int = 0

    def edit(self, flat: torch.Tensor, log: StepLog, op: int) -> None:
        flat[self.element] = torch.nextafter(flat[self.element], torch.tensor(np.inf, dtype=torch.float32))
        log.sparse[op] = OpLog(np.array([self.element]), np.array([Code.UP], np.uint8), np.zeros(1, np.float32))


@dataclass
class ForgeExplicit(_LogCheat):
    """Writes an explicit log entry with a value far outside the certified window."""

    step: int
    element: int = 0
    delta: float = 0.25

    def edit(self, flat: torch.Tensor, log: StepLog, op: int) -> None:
        flat[self.element] += self.delta
        value = flat[self.element : self.element + 1].numpy().copy()
        log.sparse[op] = OpLog(np.array([self.element]), np.array([Code.EXPLICIT], np.uint8), value)


CHEATS = {
    "tamper-weight": lambda spec, s: TamperWeight(s),
    "poison-sample": lambda spec, s: PoisonSample(s),
    "skip-step": lambda spec, s: SkipStep(s),
    "wrong-lr": lambda spec, s: WrongLearningRate(s, spec.optimizer.lr),
    "abuse-log": lambda spec, s: AbuseLog(s),
    "forge-explicit": lambda spec, s: ForgeExplicit(s),
}
"""Cheating modes by name (``vtrain demo --cheat NAME``)."""
