"""Users' own models (``examples/zoo.py``): each ordinary model either trains exactly (loss, gradients,
buffers and one optimizer step equal torch autograd and torch.optim in FP64), or is refused before
training with an error naming the ATen op, the module and the user's source line. Each lowering the
zoo needed is checked here on values with ties (clamp bounds, equal operands), zeros, negatives and
large magnitudes; one zoo model trains and replays through the CLI (the rest: slow)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from vtrain.frontend import TorchTask, capture
from vtrain.frontend.check import compare_fp64, compare_step_fp64
from vtrain.frontend.errors import FrontendError, UnsupportedOp
from vtrain.graph.step_graph import OpKind

ROOT = Path(__file__).resolve().parents[1]
ZOO_FILE = ROOT / "examples" / "zoo.py"
TOL = 1e-5  # as tests/test_frontend.py: FP64 noise plus the FP32 rounding of the graph's scalar constants


def _zoo():
    spec = importlib.util.spec_from_file_location("zoo_example", ZOO_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


ZOO = _zoo()


def _worst(res: dict[str, tuple[np.ndarray, np.ndarray]]) -> float:
    return max(float(np.abs(a - b).max()) / max(1e-3, float(np.abs(b).max())) for a, b in res.values())


def _check(task: TorchTask, batch: int, seed: bytes | None = None) -> None:
    cap = capture(task, batch)
    rows = task.samples()[:batch]
    cmp = compare_fp64(task, cap, rows, seed=seed)
    assert cmp.worst() < TOL, (cmp.loss, {k: float(np.abs(a - b).max()) for k, (a, b) in cmp.grads.items()})
    assert _worst(compare_step_fp64(task, cap, rows, seed=seed)) < TOL


# --- the zoo --------------------------------------------------------------------------------------------
# the rest: slow (each ~1 s)
DEFAULT_ZOO = {"mlp_acts", "cnn_groupnorm", "conv1d_seq", "llama_style", "stats_forward", "ema_buffer", "erf_gelu"}


@pytest.mark.parametrize("name", [n if n in DEFAULT_ZOO else pytest.param(n, marks=pytest.mark.slow)
                                  for n in ZOO.TRAINED])
def test_zoo_model_matches_torch_in_fp64(name: str) -> None:
    torch.manual_seed(0)
    _check(getattr(ZOO, name)(), 4, seed=bytes(range(32)))


REFUSALS = {  # factory -> (ATen op, module, what to use instead)
    "sort_model": ("aten.sort.default", "module <root> (Sorter)", "Supported ATen ops"),
    "max_norm_embedding": ("aten.embedding_renorm_.default", "module emb (Embedding)", "drop max_norm"),
}


@pytest.mark.parametrize("name", ZOO.REFUSED)
def test_refused_zoo_model_names_the_op_module_and_user_line(name: str) -> None:
    torch.manual_seed(0)
    with pytest.raises(UnsupportedOp) as e:
        capture(getattr(ZOO, name)(), 4)
    msg = str(e.value)
    op, module, instead = REFUSALS[name]
    assert op in msg and module in msg and instead in msg, msg
    assert f'"{ZOO_FILE}", line ' in msg, msg  # the user's line, not torch's
    assert "Traceback" not in msg


def test_a_parameter_changed_in_place_by_the_forward_is_refused() -> None:
    class ClampsItself(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            with torch.no_grad():
                self.w.clamp_(-0.5, 0.5)
            return x * self.w

    x = np.ones((4, 3), np.float32)
    with pytest.raises(FrontendError, match=r"the forward changes w in place \(PARAMETER_MUTATION\)"):
        capture(TorchTask(ClampsItself(), F.mse_loss, {"name": "SGD", "lr": 0.1}, [x], x), 2)


class DoubleForward(torch.autograd.Function):
    """A custom Function (a straight-through-style backward): export would keep only its forward."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3


