"""A user's torch model as a step graph: capture with ``torch.export``, lower each node, then build
the backward (``GraphBuilder.grad``) and the optimizer (``vtrain.models.optim``) on top.

The batch is one FP32 row per sample (``Dataset.samples``): the model's input fields, then the
target's. A wrapper module slices the row batch, casts integer fields (token ids, class labels) and
calls ``loss(module(*inputs), target)``; that wrapper is exported, so the exported program starts
at the committed DATA op. State slots: the trainable parameters (tied ones once, under the first
``state_dict`` name), then the buffers the forward updates (batch-norm running statistics), then
the optimizer state. Buffers the forward only reads are constants of the graph.
"""

from __future__ import annotations

import contextlib
import logging
import math
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from vtrain.errors import GraphError
from vtrain.frontend.errors import FrontendError, UnsupportedOp, describe_function, node_origin
from vtrain.frontend.lowering import (
    NO_FOLD,
    ZEROED,
    Lowerer,
    Sym,
    decomposition_table,
    lowering_of,
    mark_detaches,
    mark_no_grad_regions,
    supported_ops,
)
from vtrain.graph.step_graph import Graph, GraphBuilder, OpKind, T
from vtrain.models.optim import (
    AdamConfig,
    AdamWConfig,
    NesterovSGDConfig,
    OptimConfig,
    SGDConfig,
    apply_optimizer,
    optimizer_slots,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Field:
    """One named part of a sample row: its per-sample shape and torch dtype (float32 or an int type)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Schedule:
    """Linear warmup then cosine decay of the learning rate to ``min_lr_ratio * lr`` at ``total_steps``."""

    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0

    def table(self, lr: float, n_steps: int) -> np.ndarray:
        """``lr_s`` for steps ``1..n_steps`` (FP32, computed once at build time and committed)."""
        out = np.empty(n_steps, np.float64)
        for i in range(n_steps):
            s = i + 1
            if self.warmup_steps and s <= self.warmup_steps:
                out[i] = lr * s / self.warmup_steps
                continue
            span = max(1, self.total_steps - self.warmup_steps)
            prog = min(1.0, (s - self.warmup_steps) / span)
            out[i] = lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog)))
        return out.astype(np.float32)


@dataclass
class TorchTask:
    """What a model factory returns: the module, the loss, torch.optim-style settings and the data.

    ``inputs``: one array ``[N, *shape]`` per positional input of ``module``; ``target``: ``[N, *shape]``.
    ``optimizer``: ``{"name": "SGD" | "AdamW", ...torch.optim keyword arguments}``.
    ``clip_grad_norm``: global gradient-norm clipping (in the graph); ``schedule``: LR schedule.
    """

    module: nn.Module
    loss: Callable[..., torch.Tensor]
    optimizer: Mapping[str, Any]
    inputs: Sequence[np.ndarray]
    target: np.ndarray
    input_dtypes: Sequence[torch.dtype] | None = None
    target_dtype: torch.dtype | None = None
    clip_grad_norm: float | None = None
    schedule: Schedule | None = None
    vocab: list[str] | None = None

    def fields(self) -> list[Field]:
        dts = list(self.input_dtypes or [_dtype_of(a) for a in self.inputs])
        out = [Field(f"input{i}", tuple(a.shape[1:]), d) for i, (a, d) in enumerate(zip(self.inputs, dts))]
        out.append(Field("target", tuple(self.target.shape[1:]), self.target_dtype or _dtype_of(self.target)))
        return out

    def samples(self) -> np.ndarray:
        """The dataset rows: each sample's fields flattened and concatenated, as FP32."""
        arrays = [*self.inputs, self.target]
        n = {int(a.shape[0]) for a in arrays}
        if len(n) != 1:
            raise FrontendError(f"data: every array needs the same number of samples, got {sorted(n)}")
        flds = self.fields()
        cols = []
        for a, f in zip(arrays, flds):
            a = np.asarray(a)
            if f.dtype != torch.float32:
                if not np.all(np.equal(np.mod(a, 1), 0)) or np.abs(a).max(initial=0) >= 2**24:
                    raise FrontendError(f"data: field {f.name} is {f.dtype} but holds values that are not "
                                        "integers below 2^24")
            cols.append(np.asarray(a, np.float32).reshape(a.shape[0], -1))
        out = np.ascontiguousarray(np.concatenate(cols, axis=1), np.float32) + np.float32(0.0)
        if not np.isfinite(out).all():
            raise FrontendError("data: the arrays hold NaN or infinite values")
        return out


def _dtype_of(a: np.ndarray) -> torch.dtype:
    return torch.int64 if np.issubdtype(np.asarray(a).dtype, np.integer) else torch.float32


class _WithLoss(nn.Module):
    """``rows [B, L]`` -> ``loss(module(*inputs), target)``: the function that is exported."""

    def __init__(self, module: nn.Module, loss: Callable[..., torch.Tensor], fields: list[Field]) -> None:
        super().__init__()
        self.module = module
        self.loss_fn = loss
        self.fields = fields

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        B = rows.shape[0]
        vals, off = [], 0
        for f in self.fields:
            v = rows[:, off : off + f.size].reshape(B, *f.shape)
            vals.append(v.to(f.dtype) if f.dtype != torch.float32 else v)
            off += f.size
        out = self.module(*vals[:-1])
        return self.loss_fn(out, vals[-1])


# --- optimizer settings -------------------------------------------------------------------------------
_UNSUPPORTED_FLAGS = ("maximize", "amsgrad", "capturable", "differentiable")
"""torch.optim options that change the update (refused by name when true)."""
_IGNORED = ("foreach", "fused")
"""torch.optim implementation switches (the same update either way): accepted and ignored."""


def optimizer_config(settings: Mapping[str, Any]) -> OptimConfig:
    """torch.optim-style settings (``{"name": "SGD", "lr": .., "momentum": .., "weight_decay": .., "nesterov": ..}``,
    ``{"name": "Adam" | "AdamW", "lr": .., "betas": (b1, b2), "eps": .., "weight_decay": ..}``) as an optimizer
    config; an option that changes the update and has no graph form is refused by name."""
    if not isinstance(settings, Mapping):
        raise FrontendError(f"optimizer: expected a mapping with a 'name', got {type(settings).__name__}")
    s = dict(settings)
    raw_name = str(s.pop("name", ""))
    name = raw_name.lower()
    if name not in ("sgd", "adam", "adamw"):
        raise FrontendError(f"optimizer: expected name 'SGD', 'Adam' or 'AdamW' (torch.optim), got {raw_name!r}")
    what = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}[name]
    for k in _UNSUPPORTED_FLAGS:
        if s.pop(k, False):
            raise FrontendError(f"optimizer {what}: {k}=True is not supported (use {k}=False)")
    for k in _IGNORED:
        s.pop(k, None)
    if name == "sgd":
        if _number(s.pop("dampening", 0.0), "dampening", what) != 0.0:
            raise FrontendError("optimizer SGD: dampening must be 0")
        nesterov = bool(s.pop("nesterov", False))
        _only(s, {"lr", "momentum", "weight_decay"}, "SGD")
        momentum = _number(s.get("momentum", 0.0), "momentum", what)
        if nesterov and momentum <= 0.0:
            raise FrontendError("optimizer SGD: nesterov=True needs momentum > 0 (as torch.optim.SGD)")
        cls = NesterovSGDConfig if nesterov else SGDConfig
        return cls(lr=_number(s.get("lr", 1e-3), "lr", what), momentum=momentum,
                   weight_decay=_number(s.get("weight_decay", 0.0), "weight_decay", what))
    _only(s, {"lr", "betas", "eps", "weight_decay"}, what)
    betas = s.get("betas", (0.9, 0.999))
    if not isinstance(betas, list | tuple) or len(betas) != 2:
        raise FrontendError(f"optimizer {what}: betas: expected two numbers (beta1, beta2), got {betas!r}")
    b1, b2 = (_number(b, f"betas[{i}]", what) for i, b in enumerate(betas))
    default_wd = 0.0 if name == "adam" else 0.01  # torch.optim's defaults
    wd = _number(s.get("weight_decay", default_wd), "weight_decay", what)
    acls = AdamConfig if name == "adam" and wd != 0.0 else AdamWConfig  # Adam with wd 0 is AdamW with wd 0
    return acls(lr=_number(s.get("lr", 1e-3), "lr", what), beta1=b1, beta2=b2,
                eps=_number(s.get("eps", 1e-8), "eps", what), weight_decay=wd)


