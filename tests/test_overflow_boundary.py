"""Sums whose exact value is next to the FP32 overflow threshold are decided on the exact value.

RN32 overflows at the midpoint ``B = 2^128 - 2^103`` between FLT_MAX and the virtual 2^128 (ties
go to the even 2^128, i.e. infinity). A MATMUL/SUM of finite FP32 values never overflows FP64, but
its FP64 value ``v`` may round to or past ``B`` while ``e`` is below it (and the reverse), so
``RN32(v)`` says nothing there: the canonical decision (trainer), the replay (auditor, with and
without its checks) and the contract's rule all go by ``RN32(e)`` alone, on the native and the
numpy paths; only where ``RN32(e)`` itself overflows is the value NonFinite.

(MEAN cannot get there: ``e <= max|x_k| <= FLT_MAX``, and ``v`` exceeds it by at most ``(n+2) u``
relative, below ``2^103 / FLT_MAX = 2^-25`` for ``n < 2^27``.)
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from vtrain.commit.roots import LogEntry
from vtrain.errors import NonFiniteValue
from vtrain.graph.executor import _compute_fp64
from vtrain.graph.step_graph import GraphBuilder, OpKind
from vtrain.numerics import exact as X
from vtrain.numerics import native, native_rows
from vtrain.numerics.canonical import (
    _decide_fsum,
    decide,
    exact_element,
    is_exact_rounding,
    op_desc,
    round_canonical,
    round_canonical_matmul,
    round_canonical_sum,
)
from vtrain.numerics.rounding import TRAINER_BOUND_SLACK, LogViolation, apply_log, gamma

FMAX = float(np.finfo(np.float32).max)
B = 2.0**128 - 2.0**103

#: ``(name, row, RN32(e) or None where it overflows)``: rows of FP32 terms (one SUM element each).
ROWS = [
    # e = B - 2^50: v rounds to B exactly (FP64 ulp 2^75 there), RN32(v) = inf; RN32(e) = FLT_MAX
    ("below, v on B", [FMAX, 2.0**103, -(2.0**50)], FMAX),
    # e = B - 2^76 + 1: v = B - 2^76 < B, a near-tie the log must carry (down)
    ("below, v below B", [FMAX, 2.0**103 - 2.0**80, 2.0**80 - 2.0**76, 1.0], FMAX),
    # e = B + 2^50: RN32(e) overflows
    ("above", [FMAX, 2.0**103, 2.0**50], None),
    # e = B exactly: ties to even, infinity
    ("on B", [FMAX, 2.0**103, 1.0, -1.0], None),
    # e = B - 2^75 - 2^74 (four 2^74 terms are lost one by one in FP64: v = B - 2^76 while e = B - ...)
    ("below, terms lost", [FMAX, 2.0**103 - 2.0**80, 2.0**79, 2.0**78, 2.0**77, 2.0**74, 2.0**74, 2.0**74], FMAX),
]


def _rows(kind: OpKind, rows: list[list[float]]):
    """A SUM (or MATMUL with b = ones, + a zero bias) over ``rows`` padded with zeros."""
    n = max(len(r) for r in rows)
    x = np.zeros((len(rows), n), np.float32)
    for i, r in enumerate(rows):
        x[i, : len(r)] = r
    g = GraphBuilder()
    if kind == OpKind.SUM:
        i0 = g.input("x", x.shape)
        y = g.sum(i0)
        ins = [x]
    else:
        a, b, bias = g.input("a", x.shape), g.input("b", (2, n)), g.input("bias", (2,))
        y = g.matmul(a, b, bias)
        ins = [x, np.ones((2, n), np.float32), np.zeros(2, np.float32)]
        ins[1][1] = -1.0  # column 1: the negated sums (the other side of the threshold)
    graph = g.build(y)
    return graph, graph.ops[y.op], [torch.from_numpy(t) for t in ins]


def _fp64(op, ins: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``v`` and a finite valid bound ``d = 1.01 g(n) (fl64(S) + n 2^-149)`` (the executor's FP32
    estimate of ``S`` overflows here, which makes every element a candidate: valid, and no test of
    an evaluation off by ``d``)."""
    v, _ = _compute_fp64(op, ins)
    x = ins[0].double()
    if op.kind == OpKind.SUM:
        s, n = x.abs().sum(-1, keepdim=True), x.shape[-1]
    else:
        s = x.abs() @ ins[1].double().abs().T + ins[2].double().abs()
        n = x.shape[-1] + 1
    return v, (TRAINER_BOUND_SLACK * gamma(n)) * (s + n * 2.0**-149)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).numpy().view(np.uint32)


