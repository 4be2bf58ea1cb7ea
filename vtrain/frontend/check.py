"""Checks a lowered step against torch autograd, both in FP64: the loss, every parameter's gradient
and every updated buffer (running statistics). A lowering is right when these agree to FP64 noise
(plus the FP32 rounding of the scalar constants the graph stores)."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from vtrain.frontend.capture import Captured, TorchTask, _WithLoss, torch_optimizer
from vtrain.frontend.errors import FrontendError
from vtrain.graph.fp64 import evaluate_fp64
from vtrain.graph.generated import dropout_uniforms
from vtrain.graph.step_graph import OpKind, bits_f32, f32_bits


@contextlib.contextmanager
def same_dropout(seed: bytes, step: int) -> Iterator[None]:
    """Make torch's ``F.dropout`` (the channel dropouts ``F.dropout1d/2d/3d``, and the attention dropout of
    ``F.scaled_dot_product_attention``, which ``nn.MultiheadAttention`` calls) use the graph's masks: the
    k-th dropout call with p > 0 gets DROPOUT_MASK salt k (the builder numbers them in the same, execution,
    order); a channel dropout's mask has one element per (sample, channel)."""
    F = torch.nn.functional
    orig = F.dropout
    originals = {name: getattr(F, name) for name in ("dropout1d", "dropout2d", "dropout3d")}
    salt = [0]

    def channel_dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return x
        q = 1.0 - (1.0 - p)  # the graph's drop probability (bernoulli.p(1 - p) lowered)
        mask_shape = tuple(x.shape[:2]) + (1,) * (x.dim() - 2)
        u = dropout_uniforms(seed, step, salt[0], math.prod(mask_shape))
        salt[0] += 1
        keep = torch.from_numpy((u >= np.uint32(round(q * 2**32))).reshape(mask_shape))
        return x * (keep.to(x.dtype) / (1.0 - p))

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return x
        u = dropout_uniforms(seed, step, salt[0], math.prod(x.shape))
        salt[0] += 1
        keep = torch.from_numpy((u >= np.uint32(round(p * 2**32))).reshape(tuple(x.shape)))
        scale = bits_f32(f32_bits(1.0 / (1.0 - p)))
        return x * (keep.to(x.dtype) * scale)

    orig_sdpa = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        """torch's math attention with its dropout on the weights through :func:`dropout` (torch's fused
        kernels draw their own mask; the graph's decomposition is this one with a DROPOUT_MASK)."""
        if dropout_p == 0.0:
            return orig_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                             enable_gqa=enable_gqa)
        n, s = q.size(-2), k.size(-2)
        bias = torch.zeros(n, s, dtype=q.dtype)
        if is_causal:
            bias = bias.masked_fill(~torch.ones(n, s, dtype=torch.bool).tril(), float("-inf"))
        if attn_mask is not None:
            bias = bias.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else attn_mask + bias
        if enable_gqa:
            k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
            v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
        w = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)) if scale is None else scale) + bias
        return dropout(torch.softmax(w, -1), dropout_p) @ v

    F.dropout = dropout
    F.scaled_dot_product_attention = sdpa
    for name in originals:
        setattr(F, name, channel_dropout)
    try:
        yield
    finally:
        F.dropout = orig
        F.scaled_dot_product_attention = orig_sdpa
        for name, fn in originals.items():
            setattr(F, name, fn)


def _reference_loss(wrapper: _WithLoss, rows: np.ndarray) -> torch.Tensor:
    """The FP64 torch loss of ``rows``; a loss or model that holds its own float32 tensors (not parameters or
    buffers, which are converted) cannot run in FP64: FrontendError says so."""
    try:
        return wrapper(torch.from_numpy(rows).double())
    except RuntimeError as e:
        if "Double" not in str(e) and "double" not in str(e):
            raise
        raise FrontendError(f"the FP64 reference could not run the model and loss ({e}): a tensor the loss or "
                            "forward creates itself stays float32; make it from the input (x.new_tensor(...)) "
                            "or register it as a buffer") from None


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
    """Evaluate the graph in FP64 and torch autograd in FP64 on ``rows`` (torch's dropout calls use
    the graph's masks, see :func:`same_dropout`)."""
    g = cap.graph
    state = [torch.from_numpy(a).double() for a in cap.initial_state]
    vals = evaluate_fp64(g, state, torch.from_numpy(rows), seed=seed, step=step)
    ref = copy.deepcopy(task.module).double().train()
    wrapper = _WithLoss(ref, task.loss, cap.fields)
    with same_dropout(seed or bytes(32), step):
        loss = _reference_loss(wrapper, rows)
    loss.backward()
    named = dict(ref.named_parameters(remove_duplicate=False))
    grads = {}
    for i, name in enumerate(cap.slot_names[: cap.n_params]):
        p = named[name]  # tied names share this one Parameter (and its one .grad)
        torch_grad = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[name] = (vals[g.grad_ops[i]].detach().numpy().reshape(-1),
                       torch_grad.detach().numpy().reshape(-1))
    bufs = {}
    sd = ref.state_dict()
    outputs = {o.attrs[0]: o for o in g.ops if o.kind == OpKind.OUTPUT}
    for j in range(cap.n_params, cap.n_params + cap.n_buffers):
        name = cap.slot_names[j]
        bufs[name] = (vals[outputs[j].id].detach().numpy().reshape(-1),
                      sd[name].double().numpy().reshape(-1))
    return Comparison((float(vals[g.loss_op].reshape(-1)[0]), float(loss.detach())), grads, bufs)


def compare_step_fp64(task: TorchTask, cap: Captured, rows: np.ndarray, seed: bytes | None = None,
                      step: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One whole step (forward, backward, clipping, schedule, optimizer) in FP64: every new state
    slot of the graph against torch.optim (and ``clip_grad_norm_``) on the same FP64 model."""
    g = cap.graph
    state = [torch.from_numpy(a).double() for a in cap.initial_state]
    vals = evaluate_fp64(g, state, torch.from_numpy(rows), seed=seed, step=step)
    ref = copy.deepcopy(task.module).double().train()
    named = dict(ref.named_parameters(remove_duplicate=False))
    params = [named[n] for n in cap.slot_names[: cap.n_params]]
    cfg = cap.optimizer
    lr = cfg.lr if task.schedule is None else float(task.schedule.table(cfg.lr, step)[step - 1])
    opt = torch_optimizer(cfg, params, lr)
    with same_dropout(seed or bytes(32), step):
        loss = _reference_loss(_WithLoss(ref, task.loss, cap.fields), rows)
    loss.backward()
    if task.clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, task.clip_grad_norm)
    opt.step()
    outputs = {o.attrs[0]: o for o in g.ops if o.kind == OpKind.OUTPUT}
    sd = ref.state_dict()
    out = {}
    for j, name in enumerate(cap.slot_names[: cap.n_params + cap.n_buffers]):
        out[name] = (vals[outputs[j].id].detach().numpy().reshape(-1), sd[name].double().numpy().reshape(-1))
    return out
