"""The built-in models as ordinary ``torch.nn`` modules, named like their usual state_dicts.

The GPT follows nanoGPT's names (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn.weight``,
``lm_head.weight``, ...), the MLP ``layers.<i>.weight`` / ``layers.<i>.bias``. Exported weights
(``vtrain export``) load into these with ``load_state_dict(strict=True)``; :data:`RENAMES` maps the
step graph's parameter names to them.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vtrain.models.nn import GPTConfig, MLPConfig


class MLP(nn.Module):
    """ReLU MLP: ``layers[i]`` are the linear layers (the step graph's ``l<i>``)."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        dims = (cfg.n_in, *cfg.hidden, cfg.n_out)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


class _Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class _FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.c_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.attn = _Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=1e-5)
        self.mlp = _FeedForward(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Character-level GPT in nanoGPT's layout; ``forward(idx)`` returns logits ``(B, T, vocab)``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab, cfg.d_model),
            wpe=nn.Embedding(cfg.context, cfg.d_model),
            h=nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=nn.LayerNorm(cfg.d_model, eps=1e-5),
        ))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.cfg.context:
            raise ValueError(f"expected at most {self.cfg.context} tokens of context, got {T}")
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(T))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


_GPT_RENAMES: list[tuple[str, str]] = [
    (r"h(\d+)\.ln1\.([wb])", r"transformer.h.\1.ln_1.\2"),
    (r"h(\d+)\.ln2\.([wb])", r"transformer.h.\1.ln_2.\2"),
    (r"h(\d+)\.attn\.([wb])", r"transformer.h.\1.attn.c_attn.\2"),
    (r"h(\d+)\.proj\.([wb])", r"transformer.h.\1.attn.c_proj.\2"),
    (r"h(\d+)\.fc\.([wb])", r"transformer.h.\1.mlp.c_fc.\2"),
    (r"h(\d+)\.fc2\.([wb])", r"transformer.h.\1.mlp.c_proj.\2"),
    (r"lnf\.([wb])", r"transformer.ln_f.\1"),
    (r"head\.w", r"lm_head.w"),
]


def state_dict_name(model: str, name: str) -> str:
    """The state_dict key of the step graph's parameter ``name`` (other models: unchanged)."""
    if model == "mlp":
        m = re.fullmatch(r"l(\d+)\.([wb])", name)
        new = f"layers.{m.group(1)}.{m.group(2)}" if m else name
    elif model == "gpt":
        if name == "wte_t":
            return "transformer.wte.weight"
        if name == "wpe":
            return "transformer.wpe.weight"
        new = name
        for pat, rep in _GPT_RENAMES:
            if re.fullmatch(pat, name):
                new = re.sub(pat, rep, name)
                break
    else:
        return name
    return re.sub(r"\.w$", ".weight", re.sub(r"\.b$", ".bias", new))


def state_dict_value(model: str, name: str, value: np.ndarray) -> np.ndarray:
    """The step graph keeps the token embedding transposed ``(C, V)`` and ``wpe`` as ``(1, T, C)``."""
    if model == "gpt" and name == "wte_t":
        return np.ascontiguousarray(value.T)
    if model == "gpt" and name == "wpe":
        return np.ascontiguousarray(value.reshape(value.shape[1:]))
    return value


def module_for(model: str, cfg: MLPConfig | GPTConfig) -> nn.Module:
    if model == "mlp":
        assert isinstance(cfg, MLPConfig)
        return MLP(cfg)
    assert isinstance(cfg, GPTConfig)
    return GPT(cfg)
