"""The `vtrain` train/replay/sample/export/inspect commands as a user meets them: self-contained
run folders (replay from anywhere, changed data named), resume after an interrupt, exit codes,
refused conflicts, progress when stderr is not a terminal, a quick `--help`, and using what was
trained (sampling, state_dict-named weights, log inspection and plots)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from protocol.cli import main

ROOT = Path(__file__).resolve().parent.parent
MLP = ["--steps", "6", "--interval", "2", "--batch-size", "4", "--hidden", "8"]
GPT = ["--model", "gpt", "--steps", "3", "--interval", "1", "--batch-size", "2", "--width", "8",
       "--heads", "2", "--context", "8"]
TEXT = "the trainer posts a root. the auditor replays every step! " * 4


def run(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(r: Result) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def err(r: Result, code: int, *words: str) -> str:
    assert isinstance(r.exception, SystemExit), f"uncaught {r.exception!r}\n{r.output}"
    assert r.exit_code == code, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    text = " ".join(r.output.split())
    for w in words:
        assert w in text, f"{w!r} not in {r.output!r}"
    return text


def roots(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "roots.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mlp") / "run"
    ok(run("train", "--out", out, *MLP))
    return out


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT trained on a user's text file given by a path relative to the working directory."""
    base = tmp_path_factory.mktemp("gpt")
    (base / "english.txt").write_text(TEXT, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        ok(run("train", "--out", "run", "--text", "english.txt", *GPT))
    return base / "run"


# -- self-contained run folders ----------------------------------------------------------------------


def test_the_run_folder_pins_data_vocab_and_relative_paths(gpt_run: Path) -> None:
    spec = json.loads((gpt_run / "spec.json").read_text())
    assert spec["text_path"] == "data/english.txt"  # no absolute path, no path outside the folder
    assert (gpt_run / "data" / "english.txt").read_text(encoding="utf-8") == TEXT
    vocab = json.loads((gpt_run / "vocab.json").read_text(encoding="utf-8"))
    assert vocab["symbols"] == sorted(set(TEXT))
    inputs = json.loads((gpt_run / "inputs.json").read_text())
    import hashlib

    assert inputs["files"] == {"data/english.txt": hashlib.sha256(TEXT.encode()).hexdigest()}


def test_replay_works_from_another_directory(gpt_run: Path, tmp_path: Path, monkeypatch) -> None:
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(gpt_run, moved)  # neither the original text file nor the old cwd is reachable
    monkeypatch.chdir(tmp_path)
    v = ok(run("replay", "--run", moved))
    assert v["matched"] == 3 and v["first_divergent_step"] is None


def test_changed_data_is_named_before_any_step_runs(gpt_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(gpt_run, copy)
    data = copy / "data" / "english.txt"
    data.write_text(TEXT.replace("trainer", "trainee", 1), encoding="utf-8")
    r = run("replay", "--run", copy)
    text = err(r, 1, "english.txt", "changed since training", "sha256", "recorded")
    assert "replay: step" not in text  # refused before the first step
    data.unlink()
    err(run("replay", "--run", copy), 4, "english.txt", "missing")


def test_a_dataset_that_differs_from_the_trained_one_is_refused(mlp_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(mlp_run, copy)
    inputs = json.loads((copy / "inputs.json").read_text())
    inputs["dataset_sha256"] = "0" * 64  # as if sklearn shipped other digits
    (copy / "inputs.json").write_text(json.dumps(inputs))
    err(run("replay", "--run", copy), 1, "dataset", "differs from the one trained on")


# -- resume ------------------------------------------------------------------------------------------


def _interrupt_after(monkeypatch, n: int) -> None:
    import vtrain.training.loop as loop

    real = loop.train_steps

    def cut(*a, **k):
        for i, o in enumerate(real(*a, **k)):
            if i == n:
                raise KeyboardInterrupt
            yield o

    monkeypatch.setattr(loop, "train_steps", cut)


@pytest.mark.parametrize("how", ["--resume", "same --out", "damaged checkpoint", "no roots file"])
def test_resume_after_an_interrupt_gives_the_roots_of_an_uninterrupted_run(
        mlp_run: Path, tmp_path: Path, monkeypatch, how: str) -> None:
    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        _interrupt_after(mp, 3)
        err(run("train", "--out", out, *MLP), 130, "interrupted after step 3", "--resume")
    assert [r["step"] for r in roots(out)] == [1, 2, 3]
    # what a hard crash could also leave: a torn roots line and a temp file of a write cut short
    with open(out / "roots.jsonl", "ab") as f:
        f.write(b'{"step": 4, "loss": 0.1, "sta')
    (out / "logs" / ".step_000004.vtlog.tmp123").write_bytes(b"half")
    if how == "damaged checkpoint":  # the last checkpoint no longer matches its recorded root
        ck = out / "checkpoints" / "step_000002.safetensors"
        b = bytearray(ck.read_bytes())
        b[-3] ^= 0x40
        ck.write_bytes(bytes(b))
    if how == "no roots file":  # a crash before the first record reached the disk
        (out / "roots.jsonl").unlink()
    r = run("train", "--resume", out) if how != "same --out" else run("train", "--out", out, *MLP)
    summary = ok(r)
    assert summary["resumed_after"] == (0 if how in ("damaged checkpoint", "no roots file") else 2)
    assert roots(out) == roots(mlp_run)
    for s in range(1, 7):
        name = f"step_{s:06d}.vtlog"
        assert (out / "logs" / name).read_bytes() == (mlp_run / "logs" / name).read_bytes()
    assert not list(out.rglob(".step_*"))
    assert ok(run("replay", "--run", out))["matched"] == 6


def test_a_complete_or_different_run_is_not_overwritten(mlp_run: Path) -> None:
    before = (mlp_run / "roots.jsonl").read_bytes()
    err(run("train", "--out", mlp_run, *MLP), 1, "already holds a complete run")
    err(run("train", "--out", mlp_run, *MLP[:-1], "16"), 1, "another spec", "mlp.hidden")
    err(run("train", "--resume", mlp_run), 1, "already holds a complete run", "nothing to resume")
    assert (mlp_run / "roots.jsonl").read_bytes() == before


# -- exit codes and conflicts --------------------------------------------------------------------------


def test_exit_codes_tell_diverged_bad_input_and_unavailable_apart(mlp_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(mlp_run, copy)
    lines = (copy / "roots.jsonl").read_text().splitlines()
    rec = json.loads(lines[3])
    rec["state_root"] = "ab" * 32
    lines[3] = json.dumps(rec)
    (copy / "roots.jsonl").write_text("\n".join(lines) + "\n")
    r = run("replay", "--run", copy)
    assert r.exit_code == 3, r.output  # diverged
    assert json.loads(r.stdout.splitlines()[-1])["first_divergent_step"] == 4
    (copy / "logs" / "step_000005.vtlog").unlink()
    err(run("replay", "--run", copy), 4, "step 5 missing")  # unavailable
    (copy / "spec.json").write_text("{")
    err(run("replay", "--run", copy), 1, "spec.json")  # bad input
    err(run("replay", "--run", copy, "--bogus"), 2, "--bogus")  # usage
    err(run("train", "--resume", tmp_path / "nothing-here"), 4, "no such run folder")


@pytest.mark.parametrize("args, words", [
    (["--text", "{text}"], ["--text", "not an option of --model mlp"]),
    (["--model", "gpt", "--hidden", "8"], ["--hidden", "not an option of --model gpt"]),
    (["--spec", "{spec}", "--steps", "3", "--seed", "1"], ["--steps, --seed", "conflicts with --spec"]),
    (["--resume", "{run}", "--model", "gpt"], ["--model", "conflicts with --resume"]),
    (["--resume", "{run}", "--out", "{run}"], ["--resume", "--out", "not both"]),
    ([], ["expected --out RUN", "--resume RUN"]),
])
def test_options_that_would_be_ignored_are_refused(mlp_run: Path, tmp_path: Path, args: list[str],
                                                  words: list[str]) -> None:
    (tmp_path / "t.txt").write_text(TEXT)
    subst = {"{text}": str(tmp_path / "t.txt"), "{spec}": str(mlp_run / "spec.json"), "{run}": str(mlp_run)}
    args = [subst.get(a, a) for a in args]
    out = [] if "--resume" in args or not args else ["--out", str(tmp_path / "new")]
    err(run("train", *out, *args), 2, *words)
    assert not (tmp_path / "new").exists()


def test_help_and_version_are_quick_and_documented() -> None:
    """`vtrain --help` must not import torch (that alone takes most of a second)."""
    code = "import sys; import protocol.cli; print(sorted(m for m in ('torch', 'numpy', 'web3') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stdout
    r = run("--version")
    assert r.exit_code == 0 and "vtrain, version" in r.output
    for cmd in ("train", "replay", "sample", "export", "inspect", "export-paper-log"):
        h = run(cmd, "--help")
        assert h.exit_code == 0 and "3 replay diverged" in " ".join(h.output.split()), h.output


def test_mode_names_in_the_cli_are_the_numerics_modes() -> None:
    from vtrain.cli import MODE_NAMES
    from vtrain.numerics.rounding import Mode

    assert list(MODE_NAMES) == [m.value for m in Mode]


# -- progress ------------------------------------------------------------------------------------------


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    from vtrain.progress import StepProgress

    buf = io.StringIO()
    with StepProgress("train", 25, every=10, seconds=1e9, stream=buf, terminal=False) as p:
        for s in range(1, 26):
            p.update(s, loss=1.0 / s)
    lines = buf.getvalue().splitlines()
    assert [ln.split()[2] for ln in lines] == ["10/25", "20/25", "25/25"], lines
    assert "loss 0.0400" in lines[-1] and "s/step" in lines[0] and "left" in lines[0]
    r = run("train", "--out", tmp_path / "r", *MLP)  # CliRunner's stderr is not a terminal
    assert "train mlp (certified): step 6/6 loss" in r.stderr


def test_a_warning_is_one_plain_line_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    """Before: rich wrapped it at 80 columns under a timestamp (8 lines for the missing native library)."""
    env = {**os.environ, "VTRAIN_NATIVE_NUMERICS_LIB": str(tmp_path / "absent.so")}
    env.pop("VTRAIN_NATIVE_NUMERICS", None)
    r = subprocess.run([sys.executable, "-m", "protocol.cli", "train", "--out", str(tmp_path / "r"), *MLP],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "native" in ln or "numpy" in ln]
    assert len(lines) == 1 and lines[0].startswith("WARNING vtrain.numerics.native: native numerics kernels "
                                                   "unavailable (") and "using numpy" in lines[0], r.stderr


# -- using what was trained ----------------------------------------------------------------------------


def test_sample_greedy_and_seeded(gpt_run: Path) -> None:
    a = run("sample", gpt_run, "--prompt", "the ", "--tokens", "30")
    assert a.exit_code == 0, a.output
    assert a.stdout.startswith("the ") and len(a.stdout.rstrip("\n")) == 34
    assert set(a.stdout.rstrip("\n")) <= set(TEXT)
    assert run("sample", gpt_run, "--prompt", "the ", "--tokens", "30").stdout == a.stdout
    t1 = run("sample", gpt_run, "--tokens", "40", "--temperature", "1.5", "--seed", "7").stdout
    assert t1 == run("sample", gpt_run, "--tokens", "40", "--temperature", "1.5", "--seed", "7").stdout
    err(run("sample", gpt_run, "--prompt", "xyzQ"), 1, "not in the run's vocabulary", "Q")


def test_sample_needs_a_language_model(mlp_run: Path) -> None:
    err(run("sample", mlp_run), 1, "needs a language model", "mlp run")


def test_export_writes_weights_named_like_a_state_dict(gpt_run: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from vtrain.outputs.torch_models import GPT
    from vtrain.torch_ref import TorchReference
    from vtrain.training.loop import batch_for
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import build_job

    info = ok(run("export", gpt_run, "--out", tmp_path / "x", "--step", "2"))
    sd = load_file(str(tmp_path / "x" / "model.safetensors"))
    assert "transformer.wte.weight" in sd and "lm_head.weight" in sd and "transformer.h.0.attn.c_attn.weight" in sd
    assert not any(":" in k or k.endswith(("_t", ".m", ".v")) for k in sd)  # no slot numbers, no optimizer state
    job = build_job(RunDir(gpt_run).read_spec())
    model = GPT(job.spec.gpt)
    model.load_state_dict(sd, strict=True)  # every weight, nothing else
    assert info["tensors"] == len(model.state_dict())
    # the exported model computes the run's next loss (plain FP32 vs controlled numerics)
    batch = batch_for(job, 3).to(torch.int64)
    T = job.spec.gpt.context
    with torch.no_grad():
        logits = model(batch[:, :T])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    assert float(loss) == pytest.approx(roots(gpt_run)[2]["loss"], rel=1e-5)
    ref = TorchReference(job)  # vtrain's own plain-torch model on the same checkpoint
    ref._load(RunDir(gpt_run).read_checkpoint(2, job.graph))
    assert float(ref.loss(batch_for(job, 3)).detach()) == pytest.approx(float(loss), rel=1e-6)
    cfg = json.loads((tmp_path / "x" / "config.json").read_text())
    assert cfg["model"] == "gpt" and cfg["step"] == 2 and cfg["config"]["vocab"] == job.spec.gpt.vocab
    assert json.loads((tmp_path / "x" / "vocab.json").read_text(encoding="utf-8"))["symbols"] == sorted(set(TEXT))


def test_export_of_the_mlp_and_a_tampered_checkpoint(mlp_run: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from vtrain.models.nn import MLPConfig
    from vtrain.outputs.torch_models import MLP as TorchMLP

    ok(run("export", mlp_run, "--out", tmp_path / "x"))
    sd = load_file(str(tmp_path / "x" / "model.safetensors"))
    assert sorted(sd) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]
    TorchMLP(MLPConfig(hidden=(8,))).load_state_dict(sd, strict=True)
    copy = tmp_path / "run"
    shutil.copytree(mlp_run, copy)
    from safetensors.numpy import load, save

    ck = copy / "checkpoints" / "step_000006.safetensors"
    d = load(ck.read_bytes())
    k = sorted(d)[0]
    d[k] = d[k] + np.float32(1e-3)
    ck.write_bytes(save(d))
    err(run("export", copy, "--out", tmp_path / "y"), 1, "step_000006", "state root")
    assert not (tmp_path / "y").exists()


def test_export_never_writes_over_a_models_own_files(mlp_run: Path, tmp_path: Path) -> None:
    """A folder with a model.safetensors / config.json no export wrote (a HF model folder) is refused and kept
    (before: both were overwritten); an earlier export in the folder is replaced."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"their weights")
    (hf / "config.json").write_text('{"architectures": ["GPT2LMHeadModel"]}')
    err(run("export", mlp_run, "--out", hf), 1, "model.safetensors and config.json", "no vtrain export wrote")
    assert (hf / "model.safetensors").read_bytes() == b"their weights"
    assert (hf / "config.json").read_text() == '{"architectures": ["GPT2LMHeadModel"]}'
    ok(run("export", mlp_run, "--out", tmp_path / "x"))
    ok(run("export", mlp_run, "--out", tmp_path / "x", "--step", "2"))
    assert json.loads((tmp_path / "x" / "config.json").read_text())["step"] == 2


def test_inspect_counts_entries_and_draws_the_plots(mlp_run: Path, tmp_path: Path) -> None:
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import build_job

    r = run("inspect", mlp_run, "--plots", tmp_path / "plots", "--json")
    s = ok(r)
    assert [x["loss"] for x in s["steps"]] == [x["loss"] for x in roots(mlp_run)]
    rd = RunDir(mlp_run)
    job = build_job(rd.read_spec())
    entries = sum(rd.read_log(st, job.graph).n_entries for st in range(1, 7))
    assert sum(s["entries_per_code"].values()) == entries == sum(o["entries"] for o in s["entries_per_op"])
    assert sum(x["logged"] for x in s["steps"]) == entries
    for name in ("loss.png", "logged_fraction.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = run("inspect", mlp_run, "--plots", tmp_path / "plots").stdout
    # the MLP's logs are usually empty (its sums are exact-grid, docs/numerics.md): then no table
    assert ("log entries per code" in text) == (entries > 0)
    kinds = {o["kind"] for o in s["entries_per_op"]}
    assert all(k in text for k in kinds)


def test_a_batch_larger_than_the_dataset_is_refused_naming_both_numbers(tmp_path: Path) -> None:
    """Each step samples its batch with replacement: a batch larger than the dataset would repeat samples at
    every step (a mistaken --batch-size), so a new run is refused before anything is written."""
    out = tmp_path / "run"
    text = err(run("train", "--out", out, "--steps", "1", "--batch-size", "1800", "--hidden", "8"), 1,
               "batch size 1800 is larger than the dataset's 1797 samples", "--batch-size 1797 or less")
    assert "with replacement" in text
    assert not out.exists()
