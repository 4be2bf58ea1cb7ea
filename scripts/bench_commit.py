#!/usr/bin/env python
"""Commitment throughput: tensor, state and trace roots vs raw hashlib.sha256 over the same bytes.

    .venv/bin/python scripts/bench_commit.py [--mb 64] [--state-gb 1.49] [--repeat 3] [--threads N]
                                             [--clock wall|cpu]

Everything is measured in the same run (best of ``--repeat``) and reported as a ratio to one
single-threaded ``hashlib.sha256`` pass over the same bytes ("vs raw"). Rows:

- ``reference``: the pure-Python builder (one ``hashlib`` call per leaf and node, as before the
  C builder); its per-call overhead bounds it (the "per-call floor" row);
- ``C, 1 thread`` / ``C, N threads``: the C builder (vtrain/commit/native.py, ``make native``)
  on the best SHA-256 this CPU has; the AVX2 and portable rows force the others (CPUs without
  SHA-NI) and compare them with the same raw pass (OpenSSL, which uses SHA-NI when present).
  The format costs 7 SHA-256 blocks per 256-byte leaf (5 for ``0x00 || 256 bytes``, ~2 for its
  share of the nodes) where a raw pass costs 4: at the raw pass's speed per block one thread
  would top out at 4/7 = 0.57x (two messages interleaved per core get a little past that);
- state root: a GPT-2 117M AdamW-sized state (params, exp_avg, exp_avg_sq in GPT-2's shapes,
  ``--state-gb`` of float32; 0 skips), every component root and the state tree;
- trace root: every op output of one certified step of a small GPT plus the trace tree, and the
  regeneration of that trace (one replayed step) relative to the step itself.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vtrain.commit import native  # noqa: E402
from vtrain.commit.merkle import reference_chunked_root  # noqa: E402
from vtrain.commit.roots import (  # noqa: E402
    reference_tensor_root,
    state_root,
    tensor_root,
    tensor_roots,
    tensor_tree,
    trace_root,
)

#: ``--clock cpu`` times by the process's CPU time (all threads): steadier single-thread ratios on
#: a machine shared with other jobs, but it cannot show a speed-up from threads.
CLOCK: Callable[[], float] = time.perf_counter


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        best = min(best, CLOCK() - t0)
    return best


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def section(self, title: str) -> None:
        self.rows.append((title, "", "", ""))

    def row(self, name: str, seconds: float, nbytes: int, raw_seconds: float, note: str = "") -> None:
        self.rows.append(
            (
                f"  {name}",
                f"{nbytes / 1e6 / seconds:9.1f}",
                f"{raw_seconds / seconds:6.3f}x",
                note or f"{seconds:.3f} s",
            )
        )

    def print(self) -> None:
        w = max(len(r[0]) for r in self.rows)
        print(f"{'what':<{w}}  {'MB/s':>9}  {'vs raw':>7}  time")
        print(f"{'-' * w}  {'-' * 9}  {'-' * 7}  {'-' * 8}")
        for name, rate, ratio, note in self.rows:
            print(f"{name:<{w}}  {rate:>9}  {ratio:>7}  {note}")


def raw_sha256(arrs: list[np.ndarray]) -> None:
    for a in arrs:
        hashlib.sha256(a.data).digest()


def gpt2_adamw_state(gb: float) -> list[np.ndarray]:
    """Views into one float32 buffer: GPT-2 117M's parameters (head tied to wte), exp_avg and
    exp_avg_sq, scaled to ``gb`` gigabytes (1.49 = the real size)."""
    from vtrain.models.nn import GPTConfig, gpt_params

    cfg = GPTConfig(vocab=50257, context=1024, n_layer=12, n_head=12, d_model=768)
    sizes = [int(np.prod(shape)) for name, shape, _ in gpt_params(cfg) if name != "head.w"] * 3
    scale = gb * 1e9 / (4 * sum(sizes))
    sizes = [max(1, int(s * scale)) for s in sizes]
    buf = np.random.default_rng(0).random(sum(sizes), dtype=np.float32)
    out, at = [], 0
    for s in sizes:
        out.append(buf[at : at + s])
        at += s
    return out


def bench_tensor(t: Table, mb: int, r: int, nt: int, pymerkle_mb: int) -> float:
    """Tensor-root rows; returns the reference builder's rate in bytes/s."""
    n = mb * (1 << 20) // 4
    arr = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    nb = arr.nbytes
    raw = best_of(r, lambda: raw_sha256([arr]))
    t.section(f"tensor root, {mb} MiB float32 ({-(-n // 64)} leaves)")
    t.row("hashlib.sha256, one call, 1 thread", raw, nb, raw)
    want: list[bytes] = []
    ref = best_of(r, lambda: want.append(reference_tensor_root(arr)))
    t.row("reference (pure Python, hashlib per hash)", ref, nb, raw)
    sha = hashlib.sha256
    calls = 2 * -(-n // 64) - 1
    floor = best_of(r, lambda: [sha(b"").digest() for _ in range(calls)]) + raw
    t.row(f"  per-call floor ({calls} empty hashlib calls + raw)", floor, nb, raw)
    if native.available():
        assert tensor_root(arr) == want[0], "the C builder disagrees with the reference"
        t.row("C, 1 thread", best_of(r, lambda: tensor_root(arr, threads=1)), nb, raw)
        t.row(f"C, {nt} threads", best_of(r, lambda: tensor_root(arr, threads=nt)), nb, raw)
        best = native.implementation()
        for impl, label in (("avx2", "AVX2, 8 lanes (x86 without SHA-NI)"), ("portable", "portable C")):
            if impl != best and native.select(impl) == impl:
                try:
                    t.row(f"C {label}, 1 thread", best_of(r, lambda: tensor_root(arr, threads=1)), nb, raw)
                finally:
                    native.select("best")
        t.row("C tensor_tree (all levels kept), 1 thread", best_of(r, lambda: tensor_tree(arr, threads=1)), nb, raw)
        tree_nt = best_of(r, lambda: tensor_tree(arr, threads=nt))
        t.row(f"C tensor_tree (all levels kept), {nt} threads", tree_nt, nb, raw)
    if pymerkle_mb:
        from pymerkle import InmemoryTree

        small = arr[: pymerkle_mb * (1 << 20) // 4]
        raw_small = best_of(r, lambda: raw_sha256([small]))
        raw_bytes = small.tobytes()

        def pym() -> None:
            tree = InmemoryTree()
            for i in range(0, len(raw_bytes), 256):
                tree.append_entry(raw_bytes[i : i + 256])
            tree.get_root()

        t.row(f"pymerkle InmemoryTree ({pymerkle_mb} MiB)", best_of(1, pym), small.nbytes, raw_small)
    return nb / ref


def bench_state(t: Table, gb: float, r: int, nt: int, ref_rate: float) -> None:
    """State-root rows over a GPT-2 117M AdamW-sized state."""
    state = gpt2_adamw_state(gb)
    sb = sum(a.nbytes for a in state)
    raw_s = best_of(r, lambda: raw_sha256(state))
    t.section(f"state root, GPT-2 117M AdamW state: {len(state)} tensors, {sb / 1e9:.2f} GB")
    t.row("hashlib.sha256 over every tensor, 1 thread", raw_s, sb, raw_s)
    est = sb / ref_rate
    t.row("reference (estimated from its tensor-root rate)", est, sb, raw_s, f"{est:.1f} s (est.)")
    if native.available():
        t.row("C, 1 thread", best_of(r, lambda: state_root(tensor_roots(state, threads=1))), sb, raw_s)
        t.row(f"C, {nt} threads", best_of(r, lambda: state_root(tensor_roots(state, threads=nt))), sb, raw_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="tensor size in MiB (float32)")
    ap.add_argument("--state-gb", type=float, default=1.49, help="GPT-2 117M AdamW state size (0: skip)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the best is reported")
    ap.add_argument("--threads", type=int, default=None, help="threads of the C rows (default: all CPUs)")
    ap.add_argument("--pymerkle-mb", type=int, default=4, help="size for the pymerkle row (0: skip)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="wall time, or process CPU time")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.perf_counter if args.clock == "wall" else time.process_time
    nt = args.threads or native.default_threads()
    r = args.repeat
    t = Table()

    ref_rate = bench_tensor(t, args.mb, r, nt, args.pymerkle_mb)
    if args.state_gb > 0:
        bench_state(t, args.state_gb, r, nt, ref_rate)
    outs, step_s, regen_s = gpt_trace()
    tb = sum(a.nbytes for a in outs)
    raw_t = best_of(r, lambda: raw_sha256(outs))
    t.section(f"trace root, one step of a small GPT: {len(outs)} op outputs, {tb / 1e6:.1f} MB")
    t.row("hashlib.sha256 over every op output, 1 thread", raw_t, tb, raw_t)
    want = trace_root([reference_chunked_root(a, 256) for a in outs])
    ref_t = best_of(r, lambda: trace_root([reference_tensor_root(a) for a in outs]))
    t.row("reference (pure Python)", ref_t, tb, raw_t)
    if native.available():
        assert trace_root(tensor_roots(outs)) == want, "the C builder disagrees with the reference"
        t.row("C, 1 thread", best_of(r, lambda: trace_root(tensor_roots(outs, threads=1))), tb, raw_t)
        t.row(f"C, {nt} threads", best_of(r, lambda: trace_root(tensor_roots(outs, threads=nt))), tb, raw_t)
    t.rows.append(
        ("  trace regeneration (replay + every root + tree) / step", "", f"{regen_s / step_s:6.2f}x",
         f"{regen_s * 1e3:.0f} ms vs step {step_s * 1e3:.0f} ms")
    )

    cpus = native.default_threads()
    print(f"C builder: {native.implementation()}, {nt} threads (of {cpus} CPUs); {args.clock} clock")
    t.print()
    return 0


def gpt_trace() -> tuple[list[np.ndarray], float, float]:
    """(op outputs of one certified GPT step, the step's time, one trace regeneration's time)."""
    from vtrain.commit.trace import StepTrace
    from vtrain.graph.executor import StepExecutor, state_tensors
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.training.loop import batch_for
    from vtrain.training.spec import TrainSpec, build_job

    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=8,
                              gpt=GPTConfig(vocab=32, context=32, n_layer=2, n_head=4, d_model=64)))
    ex = StepExecutor(job.graph, "certified")
    state = state_tensors(job.initial_state)
    data = batch_for(job, 1)
    ex.run(state, data)  # warm-up
    step = best_of(3, lambda: ex.run(state, data))
    trace = StepTrace.of(1, job.graph, ex.run(state, data, keep_trace=True))

    def regen() -> None:
        _ = StepTrace.of(1, job.graph, ex.run(state, data, keep_trace=True)).root

    return trace.outputs, step, best_of(3, regen)


if __name__ == "__main__":
    sys.exit(main())
