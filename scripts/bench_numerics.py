#!/usr/bin/env python
"""Controlled numerics, measured: step time, rounding-log size and cross-environment replication.

    .venv/bin/python scripts/bench_numerics.py                 # defaults: a few minutes on 2 cores
    .venv/bin/python scripts/bench_numerics.py --long          # + replication over 1000 steps
    .venv/bin/python scripts/bench_numerics.py --profile       # + where a certified step spends time
    .venv/bin/python scripts/bench_numerics.py --skip-timing --skip-replication --divergence-plot div.png
    .venv/bin/python scripts/bench_numerics.py --gpt2-117m --skip-timing --skip-replication
                                                   # GPT-2 117M shapes: manual, slow (minutes/step on 2 cores)
    .venv/bin/python scripts/bench_numerics.py --device cuda   # (a) on a GPU (scripts/gpu_check.sh)

Everything is measured in this one run and printed as markdown tables:

(a) step time of each mode against plain torch FP32 (``fp32`` = ``vtrain.torch_ref``), for a
    small GPT and the MLP, and of the certified replay, plain and as the auditor runs it; only the
    step itself is timed (``time.perf_counter`` around the
    executor's ``run``), after ``--warmup`` untimed steps; the median over ``--steps`` is reported.
(b) rounding-log bytes per step and the fraction of rounded values that got an entry, certified
    (sparse) vs paper (dense ternary), on the same trajectory: both modes output ``RN32(v)``, so
    their states are identical step by step (checked and reported).
(d) ``--gpt2-117m``: the built-in GPT at GPT-2 small shapes (12 layers, d 768, 12 heads, vocab
    50,257, context 256): certified step time, commit time, log bytes and peak RSS per step, fp32
    step time, and a replay in a second CPU environment (``ATEN_CPU_CAPABILITY=default``), each
    phase a separate process (RSS from ``wait4``).
(c) replication verdicts: ``vtrain train`` in this environment, ``vtrain replay`` in emulated
    other hardware (``/work/shared/notes/nondeterminism.md``), each a separate process, for every
    mode; matched steps and the first divergent step.
(d) with ``--divergence-plot PNG``: the number of weights that differ from the trainer's at each
    step when plain FP32 and certified runs are replayed under each environment, drawn as a PNG.

Log sizes compare certified (as vtrain stores it) against the seed paper's log as the paper's code
stores it: raw trits of every hooked value, 1.6 bits each (``vtrain.numerics.paper``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import vtrain.graph.executor as vexec  # noqa: E402
from vtrain.graph.executor import state_tensors  # noqa: E402
from vtrain.models.nn import GPTConfig, MLPConfig  # noqa: E402
from vtrain.models.optim import AdamWConfig, SGDConfig  # noqa: E402
from vtrain.numerics.logfile import encode_step_log, encode_step_log_v1  # noqa: E402
from vtrain.numerics.rounding import Mode  # noqa: E402
from vtrain.torch_ref import executor_for  # noqa: E402
from vtrain.training.loop import batch_for, component_roots  # noqa: E402
from vtrain.training.spec import Job, TrainSpec, build_job  # noqa: E402

MODES = ["fp32", "round-nolog", "certified", "paper"]

ENVS: dict[str, tuple[dict[str, str], str]] = {
    "B": ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "OMP_NUM_THREADS": "1"}, "AVX2 kernels, MKL CNR COMPATIBLE, oneDNN AVX2, 1 thread"),
    "C": ({"ATEN_CPU_CAPABILITY": "default"}, "ATen without vector kernels"),
    "threads1": ({"OMP_NUM_THREADS": "1"}, "1 thread instead of the default"),
    "same": ({}, "the trainer's own environment (control)"),
}
_KERNEL_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def table(head: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}"


# --- specs -----------------------------------------------------------------------------------------
def gpt_spec(a: argparse.Namespace, steps: int = 8, mode: str = "certified") -> TrainSpec:
    return TrainSpec(model="gpt", optimizer=AdamWConfig() if a.optimizer == "adamw" else SGDConfig(),
                     batch_size=a.batch, steps=steps, mode=mode,
                     gpt=GPTConfig(n_layer=a.layers, d_model=a.width, n_head=a.heads,
                                   context=a.context))


def mlp_spec(a: argparse.Namespace) -> TrainSpec:
    hidden = tuple(int(h) for h in a.mlp_hidden.split(",") if h)
    return TrainSpec(model="mlp", optimizer=SGDConfig(), batch_size=a.batch, mlp=MLPConfig(hidden=hidden))


def describe(spec: TrainSpec, job: Job) -> str:
    n_params = sum(int(torch.tensor(s.shape).prod()) for s in job.graph.slots)
    if spec.model == "gpt":
        g = spec.gpt
        what = (f"GPT {g.n_layer} layers, d_model {g.d_model}, {g.n_head} heads, context {g.context}, "
                f"vocab {g.vocab}")
    else:
        what = f"MLP 64-{'-'.join(map(str, spec.mlp.hidden))}-10 (digits)"
    return (f"{what}, batch {spec.batch_size}, {spec.optimizer.name}; {n_params:,} state values, "
            f"{job.graph.n_ops} ops per step")


# --- (a) + (b): step time and log size, in process ------------------------------------------------
def measure_modes(job: Job, modes: list[str], warmup: int, steps: int, device: str = "cpu") -> dict[str, dict]:
    """Run ``warmup + steps`` steps in each mode from the initial state; time only ``ex.run``
    (which returns the state on the CPU, so a GPU step is complete when it returns). Each mode's steps
    run back to back, as a trainer runs them; the certified steps' replays (plain, and the auditor's
    checked one) run after them, in a loop of their own, from the states and logs the steps left."""
    out: dict[str, dict] = {}
    for mode in modes:
        ex = executor_for(job, mode, device)
        state = state_tensors(job.initial_state)
        times, cpu, log_bytes, raw_bytes, roots = [], [], [], [], []
        replays = []  # (step, state before, data, log, roots after) of the timed certified steps
        values = logged = explicit = 0
        for s in range(1, warmup + steps + 1):
            data = batch_for(job, s)
            c0, t0 = time.process_time(), time.perf_counter()
            res = ex.run(state, data, step=s)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            before, state = state, res.state
            roots.append(component_roots(state))
            if s <= warmup:
                continue
            if mode == "certified":
                replays.append((s, before, data, res.log, roots[-1]))
            times.append(dt)
            cpu.append(dc)
            values += res.stats.values
            logged += res.stats.logged
            explicit += res.stats.explicit
            if mode in ("certified", "paper"):
                blob = encode_step_log(res.log, s, job.graph)
                log_bytes.append(len(blob))
                raw_bytes.append(len(encode_step_log_v1(res.log, s, job.graph)))  # the old on-disk format
        out[mode] = {"times": times, "median_s": statistics.median(times), "cpu": cpu,
                     "cpu_median_s": statistics.median(cpu), "values": values,
                     "logged": logged, "explicit": explicit, "log_bytes": log_bytes,
                     "raw_bytes": raw_bytes, "roots": roots}
        if replays:
            out.update(measure_replays(job, ex, replays))
    return out


def measure_replays(job: Job, ex: Any, replays: list[tuple]) -> dict[str, dict]:
    """The certified steps' replays, each from the state and log its step left, in their own loop: the
    plain replay, then the auditor's checked one (every applied entry verified against RN32(e))."""
    resolver = auditor_resolver(job)
    rtimes, rcpu, rsame = [], [], True
    atimes, acpu, asame = [], [], True
    for s, before, data, log_in, want in replays:
        c1, t1 = time.process_time(), time.perf_counter()
        rep = ex.run(before, data, log_in=log_in, step=s)
        rtimes.append(time.perf_counter() - t1)
        rcpu.append(time.process_time() - c1)
        rsame = rsame and component_roots(rep.state) == want
        c2, t2 = time.process_time(), time.perf_counter()
        aud = ex.run(before, data, log_in=log_in, step=s, check=True, resolver_factory=resolver)
        atimes.append(time.perf_counter() - t2)
        acpu.append(time.process_time() - c2)
        asame = asame and component_roots(aud.state) == want
    return {
        "certified replay" + ("" if rsame else " (DIVERGED)"): {
            "times": rtimes, "median_s": statistics.median(rtimes), "cpu": rcpu,
            "cpu_median_s": statistics.median(rcpu)},
        "auditor replay (checked, exact)" + ("" if asame else " (DIVERGED)"): {
            "times": atimes, "median_s": statistics.median(atimes), "cpu": acpu,
            "cpu_median_s": statistics.median(acpu)},
    }


