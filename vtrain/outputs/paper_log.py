"""``vtrain export-paper-log``: a ``paper``-mode run's logs in the seed paper's own file layout.

Per step ``s`` and pass (forward, backward): ``<pass>_hooks_log_b_<s>_e_0`` holds each hooked
tensor's trits packed five to a byte (first trit lowest, zero-padded to a multiple of 5), raw, in
op order; ``<pass>_hooks_log_b_<s>_e_0_metadata`` has one line ``numel, nbytes`` per tensor. The
paper's reader (``Tensor012Logger`` in mode ``rb``) reads exactly this (``vtrain.numerics.paper``).
The paper numbers batches within an epoch; a vtrain run has one data order, so ``b`` is the step.
"""

from __future__ import annotations

from pathlib import Path

from vtrain.numerics.paper import pass_of
from vtrain.numerics.rounding import pack_trits
from vtrain.training.rundir import RunDir, atomic_write
from vtrain.training.spec import Job


def paper_file_names(step: int, where: str) -> tuple[str, str]:
    name = f"{where}_hooks_log_b_{step}_e_0"
    return name, name + "_metadata"


def export_paper_logs(run: RunDir, job: Job, out: Path) -> dict:
    """Write every recorded step's paper log; returns counts (files, bytes, hooked values)."""
    g = job.graph
    passes = pass_of(g)
    roots = run.read_roots()
    out = Path(out)
    n_files = n_bytes = n_values = 0
    for s in sorted(roots):
        lg = run.read_log(s, g)
        for where, ops in passes.items():
            body, meta = [], []
            for o in ops:
                packed = pack_trits(lg.dense[o].trits)
                body.append(packed)
                meta.append(f"{g.ops[o].numel}, {len(packed)}\n")
                n_values += g.ops[o].numel
            log_name, meta_name = paper_file_names(s, where)
            data = b"".join(body)
            atomic_write(out / log_name, data)
            atomic_write(out / meta_name, "".join(meta).encode())
            n_files += 2
            n_bytes += len(data)
    return {"out": str(out), "steps": len(roots), "files": n_files, "log_bytes": n_bytes,
            "hooked_values": n_values, "bits_per_value": round(8 * n_bytes / n_values, 4) if n_values else None}