def _number(v: Any, key: str, what: str) -> float:
    """An optimizer setting as a float: a finite int or float (a 0-dim tensor's value) in torch.optim's range
    (not negative; a beta below 1), else FrontendError."""
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.dtype.is_complex:
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise FrontendError(f"optimizer {what}: {key}: expected a finite number, got {v!r}")
    if v < 0.0 or (key.startswith("betas") and v >= 1.0):
        bound = "in [0, 1)" if key.startswith("betas") else ">= 0"
        raise FrontendError(f"optimizer {what}: {key}: expected a number {bound} (as torch.optim), got {v!r}")
    return float(v)


def torch_optimizer(cfg: OptimConfig, params: list[torch.Tensor], lr: float | None = None) -> torch.optim.Optimizer:
    """The torch.optim optimizer that ``cfg`` stands for (the reference of checks and of FP32 runs)."""
    lr = cfg.lr if lr is None else lr
    if isinstance(cfg, SGDConfig):
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               nesterov=isinstance(cfg, NesterovSGDConfig))
    cls = torch.optim.Adam if isinstance(cfg, AdamConfig) else torch.optim.AdamW
    return cls(params, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _only(s: dict, allowed: set[str], what: str) -> None:
    extra = sorted(set(s) - allowed)
    if extra:
        raise FrontendError(f"optimizer {what}: unsupported setting(s) {extra} (supported: {sorted(allowed)})")


# --- lowering driver ----------------------------------------------------------------------------------
@dataclass
class Captured:
    """A lowered training step and how its slots map onto the user's module."""

    graph: Graph
    initial_state: list[np.ndarray]
    slot_names: list[str]
    aliases: dict[str, list[str]]
    """Slot name -> every ``state_dict`` key it stands for (tied weights share one slot)."""
    n_params: int
    n_buffers: int
    fields: list[Field]
    optimizer: OptimConfig
    aten_ops: dict[str, int] = field(default_factory=dict)


def _flatten_syms(v: Any) -> bool:
    if isinstance(v, Sym):
        return True
    if isinstance(v, list | tuple):
        return any(_flatten_syms(x) for x in v)
    if isinstance(v, dict):
        return any(_flatten_syms(x) for x in v.values())
    return False


def _unsupported(node, why: str = "", loss_name: str = "") -> UnsupportedOp:
    origin = node_origin(node, loss_name)
    msg = f"ATen op {node.target} has no lowering to vtrain primitives"
    if why:
        msg = f"ATen op {node.target}: {why}"
    if origin:
        msg += f" (from {origin})"
    return UnsupportedOp(msg + ".\nSupported ATen ops: " + ", ".join(supported_ops()))


def lower_program(ep, L: Lowerer, placeholders: dict[str, Any],
                  loss_name: str = "") -> tuple[list[Any], dict[str, int]]:
    """Lower every node of ``ep`` (core ATen); returns the output node's values and op counts
    (``loss_name``: how errors name the loss function)."""
    env: dict[str, Any] = {}
    counts: dict[str, int] = {}
    outputs: list[Any] = []
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = placeholders[node.name]
            continue
        if node.op == "output":
            outputs = [env.get(a.name) if hasattr(a, "name") else a for a in node.args[0]]
            break
        if node.op != "call_function":
            raise _unsupported(node, f"FX node kind {node.op!r}", loss_name)
        args = torch.fx.node.map_arg(node.args, lambda n: env[n.name])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n.name])
        if node.target is operator.getitem:
            env[node.name] = args[0][args[1]]
            continue
        counts[str(node.target)] = counts.get(str(node.target), 0) + 1
        if node.target in ZEROED and isinstance(node.meta.get("val"), torch.Tensor):
            val = node.meta["val"]  # uninitialized memory: zeros, so a CONST made of it is the same every build
            env[node.name] = torch.zeros(tuple(int(s) for s in val.shape), dtype=val.dtype)
            continue
        if not _flatten_syms((args, kwargs)) and node.target not in NO_FOLD:
            try:
                with torch.no_grad():
                    env[node.name] = node.target(*args, **kwargs)  # known at build time
            except Exception as e:  # noqa: BLE001 - any failure of a user's op is reported with its origin
                raise _unsupported(node, f"evaluating it at build time failed: {e}", loss_name) from None
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.numel() == 0 and node.target not in NO_FOLD:
            # no elements (``x[..., d:]`` with d the axis length, as partial rotary embeddings slice):
            # nothing of it depends on any input; a known empty tensor (``cat`` drops it)
            env[node.name] = torch.zeros(tuple(int(s) for s in val.shape), dtype=val.dtype)
            continue
        fn = lowering_of(node.target)
        if fn is None:
            raise _unsupported(node, "", loss_name)
        L.node = node
        try:
            out = fn(L, node, *args, **kwargs)
        except UnsupportedOp as e:
            if "Supported ATen ops" in str(e):
                raise
            raise _unsupported(node, str(e), loss_name) from None
        except GraphError as e:  # a lowering's arguments the graph cannot express: named with its origin
            raise _unsupported(node, str(e), loss_name) from None
        env[node.name] = _check_shapes(L, node, out)
    return outputs, counts


