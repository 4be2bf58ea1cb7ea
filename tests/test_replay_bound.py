"""The checked replay's MATMUL bound: the norm bound filters, the tight bound of the exact terms
(``canonical.tight_bound_at``) decides at the candidates and entries (docs/numerics.md, "Replay checks").

- the C kernel (``csrc/numerics/replay.c``) gives numpy's bits of ``fl(S)`` and the bound is valid;
- the replay's unlogged near-ties with ``tight`` are the reference set on the dense ``min(d, tight)``,
  native filter and numpy path alike;
- an honest replay of a GPT with canonical explicit MATMUL entries flags nothing (the resolver still
  checks every entry: tests/test_exact_rule.py).
"""

from __future__ import annotations

from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from small_gpt import small_gpt
from test_numerics import _adversarial_values

from vtrain.graph.step_graph import OpKind
from vtrain.numerics import canonical, native_replay
from vtrain.numerics import rounding as R
from vtrain.numerics.rounding import TRAINER_BOUND_SLACK, OpLog, gamma

MATMUL = SimpleNamespace(kind=OpKind.MATMUL)


def _matmul(rng: np.random.Generator, batch: tuple[int, ...], m: int, k: int, n: int, bias: bool):
    a = (rng.standard_normal((*batch, m, k)) * np.exp2(rng.integers(-30, 30, (*batch, m, k)))).astype(np.float32)
    b = (rng.standard_normal((*batch, n, k)) * np.exp2(rng.integers(-30, 30, (*batch, n, k)))).astype(np.float32)
    a[..., 0, : k // 2] = 0.0
    ins = [torch.from_numpy(a), torch.from_numpy(b)]
    if bias:
        ins.append(torch.from_numpy(rng.standard_normal(n).astype(np.float32)))
    return ins


@pytest.mark.parametrize("shape", [((), 3, 1, 2, False), ((), 5, 7, 4, True), ((2, 3), 4, 129, 5, False),
                                   ((2,), 6, 300, 3, True), ((), 2, 1024, 3, False)])
def test_the_tight_bound_of_the_exact_terms_native_and_numpy(monkeypatch, shape) -> None:
    rng = np.random.default_rng(sum(shape[1:4]))
    ins = _matmul(rng, *shape)
    total = int(np.prod(shape[0])) * shape[1] * shape[3]
    idx = np.concatenate([np.arange(total), rng.integers(0, total, 20)]).astype(np.int64)
    n = shape[2] + shape[4]
    t, _ = canonical._terms(MATMUL, ins, torch.from_numpy(idx))
    want = (TRAINER_BOUND_SLACK * gamma(n)) * (np.abs(t.numpy()).sum(axis=1) + n * 2.0**-149)
    if native_replay._FN is not None:
        assert np.array_equal(native_replay.matmul_abs_sums(ins, idx), np.abs(t.numpy()).sum(axis=1))
        assert np.array_equal(canonical.tight_bound_at(MATMUL, ins, idx), want)
        with pytest.raises(IndexError):
            native_replay.matmul_abs_sums(ins, np.array([total], np.int64))
    monkeypatch.setattr(native_replay, "_FN", None)
    got = canonical.tight_bound_at(MATMUL, ins, idx)
    assert np.array_equal(got, want)
    g = Fraction(n, 2**53) / (1 - Fraction(n, 2**53))
    for row, i in zip(t.numpy()[:12], idx[:12], strict=False):  # |v - e| <= g(n) S <= d'
        assert g * sum(abs(Fraction(float(x))) for x in row) <= Fraction(float(got[np.flatnonzero(idx == i)[0]]))


@pytest.mark.parametrize("native", [True, False])
def test_the_replays_near_ties_with_a_tight_bound_are_the_reference_set(monkeypatch, native: bool) -> None:
    rng = np.random.default_rng(17)
    v, d = _adversarial_values(rng, 20000)
    factor = rng.choice([0.25, 0.5, 1.0, 3.0], v.numel())  # tighter, equal and looser than d
    dense_tight = d.numpy().reshape(-1) * factor

    def tight(index: np.ndarray) -> np.ndarray:
        return dense_tight[index]

    d_min = torch.from_numpy(np.minimum(d.numpy().reshape(-1), dense_tight))
    rf = v.to(torch.float32)
    _, entries = R.round_output(v, d, "x")
    entries = OpLog(entries.index[::3].copy(), entries.code[::3].copy(), entries.value[::3].copy())
    want = R.unlogged_near_ties_reference(v, d_min, rf, entries)
    assert len(want) > 100 and len(want) < len(R.unlogged_near_ties_reference(v, d, rf, entries))
    if not native:
        monkeypatch.setattr(R.NF, "usable", lambda t: False)
        assert np.array_equal(R.unlogged_near_ties(v, d, rf, entries, tight), want)
    viol: list[R.LogViolation] = []
    R.apply_log(v, d, entries, "x", violations=viol, check_finite=False, tight=tight)
    near = sorted(x.index for x in viol if x.code == 0)
    assert near == want.tolist()


@pytest.mark.parametrize("native", [True, False])
def test_an_honest_checked_replay_with_explicit_matmul_entries_flags_nothing(monkeypatch, native: bool) -> None:
    """The benchmark's small GPT (d 64): canonical explicit MATMUL entries, each within its rounding
    interval plus ``d`` of ``v'``; no violation, every MATMUL on the norm bound and the tight bound of
    the exact terms (native: one ``vt_replay_matmul_norm`` call per op; the torch path that other
    devices take: ``tight_bound_at`` at the candidates and entries)."""
    import vtrain.graph.executor as E
    from vtrain.graph.executor import state_tensors

    calls: list[int] = []
    if not native:  # the torch/numpy path (other devices): dense bounds, unlogged_near_ties
        monkeypatch.setattr(R.NF, "usable", lambda t: False)
        tight = canonical.tight_bound_at
        monkeypatch.setattr(E, "tight_bound_at", lambda *a: calls.append(1) or tight(*a))
    else:
        fused = canonical.replay_matmul_norm
        monkeypatch.setattr(E, "replay_matmul_norm", lambda *a: calls.append(1) or fused(*a))
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for, component_roots
    from vtrain.training.spec import TrainSpec, build_job

    job = build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=8,
                              gpt=GPTConfig(n_layer=2, d_model=64, n_head=4, context=32)))
    ex = executor_for(job, "certified")
    state = state_tensors(job.initial_state)
    explicit_matmul = 0
    for step in range(1, 6):
        res = ex.run(state, batch_for(job, step), step=step)
        rep = ex.run(state, batch_for(job, step), log_in=res.log, step=step, check=True)
        assert rep.violations == []
        assert component_roots(rep.state) == component_roots(res.state)
        explicit_matmul += sum(int((ol.code == 3).sum()) for op_id, ol in res.log.sparse.items()
                               if job.graph.ops[op_id].kind == OpKind.MATMUL)
        state = res.state
    assert explicit_matmul > 0
    assert len(calls) > 50  # the tight bound read at candidates and entries (one call each op)