def test_a_custom_autograd_function_is_refused_by_name() -> None:
    class Uses(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return DoubleForward.apply(self.lin(x))

    x = np.ones((4, 3), np.float32)
    original = torch.autograd.Function.__dict__["apply"]
    with pytest.raises(UnsupportedOp, match=r"custom torch.autograd.Function DoubleForward \(.*test_frontend_zoo"
                                            r"\.py, line \d+\): .*drops its backward"):
        capture(TorchTask(Uses(), F.mse_loss, {"name": "SGD", "lr": 0.1}, [x], x), 2)
    assert torch.autograd.Function.__dict__["apply"] is original  # restored after capture
    assert DoubleForward.apply(torch.ones(1)).item() == 2.0


def test_gradient_hooks_are_refused_by_name() -> None:
    x = np.ones((4, 3), np.float32)
    hooked = nn.Sequential(nn.Linear(3, 3))
    hooked[0].weight.register_hook(lambda g: g.clamp(-0.1, 0.1))
    with pytest.raises(FrontendError, match=r"parameter 0\.weight has a gradient hook"):
        capture(TorchTask(hooked, F.mse_loss, {"name": "SGD", "lr": 0.1}, [x], x), 2)
    module = nn.Sequential(nn.Linear(3, 3))
    module[0].register_full_backward_hook(lambda m, gi, go: None)
    with pytest.raises(FrontendError, match=r"module 0 \(Linear\) has a backward hook"):
        capture(TorchTask(module, F.mse_loss, {"name": "SGD", "lr": 0.1}, [x], x), 2)


def test_an_op_of_the_loss_function_is_placed_in_the_loss() -> None:
    class Lin(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x)

    def sorted_loss(out, y):
        return (torch.sort(out, -1).values - y).abs().mean()

    x = np.ones((4, 3), np.float32)
    where = r"aten\.sort\.default.*the loss function .*{} \(.*test_frontend_zoo\.py, line \d+\)"
    with pytest.raises(UnsupportedOp, match=where.format("sorted_loss")):
        capture(TorchTask(Lin(), sorted_loss, {"name": "SGD", "lr": 0.1}, [x], x), 2)
    with pytest.raises(UnsupportedOp, match=where.format("<lambda>")):
        capture(TorchTask(Lin(), lambda o, y: torch.sort(o, -1).values.sum(), {"name": "SGD", "lr": 0.1}, [x], x), 2)


def test_unused_and_frozen_parameters_are_left_as_torch_leaves_them() -> None:
    torch.manual_seed(0)
    task = ZOO.frozen_unused()
    cap = capture(task, 4)
    assert cap.slot_names[: cap.n_params] == ["head.weight", "head.bias", "aux_head.weight", "aux_head.bias"]
    res = compare_step_fp64(task, cap, task.samples()[:4])
    for k in ("aux_head.weight", "aux_head.bias"):  # no gradient: not updated (not even decayed)
        a, b = res[k]
        assert np.array_equal(a, b) and np.array_equal(b, task.module.state_dict()[k].double().numpy().reshape(-1))
    wd = ZOO.frozen_unused()
    wd.optimizer = {"name": "AdamW", "lr": 0.1, "weight_decay": 0.5}
    _check(wd, 4)
    class Gate(nn.Module):  # ``gate`` only chooses a branch: no gradient, no update (as torch)
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.gate = nn.Parameter(torch.tensor([0.5, -0.5, 0.0]))

        def forward(self, x):
            h = self.lin(x)
            return torch.where(self.gate > 0, h, -h)

    gated = TorchTask(Gate(), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1, "weight_decay": 0.1},
                      [np.ones((4, 3), np.float32)], np.ones((4, 3), np.float32))
    _check(gated, 4)
    with pytest.raises(FrontendError, match="no trainable parameter reaches the loss"):
        capture(TorchTask(wd.module.aux_head, lambda o, y: (o.detach() * y).sum(), wd.optimizer,
                          [np.ones((4, 8), np.float32)], np.ones((4, 3), np.float32)), 2)


# --- each new lowering on ties, zeros, negatives and large magnitudes ------------------------------------
VALUES = np.array([-1e4, -25.0, -6.0, -1.0, -0.5, -1e-3, -0.0, 0.0, 1e-3, 0.5, 1.0, 6.0, 20.0, 25.0, 1e4],
                  np.float32)


class Unary(nn.Module):
    """``fn(x + w)`` with ``w`` a zero parameter: the op sees ``x`` exactly (ties included) and ``w``'s
    gradient is the op's gradient at ``x``."""

    def __init__(self, fn, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))
        self.fn = fn

    def forward(self, x):
        return self.fn(x + self.w)


class Binary(nn.Module):
    def __init__(self, fn, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, n))
        self.fn = fn

    def forward(self, x):
        return self.fn(x[:, 0] + self.w[0], x[:, 1] + self.w[1])


