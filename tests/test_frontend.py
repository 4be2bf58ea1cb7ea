"""The torch front end: each lowering and whole models agree with torch autograd in FP64 (loss,
gradients, running statistics, one optimizer step); errors name the ATen op and its origin."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from vtrain.errors import DatasetError, SpecError
from vtrain.frontend import Schedule, TorchTask, capture
from vtrain.frontend.check import compare_fp64, compare_step_fp64
from vtrain.frontend.errors import FrontendError, UnsupportedOp
from vtrain.graph.step_graph import OpKind

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-5  # FP64 noise plus the FP32 rounding of scalar constants the graph stores
SGD = {"name": "SGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}
ADAMW = {"name": "AdamW", "lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}


class Fn(nn.Module):
    """``fn(x, w)`` with one trainable weight ``w`` of ``shape`` (so every op has a gradient to check)."""

    def __init__(self, fn, shape, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(shape, generator=gen) * 0.5)
        self.fn = fn

    def forward(self, x):
        return self.fn(x, self.w)


def _sum_loss(out, y):
    return (out * y).sum()


def _task(module, x: np.ndarray, y: np.ndarray, loss=_sum_loss, opt=SGD, **kw) -> TorchTask:
    return TorchTask(module, loss, opt, [x], y, **kw)


def _check(task: TorchTask, batch: int, step_too: bool = True, seed: bytes | None = None) -> None:
    cap = capture(task, batch)
    rows = task.samples()[:batch]
    cmp = compare_fp64(task, cap, rows, seed=seed)
    assert cmp.worst() < TOL, (cmp.loss, {k: float(np.abs(a - b).max()) for k, (a, b) in cmp.grads.items()})
    if step_too:
        res = compare_step_fp64(task, cap, rows, seed=seed)
        worst = max(float(np.abs(a - b).max()) / max(1e-3, float(np.abs(b).max())) for a, b in res.values())
        assert worst < TOL


def _rand(shape, seed=0, lo=-1.0, hi=1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


# --- one lowering (or a few) at a time ------------------------------------------------------------
ELEMENTWISE = {
    "add_sub_mul_div": (lambda x, w: (x + w) * w - x / (w * w + 1.0) - 2.0 * x + 3.0, (5,)),
    "rsub_neg_abs": (lambda x, w: 1.0 - (-(x * w)).abs() + torch.abs(w), (5,)),
    "relu_tanh": (lambda x, w: torch.tanh(F.relu(x * w + 0.1)), (5,)),
    "exp_log_sqrt": (lambda x, w: torch.log(torch.exp(x * w) + 1.0) + torch.sqrt(w * w + 1.0), (5,)),
    "rsqrt_reciprocal_pow": (lambda x, w: torch.rsqrt(w * w + 1.0) + 1.0 / (x * x + 2.0) + (x * w) ** 3 + w**2
                             + (w * w + 1.0) ** 0.5 + (w * w + 1.0) ** -1, (5,)),
    "sigmoid_silu": (lambda x, w: torch.sigmoid(x * w) + F.silu(x + w), (5,)),
    "gelu_tanh": (lambda x, w: F.gelu(x * w, approximate="tanh"), (5,)),
    "gelu_erf": (lambda x, w: F.gelu(x * w) + torch.erf(x - w) + torch.erfc(x * w), (5,)),
    "where_compare": (lambda x, w: torch.where(x > 0.2, x * w, w) + torch.where(x <= -0.3, w, 0.0 * w)
                      + torch.where((x < 0.5) & (x >= -0.5), w * w, x) + (x == 0.25) * w + (x != 1.0) * w, (5,)),
    "masked_fill_any": (lambda x, w: (w * x).masked_fill(x < 0, -1e9).softmax(-1)
                        * (x > 0.9).any(-1, keepdim=True), (5,)),
    "broadcast_bias": (lambda x, w: x * w[:, None] + w[None, :1], (4,)),
    "or_detach_index": (lambda x, w: torch.where((x > 0.5) | (x < -0.5), w, x) * w.detach()
                        + (x * w)[..., torch.tensor([4, 0, 0, 2, 1])]
                        + torch.div(x, w * w + 1, rounding_mode=None), (5,)),
    "floor_remainder_fmod": (lambda x, w: torch.remainder(3 * x, w + 2.0) + torch.fmod(3 * x, -(w + 2.0))
                             + torch.floor(4 * x * w) * w + torch.ceil(4 * x) * w + torch.trunc(4 * x - w)
                             + torch.div(4 * x, w + 2.0, rounding_mode="floor") * w
                             + torch.div(4 * x, -(w + 2.0), rounding_mode="trunc") * w
                             + torch.round(4 * x * w) + torch.round(x.new_tensor([0.5, 1.5, -0.5, -2.5, 2.5])) * w,
                             (5,)),
    "slice_assign_circular_pad": (lambda x, w: _assigned(x * w) + F.pad(x * w, (2, 1, 1, 0), mode="circular")
                                  [:, 1:, 2:-1], (5,)),
    "argmax_indices_cumsum": (lambda x, w: (x * w).cumsum(1) + torch.cumsum(x * w, -1)
                              + (x * w).argmax(-1, keepdim=True) * w + (x * w).max(1).indices[:, None] * w
                              + torch.floor(2 * x).argmin(-1, keepdim=True) * w + (x * w).argmin() * w, (5,)),
}


def _assigned(h: torch.Tensor) -> torch.Tensor:
    """In-place slice assignments (export makes them slice_scatter / select_scatter / copy)."""
    out = torch.zeros_like(h)
    out[..., ::2] = h[..., 1:4] * 2
    out[:, 1] = h[:, 3]
    g = h.clone()
    g[..., 2:4] = 0.5
    return out + g


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
@pytest.mark.parametrize("seed", [0, 1])
def test_elementwise_lowerings(name: str, seed: int) -> None:
    fn, shape = ELEMENTWISE[name]
    x = _rand((6, 4, 5) if name != "broadcast_bias" else (6, 4, 4), seed)
    y = _rand(x.shape, seed + 10)
    _check(_task(Fn(fn, shape, seed), x, y), 3, step_too=seed == 0)


MOVEMENT = {
    "view_permute_transpose": (lambda x, w: (x.view(3, 2, 2) * w.view(2, 2)).permute(2, 0, 1).transpose(0, 1)
                               .reshape(3, 4)),
    "cat_stack_split": (lambda x, w: torch.cat([*torch.split(x * w, [1, 2, 1], dim=1), x], dim=1)
                        + torch.stack([x, w.expand(3, 4)], 0).sum(0).repeat(1, 2)),
    "slice_step_select_flatten": (lambda x, w: torch.flatten((x * w)[:, ::2]) * (x * w)[1, 1:3].sum()
                                  + (x * w)[..., -1].sum()),
    "unsqueeze_squeeze_expand": (lambda x, w: ((x * w).unsqueeze(1).expand(3, 2, 4).squeeze(0)
                                               * w.view(1, 1, 4)).sum(1)),
    "pad_chunk_unbind": (lambda x, w: F.pad(x * w, (1, 2)).chunk(7, dim=1)[1] + sum(torch.unbind(x * w, 1))[:, None]
                         + F.pad(x * w, (1, 0, 0, 1), value=0.5)[1:, 1:2]),
    "index_select_matmul": (lambda x, w: torch.index_select(x * w, 1, torch.tensor([3, 0, 0]))
                            @ (x[:, :3] * w[:3]).t()),
    "bmm_softmax_dim0": (lambda x, w: torch.softmax((x * w).view(3, 2, 2) @ (x * w).view(3, 2, 2).transpose(1, 2), 0)
                         .log_softmax(1).reshape(3, 4)),
    "mean_sum_amax_dims": (lambda x, w: (x * w).mean(0, keepdim=True) + (x * w).sum((0, 1))
                           + (x * w).amax(1, keepdim=True) + (x * w).mean()),
}


@pytest.mark.parametrize("name", sorted(MOVEMENT))
def test_movement_and_reduction_lowerings(name: str) -> None:
    x = _rand((5, 3, 4), 3)
    out = MOVEMENT[name](torch.from_numpy(x[0]), torch.ones(4))
    y = _rand((5, *out.shape), 4)
    module = Fn(lambda xb, w: torch.stack([MOVEMENT[name](xi, w) for xi in xb.unbind(0)]), (4,), 2)
    _check(_task(module, x, y), 2)


class ConvNet(nn.Module):
    def __init__(self, conv: nn.Module, pool: nn.Module | None = None, bn: bool = False) -> None:
        super().__init__()
        self.conv, self.pool = conv, pool
        self.bn = nn.BatchNorm2d(conv.out_channels) if bn else None

    def forward(self, x):
        h = self.conv(x)
        if self.bn is not None:
            h = self.bn(h)
        return self.pool(h) if self.pool is not None else h


CONVS = {
    "conv3x3_pad1": lambda: ConvNet(nn.Conv2d(2, 3, 3, padding=1)),
    "conv3x3_stride2_nobias": lambda: ConvNet(nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False)),
    "conv1x1": lambda: ConvNet(nn.Conv2d(2, 3, 1)),
    "conv1x1_stride2": lambda: ConvNet(nn.Conv2d(2, 3, 1, stride=2)),
    "conv_dilated_rect": lambda: ConvNet(nn.Conv2d(2, 3, (3, 2), padding=(2, 1), dilation=(2, 1))),
    "maxpool_pad": lambda: ConvNet(nn.Conv2d(2, 3, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1)),
    "maxpool_ties": lambda: ConvNet(nn.Conv2d(2, 3, 1), nn.Sequential(nn.ReLU(), nn.MaxPool2d(2))),
    "avgpool": lambda: ConvNet(nn.Conv2d(2, 3, 3), nn.AvgPool2d(2, stride=1, padding=1)),
    "adaptive_avgpool": lambda: ConvNet(nn.Conv2d(2, 4, 1), nn.AdaptiveAvgPool2d(2)),
    "batchnorm_train": lambda: ConvNet(nn.Conv2d(2, 3, 3, padding=1), bn=True),
    "conv_transpose_stride2": lambda: ConvNet(nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1)),
    "conv_transpose_groups_dilated": lambda: ConvNet(nn.ConvTranspose2d(2, 4, (3, 2), stride=(2, 1), padding=(2, 0),
                                                                        dilation=(1, 2), groups=2, bias=False)),
    "upsample_bilinear": lambda: ConvNet(nn.Conv2d(2, 3, 1), nn.Upsample(scale_factor=2, mode="bilinear")),
    "upsample_align_corners_bicubic": lambda: ConvNet(nn.Conv2d(2, 3, 3), nn.Sequential(
        nn.Upsample(size=(7, 5), mode="bilinear", align_corners=True), nn.Upsample(scale_factor=1.5, mode="bicubic"))),
    "adaptive_pools_uneven": lambda: ConvNet(nn.Conv2d(2, 3, 1), nn.Sequential(nn.AdaptiveMaxPool2d((4, 5)),
                                                                                nn.AdaptiveAvgPool2d(3))),
    "resize_nearest_exact_antialias": lambda: ConvNet(nn.Conv2d(2, 3, 1), Fn(lambda h, w: F.interpolate(
        F.interpolate(h, scale_factor=1.5, mode="nearest-exact"), size=(4, 5), mode="bilinear", antialias=True) * w
        + F.interpolate(h, size=(4, 5), mode="bicubic", antialias=True, align_corners=True)
        + F.interpolate(h[:, None], size=(3, 4, 5), mode="trilinear")[:, 0], (4, 5))),
    "pools_ceil_mode_divisors": lambda: ConvNet(nn.Conv2d(2, 3, 1), Fn(lambda h, w: torch.cat([p.flatten(1) for p in (
        F.max_pool2d(h, 3, 2, padding=1, ceil_mode=True), F.avg_pool2d(h, 3, 2, ceil_mode=True),
        F.avg_pool2d(h, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        F.avg_pool2d(h, 2, 3, padding=1, ceil_mode=True), F.avg_pool2d(h, 3, 2, 1, divisor_override=5))], 1) * w,
        (1,))),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_pool_batchnorm_lowerings(name: str) -> None:
    torch.manual_seed(0)
    module = CONVS[name]()
    x = _rand((6, 2, 6, 6), 5)
    out = module(torch.from_numpy(x[:1]))
    y = _rand((6, *out.shape[1:]), 6)
    _check(_task(module, x, y, opt=ADAMW), 3)


def test_conv_transpose1d_and_linear_upsampling() -> None:
    torch.manual_seed(1)
    module = nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), nn.ConvTranspose1d(3, 2, 4, stride=2, padding=1),
                           nn.Upsample(scale_factor=1.5, mode="linear"))
    x = _rand((6, 2, 7), 7)
    _check(_task(module, x, _rand((6, 2, 21), 8), opt=ADAMW), 3)


def test_3d_convolutions_pools_and_trilinear_resize() -> None:
    """Conv3d (groups, stride, padding, dilation), BatchNorm3d, MaxPool3d, AvgPool3d (ceil_mode, divisor),
    uneven AdaptiveAvgPool3d / AdaptiveMaxPool3d, ConvTranspose3d, trilinear and nearest resizing on
    [N, C, D, H, W]."""
    torch.manual_seed(2)
    module = nn.Sequential(
        nn.Conv3d(2, 4, (3, 2, 3), stride=(1, 2, 1), padding=(1, 1, 2), dilation=(1, 1, 2), groups=2),
        nn.BatchNorm3d(4), nn.ReLU(), nn.ConvTranspose3d(4, 2, 2, stride=2, padding=(1, 0, 1)),
        Fn(lambda h, w: torch.cat([p.flatten(1) for p in (
            F.max_pool3d(h, 2, 2, padding=1), F.avg_pool3d(h, (2, 3, 2), 2, padding=(1, 1, 0), count_include_pad=False),
            F.avg_pool3d(h, 3, 2, ceil_mode=True, divisor_override=5), F.adaptive_max_pool3d(h, (4, 2, 3)),
            F.adaptive_avg_pool3d(h, (4, 3, 1)), F.adaptive_avg_pool3d(h, 1),
            F.interpolate(h, size=(3, 5, 4), mode="trilinear"), F.interpolate(h, scale_factor=(0.5, 1, 1.5)),
            F.interpolate(h, size=(3, 2, 4), mode="nearest-exact"))], 1) * w, (1,)))
    x = _rand((4, 2, 4, 5, 4), 3)
    out = module(torch.from_numpy(x[:1]))
    _check(_task(module, x, _rand((4, *out.shape[1:]), 4), opt=ADAMW), 2, step_too=False)
    indices = Fn(lambda h, w: F.max_pool3d(h * w, 2, return_indices=True)[1].float(), (1,))
    with pytest.raises(UnsupportedOp, match="max_pool3d's indices output"):
        capture(_task(indices, x, _rand((4, 2, 2, 2, 2), 4)), 2)


def test_conv1d_batchnorm1d_layernorm_linear() -> None:
    torch.manual_seed(1)
    module = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(),
                           nn.LayerNorm(20), nn.Linear(20, 3))
    x = _rand((6, 2, 5), 7)
    _check(_task(module, x, np.arange(6) % 3, loss=F.cross_entropy), 4)


def test_embedding_gather_cross_entropy_and_mse() -> None:
    torch.manual_seed(2)
    module = nn.Sequential(nn.Embedding(11, 6), nn.Linear(6, 11))
    ids = np.random.default_rng(0).integers(0, 11, (8, 5))
    tgt = np.random.default_rng(1).integers(0, 11, (8, 5))
    _check(_task(module, ids, tgt, loss=lambda o, t: F.cross_entropy(o.flatten(0, 1), t.flatten())), 4)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    _check(_task(mlp, _rand((8, 4), 1), _rand((8, 2), 2), loss=F.mse_loss, opt=ADAMW), 4)


def test_dropout_matches_torch_with_the_graphs_masks() -> None:
    torch.manual_seed(3)
    module = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 2), nn.Dropout(0.5))
    task = _task(module, _rand((8, 6), 3), _rand((8, 2), 4), loss=F.mse_loss)
    cap = capture(task, 4)
    masks = [o for o in cap.graph.ops if o.kind == OpKind.DROPOUT_MASK]
    assert [o.attrs[2] for o in masks] == [0, 1]  # one salt per dropout, in execution order
    assert masks[0].attrs[0] == round(0.3 * 2**32)
    _check(task, 4, seed=bytes(range(32)))
    cmp = compare_fp64(task, cap, task.samples()[:4], seed=bytes(range(32)), step=2)
    assert cmp.worst() < TOL  # another step, another mask, still torch's value with that mask


# --- errors ------------------------------------------------------------------------------------------
class Erfinv(nn.Module):
    def forward(self, x):
        return torch.erfinv(x)


class UsesErfinv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = Erfinv()  # no lowering

    def forward(self, x):
        return self.act(torch.tanh(self.lin(x)))


def test_unsupported_op_names_the_op_module_and_line() -> None:
    task = _task(UsesErfinv(), _rand((4, 3)), _rand((4, 3)))
    with pytest.raises(UnsupportedOp) as e:
        capture(task, 2)
    msg = str(e.value)
    assert "aten.erfinv.default" in msg
    assert "module act (Erfinv)" in msg
    assert "Supported ATen ops" in msg and "aten.convolution.default" in msg
    assert "Traceback" not in msg

    class Sorts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return torch.sort(x * self.w, dim=-1).values  # no lowering

    with pytest.raises(UnsupportedOp, match=r"aten\.sort\.default has no lowering.*test_frontend\.py.*line \d+"):
        capture(_task(Sorts(), _rand((4, 3)), _rand((4, 3))), 2)


def test_optimizer_settings_are_checked() -> None:
    x, y = _rand((4, 3)), _rand((4, 3))
    for bad, match in (({"name": "RMSprop", "lr": 1}, "'SGD', 'Adam' or 'AdamW'"),
                       ({"name": "SGD", "lr": 0.1, "nesterov": True}, "nesterov"),
                       ({"name": "AdamW", "lr": 0.1, "foo": 1}, "unsupported setting")):
        with pytest.raises(FrontendError, match=match):
            capture(_task(Fn(lambda a, w: a * w, (3,)), x, y, opt=bad), 2)


# --- whole models ------------------------------------------------------------------------------------
def _resnet_task(**kw) -> TorchTask:
    import importlib.util

    spec = importlib.util.spec_from_file_location("resnet_example", ROOT / "examples" / "resnet_digits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    torch.manual_seed(0)
    return mod.task(**kw)


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
def test_resnet_matches_torch_in_fp64(optimizer: str) -> None:
    task = _resnet_task(optimizer=optimizer)
    cap = capture(task, 6)
    kinds = {o.kind for o in cap.graph.ops}
    assert {OpKind.TAKE, OpKind.MAX_GRAD, OpKind.MATMUL} <= kinds
    assert "bn.running_mean" in cap.slot_names and "layer2.shortcut.1.running_var" in cap.slot_names
    _check(task, 6)


def test_clipping_and_schedule_are_graph_ops() -> None:
    task = _resnet_task(optimizer="AdamW", clip=0.05, warmup=2, total_steps=6)
    cap = capture(task, 4, n_steps=6)
    assert sum(o.kind == OpKind.STEP for o in cap.graph.ops) == 1
    rows = task.samples()[:4]
    for step in (1, 4):  # warmup, then cosine decay: the rate comes from the committed table
        res = compare_step_fp64(task, cap, rows, step=step)
        worst = max(float(np.abs(a - b).max()) / max(1e-3, float(np.abs(b).max())) for a, b in res.values())
        assert worst < TOL
    table = Schedule(2, 6, 0.1).table(1.0, 6)
    assert table[0] == np.float32(0.5) and table[1] == 1.0 and table[-1] == np.float32(0.1)


def _gpt2(vocab: int = 300, dropout: float = 0.1):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=8, n_embd=16, n_layer=2, n_head=2,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                  bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def _lm_loss(out, t):
    return F.cross_entropy(out.logits.flatten(0, 1), t.flatten())


def test_hf_gpt2_matches_torch_in_fp64_with_dropout_and_tied_weights() -> None:
    model = _gpt2()
    toks = np.random.default_rng(0).integers(0, 300, (6, 9))
    task = TorchTask(model, _lm_loss, ADAMW, [toks[:, :8]], toks[:, 1:], clip_grad_norm=1.0)
    cap = capture(task, 3)
    assert cap.slot_names[0] == "transformer.wte.weight"
    assert cap.aliases["transformer.wte.weight"] == ["transformer.wte.weight", "lm_head.weight"]
    assert "lm_head.weight" not in cap.slot_names  # tied: one slot
    wte = cap.graph.input_op(0)
    assert any(o.kind == OpKind.TAKE and o.inputs[0] == wte for o in cap.graph.ops)  # embedding = TAKE
    assert sum(o.kind == OpKind.DROPOUT_MASK for o in cap.graph.ops) == 7
    ops = cap.graph.ops
    assert any(o.kind == OpKind.SELECT and ops[o.inputs[0]].name == "mask_keep" for o in ops)  # causal mask
    _check(task, 3, seed=bytes(range(32)))


@pytest.mark.slow
def test_gpt2_full_vocab_is_practical() -> None:
    """50,257 tokens: the embedding is a TAKE (no V-wide one-hot product in the forward)."""
    model = _gpt2(vocab=50257, dropout=0.0)
    toks = np.random.default_rng(1).integers(0, 50257, (2, 9))
    task = TorchTask(model, _lm_loss, ADAMW, [toks[:, :8]], toks[:, 1:])
    cap = capture(task, 2)
    fwd = cap.graph.ops[: cap.graph.loss_op]
    assert not any(o.kind == OpKind.ONE_HOT for o in fwd)
    _check(task, 2, step_too=False)


# --- jobs from files -----------------------------------------------------------------------------------
def test_spec_model_file_errors(tmp_path: Path) -> None:
    from vtrain.training.spec import TrainSpec, build_job

    for model, match in (("resnet", "FILE.py:FACTORY"), ("examples/resnet_digits.txt:task", r"\*\.py"),
                         (str(tmp_path / "none.py") + ":task", "no such file")):
        with pytest.raises(SpecError, match=match):
            build_job(TrainSpec(model=model))
    with pytest.raises(SpecError, match="has no function 'nope'.*task"):
        build_job(TrainSpec(model="examples/resnet_digits.py:nope"))
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return 3\n")
    with pytest.raises(SpecError, match="must return a vtrain.frontend.TorchTask, got int"):
        build_job(TrainSpec(model=f"{bad}:f"))
    with pytest.raises(SpecError, match="model_args"):
        build_job(TrainSpec(model="examples/resnet_digits.py:task", model_args={"depth": 3}))
    spec = TrainSpec(model="examples/resnet_digits.py:task", model_args={"width": 4}, batch_size=4)
    assert TrainSpec.from_json(spec.to_json()) == spec


def test_a_factory_that_raises_is_named_with_its_line(tmp_path: Path) -> None:
    """Any exception of the user's factory is one SpecError naming the factory, the error and its line (before:
    a traceback for anything but TypeError, and a TypeError inside the factory blamed the model_args)."""
    from vtrain.training.spec import TrainSpec, build_job

    src = tmp_path / "raises.py"
    src.write_text("def helper(n):\n    return [1, 2][n]\n\n\ndef task(n=5):\n    return helper(n)\n\n\n"
                   "def typo():\n    return len(3)\n")
    with pytest.raises(SpecError, match=rf"raises\.py:task raised IndexError: list index out of range \(at {src}, "
                                        r"line 2: return \[1, 2\]\[n\]\)"):
        build_job(TrainSpec(model=f"{src}:task"))
    with pytest.raises(SpecError, match=r"typo raised TypeError: object of type 'int' has no len\(\).*line 10"):
        build_job(TrainSpec(model=f"{src}:typo"))
    with pytest.raises(SpecError, match=r"model_args \['m'\]: the factory rejects them"):
        build_job(TrainSpec(model=f"{src}:task", model_args={"m": 1}))


def test_checkpoint_is_the_initial_state(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from vtrain.frontend.job import make_task
    from vtrain.training.spec import TrainSpec, build_job

    ref = "examples/resnet_digits.py:task"
    module = make_task(ref, {"width": 4}, 0, None).module
    sd = {k: v.clone() + 0.25 if v.is_floating_point() else v.clone() for k, v in module.state_dict().items()}
    save_file(sd, str(tmp_path / "w.safetensors"))
    torch.save(sd, tmp_path / "w.pt")
    loaded = make_task(ref, {"width": 4}, 0, str(tmp_path / "w.pt")).module.state_dict()
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)
    tuned = build_job(TrainSpec(model=ref, model_args={"width": 4}, batch_size=4, steps=2,
                                checkpoint=str(tmp_path / "w.safetensors")))
    names = tuned.torch.captured.slot_names
    assert np.array_equal(tuned.initial_state[names.index("stem.weight")], sd["stem.weight"].numpy())
    assert np.array_equal(tuned.initial_state[names.index("bn.running_mean")], sd["bn.running_mean"].numpy())
    del sd["fc.bias"]
    sd["extra"] = torch.zeros(1)
    torch.save(sd, tmp_path / "bad.pt")
    with pytest.raises(FrontendError, match=r"missing \['fc.bias'\].*unexpected \['extra'\]"):
        make_task(ref, {"width": 4}, 0, str(tmp_path / "bad.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(FrontendError, match="cannot read it"):
        make_task(ref, {"width": 4}, 0, str(tmp_path / "junk.pt"))


def test_data_loaders(tmp_path: Path) -> None:
    from vtrain.frontend import data

    txt = tmp_path / "t.txt"
    txt.write_text("héllo world, hello vtrain")
    x, y = data.text_bytes(txt, 4)
    raw = np.frombuffer(txt.read_bytes(), np.uint8)
    assert x.shape == (len(raw) // 5, 4) and x[0].tolist() == raw[:4].tolist() and y[0].tolist() == raw[1:5].tolist()
    xc, yc, vocab = data.text_chars(txt, 4)
    assert "é" in vocab and xc.max() < len(vocab)
    np.savez(tmp_path / "a.npz", x=np.zeros((5, 3), np.float32), y=np.arange(5))
    ax, ay = data.arrays(tmp_path / "a.npz")
    assert ax.shape == (5, 3) and ay.tolist() == [0, 1, 2, 3, 4]
    np.save(tmp_path / "a.npy", np.ones((4, 3)))
    assert data.arrays(tmp_path / "a.npy")[0].shape == (4, 2)
    with pytest.raises(DatasetError, match="no array named"):
        data.arrays(tmp_path / "a.npz", inputs="images")
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(DatasetError, match="empty"):
        data.text_bytes(tmp_path / "e.txt", 4)
    img, lab = data.digits_images()
    assert img.shape[1:] == (1, 8, 8) and lab.dtype == np.int64
    with pytest.raises(FrontendError, match="not integers"):
        TorchTask(nn.Linear(2, 2), F.mse_loss, SGD, [np.zeros((2, 2))], np.array([0.5, 1.0]),
                  target_dtype=torch.int64).samples()
    assert math.isfinite(float(x.sum()))


def test_docs_list_every_lowering() -> None:
    from vtrain.frontend.lowering import lowering_table

    assert lowering_table() in (ROOT / "docs" / "frontend.md").read_text()


def test_toml_spec_with_a_model_table(tmp_path: Path) -> None:
    from vtrain.training.spec import TrainSpec

    f = tmp_path / "spec.toml"
    f.write_text('model = "examples/resnet_digits.py:task"\nbatch_size = 4\ncheckpoint = "w.pt"\n'
                 '[model_args]\nwidth = 4\noptimizer = "AdamW"\n')
    spec = TrainSpec.from_file(f)
    assert spec.model_args == {"width": 4, "optimizer": "AdamW"} and spec.checkpoint == "w.pt"
    f.write_text('model = "examples/resnet_digits.py:task"\nmodel_args = 3\n')
    with pytest.raises(SpecError, match="model_args: expected a table"):
        TrainSpec.from_file(f)


def test_frozen_parameters_are_constants() -> None:
    torch.manual_seed(4)
    module = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    module[0].weight.requires_grad_(False)
    task = _task(module, _rand((8, 4), 1), _rand((8, 2), 2), loss=F.mse_loss)
    cap = capture(task, 4)
    assert "0.weight" not in cap.slot_names and cap.slot_names[: cap.n_params] == ["0.bias", "2.weight", "2.bias"]
    _check(task, 4)


def test_npz_example_trains_from_a_users_file(tmp_path: Path) -> None:
    from vtrain.graph.executor import state_tensors
    from vtrain.training.loop import train_steps
    from vtrain.training.spec import TrainSpec, build_job

    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 5)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    job = build_job(TrainSpec(model="examples/npz_classifier.py:task", model_args={"path": str(tmp_path / "d.npz")},
                              batch_size=8, steps=3))
    assert job.dataset.samples.shape == (40, 6)
    losses = [o.loss for o in train_steps(job, state_tensors(job.initial_state), 1, 3)]
    assert all(math.isfinite(v) for v in losses)


# --- window ops over random geometries (the lowerings called directly, no export) ---------------------
class _Node:
    users: dict = {}


def _window_graph(build, x0: np.ndarray, w0: np.ndarray | None):
    from vtrain.frontend.lowering import Lowerer, Sym
    from vtrain.graph.fp64 import evaluate_fp64
    from vtrain.graph.step_graph import GraphBuilder

    g = GraphBuilder()
    L = Lowerer(g)
    x = g.input("x", x0.shape)
    w = g.input("w", w0.shape) if w0 is not None else None
    g.data((1,))
    out = build(L, Sym(x), Sym(w) if w is not None else None)
    out_t = out[0].t if isinstance(out, tuple) else out.t
    ct = np.random.default_rng(9).standard_normal(out_t.shape).astype(np.float32)
    loss = g.sum(g.reshape(g.mul(out_t, g.const(ct)), (1, math.prod(out_t.shape))))
    wrt = [x] + ([w] if w is not None else [])
    grads = g.grad(loss, wrt)
    graph = g.build(loss)
    state = [torch.from_numpy(x0).double()] + ([torch.from_numpy(w0).double()] if w0 is not None else [])
    vals = evaluate_fp64(graph, state, torch.zeros(1, dtype=torch.float64))
    return vals[out_t.op], [vals[gr.op] for gr in grads], torch.from_numpy(ct).double()


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(3, 7), st.integers(3, 7), st.integers(1, 3),
       st.integers(1, 3), st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.booleans(), st.integers(0, 99))
def test_conv2d_lowering_over_random_geometries(cin, cout, h, w, kh, kw, stride, pad, dil, bias, seed) -> None:
    from vtrain.frontend.lowering import _convolution

    assume((h + 2 * pad - dil * (kh - 1) - 1) >= 0 and (w + 2 * pad - dil * (kw - 1) - 1) >= 0)
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((2, cin, h, w)).astype(np.float32)
    w0 = rng.standard_normal((cout, cin, kh, kw)).astype(np.float32)
    b0 = torch.from_numpy(rng.standard_normal(cout).astype(np.float32)) if bias else None
    out, (gx, gw), ct = _window_graph(
        lambda L, x, wt: _convolution(L, _Node(), x, wt, b0, [stride] * 2, [pad] * 2, [dil] * 2, False, [0, 0], 1),
        x0, w0)
    xt = torch.from_numpy(x0).double().requires_grad_(True)
    wt = torch.from_numpy(w0).double().requires_grad_(True)
    ref = F.conv2d(xt, wt, b0.double() if b0 is not None else None, stride, pad, dil)
    (ref * ct).sum().backward()
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(gx, xt.grad, rtol=1e-12, atol=1e-12) and torch.allclose(gw, wt.grad, rtol=1e-12, atol=1e-12)


class _ShapedNode(_Node):
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.meta = {"val": torch.empty(shape)}


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.integers(0, 2), st.booleans(), st.integers(0, 99))
def test_conv_transpose_lowering_over_random_geometries(nsp, groups, cout, n, k, stride, pad, dil, outpad, bias,
                                                        seed) -> None:
    from vtrain.frontend.lowering import _transposed_convolution

    spatial, kernel = (n, n + 1)[:nsp], (k, max(k - 1, 1))[:nsp]
    assume(outpad < max(stride, dil))
    assume(all((m - 1) * stride - 2 * pad + dil * (j - 1) + outpad + 1 > 0 for m, j in zip(spatial, kernel)))
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((2, 2 * groups, *spatial)).astype(np.float32)
    w0 = rng.standard_normal((2 * groups, cout, *kernel)).astype(np.float32)
    b0 = torch.from_numpy(rng.standard_normal(cout * groups).astype(np.float32)) if bias else None
    xt = torch.from_numpy(x0).double().requires_grad_(True)
    wt = torch.from_numpy(w0).double().requires_grad_(True)
    conv_t = F.conv_transpose1d if nsp == 1 else F.conv_transpose2d
    ref = conv_t(xt, wt, b0.double() if b0 is not None else None, stride, pad, outpad, groups, dil)
    node = _ShapedNode(tuple(ref.shape))
    out, (gx, gw), ct = _window_graph(lambda L, x, wt: _transposed_convolution(
        L, node, x, wt, b0, [stride] * nsp, [pad] * nsp, [dil] * nsp, [outpad] * nsp, groups), x0, w0)
    (ref * ct).sum().backward()
    assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(gx, xt.grad, rtol=1e-12, atol=1e-12) and torch.allclose(gw, wt.grad, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 7), st.integers(3, 7), st.integers(1, 3), st.integers(1, 3), st.integers(0, 1),
       st.booleans(), st.integers(0, 99))
def test_pool_lowerings_over_random_geometries(h, w, k, stride, pad, ties, seed) -> None:
    from vtrain.frontend.lowering import _avg_pool2d, _max_pool2d

    assume(pad * 2 <= k and h + 2 * pad >= k and w + 2 * pad >= k)
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((2, 2, h, w)).astype(np.float32)
    if ties:
        x0 = np.round(x0)  # many equal values: the gradient goes to the first maximum, as torch's
    for lower, ref_fn in ((_max_pool2d, F.max_pool2d), (_avg_pool2d, F.avg_pool2d)):
        out, (gx,), ct = _window_graph(
            lambda L, x, _, lower=lower: lower(L, _Node(), x, [k, k], [stride, stride], [pad, pad]), x0, None)
        xt = torch.from_numpy(x0).double().requires_grad_(True)
        ref = ref_fn(xt, k, stride, pad)
        (ref * ct).sum().backward()
        assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
        assert torch.allclose(gx, xt.grad, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None, report_multiple_bugs=False)
@given(st.integers(1, 2), st.integers(1, 2), st.tuples(*[st.integers(2, 5)] * 3), st.tuples(*[st.integers(1, 3)] * 3),
       st.tuples(*[st.integers(1, 2)] * 3), st.tuples(*[st.integers(0, 1)] * 3), st.tuples(*[st.integers(1, 2)] * 3),
       st.booleans(), st.booleans(), st.integers(0, 99))
def test_3d_window_lowerings_over_random_geometries(groups, cout, size, k, stride, pad, dil, bias, ceil, seed) -> None:
    """Conv3d, ConvTranspose3d (groups, stride, padding, dilation), MaxPool3d / AvgPool3d (padding, ceil_mode,
    count_include_pad=False) and uneven AdaptiveAvgPool3d / AdaptiveMaxPool3d against torch in FP64 (values and
    gradients to 1e-12)."""
    from vtrain.frontend.lowering import (
        Sym,
        _adaptive_windows,
        _avg_pool2d,
        _convolution,
        _max_pool2d,
        _transposed_convolution,
    )

    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((2, 2 * groups, *size)).astype(np.float32)
    xt = torch.from_numpy(x0).double()
    if all(n + 2 * p - d * (j - 1) - 1 >= 0 for n, j, p, d in zip(size, k, pad, dil)):
        w0 = rng.standard_normal((cout * groups, 2, *k)).astype(np.float32)
        b0 = torch.from_numpy(rng.standard_normal(cout * groups).astype(np.float32)) if bias else None
        cases = [(w0, lambda L, x, wt: _convolution(L, _Node(), x, wt, b0, list(stride), list(pad), list(dil), False,
                                                     [0, 0, 0], groups),
                  lambda x, w: F.conv3d(x, w, b0.double() if b0 is not None else None, stride, pad, dil, groups))]
    else:
        cases = []
    outpad = tuple(min(s, d) - 1 for s, d in zip(stride, dil))
    wt0 = rng.standard_normal((2 * groups, cout, *k)).astype(np.float32)
    try:
        ref_t = F.conv_transpose3d(xt, torch.from_numpy(wt0).double(), None, stride, pad, outpad, groups, dil)
    except RuntimeError:  # an empty output
        ref_t = None
    if ref_t is not None:
        node = _ShapedNode(tuple(ref_t.shape))
        cases.append((wt0, lambda L, x, wt, node=node: _transposed_convolution(
            L, node, x, wt, None, list(stride), list(pad), list(dil), list(outpad), groups),
                      lambda x, w: F.conv_transpose3d(x, w, None, stride, pad, outpad, groups, dil)))
    pk = tuple(max(j, 2 * p) for j, p in zip(k, pad))
    if all(n + 2 * p >= j for n, j, p in zip(size, pk, pad)):
        for lower, ref_fn, kw in ((_max_pool2d, F.max_pool3d, {}),
                                  (_avg_pool2d, F.avg_pool3d, {"count_include_pad": False})):
            try:
                ref = ref_fn(xt, pk, stride, pad, ceil_mode=ceil, **kw)
            except RuntimeError:  # torch refuses this window
                continue
            node = _ShapedNode(tuple(ref.shape))
            cases.append((None, lambda L, x, _, lower=lower, node=node, kw=kw: lower(
                L, node, x, list(pk), list(stride), list(pad), ceil_mode=ceil, **kw),
                lambda x, _, ref_fn=ref_fn, kw=kw: ref_fn(x, pk, stride, pad, ceil_mode=ceil, **kw)))
    osz = tuple(max(1, n - j) for n, j in zip(size, k))
    for kind, ref_fn in (("mean", F.adaptive_avg_pool3d), ("max", F.adaptive_max_pool3d)):
        cases.append((None, lambda L, x, _, kind=kind: Sym(_adaptive_windows(L, x.t, osz, kind)),
                      lambda x, _, ref_fn=ref_fn: ref_fn(x, osz)))
    for w_init, build, ref_fn in cases:
        out, grads, ct = _window_graph(build, x0, w_init)
        xg = xt.clone().requires_grad_(True)
        wg = torch.from_numpy(w_init).double().requires_grad_(True) if w_init is not None else None
        ref = ref_fn(xg, wg)
        (ref * ct).sum().backward()
        assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
        assert torch.allclose(grads[0], xg.grad, rtol=1e-12, atol=1e-12)
        if wg is not None:
            assert torch.allclose(grads[1], wg.grad, rtol=1e-12, atol=1e-12)


def test_export_of_an_hf_gpt2_run_loads_with_from_pretrained(tmp_path: Path) -> None:
    """`vtrain export` of a front-end HF run: `GPT2LMHeadModel.from_pretrained(out)` loads the run's
    trained weights (tied embedding included), bit for bit, and runs."""
    from click.testing import CliRunner
    from transformers import GPT2LMHeadModel

    from protocol.cli import main
    from vtrain.frontend.job import state_dict_of
    from vtrain.outputs.export import verified_state
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import build_job

    root = Path(__file__).resolve().parents[1]
    run, out = tmp_path / "run", tmp_path / "hf"
    args = ["--model-arg", "context=8", "--model-arg", "n_layer=1", "--model-arg", "n_embd=16",
            "--model-arg", "n_head=2", "--model-arg", "vocab_size=260"]
    r = CliRunner().invoke(main, ["train", "--out", str(run), "--model", f"{root}/examples/hf_gpt2.py:small", *args,
                                  "--steps", "2", "--batch-size", "2"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["export", str(run), "--out", str(out)])
    assert r.exit_code == 0, r.output
    model = GPT2LMHeadModel.from_pretrained(str(out))
    rd = RunDir(run)
    job = build_job(rd.read_spec())
    _, state = verified_state(rd, job)
    trained = state_dict_of(job.torch.captured, state)
    got = model.state_dict()
    assert trained and all(torch.equal(got[k], v.reshape(got[k].shape)) for k, v in trained.items())
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # still tied
    logits = model(torch.zeros((1, 8), dtype=torch.long)).logits
    assert logits.shape == (1, 8, 260) and bool(torch.isfinite(logits).all())
