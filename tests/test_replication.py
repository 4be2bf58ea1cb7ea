"""Cross-process replication: a trainer in the default environment, auditors in others.

Every command is a separate ``vtrain train`` / ``vtrain replay`` process. The auditor's
environment emulates other hardware on this CPU (``/work/shared/notes/nondeterminism.md``):

- ``B``: ``ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2``, one thread
  (an older AVX2 machine: other softmax/SDPA kernels, other GEMM blocking);
- ``C``: ``ATEN_CPU_CAPABILITY=default`` (no vectorised kernels: layer_norm, GELU, softmax, Adam);
- ``threads1``: ``OMP_NUM_THREADS=1`` (other reduction splits).

``certified`` (and ``paper``) must replay bit for bit at every step; ``fp32`` (plain torch) must
diverge, which shows the environments really differ. The default run is small (2 configs,
6 steps, B and C); ``-m slow`` runs the full matrix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAIN = "from vtrain.cli import train_cmd; train_cmd()"
REPLAY = "from vtrain.cli import replay_cmd; replay_cmd()"

# Variables that select kernels; the trainer runs with none of them set (the default env).
_KERNEL_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

ENVS: dict[str, dict[str, str]] = {
    "B": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
          "OMP_NUM_THREADS": "1"},
    "C": {"ATEN_CPU_CAPABILITY": "default"},
    "threads1": {"OMP_NUM_THREADS": "1"},
    "same": {},  # the trainer's own environment: every mode, fp32 included, must match
}

FAST_STEPS = 6
SLOW_STEPS = 30
BATCH = 8


def env_for(extra: dict[str, str]) -> dict[str, str]:
    """The default environment (no kernel-selecting variable) plus ``extra``.

    ``OMP_WAIT_POLICY=PASSIVE`` (trainer and auditors alike) only changes how idle OpenMP threads
    wait, never how work is split: it keeps concurrent 2-thread processes on a busy 2-core
    machine from spinning against each other (a 1000x slowdown of small GEMMs otherwise).
    """
    env = {k: v for k, v in os.environ.items() if k not in _KERNEL_VARS}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


@dataclass
class Proc:
    rc: int
    stdout: str
    stderr: str

    def verdict(self) -> dict:
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith("{")]
        assert lines, f"no JSON verdict (rc {self.rc}): {self.stdout!r} {self.stderr[-2000:]!r}"
        return json.loads(lines[-1])


def run_cli(code: str, args: list[str], extra_env: dict[str, str] | None = None,
            timeout: float = 900) -> Proc:
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO,
                       env=env_for(extra_env or {}), capture_output=True, text=True,
                       timeout=timeout)
    return Proc(p.returncode, p.stdout, p.stderr)


def parallel(jobs: list) -> list[Proc]:
    """Run ``(code, args, env)`` jobs concurrently (one per core): each process starts torch."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda j: run_cli(*j), jobs))


def train_args(out: Path, model: str, optimizer: str, mode: str, steps: int) -> list[str]:
    return ["--out", str(out), "--model", model, "--optimizer", optimizer, "--mode", mode,
            "--steps", str(steps), "--batch-size", str(BATCH)]


Config = tuple[str, str, str]  # model, optimizer, mode


def train_all(root: Path, configs: list[Config], steps: int) -> dict[Config, Path]:
    """Train each (model, optimizer, mode) in the default env; returns the run folders."""
    runs = {c: root / "-".join(c) for c in configs}
    procs = parallel([(TRAIN, train_args(runs[c], *c, steps), {}) for c in configs])
    for c, p in zip(configs, procs, strict=True):
        assert p.rc == 0, f"train {c} failed (rc {p.rc}): {p.stderr[-3000:]}"
    return runs


def default_threads() -> int:
    code = "import torch; print(torch.get_num_threads())"
    return int(subprocess.run([sys.executable, "-c", code], env=env_for({}), capture_output=True,
                              text=True, check=True).stdout)


def check_replays(runs: dict, envs: list[str], steps: int) -> list[str]:
    """Replay every run in every env; returns the failures (empty when all verdicts are right)."""
    jobs, keys = [], []
    for cfg, run in runs.items():
        for e in envs:
            jobs.append((REPLAY, ["--run", str(run)], ENVS[e]))
            keys.append((cfg, e))
    failures = []
    for (cfg, e), p in zip(keys, parallel(jobs), strict=True):
        mode = cfg[2]
        v = p.verdict()
        if mode == "fp32" and e == "threads1" and cfg[0] == "mlp":
            # the MLP's GEMMs (batch 8) are too small for MKL to split across threads: one thread
            # may give the same bits (seen), or not; either verdict must be a well-formed one
            ok = p.rc in (0, 3) and v["steps"] == steps
        elif mode == "fp32" and e != "same":
            ok = p.rc == 3 and v["first_divergent_step"] is not None and v["matched"] < steps
        else:
            ok = (p.rc == 0 and v["matched"] == v["steps"] == steps
                  and v["first_divergent_step"] is None)
        if not ok:
            failures.append(f"{'/'.join(cfg)} under {e}: rc {p.rc} {v}")
    return failures