UNARY = {
    "leaky_relu": lambda a: F.leaky_relu(a, 0.2),
    "elu": lambda a: F.elu(a, 0.7),
    "selu": F.selu,  # elu with scale and input_scale
    "softplus": F.softplus,
    "softplus_beta": lambda a: F.softplus(a, beta=2.0, threshold=10.0),
    "mish": F.mish,
    "gelu_erf": lambda a: F.gelu(a) + torch.erf(a * 0.5) + torch.erfc(a),
    "clamp": lambda a: torch.clamp(a, -1.0, 1.0),
    "clamp_min_max": lambda a: torch.clamp_min(a, -0.5) + torch.clamp_max(a, 6.0) + a.clamp(max=0.0),
    "hardtanh_relu6": lambda a: F.hardtanh(a, -0.5, 0.5) + F.relu6(a),
    "sign_abs": lambda a: a.sign() * a + a.abs(),
    "logsigmoid": F.logsigmoid,
    "log1p": lambda a: torch.log1p(a.abs() * 1e-3),
    "var_std": lambda a: (a.unflatten(-1, (3, 5)).var(-1) + a.unflatten(-1, (3, 5)).std(1, unbiased=False).sum()
                          + a.var()),
    "var_mean": lambda a: torch.stack(torch.var_mean(a.unflatten(-1, (3, 5)), dim=-1, correction=0), -1),
    "logsumexp": lambda a: torch.logsumexp(a.unflatten(-1, (3, 5)) * 1e-3, -1),
    "flip_cumsum": lambda a: (a.flip(-1) * torch.cumsum(a * 1e-3, -1)
                              + a.unflatten(-1, (3, 5)).flip((-2, -1)).flatten(-2)),
    "pow_int": lambda a: (a * 1e-2) ** 4 + (a * 1e-3) ** 7 + (a * a + 1.0) ** -2 + (a * a + 1.0) ** -8,
    "exp2_log2_log10": lambda a: torch.exp2(a * 1e-3) + torch.log2(a * a + 1.0) + torch.log10(a.abs() + 1.0),
    "vector_norm": lambda a: torch.linalg.vector_norm(a.unflatten(-1, (3, 5)), dim=-1) + a.norm(1),
}


UNARY_GROUPS = {
    "activations": ("leaky_relu", "elu", "selu", "softplus", "softplus_beta", "mish", "logsigmoid", "log1p",
                    "gelu_erf"),
    "clamps": ("clamp", "clamp_min_max", "hardtanh_relu6", "sign_abs"),
    "statistics": ("var_std", "var_mean", "logsumexp", "vector_norm"),
    "more": ("flip_cumsum", "pow_int", "exp2_log2_log10"),
}


def _check_unary(fn) -> None:
    x = np.stack([VALUES, -VALUES[::-1], VALUES * 0.5, np.roll(VALUES, 3)])
    out = fn(torch.from_numpy(x[0]))
    y = np.random.default_rng(0).uniform(-1, 1, (4, *out.shape)).astype(np.float32)
    task = TorchTask(Unary(fn, len(VALUES)), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1}, [x], y)
    _check(task, 4)


@pytest.mark.parametrize("group", sorted(UNARY_GROUPS))
def test_unary_lowerings_match_torch_on_ties_and_extremes(group: str) -> None:
    """One model per group: each op's output weighted by distinct constants and summed (one value per op)."""
    fns = [UNARY[n] for n in UNARY_GROUPS[group]]

    def weighted(out: torch.Tensor) -> torch.Tensor:
        return (out * torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape)).sum()

    _check_unary(lambda a: torch.stack([weighted(f(a)) for f in fns]))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_lowering_matches_torch_on_ties_and_extremes(name: str) -> None:
    _check_unary(UNARY[name])


BINARY = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "clamp_tensor": lambda a, b: torch.clamp(a, min=b, max=b + 1.0),
    "bce_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(a, (b > 0).float(), reduction="none"),
}


@pytest.mark.parametrize("name", ["maximum", "minimum"] + [pytest.param(n, marks=pytest.mark.slow)
                                                            for n in sorted(BINARY) if "mum" not in n])
def test_binary_lowering_matches_torch_on_ties_and_extremes(name: str) -> None:
    a = np.concatenate([VALUES, VALUES[:5]])
    b = np.concatenate([VALUES, VALUES[5:10]])  # the first 15 elements tie (zeros of both signs, large ones)
    x = np.stack([np.stack([a, b]), np.stack([b, a]), np.stack([a, -a]), np.stack([a * 0, b])])
    y = np.random.default_rng(1).uniform(-1, 1, (4, len(a))).astype(np.float32)
    task = TorchTask(Binary(BINARY[name], len(a)), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1}, [x], y)
    _check(task, 4)


