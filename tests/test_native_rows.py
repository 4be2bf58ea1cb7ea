"""The native decisions of candidate rows (``csrc/numerics/rows.c`` via ``vtrain.numerics.native_rows``)
against their specification, the numpy path of ``vtrain.numerics.canonical``: bitwise the same bits,
codes, decided flags and tight-filter drops, on adversarial rows; every decided row equal to the exact
rational decision; ``is_exact_rounding`` and ``grid_elements`` the same on right and wrong claims; and
executor steps with the kernels on and off giving the same states and encoded logs."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

import vtrain.numerics.canonical as C
from vtrain.graph.step_graph import OpKind
from vtrain.numerics import native_rows
from vtrain.numerics.logfile import encode_step_log
from vtrain.numerics.rounding import TRAINER_BOUND_SLACK, U, gamma

pytestmark = pytest.mark.skipif(not native_rows.available(),
                                reason="native numerics kernels not loaded (make native; VTRAIN_NATIVE_NUMERICS=0)")

SUMS = [OpKind.MATMUL, OpKind.SUM, OpKind.MEAN]


def _f32_mid(c: float, above: bool) -> float:
    c32 = np.float32(c)
    nb = np.nextafter(c32, np.float32(np.inf if above else -np.inf))
    return (float(c32) + float(nb)) / 2


def _reach(kind: OpKind, s_abs: float, n: int) -> float:
    """``2 * big * scale`` of ``_decide_dd`` (the distance that puts a midpoint in reach)."""
    g = n * U / (1 - n * U)
    if kind == OpKind.MATMUL:
        big = 1.25 * g * (s_abs + n * 2.0**-149)
    elif kind == OpKind.SUM:
        big = 1.25 * (g * s_abs)
    else:
        big = 1.25 * ((g + 2 * U) * s_abs / n)
    return 2 * big * (float(n) if kind == OpKind.MEAN else 1.0)


def _pad(row: list[float], n: int, rng: np.random.Generator) -> list[float]:
    """``row`` plus cancelling pairs up to ``n`` terms, shuffled (the exact sum is unchanged)."""
    out = list(row)
    while len(out) + 2 <= n:
        x = float(rng.standard_normal()) * 2.0 ** int(rng.integers(-40, 40))
        out += [x, -x]
    if len(out) < n:
        out.append(0.0)
    rng.shuffle(out)
    return out


def _at_reach(kind: OpKind, m: float, big: float, side: float) -> list[float]:
    """A row whose double-double distance to the midpoint ``m`` is exactly the reach, as FP64 computes
    it from the row's own ``sum|t|`` (a fixed point: the distance is a term of that sum)."""
    d = 0.0
    for _ in range(20):
        row = [m, side * d, big, -big]
        r = _reach(kind, float(np.abs(np.array([row])).sum(axis=1)[0]), 4)
        if r == d:
            break
        d = r
    return [m, side * d, big, -big]


def adversarial_rows(kind: OpKind, rng: np.random.Generator) -> list[list[float]]:
    """Rows of exact FP64 terms that probe every comparison of the decision (docs in each block)."""
    rows: list[list[float]] = []
    big = 2.0**70
    for _ in range(12):
        c = float(np.float32(rng.standard_normal() * 2.0 ** int(rng.integers(-20, 20))))
        n = int(rng.choice([1, 2, 3, 5, 7, 8, 9, 16, 31, 64, 129, 200]))
        for above in (False, True):
            m = _f32_mid(c, above)
            if kind == OpKind.MEAN:
                m *= n  # the row sums to n m: its mean is the midpoint
            ulp = math.ulp(m)
            rows.append(_pad([m], n, rng))  # an exact tie (grid or not, by the padding)
            rows.append(_pad([m, big, -big], max(n, 3), rng))  # an exact tie off the grid
            for k in (1, 2, 3):  # FP64 ulps either side of a midpoint
                rows.append(_pad([m, k * ulp, big, -big], max(n, 4), rng))
                rows.append(_pad([m, -k * ulp, big, -big], max(n, 4), rng))
            for j in (1, 2, 10, 30, 60):  # below one FP64 ulp either side: hi = m and lo carries it
                for sgn in (1, -1):
                    rows.append([m, sgn * ulp * 2.0**-j])
                    rows.append(_pad([m, sgn * ulp * 2.0**-j, big, -big], max(n, 4), rng))
            rows.append(_at_reach(kind, m, 2.0 ** (math.frexp(m)[1] + 10), -1.0 if above else 1.0))
            # distances just inside / outside the reach: e = m + delta, delta = reach (1 +- 2^-j)
            nn = max(n, 4)
            s_abs = abs(m) + 2 * big
            reach = _reach(kind, s_abs, nn) / (float(nn) if kind == OpKind.MEAN else 1.0)
            for j in (2, 8, 20, 30, 40, 45, 52):
                for sgn in (1, -1):
                    delta = reach * (1 + sgn * 2.0**-j)
                    side = 1.0 if above else -1.0  # m is above c: approach it from below, and vice versa
                    d = -side * delta * (float(nn) if kind == OpKind.MEAN else 1.0)
                    rows.append(_pad([m, d, big, -big], nn, rng))
    for _ in range(20):  # heavy cancellation: large terms whose sum is tiny
        n = int(rng.integers(2, 60))
        xs = (rng.standard_normal(n) * 2.0 ** rng.integers(0, 60, n)).tolist()
        rows.append([*xs, -math.fsum(xs) + float(rng.standard_normal()) * 2.0**-20])
    for _ in range(20):  # exact-grid rows and near-grid rows (one term off the grid, or S at the limit)
        n = int(rng.choice([1, 2, 4, 8, 16, 3, 5, 12]))
        q = int(rng.integers(-30, 10))
        ints = rng.integers(-(2**20), 2**20, n).astype(np.float64)
        row = (ints * 2.0**q).tolist()
        rows.append(row)
        rows.append([*row[:-1], row[-1] + 2.0 ** (q - 1)])  # off the grid by half a grid step
        rows.append([2.0 ** (52 + q), *([2.0**q] * (n - 1))])  # S = 2^(52+q) + (n-1) 2^q: near 2^(53+q)
        rows.append([2.0 ** (53 + q) - 2.0**q, 2.0**q, *([0.0] * (n - 1))])  # S = 2^(53+q) exactly
    for _ in range(10):  # subnormal products (FP32 x FP32 below 2^-149 and FP64 subnormals)
        n = int(rng.integers(1, 20))
        rows.append((rng.standard_normal(n) * 2.0 ** rng.integers(-1074, -1000, n)).tolist())
        rows.append((rng.standard_normal(n) * 2.0 ** rng.integers(-200, -140, n)).tolist())
    for _ in range(10):  # terms spanning more than 2^100
        n = int(rng.integers(3, 40))
        rows.append((rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)).tolist())
        rows.append([2.0**60, -(2.0**60), *(rng.standard_normal(n) * 2.0**-50).tolist()])
    for _ in range(40):  # random rows, n = 1 and odd n included
        n = int(rng.choice([1, 2, 3, 7, 33, 127, 128, 129, 300]))
        rows.append((rng.standard_normal(n).astype(np.float32).astype(np.float64)
                     * rng.standard_normal(n).astype(np.float32).astype(np.float64)).tolist())
    return rows


