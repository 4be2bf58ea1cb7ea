"""Hugging Face ``GPT2LMHeadModel`` (random init from a ``GPT2Config``; no weights or tokenizer are
downloaded) trained on byte-level tokens of a text file, through the torch front end.

    vtrain train --out runs/gpt2 --model examples/hf_gpt2.py:small --steps 4 --batch-size 2
    vtrain train --out runs/gpt2-117m --model examples/hf_gpt2.py:full --steps 1 --batch-size 1

``small``: 2 layers, width 64, context 32, the full 50,257-token vocabulary. ``full``: GPT-2's
117M configuration (12 layers, width 768, context 1024 by default). Tokens are the text's UTF-8
bytes (ids 0..255 of GPT-2's byte-level vocabulary). Attention is the ``eager`` implementation
(the causal mask is a SELECT; torch 2.13's decomposition of SDPA at dropout 0 fails to export).
"""

from __future__ import annotations

from pathlib import Path

import torch.nn.functional as F

import vtrain

# The project's README (found from the installed package, not from this file: a run folder pins
# a copy of this file, and a replay from that copy must read the same text; the dataset's sha256
# is checked either way).
DEFAULT_TEXT = Path(vtrain.__file__).resolve().parents[1] / "README.md"


def lm_loss(out, target):
    """Next-token cross-entropy over every position."""
    return F.cross_entropy(out.logits.flatten(0, 1), target.flatten())


def _task(cfg_kwargs: dict, context: int, text: str | None, lr: float, optimizer: str, clip: float | None,
          warmup: int, total_steps: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    from vtrain.frontend import Schedule, TorchTask
    from vtrain.frontend.data import text_bytes

    cfg = GPT2Config(n_positions=max(context, cfg_kwargs.pop("n_positions", context)), bos_token_id=0,
                     eos_token_id=0, **cfg_kwargs)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg)
    x, y = text_bytes(text or DEFAULT_TEXT, context)
    if optimizer == "AdamW":
        opt = {"name": "AdamW", "lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    else:
        opt = {"name": "SGD", "lr": lr, "momentum": 0.9}
    schedule = Schedule(warmup, total_steps, 0.1) if total_steps else None
    return TorchTask(model, lm_loss, opt, [x], y, clip_grad_norm=clip, schedule=schedule)


def small(context: int = 32, n_layer: int = 2, n_embd: int = 64, n_head: int = 2, vocab_size: int = 50257,
          dropout: float = 0.1, text: str | None = None, lr: float = 1e-3, optimizer: str = "AdamW",
          clip: float | None = 1.0, warmup: int = 2, total_steps: int = 100):
    """A small GPT-2 (full vocabulary by default) with dropout, AdamW, clipping and a warmup-cosine schedule."""
    return _task(dict(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, resid_pdrop=dropout,
                      embd_pdrop=dropout, attn_pdrop=dropout), context, text, lr, optimizer, clip, warmup,
                 total_steps)


def full(context: int = 1024, text: str | None = None, lr: float = 6e-4, clip: float | None = 1.0,
         warmup: int = 100, total_steps: int = 1000):
    """GPT-2 117M (GPT2Config() defaults: 12 layers, 12 heads, width 768, vocab 50,257)."""
    return _task(dict(n_positions=1024), context, text, lr, "AdamW", clip, warmup, total_steps)
