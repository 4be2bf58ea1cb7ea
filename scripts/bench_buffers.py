#!/usr/bin/env python
"""What the executor's buffer pool (vtrain/graph/buffers.py) saves: certified steps at GPT-2 shapes
with the pool and without it (``VTRAIN_BUFFER_POOL=0``), each in its own process.

    .venv/bin/python scripts/bench_buffers.py                 # 2 layers of GPT-2 117M's shapes (head-heavy)
    .venv/bin/python scripts/bench_buffers.py --layers 12     # the whole GPT-2 117M shape (about 9 GiB)

For each: the median wall and CPU seconds of the steps after the first two (the pool's buffers are
all made by then), the minor page faults and kernel (system) CPU seconds per step, and the process's
peak RSS. Same bits either way (tests/test_buffers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(a: argparse.Namespace) -> None:
    """One configuration, in this process: prints one JSON line."""
    import resource
    import time


    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from vtrain.graph.executor import set_threads, state_tensors
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for
    from vtrain.training.spec import TrainSpec, build_job

    set_threads(a.threads)
    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=a.batch, steps=a.steps + 2, mode="certified",
                     gpt=GPTConfig(vocab=a.vocab, n_layer=a.layers, d_model=a.width, n_head=a.heads,
                                   context=a.context))
    job = build_job(spec)
    ex = executor_for(job, "certified")
    state = state_tensors(job.initial_state)
    rows = []
    for s in range(1, a.steps + 3):
        r0, c0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
        state = ex.run(state, batch_for(job, s), step=s).state
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        rows.append((time.perf_counter() - w0, time.process_time() - c0, r1.ru_minflt - r0.ru_minflt,
                     r1.ru_stime - r0.ru_stime))
    steady = rows[2:]
    med = statistics.median
    print(json.dumps({"wall_s": med(r[0] for r in steady), "cpu_s": med(r[1] for r in steady),
                      "faults": med(r[2] for r in steady), "sys_s": med(r[3] for r in steady),
                      "first_s": rows[0][0], "pool_gib": ex.buffers.held_bytes / 2**30,
                      "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after two untimed ones)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return 0
    args = [sys.executable, __file__, "--child", *sys.argv[1:]]
    print(f"# bench_buffers: GPT {a.layers} layers, d {a.width}, ctx {a.context}, vocab {a.vocab:,}, batch "
          f"{a.batch}, AdamW; {a.threads} thread(s); medians of {a.steps} steps after two\n")
    print("| buffers | step wall | step CPU | minor faults / step | kernel CPU / step | pool held | peak RSS |")
    print("|---|---|---|---|---|---|---|")
    got = {}
    for name, flag in (("fresh (VTRAIN_BUFFER_POOL=0)", "0"), ("pooled", "1")):
        env = {**os.environ, "VTRAIN_BUFFER_POOL": flag}
        out = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"bench_buffers: {name} failed:\n{out.stderr[-2000:]}")
        r = got[flag] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {name} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s | {r['faults']:,.0f} | {r['sys_s']:.2f} s | "
              f"{r['pool_gib']:.2f} GiB | {r['rss_gib']:.2f} GiB |")
    print(f"\npooled / fresh step wall: {got['1']['wall_s'] / got['0']['wall_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
