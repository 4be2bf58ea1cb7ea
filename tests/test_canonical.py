"""The canonical rounding log (vtrain/numerics/canonical.py): outputs and log entries are a function
of the exact values alone, the same for every FP64 evaluation within the certified bound, and every
entry is one the contract upholds (the Python mirror of its rule, vtrain.numerics.exact)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.commit.roots import LogEntry
from vtrain.graph.executor import _compute_fp64
from vtrain.graph.step_graph import GraphBuilder, OpKind
from vtrain.numerics import exact as X
from vtrain.numerics.canonical import _decide_sums, candidates, decide, exact_element, op_desc, round_canonical
from vtrain.numerics.rounding import apply_log, round_output


def _graph(kind: OpKind, shapes: list[tuple[int, ...]]):
    g = GraphBuilder()
    ins = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    if kind == OpKind.MATMUL:
        y = g.matmul(ins[0], ins[1], ins[2] if len(ins) == 3 else None)
    elif kind == OpKind.SUM:
        y = g.sum(ins[0])
    elif kind == OpKind.MEAN:
        y = g.mean(ins[0])
    else:
        y = {OpKind.EXP: g.exp, OpKind.LOG: g.log, OpKind.TANH: g.tanh, OpKind.ERF: g.erf}[kind](ins[0])
    return g, y


def _case(kind: OpKind, rng: np.random.Generator, style: str):
    """A small op and FP32 inputs; ``style`` picks inputs that put many elements near midpoints."""
    if kind == OpKind.MATMUL:
        m, n, k = 6, 5, int(rng.integers(1, 40))
        shapes = [(m, k), (n, k), (n,)]
    elif kind in (OpKind.SUM, OpKind.MEAN):
        shapes = [(8, int(rng.integers(1, 50)))]
    else:
        shapes = [(64,)]
    arrays = []
    for s in shapes:
        if style == "ties":  # small integers times powers of two: exact sums land on midpoints
            a = rng.integers(-3, 4, size=s).astype(np.float32) * np.float32(2.0 ** int(rng.integers(-3, 12)))
            if kind == OpKind.MATMUL and s == shapes[-1]:
                a = a + np.float32(2.0**24 + 1)
        elif style == "cancel":  # large terms that nearly cancel in pairs: ill-conditioned sums
            a = rng.standard_normal(s).astype(np.float32) * np.float32(1e4)
            h = s[-1] // 2
            if len(s) > 1 and h:
                first = len(arrays) == 0  # MATMUL: a's pairs cancel, b's pairs repeat
                noise = rng.standard_normal(a[..., :h].shape).astype(np.float32) * np.float32(1e-3)
                a[..., h : 2 * h] = (-a[..., :h] if first else a[..., :h]) + noise
        else:
            a = rng.standard_normal(s).astype(np.float32)
        if kind in (OpKind.EXP, OpKind.LOG, OpKind.TANH, OpKind.ERF):  # near-ties are rare: plain values in range
            a = np.clip(rng.standard_normal(s) * 3, -20, 20).astype(np.float32)
        if kind == OpKind.LOG:
            a = np.abs(a) + np.float32(1e-3)
        arrays.append(a)
    if kind != OpKind.MATMUL:
        arrays = arrays[:1]
        shapes = shapes[:1]
    g, y = _graph(kind, shapes)
    graph = g.build(y)
    op = graph.ops[y.op]
    return graph, op, [torch.from_numpy(a) for a in arrays]


KINDS = [OpKind.MATMUL, OpKind.SUM, OpKind.MEAN, OpKind.EXP, OpKind.TANH, OpKind.LOG, OpKind.ERF]


def _grid_mask(op, ins: list[torch.Tensor]) -> torch.Tensor:
    """Elements whose every honest FP64 evaluation is exact (the exact-grid rule; all False for
    ops other than MATMUL, SUM, MEAN)."""
    from vtrain.numerics.canonical import _terms, grid_exact

    numel = int(np.prod(op.shape))
    if op.kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
        return torch.zeros(numel, dtype=torch.bool)
    terms, _ = _terms(op, ins, torch.arange(numel))
    return grid_exact(op.kind, terms)


def _perturbed(v: torch.Tensor, d: torch.Tensor, rng: np.random.Generator) -> list[torch.Tensor]:
    """FP64 evaluations an honest machine might return: v itself moved anywhere within +-d (and to
    the ends), as another summation order or device could."""
    out = [v + d, v - d, v + d * 0.999, v - d * 0.999]
    for _ in range(4):
        out.append(v + d * torch.from_numpy(rng.uniform(-1, 1, size=v.shape)))
    return out


@pytest.mark.parametrize("style", ["random", "ties", "cancel"])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_output_and_log_do_not_depend_on_the_fp64_evaluation(kind: OpKind, style: str) -> None:
    rng = np.random.default_rng(7 + 31 * int(kind) + len(style))
    for trial in range(6):
        graph, op, ins = _case(kind, rng, style)
        v, d = _compute_fp64(op, ins)
        # the exact value is somewhere within d of v: every evaluation at most d away from it is honest;
        # here v is moved by up to d (so |v' - e| <= 2d: wider than any honest machine, and still canonical
        # wherever the band argument holds, i.e. for d within the certified ratio)
        ref_out, ref_log, _ = round_canonical(graph, op, ins, v, d, "ref")
        for vp in _perturbed(v, d * 0.2, rng):
            out, log, _ = round_canonical(graph, op, ins, vp, d, "perturbed")
            assert torch.equal(out.view(torch.int32), ref_out.view(torch.int32)), (kind, style, trial)
            assert np.array_equal(log.index, ref_log.index) and np.array_equal(log.code, ref_log.code)
            assert np.array_equal(log.value.view(np.uint32), ref_log.value.view(np.uint32))


def test_the_per_value_rule_is_not_canonical_which_is_why_this_exists() -> None:
    """round_output decides on the trainer's own v: two honest evaluations can disagree on a near-tie."""
    rng = np.random.default_rng(3)
    differ = 0
    for _ in range(40):
        graph, op, ins = _case(OpKind.MATMUL, rng, "ties")
        v, d = _compute_fp64(op, ins)
        a, la = round_output(v, d, "a")
        b, lb = round_output(v + d * 0.2, d, "b")
        differ += int(not torch.equal(a, b) or not np.array_equal(la.code, lb.code))
    assert differ > 0