def _by_width(rows: list[list[float]]) -> dict[int, np.ndarray]:
    out: dict[int, list[list[float]]] = {}
    for r in rows:
        out.setdefault(len(r), []).append(r)
    return {n: np.array(rs, dtype=np.float64) for n, rs in out.items()}


def _exact(kind: OpKind, row: list[float]) -> tuple[int, int]:
    return C.decide(C.exact_element_of_terms(kind, row))


@pytest.mark.parametrize("kind", SUMS, ids=[k.name for k in SUMS])
def test_term_rows_decide_as_the_numpy_path_and_exactly(kind: OpKind) -> None:
    rng = np.random.default_rng(int(kind) + 7)
    n_rows = n_decided = n_checked = 0
    for n, t in _by_width(adversarial_rows(kind, rng)).items():
        b0, c0, ok0 = C._decide_rows_np(kind, t, n)
        kept, b1, c1, ok1 = native_rows.decide(kind, None, None, rows=torch.from_numpy(t))
        assert np.array_equal(kept, np.arange(len(t)))
        assert np.array_equal(ok0, ok1), (n, np.flatnonzero(ok0 != ok1))
        assert np.array_equal(b0, b1), (n, np.flatnonzero(b0 != b1))
        assert np.array_equal(c0, c1), (n, np.flatnonzero(c0 != c1))
        n_rows += len(t)
        n_decided += int(ok1.sum())
        for k in np.flatnonzero(ok1)[:: max(1, int(ok1.sum()) // 60)].tolist():  # exact rationals are slow
            assert (int(b1[k]), int(c1[k])) == _exact(kind, t[k].tolist()), (n, t[k].tolist())
            n_checked += 1
        # decide_rows (the data-parallel entry: C, fsum, exact) is the exact decision on every row
        bits, codes, _ = C.decide_rows(kind, torch.from_numpy(t))
        for k in range(0, len(t), max(1, len(t) // 12)):
            assert (int(bits[k]), int(codes[k])) == _exact(kind, t[k].tolist()), (n, t[k].tolist())
    assert 0 < n_decided < n_rows, "the rows exercise both the decided and the undecided paths"
    assert n_checked > 30


@pytest.mark.parametrize("kind", SUMS, ids=[k.name for k in SUMS])
def test_the_grid_kernel_is_grid_exact(kind: OpKind) -> None:
    rng = np.random.default_rng(3)
    for n, t in _by_width(adversarial_rows(kind, rng)).items():
        want = C.grid_exact(kind, t).numpy()
        x = torch.from_numpy(t.astype(np.float32))  # SUM/MEAN rows of FP32 values
        if np.array_equal(x.double().numpy(), t) and kind != OpKind.MATMUL:
            got = native_rows.grid(kind, [x], np.arange(len(t)))
            assert np.array_equal(got, want), n


def _op(kind: OpKind, n_in: int):
    from types import SimpleNamespace

    return SimpleNamespace(kind=kind, inputs=tuple(range(n_in)))


def _matmul_inputs(rng: np.random.Generator, batch: tuple[int, ...], m: int, k: int, n: int, bias: bool,
                   grid: bool) -> list[torch.Tensor]:
    if grid:  # few-bit values: exact-grid rows with exact midpoint ties among them
        a = rng.integers(-8, 8, (*batch, m, k)) * 2.0**-3
        b = rng.integers(-8, 8, (*batch, n, k)) * 2.0**-4
    else:
        a = rng.standard_normal((*batch, m, k)) * 2.0 ** rng.integers(-3, 3, (*batch, m, k))
        b = rng.standard_normal((*batch, n, k))
    ins = [torch.from_numpy(a.astype(np.float32)), torch.from_numpy(b.astype(np.float32))]
    if bias:
        ins.append(torch.from_numpy((rng.integers(-8, 8, n) * 2.0**-5 if grid else rng.standard_normal(n))
                                    .astype(np.float32)))
    return ins


def _fp64_matmul(ins: list[torch.Tensor]) -> torch.Tensor:
    v = ins[0].double() @ ins[1].double().transpose(-1, -2)
    return v + ins[2].double() if len(ins) == 3 else v


CASES = [  # (batch, m, k, n, bias, grid)
    ((), 16, 32, 12, True, True),
    ((), 16, 33, 12, False, True),
    ((), 24, 64, 16, True, False),
    ((3,), 8, 16, 8, False, True),
    ((2, 2), 8, 17, 8, True, True),
    ((), 9, 1, 7, False, True),
]


@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}m{c[1]}k{c[2]}n{c[3]}{'+bias' if c[4] else ''}"
                                             f"{'-grid' if c[5] else ''}" for c in CASES])
def test_matmul_candidates_decide_as_the_numpy_path(case) -> None:
    """Every element a candidate (so the tight filter drops many), from the op's FP32 inputs: the C
    call's drops, bits, codes and decided flags are the numpy path's; decided ones are exact."""
    batch, m, k, n, bias, grid = case
    rng = np.random.default_rng(m * k + n)
    ins = _matmul_inputs(rng, batch, m, k, n, bias, grid)
    v = _fp64_matmul(ins)
    out = v.float().add_(0.0).reshape(-1)
    vf = v.reshape(-1)  # every third FP64 value moved onto a midpoint of its output: the filter keeps it
    vf[::3] = (out[::3].double() + torch.nextafter(out[::3], torch.tensor(np.inf)).double()) / 2
    cand = torch.arange(v.numel())
    nt = k + bias
    got = native_rows.decide(OpKind.MATMUL, ins, cand,
                             tight=(v.reshape(-1), out, TRAINER_BOUND_SLACK * gamma(nt), C._BAND))
    kept, b1, c1, ok1 = got
    t, _ = C._terms(_op(OpKind.MATMUL, len(ins)), ins, cand)
    tn = t.numpy()
    s_abs = np.abs(tn).sum(axis=1)
    still = C._tight_candidates(tn, nt, s_abs, v.reshape(-1).numpy(), out.numpy())
    assert np.array_equal(kept, still)
    assert 0 < len(still) < len(cand)
    b0, c0, ok0 = C._decide_rows_np(OpKind.MATMUL, tn[still], nt, s_abs[still])
    assert np.array_equal(ok0, ok1) and np.array_equal(b0, b1) and np.array_equal(c0, c1)
    for j, pos in enumerate(still.tolist()[:40]):
        if ok0[j]:
            assert (int(b0[j]), int(c0[j])) == _exact(OpKind.MATMUL, tn[pos].tolist())
    # and through the trainer's entry, native and numpy (the whole op's decision, fsum and exact included)
    op = _op(OpKind.MATMUL, len(ins))
    nat = C._decide_candidates(op, ins, v, out.clone(), cand)
    ref = C._decide_candidates_np(op, ins, v, out.clone(), cand)
    assert (nat is None) == (ref is None)
    if nat is not None:
        for x, y in zip(nat, ref, strict=True):
            assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN], ids=["SUM", "MEAN"])
