"""A file model's initial weights are pinned where they are made (docs/frontend.md, "Initial weights").

torch's random init kernels give different bits under different vector ISAs (``normal_`` of 16 or
more elements differs between ``ATEN_CPU_CAPABILITY=default`` and AVX2/AVX-512), so a factory's
draw is not a portable initial state. ``vtrain train --out`` writes what the factory drew to
``model/initial.safetensors`` and pins it in ``spec.json``; a replay, an export of step 0 and an
agent's ``check_onchain`` in another environment load those bits. ``create-job`` refuses a file
model without a checkpoint, saying why and how to pin it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from test_replication import REPO, env_for

from protocol.cli import main
from vtrain.training.rundir import RunDir

SOURCE = '''
import numpy as np
import torch.nn.functional as F
from torch import nn


def task(hidden: int = 16):
    from vtrain.frontend import TorchTask

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    nn.init.normal_(model[0].weight, 0.0, 0.5)  # 128 values: torch's vectorised normal_ (ISA dependent)
    return TorchTask(model, F.cross_entropy, {"name": "SGD", "lr": 0.1}, [x], y)
'''
ARGS = ["--steps", "2", "--interval", "1", "--batch-size", "4"]
OTHER_ISA = {"ATEN_CPU_CAPABILITY": "default"}

needs_vector_isa = pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() == "DEFAULT",
                                      reason="this CPU's torch kernels are the default ones: no other ISA to compare")


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(r: Result) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def in_other_isa(code: str) -> dict:
    """Run ``code`` (Python printing one JSON line last) under ``ATEN_CPU_CAPABILITY=default``."""
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env_for(OTHER_ISA), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("user")
    (base / "net.py").write_text(SOURCE)
    return base


@pytest.fixture(scope="module")
def drawn_run(user: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A file-model run without --checkpoint, trained in this (default) environment."""
    out = tmp_path_factory.mktemp("runs") / "run"
    return out, ok(run("train", "--out", out, "--model", f"{user}/net.py:task", *ARGS))


def test_the_run_pins_the_weights_its_factory_drew_with_the_same_initial_root(drawn_run, user: Path) -> None:
    """spec.json pins model/initial.safetensors (what the factory drew); the initial state root is the
    one the factory's own weights give here (unchanged by the pin)."""
    from vtrain.training.loop import initial_commitment
    from vtrain.training.spec import TrainSpec, build_job

    out, summary = drawn_run
    spec = json.loads((out / "spec.json").read_text())
    raw = (out / "model" / "initial.safetensors").read_bytes()
    assert spec["checkpoint"] == "model/initial.safetensors"
    assert spec["checkpoint_sha256"] == hashlib.sha256(raw).hexdigest()
    inputs = json.loads((out / "inputs.json").read_text())
    assert inputs["initial_weights"] == "model/initial.safetensors"
    assert inputs["files"]["model/initial.safetensors"] == spec["checkpoint_sha256"]
    unpinned = TrainSpec(model=f"{user}/net.py:task", steps=2, interval=1, batch_size=4)
    assert summary["initial_state_root"] == initial_commitment(build_job(unpinned))[1].hex()
    # the same options again: the same run (complete), not "another spec"
    r = run("train", "--out", out, "--model", f"{user}/net.py:task", *ARGS)
    assert r.exit_code == 1 and "already holds a complete run" in r.output, r.output


