"""Adjudicator (Solidity) against vtrain.numerics.exact: random elements of every supported op kind, the
honest trainer's claims (vtrain.graph.executor + vtrain.numerics.rounding), tampered claims, log abuse, forged
explicit values and forged proofs."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from revert_helpers import error_table, expect_revert

import nodes
from protocol.build import load_artifact
from protocol.proofs import build_element_proof, element_openings, encode_proof, log_opening, range_siblings
from vtrain.commit.merkle import MerkleTree
from vtrain.commit.roots import LogEntry, dataset_root, op_log_leaves, op_log_root, sample_index
from vtrain.errors import NonFiniteValue
from vtrain.graph.executor import _compute_fp64, _move
from vtrain.graph.step_graph import LOGGING_KINDS, ROUNDING_KINDS, OpKind, OpNode
from vtrain.numerics import exact
from vtrain.numerics.canonical import decide, exact_element
from vtrain.numerics.rounding import round_output

CALL_GAS = 16_000_000
SEED = hashlib.sha256(b"test seed").digest()
STEP = 7
K = OpKind

RULED = [
    K.ADD,
    K.SUB,
    K.MUL,
    K.DIV,
    K.ADD_S,
    K.MUL_S,
    K.DIV_S,
    K.RSUB_S,
    K.SQRT,
    K.MATMUL,
    K.SUM,
    K.MEAN,
    K.MAX,
    K.RELU,
    K.RELU_GRAD,
    K.OUTPUT,
    K.RESHAPE,
    K.PERMUTE,
    K.SLICE,
    K.PAD,
    K.EXPAND,
    K.ONE_HOT,
    K.GATHER,
    K.DATA,
    K.EXP,
    K.LOG,
    K.TANH,
    K.ERF,
]


def deploy_adjudicator():
    """The Adjudicator (which deploys its Transcendental) on a fresh eth-tester chain."""
    w3 = nodes.eth_tester_w3()
    return nodes.deploy(w3, load_artifact("Adjudicator"), gas=8_000_000)


def adjudicator_errors(adj) -> dict:
    """The custom errors the Adjudicator and its libraries revert with, by selector."""
    return error_table(adj.abi, *(load_artifact(n).abi for n in ("Float32", "TensorProof", "TensorIndex", "ExactSum")))


@pytest.fixture(scope="module")
def adj():
    return deploy_adjudicator()


@pytest.fixture(scope="module")
def errors(adj):
    return adjudicator_errors(adj)


# ---------------------------------------------------------------------------------------------
# Cases: an op, its inputs, and the chain-side context


@dataclass(frozen=True)
class Case:
    desc: exact.OpDesc
    inputs: tuple[np.ndarray, ...]
    dataset: np.ndarray | None = None
    index: int | None = None  # the element the case was built around (a near tie), if any

    @property
    def data(self) -> exact.DataContext | None:
        return None if self.dataset is None else exact.DataContext(self.dataset, SEED, STEP)

    @property
    def numel(self) -> int:
        return math.prod(self.desc.shape)


def root_of(x: np.ndarray) -> bytes:
    """Tensor root straight from the bytes (so tests can commit NaN inputs too)."""
    return MerkleTree.from_chunks(np.ascontiguousarray(x, dtype="<f4").reshape(-1).view(np.uint8), 256).root


def claim_tuple(case: Case, index: int, claimed: int, entries: list[LogEntry], **over) -> tuple:
    fields = dict(
        descriptor=case.desc.encode(),
        roots=[root_of(x) for x in case.inputs],
        index=index,
        claimed=claimed,
        log_root=op_log_root(entries),
        step=STEP,
        data_root=dataset_root(case.dataset) if case.dataset is not None else b"\0" * 32,
        seed=SEED,
        n_samples=0 if case.dataset is None else case.dataset.shape[0],
    )
    fields.update(over)
    return tuple(fields.values())


def proof_of(case: Case, index: int, entries: list[LogEntry]) -> bytes:
    return build_element_proof(case.desc.encode(), list(case.inputs), index, entries, case.dataset, SEED, STEP)


def on_chain(adj, case: Case, index: int, claimed: int, entries: list[LogEntry], proof: bytes | None = None, **over):
    if proof is None:
        proof = proof_of(case, index, entries)
    return adj.functions.adjudicate(claim_tuple(case, index, claimed, entries, **over), proof).call({"gas": CALL_GAS})


def entry_for(entries: list[LogEntry], index: int) -> LogEntry | None:
    return next((e for e in entries if e.index == index), None)


def check(adj, case: Case, index: int, claimed: int, entries: list[LogEntry]) -> bool:
    """The contract's ruling, asserted equal to vtrain.numerics.exact's."""
    want = exact.judge_element(case.desc, case.inputs, index, claimed, entry_for(entries, index), case.data)
    got = on_chain(adj, case, index, claimed, entries)
    assert got == want, (case.desc, index, hex(claimed), entries)
    return got


# ---------------------------------------------------------------------------------------------
# Random inputs


def f32(rng: np.random.Generator, shape, style: str | None = None) -> np.ndarray:
    n = math.prod(shape)
    style = style or rng.choice(["normal", "normal", "wide", "special", "ints"])
    if style == "normal":
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-8, 8)
    elif style == "wide":
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-140, 100, n)
    elif style == "ints":  # exact ties in + - * / are likely
        x = rng.integers(-(1 << 25), 1 << 25, n) * 2.0 ** rng.integers(-3, 3)
    else:
        pool = np.array(
            [
                0.0,
                1.0,
                -1.0,
                0.5,
                3.0,
                2.0**-149,
                -(2.0**-149),
                2.0**-126,
                1.5 * 2.0**-140,
                2.0**100,
                -(2.0**100),
                3.0e38,
                16777217.0,
                0.1,
                -7.0,
            ],
            dtype=np.float64,
        )
        x = rng.choice(pool, n) * rng.choice([1.0, 1.0, 2.0**-30], n)
    return (x.astype(np.float32) + np.float32(0)).reshape(shape)  # canonical zeros


def rand_shape(rng, rank=None, hi=5):
    rank = rank if rank is not None else int(rng.integers(1, 4))
    return tuple(int(d) for d in rng.integers(1, hi + 1, rank))


def cancel_row(rng, a: np.ndarray, b: np.ndarray | None) -> None:
    """Make the last term nearly cancel the others (a near-tie generator for the certified ops)."""
    if a.shape[-1] < 2:
        return
    with np.errstate(all="ignore"):
        if b is None:
            a[..., -1] = -a[..., :-1].astype(np.float64).sum(axis=-1).astype(np.float32)
        else:  # rows of a against row 0 of b
            rest = np.einsum("...ik,...k->...i", a[..., :-1].astype(np.float64), b[..., 0, :-1].astype(np.float64))
            b[..., -1] = 1.0
            a[..., -1] = (-rest).astype(np.float32)
    a[~np.isfinite(a)] = 1.0


def steer_to_midpoint(rng, a: np.ndarray, b: np.ndarray | None, scale: int = 1) -> None:
    """Make the first row's exact sum (of a, or of a * b[0]) sit within a few FP32-ulp/2^20..2^40
    of an FP32 midpoint (times ``scale``): the elements the rounding log exists for."""
    a_row = a.reshape(-1, a.shape[-1])[0]
    b_row = None if b is None else b.reshape(-1, b.shape[-1])[0]
    k = len(a_row)
    if k < 4:
        return
    val = exact.value_of
    if b_row is None:
        rest = sum((val(exact.bits_of(x)) for x in a_row[:-3]), Fraction(0))
    else:
        pairs = zip(a_row[:-3], b_row[:-3], strict=True)
        rest = sum((val(exact.bits_of(x)) * val(exact.bits_of(y)) for x, y in pairs), Fraction(0))
    c = exact.rn32(rest / scale, saturate=True)
    if not exact.is_finite(c) or c == 0:
        c = exact.bits_of(1.0)
    m, sp = exact.midpoint(c, True)
    target = (m + sp * Fraction(int(rng.integers(-8, 9)), 1 << int(rng.integers(20, 40)))) * scale
    for t in (-3, -2, -1):  # three FP32 terms carry the residual down to ~2^-72 of it
        with np.errstate(over="ignore"):
            x = np.float32(float(target - rest))
        if not np.isfinite(x):
            return  # out of range: leave the row as it is
        if b_row is None:
            a_row[t] = x
        else:
            a_row[t], b_row[t] = np.float32(1.0), x
        rest += val(exact.bits_of(x))


def make_case(kind: OpKind, rng: np.random.Generator) -> Case:
    D = exact.OpDesc
    if kind in (K.ADD, K.SUB, K.MUL, K.DIV, K.RELU_GRAD):
        out = rand_shape(rng)
        sa = tuple(d if rng.random() < 0.7 else 1 for d in out)
        sb = tuple(d if rng.random() < 0.7 else 1 for d in out)
        style = rng.choice(["normal", "ints", "special", "wide"])
        return Case(D(kind, (0, 1), out, (sa, sb), ()), (f32(rng, sa, style), f32(rng, sb, style)))
    if K.ADD_S <= kind <= K.RSUB_S:
        s = rand_shape(rng)
        c = exact.bits_of(f32(rng, (1,)).reshape(-1)[0])
        return Case(D(kind, (0,), s, (s,), (c,)), (f32(rng, s),))
    if kind in (K.EXP, K.LOG, K.TANH, K.ERF):  # more in tests/test_transcendental.py, tests/test_erf.py
        s = rand_shape(rng)
        x = f32(rng, s)
        return Case(D(kind, (0,), s, (s,), ()), (np.abs(x) if kind == K.LOG and rng.random() < 0.8 else x,))
    if kind == K.SQRT:
        s = rand_shape(rng)
        x = np.abs(f32(rng, s)) if rng.random() < 0.8 else f32(rng, s)
        if rng.random() < 0.3:  # perfect squares
            x = (rng.integers(0, 4096, s) ** 2 * 2.0 ** rng.integers(-20, 20)).astype(np.float32)
        return Case(D(kind, (0,), s, (s,), ()), (x,))
    if kind == K.MATMUL:
        batch = rand_shape(rng, int(rng.integers(0, 2)), 3)
        m, n, kk = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.choice([1, 2, 5, 33, 64, 70]))
        a, b = f32(rng, batch + (m, kk)), f32(rng, batch + (n, kk))
        mode = rng.integers(0, 3)
        if mode == 1:
            cancel_row(rng, a, b)
        ins = [a, b]
        shapes = [a.shape, b.shape]
        if rng.random() < 0.5:
            ins.append(f32(rng, (n,)))
            shapes.append((n,))
        if mode == 2:
            if len(ins) == 3:
                ins[2][0] = 0.0
            steer_to_midpoint(rng, a, b)
        desc = D(kind, tuple(range(len(ins))), batch + (m, n), tuple(shapes), ())
        return Case(desc, tuple(ins), index=0 if mode == 2 else None)
    if kind in (K.SUM, K.MEAN, K.MAX):
        s = rand_shape(rng, int(rng.integers(1, 3)), 4) + (int(rng.choice([1, 3, 64, 65, 100])),)
        a = f32(rng, s)
        mode = rng.integers(0, 3) if kind != K.MAX else 0
        if mode == 1:
            cancel_row(rng, a, None)
        elif mode == 2:
            steer_to_midpoint(rng, a, None, s[-1] if kind == K.MEAN else 1)
        return Case(D(kind, (0,), s[:-1] + (1,), (s,), ()), (a,), index=0 if mode == 2 else None)
    if kind == K.RELU:
        s = rand_shape(rng)
        return Case(D(kind, (0,), s, (s,), ()), (f32(rng, s),))
    if kind in (K.OUTPUT, K.RESHAPE):
        s = rand_shape(rng)
        out = (math.prod(s),) if kind == K.RESHAPE else s
        return Case(D(kind, (0,), out, (s,), (0,) if kind == K.OUTPUT else ()), (f32(rng, s),))
    if kind == K.PERMUTE:
        s = rand_shape(rng, int(rng.integers(2, 5)), 4)
        perm = tuple(int(p) for p in rng.permutation(len(s)))
        return Case(D(kind, (0,), tuple(s[p] for p in perm), (s,), perm), (f32(rng, s),))
    if kind in (K.SLICE, K.PAD):
        s = rand_shape(rng, int(rng.integers(1, 4)), 6)
        axis = int(rng.integers(0, len(s)))
        if kind == K.SLICE:
            start = int(rng.integers(0, s[axis]))
            out = s[:axis] + (int(rng.integers(1, s[axis] - start + 1)),) + s[axis + 1 :]
        else:
            start = int(rng.integers(0, 4))
            out = s[:axis] + (s[axis] + start + int(rng.integers(0, 4)),) + s[axis + 1 :]
        return Case(D(kind, (0,), out, (s,), (axis, start)), (f32(rng, s),))
    if kind == K.EXPAND:
        out = rand_shape(rng)
        s = tuple(d if rng.random() < 0.5 else 1 for d in out)
        return Case(D(kind, (0,), out, (s,), ()), (f32(rng, s),))
    if kind == K.ONE_HOT:
        s = rand_shape(rng, int(rng.integers(1, 3)), 4)
        classes = int(rng.integers(1, 6))
        idx = rng.choice([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.5, -1.0, 1e9], s).astype(np.float32)
        return Case(D(kind, (0,), s + (classes,), (s,), (classes,)), (idx,))
    if kind == K.GATHER:
        s = rand_shape(rng, int(rng.integers(1, 3)), 4)
        n = int(rng.integers(1, 70))
        x = f32(rng, s + (n,))
        idx = rng.choice([0.0, 1.0, 2.0, n - 1.0, float(n), 0.5, -1.0, 2.0**40], s + (1,)).astype(np.float32)
        return Case(D(kind, (0, 1), s + (1,), (x.shape, idx.shape), ()), (x, idx))
    if kind == K.DATA:
        n_samples, length = int(rng.integers(1, 9)), int(rng.integers(1, 80))
        ds = f32(rng, (n_samples, length))
        return Case(D(kind, (), (int(rng.integers(1, 5)), length), (), ()), (), ds)
    raise AssertionError(kind)


# ---------------------------------------------------------------------------------------------
# The honest trainer (vtrain.graph.executor's FP64 compute + vtrain.numerics.rounding' rounding and log;
# near-ties decided on the exact value as vtrain.numerics.canonical does)


def honest(case: Case, index: int) -> tuple[int, list[LogEntry]] | None:
    """The honest trainer's output bits and log entries for one element; None when the op has no
    finite output there (never a valid training value)."""
    d = case.desc
    if d.kind == K.DATA:
        row, col = divmod(index, d.shape[1])
        v = case.dataset[sample_index(SEED, STEP, row, case.dataset.shape[0]), col] + np.float32(0)
        return exact.bits_of(v), []
    node = OpNode(0, OpKind(d.kind), d.inputs, d.shape, d.attrs)
    ins = [torch.from_numpy(np.ascontiguousarray(x)) for x in case.inputs]
    if d.kind not in ROUNDING_KINDS:
        out = torch.broadcast_to(_move(node, ins), d.shape).reshape(-1)
        return exact.bits_of(out[index].item() + 0.0), []
    with np.errstate(all="ignore"):
        v, bound = _compute_fp64(node, ins)
    # elementwise ops: both inputs may broadcast along a dim of the output
    v = torch.broadcast_to(v, d.shape).reshape(-1)[index : index + 1]
    if bound is not None and d.kind in LOGGING_KINDS:
        bound = bound.reshape(-1)[index : index + 1]
    else:
        bound = None
    try:
        out, log = round_output(v, bound, "honest")
    except NonFiniteValue:
        return None
    if len(log):  # a near-tie: the certified trainer decides it on the exact value (canonical log)
        bits, code = decide(exact_element(d, list(case.inputs), index))
        return bits, [] if code == exact.NONE else [LogEntry(index, code, bits if code == exact.EXPLICIT else 0)]
    return exact.bits_of(out[0].item()), []


# ---------------------------------------------------------------------------------------------
# Random elements of every op kind: contract == vtrain.numerics.exact, honest claims pass


def variant(rng, case: Case, index: int, claimed: int, entries: list[LogEntry]) -> tuple[int, list[LogEntry]]:
    """A claim near the honest one: a one-ulp tamper, a random log code, or a forged explicit value."""
    pick = rng.integers(0, 4)
    c = claimed if claimed != exact.SIGN else 0
    if pick == 0:
        return exact.neighbour(c, bool(rng.integers(0, 2))), entries
    if pick == 1:
        return exact.neighbour(c, bool(rng.integers(0, 2))) if rng.random() < 0.5 else c, [
            LogEntry(index, int(rng.integers(1, 3)), 0)
        ]
    if pick == 2:
        forged = exact.from_ordered(exact.to_ordered(c) + int(rng.integers(-3, 4)))
        return forged, [LogEntry(index, 3, forged)]
    return c, [LogEntry(index, int(rng.integers(0, 5)), int(rng.integers(0, 1 << 32)))]


def run_random_elements(adj, kind: OpKind, seed: int, variants: int) -> None:
    rng = np.random.default_rng(seed)
    case = make_case(kind, rng)
    index = case.index if case.index is not None else int(rng.integers(0, case.numel))
    h = honest(case, index)
    if h is not None:
        claimed, entries = h
        assert check(adj, case, index, claimed, entries), "an honest claim must stand"
        # Its neighbours in the log: unrelated entries (other indices) change nothing.
        if index + 1 < case.numel and rng.random() < 0.3:
            entries = sorted(entries + [LogEntry(index + 1, 3, claimed)], key=lambda e: e.index)
            assert check(adj, case, index, claimed, entries)
    else:
        claimed, entries = 0, []
        try:
            claimed = exact.rn32(exact.exact_value(case.desc, case.inputs, index, case.data), saturate=True)
        except NonFiniteValue:
            pass
        if claimed & exact.POS_INF == exact.POS_INF:
            claimed = 0x7F7FFFFF
        check(adj, case, index, claimed, entries)
    for _ in range(variants):
        c, e = variant(rng, case, index, claimed, entries if h else [])
        check(adj, case, index, c, e)


@pytest.mark.parametrize("kind", RULED, ids=lambda k: k.name)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_adjudicate_matches_exact_reference_and_honest_claims_stand(adj, kind, seed):
    run_random_elements(adj, kind, seed, variants=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", RULED, ids=lambda k: k.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_adjudicate_matches_exact_reference_thousands(adj, kind, seed):
    run_random_elements(adj, kind, seed, variants=2)


# ---------------------------------------------------------------------------------------------
# The reference itself: exact values against independent computation


def test_exact_values_agree_with_mpmath_and_torch_within_bound():
    import mpmath

    mpmath.mp.prec = 400
    rng = np.random.default_rng(11)
    checked = 0
    for kind in (K.MATMUL, K.SUM, K.MEAN, K.SQRT, K.DIV, K.ADD):
        for _ in range(20):
            case = make_case(kind, rng)
            index = int(rng.integers(0, case.numel))
            try:
                e = exact.exact_value(case.desc, case.inputs, index)
            except NonFiniteValue:
                continue
            enc = exact.enclosure(case.desc, case.inputs, index)
            lo, hi, dce = enc.bounds
            dc = exact.contract_bound(case.desc, case.inputs, index)
            assert lo <= e <= hi
            if dc:  # the accumulator's width is far inside the bound
                assert hi - lo <= dc / 2**18
                assert dc <= dce <= dc * (1 + Fraction(1, 2**18))
            else:  # exact ops: exact, or (SQRT, ADD over 2^72 apart) within 2^-70 of the value
                assert dce == 0 and hi - lo <= max(abs(lo), abs(hi)) / 2**70
            # independent: mpmath at 400 bits from the float values
            vals = [mpmath.mpf(float(x)) for x in case.inputs[0].reshape(-1)]
            if kind == K.SQRT:
                ref = mpmath.sqrt(vals[index])
                assert abs(mpmath.mpf(e.numerator) / e.denominator - ref) <= ref * mpmath.mpf(2) ** -99
                continue
            if kind in (K.SUM, K.MEAN):
                n = case.inputs[0].shape[-1]
                ref = mpmath.fsum(vals[index * n : (index + 1) * n]) / (n if kind == K.MEAN else 1)
                assert mpmath.mpf(e.numerator) / e.denominator == ref
            # the trainer's FP64 value is within dc of e
            node = OpNode(0, kind, case.desc.inputs, case.desc.shape, case.desc.attrs)
            with np.errstate(all="ignore"):
                v, _ = _compute_fp64(node, [torch.from_numpy(x) for x in case.inputs])
            v = torch.broadcast_to(v, case.desc.shape).reshape(-1)[index].item()
            if not math.isfinite(v):
                continue
            if dc:  # the trainer's FP64 value is within dc of e
                assert abs(Fraction(v) - e) <= dc
            else:  # one FP64 op: within u of e, and RN32(v) == RN32(e) (53 >= 2*24 + 2)
                assert abs(Fraction(v) - e) <= abs(e) / 2**53
                with np.errstate(over="ignore"):
                    if np.isfinite(np.float32(v)):
                        assert exact.bits_of(np.float32(v) + np.float32(0)) == exact.rn32(e)
            checked += 1
    assert checked > 80


def test_exact_value_of_single_ops_is_the_rational_result():
    D = exact.OpDesc
    a = np.array([3.0], np.float32)
    b = np.array([7.0], np.float32)
    assert exact.exact_value(D(K.DIV, (0, 1), (1,), ((1,), (1,)), ()), (a, b), 0) == Fraction(3, 7)
    assert exact.exact_value(D(K.SQRT, (0,), (1,), ((1,),), ()), (np.array([2.25], np.float32),), 0) == Fraction(3, 2)
    with pytest.raises(NonFiniteValue):
        exact.exact_value(D(K.DIV, (0, 1), (1,), ((1,), (1,)), ()), (a, np.zeros(1, np.float32)), 0)


# ---------------------------------------------------------------------------------------------
# Directed cases: ties, tampering, log abuse, forged explicit values


def single(kind: OpKind, a: float, b: float | None = None) -> Case:
    D = exact.OpDesc
    if b is None:
        return Case(D(kind, (0,), (1,), ((1,),), ()), (np.array([a], np.float32),))
    return Case(D(kind, (0, 1), (1,), ((1,), (1,)), ()), (np.array([a], np.float32), np.array([b], np.float32)))


def test_exact_ties_round_to_even_and_log_entries_only_pass_at_the_midpoint(adj):
    # 2^24 + 1 is the midpoint between 2^24 and 2^24 + 2: RNE gives 2^24 (even mantissa).
    case = single(K.ADD, 16777216.0, 1.0)
    lo, hi = exact.bits_of(16777216.0), exact.bits_of(16777218.0)
    assert check(adj, case, 0, lo, [])
    assert not check(adj, case, 0, hi, [])
    # dc = 0: a down/up entry passes only at an exact midpoint (docs/numerics.md, uniform rule), and
    # only on RN32(e)'s side: the odd side of the tie never stands, whatever the log says
    assert check(adj, case, 0, lo, [LogEntry(0, 1, 0)])
    assert not check(adj, case, 0, hi, [LogEntry(0, 2, 0)])
    assert not check(adj, case, 0, hi, [LogEntry(0, 1, 0)])
    assert not check(adj, case, 0, lo, [LogEntry(0, 2, 0)])
    off = single(K.ADD, 16777216.0, 1.5)  # not a tie
    assert not check(adj, off, 0, exact.bits_of(16777216.0), [LogEntry(0, 1, 0)])
    # explicit only at the exact value
    assert check(adj, case, 0, lo, [LogEntry(0, 3, lo)])
    assert not check(adj, case, 0, hi, [LogEntry(0, 3, hi)])


def test_subnormal_results_and_canonical_zero(adj):
    tiny = 2.0**-149
    case = single(K.MUL, tiny, 0.5)  # exact 2^-150: tie between 0 and 2^-149, even is 0
    assert check(adj, case, 0, 0, [])
    assert not check(adj, case, 0, 1, [])
    neg = single(K.MUL, -tiny, 0.5)  # -2^-150 rounds to -0, canonically +0
    assert check(adj, neg, 0, 0, [])
    assert not check(adj, neg, 0, exact.SIGN, [])
    div = single(K.DIV, 1.0, 3.0)
    assert check(adj, div, 0, exact.bits_of(np.float32(1.0) / np.float32(3.0)), [])
    assert not check(adj, single(K.DIV, 1.0, 0.0), 0, 0x7F7FFFFF, [])
    assert not check(adj, single(K.SQRT, -4.0), 0, 0, [])
    assert check(adj, single(K.SQRT, 2.0), 0, exact.bits_of(np.sqrt(np.float32(2.0))), [])


def near_tie_matmul(k: int, offset_ulps: float) -> tuple[Case, Fraction]:
    """A dot product whose exact value sits `offset_ulps` FP64 ulps from an FP32 midpoint."""
    rng = np.random.default_rng(k)
    a = rng.standard_normal((1, k)).astype(np.float32)
    b = rng.standard_normal((1, k)).astype(np.float32)
    rest = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a[0, :-3], b[0, :-3], strict=True))
    target = Fraction(1) + Fraction(1, 1 << 24) + Fraction(offset_ulps) * Fraction(1, 1 << 52)  # midpoint above 1
    for t in (-3, -2, -1):  # three FP32 terms carry the residual down to ~2^-72 of it
        a[0, t] = np.float32(1.0)
        b[0, t] = np.float32(float(target - rest))
        rest += Fraction(float(b[0, t]))
    D = exact.OpDesc
    case = Case(D(K.MATMUL, (0, 1), (1, 1), ((1, k), (1, k)), ()), (a, b))
    return case, exact.exact_value(case.desc, case.inputs, 0)


def test_near_tie_matmul_honest_log_entry_stands_and_abuse_is_caught(adj):
    case, e = near_tie_matmul(40, 0.25)
    h = honest(case, 0)
    assert h is not None
    claimed, entries = h
    assert entries and entries[0].code in (1, 2), "the trainer logs a near tie"
    assert check(adj, case, 0, claimed, entries)
    # the same element without its entry: RN32 of the enclosure ends differ or the claim is off
    one, above = exact.bits_of(1.0), exact.neighbour(exact.bits_of(1.0), True)
    side = one if entries[0].code == 1 else above
    assert claimed == side
    # the other side of the midpoint with the other code: the midpoint checks hold (it is within 4dc),
    # but the claim is not RN32(e), so it no longer stands (it did before the rule demanded RN32(e))
    assert claimed == exact.rn32(e)
    assert not check(adj, case, 0, above if side == one else one, [LogEntry(0, 3 - entries[0].code, 0)])
    # log abuse: a down/up entry on an element far from any midpoint
    far = make_case(K.MATMUL, np.random.default_rng(3))
    far_claim, _ = honest(far, 0)
    assert not check(adj, far, 0, far_claim, [LogEntry(0, 1, 0)])
    assert not check(adj, far, 0, far_claim, [LogEntry(0, 2, 0)])


def test_directed_entry_on_an_ill_conditioned_element_is_log_abuse(adj):
    # 2^24 - 2^24 cancels: S ~ 2^25, so dc ~ 5 * 2^-28 > s/16 at 1.0 (s = 2^-23) but 4dc < s.
    a = np.array([[16777216.0, -16777216.0, 1.0, 1.0, 1.0]], np.float32)
    b = np.array([[1.0, 1.0, 1.0, 2.0**-24, 2.0**-40]], np.float32)
    case = Case(exact.OpDesc(K.MATMUL, (0, 1), (1, 1), ((1, 5), (1, 5)), ()), (a, b))
    enc = exact.enclosure(case.desc, case.inputs, 0)
    _, _, dc = enc.bounds
    one = exact.bits_of(1.0)
    _, s = exact.midpoint(one, True)
    assert 4 * dc < s < 16 * dc
    assert not check(adj, case, 0, one, [LogEntry(0, 1, 0)])
    assert not check(adj, case, 0, exact.neighbour(one, True), [LogEntry(0, 2, 0)])
    claimed, entries = honest(case, 0)
    assert entries[0].code == 3 and check(adj, case, 0, claimed, entries)


def test_every_element_of_small_batched_and_data_movement_ops(adj):
    rng = np.random.default_rng(17)
    D = exact.OpDesc
    x = f32(rng, (2, 2, 3), "normal")
    cases = [
        Case(
            D(K.MATMUL, (0, 1, 2), (2, 2, 2), ((2, 2, 3), (2, 2, 3), (2,)), ()),
            (x, f32(rng, (2, 2, 3), "normal"), f32(rng, (2,), "normal")),
        ),
        Case(D(K.PERMUTE, (0,), (3, 2, 2), ((2, 2, 3),), (2, 0, 1)), (x,)),
        Case(D(K.SLICE, (0,), (2, 2, 2), ((2, 2, 3),), (2, 1)), (x,)),
        Case(D(K.PAD, (0,), (2, 2, 5), ((2, 2, 3),), (2, 1)), (x,)),
        Case(D(K.EXPAND, (0,), (2, 2, 3), ((2, 1, 3),), ()), (x[:, :1, :].copy(),)),
        Case(D(K.ADD, (0, 1), (2, 2, 3), ((2, 2, 1), (1, 2, 3)), ()), (x[..., :1].copy(), x[:1].copy())),
    ]
    for case in cases:  # 8 + 12 + 8 + 20 + 12 + 12 elements
        for index in range(case.numel):
            claimed, entries = honest(case, index)
            assert check(adj, case, index, claimed, entries), (case.desc.kind, index)


def test_every_single_ulp_tamper_of_an_unlogged_claim_is_caught(adj):
    rng = np.random.default_rng(21)
    caught = 0
    for kind in (K.MATMUL, K.SUM, K.MEAN, K.ADD, K.DIV, K.SQRT, K.MUL_S, K.GATHER, K.PERMUTE):
        for _ in range(2):
            case = make_case(kind, rng)
            index = int(rng.integers(0, case.numel))
            h = honest(case, index)
            if h is None or h[1]:
                continue
            enc = exact.enclosure(case.desc, case.inputs, index, case.data)
            lo, hi, _ = enc.bounds
            assert exact.rn32(lo, True) == exact.rn32(hi, True), "tight enclosure"
            for up in (False, True):
                assert not check(adj, case, index, exact.neighbour(h[0] if h[0] != exact.SIGN else 0, up), [])
                caught += 1
    assert caught >= 20


def test_explicit_entries_stand_only_at_rn32_and_every_other_value_of_the_old_window_fails(adj):
    case, e = near_tie_matmul(64, 0.0)
    enc = exact.enclosure(case.desc, case.inputs, 0)
    lo, hi, dc = enc.bounds
    first, last = exact.rn32(lo - 4 * dc), exact.rn32(hi + 4 * dc)  # the old explicit window
    assert first != last
    right = exact.rn32(e)
    assert check(adj, case, 0, right, [LogEntry(0, 3, right)])
    for c in (first, last, exact.neighbour(first, False), exact.neighbour(last, True)):
        if c != right:
            assert not check(adj, case, 0, c, [LogEntry(0, 3, c)])
    # the claim must equal the entry's value
    other = last if right == first else first
    assert not check(adj, case, 0, right, [LogEntry(0, 3, other)])
    # a code outside 0..3 never stands
    assert not check(adj, case, 0, right, [LogEntry(0, 7, right)])


def test_data_op_reads_the_sampled_row(adj):
    rng = np.random.default_rng(5)
    ds = f32(rng, (5, 10), "normal")
    ds[:, 3] = -0.0
    case = Case(exact.OpDesc(K.DATA, (), (3, 10), (), ()), (), ds)
    for index in (0, 13, 23, 29):
        row, col = divmod(index, 10)
        want = exact.bits_of(ds[sample_index(SEED, STEP, row, 5), col] + np.float32(0))
        assert check(adj, case, index, want, [])
        assert not check(adj, case, index, exact.neighbour(want, True), [])
    assert check(adj, case, 3, 0, [])  # a -0 sample value is committed as +0


def test_large_matmul_row_spans_many_chunks(adj):
    rng = np.random.default_rng(8)
    a = f32(rng, (2, 700), "normal")
    b = f32(rng, (3, 700), "normal")
    bias = f32(rng, (3,), "normal")
    case = Case(exact.OpDesc(K.MATMUL, (0, 1, 2), (2, 3), ((2, 700), (3, 700), (3,)), ()), (a, b, bias))
    claimed, entries = honest(case, 5)
    assert check(adj, case, 5, claimed, entries)
    assert not check(adj, case, 5, exact.neighbour(claimed, True), [])


# ---------------------------------------------------------------------------------------------
# Malformed and forged proofs revert with custom errors


def basic_case() -> Case:
    rng = np.random.default_rng(9)
    a, b = f32(rng, (3, 70), "normal"), f32(rng, (2, 70), "normal")
    return Case(exact.OpDesc(K.MATMUL, (0, 1), (3, 2), ((3, 70), (2, 70)), ()), (a, b))


def call_with(adj, case, index, claimed, entries, openings, log, **over):
    return lambda: on_chain(adj, case, index, claimed, entries, encode_proof(openings, log), **over)


def test_forged_openings_revert(adj, errors):
    case = basic_case()
    index = 3
    claimed, _ = honest(case, index)
    entries = [LogEntry(1, 3, 0), LogEntry(5, 1, 0)]
    openings, log = element_openings(case.desc.encode(), list(case.inputs), index, entries)
    assert on_chain(adj, case, index, claimed, entries, encode_proof(openings, log))
    # one flipped bit in an input chunk
    data = bytearray(openings[0][0])
    data[5] ^= 1
    bad = [(bytes(data), openings[0][1]), openings[1]]
    root, first, count, size = expect_revert(
        call_with(adj, case, index, claimed, entries, bad, log), errors, "RangeMismatch"
    )
    assert (first, count, size) == (1, 2, 4) and root == root_of(case.inputs[0])  # row 1: elements 70..139
    # a wrong sibling hash
    bad = [openings[0], (openings[1][0], [b"\x11" * 32] + openings[1][1][1:])]
    expect_revert(call_with(adj, case, index, claimed, entries, bad, log), errors, "RangeMismatch")
    # a missing / an extra sibling
    bad = [(openings[0][0], openings[0][1][:-1]), openings[1]]
    expect_revert(call_with(adj, case, index, claimed, entries, bad, log), errors, "SiblingCount")
    bad = [(openings[0][0], openings[0][1] + [b"\0" * 32]), openings[1]]
    expect_revert(call_with(adj, case, index, claimed, entries, bad, log), errors, "SiblingCount")
    # chunks of the wrong length, a missing and an extra opening
    bad = [(openings[0][0][:-4], openings[0][1]), openings[1]]
    expect_revert(call_with(adj, case, index, claimed, entries, bad, log), errors, "OpeningLength")
    expect_revert(call_with(adj, case, index, claimed, entries, openings[:1], log), errors, "OpeningCount")
    extra = openings + [openings[1]]
    assert expect_revert(call_with(adj, case, index, claimed, entries, extra, log), errors, "OpeningCount") == (3, 2)
    # the right data against another tensor's root
    wrong_roots = [root_of(case.inputs[1]), root_of(case.inputs[1])]
    expect_revert(
        call_with(adj, case, index, claimed, entries, openings, log, roots=wrong_roots), errors, "RangeMismatch"
    )


def test_forged_log_openings_revert(adj, errors):
    case = basic_case()
    index = 3
    claimed, _ = honest(case, index)
    entries = [LogEntry(1, 3, 0), LogEntry(index, 1, 0), LogEntry(5, 1, 0)]
    openings, log = element_openings(case.desc.encode(), list(case.inputs), index, entries)
    position, size, leaves, siblings = log
    # hiding the entry: the pair before it does not bracket the key
    all_leaves = op_log_leaves(entries)
    tree = MerkleTree.from_leaves(all_leaves)
    for p, want in ((position - 1, (0, 2, 4)), (position + 1, (4, 6, 4))):  # the pairs before, after
        hide = (p, size, all_leaves[p] + all_leaves[p + 1], range_siblings(tree, p, p + 2))
        args = expect_revert(call_with(adj, case, index, claimed, entries, openings, hide), errors, "LogBracket")
        assert args == want
    # a leaf replaced by another code: root mismatch
    forged = (position, size, leaves[:13] + bytes([3]) + leaves[14:], siblings)
    expect_revert(call_with(adj, case, index, claimed, entries, openings, forged), errors, "RangeMismatch")
    # a claimed size that does not match the tree: another shape needs other siblings
    forged = (position, size + 5, leaves, siblings)
    expect_revert(call_with(adj, case, index, claimed, entries, openings, forged), errors, "SiblingCount")
    # wrong leaf length
    forged = (position, size, leaves[:-1], siblings)
    expect_revert(call_with(adj, case, index, claimed, entries, openings, forged), errors, "OpeningLength")
    # the honest opening of an absent element works, and names code none
    absent = log_opening(entries, 4)
    o4, _ = element_openings(case.desc.encode(), list(case.inputs), 4, entries)
    honest4, _ = honest(case, 4)
    assert on_chain(adj, case, 4, honest4, entries, encode_proof(o4, absent))


def test_bad_descriptors_and_inputs_revert(adj, errors):
    case = basic_case()
    claimed, _ = honest(case, 0)
    args = expect_revert(lambda: on_chain(adj, case, 6, 0, [], proof_of(case, 0, [])), errors, "IndexOutOfRange")
    assert args == (6, 6)
    # the bind ops are not ruled here
    for kind in (K.INPUT, K.CONST, 99):
        s = (1,)
        ins = () if kind in (K.INPUT, K.CONST, 99) else (np.ones(1, np.float32),)
        c = Case(exact.OpDesc(int(kind), tuple(range(len(ins))), s, (s,) * len(ins), ()), ins)
        proof = encode_proof([], (0, 2, op_leaves_pair(), []))
        assert expect_revert(lambda c=c, proof=proof: on_chain(adj, c, 0, 0, [], proof), errors, "UnsupportedOp") == (
            int(kind),
        )
    # a NaN input element
    nan_case = single(K.ADD, 1.0, 2.0)
    nan_case = replace(nan_case, inputs=(np.array([np.nan], np.float32), nan_case.inputs[1]))
    one_chunk = [(x.tobytes(), []) for x in nan_case.inputs]  # single-chunk trees: no siblings
    nan_proof = encode_proof(one_chunk, log_opening([], 0))
    assert expect_revert(lambda: on_chain(adj, nan_case, 0, 0, [], nan_proof), errors, "NonFinite") == (0x7FC00000,)
    # shapes that do not fit the op
    bad = replace(case, desc=replace(case.desc, in_shapes=((3, 70), (2, 71))))
    assert expect_revert(
        lambda: on_chain(adj, bad, 0, claimed, [], proof_of(case, 0, [])), errors, "ShapeMismatch"
    ) == (
        30,
        1,
    )
    # a root count that does not fit the descriptor
    expect_revert(lambda: on_chain(adj, case, 0, claimed, [], roots=[root_of(case.inputs[0])]), errors, "InputCount")


def op_leaves_pair() -> bytes:
    return b"".join(op_log_leaves([]))