@pytest.mark.parametrize("style", ["random", "ties", "cancel"])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_element_stands_under_the_contracts_rule_and_replays(kind: OpKind, style: str) -> None:
    rng = np.random.default_rng(101 + 7 * int(kind) + len(style))
    for _ in range(4):
        graph, op, ins = _case(kind, rng, style)
        v, d = _compute_fp64(op, ins)
        out, log, _ = round_canonical(graph, op, ins, v, d, "t")
        desc = op_desc(graph, op)
        tensors = [t.numpy() for t in ins]
        entries = {int(i): (int(c), float(x)) for i, c, x in zip(log.index, log.code, log.value)}
        bits = out.reshape(-1).numpy().view(np.uint32)
        for i in range(out.numel()):
            e = exact_element(desc, tensors, i)
            assert int(bits[i]) == X.rn32(e.value), "the output is RN32 of the exact value"
            code, value = entries.get(i, (0, 0.0))
            entry = LogEntry(i, code, int(np.float32(value).view(np.uint32))) if code else None
            assert X.judge_element(desc, tensors, i, int(bits[i]), entry), (kind, style, i, code)
        # an auditor on another machine (v moved within the bound) replays the same bits from the log;
        # on exact-grid elements every machine's v is exact (that is why they carry no entry)
        exact_rows = _grid_mask(op, ins).reshape(v.shape)
        for vp in (torch.where(exact_rows, v, v + d * 0.9), torch.where(exact_rows, v, v - d * 0.9)):
            rep = apply_log(vp, d, log, "replay")
            assert torch.equal(rep.view(torch.int32), out.view(torch.int32))