def test_a_wider_gpt_replays_on_the_norm_bound_with_no_violation_and_a_tampered_entry_is_overruled(monkeypatch) -> None:
    """d 128, context 64: its MATMULs take the norm bound; explicit MATMUL entries there flag nothing
    (before: ``|c - v'| > 6d``), and one moved to its FP32 neighbour is overruled by the auditor's
    resolver, whose replay keeps the trainer's (honest) state."""
    import copy

    from protocol.auditor import exact_resolver
    from protocol.jobs import JobContext
    from vtrain.graph.executor import state_tensors
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for, component_roots
    from vtrain.training.spec import TrainSpec

    ctx = JobContext.of(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=8,
                                  gpt=GPTConfig(n_layer=2, d_model=128, n_head=4, context=64)))
    job = ctx.job
    normed = {op.id for op in job.graph.ops if op.kind == OpKind.MATMUL}
    assert normed
    ex = executor_for(job, "certified")
    state = state_tensors(job.initial_state)
    res = ex.run(state, batch_for(job, 1), step=1)
    overruled: list[tuple[int, int]] = []
    aud = ex.run(state, batch_for(job, 1), log_in=res.log, step=1, check=True,
                 resolver_factory=exact_resolver(ctx, overruled))
    assert aud.violations == [] and overruled == []
    assert component_roots(aud.state) == component_roots(res.state)
    hits = [(op_id, int(ol.index[k])) for op_id, ol in res.log.sparse.items() if op_id in normed
            for k in np.flatnonzero(ol.code == 3)]
    assert hits, "explicit entries on a norm-bound MATMUL"
    op_id, index = hits[0]
    bad = copy.deepcopy(res.log)
    ol = bad.sparse[op_id]
    k = int(np.flatnonzero(ol.index == index)[0])
    ol.value[k] = np.nextafter(ol.value[k], np.float32(np.inf))
    aud = ex.run(state, batch_for(job, 1), log_in=bad, step=1, check=True,
                 resolver_factory=exact_resolver(ctx, overruled))
    assert overruled == [(op_id, index)]
    assert component_roots(aud.state) == component_roots(res.state)


