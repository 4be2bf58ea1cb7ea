"""``vtrain export``: a run's weights (no optimizer state) as safetensors with state_dict names."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
from safetensors.numpy import save as st_save

from vtrain.errors import CorruptArtifact, MissingArtifact, VtrainError
from vtrain.graph.step_graph import Graph
from vtrain.models.optim import SGDConfig
from vtrain.outputs.torch_models import state_dict_name, state_dict_value
from vtrain.training.rundir import RunDir, atomic_write
from vtrain.training.spec import Job, TrainSpec


def n_params(spec: TrainSpec, graph: Graph) -> int:
    """How many leading state slots are parameters (the rest: the optimizer's state)."""
    n = len(graph.slots)
    return n // 2 if isinstance(spec.optimizer, SGDConfig) else (n - 2) // 3


def verified_state(run: RunDir, job: Job, step: int | None = None) -> tuple[int, list]:
    """The state at checkpoint ``step`` (default: the latest), checked against the recorded root."""
    from vtrain.commit.roots import state_root
    from vtrain.training.loop import component_roots, initial_commitment

    roots = run.read_roots()
    steps = run.checkpoint_steps()
    if not steps:
        raise MissingArtifact(f"no checkpoints in run folder {run.path}")
    if step is None:
        step = max([s for s in steps if s == 0 or s in roots], default=0)
    if step not in steps:
        raise MissingArtifact(f"no checkpoint of step {step} in {run.path} (checkpoints: {steps})")
    state = run.read_checkpoint(step, job.graph)
    want = initial_commitment(job)[1].hex() if step == 0 else roots.get(step, {}).get("state_root")
    got = state_root(component_roots(state)).hex()
    if want is None:
        raise CorruptArtifact(f"{run.path}: roots.jsonl records no state root for step {step}")
    from vtrain.frontend.job import RANDOM_INIT_CAUSE, draws_initial_weights

    if got != want and step == 0 and draws_initial_weights(job.spec):  # a run folder from before the pin
        raise CorruptArtifact(f"checkpoint {run.ckpt_path(step)}: state root {got}, the initial state its factory "
                              f"draws here has {want} (the spec pins no initial weights: {RANDOM_INIT_CAUSE}; a run "
                              "trained now pins them in model/initial.safetensors)")
    if got != want:
        raise CorruptArtifact(f"checkpoint {run.ckpt_path(step)}: state root {got}, recorded {want}")
    return step, state


def weights(job: Job, state: list) -> dict[str, np.ndarray]:
    spec = job.spec
    out: dict[str, np.ndarray] = {}
    for slot, t in zip(job.graph.slots[: n_params(spec, job.graph)], state):
        key = state_dict_name(spec.model, slot.name)
        if key in out:
            raise VtrainError(f"export: two parameters map to the state_dict name {key!r}")
        out[key] = state_dict_value(spec.model, slot.name, t.detach().numpy().astype(np.float32))
    return out


def model_config(spec: TrainSpec) -> dict:
    cfg = asdict(spec.gpt) if spec.model == "gpt" else asdict(spec.mlp)
    return {"model": spec.model, "config": cfg}


def export_torch_run(job: Job, state: list, out: Path, step: int) -> dict:
    """A front-end run (``FILE.py:FACTORY``): the user's module with the run's weights, saved as the
    module's own ``state_dict`` in ``model.safetensors``; a module with ``save_pretrained`` (HF
    transformers) is saved by it, so ``from_pretrained(out)`` loads it (config.json included)."""
    import copy

    import torch
    from safetensors.torch import save as st_save_torch

    from vtrain.frontend.job import state_dict_of

    module = copy.deepcopy(job.torch.task.module)
    own = module.state_dict()
    sd = {k: v.reshape(own[k].shape).clone() for k, v in state_dict_of(job.torch.captured, state).items()}
    missing = [k for k in sd if k not in own]
    if missing:
        raise VtrainError(f"export: the run's slots {missing} are not in the module's state_dict")
    with torch.no_grad():
        module.load_state_dict(sd, strict=False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(module, "save_pretrained"):
        module.save_pretrained(str(out), safe_serialization=True)
        kind = "save_pretrained"
    else:
        full = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        atomic_write(out / "model.safetensors", st_save_torch(full, metadata={"step": str(step), "format": "pt"}))
        atomic_write(out / "config.json", json.dumps({"model": job.spec.model, "model_args": job.spec.model_args,
                                                      "step": step}, indent=1).encode())
        kind = "state_dict"
    names = sorted(module.state_dict())
    return {"out": str(out), "step": step, "tensors": len(names), "trained": len(sd), "format": kind,
            "values": int(sum(t.numel() for t in module.state_dict().values())), "names": names}


def export_run(run: RunDir, job: Job, out: Path, step: int | None = None) -> dict:
    """Write ``model.safetensors`` (weights only), ``config.json`` and (GPT) ``vocab.json`` to ``out``."""
    step, state = verified_state(run, job, step)
    if job.torch is not None:
        return export_torch_run(job, state, out, step)
    w = weights(job, state)
    vocab = run.read_vocab(job.dataset)  # checked before anything is written
    out = Path(out)
    atomic_write(out / "model.safetensors", st_save(w, metadata={"step": str(step), "format": "pt"}))
    cfg = {**model_config(job.spec), "step": step}
    atomic_write(out / "config.json", json.dumps(cfg, indent=1).encode())
    if vocab is not None:
        atomic_write(out / "vocab.json", json.dumps({"kind": "characters", "symbols": list(vocab)},
                                                    ensure_ascii=False).encode())
    return {"out": str(out), "step": step, "tensors": len(w), "values": int(sum(a.size for a in w.values())),
            "names": sorted(w)}
