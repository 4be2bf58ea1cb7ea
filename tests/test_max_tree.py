"""A MAX / MAX_GRAD row longer than ``MAX_ROW_ELEMENTS`` (= ``Adjudicator.MAX_ROW``) is built as a tree
of MAX ops over chunks (``GraphBuilder.max``, ``max_grad``): bit-identical to the one-level op (forward,
``max_grad`` and autodiff), every op rulable, a cheat on a tree op caught by the real Adjudicator;
full-vocabulary HF GPT-2 passes ``protocol.rulability``; graphs with short rows do not change."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from protocol import rulability as R
from vtrain.commit.trace import op_descriptors
from vtrain.errors import GraphError
from vtrain.graph.executor import _move
from vtrain.graph.step_graph import MAX_CONCAT_INPUTS, MAX_ROW_ELEMENTS, Graph, GraphBuilder, OpKind
from vtrain.numerics import exact as X

ROOT = Path(__file__).resolve().parents[1]
L = 8  # the tests' row limit
ONE_LEVEL = 10**9  # a limit no row reaches: the one-level ops
ROWS = 3


def test_the_row_limit_is_the_adjudicators() -> None:
    src = (ROOT / "contracts" / "Adjudicator.sol").read_text()
    (value,) = re.findall(r"uint256 public constant MAX_ROW = ([0-9_]+);", src)
    assert int(value.replace("_", "")) == MAX_ROW_ELEMENTS == R.MAX_ROW_ELEMENTS
    with pytest.raises(GraphError, match="at least 2, got 1"):
        GraphBuilder(max_row=1)


def _values(op, outs: list) -> np.ndarray:
    return outs[op].numpy().view(np.uint32) if isinstance(outs[op], torch.Tensor) else outs[op].view(np.uint32)


def _run_torch(graph: Graph, inputs: list[np.ndarray]) -> list[torch.Tensor]:
    """Every op of a graph of exact kinds, by the executor's FP32 data-movement code."""
    outs: list[torch.Tensor] = []
    for op in graph.ops:
        if op.kind == OpKind.INPUT:
            outs.append(torch.from_numpy(inputs[op.attrs[0]]))
        elif op.kind == OpKind.CONST:
            outs.append(torch.from_numpy(graph.consts[op.id]))
        else:
            outs.append(_move(op, [outs[i] for i in op.inputs]))
    return outs