@pytest.mark.parametrize("n", [1, 7, 16, 48, 129])
def test_reduce_candidates_decide_as_the_numpy_path(kind: OpKind, n: int) -> None:
    rng = np.random.default_rng(n)
    x = (rng.integers(-64, 64, (40, n)) * 2.0**-6).astype(np.float32)  # grid rows with ties
    x[20:] = rng.standard_normal((20, n)).astype(np.float32) * 2.0 ** rng.integers(-20, 20, (20, n))
    ins = [torch.from_numpy(x)]
    cand = np.arange(40, dtype=np.int64)[::-1].copy()  # any order of candidates
    kept, b1, c1, ok1 = native_rows.decide(kind, ins, cand)
    assert np.array_equal(kept, cand)
    t, _ = C._terms(_op(kind, 1), ins, torch.from_numpy(cand))
    b0, c0, ok0 = C._decide_rows_np(kind, t.numpy(), n)
    assert np.array_equal(ok0, ok1) and np.array_equal(b0, b1) and np.array_equal(c0, c1)
    for k in np.flatnonzero(ok1).tolist()[:20]:
        assert (int(b1[k]), int(c1[k])) == _exact(kind, t[k].tolist())
    grid = native_rows.grid(kind, ins, cand)
    assert np.array_equal(grid, C.grid_exact(kind, t).numpy())
    assert grid.any() == (kind == OpKind.SUM or n & (n - 1) == 0)