@pytest.mark.parametrize("bias", [False, True])
def test_a_matmul_on_the_lazy_norm_bound_reports_the_reference_near_ties(bias: bool) -> None:
    """Integer MATMULs whose sums land on FP32 midpoints (odd integers in [2^24, 2^25)): the near-ties
    the checked replay reports from the lazy norm bound and ``tight_bound_at`` are the reference set on
    the dense ``min(d_norm, d')``."""
    import vtrain.graph.executor as E

    rng = np.random.default_rng(5 + bias)
    # t = (a0 * 4095, 0, 0, eps): odd integers in [2^24, 2^25), FP32 midpoints, a hair off; the
    # orthogonal 4000s make the norm bound about 2x the tight one
    a = torch.zeros(6, 40, 4)
    a[..., 0] = torch.from_numpy(2 * rng.integers(2049, 4096, (6, 40)).astype(np.float32) - 1)
    a[..., 2], a[..., 3] = 4000.0, 1.0
    b = torch.zeros(6, 24, 4)
    b[..., 0], b[..., 1] = 4095.0, 4000.0
    b[..., 3] = torch.from_numpy(rng.integers(0, 2**6, (6, 24)).astype(np.float32) * np.float32(2.0**-31))
    ins = [a, b] + ([torch.from_numpy(2 * rng.integers(-3, 4, 24).astype(np.float32))] if bias else [])
    x = [t.double() for t in ins]
    v = torch.matmul(x[0], x[1].transpose(-1, -2))
    d = E._norm_bound(x, v, lazy=True)  # adds the bias to v
    assert not isinstance(d, torch.Tensor) or not R.NF.usable(v)
    n = v.numel()
    d_min = torch.from_numpy(np.minimum(R.NF.dense(d).reshape(-1).numpy(),
                                        canonical.tight_bound_at(MATMUL, ins, np.arange(n))))
    rf = v.to(torch.float32)
    want = R.unlogged_near_ties_reference(v.reshape(-1), d_min, rf.reshape(-1), OpLog.empty())
    loose = R.unlogged_near_ties_reference(v.reshape(-1), R.NF.dense(d).reshape(-1), rf.reshape(-1), OpLog.empty())
    assert len(want) > 20 and len(loose) > len(want)
    viol: list[R.LogViolation] = []
    R.apply_log(v, d, OpLog.empty(), "x", violations=viol, check_finite=False,
                tight=lambda i: canonical.tight_bound_at(MATMUL, ins, i))
    assert [x.index for x in viol] == want.tolist()


@pytest.mark.parametrize("shape", [((), 3, 1, 2, False), ((), 5, 7, 4, True), ((2, 3), 4, 129, 5, False),
                                   ((2,), 6, 300, 3, True), ((), 40, 64, 24, True)])
