"""``vtrain sample``: text from a trained character-level GPT (plain FP32 torch, greedy or sampled)."""

from __future__ import annotations

import torch

from vtrain.errors import VtrainError
from vtrain.outputs.torch_models import GPT


def encode(vocab: list[str], text: str) -> list[int]:
    lut = {c: i for i, c in enumerate(vocab)}
    unknown = sorted({c for c in text if c not in lut})
    if unknown:
        raise VtrainError(f"prompt: characters not in the run's vocabulary: {''.join(unknown)!r}")
    return [lut[c] for c in text]


@torch.no_grad()
def generate(model: GPT, vocab: list[str], prompt: str, tokens: int, temperature: float = 0.0,
             seed: int = 0) -> str:
    """``tokens`` new characters after ``prompt`` (temperature 0: greedy; else softmax sampling
    with a generator seeded by ``seed``, so the same call gives the same text)."""
    model.eval()
    ids = encode(vocab, prompt) if prompt else [0]
    gen = torch.Generator().manual_seed(seed)
    ctx = model.cfg.context
    out = list(ids)
    for _ in range(tokens):
        x = torch.tensor([out[-ctx:]], dtype=torch.int64)
        logits = model(x)[0, -1].double()
        if temperature <= 0:
            nxt = int(torch.argmax(logits))
        else:
            p = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(p, 1, generator=gen))
        out.append(nxt)
    text = "".join(vocab[i] for i in out)
    return text if prompt else text[1:]
