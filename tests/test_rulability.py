"""protocol/rulability.py: the one check that a job's ops can be ruled on-chain (op kinds the
deployed contracts rule, reductions within ExactSum.MAX_TERMS), tied to contracts/lib/OpKinds.sol
and to the deployed Adjudicator; the batch-70,000 MLP is refused naming its op, kind, terms, limit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from revert_helpers import error_table, revert_data
from test_adjudicator import CALL_GAS, Case, claim_tuple, deploy_adjudicator, op_leaves_pair

from protocol.proofs import encode_proof
from protocol.rulability import (
    ADJUDICATED_KINDS,
    GAME_BOUND_KINDS,
    MAX_REDUCTION_TERMS,
    RULED_KINDS,
    UnrulableJob,
    check_rulable,
    unrulable_ops,
)
from vtrain.graph.step_graph import Graph, GraphBuilder, OpKind, OpNode
from vtrain.numerics import exact
from vtrain.training.spec import TrainSpec, build_job

OPKINDS_SOL = Path(__file__).resolve().parent.parent / "contracts" / "lib" / "OpKinds.sol"


def solidity_kinds() -> dict[str, int]:
    """``uint8 internal constant NAME = N;`` of contracts/lib/OpKinds.sol."""
    found = re.findall(r"uint8\s+internal\s+constant\s+(\w+)\s*=\s*(\d+)\s*;", OPKINDS_SOL.read_text())
    return {name: int(v) for name, v in found}


def test_the_ruled_kinds_are_the_kinds_of_OpKinds_sol():
    sol = solidity_kinds()
    assert sol == {k.name: int(k) for k in OpKind}  # one numbering in both languages
    assert {OpKind[n] for n in sol} == RULED_KINDS  # every kind the contracts know is ruled, no other
    assert GAME_BOUND_KINDS - ADJUDICATED_KINDS == {OpKind.INPUT, OpKind.CONST}


@pytest.fixture(scope="module")
def adj():
    a = deploy_adjudicator()
    return a, error_table(a.abi)


@pytest.mark.parametrize("kind", [*OpKind, 99], ids=lambda k: getattr(k, "name", str(k)))
def test_the_deployed_adjudicator_rules_exactly_the_adjudicated_kinds(adj, kind):
    """Each kind on the real Adjudicator: `UnsupportedOp` exactly for the kinds not in
    ADJUDICATED_KINDS (the game binds INPUT and CONST itself; 99 is no kind). A kind it rules gets
    past the dispatch (then fails on this bogus claim's inputs, or rules)."""
    a, table = adj
    s = (1,)
    c = Case(exact.OpDesc(int(kind), (), s, (), ()), ())
    proof = encode_proof([], (0, 2, op_leaves_pair(), []))
    try:
        a.functions.adjudicate(claim_tuple(c, 0, 0, []), proof).call({"gas": CALL_GAS})
        error = None
    except Exception as e:  # noqa: BLE001 - the provider's exception types vary
        got = table.get(revert_data(e)[:4])
        error = got[0] if got else "other"
    assert (error == "UnsupportedOp") == (kind not in ADJUDICATED_KINDS), error


def test_the_demo_jobs_are_rulable():
    for spec in (TrainSpec(), TrainSpec(model="gpt", batch_size=4)):
        assert unrulable_ops(build_job(spec).graph) == []


def test_a_batch_of_70000_on_the_mlp_is_refused_naming_the_op_its_terms_and_the_limit():
    """The real spec and graph builder (no training): the weight-gradient MATMULs and the loss MEAN
    reduce over the batch, far beyond the chunk level's 65,536 terms."""
    graph = build_job(TrainSpec(batch_size=70_000)).graph
    bad = unrulable_ops(graph)
    assert bad, "a 70,000-term reduction must be refused"
    for u in bad:
        assert u.kind in ("MATMUL", "SUM", "MEAN")
        assert graph.ops[u.op].kind.name == u.kind
    first = bad[0]
    with pytest.raises(UnrulableJob) as info:
        check_rulable(graph)
    msg = str(info.value)
    assert f"op {first.op} ({first.kind})" in msg and "65,536" in msg and "ExactSum.MAX_TERMS" in msg
    assert re.search(r"a reduction of [\d,]+ terms", msg)
    assert {"700,000", "70,000"} & set(re.findall(r"[\d,]{6,}", " ".join(str(u) for u in bad)))
    assert f"and {len(bad) - 1} more" in msg


def _matmul_graph(k: int, bias: bool) -> Graph:
    g = GraphBuilder()
    a = g.input("a", (1, k))
    b = g.input("b", (1, k))
    out = g.matmul(a, b, g.input("bias", (1,)) if bias else None)
    return g.build(g.sum(out))


@pytest.mark.parametrize(
    "k,bias,ok",
    [(MAX_REDUCTION_TERMS, False, True), (MAX_REDUCTION_TERMS + 1, False, False),
     (MAX_REDUCTION_TERMS - 1, True, True), (MAX_REDUCTION_TERMS, True, False)],
)
def test_matmul_terms_are_K_plus_one_with_a_bias_and_the_limit_is_inclusive(k, bias, ok):
    bad = unrulable_ops(_matmul_graph(k, bias))
    assert (bad == []) == ok, bad
    if not ok:
        assert bad[0].kind == "MATMUL" and f"{MAX_REDUCTION_TERMS + 1:,} terms" in str(bad[0])


def test_an_op_kind_the_adjudicator_lacks_is_refused():
    graph = build_job(TrainSpec()).graph
    op = graph.ops[5]
    graph.ops[5] = OpNode(op.id, 99, op.inputs, op.shape, op.attrs, "new-kind")  # type: ignore[arg-type]
    (bad,) = unrulable_ops(graph)
    assert (bad.op, bad.kind) == (5, "99") and "no rule for this op kind" in str(bad)
    with pytest.raises(UnrulableJob, match=r"op 5 \(99 'new-kind'\): the deployed Adjudicator has no rule"):
        check_rulable(graph)



# ------------------------------------------------------------------ rows read whole by one ruling

import numpy as np  # noqa: E402

from protocol.rulability import MAX_ROW_ELEMENTS, MAX_SAMPLE_ELEMENTS, row_length  # noqa: E402

WIDE_MODEL = '''
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class RowMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x.amax(dim=-1, keepdim=True) * self.w


def task(width: int = 20000):
    from vtrain.frontend import TorchTask

    x = np.random.default_rng(0).standard_normal((8, width)).astype(np.float32)
    return TorchTask(RowMax(), F.mse_loss, {"name": "SGD", "lr": 0.1}, [x], x.max(axis=1, keepdims=True))
'''


def test_row_limits_are_the_deployed_adjudicators(adj):
    a, _ = adj
    assert a.functions.MAX_ROW().call() == MAX_ROW_ELEMENTS
    assert a.functions.MAX_SAMPLE().call() == MAX_SAMPLE_ELEMENTS


def _row_graph(kind: str, n: int, max_row: int = 10**9) -> Graph:
    """One op reading a row of ``n`` (by default one MAX / MAX_GRAD over it, as a graph built by
    other tools may have it; vtrain's default builder cuts it into a tree at ``MAX_ROW_ELEMENTS``)."""
    g = GraphBuilder(max_row=max_row)
    if kind == "DATA":
        x = g.data((2, n))
        return g.build(g.sum(g.reshape(g.sum(x), (1, 2))))
    w = g.input("w", (2, n))
    m = g.max(w, differentiable=kind == "MAX_GRAD")
    loss = g.sum(g.reshape(m, (1, 2)))
    grads = g.grad(loss, [w]) if kind == "MAX_GRAD" else []
    for slot, t in enumerate(grads):
        g.output(t, slot)
    return g.build(loss, {i: gr.op for i, gr in enumerate(grads)})


@pytest.mark.parametrize("kind,limit", [("MAX", MAX_ROW_ELEMENTS), ("MAX_GRAD", MAX_ROW_ELEMENTS),
                                        ("DATA", MAX_SAMPLE_ELEMENTS)])
def test_a_row_longer_than_one_ruling_can_read_is_refused_naming_the_op_and_the_limit(kind, limit):
    """MAX / MAX_GRAD rows and DATA samples are read whole by one ruling: at the limit the job is
    rulable, one element past it it is refused (op, kind, length, limit, the gas cap)."""
    assert [u for u in unrulable_ops(_row_graph(kind, limit)) if u.kind == kind] == []
    bad = [u for u in unrulable_ops(_row_graph(kind, limit + 1)) if u.kind == kind]
    assert len(bad) == 1, bad
    msg = str(bad[0])
    const = "MAX_SAMPLE" if kind == "DATA" else "MAX_ROW"
    assert f"({kind}" in msg and f"of {limit + 1:,} elements" in msg and f"{limit:,} (Adjudicator.{const})" in msg
    assert "16,777,216 gas cap" in msg
    if kind != "DATA":  # vtrain's own builder makes the long row a tree of rows within the limit
        assert unrulable_ops(_row_graph(kind, limit + 1, MAX_ROW_ELEMENTS)) == []


def test_the_adjudicator_reverts_cleanly_on_a_row_past_its_limit(adj):
    """Past MAX_ROW the contract reverts with RowTooLong(kind, n, limit) before reading the row,
    instead of running out of gas."""
    a, table = adj
    n = MAX_ROW_ELEMENTS + 1
    for kind, desc in ((OpKind.MAX, exact.OpDesc(int(OpKind.MAX), (0,), (1, 1), ((1, n),), ())),
                       (OpKind.MAX_GRAD, exact.OpDesc(int(OpKind.MAX_GRAD), (0, 1), (1, n), ((1, n), (1, 1)), ())),
                       (OpKind.DATA, exact.OpDesc(int(OpKind.DATA), (), (1, MAX_SAMPLE_ELEMENTS + 1), (), ()))):
        c = Case(desc, tuple(np.zeros(shape, np.float32) for shape in desc.in_shapes))
        proof = encode_proof([], (0, 2, op_leaves_pair(), []))
        with pytest.raises(Exception) as info:  # noqa: PT011 - the provider's exception types vary
            a.functions.adjudicate(claim_tuple(c, 0, 0, [], n_samples=1), proof).call({"gas": CALL_GAS})
        assert table[revert_data(info.value)[:4]][0] == "RowTooLong", kind


def test_a_file_model_with_a_20000_wide_row_max_is_a_rulable_tree(tmp_path):
    """A real spec through the front end: ``x.amax(-1)`` over 20,000 features is a tree of MAX ops
    (2 chunks of 10,000, then a row of 2), so create-job, trainer and auditor accept it; the same
    row as one MAX op (a graph not built by vtrain's builder) is refused, naming the limit."""
    f = tmp_path / "wide.py"
    f.write_text(WIDE_MODEL)
    graph = build_job(TrainSpec(model=f"{f}:task", batch_size=2, steps=1, interval=1)).graph
    check_rulable(graph)
    rows = sorted(row_length(graph, op)[0] for op in graph.ops if op.kind in (OpKind.MAX, OpKind.MAX_GRAD))
    assert rows[-1] == 10_000 and 2 in rows
    with pytest.raises(UnrulableJob, match=r"\(MAX[^)]*\): a row of 20,000 elements read whole by one ruling, more "
                                           r"than the limit of 16,384 \(Adjudicator.MAX_ROW\)"):
        check_rulable(_row_graph("MAX", 20_000))
    ok = build_job(TrainSpec(model=f"{f}:task", model_args={"width": 64}, batch_size=2, steps=1, interval=1)).graph
    assert unrulable_ops(ok) == []