def _check_shapes(L: Lowerer, node, out: Any) -> Any:
    """Wrap each output with the exported dtype; fix a 0-dim/1-element shape; refuse a mismatch."""
    val = node.meta.get("val")
    if isinstance(out, Sym) and isinstance(val, torch.Tensor):
        want = tuple(int(s) for s in val.shape) or (1,)
        t = out.t
        if t.shape != want:
            if math.prod(t.shape) != math.prod(want):
                raise _unsupported(node, f"internal: lowered shape {t.shape}, exported shape {want}")
            t = L.reshape(t, want)
        return Sym(t, val.dtype)
    if isinstance(out, tuple | list) and isinstance(val, tuple | list):
        fixed = [_check_one(L, node, o, v) for o, v in zip(out, val)]
        return type(out)(fixed) if isinstance(out, tuple) else fixed
    return out


def _check_one(L: Lowerer, node, o: Any, v: Any) -> Any:
    if isinstance(o, Sym) and isinstance(v, torch.Tensor):
        want = tuple(int(s) for s in v.shape) or (1,)
        t = o.t if o.t.shape == want else L.reshape(o.t, want)
        return Sym(t, v.dtype)
    return o


def _tied_groups(module: nn.Module) -> tuple[list[str], dict[int, list[str]]]:
    """``state_dict`` keys in order, and for each tensor identity every key naming it."""
    sd = module.state_dict(keep_vars=True)
    groups: dict[int, list[str]] = {}
    for k, v in sd.items():
        groups.setdefault(id(v), []).append(k)
    return list(sd), groups


