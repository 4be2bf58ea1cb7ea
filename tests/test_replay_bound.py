"""The checked replay's MATMUL bound: the norm bound filters, the tight bound of the exact terms
(``canonical.tight_bound_at``) decides at the candidates and entries (docs/numerics.md, "Replay checks").

- the C kernel (``csrc/numerics/replay.c``) gives numpy's bits of ``fl(S)`` and the bound is valid;
- the replay's unlogged near-ties with ``tight`` are the reference set on the dense ``min(d, tight)``,
  native filter and numpy path alike;
- an honest replay of a GPT with canonical explicit MATMUL entries flags nothing (the resolver still
  checks every entry: tests/test_exact_rule.py).
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch
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


@pytest.mark.parametrize("norm_min,native", [(0, True), (None, True), (0, False)])
def test_an_honest_checked_replay_with_explicit_matmul_entries_flags_nothing(monkeypatch, norm_min, native) -> None:
    """The benchmark's small GPT (d 64): canonical explicit MATMUL entries, each within its rounding
    interval plus ``d`` of ``v'``; no violation, with every MATMUL on the norm bound and the tight bound
    of the exact terms (``norm_min`` 0) and as sized (all on the FP32 ``|A| @ |B|`` at this size); on the
    native path and on the torch path that other devices take."""
    import vtrain.graph.executor as E
    from vtrain.graph.executor import state_tensors

    if not native:  # the torch/numpy path (other devices): dense bounds, unlogged_near_ties
        monkeypatch.setattr(R.NF, "usable", lambda t: False)
    if norm_min is not None:
        monkeypatch.setattr(E, "_REPLAY_NORM_MIN", norm_min)
        calls: list[int] = []
        tight = canonical.tight_bound_at
        monkeypatch.setattr(E, "tight_bound_at", lambda *a: calls.append(1) or tight(*a))
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
    assert norm_min is None or len(calls) > 50  # the tight bound read at candidates and entries (one call each op)


def test_a_wider_gpt_replays_on_the_norm_bound_with_no_violation_and_a_tampered_entry_is_overruled(monkeypatch) -> None:
    """d 128, context 64: its large MATMULs (M N K >= 2^24) take the norm bound as sized; explicit MATMUL
    entries there flag nothing (before: ``|c - v'| > 6d``), and one moved to its FP32 neighbour is
    overruled by the auditor's resolver, whose replay keeps the trainer's (honest) state."""
    import copy

    import vtrain.graph.executor as E
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
    normed = {op.id for op in job.graph.ops if op.kind == OpKind.MATMUL and op.inputs
              and math.prod(op.shape) * job.graph.ops[op.inputs[0]].shape[-1] >= E._REPLAY_NORM_MIN}
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