def test_the_replays_one_call_matmul_filter_gives_the_lazy_paths_bits(shape) -> None:
    """``canonical.replay_matmul_norm`` (``vt_replay_matmul_norm``) against the lazy path it replaces:
    ``v`` with its bias, ``(r, candidates, finite)`` of ``round_filter`` on ``NormBound`` at
    ``REPLAY_SCALE``, and at the candidates and entries ``min(NormBound.at, tight_bound_at)`` and
    ``grid_elements``, bit for bit (integer operands too: sums past 2^24 at midpoints, grid rows)."""
    import vtrain.graph.executor as E

    if native_replay._NORM is None:
        pytest.skip("native kernels not built")
    rng = np.random.default_rng(sum(shape[1:4]) + 7)
    for ints in (False, True):
        ins = _matmul(rng, *shape)
        if ints:
            ins = [torch.from_numpy(rng.integers(-2**13, 2**13, t.shape).astype(np.float32)) for t in ins]
        x = [t.double() for t in ins]
        v_ref = torch.matmul(x[0], x[1].transpose(-1, -2))
        v = v_ref.clone()
        d_ref = E._norm_bound(x, v_ref, lazy=True, ins=ins)
        r_ref, cand_ref, fin_ref = R.NF.round_filter(v_ref, d_ref, R.REPLAY_SCALE)
        total = v.numel()
        entries = np.sort(rng.integers(0, total, 5)).astype(np.int64)
        log = OpLog(entries, np.ones(len(entries), np.uint8), np.zeros(len(entries), np.float32))
        d, (r, cand, fin), near, _ = canonical.replay_matmul_norm(ins, v, log)
        assert isinstance(d, R.NF.PointBound)
        assert torch.equal(v, v_ref) and torch.equal(r, r_ref) and np.array_equal(cand, cand_ref) and fin == fin_ref
        assert not ints or len(cand) > 0 or total < 50
        at = np.concatenate([cand, entries])
        want = np.minimum(d_ref.at(at), canonical.tight_bound_at(MATMUL, ins, at))
        assert np.array_equal(d.at(at), want)
        assert np.array_equal(d.grid_at(at), canonical.grid_elements(MATMUL, ins, at))
        vn, rn = v.reshape(-1).numpy(), r.reshape(-1).numpy()
        assert np.array_equal(near, R._near_midpoint_np(vn[cand], rn[cand], 2.0 * want[: len(cand)] * R._CMP_SLACK))
        assert not ints or near.any() or total < 50


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN])
def test_the_replays_sum_pass_gives_the_filters_bits_the_grid_rule_and_the_near_ties(kind: OpKind) -> None:
    """``native_replay.sum_values_grid`` (``vt_replay_sum_values``): ``native_filter.sum_values_filter``'s
    ``v``, ``d``, ``r``, candidates and finiteness, and at the candidates ``grid_elements`` and
    ``_near_midpoint_np`` on ``d``, bit for bit (integer rows: exact midpoints on the grid; rows
    with a non-grid term; random rows)."""
    if native_replay._SUM is None:
        pytest.skip("native kernels not built")
    rng = np.random.default_rng(3 + (kind == OpKind.MEAN))
    op = SimpleNamespace(kind=kind)
    seen_settled = 0
    for n in (1, 7, 32, 200):
        ints = rng.integers(-2**13, 2**13, (300, n)).astype(np.float32) * np.float32(2049.0)
        odd = ints.copy()
        odd[::3, 0] += np.float32(2.0**-20)
        rand = (rng.standard_normal((300, n)) * np.exp2(rng.integers(-20, 20, (300, n)))).astype(np.float32)
        for rows in (ints, odd, rand):
            x = torch.from_numpy(rows.reshape(30, 10, n))
            factor = canonical.sum_bound_factor(kind, n)
            mean = kind == OpKind.MEAN
            v, d, r, cand, fin, grid, near, settled = native_replay.sum_values_grid(
                x, mean, factor, R.REPLAY_SCALE, R._CMP_SLACK, None, native_replay.OFF)  # (OFF: never settled)
            assert not settled
            v0, d0, r0, cand0, fin0 = R.NF.sum_values_filter(x, mean, factor, R.REPLAY_SCALE)
            quick = native_replay.sum_values_grid(x, mean, factor, R.REPLAY_SCALE, R._CMP_SLACK)
            if quick.settled:  # (settled: the same r, and nothing else handed back)
                assert torch.equal(quick.r, r) and not len(quick.cand) and not len(quick.grid)
                seen_settled += 1
            assert torch.equal(v, v0) and torch.equal(d, d0) and torch.equal(r, r0)
            assert np.array_equal(cand, cand0) and fin == fin0
            assert np.array_equal(grid, canonical.grid_elements(op, [x], cand))
            vn, rn, dn = v.reshape(-1).numpy(), r.reshape(-1).numpy(), d.reshape(-1).numpy()
            assert np.array_equal(near, R._near_midpoint_np(vn[cand], rn[cand], 2.0 * dn[cand] * R._CMP_SLACK))
    assert seen_settled, "some rows settle in the default mode"