def _clip_grads(g: GraphBuilder, grads: list[T], max_norm: float, eps: float = 1e-6) -> list[T]:
    """Global-norm clipping in the graph: ``scale = min(1, c / (sqrt(sum g^2) + eps))``, each grad times it."""
    parts = [g.sum(g.reshape(g.mul(gr, gr), (1, math.prod(gr.shape)))) for gr in grads]  # (1, 1) each
    total = parts[0] if len(parts) == 1 else g.sum(g.reshape(_concat(g, parts), (1, len(parts))))
    norm = g.sqrt(total)
    ratio = g.div(g.const(np.full((1, 1), max_norm, np.float32), "clip_norm"), g.add_s(norm, eps))
    # min(1, r) exactly: RN(1 - r) is zero only when r == 1, so RELU(1 - r) != 0 exactly when r < 1
    over = g.relu(g.rsub_s(1.0, ratio))
    scale = g.select(over, ratio, g.const(np.ones((1, 1), np.float32), "one"))
    return [g.mul(gr, g.reshape(scale, (1,) * gr.rank)) for gr in grads]


_DIFFERENTIABLE_INPUTS = {OpKind.SELECT: (1, 2), OpKind.TAKE: (0,), OpKind.GATHER: (0,)}
"""Ops with inputs that get no gradient (a condition, an index): which inputs do."""
_NO_GRADIENT = frozenset({OpKind.RELU_GRAD, OpKind.MAX_GRAD, OpKind.ONE_HOT})


