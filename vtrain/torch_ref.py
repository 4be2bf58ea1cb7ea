"""Plain torch FP32 training of the job's model: the uncontrolled control (mode ``fp32``).

The same models, parameter layout, initial values, data and optimizer hyper-parameters as the
step graph (``vtrain.models.nn``, ``vtrain.models.optim``), but computed the ordinary way: fused torch kernels
(``F.linear``, ``F.layer_norm``, ``F.gelu``, ``F.scaled_dot_product_attention``,
``F.cross_entropy``, ...), autograd and ``torch.optim``. Its results depend on the CPU kernels,
the BLAS, the thread count and the batch shape, so it differs between environments from the
first step: it is the baseline that shows what controlled numerics buys.

The state goes in and out in the job's slot order (parameters, then optimizer state: SGD momentum
buffers; AdamW ``m``, ``v``, ``beta1^t``, ``beta2^t``), so a fp32 run uses the same run folder,
checkpoints and state roots as every other mode.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.graph.executor import StepExecutor, StepLog, StepResult
from vtrain.models.nn import GPTConfig, MLPConfig
from vtrain.models.optim import AdamWConfig, SGDConfig
from vtrain.numerics.rounding import Mode, RoundingStats, canonical
from vtrain.training.spec import Job


def _adam_step_count(b1p: float, b2p: float, cfg: AdamWConfig) -> int:
    """The step count ``t`` from the state scalars ``beta1^t``, ``beta2^t`` (0 before step 1).

    Uses whichever power is still a normal FP32 number with the larger ``|log beta|`` (the
    better conditioned); ``beta1^t`` leaves the normal range after ~840 steps for beta1 = 0.9,
    ``beta2^t`` much later.
    """
    if b1p == 1.0 and b2p == 1.0:
        return 0
    tiny = 1.1754943508222875e-38  # smallest normal FP32
    pairs = ((b1p, cfg.beta1), (b2p, cfg.beta2))
    cands = [(p, b) for p, b in pairs if tiny <= p < 1.0 and 0.0 < b < 1.0]
    if not cands:
        raise VtrainError(f"adamw state: cannot recover the step count from beta^t {b1p}, {b2p}")
    p, b = max(cands, key=lambda c: abs(math.log(c[1])))
    return int(round(math.log(p) / math.log(b)))


class TorchReference:
    """Plain torch FP32 training of ``job``'s model; one :meth:`step` per training step."""

    mode = Mode.FP32

    def __init__(self, job: Job, device: str | torch.device | None = None) -> None:
        from vtrain.graph.executor import resolve_device

        self.device = resolve_device(device)
        self.job = job
        self.spec = job.spec
        self.graph = job.graph
        self.n_params = self._n_params()
        self.names = [s.name for s in self.graph.slots[: self.n_params]]
        self.params = [
            torch.zeros(s.shape, dtype=torch.float32, device=self.device, requires_grad=True)
            for s in self.graph.slots[: self.n_params]
        ]
        self.named = dict(zip(self.names, self.params, strict=True))
        cfg = self.spec.optimizer
        self.opt: torch.optim.Optimizer
        if isinstance(cfg, SGDConfig):
            self.opt = torch.optim.SGD(self.params, lr=cfg.lr, momentum=cfg.momentum,
                                       dampening=0.0, weight_decay=cfg.weight_decay)
        elif isinstance(cfg, AdamWConfig):
            self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                         eps=cfg.eps, weight_decay=cfg.weight_decay)
        else:  # pragma: no cover - TrainSpec admits only the two
            raise VtrainError(f"optimizer: expected sgd or adamw, got {cfg!r}")

    def _n_params(self) -> int:
        n = len(self.graph.slots)
        if isinstance(self.spec.optimizer, SGDConfig):
            return n // 2
        return (n - 2) // 3

    # -- the models ------------------------------------------------------------------------------
    def loss(self, data: torch.Tensor) -> torch.Tensor:
        """The training loss of one batch (a 0-dim tensor with autograd history)."""
        if self.spec.model == "mlp":
            return self._mlp_loss(self.spec.mlp, data)
        return self._gpt_loss(self.spec.gpt, data)

    def _mlp_loss(self, cfg: MLPConfig, data: torch.Tensor) -> torch.Tensor:
        p = self.named
        x = data[:, : cfg.n_in]
        y = F.one_hot(data[:, cfg.n_in].to(torch.int64), cfg.n_out).to(torch.float32)
        n_layers = len(cfg.hidden) + 1
        h = x
        for i in range(n_layers):
            h = F.linear(h, p[f"l{i}.w"], p[f"l{i}.b"])
            if i < n_layers - 1:
                h = F.relu(h)
        return F.mse_loss(h, y)

    def _gpt_loss(self, cfg: GPTConfig, data: torch.Tensor) -> torch.Tensor:
        p = self.named
        B, Tn, C, H = data.shape[0], cfg.context, cfg.d_model, cfg.n_head
        hs = C // H
        ids = data.to(torch.int64)
        idx, tgt = ids[:, :Tn], ids[:, 1 : Tn + 1]
        x = F.embedding(idx, p["wte_t"].t()) + p["wpe"]  # wte_t (C, V): a token's column
        for i in range(cfg.n_layer):
            h = F.layer_norm(x, (C,), p[f"h{i}.ln1.w"], p[f"h{i}.ln1.b"], eps=1e-5)
            qkv = F.linear(h, p[f"h{i}.attn.w"], p[f"h{i}.attn.b"])
            q, k, v = (t.view(B, Tn, H, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(B, Tn, C)
            x = x + F.linear(y, p[f"h{i}.proj.w"], p[f"h{i}.proj.b"])
            h = F.layer_norm(x, (C,), p[f"h{i}.ln2.w"], p[f"h{i}.ln2.b"], eps=1e-5)
            h = F.gelu(F.linear(h, p[f"h{i}.fc.w"], p[f"h{i}.fc.b"]), approximate="tanh")
            x = x + F.linear(h, p[f"h{i}.fc2.w"], p[f"h{i}.fc2.b"])
        x = F.layer_norm(x, (C,), p["lnf.w"], p["lnf.b"], eps=1e-5)
        logits = F.linear(x, p["head.w"])
        return F.cross_entropy(logits.reshape(B * Tn, cfg.vocab), tgt.reshape(B * Tn))

    # -- optimizer state in and out of the slot tensors -----------------------------------------
    def _load(self, state: list[torch.Tensor]) -> None:
        n = self.n_params
        with torch.no_grad():
            for p, t in zip(self.params, state[:n], strict=True):
                p.copy_(t)
                p.grad = None
        self.opt.state.clear()
        cfg = self.spec.optimizer
        if isinstance(cfg, SGDConfig):
            for p, buf in zip(self.params, state[n : 2 * n], strict=True):
                self.opt.state[p]["momentum_buffer"] = buf.detach().to(self.device, copy=True)
            return
        steps = _adam_step_count(float(state[3 * n]), float(state[3 * n + 1]), cfg)
        for p, m, v in zip(self.params, state[n : 2 * n], state[2 * n : 3 * n], strict=True):
            self.opt.state[p].update(
                step=torch.tensor(float(steps), dtype=torch.float32),
                exp_avg=m.detach().to(self.device, copy=True),
                exp_avg_sq=v.detach().to(self.device, copy=True),
            )

    def _export(self) -> list[torch.Tensor]:
        n = self.n_params
        out = [canonical(p.detach().cpu().clone()) for p in self.params]
        cfg = self.spec.optimizer
        st = self.opt.state
        if isinstance(cfg, SGDConfig):
            return out + [canonical(st[p]["momentum_buffer"].detach().cpu().clone()) for p in self.params]
        out += [canonical(st[p]["exp_avg"].detach().cpu().clone()) for p in self.params]
        out += [canonical(st[p]["exp_avg_sq"].detach().cpu().clone()) for p in self.params]
        t = int(st[self.params[0]]["step"].item()) if n else 0
        out += [torch.tensor([cfg.beta1**t], dtype=torch.float32),
                torch.tensor([cfg.beta2**t], dtype=torch.float32)]
        return out

    # -- one step ---------------------------------------------------------------------------------
    def step(
        self, state: list[torch.Tensor], data: torch.Tensor
    ) -> tuple[list[torch.Tensor], float]:
        """One plain FP32 training step: ``(new state in slot order, loss before the update)``."""
        g = self.graph
        if len(state) != len(g.slots):
            raise VtrainError(f"state: expected {len(g.slots)} tensors, got {len(state)}")
        for i, (t, s) in enumerate(zip(state, g.slots, strict=True)):
            if tuple(t.shape) != s.shape or t.dtype != torch.float32:
                raise VtrainError(f"state slot {i} ({s.name}): expected float32{s.shape}, "
                                  f"got {t.dtype}{tuple(t.shape)}")
        if tuple(data.shape) != g.data_shape:
            raise VtrainError(f"data: expected shape {g.data_shape}, got {tuple(data.shape)}")
        self._load(state)
        loss = self.loss(data.to(self.device, torch.float32))
        if not bool(torch.isfinite(loss)):
            raise NonFiniteValue(f"fp32 reference: loss is {float(loss)}")
        loss.backward()
        self.opt.step()
        return self._export(), float(loss.detach())

    def run(self, state: list[torch.Tensor], data: torch.Tensor, log_in: StepLog | None = None,
            step: int | None = None, **_ignored: Any) -> StepResult:
        """:meth:`StepExecutor.run`'s interface (logs, traces and hooks do not apply to fp32)."""
        new_state, loss = self.step(state, data)
        return StepResult(new_state, loss, StepLog(Mode.FP32), RoundingStats())


def executor_for(job: Job, mode: Mode | str, device: str | torch.device | None = None) -> StepExecutor | TorchReference:
    """The step runner of ``mode`` on ``device`` (default CPU): :class:`TorchReference` for
    ``fp32``, else the graph's."""
    if Mode(mode) == Mode.FP32:
        if job.torch is not None:
            from vtrain.frontend.job import TorchTaskReference

            return TorchTaskReference(job)  # type: ignore[return-value]
        return TorchReference(job, device)
    return StepExecutor(job.graph, mode, device, seed=job.spec.data_seed)