def _run_exact(graph: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Every op of the graph by the chain's reference semantics (:mod:`vtrain.numerics.exact`)."""
    descs = op_descriptors(graph)
    outs: list[np.ndarray] = []
    for op, desc in zip(graph.ops, descs, strict=True):
        if op.kind == OpKind.INPUT:
            outs.append(inputs[op.attrs[0]])
            continue
        if op.kind == OpKind.CONST:
            outs.append(graph.consts[op.id])
            continue
        d = X.OpDesc.of(desc)
        ins = [outs[i] for i in op.inputs]
        vals = [X.rn32(X.exact_value(d, ins, i)) for i in range(op.numel)]
        outs.append(np.array(vals, np.uint32).view(np.float32).reshape(op.shape))
    return outs


def _graph(limit: int, n: int) -> tuple[Graph, dict[str, int]]:
    """``max(x)``, ``max_grad(x, g)`` and the autodiff gradient of ``max(max(x))`` w.r.t. ``x``."""
    g = GraphBuilder(max_row=limit)
    x = g.input("x", (ROWS, n))
    gin = g.input("g", (ROWS, 1))
    m = g.max(x, differentiable=True)
    mg = g.max_grad(x, gin)
    loss = g.max(g.reshape(m, (1, ROWS)), differentiable=True)
    (dx,) = g.grad(loss, [x])
    return g.build(loss), {"max": m.op, "max_grad": mg.op, "grad": dx.op}


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows full of ties (across chunks too): a few values, +-0 and -FLT_MAX among them; row 1 has its
    maximum at element 0 only (what the padding copies); row 2 ties +0 and -0 as its maximum."""
    big = np.finfo(np.float32).max
    x = rng.choice(np.array([-2.0, -1.0, 0.0, -0.0, 1.0, 3.0, -big], np.float32), (ROWS, n))
    x[0, rng.integers(0, n, 3)] = np.float32(3.0)
    x[1] = np.minimum(x[1], -1.0)  # all negative: padding by +0 would be the maximum
    x[1, 0] = np.float32(-0.5)
    x[2] = np.where(x[2] > 0, np.float32(-0.0), x[2])
    x[2, rng.integers(0, n, 2)] = np.float32(0.0)
    return x


@pytest.mark.parametrize("n", [L - 1, L, L + 1, 3 * L + 5, 2 * L, MAX_CONCAT_INPUTS * L + 3 * L + 1, L * L + 1])
def test_a_long_row_is_a_tree_bit_identical_to_one_max(n: int) -> None:
    rng = np.random.default_rng(n)
    x = _rows(rng, n)
    gin = np.array([[-0.0], [-2.5], [1.5]], np.float32)  # -0 must pass unchanged (no ADD)
    tree, ids = _graph(L, n)
    flat, fids = _graph(ONE_LEVEL, n)
    for run in (_run_torch, _run_exact):
        got, want = run(tree, [x, gin]), run(flat, [x, gin])
        for key in ids:
            assert np.array_equal(_values(ids[key], got), _values(fids[key], want)), (run.__name__, key)
    # the autodiff gradient is the one-level first-maximum rule: one non-zero (+1 from dloss) per graph
    dx = _values(ids["grad"], _run_torch(tree, [x, gin]))
    assert np.count_nonzero(dx) == 1
    rows = [R.row_length(tree, op) for op in tree.ops if op.kind in (OpKind.MAX, OpKind.MAX_GRAD)]
    assert max(r for r, _ in rows) <= L
    kinds = [op.kind for op in tree.ops]
    if n <= L:  # a short row: the graph is the one-level one
        assert [op.kind for op in flat.ops] == kinds and op_descriptors(flat) == op_descriptors(tree)
    else:
        assert kinds.count(OpKind.MAX) > 2 and OpKind.ADD not in kinds and OpKind.CONCAT not in kinds
    assert R.unrulable_ops(tree) == []


def test_the_tree_shape() -> None:
    """``n = 3L + 5``: 4 chunks of 8 (padded by 3 copies of element 0); ``n = 2L``: no padding."""
    g = GraphBuilder(max_row=L)
    m = g.max(g.input("x", (2, 3 * L + 5)))
    kinds = [op.kind for op in g.ops[1 : m.op + 1]]
    assert kinds == [OpKind.SLICE, OpKind.CONST, OpKind.PAD, OpKind.SELECT, OpKind.RESHAPE, OpKind.MAX,
                     OpKind.RESHAPE, OpKind.MAX]
    assert g.ops[m.op - 2].shape == (2, 4, 1) and m.op in g.no_grad
    g2 = GraphBuilder(max_row=L)
    m2 = g2.max(g2.input("x", (2, 2 * L)))
    assert [op.kind for op in g2.ops[1 : m2.op + 1]] == [OpKind.RESHAPE, OpKind.MAX, OpKind.RESHAPE, OpKind.MAX]


def test_full_vocabulary_gpt2_is_rulable() -> None:
    """HF GPT-2 at 50,257 tokens: the cross-entropy's row max is a tree (4 chunks of 12,565), every
    op is rulable; with the one-level MAX it is refused (so the test can fail)."""
    transformers = pytest.importorskip("transformers")
    import torch.nn.functional as F

    from vtrain.frontend import TorchTask, capture

    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=4, n_embd=8, n_layer=1, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    toks = np.random.default_rng(1).integers(0, 50257, (2, 5))
    task = TorchTask(model, lambda out, t: F.cross_entropy(out.logits.flatten(0, 1), t.flatten()),
                     {"name": "SGD", "lr": 0.01}, [toks[:, :4]], toks[:, 1:])
    cap = capture(task, 2)
    R.check_rulable(cap.graph)
    rows = [R.row_length(cap.graph, op)[0] for op in cap.graph.ops if op.kind in (OpKind.MAX, OpKind.MAX_GRAD)]
    assert 12_565 in rows and max(rows) <= MAX_ROW_ELEMENTS
    long = next(op for op in cap.graph.ops if op.kind == OpKind.MAX and R.row_length(cap.graph, op)[0] == 12_565)
    g = GraphBuilder()  # the same row as one MAX: refused
    t = g.max(g.input("logits", (8, 50257)))
    one = GraphBuilder(max_row=ONE_LEVEL)
    t1 = one.max(one.input("logits", (8, 50257)))
    assert [b.reason for b in R.unrulable_ops(one.build(t1))][0].startswith("a row of 50,257 elements")
    assert R.unrulable_ops(g.build(t)) == [] and cap.graph.in_shapes(long)[0][-2:] == (4, 12_565)


# --- a dispute on a tree op, ruled by the real Adjudicator ---------------------------------------------
def _long_row_net(batch: int = 2, n: int = 3 * L + 5):
    """``w + data``, its row max over ``n = 3L + 5`` elements as a tree (limit ``L``), its gradient
    (the tree's MAX_GRAD) in the update; the state is the updated ``w``."""
    import graph_games as G

    g = GraphBuilder(max_row=L)
    w = g.input("w", (batch, n))
    h = g.add(w, g.data((batch, n)))
    m = g.max(h, differentiable=True)
    loss = g.mean(g.reshape(m, (1, batch)))
    (dw,) = g.grad(loss, [w])
    g.output(g.sub(w, g.mul_s(dw, 2.0**-4)), 0)
    graph = g.build(loss)
    ops = graph.ops
    ids = {
        "chunk-max": next(o.id for o in ops if o.kind == OpKind.MAX and graph.in_shapes(o)[0] == (batch, 4, L)),
        "chunk-max-grad": next(o.id for o in ops if o.kind == OpKind.MAX_GRAD and o.shape == (batch, 4, L)),
        "pad-select": next(o.id for o in ops if o.kind == OpKind.SELECT),
    }
    rng = np.random.default_rng(4)
    dataset = rng.standard_normal((9, n)).astype(np.float32)
    return G.GameGraph(graph, dataset, [rng.standard_normal((batch, n)).astype(np.float32)], ids)


@pytest.mark.parametrize("target,element,value", [
    ("chunk-max", 1, 100.0),  # row 0's chunk 1 maximum becomes the row's
    ("chunk-max-grad", 0, None),  # a gradient where the first maximum is not
    ("pad-select", 30, 100.0),  # a padding copy becomes the maximum
])
def test_a_cheat_on_a_tree_op_is_caught_by_the_adjudicator(target: str, element: int, value: float | None) -> None:
    import game_harness as H
    import graph_games as G

    gg = _long_row_net()
    assert R.unrulable_ops(gg.graph) == []
    n_steps, interval, step = 2, 1, 2
    cfg = G.job_config(gg, n_steps, interval)
    edit = G.add(0.5) if value is None else (lambda bits: X.bits_of(value))
    cheat = G.OpCheat(step, gg.ops[target], element, edit)
    honest, bad = G.real_run(gg, cfg), G.real_run(gg, cfg, cheat)
    assert honest.interval_roots[step - 1] != bad.interval_roots[step - 1], "the cheat must reach the state"
    dep = H.deploy(adjudicator="Adjudicator")
    job = H.active_job(dep, bad)
    gid = H.challenge(dep, job, step - 1)
    res = G.play_real(dep, gid, G.ProvingTrainer(dep, bad, gg.dataset), G.ProvingChallenger(dep, honest, gg.dataset))
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.ADJUDICATED), res
    (op,) = dep.events(dep.game, "OpOpened", game=gid)
    (picked,) = dep.events(dep.game, "ElementPicked", game=gid)
    assert (op.op, picked.index) == (cheat.op, cheat.element)
    assert dep.job_status(job) == H.JobStatus.FRAUDULENT


def test_the_tree_shards_over_the_batch_like_one_max() -> None:
    """Data-parallel training: the tree cuts, pads and reshapes only the reduced (per-sample) axis, so
    a batch-sharded long row has a sharding plan (CONCAT of chunk maxima would have none)."""
    from vtrain.distributed.sharding import analyse

    def net(limit: int) -> Graph:
        g = GraphBuilder(max_row=limit)
        w = g.input("w", (1, 3 * L + 5))
        m = g.max(g.mul(g.data((4, 3 * L + 5)), w), differentiable=True)
        loss = g.mean(g.reshape(m, (1, 4)))
        (dw,) = g.grad(loss, [w])
        g.output(g.sub(w, dw), 0)
        return g.build(loss)

    assert len(analyse(net(L)).reductions) == len(analyse(net(ONE_LEVEL)).reductions) > 0


def test_a_vocabulary_wide_row_at_the_real_limit_is_bit_identical() -> None:
    """50,257 (GPT-2's vocabulary) at ``MAX_ROW_ELEMENTS``: 4 chunks of 12,565, by the executor's code."""
    n = 50_257
    x = _rows(np.random.default_rng(7), n)
    gin = np.array([[-0.0], [-2.5], [1.5]], np.float32)
    tree, ids = _graph(MAX_ROW_ELEMENTS, n)
    flat, fids = _graph(ONE_LEVEL, n)
    got, want = _run_torch(tree, [x, gin]), _run_torch(flat, [x, gin])
    for key in ids:
        assert np.array_equal(_values(ids[key], got), _values(fids[key], want)), key
    assert any(op.shape[-2:] == (4, 12_565) for op in tree.ops) and R.unrulable_ops(tree) == []
