"""A graph evaluated in FP64 without any rounding: the reference that lowerings and VJPs are
checked against (torch autograd on the original model, also in FP64). Not a training path."""

from __future__ import annotations

import torch

from vtrain.graph.executor import _compute_fp64, _move
from vtrain.graph.generated import generated_output
from vtrain.graph.step_graph import GENERATED_KINDS, ROUNDING_KINDS, Graph, OpKind


def evaluate_fp64(
    graph: Graph,
    state: list[torch.Tensor],
    data: torch.Tensor,
    seed: bytes | None = None,
    step: int | None = 1,
    upto: int | None = None,
) -> dict[int, torch.Tensor]:
    """Every op's FP64 value (ops ``0..upto``); torch autograd flows through it from ``state``."""
    vals: dict[int, torch.Tensor] = {}
    last = graph.n_ops - 1 if upto is None else upto
    for op in graph.ops[: last + 1]:
        ins = [vals[i] for i in op.inputs]
        if op.kind == OpKind.INPUT:
            vals[op.id] = state[op.attrs[0]]
        elif op.kind == OpKind.DATA:
            vals[op.id] = data.double()
        elif op.kind == OpKind.CONST:
            vals[op.id] = torch.from_numpy(graph.consts[op.id]).double()
        elif op.kind in GENERATED_KINDS:
            vals[op.id] = generated_output(op, seed, step).double()
        elif op.kind in ROUNDING_KINDS:
            vals[op.id] = _compute_fp64(op, ins)[0]
        else:
            vals[op.id] = _move(op, ins)
    return vals