@pytest.mark.parametrize("style", ["random", "ties", "cancel"])
@pytest.mark.parametrize("kind", [OpKind.MATMUL, OpKind.SUM, OpKind.MEAN], ids=lambda k: k.name)
def test_the_vectorised_path_agrees_with_exact_arithmetic_wherever_it_decides(kind: OpKind, style: str) -> None:
    rng = np.random.default_rng(55 + int(kind) + len(style))
    decided_total = 0
    for _ in range(8):
        graph, op, ins = _case(kind, rng, style)
        n = graph.ops[op.id].shape
        cand = torch.arange(int(np.prod(n)))
        bits, codes, ok, _ = _decide_sums(op, ins, cand)
        desc = op_desc(graph, op)
        tensors = [t.numpy() for t in ins]
        for k in ok.nonzero().reshape(-1).tolist():
            assert (int(bits[k]), int(codes[k])) == decide(exact_element(desc, tensors, k)), (kind, style, k)
        decided_total += int(ok.sum())
    assert decided_total > 0


def test_candidates_cover_every_element_that_needs_an_entry() -> None:
    rng = np.random.default_rng(9)
    for _ in range(20):
        graph, op, ins = _case(OpKind.MATMUL, rng, "ties")
        for bound in ("tight", "norm"):  # the trainer's MATMUL bound is "norm" (Cauchy-Schwarz)
            v, d = _compute_fp64(op, ins, bound)
            cand = set(candidates(v, d).tolist())
            desc = op_desc(graph, op)
            tensors = [t.numpy() for t in ins]
            for i in range(v.numel()):
                if decide(exact_element(desc, tensors, i))[1] != 0:
                    assert i in cand


def test_candidates_include_every_element_near_either_neighbours_midpoint() -> None:
    """The filter (the rounding module's ``midpoint_candidates``) flags at least every element the
    two-neighbour comparison ``fl(m - v) <= reach`` flags: at powers of two (unequal gaps), around
    zero and subnormals, exactly on midpoints, and at random."""
    from vtrain.numerics.canonical import CANDIDATE_BAND
    from vtrain.numerics.rounding import _neighbours

    rng = np.random.default_rng(11)
    r = np.concatenate([2.0 ** rng.integers(-149, 127, 3000), rng.standard_normal(3000),
                        rng.integers(-50, 50, 3000) * 2.0**-149, [0.0, 2.0**-149, -(2.0**-126)]]).astype(np.float32)
    rt = torch.from_numpy(r)
    lo, hi = _neighbours(rt)
    h = torch.minimum(rt.double() - lo.double(), hi.double() - rt.double()) * 0.5
    t = torch.from_numpy(rng.uniform(-1, 1, r.size)) * h * rng.choice([1.0, 0.999, 1e-3], r.size)
    v = rt.double() + t
    d = h * torch.from_numpy(rng.choice([0.0, 1e-9, 0.01, 0.2], r.size)) / CANDIDATE_BAND
    reach = CANDIDATE_BAND * d * (1.0 + 2.0**-30)
    r64 = v.to(torch.float32)
    lo_n, hi_n = _neighbours(r64)
    near = (((r64.double() + hi_n.double()) * 0.5 - v) <= reach) | ((v - (r64.double() + lo_n.double()) * 0.5) <= reach)
    want = set(near.nonzero().reshape(-1).tolist())
    got = set(candidates(v, d).tolist())
    assert want and want <= got


@pytest.mark.parametrize("style", ["random", "ties", "cancel"])
@pytest.mark.parametrize("kind", [OpKind.MATMUL, OpKind.SUM, OpKind.MEAN], ids=lambda k: k.name)
def test_the_correctly_rounded_sum_path_agrees_with_exact_arithmetic(kind: OpKind, style: str) -> None:
    from vtrain.numerics.canonical import _decide_fsum, _terms

    rng = np.random.default_rng(77 + int(kind) + len(style))
    decided = ties = 0
    for _ in range(6):
        graph, op, ins = _case(kind, rng, style)
        cand = torch.arange(int(np.prod(op.shape)))
        terms, _ = _terms(op, ins, cand)
        desc = op_desc(graph, op)
        tensors = [t.numpy() for t in ins]
        for k, row in enumerate(terms.tolist()):
            got = _decide_fsum(op, row)
            if got is None:
                continue
            el = exact_element(desc, tensors, k)
            assert got == decide(el), (kind, style, k)
            decided += 1
            m_lo, _ = X.midpoint(got[0], above=False)
            m_hi, _ = X.midpoint(got[0], above=True)
            ties += int(el.value in (m_lo, m_hi))
    assert decided > 0
    if style == "ties" and kind == OpKind.MATMUL:
        assert ties > 0  # exact midpoints were met and settled ties-to-even