def _claims(kind: OpKind, ins: list[torch.Tensor], index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Right claims (RN32 of the exact value) and wrong ones (a neighbour of it) for each element."""
    t, n = C._terms(_op(kind, len(ins)), ins, torch.from_numpy(index))
    right = []
    for row in t.tolist():
        e = sum((Fraction(x) for x in row), Fraction(0)) / (n if kind == OpKind.MEAN else 1)
        right.append(C.X.rn32(e))
    right_a = np.array(right, dtype=np.uint32)
    f = right_a.view(np.float32)
    up = np.nextafter(f, np.float32(np.inf)).view(np.uint32)
    down = np.nextafter(f, np.float32(-np.inf)).view(np.uint32)
    return right_a, np.where(np.arange(len(f)) % 2 == 0, up, down).astype(np.uint32)


@pytest.mark.parametrize("kind", SUMS, ids=[k.name for k in SUMS])
def test_is_exact_rounding_native_is_the_numpy_path(kind: OpKind, monkeypatch) -> None:
    rng = np.random.default_rng(int(kind))
    if kind == OpKind.MATMUL:
        ins = _matmul_inputs(rng, (2,), 6, 16, 5, True, True)
        ins2 = _matmul_inputs(rng, (), 6, 24, 5, False, False)
    else:
        ins = [torch.from_numpy((rng.integers(-64, 64, (30, 16)) * 2.0**-6).astype(np.float32))]
        ins2 = [torch.from_numpy(rng.standard_normal((30, 9)).astype(np.float32))]
    if kind == OpKind.MATMUL:  # exact ties: 4096^2 + odd = 2^24 + odd, a midpoint of FP32
        a = np.tile(np.array([4096.0, 1.0, 2.0**-30], np.float32), (6, 1))
        b = np.array([[4096.0, 2 * j + 1, 2.0**-30 * (j % 2)] for j in range(5)], np.float32)
        ties = [torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(np.zeros(5, np.float32))]
    else:
        x = np.zeros((12, 16), np.float32)
        x[:, 0], x[:, 1] = 2.0**28, 16 * (2 * np.arange(12) + 1)  # MEAN 2^24 + odd, SUM 2^28 + 16 odd
        x[:, 2], x[:, 3] = 2.0**40, -(2.0**40)  # off the grid
        ties = [torch.from_numpy(x)]
    op_seen = 0
    for xs in (ins, ins2, ties):
        op = _op(kind, len(xs))
        size = (_fp64_matmul(xs).numel() if kind == OpKind.MATMUL else xs[0].shape[0])
        index = np.arange(size, dtype=np.int64)
        right, wrong = _claims(kind, xs, index)
        for claimed, want in ((right, True), (wrong, False)):
            calls: dict[str, list] = {"native": [], "numpy": []}
            fsum = C._is_rn32_fsum
            for mode in ("native", "numpy"):
                if mode == "numpy":
                    monkeypatch.setattr(native_rows, "_LIB", None)

                def spy(terms, scale, c, seen=calls[mode], fsum=fsum):
                    seen.append((terms, scale, float(c)))
                    return fsum(terms, scale, c)

                monkeypatch.setattr(C, "_is_rn32_fsum", spy)
                got = C.is_exact_rounding(op, None, xs, index, claimed)
                assert got.all() if want else not got.any(), (mode, want)
                monkeypatch.undo()
            assert calls["native"] == calls["numpy"], "the same elements are too close to call in FP64"
            op_seen += len(calls["native"])
    assert op_seen > 0, "exact ties reach the fsum signs"


def _steps(spec, steps: int, native: bool, monkeypatch, check: bool = False):
    from vtrain.graph.executor import state_tensors
    from vtrain.torch_ref import executor_for
    from vtrain.training.loop import batch_for, component_roots
    from vtrain.training.spec import build_job

    if not native:
        monkeypatch.setattr(native_rows, "_LIB", None)
    job = build_job(spec)
    ex = executor_for(job, "certified")
    state = state_tensors(job.initial_state)
    out = []
    resolver = None
    if check:
        from types import SimpleNamespace

        from protocol.auditor import exact_resolver
        from vtrain.commit.trace import GraphCommitment

        resolver = exact_resolver(SimpleNamespace(graph=GraphCommitment.of(job.graph)))
    for s in range(1, steps + 1):
        res = ex.run(state, batch_for(job, s), step=s)
        entry = (component_roots(res.state), encode_step_log(res.log, s, job.graph), res.log.n_entries)
        if check:
            rep = ex.run(state, batch_for(job, s), log_in=res.log, step=s, check=True, resolver_factory=resolver)
            entry += (component_roots(rep.state), len(rep.violations))
        out.append(entry)
        state = res.state
    monkeypatch.undo()
    return out


def _specs():
    from vtrain.models.nn import GPTConfig, MLPConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.training.spec import TrainSpec

    mlp = TrainSpec(model="mlp", batch_size=16, steps=3, mode="certified",
                    mlp=MLPConfig(n_in=64, hidden=(32,), n_out=10))
    gpt = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4, steps=2, mode="certified",
                    gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16))
    # a wide output head: its backward MATMULs' softmax-gradient rows are where the Hoelder filter bites
    head = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=2, steps=2, mode="certified",
                     gpt=GPTConfig(vocab=3000, n_layer=1, d_model=32, n_head=2, context=16))
    return {"mlp": mlp, "gpt": gpt, "gpt-wide-head": head}


@pytest.mark.parametrize("name", ["mlp", "gpt", "gpt-wide-head"])
def test_executor_steps_are_the_same_with_the_kernels_on_and_off(name: str, monkeypatch) -> None:
    """Also where the MATMUL epilogue decides every candidate and hands back only the entries due
    (``MatmulRound.entries``: its bits written, the entries compacted in C), which the GPTs reach."""
    spec = _specs()[name]
    epilogue, compacted = native_rows.matmul_round_norm, []

    def spy(*args, **kwargs):
        got = epilogue(*args, **kwargs)
        compacted.append(got.entries is not None)
        return got

    monkeypatch.setattr(native_rows, "matmul_round_norm", spy)
    on = _steps(spec, spec.steps, True, monkeypatch, check=True)  # (its undo() drops the spy too)
    off = _steps(spec, spec.steps, False, monkeypatch, check=True)
    assert on == off
    if name != "mlp":  # (the MLP's candidates are exact-grid ties: its logs are empty)
        assert sum(e[2] for e in on) > 0, "the steps log entries"
        assert any(compacted), "some MATMUL hands back its entries alone"
    for roots, _, _, rep_roots, violations in on:  # the auditor's checked replay agrees and flags nothing
        assert rep_roots == roots and violations == 0


@pytest.mark.slow
def test_bench_gpt_steps_are_the_same_with_the_kernels_on_and_off(monkeypatch) -> None:
    """The benchmark's small GPT (scripts/bench_numerics.py), a few steps with the auditor's checked replay."""
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.training.spec import TrainSpec

    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=8, steps=4, mode="certified",
                     gpt=GPTConfig(n_layer=2, d_model=64, n_head=4, context=32))
    on = _steps(spec, spec.steps, True, monkeypatch, check=True)
    assert on == _steps(spec, spec.steps, False, monkeypatch, check=True)
    assert sum(e[2] for e in on) > 0
    assert all(e[3] == e[0] for e in on)  # (an explicit entry may be flagged for the resolver, which upholds it)


def test_an_index_outside_the_op_is_refused_not_read() -> None:
    """Indices can come from a counterparty's log (``is_exact_rounding``): the kernels check them."""
    rng = np.random.default_rng(5)
    mm = _matmul_inputs(rng, (2,), 4, 8, 3, True, False)
    red = [torch.from_numpy(rng.standard_normal((5, 6)).astype(np.float32))]
    for kind, ins, size in ((OpKind.MATMUL, mm, 2 * 4 * 3), (OpKind.SUM, red, 5), (OpKind.MEAN, red, 5)):
        for bad in (size, -1, 2**40):
            idx = np.array([0, bad], dtype=np.int64)
            with pytest.raises(IndexError, match="expected element indices"):
                native_rows.decide(kind, ins, idx)
            with pytest.raises(IndexError, match="expected element indices"):
                native_rows.is_rn32(kind, ins, idx, np.zeros(2, np.uint32))
            with pytest.raises(IndexError, match="expected element indices"):
                native_rows.grid(kind, ins, idx)
        ok = np.arange(size, dtype=np.int64)
        assert len(native_rows.decide(kind, ins, ok)[0]) == size
    # a batch b does not have (broadcast) is left to the numpy path
    assert native_rows.decide(OpKind.MATMUL, [mm[0], mm[1][:1]], np.array([0])) is None


@pytest.mark.parametrize("kind", SUMS, ids=[k.name for k in SUMS])
def test_is_exact_rounding_of_special_claims_is_the_numpy_path(kind: OpKind, monkeypatch) -> None:
    """Non-finite, zero, signed-zero and extreme claims: the same verdicts natively and in numpy."""
    rng = np.random.default_rng(11)
    if kind == OpKind.MATMUL:
        ins = _matmul_inputs(rng, (), 2, 4, 4, False, True)
        ins[0][0] = 0.0  # a zero row: e = 0 exactly
    else:
        ins = [torch.from_numpy((rng.integers(-4, 4, (8, 4)) * 0.5).astype(np.float32))]
        ins[0][0] = 0.0
    special = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x80000000, 0x00000000, 0x7F7FFFFF, 0x00000001,
                        0x3F800000], dtype=np.uint32)
    index = np.zeros(len(special), dtype=np.int64)  # the zero element: only +0 is right
    op = _op(kind, len(ins))
    if kind == OpKind.MATMUL:
        desc = C.X.OpDesc(int(kind), (0, 1), (2, 4), ((2, 4), (4, 4)), ())
    else:
        desc = C.X.OpDesc(int(kind), (0,), (8, 1), ((8, 4),), ())
    nat = C.is_exact_rounding(op, desc, ins, index, special)
    monkeypatch.setattr(native_rows, "_LIB", None)
    ref = C.is_exact_rounding(op, desc, ins, index, special)
    assert np.array_equal(nat, ref)
    # -0 is not RN32(0): a zero result is +0, and the contract's rule rejects a -0 claim
    # (tests/vectors/rule.json, "zero: -0")
    assert nat.tolist() == [False, False, False, False, True, False, False, False]