def test_max_and_min_reductions_split_or_route_a_ties_gradient_as_torch() -> None:
    """amax / max() / amin / min(): torch splits the gradient evenly between tied extremes; max(dim) /
    min(dim) give it to the first (their index, also an output). Small integers: every row has ties."""
    x = np.random.default_rng(8).integers(-2, 3, (4, 15)).astype(np.float32)
    x[0] = 1.0  # one row all tied

    def fn(a):
        r = a.unflatten(-1, (3, 5))
        whole = torch.stack([a.max(), a.min()]).reshape(1, 2).expand(a.shape[0], 2)
        return torch.cat([r.amax(-1).flatten(1), r.amin((1, 2)).unsqueeze(1), whole, r.max(1).values.flatten(1),
                          r.min(-1).values.flatten(1), torch.amax(r, 1, keepdim=True).flatten(1)], -1)

    out = fn(torch.from_numpy(x))
    y = np.random.default_rng(9).uniform(-1, 1, out.shape).astype(np.float32)
    _check(TorchTask(Unary(fn, 15), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1}, [x], y), 4)
    # the indices (the first extreme, as torch's) on the same ties
    _check(TorchTask(Unary(lambda a: (a.max(-1).indices + 2 * a.min(-1).indices).float() * a.sum(-1), 15),
                     lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1}, [x], y[:, 0]), 4)


def test_kl_div_nearest_upsampling_and_adaptive_max_pool() -> None:
    """kl_div decomposes through isnan (false: a graph's values are finite) and where(isnan, nan, ..)."""
    torch.manual_seed(5)
    body = nn.Sequential(nn.Conv2d(1, 2, 1), nn.Upsample(scale_factor=2), nn.ReLU(), nn.AdaptiveMaxPool2d(2),
                         nn.Flatten(), nn.Linear(8, 3))
    x = np.random.default_rng(6).standard_normal((4, 1, 3, 3)).astype(np.float32)
    y = np.random.default_rng(7).dirichlet(np.ones(3), 4).astype(np.float32)
    _check(TorchTask(body, lambda o, t: F.kl_div(F.log_softmax(o, -1), t, reduction="batchmean"),
                     {"name": "SGD", "lr": 0.1}, [x], y), 4)


def test_weighted_and_ignoring_classification_losses() -> None:
    x = np.random.default_rng(10).standard_normal((8, 4)).astype(np.float32)
    y = np.random.default_rng(11).integers(0, 3, 8)

    def loss(o, t):
        w = o.new_tensor([1.0, 2.0, 0.5])
        return (F.cross_entropy(o, t, weight=w, ignore_index=2) + F.nll_loss(F.log_softmax(o, -1), t, weight=w)
                + F.cross_entropy(o, t, reduction="sum", label_smoothing=0.2))

    torch.manual_seed(0)
    _check(TorchTask(nn.Linear(4, 3), loss, {"name": "SGD", "lr": 0.1}, [x], y), 8)
    f32 = TorchTask(nn.Linear(4, 3), lambda o, t: F.cross_entropy(o, t, weight=torch.tensor([1.0, 2.0, 0.5])),
                    {"name": "SGD", "lr": 0.1}, [x], y)
    with pytest.raises(FrontendError, match=r"FP64 reference.*x\.new_tensor"):
        compare_fp64(f32, capture(f32, 8), f32.samples()[:8])


def test_grouped_and_depthwise_convolutions_and_embedding_padding_idx() -> None:
    torch.manual_seed(7)
    body = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU(), nn.Conv2d(4, 6, 1, groups=2, bias=False),
                         nn.Conv2d(6, 6, 2, stride=2, groups=3), nn.Flatten(), nn.Linear(24, 2))
    x = np.random.default_rng(12).standard_normal((4, 4, 4, 4)).astype(np.float32)
    _check(TorchTask(body, F.cross_entropy, {"name": "SGD", "lr": 0.1, "momentum": 0.9}, [x], np.arange(4) % 2), 4)
    emb = nn.Sequential(nn.Embedding(7, 3, padding_idx=0), nn.Flatten(), nn.Linear(12, 2))
    ids = np.random.default_rng(13).integers(0, 3, (4, 4))  # many padding tokens
    task = TorchTask(emb, F.cross_entropy, {"name": "AdamW", "lr": 0.1, "weight_decay": 0.1}, [ids], np.arange(4) % 2)
    _check(task, 4)
    cap = capture(task, 4)
    grad = compare_fp64(task, cap, task.samples()[:4]).grads["0.weight"][0].reshape(7, 3)
    assert not grad[0].any() and grad[1:3].any()  # the padding row gets no gradient, as torch


