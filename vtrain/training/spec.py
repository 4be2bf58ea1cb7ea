"""The training spec (one JSON-able dataclass) and what follows from it: the step graph, the
initial state and the dataset. Everything a trainer and an auditor must agree on is here."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vtrain.errors import DatasetError, SpecError
from vtrain.graph.step_graph import Graph, GraphBuilder
from vtrain.models.nn import (
    GPTConfig,
    MLPConfig,
    gpt_forward,
    gpt_params,
    init_params,
    mlp_forward,
    mlp_params,
)
from vtrain.models.optim import AdamWConfig, SGDConfig, apply_optimizer, optimizer_slots
from vtrain.numerics.rounding import Mode
from vtrain.training.data import Dataset, digits_dataset, load_text_file, synthetic_corpus, text_dataset


@dataclass(frozen=True)
class TrainSpec:
    """A training job: model, optimizer, data, schedule and numerics mode."""

    model: str = "mlp"  # "mlp" (digits, MSE), "gpt" (character-level) or "FILE.py:FACTORY" (a torch model)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    gpt: GPTConfig = field(default_factory=GPTConfig)
    optimizer: SGDConfig | AdamWConfig = field(default_factory=SGDConfig)
    batch_size: int = 16
    steps: int = 8
    interval: int = 4  # K: steps per committed interval
    seed: int = 0  # parameter init and data order
    mode: str = Mode.CERTIFIED.value
    text_path: str | None = None  # gpt: a user's text file; default: the synthetic corpus
    corpus_chars: int = 20_000
    model_args: dict[str, Any] = field(default_factory=dict)  # FILE.py:FACTORY: keyword arguments
    checkpoint: str | None = None  # FILE.py:FACTORY: initial weights (safetensors / state_dict .pt)
    model_sha256: str | None = None  # FILE.py:FACTORY: sha256 of the factory file's bytes (pinned runs)
    checkpoint_sha256: str | None = None  # sha256 of the checkpoint file's bytes (pinned runs)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def data_seed(self) -> bytes:
        """The 32-byte data-order seed committed on-chain."""
        return self.seed.to_bytes(32, "big")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["optimizer"]["name"] = self.optimizer.name
        for k in PIN_KEYS:  # absent unless pinned: specs without a file model keep their hash
            if d[k] is None:
                del d[k]
        return d

    @property
    def pinned(self) -> bool:
        """True when the factory file (and the checkpoint, if any) are pinned by sha256."""
        return self.model_sha256 is not None and (self.checkpoint is None or self.checkpoint_sha256 is not None)

    def commitment(self) -> dict[str, Any]:
        """What the on-chain ``specHash`` commits to: :meth:`to_dict`, except that a pinned file
        model is named by its file name and the sha256 of its bytes, and a text file by its name
        (its contents are in ``dataRoot``), not by where the files lie (a run folder moved
        elsewhere, or an auditor's copy, hashes the same)."""
        d = self.to_dict()
        if self.text_path is not None:  # the text's contents are committed by dataRoot
            d["text_path"] = Path(self.text_path).name
        if self.pinned:
            path, _, factory = self.model.rpartition(":")
            d["model"] = f"{Path(path).name}:{factory}"
            if self.checkpoint is not None:
                d["checkpoint"] = Path(self.checkpoint).name
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_dict(d: Any) -> TrainSpec:
        """A spec from its :meth:`to_dict` form; unknown keys, wrong types and out-of-range values
        raise :class:`SpecError` naming the key."""
        if not isinstance(d, dict):
            raise SpecError(f"spec: expected an object of settings, got {type(d).__name__}")
        d = dict(d)
        _known("spec", d, TrainSpec)
        opt = d.pop("optimizer", {"name": "sgd"})
        if not isinstance(opt, dict):
            raise SpecError(f"spec: optimizer: expected an object, got {type(opt).__name__}")
        name = opt.get("name", "sgd")
        classes = {"sgd": SGDConfig, "adamw": AdamWConfig}
        if name not in classes:
            raise SpecError(f"spec: optimizer.name: expected one of {sorted(classes)}, got {name!r}")
        cls = classes[name]
        _known("optimizer", opt, cls)
        mlp = d.pop("mlp", {})
        gpt = d.pop("gpt", {})
        for key, sub, sub_cls in (("mlp", mlp, MLPConfig), ("gpt", gpt, GPTConfig)):
            if not isinstance(sub, dict):
                raise SpecError(f"spec: {key}: expected an object, got {type(sub).__name__}")
            _known(key, sub, sub_cls)
        hidden = mlp.get("hidden", list(MLPConfig().hidden))
        if not isinstance(hidden, list | tuple):
            raise SpecError(f"spec: mlp.hidden: expected a list of positive integers, got {hidden!r}")
        return TrainSpec(mlp=MLPConfig(**{**mlp, "hidden": tuple(hidden)}), gpt=GPTConfig(**gpt),
                         optimizer=cls(**opt), **d)

    @staticmethod
    def from_json(text: str) -> TrainSpec:
        from vtrain.training.untrusted import loads_json

        try:
            return TrainSpec.from_dict(loads_json(text))
        except json.JSONDecodeError as e:
            raise SpecError(f"invalid training spec JSON: {e}") from None

    @staticmethod
    def from_toml(text: str) -> TrainSpec:
        """The same settings as TOML (``[optimizer]``, ``[mlp]``, ``[gpt]`` tables)."""
        import tomllib

        try:
            return TrainSpec.from_dict(tomllib.loads(text))
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"invalid training spec TOML: {e}") from None

    @staticmethod
    def from_file(path: str | Path) -> TrainSpec:
        """Read a spec file: TOML when its name ends in ``.toml``, else JSON. Errors name the file."""
        from vtrain.errors import CorruptArtifact
        from vtrain.training.untrusted import read_regular

        path = Path(path)
        try:  # a spec may come from someone else: only a regular file, and small
            raw = read_regular(path, MAX_SPEC_BYTES, "spec file")
        except CorruptArtifact as e:
            raise SpecError(str(e)) from None
        except OSError as e:
            raise SpecError(f"spec file {path}: {e.strerror or e}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"spec file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        try:
            return TrainSpec.from_toml(text) if path.suffix.lower() == ".toml" else TrainSpec.from_json(text)
        except SpecError as e:
            raise SpecError(f"spec file {path}: {e}") from None


_U256 = 2**256
#: Most bytes of a spec file (settings and model arguments; read whole before it is parsed).
MAX_SPEC_BYTES = 1 << 20
#: Keys of a spec that pin a file model's bytes (left out of :meth:`TrainSpec.to_dict` when unset).
PIN_KEYS = ("model_sha256", "checkpoint_sha256")


def _known(where: str, d: dict, cls: type) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in d if k not in names)
    if unknown:
        raise SpecError(f"spec: {where}: unknown key(s) {', '.join(map(repr, unknown))} "
                        f"(known: {', '.join(sorted(names))})")


