"""A training job from a user's Python file: ``model = "path/to/file.py:factory"`` in the spec.

``factory(**model_args)`` returns a :class:`~vtrain.frontend.TorchTask`. It is called after
``torch.manual_seed(spec.seed)``; the weights it draws are still not the same bits on every CPU
(:data:`RANDOM_INIT_CAUSE`), so a run folder pins them as its checkpoint
(:meth:`~vtrain.training.rundir.RunDir.pin_initial_weights`). ``checkpoint`` (safetensors or a
``state_dict`` .pt file) replaces the module's initial weights: fine-tuning starts from it, and it
is what the initial state root commits to.
"""

from __future__ import annotations

import copy
import hashlib
import io
import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vtrain.errors import DataChanged, NonFiniteValue, SpecError, VtrainError
from vtrain.frontend.capture import Captured, TorchTask, _WithLoss, capture, torch_optimizer
from vtrain.frontend.errors import FrontendError

log = logging.getLogger(__name__)


def is_file_model(model: str) -> bool:
    """True for ``"file.py:factory"`` (a user's model), False for the built-in names."""
    return ":" in model


def parse_model_ref(model: str) -> tuple[Path, str]:
    """``"dir/file.py:factory"`` -> (path, factory name); SpecError names what is wrong."""
    path, _, name = model.rpartition(":")
    if not path or not name.isidentifier():
        raise SpecError(f"spec: model: expected 'mlp', 'gpt' or 'FILE.py:FACTORY', got {model!r}")
    if not path.endswith(".py"):
        raise SpecError(f"spec: model: expected a Python file (*.py) before ':', got {path!r}")
    return Path(path), name


def pinned_bytes(path: Path, sha256: str | None, what: str) -> bytes:
    """The bytes of ``path``, read once; with ``sha256`` (a pinned spec) they must hash to it, else
    :class:`DataChanged` names the file and both sha256 (nothing of the file is used)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(f"spec: {what}: cannot read {str(path)!r} ({e.strerror or e})") from None
    if sha256 is not None and (got := hashlib.sha256(raw).hexdigest()) != sha256:
        raise DataChanged(f"{what} {str(path)!r} is not the pinned one: sha256 {got}, the spec pins {sha256}")
    return raw


def pin_files(spec):
    """``spec`` (a :class:`~vtrain.training.spec.TrainSpec` of a file model) with its model source
    and checkpoint pinned, where they lie, by the sha256 of their bytes now (as a run folder's
    spec.json pins its copies): a job for it commits to those bytes. Already pinned files are
    checked (:func:`pinned_bytes`)."""
    import dataclasses

    path, _ = parse_model_ref(spec.model)
    source = pinned_bytes(path, spec.model_sha256, "model source")
    out = dataclasses.replace(spec, model_sha256=hashlib.sha256(source).hexdigest())
    if spec.checkpoint is not None:
        raw = pinned_bytes(Path(spec.checkpoint), spec.checkpoint_sha256, "checkpoint")
        out = dataclasses.replace(out, checkpoint_sha256=hashlib.sha256(raw).hexdigest())
    return out


#: A run folder's pin of the initial weights a file model's factory drew (``model/initial.safetensors``).
INITIAL_WEIGHTS = "initial.safetensors"

#: Why a file model without a checkpoint has no portable initial state (messages of train, create-job,
#: replay and the agents).
RANDOM_INIT_CAUSE = ("its initial weights are what the factory draws from torch's random number generator, "
                     "and torch's random init kernels (normal_, uniform_, kaiming_uniform_) give different bits "
                     "on CPUs with other vector instructions (AVX2, AVX-512, ARM, ATEN_CPU_CAPABILITY)")


def draws_initial_weights(spec) -> bool:
    """True for a file model without a ``checkpoint``: its initial state is whatever its factory
    draws after ``torch.manual_seed``, which depends on the CPU's torch kernels (not portable)."""
    return is_file_model(spec.model) and spec.checkpoint is None