@pytest.fixture(params=["native", "numpy"])
def path(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "numpy":
        monkeypatch.setattr(native, "_LIB", None)
        monkeypatch.setattr(native_rows, "_LIB", None)
    elif not native.available():
        pytest.skip("native numerics kernels not loaded (make native)")
    return request.param


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MATMUL], ids=lambda k: k.name)
@pytest.mark.parametrize("name,row,want", ROWS, ids=[r[0] for r in ROWS])
def test_the_trainer_decides_on_the_exact_value_next_to_the_overflow_threshold(
    kind: OpKind, name: str, row: list[float], want: float | None, path: str
) -> None:
    neg = [-x for x in row]
    graph, op, ins = _rows(kind, [row, neg, [1.0, 2.0]])
    desc, tensors = op_desc(graph, op), [t.numpy() for t in ins]
    v, d = _fp64(op, ins)
    evaluations = [v, v + d, v - d]  # any honest FP64 value: within d of e (two of these are off by d)
    runs = [lambda vv=vv: round_canonical(graph, op, ins, vv, d, "op") for vv in evaluations]
    if kind == OpKind.SUM and path == "native":  # the one-pass SUM kernel (no numpy twin to call)
        runs.append(lambda: round_canonical_sum(graph, op, ins, "op"))
    if kind == OpKind.MATMUL and path == "native":  # the trainer's one-call MATMUL (norm bound; adds the bias)
        runs.append(lambda: round_canonical_matmul(graph, op, ins, ins[0].double() @ ins[1].double().T, "op"))
    if want is None:
        for run in runs:
            with pytest.raises(NonFiniteValue, match=r"op: expected finite values, got NaN/Inf \(element \d: RN32 ov"):
                run()
        return
    expected = [decide(exact_element(desc, tensors, i)) for i in range(int(np.prod(op.shape)))]
    assert expected[0][0] == X.bits_of(want) and expected[1][0] == X.bits_of(-want)
    for run in runs:
        out, log, _ = run()
        assert [int(b) for b in _bits(out)] == [b for b, _ in expected], name
        codes = dict(zip(log.index.tolist(), log.code.tolist(), strict=True))
        assert [codes.get(i, 0) for i in range(len(expected))] == [c for _, c in expected], name
        # the contract's rule (exact.judge_element mirrors Adjudicator, tests/vectors/rule.json) upholds each
        for i, (b, c) in enumerate(expected):
            entry = LogEntry(i, c, b if c == 3 else 0) if c else None
            assert X.judge_element(desc, tensors, i, b, entry), (name, i)
        assert is_exact_rounding(op, desc, ins, np.arange(len(expected)), _bits(out)).all()


@pytest.mark.parametrize("kind", [OpKind.SUM, OpKind.MATMUL], ids=lambda k: k.name)
@pytest.mark.parametrize("name,row,want", [r for r in ROWS if r[2] is not None], ids=[r[0] for r in ROWS if r[2]])
def test_the_replay_gets_the_trainers_bits_where_its_own_v_overflows(
    kind: OpKind, name: str, row: list[float], want: float, path: str
) -> None:
    graph, op, ins = _rows(kind, [row, [-x for x in row], [1.0, 2.0]])
    v, d = _fp64(op, ins)
    out, log, _ = round_canonical(graph, op, ins, v, d, "op")
    side = np.sign(v.reshape(-1).numpy())
    for shift in (0.0, 1.0, -1.0, 0.5):  # every honest replay value: e +- d, here v moved by up to d
        vp = (v.reshape(-1) + torch.from_numpy(side) * d.reshape(-1) * shift).reshape(v.shape).contiguous()
        for checked in (False, True):
            viol: list[LogViolation] | None = [] if checked else None
            got = apply_log(vp, d, log, "op", violations=viol)
            assert np.array_equal(_bits(got), _bits(out)), (name, shift, checked)
            assert not viol, (name, shift, viol)


