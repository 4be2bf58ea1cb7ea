"""The certified step loop's shortcuts (vtrain/graph/executor.py, vtrain/numerics/canonical.py,
vtrain/numerics/fp32_native.py): each gives the bits of the path it shortcuts, and falls back to
that path where its conditions do not hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_canonical import _case

from vtrain.graph import executor as E
from vtrain.graph.executor import StepExecutor, _compute_fp64
from vtrain.graph.step_graph import GraphBuilder, OpKind
from vtrain.numerics import canonical as C
from vtrain.numerics import fp32_native as F
from vtrain.numerics import native_rows

needs_native = pytest.mark.skipif(not (native_rows.available() and F.available()), reason="native kernels not built")


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.int32).numpy().tobytes()


def _log_bits(log) -> tuple[bytes, bytes, bytes]:
    return log.index.tobytes(), log.code.tobytes(), log.value.tobytes()


# -- canonical: the MATMUL plan, the SUM decisions, the shared empty log -----------------------------
@needs_native
@pytest.mark.parametrize("shapes", [
    [(6, 5), (4, 5)], [(6, 5), (4, 5), (4,)], [(2, 3, 6, 5), (2, 3, 4, 5)], [(2, 3, 6, 5), (2, 3, 4, 5), (4,)],
    [(6, 5), (4, 6)], [(2, 6, 5), (3, 4, 5)], [(6, 5), (4, 5), (5,)], [(6, 5), (4, 5), (1, 4)], [(6, 0), (4, 0)],
    [(0, 5), (4, 5)], [(5,), (5,)], [(2, 0, 6, 5), (2, 0, 4, 5)],
])
def test_matmul_plan_is_matmul_operands_of_those_shapes(shapes) -> None:
    """:func:`canonical.matmul_plan` takes the shapes that ``native_rows.matmul_operands`` takes, with its
    ``(batches, m, k, ncols)``; it refuses the others (then the trainer checks the tensors as before)."""
    ins = [torch.ones(s, dtype=torch.float32) for s in shapes]
    ok_mm = len(shapes[0]) >= 2 and len(shapes[1]) == len(shapes[0]) and shapes[0][-1] == shapes[1][-1]
    v = (torch.matmul(ins[0].double(), ins[1].double().transpose(-1, -2)) if ok_mm and shapes[0][:-2] == shapes[1][:-2]
         else torch.zeros((1,), dtype=torch.float64))
    ref = native_rows.matmul_operands(ins, v)
    plan = C.matmul_plan(shapes)
    assert (plan.shape if plan is not None else None) == ref


def _ties(rng: np.random.Generator, shape: tuple[int, ...], scale: int) -> torch.Tensor:
    """Small integers times a power of two: exact sums land on FP32 midpoints (candidates, entries)."""
    a = rng.integers(-3, 4, size=shape).astype(np.float32) * np.float32(2.0**scale)
    return torch.from_numpy(a)


@needs_native
def test_round_canonical_matmul_with_a_plan_has_the_same_bits() -> None:
    """With its :class:`canonical.MatmulPlan` a MATMUL rounds and logs as without it; a plan made for
    other sizes is not used (the operands are checked as before)."""
    rng = np.random.default_rng(7)
    logged = 0
    for _ in range(30):
        graph, op, ins = _case(OpKind.MATMUL, rng, "cancel")  # (ill-conditioned sums: entries)
        v0 = torch.matmul(ins[0].double(), ins[1].double().T)
        ref = C.round_canonical_matmul(graph, op, ins, v0.clone(), "op")
        plan = C.matmul_plan([graph.ops[i].shape for i in op.inputs])
        assert plan is not None
        got = C.round_canonical_matmul(graph, op, ins, v0.clone(), "op", plan)
        m, k = ins[0].shape
        wrong = C.matmul_plan([(m + 1, k), tuple(ins[1].shape), tuple(ins[2].shape)])  # (other sizes: not taken)
        other = C.round_canonical_matmul(graph, op, ins, v0.clone(), "op", wrong)
        for out in (got, other):
            assert _bits(out[0]) == _bits(ref[0]) and _log_bits(out[1]) == _log_bits(ref[1]) and out[2] == ref[2]
        logged += len(ref[1])
    assert logged  # (the cases do log entries)


@needs_native
def test_round_canonical_sum_decides_its_candidates_as_round_canonical() -> None:
    """A SUM/MEAN's candidates settled by ``native_rows.decide_into`` first (the common case) give what
    :func:`canonical.round_canonical` gives from the FP64 values and their bound (a function of the
    exact sums alone)."""
    rng = np.random.default_rng(11)
    cands = 0
    for case in range(40):
        kind = OpKind.SUM if case % 2 else OpKind.MEAN
        g = GraphBuilder()
        x = g.input("x", (8, int(rng.integers(2, 50))))
        y = g.sum(x) if kind == OpKind.SUM else g.mean(x)
        graph = g.build(g.sum(g.reshape(y, (1, 8))))
        op = graph.ops[y.op]
        ins = [_ties(rng, graph.ops[x.op].shape, int(rng.integers(-3, 12)))]
        got = C.round_canonical_sum(graph, op, ins, "op")
        assert got is not None
        v, d = _compute_fp64(op, ins, "tight")
        ref = C.round_canonical(graph, op, ins, v, d, "op")
        assert _bits(got[0]) == _bits(ref[0]) and _log_bits(got[1]) == _log_bits(ref[1])
        assert tuple(got[0].shape) == tuple(op.shape)
        cands += int(len(C.NF.sum_round_filter(ins[0], kind == OpKind.MEAN,
                                               C.sum_bound_factor(kind, ins[0].shape[-1]), C._BAND)[1]))
    assert cands  # (the cases do have candidates)


def test_the_shared_empty_log_cannot_be_written() -> None:
    """The trainer's ops without entries share one empty log: its arrays are read-only."""
    log = C._NO_ENTRIES
    assert len(log) == 0
    for a in (log.index, log.code, log.value):
        with pytest.raises(ValueError):
            a.resize(1)


