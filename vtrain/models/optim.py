"""Optimizers as primitive ops. Every update is a chain of single IEEE ops (no FMA, no lerp), so
optimizer steps never need a rounding-log entry and replay identically everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtrain.graph.step_graph import GraphBuilder, T


@dataclass(frozen=True)
class SGDConfig:
    """SGD with (heavy-ball) momentum and optional decoupled weight decay."""

    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    name: str = "sgd"


@dataclass(frozen=True)
class AdamWConfig:
    """AdamW (Loshchilov & Hutter) with bias correction kept as state scalars ``beta^t``."""

    lr: float = 3e-3
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.01
    name: str = "adamw"


@dataclass(frozen=True)
class NesterovSGDConfig(SGDConfig):
    """torch.optim.SGD with ``nesterov=True`` (dampening 0): ``b = m b + (g + wd p)``,
    ``p -= lr ((g + wd p) + m b)``. Built by the torch front end only (a spec's ``sgd`` is never Nesterov)."""

    name: str = "sgd_nesterov"


@dataclass(frozen=True)
class AdamConfig(AdamWConfig):
    """torch.optim.Adam: L2 weight decay coupled into the gradient (``g + wd p``), then the Adam update
    with no decoupled decay term (the torch front end only; with wd = 0 it builds AdamW with wd = 0)."""

    weight_decay: float = 0.0
    name: str = "adam"


OptimConfig = SGDConfig | AdamWConfig
"""Every config; :class:`NesterovSGDConfig` is an SGDConfig and :class:`AdamConfig` an AdamWConfig
(the same state slots)."""


def optimizer_slots(
    cfg: OptimConfig, params: list[tuple[str, tuple[int, ...]]]
) -> list[tuple[str, tuple[int, ...], np.ndarray]]:
    """State slots (name, shape, initial value) the optimizer adds after the parameters."""
    if isinstance(cfg, SGDConfig):
        return [(f"{n}.momentum", s, np.zeros(s, np.float32)) for n, s in params]
    out = [(f"{n}.m", s, np.zeros(s, np.float32)) for n, s in params]
    out += [(f"{n}.v", s, np.zeros(s, np.float32)) for n, s in params]
    out += [("adam.beta1_pow", (1,), np.ones(1, np.float32)), ("adam.beta2_pow", (1,), np.ones(1, np.float32))]
    return out


def _times_lr(g: GraphBuilder, x: T, cfg: OptimConfig, lr: T | None) -> T:
    """``x * lr``: MUL_S by the fixed rate, or MUL by the step's rate (a (1,) tensor of the graph)."""
    if lr is None:
        return g.mul_s(x, cfg.lr)
    return g.mul(x, g.reshape(lr, (1,) * x.rank))


def sgd_update(g: GraphBuilder, cfg: SGDConfig, p: T, grad: T, buf: T, lr: T | None = None) -> tuple[T, T]:
    """torch.optim.SGD (dampening 0): ``b = m b + (g + wd p)``, ``p -= lr b``
    (Nesterov: ``p -= lr (g + wd p + m b)``)."""
    if cfg.weight_decay:
        grad = g.add(grad, g.mul_s(p, cfg.weight_decay))
    new_buf = g.add(g.mul_s(buf, cfg.momentum), grad)
    step = g.add(grad, g.mul_s(new_buf, cfg.momentum)) if isinstance(cfg, NesterovSGDConfig) else new_buf
    new_p = g.sub(p, _times_lr(g, step, cfg, lr))
    return new_p, new_buf


def adamw_update(
    g: GraphBuilder, cfg: AdamWConfig, p: T, grad: T, m: T, v: T, bc1: T, bc2: T, lr: T | None = None
) -> tuple[T, T, T]:
    """One AdamW update; ``bc1 = 1 - beta1^t`` and ``bc2 = 1 - beta2^t`` (shape (1,)). For
    :class:`AdamConfig` the decay is coupled: ``g + wd p`` enters the moments, no decoupled term."""
    coupled = isinstance(cfg, AdamConfig)
    if coupled and cfg.weight_decay:
        grad = g.add(grad, g.mul_s(p, cfg.weight_decay))
    new_m = g.add(g.mul_s(m, cfg.beta1), g.mul_s(grad, 1.0 - cfg.beta1))
    new_v = g.add(g.mul_s(v, cfg.beta2), g.mul_s(g.mul(grad, grad), 1.0 - cfg.beta2))
    m_hat = g.div(new_m, bc1)
    v_hat = g.div(new_v, bc2)
    step = g.div(m_hat, g.add_s(g.sqrt(v_hat), cfg.eps))
    if not coupled:
        step = g.add(step, g.mul_s(p, cfg.weight_decay))
    new_p = g.sub(p, _times_lr(g, step, cfg, lr))
    return new_p, new_m, new_v


def _split(g: GraphBuilder, flat: T, like: list[T]) -> list[T]:
    """``flat`` cut back into tensors of ``like``'s sizes (1-D SLICEs; OUTPUT takes them as they are)."""
    out, off = [], 0
    for t in like:
        n = t.shape[0] if t.rank == 1 else int(np.prod(t.shape))
        out.append(flat if n == flat.shape[0] else g.slice(flat, 0, off, n))
        off += n
    return out


def apply_optimizer(
    g: GraphBuilder, cfg: OptimConfig, params: list[T], grads: list[T], state: list[T], lr: T | None = None
) -> tuple[list[T], list[T]]:
    """New parameters and new optimizer state, in slot order; ``lr`` (shape (1,)): a scheduled rate.

    The update runs once over flat buffers: parameters, gradients and each state kind are CONCATed
    (exact copies), the ~15 elementwise ops of the update run on the concatenation, and the results are
    SLICEd back per slot (OUTPUT binds a 1-D slice to its slot's shape). Every element gets the same
    ops on the same values as a per-tensor update, so the new state is bit for bit the same; the graph
    has ~15 update ops in all instead of ~15 per parameter tensor. Slots stay one per tensor."""
    flat_p, flat_g = g.concat(params), g.concat(grads)
    if isinstance(cfg, SGDConfig):
        new_p, new_b = sgd_update(g, cfg, flat_p, flat_g, g.concat(state), lr)
        return _split(g, new_p, params), _split(g, new_b, params)
    n = len(params)
    ms, vs, b1p, b2p = state[:n], state[n : 2 * n], state[2 * n], state[2 * n + 1]
    new_b1p, new_b2p = g.mul_s(b1p, cfg.beta1), g.mul_s(b2p, cfg.beta2)
    bc1, bc2 = g.rsub_s(1.0, new_b1p), g.rsub_s(1.0, new_b2p)
    new_p, new_m, new_v = adamw_update(g, cfg, flat_p, flat_g, g.concat(ms), g.concat(vs), bc1, bc2, lr)
    return _split(g, new_p, params), _split(g, new_m, params) + _split(g, new_v, params) + [new_b1p, new_b2p]