def test_the_numpy_candidate_filter_is_the_torch_one_and_non_finite_values_raise() -> None:
    """Small ops run the candidate filter in numpy (canonical._candidates_np): the same set as the
    rounding module's torch filter on the same values (random values, near-midpoints, zeros,
    subnormals, FP32 overflow, NaN/Inf); and a NaN/Inf raises on either path (an op without
    candidates skips the finiteness check: the filter flags every non-finite value), while an FP32
    overflow of a finite v is decided on the exact value."""
    from vtrain.numerics.canonical import _BAND, _candidates_np
    from vtrain.numerics.rounding import NonFiniteValue, midpoint_candidates

    rng = np.random.default_rng(31)
    for _ in range(40):
        n = 3000
        r = rng.standard_normal(n).astype(np.float32) * np.float32(2.0 ** int(rng.integers(-140, 120)))
        half = np.abs(np.nextafter(r, np.float32(np.inf)).astype(np.float64) - r) / 2
        v = r.astype(np.float64) + rng.choice([-1.0, 1.0], n) * half * rng.choice([0.0, 0.5, 0.999, 1.0], n)
        v[rng.random(n) < 0.01] = rng.choice([0.0, -0.0, 2.0**-1074, 3.5e38, np.inf, -np.inf, np.nan])
        d = np.abs(v) * 2.0**-40 * rng.choice([0.0, 1.0, 2.0**20], n)
        vt, dt = torch.from_numpy(v), torch.from_numpy(d)
        rf = vt.to(torch.float32)
        want = midpoint_candidates(vt, rf, dt * _BAND)
        want = np.zeros(0, np.int64) if want is None else want.numpy()
        with np.errstate(over="ignore"):
            got = _candidates_np(v, d, rf.numpy())
        np.testing.assert_array_equal(got, want)
    graph, op, ins = _case(OpKind.SUM, rng, "random")
    for shape in ((8, 3), (8, 3000)):  # the numpy path (<= 4096 elements) and the torch one
        v = torch.zeros(shape, dtype=torch.float64)
        d = torch.zeros(shape, dtype=torch.float64)
        for bad in (float("nan"), float("inf")):
            v[3, 1] = bad
            with pytest.raises(NonFiniteValue):
                round_canonical(graph, op, ins, v, d, "SUM op")
    # a finite v that overflows FP32 is no evidence (tests/test_overflow_boundary.py): the element is
    # decided on its exact value, here an ordinary one
    v, d = _compute_fp64(op, ins)
    want, _, _ = round_canonical(graph, op, ins, v, d, "SUM op")
    v[3, 0] = 1e39
    out, _, _ = round_canonical(graph, op, ins, v, d, "SUM op")
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))


def test_the_chunked_candidate_filter_finds_the_same_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large CPU ops run the filter in pieces of ``_CHUNK`` elements: the same flat indices, in order,
    as one pass over the whole op (candidates in several pieces, pieces without any, a short last one)."""
    import vtrain.numerics.canonical as C
    from vtrain.numerics.rounding import midpoint_candidates

    rng = np.random.default_rng(4)
    n = 10_007
    v = torch.from_numpy(rng.standard_normal(n))
    d = v.abs() * 2.0**-30
    d[2000:5000] = 0.0  # pieces without candidates
    d[-3:] = 1.0  # candidates in the short last piece
    want = midpoint_candidates(v, v.to(torch.float32), d * C._BAND)
    monkeypatch.setattr(C, "_CHUNK", 1000)
    got = candidates(v, d)
    assert want is not None and len(want) > 50
    assert torch.equal(got, want)
    assert candidates(v, torch.zeros(n, dtype=torch.float64)).numel() == 0
