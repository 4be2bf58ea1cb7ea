"""The checked replay's native settlement of an op (``StepExecutor._replay_mode``; ``vt_replay_matmul_norm``
and ``vt_replay_sum_values`` in csrc/numerics/replay.c): a MATMUL/SUM/MEAN whose native pass finds every
entry well formed, neither far nor wild, finite and (with the auditor's resolver) ``RN32(e)`` by the
double-double verdict, and no unlogged suspect, returns without ``apply_log`` and without calling the
resolver. Against the forced full path (``native_replay.OFF``), on an honest log and on doctored ones
(an entry on the wrong side of a tie, a wrong explicit value, an index out of range, a duplicate index,
a -0 explicit value, an entry far from ``v``, an unlogged near-tie): the same states, losses,
violations, overruled elements and errors; every doctored op reaches the resolver; an honest op with
entries does not."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from small_gpt import small_gpt

from vtrain.errors import VtrainError
from vtrain.graph import executor as vexec
from vtrain.graph.step_graph import OpKind
from vtrain.numerics import native, native_replay
from vtrain.numerics.rounding import OpLog, declare_upholds_rn32_entries, upholds_rn32_entries

pytestmark = pytest.mark.skipif(not native.available(), reason="native numerics kernels not built (make native)")

F32 = np.float32


def _counting(base, calls: list[int]):
    """``base`` (a resolver factory) recording the op of every resolver call; its declaration kept."""

    def factory(op, ins):
        r = base(op, ins)

        def resolve(keys, *a):
            calls.append(op.id)
            return r(keys, *a)

        return resolve

    return declare_upholds_rn32_entries(factory) if upholds_rn32_entries(base) else factory


def _replay(ex, state, data, log, step, ctx, resolving: bool, full: bool):
    """(outcome, ops that reached the resolver) of a checked replay, the full path forced with ``full``."""
    from protocol.auditor import exact_resolver
    from vtrain.training.loop import component_roots

    calls: list[int] = []
    overruled: list[tuple[int, int]] = []
    factory = _counting(exact_resolver(ctx, overruled), calls) if resolving else None
    with pytest.MonkeyPatch.context() as mp:
        if full:
            mp.setattr(vexec.StepExecutor, "_replay_mode", staticmethod(lambda *a: native_replay.OFF))
        try:
            rep = ex.run(state, data, log_in=log, step=step, check=True, resolver_factory=factory)
        except VtrainError as e:
            return ("raised", type(e).__name__, str(e)), calls
    viol = [(i, v.index, v.code, v.detail) for i, v in rep.violations]
    return (component_roots(rep.state), rep.loss, viol, sorted(overruled)), calls


def _with_entry(log, op: int, index: int, code: int, value: float):
    """``log`` with one more entry of ``op`` (kept sorted; an existing one at ``index`` replaced)."""
    bad = copy.deepcopy(log)
    ol = bad.sparse.get(op, OpLog.empty())
    keep = ol.index != index
    idx = np.append(ol.index[keep], index)
    order = np.argsort(idx, kind="stable")
    codes = np.append(ol.code[keep], np.uint8(code))[order].astype(np.uint8)
    bad.sparse[op] = OpLog(idx[order].astype(np.int64), codes, np.append(ol.value[keep], F32(value))[order].astype(F32))
    return bad


def _compare(ex, state, data, logs: dict, step, ctx, doctored_ops: dict[str, int | None]) -> dict:
    """Fast vs full on each log, with the auditor's resolver and without one; the fast outcomes."""
    fast_outcomes = {}
    for name, lg in logs.items():
        for resolving in (True, False):
            fast, fast_calls = _replay(ex, state, data, lg, step, ctx, resolving, full=False)
            full, _ = _replay(ex, state, data, lg, step, ctx, resolving, full=True)
            assert fast == full, (name, resolving)
            op = doctored_ops.get(name)
            if resolving and op is not None and fast[0] != "raised":
                assert op in fast_calls, f"{name}: the doctored op reached the resolver"
            if resolving:
                fast_outcomes[name] = (fast, fast_calls)
    return fast_outcomes


