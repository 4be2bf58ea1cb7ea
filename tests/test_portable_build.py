"""A file model's step graph is the same on every vector ISA (docs/frontend.md, "Initial weights").

The graph root commits to every op and every CONST the build makes: values folded at build time by
running the user's torch ops (a rotary table's ``cos``/``sin``), interpolation weights, gather tables.
torch's CPU kernels are compiled once per vector ISA and give other bits for some ops (FMA
contraction, vectorised transcendental functions), so a constant taken from them could make a trainer
on AVX-512 and an auditor on another CPU build two graphs, and the job would be refused. These tests
build the same models here and under ``ATEN_CPU_CAPABILITY=default`` and compare the graph root and
the bytes of every CONST, both from the initial weights pinned where the factory ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from test_replication import REPO, env_for

PROBE = '''
import hashlib, json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from pathlib import Path
from vtrain.commit.trace import GraphCommitment
from vtrain.frontend.job import initial_weights_bytes, make_task
from vtrain.training.spec import TrainSpec, build_job

pins, refs = Path(sys.argv[1]), sys.argv[2:]
out = {}
for i, ref in enumerate(refs):
    pin = pins / f"{i}.safetensors"
    if not pin.exists():  # the first build pins what its factory drew, as `vtrain train` does
        pin.write_bytes(initial_weights_bytes(make_task(ref, {}, TrainSpec(model=ref).seed, None).module))
    job = build_job(TrainSpec(model=ref, batch_size=2, steps=2, interval=1, checkpoint=str(pin)))
    h = hashlib.sha256()
    for k in sorted(job.graph.consts):
        h.update(k.to_bytes(8, "little") + job.graph.consts[k].tobytes())
    out[ref] = [GraphCommitment.of(job.graph).root.hex(), h.hexdigest(), job.graph.n_ops]
print(json.dumps(out))
'''

needs_vector_isa = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() == "DEFAULT",
                                      reason="this CPU's torch kernels are the default ones: no other ISA to compare")


def _graphs(pins: Path, models: list[str], extra: dict[str, str] | None) -> dict[str, list]:
    """PROBE's output for ``models``: in this process (``extra`` None) or in a fresh one with ``extra`` set."""
    if extra is None:
        argv = sys.argv
        out = io.StringIO()
        try:
            sys.argv = ["probe", str(pins), *models]
            with contextlib.redirect_stdout(out), warnings.catch_warnings():
                exec(compile(PROBE, "probe", "exec"), {"__name__": "probe"})
        finally:
            sys.argv = argv
            logging.disable(logging.NOTSET)  # PROBE silences logging for its own process
        return json.loads(out.getvalue().strip().splitlines()[-1])
    p = subprocess.run([sys.executable, "-c", PROBE, str(pins), *models], cwd=REPO, env=env_for(extra),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _same_graphs_on_both_isas(pins: Path, models: list[str]) -> None:
    """Built here (pinning the initial weights its factory draws: a frozen parameter is a CONST) and under
    the default ISA from those pins."""
    here = _graphs(pins, models, None)
    other = _graphs(pins, models, {"ATEN_CPU_CAPABILITY": "default"})
    assert other == here, {m: (here[m], other[m]) for m in models if here[m] != other[m]}


@needs_vector_isa
def test_a_unet_and_a_rotary_transformer_build_the_same_graph_on_another_isa(tmp_path: Path) -> None:
    """Bilinear and nearest upsampling, uneven adaptive pooling, convolutions, argmax (the U-Net) and a
    rotary table folded at build time, RMSNorm, SwiGLU (the Llama-style model)."""
    _same_graphs_on_both_isas(tmp_path, ["examples/zoo.py:unet_decoder", "examples/zoo.py:llama_style"])


@pytest.mark.slow
@needs_vector_isa
def test_every_example_model_builds_the_same_graph_on_another_isa(tmp_path: Path) -> None:
    """Every trained zoo model, the ResNet, HF GPT-2 and HF BERT examples (``pytest
    tests/test_portable_build.py -m slow``)."""
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import zoo
    finally:
        sys.path.pop(0)
    models = [f"examples/zoo.py:{name}" for name in zoo.TRAINED]
    models += ["examples/resnet_digits.py:task", "examples/hf_gpt2.py:small", "examples/hf_bert.py:tiny"]
    _same_graphs_on_both_isas(tmp_path, models)


RESIZE_PROBE = '''
import json, sys
import numpy as np, torch
from vtrain.frontend.lowering import _interpolation_matrix
aten = torch.ops.aten
OPS = {"linear": aten.upsample_linear1d.default, "cubic": aten.upsample_bicubic2d.default,
       "linear_aa": aten._upsample_bilinear2d_aa.default, "cubic_aa": aten._upsample_bicubic2d_aa.default}
out = {"ours": [], "torch": []}
for kind, n_in, n_out, ac, scale in json.loads(sys.argv[1]):
    out["ours"].append(_interpolation_matrix(kind, n_in, n_out, ac, scale).tobytes().hex())
    nsp = 1 if kind == "linear" else 2
    other = 3 if kind.endswith("aa") else 1  # antialiasing resizes a size-1 axis differently: keep the other's
    basis = torch.eye(n_in, dtype=torch.float64).reshape(n_in, 1, *([1] * (nsp - 1)), n_in)
    basis = basis.expand(n_in, 1, *([other] * (nsp - 1)), n_in).contiguous()
    res = OPS[kind](basis, [other] * (nsp - 1) + [n_out], ac, *([None] * (nsp - 1)), scale)
    out["torch"].append(res.reshape(n_in, -1, n_out)[:, 0, :].T.contiguous().numpy().tobytes().hex())
print(json.dumps(out))
'''

RESIZE_CASES = [  # (kind, n_in, n_out, align_corners, scale): FMA in torch's AVX2 / AVX-512 kernels moves these
    ("linear", 2, 10, False, None), ("linear", 3, 33, False, None), ("linear", 4, 100, False, None),
    ("cubic", 27, 68, False, 2.5384634236287646), ("cubic", 29, 87, True, 3.0), ("cubic_aa", 5, 3, False, None),
    ("linear", 7, 7, False, 1.1), ("linear", 5, 1, True, None), ("cubic", 6, 6, False, None),
    ("linear_aa", 9, 4, False, None), ("linear_aa", 4, 9, True, 2.3), ("cubic_aa", 11, 3, True, None),
    ("cubic", 3, 8, True, None), ("linear", 6, 13, False, 2.2),
]


def _same_resize_weights_on_the_default_isa(cases: list) -> None:
    p = subprocess.run([sys.executable, "-c", RESIZE_PROBE, json.dumps(cases)], cwd=REPO,
                       env=env_for({"ATEN_CPU_CAPABILITY": "default"}), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    there = json.loads(p.stdout.strip().splitlines()[-1])
    from vtrain.frontend.lowering import _interpolation_matrix

    here = [_interpolation_matrix(*case).tobytes().hex() for case in cases]
    assert here == there["ours"]
    assert here == there["torch"], [c for c, a, b in zip(cases, here, there["torch"]) if a != b][:20]


def test_resize_weights_are_the_same_bits_on_the_default_isa() -> None:
    """Resize weights (``F.interpolate``: linear, bicubic, antialiased) are computed in Python floats, one
    rounding per operation: the same FP64 bytes here and under ``ATEN_CPU_CAPABILITY=default``, and equal to
    torch's default-ISA kernel on basis vectors (its AVX2 / AVX-512 kernels contract multiply-adds: the
    near-zero weights of these cases differ there, even after rounding to FP32)."""
    _same_resize_weights_on_the_default_isa(RESIZE_CASES)


@pytest.mark.slow
def test_resize_weights_match_the_default_isa_kernel_on_a_sweep() -> None:
    """Every kind, both ``align_corners``, sizes 1..12 to 1..12 and 200 random sizes and scale factors."""
    rng = random.Random(0)
    sizes = [(i, o, None) for i in range(1, 13) for o in range(1, 13)]
    for _ in range(200):
        n, f = rng.randint(1, 40), rng.choice([1.5, 2.0, 0.5, 1 / 3, 2.5, 0.7, 1.1, 3.0, rng.uniform(0.2, 4.0)])
        if int(n * f) >= 1:
            sizes.append((n, int(n * f), f))
    kinds = ("linear", "cubic", "linear_aa", "cubic_aa")
    _same_resize_weights_on_the_default_isa([(k, n, o, ac, f) for k in kinds for n, o, f in sizes
                                             for ac in (False, True)])
