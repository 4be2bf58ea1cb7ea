"""The step graph: autodiff rules agree with torch autograd, shapes are checked, ops are data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vtrain.errors import GraphError
from vtrain.graph.executor import _compute_fp64, _move
from vtrain.graph.step_graph import ROUNDING_KINDS, GraphBuilder, OpKind
from vtrain.models.nn import GPTConfig
from vtrain.models.optim import AdamWConfig, SGDConfig
from vtrain.training.spec import TrainSpec, build_job


def _fp64_forward(graph, state, data, upto: int):
    """Evaluate ops 0..upto in FP64 without rounding, keeping torch autograd on the inputs."""
    vals = {}
    for op in graph.ops[: upto + 1]:
        ins = [vals[i] for i in op.inputs]
        if op.kind == OpKind.INPUT:
            vals[op.id] = state[op.attrs[0]]
        elif op.kind == OpKind.DATA:
            vals[op.id] = data
        elif op.kind == OpKind.CONST:
            vals[op.id] = torch.from_numpy(graph.consts[op.id]).double()
        elif op.kind == OpKind.MAX:
            vals[op.id] = ins[0].detach().amax(dim=-1, keepdim=True)
        elif op.kind in ROUNDING_KINDS:
            vals[op.id] = _compute_fp64(op, ins)[0] if op.kind != OpKind.MATMUL else _mm(op, ins)
        else:
            vals[op.id] = _move(op, ins)
    return vals


def _mm(op, ins):
    v = torch.matmul(ins[0], ins[1].transpose(-1, -2))
    return v + ins[2] if len(ins) == 3 else v


@pytest.mark.parametrize(
    "spec",
    [
        TrainSpec(model="mlp", batch_size=8, optimizer=SGDConfig()),
        TrainSpec(
            model="gpt",
            batch_size=2,
            optimizer=AdamWConfig(),
            gpt=GPTConfig(vocab=32, context=8, n_layer=1, n_head=2, d_model=16),
        ),
    ],
    ids=["mlp", "gpt"],
)
def test_graph_gradients_match_torch_autograd(spec: TrainSpec) -> None:
    job = build_job(spec)
    g = job.graph
    n_params = len(g.grad_ops)
    state = [torch.from_numpy(a).double().requires_grad_(i < n_params) for i, a in enumerate(job.initial_state)]
    data = torch.from_numpy(job.dataset.samples[: spec.batch_size]).double()
    vals = _fp64_forward(g, state, data, g.n_ops - 1)
    loss = vals[g.loss_op].reshape(())
    ref = torch.autograd.grad(loss, state[:n_params])
    assert sorted(g.grad_ops) == list(range(n_params))
    for slot, want in enumerate(ref):
        got = vals[g.grad_ops[slot]]
        assert got.shape == want.shape, g.slots[slot].name
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12), g.slots[slot].name


def test_broadcast_rejects_incompatible_shapes() -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    y = b.input("y", (3, 5))
    with pytest.raises(GraphError, match="do not broadcast"):
        b.add(x, y)


def test_matmul_requires_nt_layout() -> None:
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    w = b.input("w", (5, 3))
    with pytest.raises(GraphError, match=r"expected a\[...,M,K\] and b\[...,N,K\]"):
        b.matmul(x, w)


def test_every_reduction_in_the_models_is_disputable() -> None:
    """MATMUL/SUM/MEAN terms stay within the on-chain accumulator (ExactSum.MAX_TERMS); those over
    MAX_DIRECT_TERMS are ruled through the chunk level (tests/test_chunked.py)."""
    from vtrain.numerics.exact import MAX_TERMS

    for spec in (TrainSpec(model="mlp", batch_size=32), TrainSpec(model="gpt", batch_size=8)):
        g = build_job(spec).graph
        for op in g.ops:
            if op.kind in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
                n = g.ops[op.inputs[0]].shape[-1]
                assert n <= MAX_TERMS, (op, n)


def test_graph_is_static_across_builds() -> None:
    a = build_job(TrainSpec(model="gpt", batch_size=2)).graph
    b = build_job(TrainSpec(model="gpt", batch_size=2)).graph
    assert [(o.kind, o.inputs, o.shape, o.attrs) for o in a.ops] == [
        (o.kind, o.inputs, o.shape, o.attrs) for o in b.ops
    ]
    assert math.prod(a.data_shape) > 0
    assert all(np.isfinite(c).all() for c in a.consts.values())