def test_softplus_and_mish_stay_finite_where_torchs_decomposition_overflows() -> None:
    """torch's decomposition of softplus computes exp(a) for every a (inf for a > 88 in FP32): kept whole."""
    from vtrain.graph.executor import StepExecutor, state_tensors

    for fn in (F.softplus, F.mish):
        x = np.stack([VALUES * 10, VALUES]).astype(np.float32)
        task = TorchTask(Unary(fn, len(VALUES)), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1},
                         [x], np.ones_like(x))
        cap = capture(task, 2)
        res = StepExecutor(cap.graph).run(state_tensors(cap.initial_state), torch.from_numpy(task.samples()[:2]))
        assert np.isfinite(res.loss) and all(bool(torch.isfinite(s).all()) for s in res.state)


@pytest.mark.slow
def test_group_and_instance_norm_and_embedding_bag_lowerings() -> None:
    torch.manual_seed(4)
    conv = nn.Sequential(nn.Conv2d(2, 6, 1), nn.GroupNorm(3, 6), nn.InstanceNorm2d(6), nn.GroupNorm(1, 6, affine=False))
    x = np.random.default_rng(2).standard_normal((4, 2, 3, 3)).astype(np.float32) * 4
    y = np.random.default_rng(3).uniform(-1, 1, (4, 6, 3, 3)).astype(np.float32)
    _check(TorchTask(conv, F.mse_loss, {"name": "AdamW", "lr": 0.01}, [x], y), 4)
    for mode in ("sum", "max"):
        bag = nn.Sequential(nn.EmbeddingBag(9, 4, mode=mode), nn.Linear(4, 2))
        ids = np.random.default_rng(5).integers(0, 9, (4, 3))
        _check(TorchTask(bag, F.cross_entropy, {"name": "SGD", "lr": 0.1}, [ids], np.arange(4) % 2), 4)


def test_gather_along_any_axis_with_several_indices_per_row() -> None:
    """cross_entropy over [N, C, T] (class axis 1: a gather on a middle axis), and gather with k indices per
    row from a wider tensor (RoBERTa's token-type ids: a [1, P] buffer gathered by [B, T] positions)."""
    torch.manual_seed(3)
    x = np.random.default_rng(20).standard_normal((4, 5, 6)).astype(np.float32)
    idx = np.random.default_rng(21).integers(0, 5, (4, 3, 6))

    class Gathers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 6))

        def forward(self, a, i):
            h = a * self.w
            return (torch.gather(h, 1, i).sum((1, 2)) + torch.gather(h, 2, i[:, :2, :4].transpose(1, 2)).sum((1, 2))
                    + torch.gather(h, 0, i[:2, :, :3].transpose(0, 1).clamp(max=3)).sum()
                    + F.cross_entropy(h, i[:, 0, :]))

    task = TorchTask(Gathers(), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1}, [x, idx],
                     np.random.default_rng(22).uniform(-1, 1, 4).astype(np.float32))
    _check(task, 4)


def test_attention_dropout_is_checked_with_the_graphs_masks() -> None:
    """SDPA's and nn.MultiheadAttention's attention dropout is the graph's DROPOUT_MASK on the weights; the
    FP64 check gives torch the same masks (torch's fused attention would draw its own)."""

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(8, 24)
            self.mha = nn.MultiheadAttention(8, 2, dropout=0.25, batch_first=True)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, -1)
            h = F.scaled_dot_product_attention(q, k, v, dropout_p=0.2, is_causal=True)
            return self.mha(h, h, h, need_weights=False)[0].mean(1)

    torch.manual_seed(4)
    x = np.random.default_rng(23).standard_normal((4, 5, 8)).astype(np.float32)
    _check(TorchTask(Attn(), lambda o, t: (o * t).sum(), {"name": "SGD", "lr": 0.1}, [x],
                     np.random.default_rng(24).uniform(-1, 1, (4, 8)).astype(np.float32)), 4, seed=bytes(range(32)))


