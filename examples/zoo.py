"""A zoo of small, ordinary models a practitioner brings to ``vtrain train --model FILE.py:FACTORY``.

Each factory returns a tiny task (a few hundred parameters, 16 samples) that captures, trains and
replays in seconds; ``tests/test_frontend_zoo.py`` checks each against torch autograd and
torch.optim in FP64 and trains and replays one through the CLI::

    vtrain train --out runs/zoo --model examples/zoo.py:mlp_acts --steps 2 --batch-size 4
    vtrain replay --run runs/zoo

``REFUSED`` lists factories that use an op without an exact lowering: the build stops with an
error naming the op, the module and the source line.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

N = 16


def _x(*shape: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((N, *shape)) * scale).astype(np.float32)


def _labels(k: int, *shape: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, k, (N, *shape)).astype(np.int64)


def _task(module, loss, opt, inputs, target, **kw):
    from vtrain.frontend import TorchTask

    return TorchTask(module, loss, opt, inputs, target, **kw)


# --- 1. an MLP with every common activation ------------------------------------------------------------
class ActsMLP(nn.Module):
    def __init__(self, d: int = 6, h: int = 8, k: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, h)
        self.acts = nn.ModuleList([nn.LeakyReLU(0.1), nn.ELU(), nn.Softplus(), nn.Hardtanh(-0.5, 0.5),
                                   nn.ReLU6(), nn.Mish(), nn.GELU(approximate="tanh"), nn.SiLU()])
        self.lins = nn.ModuleList([nn.Linear(h, h) for _ in self.acts])
        self.out = nn.Linear(h, k)

    def forward(self, x):
        h = self.inp(x)
        for act, lin in zip(self.acts, self.lins):
            h = lin(act(h))
        return self.out(h)


def mlp_acts(lr: float = 0.05):
    """LeakyReLU, ELU, Softplus, Hardtanh, ReLU6, Mish, GELU(tanh), SiLU; cross-entropy with label
    smoothing; SGD with Nesterov momentum."""
    return _task(ActsMLP(), lambda o, t: F.cross_entropy(o, t, label_smoothing=0.1),
                 {"name": "SGD", "lr": lr, "momentum": 0.9, "nesterov": True}, [_x(6, scale=3.0)], _labels(3))


# --- 2. a CNN with GroupNorm, channel dropout, global average pooling, Flatten, Dropout ----------------------
class GroupNormCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Dropout2d(0.25),
                                  nn.Conv2d(4, 4, 3, padding=1), nn.InstanceNorm2d(4, affine=True), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(4, 3))

    def forward(self, x):
        return self.body(x)


def cnn_groupnorm(lr: float = 1e-2):
    """GroupNorm, Dropout2d, InstanceNorm2d (affine), AdaptiveAvgPool2d(1), Flatten, Dropout; cross-entropy; AdamW."""
    return _task(GroupNormCNN(), F.cross_entropy, {"name": "AdamW", "lr": lr, "weight_decay": 0.01},
                 [_x(1, 6, 6)], _labels(3))


# --- 3. a Conv1d sequence regressor --------------------------------------------------------------------
class Conv1dSeq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(2, 4, 3, padding=1)
        self.c2 = nn.Conv1d(4, 4, 3, padding=2, dilation=2)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = F.elu(self.c1(x))
        h = torch.clamp(self.c2(h), -1.0, 1.0) + h
        return self.head(h.mean(-1)).squeeze(-1)


def conv1d_seq(lr: float = 1e-2):
    """Conv1d (dilated), ELU, clamp; smooth L1 loss; Adam with coupled weight decay."""
    return _task(Conv1dSeq(), F.smooth_l1_loss, {"name": "Adam", "lr": lr, "weight_decay": 1e-3},
                 [_x(2, 8)], _x(seed=2))


# --- 4. an LSTM cell loop and an nn.GRU ---------------------------------------------------------------
class CellLoop(nn.Module):
    def __init__(self, d: int = 3, h: int = 5, k: int = 2) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(d, h)
        self.head = nn.Linear(h, k)

    def forward(self, x):  # x [B, T, d]
        B = x.shape[0]
        h = x.new_zeros(B, self.cell.hidden_size)
        c = x.new_zeros(B, self.cell.hidden_size)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


def lstm_cell(lr: float = 0.05):
    """An nn.LSTMCell unrolled over 4 steps (sigmoid, tanh gates); binary cross-entropy with logits; SGD."""
    y = (np.random.default_rng(3).random((N, 2)) > 0.5).astype(np.float32)
    return _task(CellLoop(), F.binary_cross_entropy_with_logits, {"name": "SGD", "lr": lr, "momentum": 0.9},
                 [_x(4, 3)], y)


class GRUModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(3, 5, batch_first=True)
        self.head = nn.Linear(5, 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def gru(lr: float = 1e-2):
    """An nn.GRU over 4 steps; MSE; AdamW."""
    return _task(GRUModel(), F.mse_loss, {"name": "AdamW", "lr": lr}, [_x(4, 3)], _x(2, seed=4))


# --- 5. an embedding + mean-pooling text classifier -----------------------------------------------------
class BagOfWords(nn.Module):
    def __init__(self, vocab: int = 20, d: int = 6, k: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, k)

    def forward(self, ids):
        return F.log_softmax(self.head(self.emb(ids).mean(1)), -1)


def embed_mean(lr: float = 0.1):
    """nn.Embedding, mean pooling, log_softmax; NLL loss; SGD with weight decay."""
    return _task(BagOfWords(), F.nll_loss, {"name": "SGD", "lr": lr, "weight_decay": 1e-4},
                 [_labels(20, 5, seed=5)], _labels(4, seed=6))


class EmbeddingBagModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(20, 6, mode="mean")
        self.head = nn.Linear(6, 4)

    def forward(self, ids):
        return self.head(self.bag(ids))


def embedding_bag(lr: float = 0.1):
    """nn.EmbeddingBag(mode='mean') on fixed-length bags; cross-entropy; SGD."""
    return _task(EmbeddingBagModel(), F.cross_entropy, {"name": "SGD", "lr": lr},
                 [_labels(20, 5, seed=5)], _labels(4, seed=6))


# --- 6. a hand-written transformer block -----------------------------------------------------------------
class TinyBlock(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 8, heads: int = 2, ctx: int = 6) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(approximate="tanh"), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, vocab)
        mask = torch.triu(torch.full((ctx, ctx), float("-inf")), 1)
        self.register_buffer("mask", mask)

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask, need_weights=False)
        x = x + a
        x = x + self.ff(self.ln2(x))
        return self.head(x)


def transformer_mha(lr: float = 1e-2):
    """Token + position embeddings, nn.MultiheadAttention with a causal mask, LayerNorm, GELU(tanh) MLP;
    next-token cross-entropy; AdamW with clipping."""
    toks = _labels(16, 7, seed=7)
    return _task(TinyBlock(), lambda o, t: F.cross_entropy(o.flatten(0, 1), t.flatten()),
                 {"name": "AdamW", "lr": lr, "betas": (0.9, 0.95)}, [toks[:, :6]], toks[:, 1:],
                 clip_grad_norm=1.0)


class SDPABlock(nn.Module):
    def __init__(self, d: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def transformer_sdpa(lr: float = 1e-2):
    """F.scaled_dot_product_attention(is_causal=True); MSE; AdamW."""
    return _task(SDPABlock(), F.mse_loss, {"name": "AdamW", "lr": lr}, [_x(5, 8)], _x(5, 8, seed=8))


# --- 6b. a Llama-style block: RMSNorm, rotary embeddings over the whole head, SwiGLU, tied weights --------------
class LlamaStyle(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 8, heads: int = 2, ctx: int = 6) -> None:
        super().__init__()
        self.heads, hd = heads, d // heads
        self.tok = nn.Embedding(vocab, d)
        self.norm1, self.norm2, self.norm = nn.RMSNorm(d), nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        freqs = torch.outer(torch.arange(ctx).float(), 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd))
        self.register_buffer("cos", torch.cat([freqs.cos()] * 2, -1), persistent=False)
        self.register_buffer("sin", torch.cat([freqs.sin()] * 2, -1), persistent=False)
        self.rot = hd  # rotary over the whole head: x[..., rot:] is empty (as Phi-3 / partial_rotary_factor 1)

    def rope(self, x):
        r, rest = x[..., : self.rot], x[..., self.rot :]
        half = r.shape[-1] // 2
        rotated = torch.cat([-r[..., half:], r[..., :half]], -1)
        return torch.cat([r * self.cos + rotated * self.sin, rest], -1)

    def forward(self, ids):
        x = self.tok(ids)
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(C, -1))
        y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True, dropout_p=0.1)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(self.norm(x)).transpose(1, 2)  # [B, vocab, T]: cross-entropy's class axis 1


def llama_style(lr: float = 0.1):
    """RMSNorm, rotary embeddings (an empty slice past the head), SDPA with attention dropout, SwiGLU, tied
    embedding / head; cross-entropy over [B, vocab, T] with label smoothing; SGD with momentum."""
    toks = _labels(16, 7, seed=9)
    return _task(LlamaStyle(), lambda o, t: F.cross_entropy(o, t, label_smoothing=0.1),
                 {"name": "SGD", "lr": lr, "momentum": 0.9}, [toks[:, :6]], toks[:, 1:])


# --- 7. statistics in the forward ------------------------------------------------------------------------
class StatsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.out = nn.Linear(4, 2)
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x):
        h = self.lin(x) * self.scale
        feats = torch.stack([
            torch.logsumexp(h, -1),
            h.var(-1),
            h.std(-1, unbiased=False),
            torch.linalg.vector_norm(h, dim=-1),
        ], -1)
        feats = torch.maximum(feats, torch.minimum(h[:, :4], h[:, 2:])) + torch.clamp_min(h[:, :4], 0.0)
        return self.out(F.logsigmoid(feats) + feats.sign() * feats.abs())


def stats_forward(lr: float = 1e-2):
    """logsumexp, var (unbiased), std, vector_norm, maximum, minimum, clamp_min, logsigmoid, sign, abs;
    L1 loss; Adam."""
    return _task(StatsNet(), F.l1_loss, {"name": "Adam", "lr": lr}, [_x(6, scale=2.0)], _x(2, seed=9))


# --- 8. a frozen backbone and a parameter the forward never uses --------------------------------------
class FrozenAndUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(5, 8), nn.Tanh())
        for p in self.backbone.parameters():
            p.requires_grad_(False)
        self.head = nn.Linear(8, 3)
        self.aux_head = nn.Linear(8, 3)  # defined, never called

    def forward(self, x):
        return self.head(self.backbone(x))


def frozen_unused(lr: float = 0.05):
    """A frozen (requires_grad=False) backbone and an unused head; cross-entropy; SGD with momentum."""
    return _task(FrozenAndUnused(), F.cross_entropy, {"name": "SGD", "lr": lr, "momentum": 0.9},
                 [_x(5)], _labels(3))


# --- 9. a buffer the forward updates itself, under no_grad (an EMA of the features) ---------------------
class FeatureEMA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        h = self.lin(x)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        return h - self.ema


def ema_buffer(lr: float = 0.1):
    """A buffer updated in place in the forward inside torch.no_grad() (no gradient flows through it);
    cross-entropy; SGD."""
    return _task(FeatureEMA(), F.cross_entropy, {"name": "SGD", "lr": lr, "momentum": 0.5}, [_x(4)], _labels(3))


# --- 10. a convolutional autoencoder: strided convs down, transposed convs up ---------------------------
class ConvAutoencoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU())  # 8x8 -> 2x2
        self.dec = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1), nn.Sigmoid())

    def forward(self, x):
        return self.dec(self.enc(x))


def conv_autoencoder(lr: float = 1e-2):
    """Conv2d(stride 2) encoder, ConvTranspose2d decoder (output_padding), BatchNorm2d, Sigmoid; MSE to the
    input; Adam."""
    x = _x(1, 8, 8)
    return _task(ConvAutoencoder(), F.mse_loss, {"name": "Adam", "lr": lr}, [x], 1.0 / (1.0 + np.exp(-x)))


# --- 11. a small U-Net: upsampling decoder with skips, uneven adaptive pooling, argmax in the loss -------
class UNetDecoder(nn.Module):
    def __init__(self, c: int = 4, k: int = 3) -> None:
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.ReLU())
        self.down2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.bottom = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.ReLU())
        self.up_bilinear = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.up_nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec2 = nn.Sequential(nn.Conv2d(4 * c, c, 3, padding=1), nn.ReLU())
        self.dec1 = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(3)  # 8x8 -> 3x3: windows of 3 and 4
        self.head = nn.Linear(9 * c, k)

    def forward(self, x):
        h1 = self.down1(x)
        h2 = self.down2(h1)
        h = self.dec2(torch.cat([self.up_bilinear(self.bottom(h2)), h2], 1))
        h = self.dec1(torch.cat([self.up_nearest(h), h1], 1))
        return self.head(self.pool(h).flatten(1))


def hard_example_loss(out, t):
    """Cross-entropy with misclassified samples (argmax != target) weighted twice."""
    weight = 1.0 + (out.argmax(1) != t).float()
    return (weight * F.cross_entropy(out, t, reduction="none")).mean()


def unet_decoder(lr: float = 1e-2):
    """Max pooling down, bilinear (align_corners) and nearest upsampling up, concatenated skips,
    AdaptiveAvgPool2d to a size that does not divide the input; argmax in the loss; AdamW."""
    return _task(UNetDecoder(), hard_example_loss, {"name": "AdamW", "lr": lr, "weight_decay": 0.01},
                 [_x(1, 8, 8)], _labels(3))


def erf_gelu():
    """nn.Sequential(Linear, GELU(), Linear): torch's default, exact GELU (erf; the ERF primitive); MSE; AdamW."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    return _task(model, F.mse_loss, {"name": "AdamW", "lr": 1e-2}, [_x(4, scale=2.0)], _x(4, seed=2))


# --- refused: each stops the build with a message naming the op, module and line -----------------------


class Sorter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sort(self.lin(x), -1).values


def sort_model():
    """torch.sort: refused (no lowering)."""
    return _task(Sorter(), F.mse_loss, {"name": "SGD", "lr": 0.1}, [_x(4)], _x(4, seed=2))


class MaxNormEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 4, max_norm=1.0)
        self.head = nn.Linear(4, 4)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def max_norm_embedding():
    """nn.Embedding(max_norm=1.0): refused (it renormalises the weight in place in the forward)."""
    return _task(MaxNormEmbedding(), F.cross_entropy, {"name": "SGD", "lr": 0.1}, [_labels(20, 5)], _labels(4))


TRAINED = ["mlp_acts", "cnn_groupnorm", "conv1d_seq", "lstm_cell", "gru", "embed_mean", "embedding_bag",
           "transformer_mha", "transformer_sdpa", "llama_style", "stats_forward", "frozen_unused", "ema_buffer",
           "erf_gelu", "conv_autoencoder", "unet_decoder"]
REFUSED = ["sort_model", "max_norm_embedding"]
