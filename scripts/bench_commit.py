#!/usr/bin/env python
"""Commitment throughput: tensor_root vs one raw hashlib.sha256 call over the same bytes.

    .venv/bin/python scripts/bench_commit.py [--mb 64] [--repeat 3]

Everything is measured in the same run (best of ``--repeat``). The tree costs one ``hashlib``
call per 256-byte leaf plus one per inner node, so on a CPU with SHA extensions (where one big
call runs at ~1.7 GB/s) the per-call overhead, not the hashing, bounds the ratio; the
"per-call floor" row shows that bound for the same number of calls on empty input.
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

from vtrain.commit.merkle import chunked_root  # noqa: E402
from vtrain.commit.roots import tensor_root, tensor_tree  # noqa: E402


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64, help="tensor size in MiB (float32)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the best is reported")
    ap.add_argument(
        "--pymerkle-mb", type=int, default=4, help="size for the pymerkle row (0: skip)"
    )
    args = ap.parse_args(argv)

    n = args.mb * (1 << 20) // 4
    arr = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    nbytes = arr.nbytes
    n_leaves = -(-n // 64)
    mb = nbytes / 1e6

    raw = best_of(args.repeat, lambda: hashlib.sha256(arr.data).digest())
    rows: list[tuple[str, str, str]] = []

    def row(name: str, seconds: float, size_mb: float = mb) -> None:
        rate = size_mb / seconds
        rows.append((name, f"{rate:9.1f}", f"{rate / (mb / raw):6.3f}x"))

    row(f"hashlib.sha256, one call ({args.mb} MiB)", raw)
    row("tensor_root (validation + blocked tree)", best_of(args.repeat, lambda: tensor_root(arr)))
    row(
        "chunked_root (tree only, no validation)",
        best_of(args.repeat, lambda: chunked_root(arr, 256)),
    )
    row("tensor_tree (all levels kept, for proofs)", best_of(args.repeat, lambda: tensor_tree(arr)))

    sha = hashlib.sha256
    calls = 2 * n_leaves - 1
    floor = best_of(args.repeat, lambda: [sha(b"").digest() for _ in range(calls)]) + raw
    row(f"per-call floor ({calls} empty sha256 calls + raw)", floor)

    if args.pymerkle_mb:
        from pymerkle import InmemoryTree

        small = arr[: args.pymerkle_mb * (1 << 20) // 4]
        raw_bytes = small.tobytes()

        def pym() -> None:
            t = InmemoryTree()
            for i in range(0, len(raw_bytes), 256):
                t.append_entry(raw_bytes[i : i + 256])
            t.get_root()

        row(f"pymerkle InmemoryTree ({args.pymerkle_mb} MiB)", best_of(1, pym), small.nbytes / 1e6)

    step_s, trace_s = trace_regeneration_times()
    rows.append((f"trace regeneration of one GPT step ({trace_s * 1e3:.0f} ms)", "", f"{trace_s / step_s:6.2f}x step"))

    print(f"commitment throughput: {args.mb} MiB float32 = {n} elements, {n_leaves} leaves")
    w = max(len(r[0]) for r in rows)
    print(f"{'what':<{w}}  {'MB/s':>9}  {'vs raw':>7}")
    print(f"{'-' * w}  {'-' * 9}  {'-' * 7}")
    for name, rate, ratio in rows:
        print(f"{name:<{w}}  {rate:>9}  {ratio:>7}")
    return 0


def trace_regeneration_times() -> tuple[float, float]:
    """(one certified training step, one trace regeneration incl. every op root and the trace tree)
    for a small GPT, measured in this run. A trace is regenerated from the step's input state."""
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

    def regen() -> None:
        t = StepTrace.of(1, job.graph, ex.run(state, data, keep_trace=True))
        _ = t.root

    return step, best_of(3, regen)


if __name__ == "__main__":
    sys.exit(main())
