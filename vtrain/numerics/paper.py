"""The seed paper's rounding log, as its code does it (github.com/meghabyte/verifiable-training;
facts in ``docs/numerics.md``): the baseline that mode ``paper`` reproduces.

- **Where**: the paper hooks every leaf module's forward output and every module's ``grad_input``
  (gradients w.r.t. activations). Parameter gradients and the optimizer update are not logged.
  Here each primitive op of the step graph stands for a leaf module: every rounding op of the
  forward pass, and every rounding op of the backward pass except those that only compute
  parameter gradients (``Graph.weight_grad_ops``), is *hooked*. The other ops (weight gradients,
  the optimizer, ops nobody needs) round to nearest with no log, as in mode ``round-nolog``.
- **Trit code** (``utils.round_val_64_to_32``): ``(RN(v) > v) - (RN(v) < v) + 1``, so
  **0 = rounded down, 1 = not logged, 2 = rounded up**.
- **Threshold** (``Rounder.check_logging_threshold``): an element is logged when
  ``|v - RN(v)| > 10^floor(log10|v|) * 0.25 * 2^-23`` (a decimal scale, not the FP32 spacing).
- **Auditor**: rounds its own value; where its own threshold fires, the logged trit is 0 or 2 and
  differs from its own rounding direction, it moves one ``nextafter`` step from its own RN32 value
  toward the logged side (``Round64Down`` / ``Round64Up``).
- **Storage** (``logging_utils.Tensor012Logger``): trits five to a byte, first trit lowest, each
  tensor zero-padded to a multiple of 5, raw, with a ``_metadata`` sidecar (``numel, nbytes`` per
  tensor); one file per batch and pass (``forward_hooks_log_b_<b>_e_<e>``, ``backward_...``).
  That is 1.6 bits per hooked value whatever the threshold: :func:`paper_log_bytes`.
"""

from __future__ import annotations

import numpy as np
import torch

from vtrain.errors import VtrainError
from vtrain.graph.step_graph import ROUNDING_KINDS, Graph, OpKind
from vtrain.numerics.rounding import DenseLog, canonical

PAPER_EPS = 2.0**-23
PAPER_PIVOT = 0.25
"""``Rounder``'s hard-coded constants (its adaptive ``THRESHOLDS`` table is empty)."""

DOWN, NONE, UP = 0, 1, 2
"""The paper's trits."""


def hooked_ops(graph: Graph) -> dict[int, str]:
    """Rounding ops the paper's hooks log, in op order: op id -> ``"forward"`` or ``"backward"``."""
    grads = set(graph.grad_ops.values())
    # ancestors of the parameter gradients after the loss: the backward ops anyone needs
    useful: set[int] = set()
    todo = [g for g in grads if g > graph.loss_op]
    while todo:
        o = todo.pop()
        if o in useful or o <= graph.loss_op:
            continue
        useful.add(o)
        todo.extend(graph.ops[o].inputs)
    out: dict[int, str] = {}
    for op in graph.ops:
        if op.kind not in ROUNDING_KINDS:
            continue
        if op.id <= graph.loss_op:
            out[op.id] = "forward"
        elif op.id in useful and op.id not in graph.weight_grad_ops:
            out[op.id] = "backward"
    return out


def paper_threshold(v: torch.Tensor) -> torch.Tensor:
    """``10^floor(log10|v|) * (0.5 eps - (0.5 - pivot) 2^-23)`` in FP64, as ``check_logging_threshold``."""
    scale = torch.pow(torch.tensor(10.0, dtype=torch.float64), torch.floor(torch.log10(v.abs())))
    return scale * (0.5 * PAPER_EPS - (0.5 - PAPER_PIVOT) * 2.0**-23)


def _own_trits(v: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(trits before the threshold, threshold mask) of FP64 ``v`` and its FP32 rounding ``r``."""
    r64 = r.double()
    trits = (r64 > v).to(torch.uint8) - (r64 < v).to(torch.uint8) + 1
    return trits, (v - r64).abs() > paper_threshold(v)


def round_paper(v: torch.Tensor) -> tuple[torch.Tensor, DenseLog]:
    """Trainer side: ``RN32(v)`` and one trit per element (1 where the threshold does not fire)."""
    r = v.to(torch.float32)
    if not bool(torch.isfinite(r).all()):
        from vtrain.errors import NonFiniteValue

        raise NonFiniteValue("paper rounding: expected finite values, got NaN/Inf")
    vf, rf = v.reshape(-1), r.reshape(-1)
    trits, fire = _own_trits(vf, rf)
    trits = torch.where(fire, trits, torch.ones((), dtype=torch.uint8))
    return canonical(r), DenseLog(trits.numpy())


def apply_paper(v: torch.Tensor, dense: DenseLog) -> torch.Tensor:
    """Auditor side: its own ``RN32``, moved one FP32 step toward the logged side where its own
    threshold fires and its own direction differs from the logged 0 (down) or 2 (up)."""
    r = v.to(torch.float32)
    rf, vf = r.reshape(-1).clone(), v.reshape(-1)
    logged = torch.from_numpy(np.ascontiguousarray(dense.trits))
    if logged.numel() != rf.numel():
        raise VtrainError(f"paper log: expected {rf.numel()} trits, got {logged.numel()}")
    if bool((logged > 2).any()):
        raise VtrainError("paper log: trit out of range (expected 0, 1 or 2)")
    own, fire = _own_trits(vf, rf)
    own = torch.where(fire, own, torch.ones((), dtype=torch.uint8))
    down = (own == UP) & fire & (logged == DOWN)
    up = (own == DOWN) & fire & (logged == UP)
    inf = torch.full_like(rf, float("inf"))
    rf = torch.where(down, torch.nextafter(rf, -inf), rf)
    rf = torch.where(up, torch.nextafter(rf, inf), rf)
    return canonical(rf.reshape(r.shape))


def pass_of(graph: Graph) -> dict[str, list[int]]:
    """Hooked op ids per pass file, in the order their tensors are written."""
    out: dict[str, list[int]] = {"forward": [], "backward": []}
    for op, where in hooked_ops(graph).items():
        out[where].append(op)
    return out


def paper_log_bytes(graph: Graph) -> int:
    """Bytes of one step's log as the paper stores it: ``ceil(numel / 5)`` per hooked tensor."""
    return sum((graph.ops[o].numel + 4) // 5 for o in hooked_ops(graph))


__all__ = ["hooked_ops", "round_paper", "apply_paper", "paper_threshold", "paper_log_bytes", "pass_of",
           "OpKind", "DOWN", "NONE", "UP"]