def test_an_unlogged_overflow_is_a_suspect_for_the_resolver_and_without_one_raises() -> None:
    graph, op, ins = _rows(OpKind.SUM, [ROWS[0][1]])
    v, d = _fp64(op, ins)
    assert not np.isfinite(v.float().numpy()).all()  # RN32(v) overflows, RN32(e) = FLT_MAX
    out, log, _ = round_canonical(graph, op, ins, v, d, "op")
    assert len(log) == 1 and int(_bits(out)[0]) == X.bits_of(FMAX)
    with pytest.raises(NonFiniteValue):  # a trainer that left the near-tie out: the plain replay cannot go on
        apply_log(v, d, type(log).empty(), "op")
    seen: list[np.ndarray] = []

    def resolver(idx: np.ndarray, proposed: np.ndarray, codes: np.ndarray, flagged: np.ndarray) -> np.ndarray:
        seen.append(idx.copy())
        return np.full(len(idx), FMAX, np.float32)

    viol: list[LogViolation] = []
    got = apply_log(v, d, type(log).empty(), "op", resolver=resolver, violations=viol)
    assert int(_bits(got)[0]) == X.bits_of(FMAX) and [x.index for x in viol] == [0] and seen
    up = type(log)(log.index, np.array([2], np.uint8), log.value)  # "up" at FLT_MAX claims infinity
    with pytest.raises(NonFiniteValue):
        apply_log(v, d, up, "op")


def test_the_correctly_rounded_sum_decides_next_to_flt_max_with_its_virtual_neighbour() -> None:
    for name, row, want in ROWS:
        for sign in (1.0, -1.0):
            terms = [sign * x for x in row]
            e = sum((Fraction(x) for x in terms), Fraction(0))
            el = exact_element(*_sum_desc(terms))
            if want is None:
                assert _decide_fsum(OpKind.SUM, terms) is None, name  # exact rationals raise there
                with pytest.raises(NonFiniteValue):
                    X.rn32(e)
                continue
            assert _decide_fsum(OpKind.SUM, terms) == decide(el), (name, sign)


def _sum_desc(terms: list[float]):
    x = np.array([terms], np.float32)
    return X.OpDesc(int(OpKind.SUM), (0,), (1, 1), ((1, len(terms)),), ()), [x], 0


def test_python_rules_as_the_shared_vectors_next_to_flt_max_and_on_minus_zero(path: str) -> None:
    """tests/vectors/rule.json (Solidity = Python, tests/test_exact_rule.py) holds these elements'
    enclosures; the auditor's check of a claim (``is_exact_rounding``) and the trainer's decision
    say the same of them: only RN32(e) stands, never -0 nor a value past the threshold."""
    import json
    from pathlib import Path

    cases = {c["name"]: c for c in json.loads((Path(__file__).parent / "vectors" / "rule.json").read_text())["cases"]}
    rows = {
        "near overflow": [FMAX, 2.0**103 - 2.0**80, 2.0**80 - 2.0**76, 1.0],
        "near overflow, negative": [-FMAX, -(2.0**103 - 2.0**80), -(2.0**80 - 2.0**76), -1.0],
        "past overflow": [FMAX, 2.0**103, 2.0**50],
        "zero": [1.0, -1.0],
    }
    seen = 0
    for name, c in cases.items():
        head = name.split(":")[0]
        if head not in rows or (head == "zero" and "-0" not in name):
            continue
        graph, op, ins = _rows(OpKind.SUM, [rows[head]])
        desc = op_desc(graph, op)
        enc = X.enclosure(desc, [ins[0].numpy()], 0)
        assert (enc.lo, enc.hi, enc.dc, enc.exp, enc.den) == tuple(
            int(c["enclosure"][k]) for k in ("lo", "hi", "dc", "exp", "den")), name
        entry = LogEntry(0, c["code"], c["value"]) if c["code"] else None
        assert X.judge_element(desc, [ins[0].numpy()], 0, c["claimed"], entry) == c["stands"], name
        right = bool(is_exact_rounding(op, desc, ins, np.array([0]), np.array([c["claimed"]], np.uint32))[0])
        assert right or not c["stands"], name  # a claim that stands is RN32(e)
        if head != "past overflow":
            bits, code = decide(exact_element(desc, [ins[0].numpy()], 0))
            assert right == (c["claimed"] == bits), name
            if c["code"] == code and c["claimed"] == bits:
                assert c["stands"], name  # the trainer's canonical entry is upheld
        else:
            assert not right, name
        seen += 1
    assert seen == 12