# --- default (fast) run ----------------------------------------------------------------------
FAST_CONFIGS = [(m, o, mode) for m, o in (("mlp", "sgd"), ("gpt", "adamw"))
                for mode in ("certified", "fp32")]


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory) -> dict:
    return train_all(tmp_path_factory.mktemp("replication"), FAST_CONFIGS, FAST_STEPS)


def test_certified_replicates_fp32_diverges(fast_runs) -> None:
    """certified: every step's state root matches under B and C; plain torch fp32 does not."""
    failures = check_replays(fast_runs, ["B", "C"], FAST_STEPS)
    assert not failures, "\n".join(failures)


def _damaged_copy(src: Path, dst: Path, kind: str) -> Path:
    shutil.copytree(src, dst)
    log = dst / "logs" / "step_000003.vtlog"
    data = bytearray(log.read_bytes())
    if kind == "truncated":
        log.write_bytes(bytes(data[: len(data) // 2]))
    elif kind == "flipped":
        data[-5] ^= 0x5A  # inside the compressed payload (or its checksum)
        log.write_bytes(bytes(data))
    elif kind == "other-step":
        shutil.copyfile(dst / "logs" / "step_000002.vtlog", log)
    elif kind == "missing":
        log.unlink()
    return dst


def test_truncated_log_fails_replay_naming_the_step(fast_runs, tmp_path) -> None:
    """A truncated rounding log makes a replay process exit non-zero, naming the step."""
    run = _damaged_copy(fast_runs[("mlp", "sgd", "certified")], tmp_path / "run", "truncated")
    p = run_cli(REPLAY, ["--run", str(run)], ENVS["C"])
    assert p.rc != 0, f"replay accepted a truncated log: {p.stdout}"
    assert "step 3" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not any(ln.startswith("{") for ln in p.stdout.splitlines()), "printed a verdict"


@pytest.mark.parametrize("kind", ["flipped", "other-step", "missing"])
def test_damaged_log_names_the_step(fast_runs, tmp_path, kind: str) -> None:
    """Other damage, through the same command in this process (cheaper than a subprocess each)."""
    from click.testing import CliRunner

    from vtrain.cli import replay_cmd

    run = _damaged_copy(fast_runs[("mlp", "sgd", "certified")], tmp_path / "run", kind)
    res = CliRunner().invoke(replay_cmd, ["--run", str(run)])
    out = res.output + (res.stderr or "")
    assert res.exit_code != 0, out
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "step 3" in out, out


# --- full matrix (slow) ----------------------------------------------------------------------
SLOW_CONFIGS = [(m, o, mode) for m in ("mlp", "gpt") for o in ("sgd", "adamw")
                for mode in ("certified", "paper", "fp32")]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_full_matrix(tmp_path) -> None:
    """Both models x both optimizers x {certified, paper, fp32} x envs B, C, 1 thread, 30 steps.

    Also the trainer's own environment, where fp32 must match too (the runs are deterministic, so
    its divergence elsewhere comes from the environment).
    """
    envs = ["B", "C", "same"]
    if default_threads() > 1:
        envs.append("threads1")  # with one core the default is already one thread
    runs = train_all(tmp_path, SLOW_CONFIGS, SLOW_STEPS)
    failures = check_replays(runs, envs, SLOW_STEPS)
    assert not failures, "\n".join(failures)



def test_trainers_in_different_environments_write_identical_logs(fast_runs, tmp_path) -> None:
    """The canonical log (vtrain/numerics/canonical.py): a second trainer under environment C (other
    kernels) writes the same rounding log, byte for byte, at every step, not just the same states;
    so does one under B. The log is a function of the exact values, not of this machine."""
    ref = fast_runs[("gpt", "adamw", "certified")]
    others = {e: tmp_path / e for e in ("B", "C")}
    procs = parallel([(TRAIN, train_args(run, "gpt", "adamw", "certified", FAST_STEPS), ENVS[e])
                      for e, run in others.items()])
    for p in procs:
        assert p.rc == 0, p.stderr[-3000:]
    ref_logs = sorted((ref / "logs").glob("*.vtlog"))
    assert len(ref_logs) == FAST_STEPS
    for e, run in others.items():
        for log in ref_logs:
            assert (run / "logs" / log.name).read_bytes() == log.read_bytes(), f"{log.name} differs under {e}"