def _int(where: str, v: Any, lo: int = 1, hi: int = 2**31 - 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(f"spec: {where}: expected an integer, got {v!r}")
    if not lo <= v <= hi:
        raise SpecError(f"spec: {where}: expected an integer in [{lo}, {hi}], got {v}")


def _float(where: str, v: Any, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise SpecError(f"spec: {where}: expected a finite number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        raise SpecError(f"spec: {where}: expected a number in {'(' if lo_open else '['}{lo}, {hi}"
                        f"{')' if hi_open else ']'}, got {v}")


def _validate(s: TrainSpec) -> None:
    """Types and ranges of every setting (a spec is also built from options and code)."""
    if not isinstance(s.model, str):
        raise SpecError(f"spec: model: expected 'mlp', 'gpt' or 'FILE.py:FACTORY', got {s.model!r}")
    if s.model not in ("mlp", "gpt"):
        from vtrain.frontend.job import parse_model_ref

        parse_model_ref(s.model)
    if not isinstance(s.model_args, dict) or not all(isinstance(k, str) for k in s.model_args):
        raise SpecError(f"spec: model_args: expected a table of keyword arguments, got {s.model_args!r}")
    if s.checkpoint is not None and not isinstance(s.checkpoint, str):
        raise SpecError(f"spec: checkpoint: expected a file name, got {s.checkpoint!r}")
    for key in PIN_KEYS:
        v = getattr(s, key)
        if v is not None and (not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v)):
            raise SpecError(f"spec: {key}: expected 64 lowercase hex digits (a sha256), got {v!r}")
    if s.model_sha256 is not None and s.model in ("mlp", "gpt"):
        raise SpecError(f"spec: model_sha256: only a FILE.py:FACTORY model has a source to pin, got model {s.model!r}")
    if s.checkpoint_sha256 is not None and s.checkpoint is None:
        raise SpecError("spec: checkpoint_sha256: set, but there is no checkpoint")
    modes = [m.value for m in Mode]
    if s.mode not in modes:
        raise SpecError(f"spec: mode: expected one of {modes}, got {s.mode!r}")
    for name in ("batch_size", "steps", "interval"):
        _int(name, getattr(s, name))
    _int("seed", s.seed, 0, _U256 - 1)
    _int("corpus_chars", s.corpus_chars, 1, 10**9)
    if s.text_path is not None and not isinstance(s.text_path, str):
        raise SpecError(f"spec: text_path: expected a file name, got {s.text_path!r}")
    if not isinstance(s.mlp, MLPConfig) or not isinstance(s.gpt, GPTConfig):
        raise SpecError("spec: mlp/gpt: expected MLPConfig and GPTConfig")
    _int("mlp.n_in", s.mlp.n_in, 1, 1 << 20)
    _int("mlp.n_out", s.mlp.n_out, 1, 1 << 20)
    if not isinstance(s.mlp.hidden, tuple):
        raise SpecError(f"spec: mlp.hidden: expected a list of positive integers, got {s.mlp.hidden!r}")
    for k, h in enumerate(s.mlp.hidden):
        _int(f"mlp.hidden[{k}]", h, 1, 1 << 20)
    for name in ("vocab", "context", "n_layer", "n_head", "d_model"):
        _int(f"gpt.{name}", getattr(s.gpt, name), 1, 1 << 24)
    if s.model == "gpt" and s.gpt.d_model % s.gpt.n_head:
        raise SpecError(f"spec: gpt: d_model {s.gpt.d_model} is not divisible by n_head {s.gpt.n_head}")
    o = s.optimizer
    if not isinstance(o, SGDConfig | AdamWConfig):
        raise SpecError(f"spec: optimizer: expected SGD or AdamW settings, got {type(o).__name__}")
    _float("optimizer.lr", o.lr, 0.0, 1e6, lo_open=True)
    _float("optimizer.weight_decay", o.weight_decay, 0.0, 1e6)
    if isinstance(o, SGDConfig):
        _float("optimizer.momentum", o.momentum, 0.0, 1.0, hi_open=True)
    else:
        _float("optimizer.beta1", o.beta1, 0.0, 1.0, hi_open=True)
        _float("optimizer.beta2", o.beta2, 0.0, 1.0, hi_open=True)
        _float("optimizer.eps", o.eps, 0.0, 1.0, lo_open=True)


@dataclass
class Job:
    """A spec made concrete: dataset, graph and initial state."""

    spec: TrainSpec
    dataset: Dataset
    graph: Graph
    initial_state: list[np.ndarray]
    torch: Any = None  # vtrain.frontend.job.TorchJob for a FILE.py:FACTORY model


def load_dataset(spec: TrainSpec) -> Dataset:
    if spec.model == "mlp":
        return digits_dataset()
    if spec.text_path:
        return load_text_file(spec.text_path, spec.gpt.context)
    return text_dataset(synthetic_corpus(spec.corpus_chars, seed=spec.seed), spec.gpt.context)


def check_batch_fits(spec: TrainSpec, n_samples: int) -> None:
    """DatasetError when a new job's batch is larger than its dataset. Each step draws its ``batch_size`` rows
    from the samples with replacement (docs/protocol.md), so such a batch repeats samples at every step: almost
    always a mistaken ``--batch-size`` or a truncated data file. Checked where a run or a job is made (``vtrain
    train`` of a new run, ``client create-job``), not by replay or the agents, so a job made before stays valid."""
    if spec.batch_size > n_samples:
        raise DatasetError(f"batch size {spec.batch_size} is larger than the dataset's {n_samples} samples: each "
                           f"step draws its {spec.batch_size} rows from the {n_samples} samples with replacement, "
                           f"so every batch would repeat samples; use --batch-size {n_samples} or less, or more data")


def build_job(spec: TrainSpec) -> Job:
    """Dataset, step graph and initial state for ``spec``."""
    if spec.model not in ("mlp", "gpt"):
        from vtrain.frontend.job import build_torch_job

        tj, samples, vocab = build_torch_job(spec)
        return Job(spec, Dataset(samples, vocab), tj.captured.graph, tj.captured.initial_state, tj)
    ds = load_dataset(spec)
    if spec.model == "mlp":
        pspec = mlp_params(spec.mlp)
        if ds.sample_len != spec.mlp.n_in + 1:
            raise DatasetError(f"mlp: the dataset's samples have {ds.sample_len - 1} features, the spec's "
                               f"mlp.n_in is {spec.mlp.n_in}")
    else:
        if ds.vocab is None or len(ds.vocab) > spec.gpt.vocab:
            raise DatasetError(f"gpt: vocab {spec.gpt.vocab} too small for {len(ds.vocab or [])} symbols")
        pspec = gpt_params(spec.gpt)
    g = GraphBuilder()
    params = [g.input(n, s) for n, s, _ in pspec]
    opt_slots = optimizer_slots(spec.optimizer, [(n, s) for n, s, _ in pspec])
    opt_state = [g.input(n, s) for n, s, _ in opt_slots]
    data = g.data((spec.batch_size, ds.sample_len))
    named = {n: t for (n, _, _), t in zip(pspec, params)}
    if spec.model == "mlp":
        loss = mlp_forward(g, spec.mlp, named, data)
    else:
        loss = gpt_forward(g, spec.gpt, named, data)
    grads = g.grad(loss, params)
    new_params, new_state = apply_optimizer(g, spec.optimizer, params, grads, opt_state)
    for slot, t in enumerate(new_params + new_state):
        g.output(t, slot)
    graph = g.build(loss, {i: gr.op for i, gr in enumerate(grads)})
    init = init_params(pspec, spec.seed) + [v for _, _, v in opt_slots]
    return Job(spec, ds, graph, init)
