"""Cross-environment replication of torch front-end jobs (``--model FILE.py:FACTORY``): the ResNet
on digits and HF GPT-2, SGD and AdamW. Separate ``vtrain train`` / ``vtrain replay`` processes, the
auditor's environments as in ``tests/test_replication.py``. ``certified`` must match at every step;
plain torch ``fp32`` (the user's module with torch.optim) must not. The default run is small (two
jobs, 3 steps, env C); ``-m slow`` runs both optimizers of both models under B, C and one thread.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_replication import REPLAY, TRAIN, check_replays, default_threads, parallel

RESNET = ["--model", "examples/resnet_digits.py:task", "--model-arg", "width=4"]
GPT2 = ["--model", "examples/hf_gpt2.py:small", "--model-arg", "n_layer=1", "--model-arg", "n_embd=32",
        "--model-arg", "context=16", "--model-arg", "vocab_size=512"]
MODELS = {"resnet": RESNET, "gpt2": GPT2}
BATCH = {"resnet": 8, "gpt2": 2}


def _opt_args(model: str, optimizer: str) -> list[str]:
    return ["--model-arg", f"optimizer={json.dumps('SGD' if optimizer == 'sgd' else 'AdamW')}"]


def _train(root: Path, configs: list[tuple[str, str, str]], steps: int) -> dict:
    runs = {c: root / "-".join(c) for c in configs}
    jobs = []
    for c in configs:
        model, opt, mode = c
        args = ["--out", str(runs[c]), *MODELS[model], *_opt_args(model, opt), "--mode", mode,
                "--steps", str(steps), "--batch-size", str(BATCH[model])]
        jobs.append((TRAIN, args, {}))
    for c, p in zip(configs, parallel(jobs), strict=True):
        assert p.rc == 0, f"train {c} failed (rc {p.rc}): {p.stderr[-3000:]}"
    return runs


FAST = [("resnet", "sgd", "certified"), ("resnet", "sgd", "fp32"), ("gpt2", "adamw", "certified"),
        ("gpt2", "adamw", "fp32")]


FAST_STEPS = 2


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory) -> dict:
    return _train(tmp_path_factory.mktemp("frontend-replication"), FAST, FAST_STEPS)


@pytest.mark.timeout(1800)
def test_torch_models_certified_replicates_fp32_diverges(fast_runs) -> None:
    failures = check_replays(fast_runs, ["C"], FAST_STEPS)
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_torch_models_full_matrix(tmp_path: Path) -> None:
    configs = [(m, o, mode) for m in MODELS for o in ("sgd", "adamw") for mode in ("certified", "fp32")]
    envs = ["B", "C", "same"] + (["threads1"] if default_threads() > 1 else [])
    runs = _train(tmp_path, configs, 8)
    failures = check_replays(runs, envs, 8)
    assert not failures, "\n".join(failures)


def test_replay_of_a_torch_job_names_a_missing_model_file(fast_runs, tmp_path: Path) -> None:
    """The run folder pins a copy of the model file; a replay without it says so (no traceback), and
    a spec.json pointed at another model file is refused as a changed spec."""
    run = tmp_path / "run"
    shutil.copytree(fast_runs[("resnet", "sgd", "certified")], run)
    spec = json.loads((run / "spec.json").read_text())
    assert spec["model"] == "model/resnet_digits.py:task" and len(spec["model_sha256"]) == 64
    edited = tmp_path / "edited"
    shutil.copytree(run, edited)
    (run / "model" / "resnet_digits.py").unlink()
    spec["model"] = "examples/missing_model.py:task"
    (edited / "spec.json").write_text(json.dumps(spec))
    q, e = parallel([(REPLAY, ["--run", str(run)], {}), (REPLAY, ["--run", str(edited)], {})])
    assert q.rc == 4 and "model source" in q.stderr and "missing" in q.stderr, q.stderr[-2000:]
    assert e.rc != 0 and "changed since training" in e.stderr and "model" in e.stderr, e.stderr[-2000:]
    assert "Traceback" not in q.stderr + e.stderr