def _decide_into_case(kind: OpKind, ins: list[torch.Tensor], cand: np.ndarray, tight_of) -> int:
    """``decide_into`` against ``decide``: on all candidates (some need the full path: nothing may be
    written) and on those ``decide`` settles with no entry (their bits written, canonical zeros, the
    rest of the output untouched), reading ``r`` from the very array it writes."""
    out = tight_of(None)[1] if tight_of(None) is not None else torch.from_numpy(
        np.random.default_rng(0).standard_normal(int(np.prod(_out_shape(kind, ins)))).astype(np.float32))
    kept, bits, codes, ok = native_rows.decide(kind, ins, cand, tight=tight_of(out))
    need = int((~ok | (codes != 0)).sum())
    before = out.clone()
    if need:  # (exact-grid matmuls have none: every row settled, written below)
        assert native_rows.decide_into(kind, ins, torch.from_numpy(cand), out, tight=tight_of(out)) == need
        assert torch.equal(out.view(torch.int32), before.view(torch.int32))  # nothing written
    easy = kept[ok & (codes == 0)]
    assert len(easy)
    assert native_rows.decide_into(kind, ins, torch.from_numpy(easy), out, tight=tight_of(out)) == 0
    want = before.numpy().copy()
    sel = ok & (codes == 0)
    want[easy] = bits[sel].astype(np.uint32).view(np.float32) + np.float32(0.0)
    assert np.array_equal(out.numpy().view(np.uint32), want.view(np.uint32))
    return need