@needs_vector_isa
def test_replay_and_export_of_step_0_under_another_isa(drawn_run, user: Path, tmp_path: Path) -> None:
    """Under ATEN_CPU_CAPABILITY=default the factory draws other weights (checked), yet the run replays
    with its step-0 checkpoint checked, and export --step 0 gives the pinned weights."""
    out, summary = drawn_run
    exp = tmp_path / "export"
    code = f"""
import json
from click.testing import CliRunner
from protocol.cli import main
from vtrain.training.loop import initial_commitment
from vtrain.training.spec import TrainSpec, build_job
drawn = initial_commitment(build_job(TrainSpec(model={f"{user}/net.py:task"!r}, steps=2, interval=1,
                                                batch_size=4)))[1].hex()
rp = CliRunner().invoke(main, ["replay", "--run", {str(out)!r}])
ex = CliRunner().invoke(main, ["export", {str(out)!r}, "--out", {str(exp)!r}, "--step", "0"])
print(json.dumps({{"drawn": drawn, "replay": [rp.exit_code, rp.output], "export": [ex.exit_code, ex.output]}}))
"""
    got = in_other_isa(code)
    assert got["drawn"] != summary["initial_state_root"], "the factory's draw should differ under another ISA"
    assert got["replay"][0] == 0, got["replay"][1]
    verdict = json.loads(got["replay"][1].strip().splitlines()[-1])
    assert verdict["matched"] == 2 and verdict["first_divergent_step"] is None
    assert got["export"][0] == 0, got["export"][1]
    from safetensors.torch import load_file

    pinned, exported = load_file(out / "model" / "initial.safetensors"), load_file(exp / "model.safetensors")
    assert sorted(pinned) == sorted(exported)
    for k in pinned:
        assert pinned[k].numpy().tobytes() == exported[k].numpy().tobytes(), k


def _unpinned_copy(out: Path, dst: Path) -> Path:
    """``out`` as a run folder from before initial weights were pinned (no checkpoint in its spec)."""
    import shutil

    shutil.copytree(out, dst)
    spec = json.loads((dst / "spec.json").read_text())
    for k in ("checkpoint", "checkpoint_sha256"):
        del spec[k]
    (dst / "spec.json").write_text(json.dumps(spec))
    inputs = json.loads((dst / "inputs.json").read_text())
    inputs["spec"] = {**inputs["spec"], "checkpoint": None}
    inputs["spec"].pop("checkpoint_sha256")
    inputs.pop("initial_weights")
    inputs["files"].pop("model/initial.safetensors")
    (dst / "inputs.json").write_text(json.dumps(inputs))
    (dst / "model" / "initial.safetensors").unlink()
    return dst


@needs_vector_isa
def test_an_unpinned_run_folder_replays_from_its_own_step_0_under_another_isa(drawn_run, tmp_path: Path) -> None:
    """A folder from before the pin (its factory's draw differs under ATEN_CPU_CAPABILITY=default) still
    replays, from its own step-0 checkpoint; its export of step 0 is refused naming the cause."""
    old = _unpinned_copy(drawn_run[0], tmp_path / "old")
    code = f"""
import json
from click.testing import CliRunner
from protocol.cli import main
rp = CliRunner().invoke(main, ["replay", "--run", {str(old)!r}])
ex = CliRunner().invoke(main, ["export", {str(old)!r}, "--out", {str(tmp_path / "exp")!r}, "--step", "0"])
print(json.dumps({{"replay": [rp.exit_code, rp.output], "export": [ex.exit_code, ex.output]}}))
"""
    got = in_other_isa(code)
    assert got["replay"][0] == 0, got["replay"][1]
    assert json.loads(got["replay"][1].strip().splitlines()[-1])["matched"] == 2
    text = " ".join(got["export"][1].split())
    assert got["export"][0] == 1 and "the initial state its factory draws here" in text, text
    assert "torch's random init kernels" in text and "model/initial.safetensors" in text, text