def test_a_doctored_entry_where_the_norm_bound_is_loose_is_flagged() -> None:
    """The lazy check reads ``min(d_norm, d')`` at every entry, not the cheap bound alone. A MATMUL
    element ``1.5 * 1 + 2^20 * (2^-44 + 2^-60) = m + 2^-40`` (``m = 1.5 + 2^-24``, an FP32 midpoint):
    its norm bound is ~2^20 times its tight one, so ``4 d' < 2^-40 < 4 d_norm``. An honest trainer
    logs nothing there (``2 Dc < 2^-40``); a doctored ``up`` entry must be flagged "far" (with
    ``d_norm`` at the entries it would pass), and the unlogged element, a norm-filter candidate off the
    exact grid, must not be flagged (with ``d_norm`` at the candidates it would be)."""
    import copy

    import vtrain.graph.executor as E
    from vtrain.graph.executor import StepExecutor
    from vtrain.graph.step_graph import GraphBuilder

    gb = GraphBuilder()
    a, b = gb.input("a", (2, 3)), gb.input("b", (3, 3))
    gb.data((1,))
    y = gb.matmul(a, b)
    gb.output(a, 0)
    gb.output(b, 1)
    graph = gb.build(gb.sum(y))
    mm = y.op
    # the third term (2^-200) keeps element 0 off the exact grid: a near-tie there would be a suspect
    an = np.array([[1.5, 2.0**20, 2.0**-100], [1.0, 3.0, 0.0]], np.float32)
    bn = np.array([[1.0, 2.0**-44 + 2.0**-60, 2.0**-100], [2.0, 1.0, 0.0], [0.5, 0.25, 0.0]], np.float32)
    state = [torch.from_numpy(an), torch.from_numpy(bn)]
    data = torch.zeros(1)
    ins = [state[0], state[1]]
    x = [t.double() for t in ins]
    v = torch.matmul(x[0], x[1].T)
    assert float(v[0, 0]) == 1.5 + 2.0**-24 + 2.0**-40
    d_norm = float(R.NF.dense(E._norm_bound(x, v.clone(), ins=ins)).reshape(-1)[0])
    d_tight = float(canonical.tight_bound_at(MATMUL, ins, np.array([0]))[0])
    assert 4 * d_tight < 2.0**-40 < 4 * d_norm
    assert not canonical.grid_elements(MATMUL, ins, np.array([0]))[0]
    ex = StepExecutor(graph, "certified")
    res = ex.run(state, data)
    assert not len(res.log.entries(mm))
    rep = ex.run(state, data, log_in=res.log, check=True)
    assert rep.violations == []  # element 0 is a norm candidate, cleared by d'
    bad = copy.deepcopy(res.log)
    bad.sparse[mm] = OpLog(np.array([0], np.int64), np.array([2], np.uint8), np.zeros(1, np.float32))
    for native, cap in ((True, None), (True, 0), (False, None)):
        with pytest.MonkeyPatch.context() as mp:
            if not native:
                mp.setattr(R.NF, "usable", lambda t: False)
            if cap is not None:  # more points than the kernel keeps: its filter, then the lazy bound
                mp.setattr(native_replay, "_POINTS_CAP", cap)
            rep = ex.run(state, data, log_in=bad, check=True)
        assert [(op, x.index, x.code, x.detail) for op, x in rep.violations] == [
            (mm, 0, 2, "entry far from the replayed value")]