def _out_shape(kind: OpKind, ins: list[torch.Tensor]) -> tuple[int, ...]:
    return tuple(ins[0].shape[:-1]) if kind != OpKind.MATMUL else (*ins[0].shape[:-1], ins[1].shape[-2])


@pytest.mark.parametrize("case", CASES[:5], ids=[f"b{c[0]}m{c[1]}k{c[2]}" for c in CASES[:5]])
def test_decide_into_writes_only_a_fully_settled_matmul(case) -> None:
    batch, m, k, n, bias, grid = case
    rng = np.random.default_rng(m * k + n)
    ins = _matmul_inputs(rng, batch, m, k, n, bias, grid)
    v = _fp64_matmul(ins)
    out = v.float().add_(0.0).reshape(-1)
    vf = v.reshape(-1)
    vf[::3] = (out[::3].double() + torch.nextafter(out[::3], torch.tensor(np.inf)).double()) / 2
    nt = k + bias

    def tight_of(r):
        return (vf, out if r is None else r, TRAINER_BOUND_SLACK * gamma(nt), C._BAND)

    _decide_into_case(OpKind.MATMUL, ins, np.arange(v.numel(), dtype=np.int64), tight_of)


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MEAN], ids=["SUM", "MEAN"])
@pytest.mark.parametrize("n", [16, 48])
def test_decide_into_writes_only_fully_settled_sums(kind: OpKind, n: int) -> None:
    rng = np.random.default_rng(n)
    x = (rng.integers(-64, 64, (40, n)) * 2.0**-6).astype(np.float32)
    x[20:] = rng.standard_normal((20, n)).astype(np.float32) * 2.0 ** rng.integers(-20, 20, (20, n))
    x[39] = 0.0
    w = n if kind == OpKind.MEAN else 1  # e = 1 + 2^-24, an exact midpoint, off the grid: an entry
    x[39, :4] = [w * 1.0, w * 2.0**-24, 2.0**-80, -(2.0**-80)]
    assert _decide_into_case(kind, [torch.from_numpy(x)], np.arange(40, dtype=np.int64)[::-1].copy(), lambda r: None)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_library_built_from_older_sources_is_refused_whole(tmp_path: Path) -> None:
    """A stale ``_kernels.so`` (an older ABI, lacking a kernel the Python side binds) is refused
    with a warning naming the rebuild, and every module falls back to numpy: no AttributeError at
    import (what a checkout updated without ``make native`` hit)."""
    src = tmp_path / "old.c"
    src.write_text("int vt_numerics_abi_version(void) { return 1; }\n")
    lib = tmp_path / "old.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    root = Path(__file__).resolve().parents[1]
    code = ("from vtrain.numerics import native, native_rows, native_filter, fp32_native\n"
            "print(native.available(), native_rows.available())")
    env = {**os.environ, "VTRAIN_NATIVE_NUMERICS_LIB": str(lib), "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]
    assert "expected ABI version" in r.stderr and "make native" in r.stderr


def _epilogue_reference(ins: list[torch.Tensor], v: torch.Tensor) -> tuple:
    """The trainer's MATMUL epilogue kernel by kernel (``executor._norm_bound``, ``round_filter``,
    ``decide``/``decide_into``): ``(v + bias, r, cand, finite, decisions, attention)``."""
    from vtrain.graph.executor import _norm_bound
    from vtrain.numerics import native_filter as NF

    x = [t.double() for t in ins]
    v = v.clone()
    nt = ins[0].shape[-1] + (len(ins) == 3)
    d = _norm_bound(x, v, True, ins)  # (adds the bias to v)
    r, cand, finite = NF.round_filter(v, _cauchy_schwarz(d), C._BAND)
    if 16 * len(cand) > (v.numel() // v.shape[-1]) + ins[1].numel() // ins[1].shape[-1]:  # the kernel's rule
        r, cand, finite = NF.round_filter(v, d, C._BAND)  # Hoelder's norms pay: the three-product bound
    if not finite or not len(cand):
        return v, r, cand, finite, None, 0
    tight = (v.reshape(-1), r.reshape(-1), TRAINER_BOUND_SLACK * gamma(nt), C._BAND)
    dec = native_rows.decide(OpKind.MATMUL, ins, cand, tight=tight)
    attention = int((~dec[3] | (dec[2] != 0)).sum())
    if not attention:
        assert native_rows.decide_into(OpKind.MATMUL, ins, torch.from_numpy(cand), r.reshape(-1), tight=tight) == 0
    return v, r, cand, finite, dec, attention


def _cauchy_schwarz(d):
    """A ``NormBound`` with its Cauchy-Schwarz product alone."""
    from dataclasses import replace

    return replace(d, na1=None, nai=None, nb1=None, nbi=None)


def _epilogue_inputs(case, spoil: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A MATMUL's FP32 operands and FP64 products (no bias); every third product moved onto a
    midpoint (candidates), element 0 exactly on a midpoint off the grid where ``K >= 4`` (an entry);
    ``spoil="inf"``: one product past FP32's range (no decision is taken)."""
    batch, m, k, n, bias, grid = case
    rng = np.random.default_rng(m * k + n + 1)
    ins = _matmul_inputs(rng, batch, m, k, n, bias, grid)
    if k >= 4:  # e = 1 + 2^-24: a midpoint of FP32, and the 2^-80 terms keep it off the exact grid
        first = (0,) * len(batch) + (0,)
        ins[0][first] = 0.0
        ins[1][first] = 0.0
        ins[0][first][:4] = torch.tensor([1.0, 2.0**-24, 2.0**-80, -(2.0**-80)])
        ins[1][first][:4] = 1.0
        if bias:
            ins[2][0] = 0.0
    v = ins[0].double() @ ins[1].double().transpose(-1, -2)
    vf = v.reshape(-1)
    out = vf.float()
    vf[::3] = (out[::3].double() + torch.nextafter(out[::3], torch.tensor(np.inf)).double()) / 2
    if spoil == "inf":
        vf[1] = 2.0**200
    return ins, v


@pytest.mark.parametrize("spoil", ["", "inf"])
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}m{c[1]}k{c[2]}n{c[3]}{'+bias' if c[4] else ''}"
                                             f"{'-grid' if c[5] else ''}" for c in CASES])
