"""Layers, losses and models written as primitive ops on a :class:`GraphBuilder`.

Every layer is a composition of primitives, so its backward pass (derived by
``GraphBuilder.grad``) is made of primitives too, and every value is a rounded FP32 value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vtrain.graph.step_graph import GraphBuilder, T


# --- layers -------------------------------------------------------------------------------------
def linear(g: GraphBuilder, x: T, w: T, b: T | None) -> T:
    """``x[..., in] -> [..., out]`` with ``w[out, in]`` (rows contiguous, as MATMUL wants)."""
    lead = x.shape[:-1]
    x2 = g.reshape(x, (math.prod(lead), x.shape[-1]))  # (N, in)
    y = g.matmul(x2, w, b)  # (N, out)
    return g.reshape(y, lead + (w.shape[0],))


def layer_norm(g: GraphBuilder, x: T, w: T, b: T, eps: float = 1e-5) -> T:
    mu = g.mean(x)  # (..., 1)
    xc = g.sub(x, mu)
    var = g.mean(g.mul(xc, xc))
    std = g.sqrt(g.add_s(var, eps))
    return g.add(g.mul(g.div(xc, std), w), b)


def gelu_tanh(g: GraphBuilder, x: T) -> T:
    """``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, one rounding per primitive."""
    x3 = g.mul(g.mul(x, x), x)
    inner = g.mul_s(g.add(x, g.mul_s(x3, 0.044715)), math.sqrt(2.0 / math.pi))
    return g.mul(g.mul_s(x, 0.5), g.add_s(g.tanh(inner), 1.0))


def softmax(g: GraphBuilder, x: T) -> T:
    z = g.sub(x, g.max(x))  # the max is a constant shift: softmax is invariant to it
    ez = g.exp(z)
    return g.div(ez, g.sum(ez))


def cross_entropy(g: GraphBuilder, logits: T, targets: T) -> T:
    """Mean negative log-likelihood; ``logits (N, V)``, ``targets (N, 1)`` class ids as floats."""
    z = g.sub(logits, g.max(logits))
    lse = g.log(g.sum(g.exp(z)))  # (N, 1)
    nll = g.sub(lse, g.gather(z, targets))  # (N, 1)
    return g.mean(g.reshape(nll, (1, nll.shape[0])))  # (1, 1)


def mse(g: GraphBuilder, pred: T, target: T) -> T:
    d = g.sub(pred, target)
    sq = g.mul(d, d)
    return g.mean(g.reshape(sq, (1, math.prod(sq.shape))))  # (1, 1)


# --- models -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MLPConfig:
    """A ReLU MLP regressing one-hot labels with MSE (the on-chain-adjudicable model)."""

    n_in: int = 64
    hidden: tuple[int, ...] = (32,)
    n_out: int = 10


@dataclass(frozen=True)
class GPTConfig:
    """A character-level GPT (nanoGPT shape: pre-LN blocks, GELU MLP, causal attention)."""

    vocab: int = 32
    context: int = 16
    n_layer: int = 1
    n_head: int = 2
    d_model: int = 32


ParamSpec = list[tuple[str, tuple[int, ...], str]]
"""(name, shape, init) with init one of 'zeros', 'ones', 'normal', 'uniform:<fan_in>'."""


def mlp_params(cfg: MLPConfig) -> ParamSpec:
    dims = (cfg.n_in, *cfg.hidden, cfg.n_out)
    out: ParamSpec = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        out += [(f"l{i}.w", (b, a), f"uniform:{a}"), (f"l{i}.b", (b,), f"uniform:{a}")]
    return out


def mlp_forward(g: GraphBuilder, cfg: MLPConfig, p: dict[str, T], data: T) -> T:
    """``data (B, n_in + 1)``: features then the label; returns the MSE loss (1, 1)."""
    B = data.shape[0]
    x = g.slice(data, 1, 0, cfg.n_in)  # (B, n_in)
    label = g.reshape(g.slice(data, 1, cfg.n_in, 1), (B,))
    y = g.one_hot(label, cfg.n_out)  # (B, n_out)
    h = x
    n_layers = len(cfg.hidden) + 1
    for i in range(n_layers):
        h = linear(g, h, p[f"l{i}.w"], p[f"l{i}.b"])
        if i < n_layers - 1:
            h = g.relu(h)
    return mse(g, h, y)


def gpt_params(cfg: GPTConfig) -> ParamSpec:
    C, V, Tn = cfg.d_model, cfg.vocab, cfg.context
    out: ParamSpec = [("wte_t", (C, V), "normal"), ("wpe", (1, Tn, C), "normal")]
    for i in range(cfg.n_layer):
        out += [
            (f"h{i}.ln1.w", (C,), "ones"),
            (f"h{i}.ln1.b", (C,), "zeros"),
            (f"h{i}.attn.w", (3 * C, C), "normal"),
            (f"h{i}.attn.b", (3 * C,), "zeros"),
            (f"h{i}.proj.w", (C, C), "normal"),
            (f"h{i}.proj.b", (C,), "zeros"),
            (f"h{i}.ln2.w", (C,), "ones"),
            (f"h{i}.ln2.b", (C,), "zeros"),
            (f"h{i}.fc.w", (4 * C, C), "normal"),
            (f"h{i}.fc.b", (4 * C,), "zeros"),
            (f"h{i}.fc2.w", (C, 4 * C), "normal"),
            (f"h{i}.fc2.b", (C,), "zeros"),
        ]
    out += [("lnf.w", (C,), "ones"), ("lnf.b", (C,), "zeros"), ("head.w", (V, C), "normal")]
    return out


def attention(g: GraphBuilder, cfg: GPTConfig, p: dict[str, T], i: int, x: T, mask: T) -> T:
    B, Tn, C = x.shape
    H, hs = cfg.n_head, C // cfg.n_head
    qkv = linear(g, x, p[f"h{i}.attn.w"], p[f"h{i}.attn.b"])  # (B, T, 3C)

    def heads(t: T) -> T:
        return g.permute(g.reshape(t, (B, Tn, H, hs)), (0, 2, 1, 3))  # (B, H, T, hs)

    q, k, v = (heads(g.slice(qkv, 2, j * C, C)) for j in range(3))
    att = g.mul_s(g.matmul(q, k), 1.0 / math.sqrt(hs))  # (B, H, T, T)
    att = softmax(g, g.add(att, mask))
    y = g.matmul(att, g.transpose(v))  # (B, H, T, hs)
    y = g.reshape(g.permute(y, (0, 2, 1, 3)), (B, Tn, C))  # (B, T, C)
    return linear(g, y, p[f"h{i}.proj.w"], p[f"h{i}.proj.b"])


def gpt_forward(g: GraphBuilder, cfg: GPTConfig, p: dict[str, T], data: T) -> T:
    """``data (B, T+1)`` token ids as floats; returns the next-token cross-entropy (1, 1)."""
    B, Tn, C = data.shape[0], cfg.context, cfg.d_model
    idx = g.slice(data, 1, 0, Tn)  # (B, T)
    tgt = g.reshape(g.slice(data, 1, 1, Tn), (B * Tn, 1))
    oh = g.reshape(g.one_hot(idx, cfg.vocab), (B * Tn, cfg.vocab))  # (B*T, V)
    x = g.reshape(g.matmul(oh, p["wte_t"]), (B, Tn, C))  # token embedding as an exact one-hot product
    x = g.add(x, p["wpe"])
    causal = np.triu(np.full((Tn, Tn), -1e9, np.float32), k=1).reshape(1, 1, Tn, Tn)
    mask = g.const(causal, "causal_mask")
    for i in range(cfg.n_layer):
        x = g.add(x, attention(g, cfg, p, i, layer_norm(g, x, p[f"h{i}.ln1.w"], p[f"h{i}.ln1.b"]), mask))
        h = layer_norm(g, x, p[f"h{i}.ln2.w"], p[f"h{i}.ln2.b"])
        h = linear(g, gelu_tanh(g, linear(g, h, p[f"h{i}.fc.w"], p[f"h{i}.fc.b"])), p[f"h{i}.fc2.w"], p[f"h{i}.fc2.b"])
        x = g.add(x, h)
    x = layer_norm(g, x, p["lnf.w"], p["lnf.b"])
    logits = linear(g, x, p["head.w"], None)  # (B, T, V)
    return cross_entropy(g, g.reshape(logits, (B * Tn, cfg.vocab)), tgt)


def init_params(spec: ParamSpec, seed: int, std: float = 0.02) -> list[np.ndarray]:
    """Deterministic initial parameters (committed as the initial state, so any RNG would do)."""
    rng = np.random.default_rng(seed)
    out = []
    for _, shape, init in spec:
        if init == "zeros":
            a = np.zeros(shape, np.float32)
        elif init == "ones":
            a = np.ones(shape, np.float32)
        elif init == "normal":
            a = (rng.standard_normal(shape) * std).astype(np.float32)
        elif init.startswith("uniform:"):
            bound = 1.0 / math.sqrt(int(init.split(":")[1]))
            a = rng.uniform(-bound, bound, shape).astype(np.float32)
        else:
            raise ValueError(f"unknown init {init!r}")
        out.append(a + np.float32(0.0))
    return out