def initial_weights_bytes(module: torch.nn.Module) -> bytes:
    """``module.state_dict()`` as safetensors bytes, each tensor once (tied weights under their first
    name, as :func:`apply_checkpoint` accepts them): loaded back, the same bits."""
    from safetensors.torch import save

    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for k, v in module.state_dict(keep_vars=True).items():
        if id(v) in seen:
            continue
        seen.add(id(v))
        out[k] = v.detach().clone().contiguous()
    return save(out, metadata={"format": "pt", "vtrain": "initial weights drawn by the factory"})


def load_factory(model: str, sha256: str | None = None):
    """The factory function named by ``model`` (the file imported under a private module name).

    With ``sha256`` the file's bytes are checked first and exactly those bytes are executed: a
    changed model source is refused before any of it runs."""
    path, name = parse_model_ref(model)
    if not path.is_file():
        raise SpecError(f"spec: model: no such file {str(path)!r}")
    source = pinned_bytes(path, sha256, "model source")
    mod_name = "vtrain_user_" + hashlib.sha256(str(path.resolve()).encode() + source).hexdigest()[:12]
    module = types.ModuleType(mod_name)
    module.__file__ = str(path)
    sys.modules[mod_name] = module
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the user's model file
    except Exception as e:  # noqa: BLE001 - the user's file: report it in one line
        raise SpecError(f"spec: model: importing {str(path)!r} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise SpecError(f"spec: model: {str(path)!r} has no function {name!r} (it has: {', '.join(found)})")
    return fn


def load_checkpoint(path: str | Path, sha256: str | None = None) -> dict[str, torch.Tensor]:
    """A ``state_dict`` from ``*.safetensors`` or a torch ``.pt``/``.pth``/``.bin`` file (tensors only);
    with ``sha256`` the bytes must be the pinned ones (:func:`pinned_bytes`)."""
    path = Path(path)
    if not path.is_file():
        raise FrontendError(f"checkpoint {str(path)!r}: no such file")
    raw = pinned_bytes(path, sha256, "checkpoint")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load as load_bytes

            sd = load_bytes(raw)
        else:
            sd = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - corrupt or foreign files: one clear line
        raise FrontendError(f"checkpoint {str(path)!r}: cannot read it ({type(e).__name__}: {e})") from None
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise FrontendError(f"checkpoint {str(path)!r}: expected a state_dict (names -> tensors)")
    return sd


def apply_checkpoint(module: torch.nn.Module, sd: dict[str, torch.Tensor], where: str) -> None:
    """Load ``sd`` into ``module`` strictly (tied weights may appear under any one of their names)."""
    own = module.state_dict()
    ids: dict[int, list[str]] = {}
    for k, v in module.state_dict(keep_vars=True).items():
        ids.setdefault(id(v), []).append(k)
    covered = {k for names in ids.values() if any(n in sd for n in names) for k in names}
    missing = [k for k in own if k not in covered]
    unexpected = [k for k in sd if k not in own]
    bad = [f"{k}: checkpoint {tuple(sd[k].shape)}, model {tuple(own[k].shape)}"
           for k in sd if k in own and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or bad:
        parts = []
        if missing:
            parts.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        if bad:
            parts.append(f"shape mismatch {bad[:4]}")
        raise FrontendError(f"checkpoint {where}: does not fit the model ({'; '.join(parts)})")
    with torch.no_grad():
        for k, v in sd.items():
            own_t = module.state_dict(keep_vars=True)[k]
            own_t.copy_(v.to(own_t.dtype))


def _user_frame(e: BaseException, model: str) -> str:
    """`` (at FILE, line N: code)`` of the innermost frame of ``e`` in the model's file, else the innermost one."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)[1:]  # [0] is make_task's call
    if not frames:
        return ""
    source = str(parse_model_ref(model)[0])
    mine = [f for f in frames if f.filename == source]
    f = (mine or frames)[-1]
    return f" (at {f.filename}, line {f.lineno}" + (f": {f.line})" if f.line else ")")


def make_task(model: str, model_args: dict[str, Any], seed: int, checkpoint: str | None,
              model_sha256: str | None = None, checkpoint_sha256: str | None = None) -> TorchTask:
    """Call the factory (seeded), check what it returns, load the checkpoint if any (each file
    checked against its pinned sha256 first, when given)."""
    fn = load_factory(model, model_sha256)
    torch.manual_seed(seed % 2**63)
    np.random.seed(seed % 2**32)
    import inspect

    try:
        inspect.signature(fn).bind(**model_args)
    except TypeError as e:
        raise SpecError(f"spec: model_args {sorted(model_args)}: the factory rejects them ({e})") from None
    except ValueError:  # no signature to check (a builtin): the call says
        pass
    try:
        task = fn(**model_args)
    except Exception as e:  # noqa: BLE001 - the user's factory: one line naming its file and line
        raise SpecError(f"spec: model: {model} raised {type(e).__name__}: {e}{_user_frame(e, model)}") from None
    if not isinstance(task, TorchTask):
        raise SpecError(f"spec: model: {model} must return a vtrain.frontend.TorchTask, got {type(task).__name__}")
    if not isinstance(task.module, torch.nn.Module):
        raise SpecError(f"spec: model: TorchTask.module must be a torch.nn.Module, got {type(task.module).__name__}")
    for p in task.module.parameters():
        if p.dtype != torch.float32:
            raise FrontendError(f"model: parameters must be float32, got {p.dtype}")
    if checkpoint:
        apply_checkpoint(task.module, load_checkpoint(checkpoint, checkpoint_sha256), repr(checkpoint))
    return task


@dataclass
class TorchJob:
    """The user's task and its lowering, kept with the :class:`~vtrain.training.spec.Job`."""

    task: TorchTask
    captured: Captured


def build_torch_job(spec) -> tuple[TorchJob, np.ndarray, list[str] | None]:
    """The task, its captured step graph and the dataset rows of ``spec`` (a file model)."""
    task = make_task(spec.model, dict(spec.model_args), spec.seed, spec.checkpoint, spec.model_sha256,
                     spec.checkpoint_sha256)
    pristine = copy.deepcopy(task.module)  # capture runs the model once (batch-norm buffers move)
    cap = capture(task, spec.batch_size, n_steps=spec.steps)
    task.module = pristine
    if task.schedule is not None and spec.steps > len(task.schedule.table(cap.optimizer.lr, spec.steps)):
        raise SpecError("spec: steps: longer than the LR schedule table")
    return TorchJob(task, cap), task.samples(), task.vocab


def state_dict_of(cap: Captured, state: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameters and buffers of a state as the module's ``state_dict`` (tied names share a tensor)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in zip(cap.slot_names[: cap.n_params + cap.n_buffers], state):
        for k in cap.aliases[name]:
            out[k] = t
    return out


class TorchTaskReference:
    """Plain torch FP32 training of a file model (mode ``fp32``): the user's module, autograd,
    ``torch.optim``; dropout from torch's RNG seeded per step. Slots in and out in the graph's order."""

    def __init__(self, job) -> None:
        from vtrain.numerics.rounding import Mode

        self.mode = Mode.FP32
        self.job = job
        tj: TorchJob = job.torch
        self.task = tj.task
        self.cap = tj.captured
        self.module = copy.deepcopy(self.task.module).train()
        self.wrapper = _WithLoss(self.module, self.task.loss, self.cap.fields)
        named = dict(self.module.named_parameters(remove_duplicate=False))
        self.params = [named[n] for n in self.cap.slot_names[: self.cap.n_params]]
        self.buffers = dict(self.module.named_buffers())
        cfg = self.cap.optimizer
        self.cfg = cfg
        self.opt: torch.optim.Optimizer = torch_optimizer(cfg, self.params)

    def _load(self, state: list[torch.Tensor]) -> None:
        from vtrain.models.optim import SGDConfig
        from vtrain.torch_ref import _adam_step_count

        n, nb = self.cap.n_params, self.cap.n_buffers
        with torch.no_grad():
            for p, t in zip(self.params, state[:n]):
                p.copy_(t.reshape(p.shape))
                p.grad = None
            for name, t in zip(self.cap.slot_names[n : n + nb], state[n : n + nb]):
                b = self.buffers[name]
                b.copy_(t.reshape(b.shape).to(b.dtype))
        self.opt.state.clear()
        rest = state[n + nb :]
        if isinstance(self.cfg, SGDConfig):
            for p, buf in zip(self.params, rest[:n]):
                self.opt.state[p]["momentum_buffer"] = buf.detach().clone().reshape(p.shape)
            return
        steps = _adam_step_count(float(rest[2 * n]), float(rest[2 * n + 1]), self.cfg)
        for p, m, v in zip(self.params, rest[:n], rest[n : 2 * n]):
            self.opt.state[p].update(step=torch.tensor(float(steps)), exp_avg=m.detach().clone().reshape(p.shape),
                                     exp_avg_sq=v.detach().clone().reshape(p.shape))

    def _export(self) -> list[torch.Tensor]:
        from vtrain.models.optim import SGDConfig
        from vtrain.numerics.rounding import canonical

        n, nb = self.cap.n_params, self.cap.n_buffers
        shapes = [s.shape for s in self.job.graph.slots]
        out = [canonical(p.detach().clone().reshape(shapes[i])) for i, p in enumerate(self.params)]
        for j, name in enumerate(self.cap.slot_names[n : n + nb]):
            out.append(canonical(self.buffers[name].detach().to(torch.float32).clone().reshape(shapes[n + j])))
        st = self.opt.state
        if isinstance(self.cfg, SGDConfig):
            return out + [canonical(st[p]["momentum_buffer"].detach().clone()) for p in self.params]
        out += [canonical(st[p]["exp_avg"].detach().clone()) for p in self.params]
        out += [canonical(st[p]["exp_avg_sq"].detach().clone()) for p in self.params]
        t = max((int(st[p]["step"].item()) for p in self.params if "step" in st[p]), default=0)  # a trained one
        out += [torch.tensor([self.cfg.beta1**t], dtype=torch.float32),
                torch.tensor([self.cfg.beta2**t], dtype=torch.float32)]
        return out

    def run(self, state: list[torch.Tensor], data: torch.Tensor, log_in=None, step: int | None = None,
            **_ignored: Any):
        """One plain FP32 step (:meth:`StepExecutor.run`'s interface; logs and traces do not apply)."""
        from vtrain.graph.executor import StepLog, StepResult
        from vtrain.numerics.rounding import Mode, RoundingStats

        if len(state) != len(self.job.graph.slots):
            raise VtrainError(f"state: expected {len(self.job.graph.slots)} tensors, got {len(state)}")
        s = step or 1
        self._load(state)
        if self.task.schedule is not None:
            lr = float(self.task.schedule.table(self.cfg.lr, max(s, self.job.spec.steps))[s - 1])
            for group in self.opt.param_groups:
                group["lr"] = lr
        gen_seed = int.from_bytes(hashlib.sha256(self.job.spec.data_seed + s.to_bytes(8, "big")).digest()[:8], "big")
        torch.manual_seed(gen_seed % 2**63)
        loss = self.wrapper(data.to(torch.float32))
        if not bool(torch.isfinite(loss)):
            raise NonFiniteValue(f"fp32 reference: loss is {float(loss)}")
        loss.backward()
        if self.task.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.task.clip_grad_norm)
        self.opt.step()
        return StepResult(self._export(), float(loss.detach()), StepLog(Mode.FP32), RoundingStats())