@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["sum", "all"])
def test_the_adjudicator_rules_as_python_on_elements_next_to_the_threshold(full: bool) -> None:
    """The real Adjudicator (embedded chain) on whole element proofs: the canonical claim stands,
    FLT_MAX under each code and the infinity patterns are ruled as ``exact.judge_element`` rules
    (Python = Solidity), on both sides of the threshold, for SUM and MATMUL."""
    import nodes
    from protocol.build import load_artifact
    from protocol.proofs import build_element_proof
    from vtrain.commit.roots import op_log_root, tensor_root

    w3 = nodes.eth_tester_w3()
    adj = nodes.deploy(w3, load_artifact("Adjudicator"))
    fmax = X.bits_of(FMAX)
    stood = 0
    for kind in (OpKind.SUM, OpKind.MATMUL) if full else (OpKind.SUM,):
        for name, row, want in ROWS:
            graph, op, ins = _rows(kind, [row, [-x for x in row]])
            desc, tensors = X.OpDesc.of(op_desc(graph, op)), [t.numpy() for t in ins]
            roots = [tensor_root(t) for t in tensors]
            for i in (0, 1):
                if full:
                    claims = [(fmax, c, fmax if c == 3 else 0) for c in (0, 1, 2, 3)]
                    claims += [(fmax | X.SIGN, c, (fmax | X.SIGN) if c == 3 else 0) for c in (0, 1, 2, 3)]
                    claims += [(X.POS_INF, 2, 0), (X.NEG_INF, 1, 0), (X.SIGN, 0, 0)]
                else:  # the element's side: FLT_MAX none / explicit, infinity by up
                    m = fmax | (X.SIGN if i else 0)
                    claims = [(m, 0, 0), (m, 3, m), (X.NEG_INF if i else X.POS_INF, 1 if i else 2, 0)]
                if want is not None:
                    bits, code = decide(exact_element(desc, tensors, i))
                    claims.append((bits, code, bits if code == 3 else 0))
                for claimed, code, value in claims:
                    entries = [LogEntry(i, code, value)] if code else []
                    proof = build_element_proof(desc.encode(), tensors, i, entries, None, b"\0" * 32, 1)
                    claim = (desc.encode(), roots, i, claimed, op_log_root(entries), 1, b"\0" * 32, b"\0" * 32, 0)
                    got = adj.functions.adjudicate(claim, proof).call({"gas": 16_000_000})
                    py = X.judge_element(desc, tensors, i, claimed, entries[0] if entries else None)
                    assert got == py, (kind.name, name, i, hex(claimed), code)
                    stood += got
                if want is not None:
                    assert py, (kind.name, name, i)  # the canonical claim (last) stands
    assert stood >= (12 if full else 6)


