"""Data-parallel edge cases of the batch axis.

- A MAX whose reduced axis runs over the batch, longer than one ruling reads (``MAX_ROW_ELEMENTS``):
  the builder lowers it as a tree that slices, pads and reshapes that axis (``GraphBuilder._row_tree``),
  which moves entries between samples; the sharding plan all-gathers the row where the tree starts
  (``ShardingPlan.gather_inputs``), so the tree runs replicated, bit-identical to one process.
- A SUM over the batch next to the FP32 overflow threshold is decided on its exact value on every
  rank, as in one process (``Collective._round``).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from test_distributed import AdversarialCombiner, _Group  # noqa: E402 (the in-process ranks)

from vtrain.distributed.collective import Collective
from vtrain.distributed.sharding import analyse, shards
from vtrain.graph.executor import StepExecutor
from vtrain.graph.step_graph import MAX_ROW_ELEMENTS, GraphBuilder, OpKind
from vtrain.numerics.logfile import encode_step_log
from vtrain.numerics.rounding import Mode


def _net(batch: int, max_row: int = MAX_ROW_ELEMENTS, width: int = 2):
    """``loss = max over the batch of sum_k data[b, k] * w[k]``, differentiable (the MAX_GRAD tree)."""
    g = GraphBuilder(max_row=max_row)
    w = g.input("w", (1, width))
    h = g.sum(g.mul(g.data((batch, width)), w))  # (batch, 1), sharded on axis 0
    m = g.max(g.reshape(h, (1, batch)), differentiable=True)  # the batch is the reduced axis
    loss = g.mean(m)
    (dw,) = g.grad(loss, [w])
    g.output(g.sub(w, dw), 0)
    return g.build(loss)


def test_a_max_over_more_batch_entries_than_one_ruling_reads_has_a_plan() -> None:
    for batch in (MAX_ROW_ELEMENTS + 1, 3 * MAX_ROW_ELEMENTS):  # padded and unpadded trees
        graph = _net(batch)
        assert any(op.kind == OpKind.MAX and graph.in_shapes(op)[0][-1] < batch for op in graph.ops)
        plan = analyse(graph)
        assert plan.gather_inputs, batch
        assert not any(graph.ops[i].kind == OpKind.MAX for i in plan.reductions)


def _run_ranks(graph, world: int, state, data, step: int = 1):
    plan = analyse(graph)
    group = _Group(world)
    out: list = [None] * world
    errors: list = [None] * world

    def body(r: int) -> None:
        try:
            shard = shards(data.shape[0], world)[r]
            coll = Collective(plan, shard, AdversarialCombiner(group, r, 0))
            ex = StepExecutor(plan.local_graph(shard), Mode.CERTIFIED, collective=coll)
            res = ex.run([s.clone() for s in state], data[shard.start : shard.start + shard.size], step=step)
            out[r] = (res.state, res.loss, coll.global_log(res.log))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors[r] = e
            group.barrier.abort()

    ts = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
    if first is not None:
        raise first
    return out


@pytest.mark.parametrize("batch,world", [(13, 2), (12, 3), (16, 4), (9, 3)])
def test_the_gathered_tree_trains_bit_identically_to_one_process(batch: int, world: int) -> None:
    graph = _net(batch, max_row=4)  # the same tree as at 16,384, at a size threads run quickly
    rng = np.random.default_rng(batch)
    data = torch.from_numpy(rng.standard_normal((batch, 2)).astype(np.float32))
    data[1] = data[batch - 2] = torch.tensor([4.0, -4.0])  # the maximum twice, on two ranks
    state = [torch.from_numpy(np.array([[0.5, -1.25]], np.float32))]
    assert analyse(graph).gather_inputs  # the tree starts on the batch-sharded row
    want = StepExecutor(graph, Mode.CERTIFIED).run([s.clone() for s in state], data, step=1)
    for st, loss, log in _run_ranks(graph, world, state, data):
        assert loss == want.loss
        assert encode_step_log(log, 1, graph) == encode_step_log(want.log, 1, graph)
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(st, want.state, strict=True))


@pytest.mark.parametrize("world", [2, 3])
def test_a_batch_sum_next_to_the_fp32_overflow_threshold_is_decided_on_its_exact_value(world: int) -> None:
    """A SUM over the batch whose exact value is within an FP64 ulp of 2^128 - 2^103: a rank's
    all-reduced v may round onto the threshold (RN32(v) = inf) while RN32(e) = FLT_MAX; the ranks
    decide it on e, as one process does (before: NonFiniteValue on the ranks whose v overflowed).
    Past the threshold every rank raises NonFiniteValue."""
    from vtrain.errors import NonFiniteValue

    fmax = float(np.finfo(np.float32).max)
    for terms, ok in (([fmax, 2.0**103, -(2.0**50), 0.0, 0.0, 0.0], True), ([fmax, 2.0**103, 2.0**50, 0.0], False)):
        batch = len(terms)
        g = GraphBuilder()
        w = g.input("w", (1, 1))
        s = g.sum(g.reshape(g.mul(g.data((batch, 1)), w), (1, batch)))  # the batch is the summed axis
        g.output(w, 0)
        graph = g.build(g.mean(g.mul(s, g.const(np.full((1, 1), 2.0**-120, np.float32), "scale"))))
        data = torch.tensor([[t] for t in terms], dtype=torch.float32)
        state = [torch.ones((1, 1), dtype=torch.float32)]
        assert any(graph.ops[i].kind == OpKind.SUM for i in analyse(graph).reductions)
        if not ok:
            with pytest.raises(NonFiniteValue):
                StepExecutor(graph, Mode.CERTIFIED).run([t.clone() for t in state], data, step=1)
            with pytest.raises(NonFiniteValue, match="expected finite values"):
                _run_ranks(graph, world, state, data)
            continue
        want = StepExecutor(graph, Mode.CERTIFIED).run([t.clone() for t in state], data, step=1)
        assert want.loss == float(np.float32(np.float32(fmax) * np.float32(2.0**-120)))
        for _, loss, log in _run_ranks(graph, world, state, data):
            assert loss == want.loss
            assert encode_step_log(log, 1, graph) == encode_step_log(want.log, 1, graph)
