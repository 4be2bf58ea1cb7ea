"""The training spec (one JSON-able dataclass) and what follows from it: the step graph, the
initial state and the dataset. Everything a trainer and an auditor must agree on is here."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vtrain.data import Dataset, digits_dataset, load_text_file, synthetic_corpus, text_dataset
from vtrain.errors import VtrainError
from vtrain.graph import Graph, GraphBuilder
from vtrain.nn import (
    GPTConfig,
    MLPConfig,
    gpt_forward,
    gpt_params,
    init_params,
    mlp_forward,
    mlp_params,
)
from vtrain.numerics import Mode
from vtrain.optim import AdamWConfig, SGDConfig, apply_optimizer, optimizer_slots


@dataclass(frozen=True)
class TrainSpec:
    """A training job: model, optimizer, data, schedule and numerics mode."""

    model: str = "mlp"  # "mlp" (digits, MSE) or "gpt" (character-level)
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

    def __post_init__(self) -> None:
        if self.model not in ("mlp", "gpt"):
            raise VtrainError(f"model: expected 'mlp' or 'gpt', got {self.model!r}")
        Mode(self.mode)
        for name in ("batch_size", "steps", "interval"):
            if getattr(self, name) <= 0:
                raise VtrainError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.model == "gpt" and self.gpt.d_model % self.gpt.n_head:
            raise VtrainError(f"gpt: d_model {self.gpt.d_model} is not divisible by n_head {self.gpt.n_head}")

    @property
    def data_seed(self) -> bytes:
        """The 32-byte data-order seed committed on-chain."""
        return self.seed.to_bytes(32, "big")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["optimizer"]["name"] = self.optimizer.name
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TrainSpec:
        try:
            d = dict(d)
            opt = dict(d.pop("optimizer", {"name": "sgd"}))
            cls = {"sgd": SGDConfig, "adamw": AdamWConfig}[opt.get("name", "sgd")]
            mlp = d.pop("mlp", {})
            mlp = MLPConfig(**{**mlp, "hidden": tuple(mlp.get("hidden", MLPConfig().hidden))})
            return TrainSpec(mlp=mlp, gpt=GPTConfig(**d.pop("gpt", {})), optimizer=cls(**opt), **d)
        except (TypeError, KeyError) as e:
            raise VtrainError(f"invalid training spec: {e}") from None

    @staticmethod
    def from_json(text: str) -> TrainSpec:
        try:
            return TrainSpec.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise VtrainError(f"invalid training spec JSON: {e}") from None


@dataclass
class Job:
    """A spec made concrete: dataset, graph and initial state."""

    spec: TrainSpec
    dataset: Dataset
    graph: Graph
    initial_state: list[np.ndarray]


def load_dataset(spec: TrainSpec) -> Dataset:
    if spec.model == "mlp":
        return digits_dataset()
    if spec.text_path:
        return load_text_file(spec.text_path, spec.gpt.context)
    return text_dataset(synthetic_corpus(spec.corpus_chars, seed=spec.seed), spec.gpt.context)


def build_job(spec: TrainSpec) -> Job:
    """Dataset, step graph and initial state for ``spec``."""
    ds = load_dataset(spec)
    if spec.model == "mlp":
        pspec = mlp_params(spec.mlp)
        if ds.sample_len != spec.mlp.n_in + 1:
            raise VtrainError(f"mlp: expected samples of {spec.mlp.n_in + 1} values, got {ds.sample_len}")
    else:
        if ds.vocab is None or len(ds.vocab) > spec.gpt.vocab:
            raise VtrainError(f"gpt: vocab {spec.gpt.vocab} too small for {len(ds.vocab or [])} symbols")
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