@pytest.mark.parametrize("name,row,want", [r for r in ROWS if r[2] is not None], ids=[r[0] for r in ROWS if r[2]])
def test_a_step_trains_and_replays_next_to_the_threshold(name: str, row: list[float], want: float, path: str) -> None:
    """Through the executor: a SUM next to the threshold trains (the native one-pass SUM or numpy)
    and replays bit for bit, plain and checked (no violation)."""
    from vtrain.graph.executor import StepExecutor
    from vtrain.numerics.rounding import Mode

    n = len(row)
    g = GraphBuilder()
    w = g.input("w", (1, n))
    s = g.sum(g.mul(g.data((2, n)), w))  # (2, 1): row 0 and its negation
    loss = g.mean(g.reshape(g.mul(s, g.const(np.full((2, 1), 2.0**-120, np.float32), "scale")), (1, 2)))
    g.output(w, 0)
    graph = g.build(loss)
    data = torch.from_numpy(np.array([row, [-x for x in row]], np.float32))
    state = [torch.ones((1, n), dtype=torch.float32)]
    ex = StepExecutor(graph, Mode.CERTIFIED)
    res = ex.run(state, data, step=1, keep_trace=True)
    op = next(o for o in graph.ops if o.kind == OpKind.SUM)
    assert [int(b) for b in _bits(res.trace[op.id])] == [X.bits_of(want), X.bits_of(-want)]
    for check in (False, True):
        rep = ex.run(state, data, log_in=res.log, check=check, step=1, keep_trace=True)
        assert not rep.violations, (name, check)
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(rep.trace, res.trace,
                                                                                     strict=True)), (name, check)


def test_near_flt_max_terms_never_overflow_fp64_and_cancel_exactly(path: str) -> None:
    """Products of FP32 values are below 2^256 and a sum of n < 2^52 of them below 2^308: FP64
    never overflows, so sums of many near-FLT_MAX terms (MATMUL: products near FLT_MAX^2) that
    cancel give their small exact value, decided on it and upheld."""
    k = 4096
    x = np.full(k, FMAX, np.float32)
    x[1::2] = -FMAX
    x[-1] = 1.5  # e = FMAX - FMAX + ... - FMAX + 1.5: the last -FMAX replaced
    graph, op, ins = _rows(OpKind.SUM, [x.tolist(), [1.0, 2.0]])
    v, d = _fp64(op, ins)
    assert torch.isfinite(v).all() and torch.isfinite(d).all()
    out, log, _ = round_canonical(graph, op, ins, v, d, "op")
    assert [int(b) for b in _bits(out)][0] == X.bits_of(FMAX + 1.5)  # k/2 FLT_MAX, k/2 - 1 -FLT_MAX, 1.5
    graph, op, ins = _rows(OpKind.SUM, [[FMAX] * 3, [1.0]])
    v, d = _fp64(op, ins)
    assert torch.isfinite(v).all()  # 3 FLT_MAX is an FP64 number: only RN32(e) overflows, and says so
    with pytest.raises(NonFiniteValue, match="element 0: RN32 overflows"):
        round_canonical(graph, op, ins, v, d, "op")
    g = GraphBuilder()
    a, b = g.input("a", (1, 3)), g.input("b", (1, 3))
    mm = g.matmul(a, b)
    mgraph = g.build(mm)
    mop = mgraph.ops[mm.op]
    mins = [torch.tensor([[FMAX, FMAX, 1.0]]), torch.tensor([[FMAX, -FMAX, 0.75]])]
    v, _ = _compute_fp64(mop, mins)
    assert torch.isfinite(v).all()  # FLT_MAX^2 is exact in FP64 (48 bits); 0.75 may be lost by the order
    s = float((mins[0].double().abs() * mins[1].double().abs()).sum())
    d = torch.tensor([[TRAINER_BOUND_SLACK * gamma(3) * (s + 3 * 2.0**-149)]], dtype=torch.float64)
    out, log, _ = round_canonical(mgraph, mop, mins, v, d, "op")
    assert int(_bits(out)[0]) == X.bits_of(0.75)
    desc = X.OpDesc.of(op_desc(mgraph, mop))
    code = int(log.code[0]) if len(log) else 0
    entry = LogEntry(0, code, X.bits_of(0.75) if code == 3 else 0) if code else None
    assert X.judge_element(desc, [t.numpy() for t in mins], 0, X.bits_of(0.75), entry)