def test_an_empty_slice_is_a_known_empty_tensor() -> None:
    """Rotary embeddings over the whole head (Phi-3, partial_rotary_factor 1) slice ``x[..., d:]`` to nothing
    and concatenate it back: no elements, nothing computed (before: a GraphError from the builder)."""

    class Rot(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            rot, rest = h[..., :4], h[..., 4:]
            return torch.cat([torch.cat([-rot[..., 2:], rot[..., :2]], -1) * 0.5 + rot, rest], -1)

    torch.manual_seed(5)
    x = np.random.default_rng(25).standard_normal((4, 3, 4)).astype(np.float32)
    _check(TorchTask(Rot(), F.mse_loss, {"name": "SGD", "lr": 0.1}, [x], x), 4)


def test_capturing_a_recurrent_model_prints_none_of_torchs_own_warnings() -> None:
    """torch's pytree deprecation (every export) and nn.LSTM's ``_flat_weights`` notice are torch's noise;
    a user's own warning still shows."""
    import warnings

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(7, 4)
            self.rnn = nn.LSTM(4, 4, batch_first=True)
            self.out = nn.Linear(4, 7)

        def forward(self, x):
            warnings.warn("the user's own warning", UserWarning, stacklevel=1)
            return self.out(self.rnn(self.emb(x))[0])

    torch.manual_seed(6)
    ids = np.random.default_rng(26).integers(0, 7, (4, 5))
    task = TorchTask(LM(), lambda o, t: F.cross_entropy(o.flatten(0, 1), t.flatten()), {"name": "SGD", "lr": 0.1},
                     [ids], ids)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        capture(task, 4)
    messages = [str(w.message) for w in seen]
    assert not [m for m in messages if "LeafSpec" in m or "_flat_weights" in m], messages
    assert "the user's own warning" in messages


# --- optimizers -----------------------------------------------------------------------------------------
def _mlp_task(opt: dict) -> TorchTask:
    torch.manual_seed(6)
    module = nn.Sequential(nn.Linear(4, 6), nn.ELU(), nn.Linear(6, 3))
    x = np.random.default_rng(7).standard_normal((8, 4)).astype(np.float32)
    return TorchTask(module, F.cross_entropy, opt, [x], np.arange(8) % 3)


@pytest.mark.parametrize("opt", [
    {"name": "Adam", "lr": 0.01, "weight_decay": 0.1, "betas": (0.8, 0.9)},
    {"name": "Adam", "lr": 0.01},
    {"name": "SGD", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    {"name": "AdamW", "lr": 0.01, "foreach": True, "fused": False},  # implementation switches: ignored
])
def test_adam_and_nesterov_steps_match_torch_optim(opt: dict) -> None:
    task = _mlp_task(opt)
    cap = capture(task, 8)
    rows = task.samples()[:8]
    assert _worst(compare_step_fp64(task, cap, rows)) < TOL
    if opt["name"] == "Adam":  # the step after: Adam's state (m, v, beta powers) carried over
        from vtrain.graph.fp64 import evaluate_fp64

        vals = evaluate_fp64(cap.graph, [torch.from_numpy(a).double() for a in cap.initial_state],
                             torch.from_numpy(rows), step=1)
        outs = {o.attrs[0]: o.id for o in cap.graph.ops if o.kind == OpKind.OUTPUT}
        state2 = [vals[outs[j]].reshape(a.shape) for j, a in enumerate(cap.initial_state)]
        vals2 = evaluate_fp64(cap.graph, state2, torch.from_numpy(rows), step=2)
        ref = task.module.double()
        torch_opt = torch.optim.Adam(ref.parameters(), lr=opt["lr"], betas=opt.get("betas", (0.9, 0.999)),
                                     weight_decay=opt.get("weight_decay", 0.0))
        for _ in range(2):
            torch_opt.zero_grad()
            F.cross_entropy(ref(torch.from_numpy(rows[:, :4]).double()), torch.arange(8) % 3).backward()
            torch_opt.step()
        for j, (name, p) in enumerate(ref.named_parameters()):
            got = vals2[outs[j]].detach().numpy().reshape(-1)
            want = p.detach().numpy().reshape(-1)
            assert float(np.abs(got - want).max()) / max(1e-3, float(np.abs(want).max())) < TOL, name


def test_adam_without_decay_is_adamw_without_decay() -> None:
    from vtrain.commit.roots import graph_root
    from vtrain.commit.trace import op_descriptors
    from vtrain.frontend.capture import optimizer_config
    from vtrain.models.optim import AdamConfig

    a = capture(_mlp_task({"name": "Adam", "lr": 0.01}), 8).graph
    w = capture(_mlp_task({"name": "AdamW", "lr": 0.01, "weight_decay": 0.0}), 8).graph
    assert graph_root(op_descriptors(a)) == graph_root(op_descriptors(w))
    assert isinstance(optimizer_config({"name": "Adam", "weight_decay": 0.1}), AdamConfig)


@pytest.mark.parametrize("opt,match", [
    ({"name": "Adam", "lr": 0.01, "amsgrad": True}, "optimizer Adam: amsgrad=True is not supported"),
    ({"name": "AdamW", "lr": 0.01, "maximize": True}, "optimizer AdamW: maximize=True"),
    ({"name": "SGD", "lr": 0.1, "nesterov": True}, "nesterov=True needs momentum > 0"),
    ({"name": "SGD", "lr": 0.1, "dampening": 0.5}, "dampening must be 0"),
    ({"name": "RMSprop", "lr": 0.01}, "expected name 'SGD', 'Adam' or 'AdamW'"),
    ({"name": "Adam", "lr": 0.01, "decoupled_weight_decay": True}, r"unsupported setting\(s\) \['decoupled"),
    # settings of the wrong type or range (a model argument passed on as is): named, not a ValueError traceback
    ({"name": "SGD", "lr": "x"}, "optimizer SGD: lr: expected a finite number, got 'x'"),
    ({"name": "SGD", "lr": "0.1"}, "lr: expected a finite number, got '0.1'"),
    ({"name": "SGD", "lr": 0.1, "momentum": float("nan")}, "momentum: expected a finite number, got nan"),
    ({"name": "SGD", "lr": -0.1}, r"lr: expected a number >= 0 \(as torch.optim\), got -0.1"),
    ({"name": "AdamW", "lr": 0.1, "betas": 0.9}, r"betas: expected two numbers \(beta1, beta2\), got 0.9"),
    ({"name": "Adam", "lr": 0.1, "betas": (0.9, 1.0)}, r"betas\[1\]: expected a number in \[0, 1\)"),
    ({"name": "AdamW", "lr": 0.1, "eps": None}, "eps: expected a finite number, got None"),
])
def test_unsupported_optimizer_options_are_refused_by_name(opt: dict, match: str) -> None:
    from vtrain.frontend.capture import optimizer_config

    with pytest.raises(FrontendError, match=match):
        optimizer_config(opt)


def test_optimizer_settings_are_refused_before_the_model_runs() -> None:
    class Explodes(nn.Module):
        def forward(self, x):
            raise AssertionError("the model ran")

    with pytest.raises(FrontendError, match="amsgrad=True"):
        capture(TorchTask(Explodes(), F.mse_loss, {"name": "Adam", "amsgrad": True}, [np.ones((2, 2))],
                          np.ones((2, 2))), 2)


# --- through the CLI ------------------------------------------------------------------------------------
def _cli(*args: str):
    from protocol.cli import main

    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


def _train_and_replay(tmp_path: Path, name: str, steps: int = 2) -> None:
    run = tmp_path / name
    out = _cli("train", "--out", str(run), "--model", f"{ZOO_FILE}:{name}", "--steps", str(steps),
               "--batch-size", "4", "--interval", "2")
    assert out["steps"] == steps and np.isfinite(out["final_loss"])
    rep = _cli("replay", "--run", str(run))
    assert rep["matched"] == steps and rep["first_divergent_step"] is None


def test_a_zoo_model_trains_and_replays_through_the_cli(tmp_path: Path) -> None:
    _train_and_replay(tmp_path, "stats_forward")


def test_an_erf_gelu_model_trains_and_replays_through_the_cli(tmp_path: Path) -> None:
    """nn.Sequential(Linear, GELU(), Linear): its ERF ops are certified-rounded and replay to the same bits."""
    _train_and_replay(tmp_path, "erf_gelu")


BERT_FILE = ROOT / "examples" / "hf_bert.py"


@pytest.mark.slow
def test_a_tiny_hf_bert_with_erf_gelu_matches_torch_and_trains_and_replays(tmp_path: Path) -> None:
    """``BertConfig(hidden_act="gelu")``: the FP64 gradients equal torch autograd's, and it trains and replays
    through the CLI (about 30 s: ``pytest tests/test_frontend_zoo.py -m slow -k bert``)."""
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("hf_bert_example", BERT_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    task = mod.tiny()
    cap = capture(task, 4)
    assert sum(o.kind == OpKind.ERF for o in cap.graph.ops) == 1  # one layer: one GELU
    cmp = compare_fp64(task, cap, task.samples()[:4])
    assert cmp.worst() < 1e-6, cmp.worst()
    run = tmp_path / "bert"
    out = _cli("train", "--out", str(run), "--model", f"{BERT_FILE}:tiny", "--steps", "2", "--batch-size", "4")
    assert out["steps"] == 2 and np.isfinite(out["final_loss"])
    rep = _cli("replay", "--run", str(run))
    assert rep["matched"] == 2 and rep["first_divergent_step"] is None


def test_a_refused_zoo_model_stops_the_cli_before_training(tmp_path: Path) -> None:
    from protocol.cli import main

    res = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "r"), "--model", f"{ZOO_FILE}:sort_model",
                                    "--steps", "2", "--batch-size", "4"])
    assert res.exit_code == 1, res.output
    for part in ("aten.sort.default", "Supported ATen ops", "module <root> (Sorter)", 'zoo.py", line '):
        assert part in res.output, res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "r" / "roots.jsonl").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ZOO.TRAINED if n != "stats_forward"])