def test_matmul_epilogue_is_its_kernels_in_order(case, spoil: str, monkeypatch) -> None:
    """``matmul_round_norm`` (one C call) against the kernels it composes, called one by one: the same
    biased ``v``, ``r`` bits, candidates, finiteness, decisions and attention count; also where the
    decisions do not fit the handed-back buffer (then none is handed back)."""
    ins, v = _epilogue_inputs(case, spoil)
    v_ref, r_ref, cand_ref, finite_ref, dec_ref, att_ref = _epilogue_reference(ins, v)
    _epilogue_matches(ins, v, (v_ref, r_ref, cand_ref, finite_ref, dec_ref, att_ref), monkeypatch)
    assert (spoil == "" and case[2] >= 4) == (att_ref > 0), "the exact midpoint needs an entry (spoiled: none)"


def _epilogue_matches(ins: list[torch.Tensor], v: torch.Tensor, ref: tuple, monkeypatch) -> None:
    """``matmul_round_norm`` gives ``ref`` (:func:`_epilogue_reference`'s result), with the decisions
    in the handed-back buffer and, past it (``_KEEP_DECISIONS`` 1), in the kernel's own."""
    v_ref, r_ref, cand_ref, finite_ref, dec_ref, att_ref = ref
    nt = ins[0].shape[-1] + (len(ins) == 3)
    coef = TRAINER_BOUND_SLACK * gamma(nt)
    args = (len(ins) == 3, nt * 2.0**-149, coef * (1.0 + (nt + 4) * 2.0**-52), C._BAND, coef)
    for cap in (native_rows._KEEP_DECISIONS, 1):
        monkeypatch.setattr(native_rows, "_KEEP_DECISIONS", cap)
        vv = v.clone()
        got = native_rows.matmul_round_norm(ins, vv, native_rows.matmul_operands(ins, vv), *args)
        assert torch.equal(vv.view(torch.int64), v_ref.view(torch.int64))
        assert torch.equal(got.r.view(torch.int32), r_ref.view(torch.int32))
        assert np.array_equal(got.cand, cand_ref) and got.finite == finite_ref and got.attention == att_ref
        if att_ref:
            assert all(np.array_equal(x, y) for x, y in zip(got.decided, dec_ref, strict=True))
        else:
            assert got.decided is None


def test_hoelder_row_norms_are_their_specification() -> None:
    """``vt_row_norms1inf32`` (the norm bound's 1- and inf-norms) on its AVX2 loop and its base loop
    against the numpy path of ``native_filter.row_norms1inf`` (16 lanes), bitwise, at row lengths
    around the lanes, with zeros, -0, subnormals and wide exponents."""
    import ctypes

    from vtrain.numerics import native
    from vtrain.numerics import native_filter as NF

    lib = native.lib()
    lib.vt_norms_set_simd.argtypes = [ctypes.c_int]
    rng = np.random.default_rng(7)
    try:
        for simd in (1, 0):
            lib.vt_norms_set_simd(simd)
            for k in (0, 1, 15, 16, 17, 31, 33, 100):
                x = rng.standard_normal((2, 5, k)) * 2.0 ** rng.integers(-140, 100, (2, 5, k))
                x[0, 0, ::3] = -0.0
                x = torch.from_numpy(x.astype(np.float32))
                got = NF.row_norms1inf(x)
                want = NF.row_norms1inf(x.double())  # (not FP32: numpy's path)
                assert got[0].shape == (2, 5, 1) == want[0].shape
                assert torch.equal(got[0].view(torch.int64), want[0].view(torch.int64)), (simd, k)
                assert torch.equal(got[1], want[1]), (simd, k)
                assert torch.equal(got[1], x.double().abs().amax(-1, keepdim=True) if k else got[1] * 0)
                assert torch.allclose(got[0], x.double().abs().sum(-1, keepdim=True), rtol=1e-14, atol=0)
    finally:
        lib.vt_norms_set_simd(1)


def _peaked_matmul(rng, m: int, k: int, n: int, peaked: str) -> tuple:
    """A softmax-gradient-like MATMUL's FP32 operands (rows of tiny values with one large one, against
    wide dense rows; ``peaked``: which operand has the peaked rows), their FP64 copies, the products,
    and the Cauchy-Schwarz and Hoelder reaches (``gamma(k)`` band) of every product."""
    a = rng.random((m, k)) * 2.0**-20
    a[np.arange(m), rng.integers(0, k, m)] = -1.0
    b = rng.standard_normal((n, k)) * 0.02
    if peaked == "b":
        a, b = b[:m] * 1.0, np.concatenate([a, a[: n - m]])
    ins = [torch.from_numpy(a.astype(np.float32)), torch.from_numpy(b.astype(np.float32))]
    x = [t.double() for t in ins]
    g = gamma(k) * C._BAND
    cs = g * (x[0].norm(dim=1)[:, None] * x[1].norm(dim=1)[None, :])
    hoelder = g * torch.minimum(x[0].abs().sum(1)[:, None] * x[1].abs().amax(1)[None, :],
                                x[0].abs().amax(1)[:, None] * x[1].abs().sum(1)[None, :])
    return ins, x, x[0] @ x[1].T, cs, hoelder


