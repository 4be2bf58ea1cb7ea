"""A tiny Hugging Face ``BertForSequenceClassification`` (random init from a ``BertConfig`` with
``hidden_act="gelu"``, the exact erf GELU; no weights or tokenizer are downloaded), trained through
the torch front end on synthetic token sequences::

    vtrain train --out runs/bert --model examples/hf_bert.py:tiny --steps 2 --batch-size 4
    vtrain replay --run runs/bert

Each GELU lowers to ``0.5 x (1 + ERF(x / sqrt 2))`` (docs/frontend.md): the ERF op is certified-rounded
and ruled on-chain like TANH. Attention is the ``eager`` implementation; dropout is off (the
classification head's pooler keeps its tanh).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def cls_loss(out, target):
    """Cross-entropy of the classification logits."""
    return F.cross_entropy(out.logits, target)


def tiny(vocab_size: int = 64, hidden: int = 16, layers: int = 1, heads: int = 2, seq: int = 8, n: int = 16,
         labels: int = 3, lr: float = 1e-2, seed: int = 0):
    """BERT with ``hidden_act="gelu"``: ``layers`` encoder layers of width ``hidden``, ``n`` random sequences
    of ``seq`` tokens with random labels; AdamW."""
    from transformers import BertConfig, BertForSequenceClassification

    from vtrain.frontend import TorchTask

    cfg = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=seq, hidden_act="gelu",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=labels)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, (n, seq)).astype(np.int64)
    y = rng.integers(0, labels, (n,)).astype(np.int64)
    return TorchTask(model, cls_loss, {"name": "AdamW", "lr": lr}, [ids], y)