def _gradient_ancestors(g: GraphBuilder, loss: int) -> set[int]:
    """Ops the loss depends on through differentiable paths: not through a stop-gradient op, a SELECT's
    condition or an index (a parameter used only there gets no gradient, as in torch)."""
    seen: set[int] = set()
    todo = [loss]
    while todo:
        o = todo.pop()
        if o in seen:
            continue
        seen.add(o)
        node = g.ops[o]
        if o in g.no_grad or node.kind in _NO_GRADIENT:
            continue
        picks = _DIFFERENTIABLE_INPUTS.get(node.kind)
        todo.extend(node.inputs if picks is None else [node.inputs[i] for i in picks])
    return seen


def _optimize_live(g: GraphBuilder, cfg: OptimConfig, params: list[T], grads: list[T], state: list[T],
                   lr: T | None, live: list[bool]) -> tuple[list[T], list[T]]:
    """``apply_optimizer`` over the parameters with a gradient; the others, and their optimizer state,
    are passed through unchanged (torch.optim skips a parameter whose ``.grad`` is None)."""
    n = len(params)
    per_param = 1 if isinstance(cfg, SGDConfig) else 2  # momentum, or (m, v); then Adam's beta powers
    idx = [i for i in range(n) if live[i]]
    sub_state = [state[k * n + i] for k in range(per_param) for i in idx] + state[per_param * n :]
    got_p, got_s = apply_optimizer(g, cfg, [params[i] for i in idx], [grads[i] for i in idx], sub_state, lr)
    new_p, new_s = list(params), list(state)
    m = len(idx)
    for j, i in enumerate(idx):
        new_p[i] = got_p[j]
        for k in range(per_param):
            new_s[k * n + i] = got_s[k * m + j]
    new_s[per_param * n :] = got_s[per_param * m :]
    return new_p, new_s


def _concat(g: GraphBuilder, parts: list[T]) -> T:
    """(1, 1) tensors side by side as (1, n): PAD each and ADD (exact)."""
    out = None
    for i, p in enumerate(parts):
        padded = g.pad(p, 1, i, len(parts))
        out = padded if out is None else g.add(out, padded)
    return out  # type: ignore[return-value]


@contextlib.contextmanager
def _custom_functions(seen: list[type]) -> Iterator[None]:
    """Record every user-defined ``torch.autograd.Function`` applied while exporting: export inlines its
    forward and drops its backward, so the graph's gradient would not be the user's."""
    fn_cls = torch.autograd.Function
    original = fn_cls.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        if not (cls.__module__ or "").startswith("torch"):
            seen.append(cls)
        return original.__func__(cls, *args, **kwargs)

    fn_cls.apply = classmethod(apply)  # type: ignore[method-assign]
    try:
        yield
    finally:
        fn_cls.apply = original  # type: ignore[method-assign]


def _refuse_backward_hooks(module: nn.Module) -> None:
    """Gradient hooks (``Tensor.register_hook`` on a parameter, ``register_full_backward_hook``) change
    torch's gradients but not the exported forward: refused by name, not silently dropped."""
    for name, p in module.named_parameters():
        if getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None):
            raise FrontendError(f"parameter {name} has a gradient hook (register_hook): the step graph's gradient "
                                "is autodiff's of the forward, without hooks; remove it (clip with clip_grad_norm)")
    for name, m in module.named_modules():
        if getattr(m, "_backward_hooks", None) or getattr(m, "_backward_pre_hooks", None):
            raise FrontendError(f"module {name or '<root>'} ({type(m).__name__}) has a backward hook: the step "
                                "graph's gradient is autodiff's of the forward, without hooks; remove it")


TORCH_NOISE: tuple[tuple[type[Warning], str], ...] = (
    # its pytree deprecation notice, on every export (and the deepcopy in run_decompositions)
    (FutureWarning, r".*LeafSpec"),
    # nn.RNN/LSTM/GRU re-list their own parameters in ``_flat_weights`` when export swaps them in
    (UserWarning, r"The tensor attributes ([\w.\[\]']+\._flat_weights\[\d+\](, )?)+ were assigned during export"),
)
"""Warnings torch prints while capturing an ordinary model (filtered there, and nowhere else)."""


