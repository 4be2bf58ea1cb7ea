"""The flat optimizer (``vtrain.models.optim.apply_optimizer``: one update over CONCATed parameters,
gradients and state, SLICEd back to the slots) gives bit for bit the state of the per-tensor update
it replaced, with far fewer ops; CONCAT's executor, exact mirror and VJP agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protocol.rulability import unrulable_ops
from vtrain.errors import GraphError
from vtrain.graph.executor import StepExecutor, _move, state_tensors
from vtrain.graph.step_graph import MAX_CONCAT_INPUTS, Graph, GraphBuilder, OpKind, T
from vtrain.models.nn import GPTConfig
from vtrain.models.optim import AdamWConfig, OptimConfig, SGDConfig, adamw_update, sgd_update
from vtrain.numerics import exact as X
from vtrain.numerics.rounding import Mode
from vtrain.training.loop import batch_for
from vtrain.training.spec import TrainSpec, build_job


def _per_tensor(g: GraphBuilder, cfg: OptimConfig, params: list[T], grads: list[T], state: list[T]):
    """The update as it was before the flat buffers: ~15 ops per parameter tensor."""
    if isinstance(cfg, SGDConfig):
        out = [sgd_update(g, cfg, p, gr, b) for p, gr, b in zip(params, grads, state, strict=True)]
        return [a for a, _ in out], [b for _, b in out]
    n = len(params)
    ms, vs, b1p, b2p = state[:n], state[n : 2 * n], state[2 * n], state[2 * n + 1]
    new_b1p, new_b2p = g.mul_s(b1p, cfg.beta1), g.mul_s(b2p, cfg.beta2)
    bc1, bc2 = g.rsub_s(1.0, new_b1p), g.rsub_s(1.0, new_b2p)
    out = [adamw_update(g, cfg, p, gr, m, v, bc1, bc2) for p, gr, m, v in zip(params, grads, ms, vs, strict=True)]
    return [a for a, _, _ in out], [b for _, b, _ in out] + [c for _, _, c in out] + [new_b1p, new_b2p]


def _per_tensor_graph(job) -> Graph:
    """The job's graph rebuilt with the per-tensor optimizer (same forward, backward and slots)."""
    src = job.graph
    g = GraphBuilder()
    n_params = len(src.grad_ops)
    ops = {}
    for op in src.ops:  # copy everything up to the last gradient op
        if op.id > max(src.grad_ops.values()):
            break
        ins = [ops[i] for i in op.inputs]
        if op.kind == OpKind.INPUT:
            t = g.input(src.slots[op.attrs[0]].name, src.slots[op.attrs[0]].shape)
        elif op.kind == OpKind.DATA:
            t = g.data(op.shape)
        elif op.kind == OpKind.CONST:
            t = g.const(src.consts[op.id], op.name)
        else:
            t = g._op(op.kind, ins, op.shape, op.attrs, op.name)
        ops[op.id] = t
    slots = [ops[src.input_op(i)] for i in range(len(src.slots))]
    grads = [ops[src.grad_ops[i]] for i in range(n_params)]
    new_p, new_s = _per_tensor(g, job.spec.optimizer, slots[:n_params], grads, slots[n_params:])
    for slot, t in enumerate(new_p + new_s):
        g.output(t, slot)
    return g.build(ops[src.loss_op], dict(src.grad_ops))