def test_the_fast_return_of_clean_ops_changes_no_output_flag_or_ruling(monkeypatch) -> None:
    """Ops the native pass settles without entries (``StepExecutor._replay_mode``'s ``CANDIDATES``: no
    entry, no suspect candidate) skip ``apply_log``: the replay's
    state, violations, overruled elements and resolver calls are those of the full path, on an honest
    log and on doctored ones (a directed code flipped, an explicit value moved, an entry added to a
    clean MATMUL and to a clean SUM)."""
    import copy

    from protocol.auditor import exact_resolver
    from vtrain.graph import executor as vexec
    from vtrain.training.loop import batch_for, component_roots

    ctx, job, ex, state = small_gpt()
    res = ex.run(state, batch_for(job, 1), step=1)
    logs = {"honest": res.log}
    directed = [(o, k) for o, ol in sorted(res.log.sparse.items()) for k in range(len(ol)) if ol.code[k] in (1, 2)]
    explicit = [(o, k) for o, ol in sorted(res.log.sparse.items()) for k in range(len(ol)) if ol.code[k] == 3]
    assert directed
    bad = copy.deepcopy(res.log)
    o, k = directed[0]
    bad.sparse[o].code[k] = 3 - bad.sparse[o].code[k]
    logs["flipped"] = bad
    if explicit:
        bad = copy.deepcopy(res.log)
        o, k = explicit[0]
        bad.sparse[o].value[k] = np.nextafter(bad.sparse[o].value[k], np.float32(np.inf))
        logs["moved"] = bad
    for kinds in ((OpKind.MATMUL,), (OpKind.SUM, OpKind.MEAN)):
        ids = [op.id for op in job.graph.ops if op.kind in kinds and op.id not in res.log.sparse]
        bad = copy.deepcopy(res.log)
        bad.sparse[ids[len(ids) // 2]] = OpLog(np.array([0], np.int64), np.array([1], np.uint8),
                                               np.array([0.0], np.float32))
        logs[kinds[0].name] = bad

    def replay(log):
        calls: list[tuple[int, list[int]]] = []
        overruled: list[tuple[int, int]] = []
        factory = exact_resolver(ctx, overruled)

        def counting(op, ins):
            r = factory(op, ins)
            return lambda keys, *a: calls.append((op.id, keys.tolist())) or r(keys, *a)

        aud = ex.run(state, batch_for(job, 1), log_in=log, step=1, check=True, resolver_factory=counting)
        return component_roots(aud.state), [(i, v.index, v.code, v.detail) for i, v in aud.violations], overruled, calls

    clean: list[int] = []
    ret = vexec.StepExecutor._replay_clean
    monkeypatch.setattr(vexec.StepExecutor, "_replay_clean", staticmethod(lambda *a: clean.append(1) or ret(*a)))
    fast = {name: replay(lg) for name, lg in logs.items()}
    assert clean or not native_replay.native.available(), "the fast return was reached"
    monkeypatch.setattr(vexec.StepExecutor, "_replay_mode", staticmethod(lambda *a: native_replay.OFF))
    clean.clear()
    full = {name: replay(lg) for name, lg in logs.items()}
    assert not clean, "the full path was taken"
    assert fast == full
    assert fast["honest"][1] == [] and fast["flipped"][2]