@needs_vector_isa
def test_check_onchain_of_the_pinned_spec_succeeds_under_another_isa(drawn_run) -> None:
    """The job's params computed here (as create-job does) are accepted by check_onchain under
    ATEN_CPU_CAPABILITY=default; the same spec without its pinned weights is refused there, the
    error naming the cause and the fix."""
    from protocol.jobs import JobContext, Terms

    out, _ = drawn_run
    params = JobContext.of(RunDir(out).read_spec()).params("0x" + "11" * 20, Terms())
    shown = [p.hex() if isinstance(p, bytes) else p for p in params]
    code = f"""
import dataclasses, json
from protocol.chain import ChainError
from protocol.jobs import JobContext
from vtrain.commit.roots import spec_hash
from vtrain.training.rundir import RunDir
shown = {json.dumps(shown)}
params = tuple(bytes.fromhex(p) if isinstance(p, str) and not p.startswith("0x") else p for p in shown)
spec = RunDir({str(out)!r}).read_spec()
JobContext.of(spec).check_onchain(params)
loose = dataclasses.replace(spec, checkpoint=None, checkpoint_sha256=None)
try:
    JobContext.of(loose).check_onchain((params[0], spec_hash(loose.commitment()), *params[2:]))
    err = None
except ChainError as e:
    err = str(e)
print(json.dumps({{"unpinned": err}}))
"""
    got = in_other_isa(code)
    err = got["unpinned"]
    assert err is not None and "different initialStateRoot" in err
    assert "torch's random init kernels" in err and "vtrain train --out RUN --spec SPEC --pin-only" in err, err


def test_create_job_refuses_a_file_model_without_a_checkpoint_and_the_advice_works(user: Path,
                                                                                   tmp_path: Path) -> None:
    """create-job with a spec whose model source is pinned but whose initial weights are not: refused
    before the chain is contacted, naming the cause and the command that pins them; that command's
    RUN/spec.json then passes the same check (and reaches the node)."""
    from vtrain.frontend.job import pin_files
    from vtrain.training.spec import TrainSpec

    spec = pin_files(TrainSpec(model=f"{user}/net.py:task", steps=2, interval=1, batch_size=4))
    spec_file = tmp_path / "job.json"
    spec_file.write_text(spec.to_json())
    chain = ["--rpc", "http://127.0.0.1:1", "--deployment", tmp_path / "none.json"]
    r = run("client", "create-job", *chain, "--spec", spec_file)
    text = " ".join(r.output.split())
    assert r.exit_code == 1 and "Traceback" not in text, text
    for w in ("has no checkpoint", "torch's random init kernels",
              f"vtrain train --out RUN --spec {spec_file} --pin-only", "RUN/model/initial.safetensors",
              "--spec RUN/spec.json", "nothing was sent"):
        assert w in text, f"{w!r} not in {text!r}"
    out = tmp_path / "RUN"
    pinned = ok(run("train", "--out", out, "--spec", spec_file, "--pin-only"))
    assert pinned["steps"] == 0 and (out / "model/initial.safetensors").exists()
    assert not (out / "roots.jsonl").exists() and (out / "checkpoints/step_000000.safetensors").exists()
    r = run("client", "create-job", *chain, "--spec", out / "spec.json")
    assert r.exit_code == 1 and "has no checkpoint" not in r.output and "none.json" in r.output, r.output
    # the pinned folder trains with --resume to what an uninterrupted run gives
    ok(run("train", "--resume", out))
    whole = tmp_path / "whole"
    ok(run("train", "--out", whole, "--spec", spec_file))
    assert (out / "roots.jsonl").read_text() == (whole / "roots.jsonl").read_text()


def test_a_spec_refused_for_data_parallel_training_leaves_nothing_pinned(user: Path, tmp_path: Path) -> None:
    """`--nproc 2` with a mode it refuses: nothing is written (before: model/ with the source and the drawn
    weights was left, and the retry was refused as a folder holding files of its own)."""
    out = tmp_path / "run"
    r = run("train", "--out", out, "--model", f"{user}/net.py:task", *ARGS, "--nproc", "2", "--mode", "fp32")
    assert r.exit_code == 1 and "expected mode 'certified'" in r.output, r.output
    assert not out.exists()
    ok(run("train", "--out", out, "--model", f"{user}/net.py:task", *ARGS, "--mode", "fp32"))