def auditor_resolver(job: Job):
    """The auditor's resolver factory (``protocol.auditor.exact_resolver``) for ``job``'s graph."""
    from types import SimpleNamespace

    from protocol.auditor import exact_resolver
    from vtrain.commit.trace import GraphCommitment

    return exact_resolver(SimpleNamespace(graph=GraphCommitment.of(job.graph)))  # type: ignore[arg-type]


def ratio(x: float, base: float | None) -> str:
    if not base:
        return "-"
    q = x / base
    return f"{q:.1f}x" if q < 10 else f"{q:.0f}x"


def timing_rows(res: dict[str, dict]) -> list[list[Any]]:
    base = res.get("fp32", {}).get("median_s")
    cbase = res.get("fp32", {}).get("cpu_median_s")
    rows = []
    for mode, r in res.items():
        spread = f"{fmt_ms(min(r['times']))}-{fmt_ms(max(r['times']))}"
        rows.append([mode, fmt_ms(r["median_s"]), spread, ratio(r["median_s"], base),
                     fmt_ms(r["cpu_median_s"]), ratio(r["cpu_median_s"], cbase)])
    return rows


TIMING_HEAD = ["mode", "wall ms / step (median)", "wall min-max", "wall vs fp32", "CPU ms / step",
               "CPU vs fp32"]


