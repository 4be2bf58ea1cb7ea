"""Checks a lowered step against torch autograd, both in FP64: the loss, every parameter's gradient
and every updated buffer (running statistics). A lowering is right when these agree to FP64 noise
(plus the FP32 rounding of the scalar constants the graph stores)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from vtrain.frontend.capture import Captured, TorchTask, _WithLoss
from vtrain.graph.fp64 import evaluate_fp64
from vtrain.graph.step_graph import OpKind


@dataclass
class Comparison:
    """Graph vs torch values (FP64) of one batch."""

    loss: tuple[float, float]
    grads: dict[str, tuple[np.ndarray, np.ndarray]]
    buffers: dict[str, tuple[np.ndarray, np.ndarray]]

    def worst(self) -> float:
        """The largest error relative to the torch value's scale, over all compared tensors."""
        errs = [abs(self.loss[0] - self.loss[1]) / max(1.0, abs(self.loss[1]))]
        for a, b in [*self.grads.values(), *self.buffers.values()]:
            errs.append(float(np.abs(a - b).max()) / max(1e-3, float(np.abs(b).max())))
        return max(errs)


def compare_fp64(task: TorchTask, cap: Captured, rows: np.ndarray, seed: bytes | None = None,
                 step: int = 1) -> Comparison:
    """Evaluate the graph in FP64 and torch autograd in FP64 on ``rows`` (dropout must be off in torch)."""
    g = cap.graph
    state = [torch.from_numpy(a).double() for a in cap.initial_state]
    vals = evaluate_fp64(g, state, torch.from_numpy(rows), seed=seed, step=step)
    ref = copy.deepcopy(task.module).double().train()
    wrapper = _WithLoss(ref, task.loss, cap.fields)
    loss = wrapper(torch.from_numpy(rows).double())
    loss.backward()
    named = dict(ref.named_parameters(remove_duplicate=False))
    grads = {}
    for i, name in enumerate(cap.slot_names[: cap.n_params]):
        torch_grad = sum(named[k].grad for k in cap.aliases[name] if k in named and named[k].grad is not None)
        if isinstance(torch_grad, int):
            torch_grad = torch.zeros_like(named[name])
        grads[name] = (vals[g.grad_ops[i]].detach().numpy().reshape(-1),
                       torch_grad.detach().numpy().reshape(-1))
    bufs = {}
    sd = ref.state_dict()
    outputs = {o.attrs[0]: o for o in g.ops if o.kind == OpKind.OUTPUT}
    for j in range(cap.n_params, cap.n_params + cap.n_buffers):
        name = cap.slot_names[j]
        bufs[name] = (vals[outputs[j].id].detach().numpy().reshape(-1),
                      sd[name].double().numpy().reshape(-1))
    return Comparison((float(vals[g.loss_op].reshape(-1)[0]), float(loss)), grads, bufs)