def capture(task: TorchTask, batch_size: int, n_steps: int | None = None) -> Captured:
    """Export ``task``'s model and loss on a batch of ``batch_size`` rows and build the step graph."""
    cfg = optimizer_config(task.optimizer)  # bad settings are refused before anything runs
    module = task.module
    _refuse_backward_hooks(module)
    module.train()
    flds = task.fields()
    rows = torch.from_numpy(task.samples()[:batch_size])
    if rows.shape[0] < batch_size:
        rows = torch.from_numpy(np.resize(task.samples(), (batch_size, rows.shape[1])).astype(np.float32))
    wrapper = _WithLoss(module, task.loss, flds)
    custom: list[type] = []
    try:
        with warnings.catch_warnings():  # torch's own notices, not the user's to act on
            for category, message in TORCH_NOISE:
                warnings.filterwarnings("ignore", category=category, message=message)
            with _custom_functions(custom):
                ep = torch.export.export(wrapper, (rows,), strict=False)
            mark_detaches(ep)
            mark_no_grad_regions(ep)
            ep = ep.run_decompositions(decomposition_table())
    except UnsupportedOp:
        raise
    except Exception as e:  # noqa: BLE001 - export errors come from the user's code; keep them short
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FrontendError(f"torch.export could not capture the model and loss: {type(e).__name__}: {first}") from None
    if custom:
        names = ", ".join(sorted({describe_function(c) for c in custom}))
        raise UnsupportedOp(f"custom torch.autograd.Function {names}: torch.export keeps its forward and drops its "
                            "backward, so the step's gradient would not be yours; write the forward with torch ops "
                            "(autodiff gives their gradient) or drop the Function")
    g = GraphBuilder()
    L = Lowerer(g)
    sig = ep.graph_signature
    keys, groups = _tied_groups(module)
    key_id = {k: i for i, ks in groups.items() for k in ks}
    mutated = set(sig.buffers_to_mutate.values())

    def key_of(target: str) -> str:
        return target.removeprefix("module.")

    # slots: parameters (state_dict order, tied once), then mutated buffers
    specs = list(sig.input_specs)
    sd_vars = module.state_dict(keep_vars=True)
    # a frozen parameter (requires_grad=False) is a constant of the graph, like a read-only buffer
    param_specs = [s for s in specs if s.kind.name == "PARAMETER" and sd_vars[key_of(s.target)].requires_grad]
    buf_specs = [s for s in specs if s.kind.name == "BUFFER" and s.target in mutated]
    sd = module.state_dict(keep_vars=True)
    canon: dict[int, str] = {i: ks[0] for i, ks in groups.items()}
    params_by_id: dict[int, list[Any]] = {}
    for s in param_specs:
        params_by_id.setdefault(key_id[key_of(s.target)], []).append(s)
    ordered_params = sorted(params_by_id, key=lambda i: keys.index(canon[i]))
    placeholders: dict[str, Any] = {}
    param_ts: list[T] = []
    init: list[np.ndarray] = []
    slot_names: list[str] = []
    aliases: dict[str, list[str]] = {}
    for i in ordered_params:
        name = canon[i]
        t = g.input(name, tuple(sd[name].shape) or (1,))
        param_ts.append(t)
        init.append(_f32(sd[name]))
        slot_names.append(name)
        aliases[name] = list(groups[i])
        for s in params_by_id[i]:
            placeholders[s.arg.name] = Sym(t)
    buf_ts: dict[str, T] = {}
    for s in sorted(buf_specs, key=lambda s: keys.index(key_of(s.target))):
        name = key_of(s.target)
        t = g.input(name, tuple(sd[name].shape) or (1,))
        buf_ts[s.target] = t
        init.append(_f32(sd[name]))
        slot_names.append(name)
        aliases[name] = [name]
        placeholders[s.arg.name] = Sym(t, sd[name].dtype)
    opt_slots = optimizer_slots(cfg, [(n, tuple(sd[n].shape) or (1,)) for n in slot_names[: len(param_ts)]])
    opt_ts = [g.input(n, s) for n, s, _ in opt_slots]
    slot_names += [n for n, _, _ in opt_slots]
    data = g.data(tuple(rows.shape))
    for s in specs:
        kind = s.kind.name
        if s.arg.name in placeholders:
            continue
        if kind == "USER_INPUT":
            placeholders[s.arg.name] = Sym(data)
        elif kind == "PARAMETER":  # frozen
            placeholders[s.arg.name] = sd_vars[key_of(s.target)].detach()
        elif kind == "BUFFER":
            placeholders[s.arg.name] = ep.state_dict[s.target] if s.target in ep.state_dict else ep.constants[s.target]
        elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            placeholders[s.arg.name] = ep.constants[s.target]
        else:
            raise FrontendError(f"export input {s.arg.name}: unexpected kind {kind}")
    outputs, counts = lower_program(ep, L, placeholders, describe_function(task.loss))
    loss_v = None
    new_bufs: dict[str, T] = {}
    for spec, val in zip(sig.output_specs, outputs):
        if spec.kind.name == "BUFFER_MUTATION":
            new_bufs[spec.target] = L.t(val)
        elif spec.kind.name == "USER_OUTPUT":
            if loss_v is not None:
                raise FrontendError("the loss function must return one scalar tensor, got several outputs")
            loss_v = val
        else:  # a parameter or an input changed in place by the forward: not a step of the graph
            what = key_of(spec.target or "a tensor")
            raise FrontendError(f"the forward changes {what} in place ({spec.kind.name}); only buffers may be "
                                "updated in the forward (parameters change through the optimizer)")
    if not isinstance(loss_v, Sym) or math.prod(loss_v.shape) != 1:
        raise FrontendError("the loss must be a scalar tensor that depends on the model's parameters")
    loss = L.reshape(loss_v.t, (1, 1))
    reach = _gradient_ancestors(g, loss.op)
    live = [t for t in param_ts if t.op in reach]
    if param_ts and not live:
        raise FrontendError("no trainable parameter reaches the loss (every one is unused or detached)")
    live_grads = dict(zip([t.op for t in live], g.grad(loss, live))) if live else {}
    grads = [live_grads.get(t.op) or g.const(np.zeros(t.shape, np.float32), "zero_grad") for t in param_ts]
    grad_ops = {i: gr.op for i, gr in enumerate(grads)}  # the loss gradients (before any clipping)
    if task.clip_grad_norm is not None:
        grads = _clip_grads(g, grads, float(task.clip_grad_norm))
    lr_t = None
    if task.schedule is not None:
        steps = n_steps or task.schedule.total_steps
        table = g.const(task.schedule.table(cfg.lr, steps), "lr_table")
        lr_t = g.take(table, g.add_s(g.step(), -1.0), 0)  # (1,)
    if len(live) == len(param_ts):
        new_p, new_s = apply_optimizer(g, cfg, param_ts, grads, opt_ts, lr=lr_t)
    else:  # as torch.optim: a parameter without a gradient (unused, detached) is left as it is
        dead = [i for i, t in enumerate(param_ts) if t.op not in reach]
        log.info("parameters without a gradient (not updated): %s", [slot_names[i] for i in dead])
        new_p, new_s = _optimize_live(g, cfg, param_ts, grads, opt_ts, lr_t, [t.op in reach for t in param_ts])
    outs = list(new_p)
    for s in sorted(buf_specs, key=lambda s: keys.index(key_of(s.target))):
        outs.append(new_bufs[s.target])
    outs += new_s
    for slot, t in enumerate(outs):
        shape = g.slots[slot].shape
        flat = t.rank == 1 and t.shape[0] == math.prod(shape)  # a slice of the flat optimizer buffers
        g.output(t if flat else L.reshape(t, shape), slot)
    graph = g.build(loss, grad_ops)
    init += [v for _, _, v in opt_slots]
    log.info("captured %d ATen nodes into %d primitive ops", sum(counts.values()), graph.n_ops)
    return Captured(graph, init, slot_names, aliases, len(param_ts), len(buf_specs), flds, cfg, counts)


def _f32(t: torch.Tensor) -> np.ndarray:
    a = t.detach().to(torch.float32).numpy().astype(np.float32)
    return np.ascontiguousarray(a.reshape(a.shape or (1,))) + np.float32(0.0)