def test_the_gpts_settled_ops_replay_as_the_full_path_on_honest_and_doctored_logs() -> None:
    from vtrain.training.loop import batch_for, component_roots

    ctx, job, ex, state = small_gpt()
    data = batch_for(job, 1)
    res = ex.run(state, data, step=1)
    sparse = res.log.sparse
    mm = sorted(o for o in sparse if job.graph.ops[o].kind == OpKind.MATMUL)
    assert mm
    directed = [(o, k) for o in mm for k in range(len(sparse[o])) if sparse[o].code[k] in (1, 2)]
    explicit = [(o, k) for o in mm for k in range(len(sparse[o])) if sparse[o].code[k] == 3]
    assert directed and explicit
    logs: dict[str, object] = {"honest": res.log}
    ops: dict[str, int | None] = {"honest": None}
    o, k = directed[0]
    bad = copy.deepcopy(res.log)
    bad.sparse[o].code[k] = 3 - bad.sparse[o].code[k]  # the other side of the tie
    logs["flipped"], ops["flipped"] = bad, o
    o, k = explicit[0]
    bad = copy.deepcopy(res.log)
    bad.sparse[o].value[k] = np.nextafter(bad.sparse[o].value[k], F32(np.inf))
    logs["moved"], ops["moved"] = bad, o
    bad = copy.deepcopy(res.log)
    bad.sparse[o].value[k] = F32(-0.0)
    logs["minus zero"], ops["minus zero"] = bad, o
    # one past the op's last element, after its honest entries
    logs["out of range"], ops["out of range"] = _with_entry(res.log, o, int(np.prod(job.graph.ops[o].shape)), 1, 0.0), o
    o2 = mm[-1]
    ol = res.log.sparse[o2]
    dup = OpLog(np.repeat(ol.index[:1], 2), np.repeat(ol.code[:1], 2), np.repeat(ol.value[:1], 2))
    bad = copy.deepcopy(res.log)
    bad.sparse[o2] = OpLog(np.concatenate([dup.index, ol.index[1:]]), np.concatenate([dup.code, ol.code[1:]]),
                           np.concatenate([dup.value, ol.value[1:]]))
    logs["duplicate"], ops["duplicate"] = bad, None  # the full path decides what a duplicate does; both agree
    o3 = next(o for o in mm if len(sparse[o]) >= 2)
    bad = copy.deepcopy(res.log)
    bad.sparse[o3] = OpLog(sparse[o3].index[::-1].copy(), sparse[o3].code[::-1].copy(), sparse[o3].value[::-1].copy())
    logs["unsorted"], ops["unsorted"] = bad, None  # the full path's binary searches misread it; both agree
    far = next(i for i in range(64) if i not in set(sparse[mm[0]].index.tolist()))
    logs["far"], ops["far"] = _with_entry(res.log, mm[0], far, 2, 0.0), mm[0]
    # an honest entry dropped where the replay sees an unlogged near-tie (some are out of its 2d reach)
    for o, ol in ((o, sparse[o]) for o in mm if len(sparse[o]) >= 2):
        bad = copy.deepcopy(res.log)
        bad.sparse[o] = OpLog(ol.index[1:], ol.code[1:], ol.value[1:])
        got, _ = _replay(ex, state, data, bad, 1, ctx, False, full=True)
        if got[0] != "raised" and any(v[3] == "unlogged element near a midpoint" for v in got[2]):
            logs["unlogged"], ops["unlogged"] = bad, o
            break
    assert "unlogged" in logs, "an op with another entry left and an unlogged near-tie"

    fast = _compare(ex, state, data, logs, 1, ctx, ops)
    (roots, _, viol, overruled), calls = fast["honest"]
    assert roots == component_roots(res.state) and viol == [] and overruled == []
    assert calls == [], "every honest op with entries settled natively"
    assert fast["flipped"][0][3] and fast["moved"][0][3] and fast["far"][0][2]
    assert fast["out of range"][0][0] == "raised"