def test_every_zoo_model_trains_and_replays_through_the_cli(tmp_path: Path, name: str) -> None:
    _train_and_replay(tmp_path, name, steps=4)


# --- disputes on a zoo model ---------------------------------------------------------------------------
def _zoo_context(name: str):
    from protocol.jobs import JobContext
    from vtrain.frontend.job import pin_files
    from vtrain.training.spec import TrainSpec

    return JobContext.of(pin_files(TrainSpec.from_dict({"model": f"{ZOO_FILE}:{name}", "steps": 4, "interval": 2,
                                                        "batch_size": 4})))


@pytest.mark.slow
def test_every_op_of_a_zoo_graph_stands_under_the_contracts_rule() -> None:
    """Step 1 of stats_forward (clamps, maximum/minimum ties, sign, log1p, var, logsumexp, Adam): the first,
    middle and last element of every op stand under ``vtrain.numerics.exact`` (the Adjudicator's rule)."""
    from vtrain.commit.trace import StepTrace, op_log_entries
    from vtrain.graph.executor import state_tensors
    from vtrain.numerics import exact
    from vtrain.training.loop import train_steps

    ctx = _zoo_context("stats_forward")
    g, seed, samples = ctx.job.graph, ctx.spec.data_seed, ctx.job.dataset.samples
    (o,) = train_steps(ctx.job, state_tensors(ctx.job.initial_state), 1, 1, keep_trace=True)
    t = StepTrace.of(1, g, o.result)
    data = exact.DataContext(samples, seed, 1)
    for op in g.ops:
        if op.kind in (OpKind.INPUT, OpKind.CONST) or exact.is_chunked(ctx.graph.descriptors[op.id]):
            continue
        desc, inputs = ctx.graph.descriptors[op.id], t.inputs_of(op.id)
        by_index = {e.index: e for e in op_log_entries(t.log, op.id)}
        bits = t.outputs[op.id].reshape(-1).view(np.uint32)
        for i in sorted({0, op.numel // 2, op.numel - 1}):
            assert exact.judge_element(desc, inputs, i, int(bits[i]), by_index.get(i), data), (op, i)


@pytest.mark.slow
def test_a_cheat_on_a_zoo_models_clamp_is_caught_at_its_op(fresh_demo_world) -> None:
    """A trainer that changes one element of the conv1d model's clamp (a SELECT) is caught there on-chain."""
    from test_frontend_disputes import CHEAT_STEP, RULING_ADJUDICATED, WINNER_CHALLENGER, _element, _game_of, _play

    from protocol.cheats import TamperAttention

    proto, store, accounts = fresh_demo_world
    ctx = _zoo_context("conv1d_seq")
    g = ctx.job.graph
    op = next(o.id for o in g.ops[: g.loss_op] if o.kind == OpKind.SELECT)
    element = _element(ctx, "clamp", op)
    job, gid, trainer = _play(proto, store, accounts, ctx, cheat=TamperAttention(step=CHEAT_STEP, op=op,
                                                                                  element=element, delta=0.5))
    game = _game_of(proto, gid)
    assert (game["step"], game["op"], game["index"]) == (CHEAT_STEP, op, element), game
    assert (game["winner"], game["ruling"]) == (WINNER_CHALLENGER, RULING_ADJUDICATED), game
    assert trainer.status() == "fraudulent"


@pytest.mark.slow
def test_a_cheat_on_an_erf_gelu_element_is_convicted_on_chain(fresh_demo_world) -> None:
    """A trainer that changes one element of nn.GELU()'s ERF op is caught there: the game narrows to the ERF
    op and element and the Adjudicator (through contracts/Transcendental.sol) rules for the challenger
    (``pytest tests/test_frontend_zoo.py -m slow -k erf_gelu_element``)."""
    from test_frontend_disputes import CHEAT_STEP, RULING_ADJUDICATED, WINNER_CHALLENGER, _element, _game_of, _play

    from protocol.cheats import TamperAttention

    proto, store, accounts = fresh_demo_world
    ctx = _zoo_context("erf_gelu")
    g = ctx.job.graph
    op = next(o.id for o in g.ops[: g.loss_op] if o.kind == OpKind.ERF)
    element = _element(ctx, "erf", op)
    job, gid, trainer = _play(proto, store, accounts, ctx, cheat=TamperAttention(step=CHEAT_STEP, op=op,
                                                                                  element=element, delta=0.5))
    game = _game_of(proto, gid)
    assert (game["step"], game["op"], game["index"], game["kind"]) == (CHEAT_STEP, op, element, OpKind.ERF), game
    assert (game["winner"], game["ruling"]) == (WINNER_CHALLENGER, RULING_ADJUDICATED), game
    assert trainer.status() == "fraudulent"
