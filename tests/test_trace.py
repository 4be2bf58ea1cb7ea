"""Traces: regenerated on demand, bound to the committed states and log, identical on replay."""

from __future__ import annotations

import pytest

from protocol.cheats import TamperWeight
from vtrain.commit.trace import GraphCommitment, StepTrace, first_difference
from vtrain.graph.executor import state_tensors
from vtrain.graph.step_graph import OpKind
from vtrain.models.nn import GPTConfig
from vtrain.models.optim import AdamWConfig
from vtrain.training.loop import replay_steps, train_steps
from vtrain.training.spec import TrainSpec, build_job

SPEC = TrainSpec(
    model="gpt",
    optimizer=AdamWConfig(),
    batch_size=2,
    steps=3,
    gpt=GPTConfig(vocab=32, context=8, n_layer=1, n_head=2, d_model=16),
)


@pytest.fixture(scope="module")
def run():
    job = build_job(SPEC)
    outs = list(train_steps(job, state_tensors(job.initial_state), 1, 3, keep_trace=True))
    return job, outs


def test_trace_binds_to_the_committed_states_and_log(run) -> None:
    job, outs = run
    prev, cur = outs[1], outs[2]
    t = StepTrace.of(3, job.graph, cur.result)
    for op in job.graph.ops:
        if op.kind == OpKind.INPUT:
            assert t.op_roots[op.id] == prev.component_roots[op.attrs[0]]
        if op.kind == OpKind.OUTPUT:
            assert t.op_roots[op.id] == cur.component_roots[op.attrs[0]]
    assert t.log_tree.root == cur.log_root


def test_auditor_replay_regenerates_the_same_trace(run) -> None:
    job, outs = run
    logs = {o.step: o.log for o in outs}
    state = outs[1].state
    (rep,) = list(replay_steps(job, state, 3, 3, lambda s: logs[s], keep_trace=True))
    a = StepTrace.of(3, job.graph, outs[2].result)
    b = StepTrace.of(3, job.graph, rep.result)
    assert a.root == b.root
    assert first_difference(a, b) is None


def test_a_weight_tampered_after_the_step_leaves_the_trace_honest_and_breaks_one_bind(run) -> None:
    job, outs = run
    honest = StepTrace.of(3, job.graph, outs[2].result)
    cheat = TamperWeight(3, slot=1, index=0)
    (bad,) = list(train_steps(job, outs[1].state, 3, 3, cheat=cheat, keep_trace=True))
    t = StepTrace.of(3, job.graph, bad.result)
    assert first_difference(honest, t) is None  # the computation itself was honest
    differs = [i for i, (a, b) in enumerate(zip(bad.component_roots, outs[2].component_roots)) if a != b]
    assert differs == [1]  # only the tampered slot's commitment changed
    out_op = next(o for o in job.graph.ops if o.kind == OpKind.OUTPUT and o.attrs[0] == 1)
    assert t.op_roots[out_op.id] != bad.component_roots[1]  # the OUTPUT bind cannot be proven


def test_graph_commitment_puts_const_roots_in_the_descriptors(run) -> None:
    from vtrain.commit.roots import decode_op_descriptor, tensor_root

    job, _ = run
    gc = GraphCommitment.of(job.graph)
    assert len(gc.descriptors) == job.graph.n_ops
    for op_id, arr in job.graph.consts.items():
        kind, _inputs, _shape, _ins, attrs = decode_op_descriptor(gc.descriptors[op_id])
        assert kind == int(OpKind.CONST)
        assert attrs[0].to_bytes(32, "big") == tensor_root(arr)