def log_rows(res: dict[str, dict], graph: Any = None) -> tuple[list[list[Any]], str]:
    """Log size per step: certified as vtrain stores it (sparse, format v2) against the seed paper's log
    as the paper stores it (``vtrain export-paper-log``: raw trits, 1.6 bits per hooked value,
    whatever its threshold; ``vtrain.numerics.paper``). Needs ``graph`` for the paper's hooked ops."""
    from vtrain.numerics.paper import hooked_ops, paper_log_bytes

    rows = []
    hooked = sum(graph.ops[o].numel for o in hooked_ops(graph)) if graph is not None else 0
    paper_raw = paper_log_bytes(graph) if graph is not None else 0
    for mode in ("certified", "paper"):
        if mode not in res:
            continue
        r = res[mode]
        n = len(r["log_bytes"])
        if mode == "certified":
            frac = r["logged"] / r["values"] if r["values"] else 0.0
            rows.append([mode, f"{statistics.mean(r['log_bytes']):,.1f} (format v2)",
                         f"{statistics.mean(r['raw_bytes']):,.0f}",
                         f"{r['values'] // n:,} rounded", f"{r['logged'] / n:,.0f} entries (sparse)", f"{frac:.4%}",
                         f"{r['explicit'] / n:,.1f}"])
        else:
            frac = r["logged"] / (hooked * n) if hooked else 0.0
            rows.append(["paper (its code; as it stores it)", f"{paper_raw:,} (raw, 1.6 bits/value)",
                         f"{paper_raw:,}", f"{hooked:,} hooked", f"{r['logged'] / n:,.0f} trits != 1 (dense: every "
                         f"hooked value)", f"{frac:.1%}", "-"])
    note = ""
    if "certified" in res and "paper" in res and paper_raw:
        c = statistics.mean(res["certified"]["log_bytes"])
        same = res["certified"]["roots"] == res["paper"]["roots"]
        nolog = res.get("round-nolog", {}).get("roots")
        same_nolog = ""
        if nolog is not None:
            same_nolog = f"; round-nolog {'identical' if nolog == res['certified']['roots'] else 'DIFFERENT'}"
        c1 = statistics.mean(res["certified"]["raw_bytes"])
        note = (f"paper (raw, as its code stores it) / certified (stored): **{paper_raw / c:.1f}x** (target >= 10x; "
                f"{paper_raw / c1:.1f}x in log format v1). "
                f"The paper logs forward outputs and activation gradients only (not weight gradients or the "
                f"optimizer): {hooked:,} of {res['certified']['values'] // len(res['certified']['log_bytes']):,} "
                f"rounded values per step. Trajectories: certified and paper states "
                f"{'identical' if same else 'DIFFERENT'} at every step{same_nolog}.")
    return rows, note


# --- profiling: where a certified step spends its time --------------------------------------------
_WRAPPED = ("_compute_fp64", "round_output", "round_paper", "apply_log", "_move", "bound_is_tight",
            "canonical")


