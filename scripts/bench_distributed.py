"""Data-parallel step time against world size, and what the collectives cost.

    .venv/bin/python scripts/bench_distributed.py [--model mlp|gpt|resnet] [--steps 6] [--worlds 1,2,3]

``resnet``: a front-end graph (examples/resnet_digits.py, width 8: convs as patch TAKEs, batch
norm whose statistics are batch reductions, max/avg pools, residuals), batch 32.

For each world size N it starts N gloo ranks on 127.0.0.1 (as `vtrain train --nproc N` does) and
times every step on rank 0, split into time inside collectives (the FP64 all-reduce of partial
sums and |t| sums, the candidate-mask MAX all-reduce, the candidates' term rows, the log gather and
the agreement hash) and the rest (this rank's compute); every rank runs one thread. The
one-process trainer is timed in the same run (1 thread and all cores), and the ranks' roots are
checked against it. Figures are ratios within this run.

What a machine with few cores can show: that the split is correct (same roots), how many bytes
each step moves and what the collectives cost against compute. It cannot show a speed-up when the
ranks share two cores (N ranks then split the same cores, and loopback is not a network).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _spec(model: str):
    from vtrain.models.optim import AdamWConfig
    from vtrain.training.spec import TrainSpec

    if model == "gpt":
        return TrainSpec(model="gpt", batch_size=12, steps=1, corpus_chars=4000, optimizer=AdamWConfig())
    if model == "resnet":
        return TrainSpec(model="examples/resnet_digits.py:task", model_args={"width": 8}, batch_size=32, steps=1)
    return TrainSpec(batch_size=96, steps=1)


class Timing:
    """Wraps a Combiner (duck-typed): seconds and bytes per collective kind."""

    def __init__(self, inner) -> None:
        self.inner, self.rank, self.world = inner, inner.rank, inner.world
        self.seconds: dict[str, float] = {}
        self.bytes: dict[str, int] = {}

    def _timed(self, kind: str, nbytes: int, fn, *a):
        t = time.perf_counter()
        out = fn(*a)
        self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t
        self.bytes[kind] = self.bytes.get(kind, 0) + nbytes
        return out

    def all_reduce_sum(self, t):
        return self._timed("all_reduce_fp64", t.numel() * t.element_size(), self.inner.all_reduce_sum, t)

    def all_reduce_max(self, t):
        return self._timed("all_reduce_max", t.numel() * t.element_size(), self.inner.all_reduce_max, t)

    def all_gather(self, t):
        return self._timed("all_gather", t.numel() * t.element_size() * self.world, self.inner.all_gather, t)

    def all_gather_object(self, obj):
        return self._timed("all_gather_object", 0, self.inner.all_gather_object, obj)


def rank_main(model: str, steps: int) -> None:
    import torch.distributed as dist

    from vtrain.distributed.collective import DistCombiner
    from vtrain.distributed.worker import distributed_train_steps, init_process_group
    from vtrain.graph.executor import state_tensors
    from vtrain.training.spec import build_job

    init_process_group(120)
    spec = _spec(model)
    job = build_job(spec.__class__(**{**spec.__dict__, "steps": steps}))
    timing = Timing(DistCombiner())
    state = state_tensors(job.initial_state)
    times, coll, roots = [], [], []
    t0 = time.perf_counter()
    before = 0.0
    for o in distributed_train_steps(job, state, 1, steps, combiner=timing):  # type: ignore[arg-type]
        t1 = time.perf_counter()
        after = sum(timing.seconds.values())
        times.append(t1 - t0)
        coll.append(after - before)
        roots.append(o.state_root.hex())
        t0, before = t1, after
    if dist.get_rank() == 0:
        print(json.dumps({"times": times, "collective": coll, "roots": roots,
                          "seconds": timing.seconds, "bytes": timing.bytes}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run_world(model: str, steps: int, world: int) -> dict:
    from vtrain.distributed.launch import free_port

    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-worker", "--model", model,
                                       "--steps", str(steps)], env=env, stdout=subprocess.PIPE, cwd=ROOT))
    outs = [p.communicate()[0].decode() for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"world {world}: a rank failed ({[p.returncode for p in procs]})")
    return json.loads([ln for ln in outs[0].splitlines() if ln.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "gpt", "resnet"], default="mlp")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--worlds", default="1,2,3")
    ap.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        rank_main(args.model, args.steps)
        return
    from vtrain.graph.executor import state_tensors
    from vtrain.training.loop import train_steps
    from vtrain.training.spec import build_job

    spec = _spec(args.model)
    job = build_job(spec.__class__(**{**spec.__dict__, "steps": args.steps}))
    import torch

    def one_process(threads: int) -> tuple[list[str], float]:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        roots, times = [], []
        for o in train_steps(job, state_tensors(job.initial_state), 1, args.steps):
            t1 = time.perf_counter()
            times.append(t1 - t0)
            roots.append(o.state_root.hex())
            t0 = t1
        return roots, statistics.median(times[1:] or times)

    cores = os.cpu_count() or 1
    ref, base = one_process(cores)
    ref1, base1 = one_process(1)
    assert ref1 == ref
    print(f"model {args.model}, batch {spec.batch_size}, {job.graph.n_ops} ops, {args.steps} steps, {cores} cores; "
          f"one process: {base * 1e3:.1f} ms/step with {cores} threads, {base1 * 1e3:.1f} ms/step with 1 thread "
          "(medians after the first step; ratios below are against the faster)")
    base = min(base, base1)
    print(f"{'ranks':>5} {'ms/step':>9} {'vs 1 proc':>9} {'collective ms':>13} {'share':>6} "
          f"{'fp64 all-reduce KiB':>19} {'rows KiB':>9} {'same roots':>10}")
    for w in [int(x) for x in args.worlds.split(",")]:
        r = run_world(args.model, args.steps, w)
        t = statistics.median(r["times"][1:] or r["times"])
        c = statistics.median(r["collective"][1:] or r["collective"])
        per = args.steps
        print(f"{w:>5} {t * 1e3:>9.1f} {t / base:>8.2f}x {c * 1e3:>13.1f} {c / t:>6.0%} "
              f"{r['bytes'].get('all_reduce_fp64', 0) / per / 1024:>19.1f} "
              f"{r['bytes'].get('all_gather', 0) / per / 1024:>9.1f} {str(r['roots'] == ref):>10}")


if __name__ == "__main__":
    main()
