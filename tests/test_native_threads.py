"""The native kernels on several threads (csrc/numerics/parallel.c): every threaded kernel gives the
one-thread bits, candidate lists (in order) and NaN/Inf flags, on arrays large enough to be cut into
parts, with candidates and non-finite values in every part; and a whole certified step is the same
at 1 and 2 torch threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.numerics import fp32_native as F
from vtrain.numerics import native, native_filter

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not built")

GRAIN = 1 << 18  # parallel.h VT_GRAIN: items per part at least


@pytest.fixture
def threads():
    """Runs a callable at 1 thread and at 3, returns both results; restores 1."""
    def both(f):
        assert native.set_threads(1) == 1
        one = f()
        assert native.set_threads(3) == 3
        try:
            many = f()
        finally:
            native.set_threads(1)
        return one, many
    return both


def near_midpoints(n: int, seed: int = 0) -> torch.Tensor:
    """FP64 values, a fifth of them within a few FP64 ulps of an FP32 midpoint, spread over the array,
    with a NaN and an Inf late in it (the last part's)."""
    g = np.random.default_rng(seed)
    f = g.standard_normal(n).astype(np.float32)
    nxt = np.nextafter(f, np.float32(np.inf))
    mid = (f.astype(np.float64) + nxt.astype(np.float64)) / 2
    v = g.standard_normal(n)
    pick = g.random(n) < 0.2
    v[pick] = mid[pick] + g.integers(-3, 4, pick.sum()) * np.spacing(mid[pick])
    v[n - 5] = np.nan
    v[n - 3] = np.inf
    return torch.from_numpy(v)


def same(a, b) -> None:
    """Tensors bit for bit (views as ints), arrays and flags equal, recursively."""
    if isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        iv = {4: torch.int32, 8: torch.int64}[a.element_size()]
        assert torch.equal(a.contiguous().view(iv), b.contiguous().view(iv))
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


N = 3 * GRAIN + 1234


def spread(cand: np.ndarray, n: int) -> bool:
    """Candidates in each eighth of ``n`` elements (so in every part of a cut)."""
    return all(((cand >= q * n // 8) & (cand < (q + 1) * n // 8)).any() for q in range(8))


def test_flat_filters_split_into_parts_keep_their_candidates_in_order(threads) -> None:
    v = near_midpoints(N)
    d = torch.from_numpy(np.abs(np.random.default_rng(1).standard_normal(N)) * 1e-16)
    s32 = torch.from_numpy(np.abs(np.random.default_rng(2).standard_normal(N)).astype(np.float32))
    for bound in (d, native_filter.RelativeBound(v, 4 * 2.0**-53), native_filter.TightBound(s32, 1e-30, 2.0**-52)):
        one, many = threads(lambda bound=bound: native_filter.round_filter(v, bound, 2.0))
        same(one, many)
        assert spread(one[1], N) and one[1][-1] >= N - 5 and not one[2]  # candidates in every part, NaN seen
        assert np.all(np.diff(one[1]) > 0)


def test_the_norm3_filter_split_by_rows(threads) -> None:
    rows, ncols, m = 3 * GRAIN // 512 + 7, 512, 4
    v = near_midpoints(rows * ncols).reshape(rows, ncols)
    g = torch.Generator().manual_seed(0)
    na, na1, nai = (torch.rand(rows, dtype=torch.float64, generator=g) * 1e-9 for _ in range(3))
    nb, nb1, nbi = (torch.rand(rows // m * ncols + ncols, dtype=torch.float64, generator=g)[: (rows // m) * ncols]
                    for _ in range(3))
    rows_used = (rows // m) * m
    v = v[:rows_used].contiguous()
    v[-1, -2] = float("nan")
    bound = native_filter.NormBound(na[:rows_used].contiguous(), nb.reshape(rows // m, ncols), None, m, 1e-30,
                                    1.0 + 2.0**-40, tuple(v.shape), na1[:rows_used].contiguous(),
                                    nai[:rows_used].contiguous(), nb1.reshape(rows // m, ncols),
                                    nbi.reshape(rows // m, ncols))
    one, many = threads(lambda: native_filter.round_filter(v, bound, 2.0))
    same(one, many)
    assert spread(one[1], v.numel()) and not one[2]


def test_sum_filters_and_row_norms_split_by_rows(threads) -> None:
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((3 * GRAIN // 16 + 99, 16)).astype(np.float32))
    x[-1, 3] = float("inf")
    for mean in (False, True):
        one, many = threads(lambda mean=mean: native_filter.sum_round_filter(x, mean, 1.0 + 2.0**-40, 2.0**20))
        same(one, many)
        assert len(one[1]) > 100 and not one[2]
        one, many = threads(lambda mean=mean: native_filter.sum_values_filter(x, mean, 1.0 + 2.0**-40, 2.0**20))
        same(one, many)
    y = x[:-1]
    same(*threads(lambda: native_filter.row_norms(y)))
    same(*threads(lambda: native_filter.row_norms1inf(y)))


def test_chains_and_transposes_split_into_parts(threads) -> None:
    rows, cols = 3 * GRAIN // 100 + 3, 100
    g = torch.Generator().manual_seed(4)
    a = torch.randn(rows, cols, generator=g)
    b = torch.randn(rows, 1, generator=g)  # one value per row
    c = torch.randn(cols, generator=g)  # a tile repeated
    kinds = [((rows, cols), *F.broadcast_kind((rows, cols), (rows, cols))),
             ((rows, 1), *F.broadcast_kind((rows, 1), (rows, cols))),
             ((cols,), *F.broadcast_kind((1, cols), (rows, cols)))]
    assert [k[1] for k in kinds] == [F.FULL, F.ROWS, F.TILE]
    # registers 3.. : a*b, a*b + c, (a*b + c) / a, sqrt(a*b)
    chain = F.Chain((rows, cols), kinds, [(F.MUL, 0, 1), (F.ADD, 3, 2), (F.DIV, 4, 0), (F.SQRT, 3, 0)], [4, 5, 6])
    a[-1, -1] = 0.0  # a 0/0 in the last part: NaN
    one, many = threads(lambda: chain([a, b, c]))
    same(one, many)
    assert one[1] is False
    ref = a * b + c
    assert torch.equal(one[0][0], ref)
    x = torch.randn(3, 517, 1031, generator=g)
    one, many = threads(lambda: F.transpose(x))
    same(one, many)
    assert torch.equal(one, x.transpose(-1, -2).contiguous())
    y = torch.randn(1, 4100, 333, generator=g)  # one matrix, cut by rows
    one, many = threads(lambda: F.transpose(y))
    assert torch.equal(many, y.transpose(-1, -2).contiguous()) and torch.equal(one, many)


def test_a_certified_step_is_the_same_on_one_and_two_threads() -> None:
    """A GPT whose output head, filters and flat AdamW chain are above the grain: two steps at torch
    threads 1 and 2 (the executor hands its count to the kernels) give the same states and logs."""
    from vtrain.graph.executor import StepExecutor, state_tensors
    from vtrain.models.nn import GPTConfig
    from vtrain.models.optim import AdamWConfig
    from vtrain.numerics.logfile import encode_step_log
    from vtrain.training.loop import batch_for
    from vtrain.training.spec import TrainSpec, build_job

    spec = TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=2, steps=3, mode="certified",
                     gpt=GPTConfig(vocab=4096, n_layer=1, d_model=256, n_head=4, context=64))
    job = build_job(spec)
    before = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            ex = StepExecutor(job.graph, "certified", seed=job.spec.data_seed)
            state, out = state_tensors(job.initial_state), []
            for s in (1, 2):
                res = ex.run(state, batch_for(job, s), step=s)
                state = res.state
                out.append((res.loss, encode_step_log(res.log, s, job.graph), [t.clone() for t in state]))
            runs.append(out)
    finally:
        torch.set_num_threads(before)
        native.set_threads(1)
    for (l1, g1, s1), (l2, g2, s2) in zip(*runs, strict=True):
        assert l1 == l2 and g1 == g2
        same(s1, s2)


def test_matmul_decisions_split_by_candidates(threads) -> None:
    """vt_rows_decide with the tight re-filter over many candidates (a MATMUL's FP64 products, every
    output a candidate, some kept, some near-ties): the same kept rows, bits, codes and flags."""
    from vtrain.graph.step_graph import OpKind
    from vtrain.numerics import native_rows
    from vtrain.numerics.rounding import TRAINER_BOUND_SLACK, gamma

    g = torch.Generator().manual_seed(5)
    m, k, n = 600, 64, 700
    a = torch.randn(m, k, generator=g)
    b = torch.randn(n, k, generator=g)
    a[::7] = torch.round(a[::7] * 4) / 4  # exact-grid rows among them
    v = torch.matmul(a.double(), b.double().T).reshape(-1)
    r = v.float()
    cand = np.arange(v.numel(), dtype=np.int64)
    tight = (v, r, TRAINER_BOUND_SLACK * gamma(k), 2.0**22)  # a wide band: many kept
    one, many = threads(lambda: native_rows.decide(OpKind.MATMUL, [a, b], cand, tight=tight))
    same(one, many)
    assert 1000 < len(one[0]) < v.numel() and np.all(np.diff(one[0]) > 0) and one[3].any()