# -- fp32_native.Chain: the scalars bound once -------------------------------------------------------
@pytest.mark.skipif(F._CHAIN is None, reason="native kernels not built")
def test_a_chains_bound_scalars_are_those_passed_as_inputs() -> None:
    """A chain with its scalars bound (``consts``) gives the bits of the same chain given them with
    every call; a scalar the kernel cannot read (not FP32) makes every call decline (None)."""
    shape = (4, 5)
    inputs = [(shape, F.FULL, 20), ((), F.SCALAR, 1), ((), F.SCALAR, 1)]
    steps = [(F.MUL, 0, 1), (F.ADD, 3, 2), (F.DIV, 4, 0)]
    a = torch.randn(shape)
    c1, c2 = torch.tensor(3.0), torch.tensor(-0.5)
    free = F.Chain(shape, inputs, steps, [4, 5])
    bound = F.Chain(shape, inputs, steps, [4, 5], consts=(c1, c2))
    (r4, r5), ok = free([a, c1, c2])
    (g4, g5), ok2 = bound([a])
    assert ok and ok2 and _bits(g4) == _bits(r4) and _bits(g5) == _bits(r5)
    assert F.Chain(shape, inputs, steps, [4], consts=(c1, c2.double()))([a]) is None
    with pytest.raises(ValueError):
        bound([a, c1])


# -- the executor's plan: SLICE inline, OUTPUT/RESHAPE to the same shape passed on, MATMUL's plan ----
def test_the_plan_passes_same_shape_outputs_and_inlines_slices() -> None:
    """A SLICE runs inline from its planned ``(axis, start, length)`` (a view where it is contiguous, a
    copy where not); an OUTPUT to its input's own shape passes the input on (``_PLAN_SAME``), one to
    another shape reshapes; the state is the slices' bits, with and without a trace."""
    g = GraphBuilder()
    x = g.input("x", (4, 6))
    s0 = g.input("s0", (2, 6))
    for k, shape in enumerate([(4, 3), (12,), (3, 4)], start=1):
        g.input(f"s{k}", shape)
    g.output(g.slice(x, 0, 1, 2), 1)  # rows: contiguous
    g.output(g.slice(x, 1, 2, 3), 2)  # columns: a copy
    g.output(g.slice(g.reshape(x, (24,)), 0, 5, 12), 3)  # flat
    g.output(g.slice(g.reshape(x, (24,)), 0, 0, 12), 4)  # flat, to the slot's (3, 4): a reshape
    g.output(g.mul_s(x, 2.0), 0)
    graph = g.build(g.sum(g.reshape(g.add(s0, s0), (1, 12))))
    ex = StepExecutor(graph, "certified")
    cls = {p.op.id: p.cls for p in ex._plan}
    slices = [op for op in graph.ops if op.kind == OpKind.SLICE]
    assert slices and all(cls[op.id] == E._PLAN_SLICE for op in slices)
    outs = {op.attrs[0]: cls[op.id] for op in graph.ops if op.kind == OpKind.OUTPUT}
    assert outs == {0: E._PLAN_SAME, 1: E._PLAN_SAME, 2: E._PLAN_SAME, 3: E._PLAN_SAME, 4: E._PLAN_RESHAPE}
    xs = torch.arange(24, dtype=torch.float32).reshape(4, 6) - 7.5
    state = [xs, torch.zeros(2, 6), torch.zeros(4, 3), torch.zeros(12), torch.zeros(3, 4)]
    for trace in (False, True):
        res = ex.run(state, torch.zeros(graph.data_shape), step=1, keep_trace=trace)
        want = [xs * 2.0, xs[1:3], xs[:, 2:5], xs.reshape(-1)[5:17], xs.reshape(-1)[:12].reshape(3, 4)]
        for t, w in zip(res.state, want, strict=True):
            assert t.shape == w.shape and t.is_contiguous() and _bits(t) == _bits(w)