SPECS = {
    "gpt-adamw": TrainSpec(model="gpt", batch_size=2, optimizer=AdamWConfig(weight_decay=0.1),
                           gpt=GPTConfig(vocab=32, context=8, n_layer=1, n_head=2, d_model=16)),
    "mlp-sgd-wd": TrainSpec(model="mlp", batch_size=8, optimizer=SGDConfig(weight_decay=0.01)),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_flat_update_gives_the_per_tensor_state_bit_for_bit_in_fewer_ops(name: str) -> None:
    job = build_job(SPECS[name])
    old = _per_tensor_graph(job)
    n_params = len(job.graph.grad_ops)
    assert sum(o.kind == OpKind.CONCAT for o in job.graph.ops) >= 3
    # AdamW: ~15 ops per tensor became ~15 in all (+ CONCATs, and a SLICE per tensor for p, m, v)
    saved = 6 * n_params if isinstance(job.spec.optimizer, AdamWConfig) else 1
    assert job.graph.n_ops <= old.n_ops - saved
    assert unrulable_ops(job.graph) == []
    states = {}
    for key, graph in (("flat", job.graph), ("per-tensor", old)):
        ex = StepExecutor(graph, Mode.CERTIFIED, seed=job.spec.data_seed)
        state = state_tensors(job.initial_state)
        for s in (1, 2, 3):
            res = ex.run(state, batch_for(job, s), step=s)
            state = res.state
        states[key] = state
    for slot, (a, b) in enumerate(zip(states["flat"], states["per-tensor"], strict=True)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), job.graph.slots[slot].name
        assert tuple(a.shape) == job.graph.slots[slot].shape


def test_concat_executor_exact_mirror_and_vjp_agree() -> None:
    rng = np.random.default_rng(5)
    shapes = [(2, 3), (1,), (4, 1, 2)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    g = GraphBuilder()
    ts = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    c = g.concat(ts)
    assert c.shape == (15,) and g.ops[c.op].kind == OpKind.CONCAT
    got = _move(g.ops[c.op], [torch.from_numpy(x) for x in xs])
    want = np.concatenate([x.reshape(-1) for x in xs])
    assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    desc = X.OpDesc(int(OpKind.CONCAT), (0, 1, 2), (15,), tuple(shapes), ())
    for i in range(15):
        assert X.rn32(X.exact_value(desc, xs, i)) == int(want.view(np.uint32)[i])
        (read,) = X.reads(desc, xs, i)
        assert read.input == (0 if i < 6 else 1 if i < 7 else 2)
    # VJP: the gradient of sum(w * concat(x)) w.r.t. x_j is w's slice of x_j's size, in x_j's shape
    w = g.const(np.arange(15, dtype=np.float32).reshape(1, 15), "w")
    loss = g.sum(g.mul(g.reshape(c, (1, 15)), w))
    grads = g.grad(loss, ts)
    assert [gr.shape for gr in grads] == shapes
    with pytest.raises(X.MalformedOp, match="CONCAT"):
        X.exact_value(X.OpDesc(int(OpKind.CONCAT), (0, 1, 2), (14,), tuple(shapes), ()), xs, 0)


def test_concat_of_many_tensors_is_a_tree_of_rulable_concats() -> None:
    g = GraphBuilder()
    ts = [g.input(f"p{i}", (i % 3 + 1,)) for i in range(3 * MAX_CONCAT_INPUTS + 2)]
    c = g.concat(ts)
    assert c.shape == (sum(t.shape[0] for t in ts),)
    cats = [o for o in g.ops if o.kind == OpKind.CONCAT]
    assert all(1 <= len(o.inputs) <= MAX_CONCAT_INPUTS for o in cats) and len(cats) == 5
    assert g.concat(ts[:1]).shape == (1,)  # one tensor: no CONCAT
    with pytest.raises(GraphError, match="at least one"):
        g.concat([])
    g.output(g.slice(c, 0, 0, 1), 0)
    graph = g.build(c)
    wide = GraphBuilder()
    many = [wide.input(f"p{i}", (1,)) for i in range(MAX_CONCAT_INPUTS + 1)]
    t = wide._op(OpKind.CONCAT, many, (len(many),))
    bad = unrulable_ops(wide.build(t))
    assert any("MAX_OP_INPUTS" in b.reason for b in bad) and not any(
        "MAX_OP_INPUTS" in b.reason for b in unrulable_ops(graph))
