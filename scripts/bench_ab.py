"""Two trees' certified steps, interleaved in one process: the honest way to compare executor changes
on a shared, noisy machine (separate processes at load 2 spread wider than a 5-10% change).

    .venv/bin/python scripts/bench_ab.py --base b86bec8 [--rounds 150] [--width 64]

The ``--base`` commit of this repository is extracted (``git archive``), its native kernels built
(``make native``), and its ``vtrain`` package imported beside this tree's under another name
(``vtrain_base``: its imports rewritten). Both build the same small GPT (2 layers, AdamW, batch 8;
ctx 32 at width 64, else 128), run two steps, then time step 3 from the same state: plain torch
FP32, the certified trainer's step and the auditor's checked replay (every entry verified, exact
resolver), alternating which tree goes first. Prints CPU-time medians per tree and the paired
ratios new/base (median and interquartile range). One thread.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
BASE_NAME = "vtrain_base"


def extract_base(rev: str, into: Path) -> Path:
    """``rev``'s vtrain package under ``into/vtrain_base`` (imports renamed, kernels built)."""
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    built = subprocess.run(["make", "-C", str(src), "native"], capture_output=True, text=True)
    if not (src / "vtrain/numerics/_kernels.so").exists():
        print(f"bench_ab: {rev}'s native kernels did not build; its numpy path is timed\n{built.stderr[-500:]}",
              file=sys.stderr)
    pkg = into / BASE_NAME
    (src / "vtrain").rename(pkg)
    pattern = re.compile(r"\b(from|import) vtrain\b")
    for f in pkg.rglob("*.py"):
        f.write_text(pattern.sub(lambda m: f"{m.group(1)} {BASE_NAME}", f.read_text()))
    return into


def setup(pkg: str, width: int):
    """(job, certified executor, fp32 executor, state, data, step result) of ``pkg`` at step 3."""
    mod = {n: importlib.import_module(f"{pkg}.{n}") for n in
           ("models.nn", "models.optim", "training.spec", "torch_ref", "graph.executor", "training.loop")}
    nn, opt, spec_m = mod["models.nn"], mod["models.optim"], mod["training.spec"]
    ctx = 32 if width == 64 else 128
    spec = spec_m.TrainSpec(model="gpt", optimizer=opt.AdamWConfig(), batch_size=8, steps=8, mode="certified",
                            gpt=nn.GPTConfig(n_layer=2, d_model=width, n_head=4, context=ctx))
    job = spec_m.build_job(spec)
    ex = mod["torch_ref"].executor_for(job, "certified")
    fx = mod["torch_ref"].executor_for(job, "fp32")
    loop = mod["training.loop"]
    st = mod["graph.executor"].state_tensors(job.initial_state)
    for s in (1, 2):
        st = ex.run(st, loop.batch_for(job, s), step=s).state
    data = loop.batch_for(job, 3)
    return job, ex, fx, st, data, ex.run(st, data, step=3)


def cpu_times(tree: tuple, resolver) -> list[float]:
    """CPU seconds of: plain FP32 step, certified step, checked replay."""
    job, ex, fx, st, data, res = tree
    out = []
    for f in (lambda: fx.run(st, data, step=3), lambda: ex.run(st, data, step=3),
              lambda: ex.run(st, data, log_in=res.log, step=3, check=True, resolver_factory=resolver)):
        c = time.process_time()
        f()
        out.append(time.process_time() - c)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare against (any git revision)")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--width", type=int, default=64, help="d_model (64: ctx 32; otherwise ctx 128)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "scripts"))
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        sys.path.insert(0, str(extract_base(args.base, Path(tmp))))
        bench: ModuleType = importlib.import_module("bench_numerics")
        new, base = setup("vtrain", args.width), setup(BASE_NAME, args.width)
        resolver = bench.auditor_resolver(new[0])
        rows: dict[str, list[list[float]]] = {"base": [], "new": []}
        for r in range(args.rounds):
            for k in (("base", "new") if r % 2 else ("new", "base")):
                rows[k].append(cpu_times(base if k == "base" else new, resolver))
    med = statistics.median
    print(f"# bench_ab: small GPT d {args.width}, {args.rounds} interleaved rounds, one thread, CPU time; "
          f"base {args.base}, new = this tree")
    for k in ("base", "new"):
        f, c, a = zip(*rows[k], strict=True)
        print(f"{k}: fp32 {med(f) * 1e3:.1f} ms, certified {med(c) * 1e3:.1f} ms, "
              f"checked replay {med(a) * 1e3:.1f} ms; "
              f"certified/fp32 {med([x / y for x, y in zip(c, f, strict=True)]):.2f}x, "
              f"replay/certified {med([x / y for x, y in zip(a, c, strict=True)]):.2f}x")
    for i, what in ((1, "certified"), (2, "checked replay")):
        p = sorted(n[i] / b[i] for n, b in zip(rows["new"], rows["base"], strict=True))
        print(f"paired new/base {what}: {med(p):.3f} (interquartile {p[len(p) // 4]:.3f}-{p[3 * len(p) // 4]:.3f})")


if __name__ == "__main__":
    main()