def test_sum_mean_and_an_exact_zero_matmul_settle_as_the_full_path() -> None:
    """A graph whose SUM and MEAN rows sit next to midpoints (honest entries there: the SUM/MEAN kernel's
    settlement) and whose MATMUL has exact-zero elements (a -0 explicit value there is neither far nor
    wild, RN32(e) = +0 by the verdict, but never a claim the contract takes: the resolver must see it)."""
    from vtrain.commit.trace import GraphCommitment
    from vtrain.graph.executor import StepExecutor
    from vtrain.graph.step_graph import GraphBuilder

    rows, n = 64, 64
    gb = GraphBuilder()
    x = gb.input("x", (rows, n))
    a, b = gb.input("a", (4, 3)), gb.input("b", (5, 3))
    gb.input("s", (rows, 1))
    gb.input("m", (rows, 1))
    gb.input("y", (4, 5))
    gb.data((1,))
    s, m, y = gb.sum(x), gb.mean(x), gb.matmul(a, b)
    for slot, t in enumerate((x, a, b, s, m, y)):
        gb.output(t, slot)
    graph = gb.build(gb.sum(gb.reshape(y, (20,))))
    ctx = SimpleNamespace(graph=GraphCommitment.of(graph))
    rng = np.random.default_rng(5)
    xn = rng.standard_normal((rows, n)).astype(F32)
    xn[:20] = 0.0  # 1 + 2^-24 + small: past a midpoint (by more than the verdict's error), within 2d: entries
    xn[:20, :3] = (1.0, 2.0**-24, 2.0**-60)
    xn[:20, 3] = np.arange(20) * F32(2.0**-62)
    xn[20:24] = 0.0  # an exact midpoint on the exact grid: no entry, and no suspect
    xn[20:24, :2] = (1.0, 2.0**-24)
    xn[24:34] = 0.0  # cancelling large terms: d above 1/16 of the spacing at 1, explicit entries
    xn[24:34, :5] = (2.0**20, -(2.0**20), 1.0, 2.0**-24, 2.0**-50)
    an = rng.standard_normal((4, 3)).astype(F32)
    an[1] = 0.0  # row 1 of y: exact zeros
    bn = rng.standard_normal((5, 3)).astype(F32)
    state = [torch.from_numpy(t) for t in (xn, an, bn, np.zeros((rows, 1), F32), np.zeros((rows, 1), F32),
                                          np.zeros((4, 5), F32))]
    data = torch.zeros(1)
    ex = StepExecutor(graph, "certified")
    res = ex.run(state, data)
    sums = [op.id for op in graph.ops if op.kind in (OpKind.SUM, OpKind.MEAN) and op.id in res.log.sparse]
    assert len(sums) == 2, "honest SUM and MEAN entries"
    logs: dict[str, object] = {"honest": res.log}
    ops: dict[str, int | None] = {"honest": None}
    for op in sums:
        ol = res.log.sparse[op]
        d = np.flatnonzero(ol.code != 3)
        e = np.flatnonzero(ol.code == 3)
        if len(d):
            bad = copy.deepcopy(res.log)
            bad.sparse[op].code[d[0]] = 3 - bad.sparse[op].code[d[0]]
            logs[f"flipped {op}"], ops[f"flipped {op}"] = bad, op
        if len(e):
            bad = copy.deepcopy(res.log)
            bad.sparse[op].value[e[0]] = np.nextafter(bad.sparse[op].value[e[0]], F32(np.inf))
            logs[f"moved {op}"], ops[f"moved {op}"] = bad, op
        logs[f"far {op}"], ops[f"far {op}"] = _with_entry(res.log, op, 40, 1, 0.0), op
        bad = copy.deepcopy(res.log)
        bad.sparse[op] = OpLog(ol.index[1:], ol.code[1:], ol.value[1:])
        logs[f"unlogged {op}"], ops[f"unlogged {op}"] = bad, op
    assert any(k.startswith("flipped") for k in logs) and any(k.startswith("moved") for k in logs)
    logs["minus zero"], ops["minus zero"] = _with_entry(res.log, y.op, 7, 3, -0.0), y.op  # y[1, 2] = 0 exactly
    logs["plus zero"], ops["plus zero"] = _with_entry(res.log, y.op, 7, 3, 0.0), None  # RN32(e): settles

    fast = _compare(ex, state, data, logs, 0, ctx, ops)
    (_, _, viol, overruled), calls = fast["honest"]
    assert viol == [] and overruled == [] and calls == [], "the honest SUM/MEAN entries settled natively"
    assert fast["minus zero"][0][3] == [(y.op, 7)], "the -0 claim overruled"
    assert fast["plus zero"][1] == [] and fast["plus zero"][0][3] == []
    for name in logs:
        if name.startswith("unlogged"):
            assert any(v[3] == "unlogged element near a midpoint" for v in fast[name][0][2]), name
