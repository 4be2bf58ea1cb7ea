#!/usr/bin/env python
"""How close the certified step can get to plain FP32 on this CPU: the FP64 GEMM floor.

    .venv/bin/python scripts/bench_gemm_floor.py     # the small GPT, and 2 layers of GPT-2 small's shapes
    .venv/bin/python scripts/bench_gemm_floor.py --width 768 --context 256 --layers 12 --batch 1 --vocab 50257

The certified executor evaluates every MATMUL in FP64 (``torch.matmul`` on the FP64 copies of its
FP32 operands); plain torch FP32 runs the same products in FP32. Where the products dominate a step
(GPT-2 shapes), the ratio of the two GEMMs bounds the certified step's ratio to plain FP32 from
below, whatever the rest of the executor costs. For each configuration this prints, in CPU time on
one thread (medians): the plain FP32 step and the certified step (``vtrain.torch_ref`` executors, the
same job, step 2 from the state step 1 hands on), the sum over the step graph's MATMULs of the FP32
GEMM and of the FP64 conversion + GEMM at each op's shapes (random operands), and the floor
``(fp32 step - fp32 GEMMs + fp64 GEMMs) / fp32 step``: the certified/FP32 ratio were every other
cost of the certified step equal to plain FP32's (rounding, filter, log and optimizer free).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from vtrain.graph.executor import state_tensors  # noqa: E402
from vtrain.graph.step_graph import OpKind  # noqa: E402
from vtrain.models.nn import GPTConfig  # noqa: E402
from vtrain.models.optim import AdamWConfig  # noqa: E402
from vtrain.torch_ref import executor_for  # noqa: E402
from vtrain.training.loop import batch_for  # noqa: E402
from vtrain.training.spec import TrainSpec, build_job  # noqa: E402


def cpu_median(f, n: int) -> float:
    """Median CPU seconds of ``n`` calls of ``f`` (after one untimed call)."""
    f()
    times = []
    for _ in range(n):
        c = time.process_time()
        f()
        times.append(time.process_time() - c)
    return statistics.median(times)


def gemm_sums(graph, n: int) -> tuple[float, float, int]:
    """(FP32 GEMMs, FP64 conversions + GEMMs) CPU seconds summed over the graph's MATMULs, and their
    count: each op's ``a @ b^T`` at its input shapes on random operands."""
    g = torch.Generator().manual_seed(0)
    f32 = f64 = 0.0
    ops = [op for op in graph.ops if op.kind == OpKind.MATMUL]
    for op in ops:
        a, b = (torch.randn(graph.ops[i].shape, generator=g) for i in op.inputs[:2])
        f32 += cpu_median(lambda a=a, b=b: torch.matmul(a, b.transpose(-1, -2)), n)
        f64 += cpu_median(lambda a=a, b=b: torch.matmul(a.double(), b.double().transpose(-1, -2)), n)
    return f32, f64, len(ops)


def measure(width: int, context: int, layers: int, heads: int, batch: int, vocab: int, steps: int) -> dict[str, float]:
    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=batch, steps=steps + 3, mode="certified",
                     gpt=GPTConfig(vocab=vocab, n_layer=layers, d_model=width, n_head=heads, context=context))
    job = build_job(spec)
    cert = executor_for(job, "certified")
    state = cert.run(state_tensors(job.initial_state), batch_for(job, 1), step=1).state  # as a run hands it on
    data = batch_for(job, 2)
    del cert  # (and its buffer pool: plain FP32 runs beside none of the certified executor's memory)
    gc.collect()
    plain = executor_for(job, "fp32")
    fp32 = cpu_median(lambda: plain.run(state, data, step=2), steps)
    plain = None  # (released before the certified executor is made)
    cert = executor_for(job, "certified")
    certified = cpu_median(lambda: cert.run(state, data, step=2), steps)
    g32, g64, n_mm = gemm_sums(job.graph, max(3, steps))
    return {"fp32": fp32, "certified": certified, "gemm32": g32, "gemm64": g64, "matmuls": n_mm,
            "floor": (fp32 - g32 + g64) / fp32}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=None, help="one configuration: d_model")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32, help="vocabulary (GPT-2: 50,257)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per mode (medians)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    configs = ([(args.width, args.context, args.layers, args.heads, args.batch, args.vocab)] if args.width else
               [(64, 32, 2, 4, 8, 32), (768, 256, 2, 12, 1, 50257)])
    print("| d | ctx | layers | batch | vocab | MATMULs | fp32 step | certified step | certified/fp32 | fp32 GEMMs | "
          "fp64 GEMMs | fp64/fp32 GEMMs | floor |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for w, c, layers, h, b, v in configs:
        r = measure(w, c, layers, h, b, v, args.steps)
        ms = {k: f"{r[k] * 1e3:.1f} ms" for k in ("fp32", "certified", "gemm32", "gemm64")}
        print(f"| {w} | {c} | {layers} | {b} | {v:,} | {r['matmuls']} | {ms['fp32']} | {ms['certified']} | "
              f"{r['certified'] / r['fp32']:.2f}x | {ms['gemm32']} | {ms['gemm64']} | "
              f"{r['gemm64'] / r['gemm32']:.2f}x | {r['floor']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
