"""``vtrain inspect``: what a run folder holds: the loss per step, rounding-log entries per op and
per code, and PNG plots of the loss and of the logged fraction per step."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from vtrain.graph.step_graph import ROUNDING_KINDS
from vtrain.numerics.rounding import Code, Mode
from vtrain.training.rundir import RunDir
from vtrain.training.spec import Job

PAPER_TRITS = {0: "down", 1: "none", 2: "up"}


def summarize(run: RunDir, job: Job) -> dict:
    """Per-step loss and log figures, and totals per op and per code, as one JSON-able dict."""
    g = job.graph
    roots = run.read_roots()
    mode = Mode(job.spec.mode)
    rounded = sum(op.numel for op in g.ops if op.kind in ROUNDING_KINDS)
    per_op: Counter[int] = Counter()
    per_code: Counter[str] = Counter()
    steps = []
    for s in sorted(roots):
        r = roots[s]
        row = {"step": s, "loss": r["loss"]}
        p = run.log_path(s)
        if mode in (Mode.CERTIFIED, Mode.PAPER) and p.exists():
            lg = run.read_log(s, g)
            row["log_bytes"] = p.stat().st_size
            if mode == Mode.CERTIFIED:
                n = 0
                for op, e in lg.sparse.items():
                    per_op[op] += len(e)
                    n += len(e)
                    for c, k in zip(*np.unique(e.code, return_counts=True)):
                        per_code[Code(int(c)).name.lower()] += int(k)
                row["logged"] = n
                row["logged_fraction"] = n / rounded if rounded else 0.0
            else:
                n = hooked = 0
                for op, d in lg.dense.items():
                    k = int((d.trits != 1).sum())
                    per_op[op] += k
                    n += k
                    hooked += len(d.trits)
                    for c, m in zip(*np.unique(d.trits, return_counts=True)):
                        per_code[PAPER_TRITS[int(c)]] += int(m)
                row["logged"] = n
                row["logged_fraction"] = n / hooked if hooked else 0.0
        steps.append(row)
    ops = [{"op": o, "kind": g.ops[o].kind.name, "name": g.ops[o].name, "numel": g.ops[o].numel,
            "entries": per_op[o]} for o in sorted(per_op) if per_op[o]]
    return {"run": str(run.path), "model": job.spec.model, "mode": mode.value, "ops_per_step": g.n_ops,
            "rounded_values_per_step": rounded, "steps": steps, "entries_per_code": dict(per_code),
            "entries_per_op": ops}


def plot(summary: dict, out_dir: Path) -> list[Path]:
    """``loss.png`` and (logged runs) ``logged_fraction.png`` in ``out_dir``; returns the paths."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vtrain.training.rundir import atomic_write

    steps = summary["steps"]
    written = []
    figs = [("loss.png", "loss", "training loss", False)]
    if any("logged_fraction" in r for r in steps):
        figs.append(("logged_fraction.png", "logged_fraction", "fraction of rounded values logged", True))
    for name, key, label, pct in figs:
        xs = [r["step"] for r in steps if key in r]
        ys = [r[key] * (100 if pct else 1) for r in steps if key in r]
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        ax.plot(xs, ys, marker="." if len(xs) < 60 else None)
        ax.set_xlabel("step")
        ax.set_ylabel(label + (" (%)" if pct else ""))
        ax.set_title(f"{summary['model']} ({summary['mode']}): {label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        atomic_write(out_dir / name, buf.getvalue())
        written.append(out_dir / name)
    return written


def text_report(summary: dict, top: int = 15) -> str:
    """The summary for a person: totals, the ops with most entries, the loss at a few steps."""
    lines = [f"{summary['run']}: {summary['model']}, mode {summary['mode']}, {len(summary['steps'])} steps, "
             f"{summary['ops_per_step']} ops/step, {summary['rounded_values_per_step']:,} rounded values/step"]
    st = summary["steps"]
    if st:
        pick = sorted({0, len(st) // 4, len(st) // 2, 3 * len(st) // 4, len(st) - 1})
        lines.append("loss: " + ", ".join(f"step {st[i]['step']} {st[i]['loss']:.4f}" for i in pick))
    if summary["entries_per_code"]:
        lines.append("log entries per code: " + ", ".join(f"{k} {v:,}" for k, v in
                                                           sorted(summary["entries_per_code"].items())))
        ops = sorted(summary["entries_per_op"], key=lambda o: -o["entries"])[:top]
        lines.append(f"ops with most entries (of {len(summary['entries_per_op'])} with any):")
        lines += [f"  op {o['op']:>4} {o['kind']:<8} {o['name'] or '-':<16} {o['entries']:>8,} entries "
                  f"({o['numel']:,} values/step)" for o in ops]
    return "\n".join(lines)