@needs_native
def test_the_plan_gives_each_canonical_matmul_its_plan() -> None:
    """The canonical trainer's MATMULs carry their :func:`canonical.matmul_plan` (on the CPU)."""
    g = GraphBuilder()
    a, b = g.input("a", (6, 5)), g.input("b", (4, 5))
    y = g.matmul(a, b)
    graph = g.build(g.sum(g.reshape(y, (1, 24))))
    ex = StepExecutor(graph, "certified")
    step = next(p for p in ex._plan if p.op.id == y.op)
    assert step.cls == E._PLAN_MATMUL and step.args == (C.matmul_plan([(6, 5), (4, 5)]),)
    assert step.args[0].shape == (1, 6, 5, 4)


def test_concat_flat_takes_parts_of_any_shape() -> None:
    """A CONCAT's parts are not flattened first (:func:`executor._flat_parts`): back to back in one buffer
    they are that range of it whatever their shapes, else the copy of their elements in order."""
    buf = torch.arange(12, dtype=torch.float32)
    parts = [buf[0:6].view(2, 3), buf[6:6], buf[6:10].view(4, 1), buf[10:12]]
    got = E.concat_flat(E._flat_parts([parts[:2], parts[2], parts[3]]))
    assert got.shape == (12,) and got.data_ptr() == buf.data_ptr() and torch.equal(got, buf)
    square = torch.arange(9, dtype=torch.float32).view(3, 3)
    for spoiled in ([buf[0:6].view(2, 3), buf[7:10].view(3, 1)], [square.T, torch.arange(9.0, 12.0)],
                    [buf[0:6].view(3, 2), torch.arange(6.0, 12.0).view(2, 3)]):
        out = E.concat_flat(spoiled)
        assert torch.equal(out, torch.cat([t.reshape(-1) for t in spoiled])) and out.data_ptr() != buf.data_ptr()


def test_slices_cutting_one_value_take_pieces_of_one_split() -> None:
    """Several SLICEs of one value along one axis, not overlapping (in any order, with gaps), take
    their pieces of one ``tensor_split``: the bits of each one's ``narrow`` (a copy where not
    contiguous), with and without a trace; overlapping ones keep their own ``narrow``."""
    g = GraphBuilder()
    x = g.input("x", (20,))
    m = g.input("m", (3, 8))
    for k, shape in enumerate([(4,), (6,), (5,), (3, 3), (3, 2), (3, 4), (3, 6)]):
        g.input(f"s{k}", shape)
    flat = g.mul_s(x, 3.0)
    g.output(g.slice(flat, 0, 9, 6), 3)  # (graph order: not the buffer's)
    g.output(g.slice(flat, 0, 2, 4), 2)
    g.output(g.slice(flat, 0, 15, 5), 4)
    g.output(g.slice(m, 1, 0, 3), 5)  # columns: copies, cut once
    g.output(g.slice(m, 1, 6, 2), 6)
    g.output(g.slice(m, 1, 2, 4), 7)
    g.output(g.slice(m, 1, 1, 6), 8)  # (overlaps the others: its own narrow, and theirs too)
    g.output(flat, 0)
    g.output(m, 1)
    graph = g.build(g.sum(g.reshape(x, (1, 20))))
    ex = StepExecutor(graph, "certified")
    args = {p.op.id: p.args for p in ex._plan if p.op.kind == OpKind.SLICE}
    cut = [a for a in args.values() if len(a) == 7]
    assert len(cut) == 3 and sum(a[6] for a in cut) == 1 and {a[5] for a in cut} == {(2, 6, 9, 15)}
    assert all(len(a) == 3 for a in args.values() if a[1] in (0, 1, 6))  # (m's columns overlap: not cut)
    xs = torch.arange(20, dtype=torch.float32) - 4.5
    ms = torch.arange(24, dtype=torch.float32).reshape(3, 8) * 0.5
    state = [xs, ms] + [torch.zeros(shape) for shape in [(4,), (6,), (5,), (3, 3), (3, 2), (3, 4), (3, 6)]]
    fl = xs * 3.0
    want = [fl, ms, fl[2:6], fl[9:15], fl[15:20], ms[:, 0:3], ms[:, 6:8], ms[:, 2:6], ms[:, 1:7]]
    for trace in (False, True):
        res = ex.run(state, torch.zeros(graph.data_shape), step=1, keep_trace=trace)
        for t, w in zip(res.state, want, strict=True):
            assert t.shape == w.shape and t.is_contiguous() and _bits(t) == _bits(w)
