#!/usr/bin/env python
"""Torch front-end jobs: ATen nodes, primitive ops, capture time, step time (certified vs plain torch).

    .venv/bin/python scripts/bench_frontend.py [resnet] [gpt2-small] [gpt2-117m] [--steps 3]

Each configuration is built as ``vtrain train`` builds it (``build_job`` of a spec naming the
example factory); the step times are the best of ``--steps`` steps in the same run, certified
(FP64 + rounding log) and plain torch FP32 (the user's module, torch.optim), printed as a ratio.
Also the certified log as stored (bytes per step) against the seed paper's raw log of the same graph.
``gpt2-117m`` is GPT-2's full 117M configuration at context 64, batch 1 (``--context`` to change).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS = {
    "resnet": ("examples/resnet_digits.py:task", {}, 16),
    "gpt2-small": ("examples/hf_gpt2.py:small", {}, 4),
    "gpt2-117m": ("examples/hf_gpt2.py:full", {}, 1),
}


def bench(name: str, steps: int, context: int | None) -> dict:
    from vtrain.graph.executor import state_tensors
    from vtrain.numerics.logfile import encode_step_log
    from vtrain.numerics.paper import paper_log_bytes
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for
    from vtrain.training.spec import TrainSpec, build_job

    model, args, batch = CONFIGS[name]
    if context is not None and name.startswith("gpt2"):
        args = {**args, "context": context}
    elif name == "gpt2-117m":
        args = {**args, "context": 64}
    spec = TrainSpec(model=model, model_args=args, batch_size=batch, steps=steps)
    t0 = time.perf_counter()
    job = build_job(spec)
    build_s = time.perf_counter() - t0
    cap = job.torch.captured
    out = {"config": name, "model_args": args, "batch": batch, "aten_nodes": sum(cap.aten_ops.values()),
           "ops_per_step": job.graph.n_ops, "slots": len(job.graph.slots),
           "params": int(sum(a.size for a in job.initial_state[: cap.n_params])), "build_s": round(build_s, 2)}
    log_bytes: list[int] = []
    for mode in ("certified", "fp32"):
        ex = executor_for(job, mode)
        state = state_tensors(job.initial_state)
        best = float("inf")
        for s in range(1, steps + 1):
            t = time.perf_counter()
            res = ex.run(state, batch_for(job, s), step=s)
            best = min(best, time.perf_counter() - t)
            state = res.state
            if mode == "certified":
                log_bytes.append(len(encode_step_log(res.log, s, job.graph)))
        out[f"{mode}_step_s"] = round(best, 4)
        out[f"{mode}_loss_{steps}"] = res.loss
    out["certified/fp32"] = round(out["certified_step_s"] / out["fp32_step_s"], 1)
    # the certified log as stored against the seed paper's raw log of the same graph (1.6 bits per hooked value)
    out["log_bytes_per_step"] = round(sum(log_bytes) / len(log_bytes), 1)
    out["paper_log_bytes_per_step"] = paper_log_bytes(job.graph)
    out["paper/certified log"] = round(out["paper_log_bytes_per_step"] / max(out["log_bytes_per_step"], 1), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=["resnet", "gpt2-small"], choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--context", type=int, default=None)
    a = ap.parse_args()
    for name in a.configs:
        print(json.dumps(bench(name, a.steps, a.context)), flush=True)


if __name__ == "__main__":
    main()