@pytest.mark.parametrize("peaked", ["a", "b"])
def test_matmul_filter_on_peaked_rows_is_tighter_and_misses_nothing(peaked: str, monkeypatch) -> None:
    """A softmax-gradient-like MATMUL (rows of tiny values with one large one, against wide dense
    rows: the Cauchy-Schwarz bound is ~10x ``|a|_1 |b|_inf``): ``v`` planted between the two bounds'
    reaches from a midpoint on every third element and on a midpoint on every seventh. The norm
    bound's filter drops the first kind (a Cauchy-Schwarz-only filter keeps them), keeps every element
    whose exact tight bound reaches a midpoint, and the epilogue gives the kernels' bits, the
    decisions handed back past the buffer too. ``peaked``: which operand has the peaked rows (so that
    ``|a|_1 |b|_inf``, or ``|a|_inf |b|_1``, is the smallest product)."""

    from vtrain.graph.executor import _norm_bound
    from vtrain.numerics import native_filter as NF
    from vtrain.numerics.rounding import midpoint_candidates_np

    m, k, n = 24, 2048, 40
    ins, x, v, cs, hoelder = _peaked_matmul(np.random.default_rng(3), m, k, n, peaked)
    assert bool((hoelder * 8 < cs).all())
    vf, out = v.reshape(-1), v.reshape(-1).float()
    mid = (out.double() + torch.nextafter(out, torch.tensor(np.inf)).double()) / 2
    between = (cs * hoelder).sqrt().reshape(-1)  # sqrt(cs h): out of the Hoelder reach, in the C-S one
    vf[::3] = mid[::3] + between[::3]
    vf[::7] = mid[::7]
    ref = _epilogue_reference(ins, v)
    d = _norm_bound(x, v.clone(), True, ins)
    _, cand_cs, _ = NF.round_filter(v, _cauchy_schwarz(d), C._BAND)
    assert len(ref[2]) < len(cand_cs) / 2 and np.isin(ref[2], cand_cs).all(), (len(ref[2]), len(cand_cs))
    s_abs = (x[0].abs() @ x[1].abs().T).reshape(-1).numpy()
    need = midpoint_candidates_np(vf.numpy(), vf.float().numpy(), 1.25 * gamma(k) * (s_abs + k * 2.0**-149) * C._BAND)
    assert len(need) >= len(vf) // 7 and np.isin(need, ref[2]).all()
    assert np.array_equal(d.at(ref[2]), NF.dense(d).reshape(-1).numpy()[ref[2]])  # the lazy reads, the dense bits
    _epilogue_matches(ins, v, ref, monkeypatch)


def test_few_cauchy_schwarz_candidates_skip_the_hoelder_norms_and_keep_the_same_rows(monkeypatch) -> None:
    """Where the Cauchy-Schwarz filter leaves no more candidates than 1/16 of A's and B's rows, the epilogue
    skips Hoelder's norms and hands its list to the tight re-filter: on peaked rows (where the
    three-product bound is far tighter) with a handful of products planted between the two bounds'
    reaches and a few on midpoints, its list is the Cauchy-Schwarz one (a superset of the
    three-product one), and the rows the tight re-filter keeps, their bits, codes and flags, and ``r``
    are those of the three-product list: which bound picked a candidate changes nothing."""
    from vtrain.graph.executor import _norm_bound
    from vtrain.numerics import native_filter as NF

    m, k, n = 4, 2048, 2000
    ins, x, v, cs, hoelder = _peaked_matmul(np.random.default_rng(4), m, k, n, "a")
    vf, out = v.reshape(-1), v.reshape(-1).float()
    mid = (out.double() + torch.nextafter(out, torch.tensor(np.inf)).double()) / 2
    between = (cs * hoelder).sqrt().reshape(-1)
    vf[::400] = mid[::400] + between[::400]  # 20 planted between the reaches
    vf[5::801] = mid[5::801]  # 10 on midpoints
    d = _norm_bound(x, v.clone(), True, ins)
    r3, cand3, _ = NF.round_filter(v, d, C._BAND)
    rcs, cand_cs, _ = NF.round_filter(v, _cauchy_schwarz(d), C._BAND)
    assert len(cand3) < len(cand_cs) and 16 * len(cand_cs) <= m + n and np.isin(cand3, cand_cs).all()
    ref = _epilogue_reference(ins, v)
    assert np.array_equal(ref[2], cand_cs)
    _epilogue_matches(ins, v, ref, monkeypatch)
    tight = (vf, r3.reshape(-1), TRAINER_BOUND_SLACK * gamma(k), C._BAND)
    dec3 = native_rows.decide(OpKind.MATMUL, ins, cand3, tight=tight)
    assert len(dec3[0]) >= 10 and all(np.array_equal(p, q) for p, q in zip(ref[4], dec3, strict=True))
    assert torch.equal(r3.view(torch.int32), rcs.view(torch.int32))