def profile_by_op_kind(job: Job, mode: str, steps: int) -> tuple[str, str]:
    """Per (function, op kind) wall time over ``steps`` steps (wrapping executor helpers), and cProfile."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    originals = {n: getattr(vexec, n) for n in _WRAPPED}
    kind_of: list[str] = ["?"]

    def wrap(name, fn):
        def inner(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                e = acc[(name, kind_of[0])]
                e[0] += time.perf_counter() - t0
                e[1] += 1
        return inner

    orig_run_op = vexec.StepExecutor._run_op
    orig_rounded_sum = vexec.StepExecutor._rounded_sum  # (the trainer's MATMUL/SUM/MEAN go there directly)

    def per_op(orig):
        def run_op(self, op, *a, **k):
            kind_of[0] = op.kind.name
            t0 = time.perf_counter()
            try:
                return orig(self, op, *a, **k)
            finally:
                e = acc[("(op total)", op.kind.name)]
                e[0] += time.perf_counter() - t0
                e[1] += 1
        return run_op

    ex = executor_for(job, mode)
    state = state_tensors(job.initial_state)
    ex.run(state, batch_for(job, 1), step=1)  # warm-up
    try:
        for n, f in originals.items():
            setattr(vexec, n, wrap(n, f))
        vexec.StepExecutor._run_op = per_op(orig_run_op)  # type: ignore[method-assign]
        vexec.StepExecutor._rounded_sum = per_op(orig_rounded_sum)  # type: ignore[method-assign]
        t0 = time.perf_counter()
        for s in range(2, steps + 2):
            state = ex.run(state, batch_for(job, s), step=s).state
        total = time.perf_counter() - t0
    finally:
        for n, f in originals.items():
            setattr(vexec, n, f)
        vexec.StepExecutor._run_op = orig_run_op  # type: ignore[method-assign]
        vexec.StepExecutor._rounded_sum = orig_rounded_sum  # type: ignore[method-assign]
    kinds = defaultdict(float)
    for (fn, kind), (t, _) in acc.items():
        if fn == "(op total)":
            kinds[kind] += t
    rows = []
    for (fn, kind), (t, calls) in sorted(acc.items(), key=lambda kv: -kv[1][0]):
        if t / total < 0.01:
            continue
        rows.append([fn, kind, f"{t / steps * 1e3:.1f}", f"{t / total:.1%}", calls // steps])
    by_kind = table(["function", "op kind", "ms / step", "share of step", "calls / step"], rows)
    prof = cProfile.Profile()
    prof.enable()
    for s in range(steps + 2, 2 * steps + 2):
        state = ex.run(state, batch_for(job, s), step=s).state
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    return by_kind, "\n".join(lines[-22:])


# --- (c): replication across processes ------------------------------------------------------------
def env_for(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _KERNEL_VARS}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # numerically neutral; see tests/test_replication.py
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def cli(cmd: str, args: list[str], extra: dict[str, str]) -> tuple[int, str, str, float]:
    code = f"from vtrain.cli import {cmd}_cmd; {cmd}_cmd()"
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env_for(extra),
                       capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def last_json(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def replication(a: argparse.Namespace, modes: list[str], envs: list[str], steps: int,
                workdir: Path) -> tuple[dict, dict]:
    spec = gpt_spec(a)
    common = ["--model", "gpt", "--optimizer", a.optimizer, "--layers", str(a.layers), "--width",
              str(a.width), "--heads", str(a.heads), "--context", str(spec.gpt.context),
              "--batch-size", str(a.batch), "--steps", str(steps), "--interval", str(steps)]
    workers = max(1, min(a.jobs, len(modes) * max(1, len(envs))))
    runs = {m: workdir / m for m in modes}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        trained = dict(zip(modes, pool.map(
            lambda m: cli("train", ["--out", str(runs[m]), "--mode", m, *common], {}), modes), strict=True))
        info: dict[str, dict] = {}
        for m, (rc, out, err, dt) in trained.items():
            if rc != 0:
                raise SystemExit(f"train {m} failed (rc {rc}):\n{err[-3000:]}")
            info[m] = {**(last_json(out) or {}), "wall_s": dt}
        pairs = [(m, e) for m in modes for e in envs]
        done = pool.map(lambda p: cli("replay", ["--run", str(runs[p[0]])], ENVS[p[1]][0]), pairs)
        verdicts = {}
        for (m, e), (rc, out, err, dt) in zip(pairs, done, strict=True):
            v = last_json(out)
            verdicts[(m, e)] = {"rc": rc, "verdict": v, "wall_s": dt,
                                "error": None if v else err.strip().splitlines()[-1:]}
    return info, verdicts


def verdict_cell(r: dict, steps: int) -> str:
    v = r["verdict"]
    if v is None:
        return f"error: {r['error']}"
    if v["first_divergent_step"] is None and v["matched"] == steps:
        return f"{steps}/{steps} bit-exact"
    return f"{v['matched']}/{steps}, diverges at step {v['first_divergent_step']}"


# --- (e): divergence plot: differing weights per step, plain FP32 vs certified ----------------------
def dump_replay(run_dir: Path, out: Path) -> None:
    """Child process (``--dump-replay``): replay ``run_dir`` in this process's environment (with the
    trainer's logs for certified; fp32 simply trains again) and save each step's parameters."""
    import numpy as np

    from vtrain.outputs.export import n_params
    from vtrain.training.loop import replay_steps
    from vtrain.training.rundir import RunDir

    run = RunDir(run_dir)
    job = build_job(run.read_spec())
    k = n_params(job.spec, job.graph)
    last = max(run.read_roots())
    state = run.read_checkpoint(0, job.graph)
    got = {}
    for o in replay_steps(job, state, 1, last, lambda s: run.read_log(s, job.graph)):
        got[f"s{o.step}"] = np.concatenate([t.numpy().reshape(-1) for t in o.state[:k]]).view(np.uint32)
    np.savez(out, **got)


def divergence(a: argparse.Namespace, envs: list[str], steps: int, png: Path) -> dict[str, list[int]]:
    """Train fp32 and certified here (a checkpoint every step), replay each under every env in its
    own process, and count per step the parameters whose bits differ from the trainer's; draw it."""
    import numpy as np

    from vtrain.outputs.export import n_params
    from vtrain.training.rundir import RunDir

    spec = gpt_spec(a)
    common = ["--model", "gpt", "--optimizer", a.optimizer, "--layers", str(a.layers), "--width",
              str(a.width), "--heads", str(a.heads), "--context", str(spec.gpt.context),
              "--batch-size", str(a.batch), "--steps", str(steps), "--interval", "1"]
    series: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_divergence_") as tmp:
        work = Path(tmp)
        for m in ("fp32", "certified"):
            rc, _, err, _ = cli("train", ["--out", str(work / m), "--mode", m, *common], {})
            if rc != 0:
                raise SystemExit(f"train {m} failed (rc {rc}):\n{err[-3000:]}")
        pairs = [(m, e) for m in ("fp32", "certified") for e in envs]

        def child(p: tuple[str, str]) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dump-replay",
                                   str(work / p[0]), str(work / f"{p[0]}-{p[1]}.npz")],
                                  cwd=ROOT, env=env_for(ENVS[p[1]][0]), capture_output=True, text=True)

        with ThreadPoolExecutor(max_workers=max(1, min(a.jobs, len(pairs)))) as pool:
            for (m, e), p in zip(pairs, pool.map(child, pairs), strict=True):
                if p.returncode != 0:
                    raise SystemExit(f"replay {m} under {e} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        for m in ("fp32", "certified"):
            run = RunDir(work / m)
            job = build_job(run.read_spec())
            k = n_params(job.spec, job.graph)
            ref = {s: np.concatenate([t.numpy().reshape(-1) for t in run.read_checkpoint(s, job.graph)[:k]])
                   .view(np.uint32) for s in range(1, steps + 1)}
            for e in envs:
                d = np.load(work / f"{m}-{e}.npz")
                series[f"{m} / {e}"] = [int((d[f"s{s}"] != ref[s]).sum()) for s in range(1, steps + 1)]
        n_weights = int(ref[1].size)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    xs = list(range(1, steps + 1))
    for name, ys in series.items():
        ax.plot(xs, ys, label=name, linestyle="-" if name.startswith("fp32") else "--",
                marker="o" if name.startswith("certified") else None, markersize=3)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_xlabel("step")
    ax.set_ylabel(f"weights differing from the trainer (of {n_weights:,})")
    ax.set_title(f"replay under other environments: plain FP32 vs certified\n{describe(spec, build_job(spec))}",
                 fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return series


# --- (d): GPT-2 117M shapes, one process per phase ------------------------------------------------
def gpt2_spec(a: argparse.Namespace, mode: str = "certified") -> TrainSpec:
    return TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=a.gpt2_batch, steps=a.gpt2_steps,
                     interval=a.gpt2_steps, mode=mode,
                     gpt=GPTConfig(vocab=a.gpt2_vocab, n_layer=a.gpt2_layers, d_model=a.gpt2_width, n_head=12,
                                   context=a.gpt2_context))


def gpt2_phase(a: argparse.Namespace) -> int:
    """One phase of (d) in its own process: ``train`` (certified, writes a run folder) or ``fp32``.
    Prints one JSON line of figures."""
    from vtrain.numerics.logfile import encode_step_log as encode
    from vtrain.training.loop import _outcome
    from vtrain.training.rundir import RunDir, reset_roots

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    spec = gpt2_spec(a, "certified" if a.gpt2_phase == "train" else "fp32")
    job = build_job(spec)
    out: dict[str, Any] = {"build_s": time.perf_counter() - t0, "ops": job.graph.n_ops,
                           "state_values": sum(int(torch.tensor(s.shape).prod()) for s in job.graph.slots)}
    state = state_tensors(job.initial_state)
    ex = executor_for(job, "certified" if a.gpt2_phase == "train" else "fp32", a.device)
    steps = a.gpt2_steps if a.gpt2_phase == "train" else a.gpt2_fp32_steps
    run = None
    if a.gpt2_phase == "train":
        run = RunDir(a.gpt2_dir)
        run.write_spec(spec)
        reset_roots(run)
        run.write_checkpoint(0, job.graph, state)
    step_s, commit_s, log_bytes, entries = [], [], [], []
    for s in range(1, steps + 1):
        t1 = time.perf_counter()
        res = ex.run(state, batch_for(job, s), step=s)
        step_s.append(time.perf_counter() - t1)
        if run is not None:
            t2 = time.perf_counter()
            o = _outcome(s, res, job.graph)  # component roots, state root, log root
            commit_s.append(time.perf_counter() - t2)
            log_bytes.append(len(encode(res.log, s, job.graph)))
            entries.append(res.log.n_entries)
            run.write_log(s, res.log, job.graph)
            run.append_roots(s, o.loss, o.state_root, o.log_root)
        state = res.state
        print(f"  [{a.gpt2_phase}] step {s}: {step_s[-1]:.1f} s", file=sys.stderr, flush=True)
    if run is not None:
        run.write_checkpoint(steps, job.graph, state)
    out.update(step_s=step_s, commit_s=commit_s, log_bytes=log_bytes, entries=entries, loss=res.loss)
    print(json.dumps(out))
    return 0


def _child(args: list[str], extra: dict[str, str], timeout: float) -> tuple[int, str, str, float, float]:
    """Run a child process; (rc, stdout, stderr, wall s, peak RSS GiB of that child from wait4)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        p = subprocess.Popen(args, cwd=ROOT, env=env_for(extra), stdout=fo, stderr=fe)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.2)
        p.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return (p.returncode, fo.read().decode(), fe.read().decode(), time.perf_counter() - t0,
                ru.ru_maxrss / 2**20)


def gpt2_section(a: argparse.Namespace) -> dict:
    """(d): certified train (this env), fp32 steps, replay under ATEN_CPU_CAPABILITY=default."""
    spec = gpt2_spec(a)
    me = [sys.executable, str(Path(__file__).resolve()), "--threads", str(a.threads), "--device", a.device,
          "--gpt2-steps", str(a.gpt2_steps), "--gpt2-batch", str(a.gpt2_batch), "--gpt2-context",
          str(a.gpt2_context), "--gpt2-layers", str(a.gpt2_layers), "--gpt2-fp32-steps", str(a.gpt2_fp32_steps),
          "--gpt2-width", str(a.gpt2_width), "--gpt2-vocab", str(a.gpt2_vocab)]
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_gpt2_") as tmp:
        run = Path(tmp) / "run"
        for phase in ("train", "fp32"):
            rc, out, err, wall, rss = _child([*me, "--gpt2-phase", phase, "--gpt2-dir", str(run)], {}, 6 * 3600)
            if rc != 0:
                raise SystemExit(f"gpt2 {phase} failed (rc {rc}):\n{err[-3000:]}")
            res[phase] = {**(last_json(out) or {}), "wall_s": wall, "rss_gib": rss}
        code = "from vtrain.cli import replay_cmd; replay_cmd()"
        rc, out, err, wall, rss = _child([sys.executable, "-c", code, "--run", str(run), "--threads",
                                          str(max(a.threads, 1)), "--device", "cpu"],
                                         {"ATEN_CPU_CAPABILITY": "default"}, 6 * 3600)
        res["replay"] = {"rc": rc, "verdict": last_json(out), "wall_s": wall, "rss_gib": rss,
                         "error": None if last_json(out) else err.strip().splitlines()[-1:]}
    tr, fp, rp = res["train"], res["fp32"], res["replay"]
    n = len(tr["step_s"])
    med = statistics.median
    v = rp["verdict"] or {}
    verdict = (f"{v.get('matched')}/{v.get('steps')} bit-exact" if v and v.get("first_divergent_step") is None
               else f"{v or rp['error']}")
    print(f"## (d) GPT-2 117M shapes on {a.device}: {spec.gpt.n_layer} layers, d {spec.gpt.d_model}, 12 heads, "
          f"vocab {spec.gpt.vocab:,}, "
          f"context {spec.gpt.context}, batch {spec.batch_size}, adamw; {tr['state_values']:,} state values, "
          f"{tr['ops']} ops per step; {a.threads} thread(s)\n")
    print(table(["figure", "value"], [
        [f"certified step (median of {n})", f"{med(tr['step_s']):.1f} s"],
        [f"fp32 torch step (median of {len(fp['step_s'])})", f"{med(fp['step_s']):.2f} s"],
        ["certified / fp32", ratio(med(tr["step_s"]), med(fp["step_s"]))],
        ["commit per step (component roots, state root, log root)", f"{med(tr['commit_s']):.2f} s"],
        ["log bytes per step (stored, format v2)", f"{statistics.mean(tr['log_bytes']):,.0f}"],
        ["log entries per step", f"{statistics.mean(tr['entries']):,.0f}"],
        ["peak RSS: certified trainer / fp32 / auditor", f"{tr['rss_gib']:.1f} / {fp['rss_gib']:.1f} / "
                                                          f"{rp['rss_gib']:.1f} GiB"],
        ["graph build", f"{tr['build_s']:.1f} s"],
        ["replay, ATEN_CPU_CAPABILITY=default (separate process)", verdict],
        ["replay wall (all steps, incl. build)", f"{rp['wall_s']:.0f} s"],
    ]))
    print()
    return res


# --- main ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2, help="small GPT: layers")
    ap.add_argument("--width", type=int, default=64, help="small GPT: d_model")
    ap.add_argument("--heads", type=int, default=4, help="small GPT: heads")
    ap.add_argument("--context", type=int, default=32, help="small GPT: context")
    ap.add_argument("--batch", type=int, default=8, help="batch size (GPT and MLP)")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw", help="GPT optimizer")
    ap.add_argument("--mlp-hidden", default="32", help="MLP hidden sizes (timing rows)")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per mode")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for the in-process timing (0: torch's default); one thread "
                         "keeps small-op timings stable on a shared machine")
    ap.add_argument("--repl-steps", type=int, default=50, help="steps of the replication runs (c)")
    ap.add_argument("--sweep", default="",
                    help="extra (a) rows, fp32 vs certified only: WIDTHxCONTEXTxBATCH,... (e.g. "
                         "128x64x16,256x128x16; layers/heads as set)")
    ap.add_argument("--long", action="store_true", help="replication over >= 1000 steps")
    ap.add_argument("--repl-modes", default=",".join(MODES), help="modes for (c), comma-separated")
    ap.add_argument("--envs", default="B,C,threads1", help=f"auditor envs for (c): {', '.join(ENVS)}")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel processes for (c)")
    ap.add_argument("--workdir", type=Path, default=None, help="run folders for (c) (default: a temp dir)")
    ap.add_argument("--profile", action="store_true", help="profile certified steps of the small GPT")
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-replication", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    ap.add_argument("--divergence-plot", type=Path, default=None, metavar="PNG",
                    help="(d) draw differing weights per step, fp32 vs certified, replayed under --envs")
    ap.add_argument("--plot-steps", type=int, default=30, help="steps of the divergence plot (d)")
    ap.add_argument("--dump-replay", nargs=2, type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help="device of the (a) timings and (d): cpu or cuda[:N]")
    ap.add_argument("--modes", default=",".join(MODES), help="modes of the (a) timings, comma-separated")
    ap.add_argument("--no-mlp", action="store_true", help="(a): the small GPT only")
    ap.add_argument("--gpt2-117m", action="store_true", help="(d): GPT-2 117M shapes (manual, slow)")
    ap.add_argument("--gpt2-steps", type=int, default=3, help="(d): certified steps (and replayed steps)")
    ap.add_argument("--gpt2-batch", type=int, default=1, help="(d): batch size")
    ap.add_argument("--gpt2-context", type=int, default=256, help="(d): context (>= 256 for the target)")
    ap.add_argument("--gpt2-layers", type=int, default=12, help="(d): layers (12 = GPT-2 small)")
    ap.add_argument("--gpt2-fp32-steps", type=int, default=2, help="(d): plain torch fp32 steps")
    ap.add_argument("--gpt2-width", type=int, default=768, help="(d): d_model (768; smaller only to test)")
    ap.add_argument("--gpt2-vocab", type=int, default=50257, help="(d): vocab (50,257; smaller only to test)")
    ap.add_argument("--gpt2-phase", default=None, help=argparse.SUPPRESS)  # internal: one phase of (d)
    ap.add_argument("--gpt2-dir", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.dump_replay:  # child process of (d)
        dump_replay(*a.dump_replay)
        return 0
    if a.gpt2_phase:
        return gpt2_phase(a)
    if a.long:
        a.repl_steps = max(a.repl_steps, 1000)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    t_start = time.perf_counter()
    raw: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()}}
    print(f"# bench_numerics ({platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"load average {os.getloadavg()[0]:.1f})\n")

    if not a.skip_timing:
        modes = [m for m in a.modes.split(",") if m]
        for m in modes:
            Mode(m)
        labelled = [("small GPT", gpt_spec(a))] + ([] if a.no_mlp else [("MLP", mlp_spec(a))])
        for label, spec in labelled:
            job = build_job(spec)
            res = measure_modes(job, modes, a.warmup, a.steps, a.device)
            raw[label] = {m: {k: v for k, v in r.items() if k != "roots"} for m, r in res.items()}
            print(f"## (a) step time, {label} on {a.device}: {describe(spec, job)}\n")
            print(f"Median of {a.steps} steps after {a.warmup} warm-up step(s); fp32 = plain torch "
                  f"(vtrain.torch_ref); certified replay = the auditor's step with the trainer's log; "
                  f"auditor replay = the same with the checks and exact resolver of protocol.auditor "
                  f"(every applied entry verified against RN32(e)). "
                  f"Targets: certified <= 3x fp32, replay <= 1.1x certified.\n")
            print(table(TIMING_HEAD, timing_rows(res)))
            rows, note = log_rows(res, job.graph)
            print(f"\n## (b) rounding log, {label} (same steps)\n")
            print(table(["mode", "stored bytes / step", "format v1 bytes / step", "values / step",
                         "logged / step", "fraction logged", "explicit / step"], rows))
            print(f"\n{note}\n")
            sys.stdout.flush()

    if a.sweep and not a.skip_timing:
        rows = []
        for item in a.sweep.split(","):
            w, c, b = (int(x) for x in item.lower().split("x"))
            sa = argparse.Namespace(**{**vars(a), "width": w, "context": c, "batch": b})
            job = build_job(gpt_spec(sa))
            res = measure_modes(job, ["fp32", "certified"], a.warmup, a.steps, a.device)
            f, cf = res["fp32"], res["certified"]
            rows.append([f"{a.layers}L d{w} T{c} B{b}", job.graph.n_ops, fmt_ms(f["median_s"]),
                         fmt_ms(cf["median_s"]), ratio(cf["median_s"], f["median_s"]),
                         ratio(cf["cpu_median_s"], f["cpu_median_s"])])
            raw.setdefault("sweep", {})[item] = {m: {k: v for k, v in r.items() if k != "roots"}
                                                 for m, r in res.items()}
        print("## (a') certified vs fp32 by GPT size\n")
        print(table(["GPT", "ops", "fp32 ms", "certified ms", "wall ratio", "CPU ratio"], rows))
        print()
        sys.stdout.flush()

    if a.profile:
        job = build_job(gpt_spec(a))
        by_kind, prof = profile_by_op_kind(job, "certified", a.profile_steps)
        print(f"## Profile: certified step of the small GPT ({a.profile_steps} steps)\n")
        print("Time inside the executor's helpers, by op kind ('(op total)' = the whole op):\n")
        print(by_kind)
        print("\ncProfile, top functions by own time:\n\n```\n" + prof + "\n```\n")
        sys.stdout.flush()

    if a.gpt2_117m:
        raw["gpt2_117m"] = gpt2_section(a)
        sys.stdout.flush()

    if not a.skip_replication:
        modes = [m for m in a.repl_modes.split(",") if m]
        envs = [e for e in a.envs.split(",") if e]
        for m in modes:
            Mode(m)
        for e in envs:
            if e not in ENVS:
                raise SystemExit(f"--envs: unknown env {e!r}; expected one of {', '.join(ENVS)}")
        spec = gpt_spec(a)
        with tempfile.TemporaryDirectory(prefix="bench_numerics_") as tmp:
            workdir = a.workdir or Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            info, verdicts = replication(a, modes, envs, a.repl_steps, workdir)
        print(f"## (c) replication, {a.repl_steps} steps: {describe(spec, build_job(spec))}\n")
        print("Trainer: this environment (`vtrain train`); auditor: `vtrain replay` in another process "
              "under each environment. Cell: steps whose state root matched.\n")
        print(table(["mode", *[f"{e}" for e in envs]],
                    [[m, *[verdict_cell(verdicts[(m, e)], a.repl_steps) for e in envs]] for m in modes]))
        print("\nEnvironments: " + "; ".join(
            f"**{e}** = `{' '.join(f'{k}={v}' for k, v in ENVS[e][0].items()) or '(no change)'}` "
            f"({ENVS[e][1]})" for e in envs) + ".\n")
        print(table(["mode", "train wall s", "log bytes (all steps)", "final loss"],
                    [[m, f"{info[m]['wall_s']:.0f}", f"{info[m].get('log_bytes', 0):,}",
                      f"{info[m].get('final_loss', float('nan')):.4f}"] for m in modes]))
        raw["replication"] = {"info": info, "verdicts": {f"{m}/{e}": v for (m, e), v in verdicts.items()}}
    if a.divergence_plot:
        envs = [e for e in a.envs.split(",") if e]
        series = divergence(a, envs, a.plot_steps, a.divergence_plot)
        print(f"## (d) divergence, {a.plot_steps} steps: weights differing from the trainer's, replayed under "
              f"each environment (plot: {a.divergence_plot})\n")
        print(table(["mode / env", "first step with a difference", "at the last step"],
                    [[k, next((i + 1 for i, v in enumerate(ys) if v), "none"), f"{ys[-1]:,}"]
                     for k, ys in series.items()]))
        raw["divergence"] = series
    print(f"\nTotal wall time {time.perf_counter() - t_start:.0f} s; load average at the end "
          f"{os.getloadavg()[0]:.1f}.")
    if a.json:
        a.json.write_text(json.dumps(raw, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
