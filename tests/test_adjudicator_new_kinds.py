"""The op kinds of issue 13 (docs/protocol.md; TAKE SELECT MAX_GRAD DROPOUT_MASK STEP) and CONCAT on the real
Adjudicator against vtrain.numerics.exact and an independent numpy reference: random elements
(invalid indices, -1 padding, ties, masks at the threshold), every 1-ulp tamper of an honest
element rejected, honest values stand, malformed descriptors and non-canonical proofs revert."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from revert_helpers import expect_revert
from test_adjudicator import Case, adjudicator_errors, claim_tuple, deploy_adjudicator, f32, rand_shape

from protocol.proofs import build_element_proof, element_openings, encode_proof, log_opening
from vtrain.commit.roots import LogEntry
from vtrain.errors import NonFiniteValue
from vtrain.graph.step_graph import OpKind
from vtrain.numerics import exact

CALL_GAS = 16_000_000
SEED = hashlib.sha256(b"test seed").digest()
STEP = 7
K = OpKind
D = exact.OpDesc
NEW_KINDS = (K.TAKE, K.SELECT, K.MAX_GRAD, K.DROPOUT_MASK, K.STEP, K.CONCAT)


@pytest.fixture(scope="module")
def adj():
    return deploy_adjudicator()


@pytest.fixture(scope="module")
def errors(adj):
    return adjudicator_errors(adj)


def ctx(step: int = STEP) -> exact.DataContext:
    return exact.DataContext(None, SEED, step)


def on_chain(adj, case: Case, index: int, claimed: int, entries=(), proof: bytes | None = None, step: int = STEP):
    entries = list(entries)
    if proof is None:
        proof = build_element_proof(case.desc.encode(), list(case.inputs), index, entries, None, SEED, step)
    claim = claim_tuple(case, index, claimed, entries, step=step)
    return adj.functions.adjudicate(claim, proof).call({"gas": CALL_GAS})


def check(adj, case: Case, index: int, claimed: int, entries=(), step: int = STEP) -> bool:
    """The contract's ruling, asserted equal to vtrain.numerics.exact's."""
    entry = next((e for e in entries if e.index == index), None)
    want = exact.judge_element(case.desc, case.inputs, index, claimed, entry, ctx(step))
    got = on_chain(adj, case, index, claimed, entries, step=step)
    assert got == want, (case.desc, index, hex(claimed))
    return got


# ---------------------------------------------------------------------------------------------
# An independent reference (numpy, as a framework computes these ops)


def _valid(idx: np.ndarray, n: int) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.isfinite(idx) & (idx == np.floor(idx)) & (idx >= 0) & (idx < n)


def numpy_value(case: Case, step: int = STEP) -> np.ndarray:
    """The whole output tensor of a new-kind op, flat, computed without vtrain.numerics.exact."""
    d = case.desc
    if d.kind == K.TAKE:
        x, idx = case.inputs
        axis, n = d.attrs[0], x.shape[d.attrs[0]]
        ok = _valid(idx, n)
        got = np.take(x, np.where(ok, idx, 0).astype(np.int64), axis=axis)
        mask = ok.reshape((1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
        out = np.where(mask, got, np.float32(0))
    elif d.kind == K.SELECT:
        cond, a, b = case.inputs
        out = np.where(cond != 0, a, b)
    elif d.kind == K.MAX_GRAD:
        x, g = case.inputs
        first = np.argmax(x, axis=-1)[..., None]  # numpy: the first maximum; -0 == +0
        out = np.where(np.arange(x.shape[-1]) == first, g, np.float32(0))
    elif d.kind == K.DROPOUT_MASK:
        threshold, scale, salt = d.attrs
        n = math.prod(d.shape)
        pre = SEED + step.to_bytes(8, "big") + salt.to_bytes(4, "big")
        u = [int.from_bytes(hashlib.sha256(pre + i.to_bytes(8, "big")).digest()[:4], "big") for i in range(n)]
        keep = [x >= threshold for x in u]
        s = np.array([scale], np.uint32).view(np.float32)[0]
        out = np.where(np.array(keep), s, np.float32(0)).reshape(d.shape)
    elif d.kind == K.STEP:
        out = np.array([step], np.float32)
    elif d.kind == K.CONCAT:
        out = np.concatenate([x.reshape(-1) for x in case.inputs])
    else:
        raise AssertionError(d.kind)
    out = np.broadcast_to(out, d.shape).astype(np.float32) + np.float32(0)  # canonical zeros
    return out.reshape(-1).view(np.uint32)


# ---------------------------------------------------------------------------------------------
# Random cases


def index_values(rng, shape, n: int) -> np.ndarray:
    """Index tensors: valid indices mixed with -1 padding, n, fractions, -0, huge values."""
    pool = [0.0, 1.0, float(n - 1), float(max(n // 2, 0)), -1.0, -1.0, float(n), 0.5, -0.0, 2.0**40, 1e30]
    return np.array(rng.choice(pool, shape), np.float32)


def make_case(kind: OpKind, rng: np.random.Generator) -> Case:
    if kind == K.TAKE:
        sx = rand_shape(rng, int(rng.integers(1, 4)), 5)
        axis = int(rng.integers(0, len(sx)))
        si = rand_shape(rng, int(rng.integers(0, 3)), 4)
        x = f32(rng, sx)
        idx = index_values(rng, si, sx[axis])
        shape = sx[:axis] + si + sx[axis + 1 :]
        return Case(D(kind, (0, 1), shape, (sx, si), (axis,)), (x, idx))
    if kind == K.SELECT:
        out = rand_shape(rng)
        shapes = [tuple(d if rng.random() < 0.7 else 1 for d in out) for _ in range(3)]
        cond = np.array(rng.choice([0.0, -0.0, 1.0, -2.0, 2.0**-149, 0.5], shapes[0]), np.float32)
        return Case(D(kind, (0, 1, 2), out, tuple(shapes), ()), (cond, f32(rng, shapes[1]), f32(rng, shapes[2])))
    if kind == K.MAX_GRAD:
        s = rand_shape(rng, int(rng.integers(1, 3)), 4) + (int(rng.choice([1, 2, 4, 9, 65, 70])),)
        x = f32(rng, s)
        if rng.random() < 0.5:  # ties: few distinct values, +0 and -0 among them
            x = np.array(rng.choice([0.0, -0.0, 1.0, 3.0, -1.0], s), np.float32)
        g = f32(rng, s[:-1] + (1,))
        return Case(D(kind, (0, 1), s, (s, s[:-1] + (1,)), ()), (x, g))
    if kind == K.DROPOUT_MASK:
        s = rand_shape(rng, int(rng.integers(1, 4)), 6)
        p = float(rng.choice([0.0, 0.1, 0.5, 0.9, 1 - 2.0**-20]))
        threshold = round(p * 2**32)
        scale = exact.bits_of(np.float32(1.0 / (1.0 - p)))
        return Case(D(kind, (), s, (), (threshold, scale, int(rng.integers(0, 2**32)))), ())
    if kind == K.STEP:
        return Case(D(kind, (), (1,), (), ()), ())
    if kind == K.CONCAT:  # 1..16 tensors (MAX_OP_INPUTS), some one-element, some over a 64-element chunk
        count = int(rng.integers(1, 17))
        shapes = [rand_shape(rng, int(rng.integers(1, 4)), int(rng.choice([1, 3, 9]))) for _ in range(count)]
        xs = tuple(f32(rng, s) for s in shapes)
        return Case(D(kind, tuple(range(len(xs))), (sum(x.size for x in xs),), tuple(shapes), ()), xs)
    raise AssertionError(kind)


def run_random(adj, kind: OpKind, seed: int, elements: int = 3) -> None:
    rng = np.random.default_rng(seed)
    case = make_case(kind, rng)
    step = int(rng.choice([1, STEP, 2**24 - 1, 2**24 + 1, 2**40 + 3])) if kind == K.STEP else STEP
    want = numpy_value(case, step)
    n = case.numel
    picks = sorted({0, n - 1} | {int(i) for i in rng.integers(0, n, elements)})
    for index in picks:
        honest = int(want[index])
        assert exact.rn32(exact.exact_value(case.desc, case.inputs, index, ctx(step))) == honest
        assert check(adj, case, index, honest, step=step), "an honest claim must stand"
        for up in (False, True):  # every 1-ulp tamper is caught
            assert not check(adj, case, index, exact.neighbour(honest, up), step=step)
        assert not check(adj, case, index, exact.SIGN, step=step)  # -0 is never canonical


@pytest.mark.parametrize("kind", NEW_KINDS, ids=lambda k: k.name)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_new_kinds_match_exact_and_numpy_and_catch_every_one_ulp_tamper(adj, kind, seed):
    run_random(adj, kind, seed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", NEW_KINDS, ids=lambda k: k.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_new_kinds_match_many(adj, kind, seed):
    run_random(adj, kind, seed, elements=6)


# ---------------------------------------------------------------------------------------------
# Directed cases


def test_take_patch_gather_with_padding_and_every_element(adj):
    """A conv-style patch gather: x [C=2, 5] by a CONST table [3, 3] of positions (-1 pads)."""
    x = np.arange(10, dtype=np.float32).reshape(2, 5) - 4.5
    table = np.array([[-1, 0, 1], [1, 2, 3], [3, 4, -1]], np.float32)
    case = Case(D(K.TAKE, (0, 1), (2, 3, 3), ((2, 5), (3, 3)), (1,)), (x, table))
    want = numpy_value(case)
    for i in range(case.numel):
        assert check(adj, case, i, int(want[i]))
        assert not check(adj, case, i, exact.neighbour(int(want[i]), True))
    assert want[0] == 0 and want[9] == 0  # padding is +0
    # reads: the idx element, then x only for a valid index
    r = exact.reads(case.desc, case.inputs, 0)
    assert [(x.input, x.start) for x in r] == [(1, 0)]
    r = exact.reads(case.desc, case.inputs, 9 + 4)  # channel 1, patch 1, tap 1 -> x[1, 2]
    assert [(x.input, x.start) for x in r] == [(1, 4), (0, 7)]


def test_take_embedding_lookup_axis0_and_odd_indices(adj):
    rng = np.random.default_rng(2)
    wte = f32(rng, (7, 3), "normal")
    idx = np.array([[0.0, 6.0, -0.0], [7.0, 2.5, -1.0]], np.float32)  # -0 is index 0; 7, 2.5, -1 invalid
    case = Case(D(K.TAKE, (0, 1), (2, 3, 3), ((7, 3), (2, 3)), (0,)), (wte, idx))
    want = numpy_value(case)
    assert list(want.view(np.float32)[6:9]) == list(wte[0])
    assert not want[9:].any()
    for i in range(case.numel):
        assert check(adj, case, i, int(want[i]))


def test_select_reads_cond_then_one_branch_and_minus_zero_is_false(adj):
    cond = np.array([[0.0], [-0.0], [2.0**-149]], np.float32)
    a = np.array([[1.0, 2.0]], np.float32)
    b = np.array([[-1.0, -2.0]], np.float32)
    case = Case(D(K.SELECT, (0, 1, 2), (3, 2), ((3, 1), (1, 2), (1, 2)), ()), (cond, a, b))
    want = numpy_value(case).view(np.float32)
    assert list(want) == [-1.0, -2.0, -1.0, -2.0, 1.0, 2.0]
    for i in range(6):
        assert check(adj, case, i, exact.bits_of(want[i]))
    assert [(r.input, r.start) for r in exact.reads(case.desc, case.inputs, 5)] == [(0, 2), (1, 1)]
    assert [(r.input, r.start) for r in exact.reads(case.desc, case.inputs, 2)] == [(0, 1), (2, 0)]


def test_max_grad_goes_to_the_first_maximum(adj):
    x = np.array([[1.0, 3.0, 3.0], [-0.0, 0.0, -1.0], [5.0, 5.0, 5.0]], np.float32)
    g = np.array([[0.25], [-2.0], [7.0]], np.float32)
    case = Case(D(K.MAX_GRAD, (0, 1), (3, 3), ((3, 3), (3, 1)), ()), (x, g))
    want = numpy_value(case).view(np.float32)
    assert list(want) == [0.0, 0.25, 0.0, -2.0, 0.0, 0.0, 7.0, 0.0, 0.0]
    for i in range(9):
        assert check(adj, case, i, exact.bits_of(want[i]))
        assert not check(adj, case, i, exact.neighbour(exact.bits_of(want[i]), False))
    # the gradient on the second of two equal maxima is a cheat
    assert not check(adj, case, 2, exact.bits_of(0.25))
    assert [(r.input, r.start, r.length) for r in exact.reads(case.desc, case.inputs, 1)] == [(0, 0, 3), (1, 0, 1)]
    assert [(r.input, r.start, r.length) for r in exact.reads(case.desc, case.inputs, 2)] == [(0, 0, 3)]


def test_dropout_mask_at_the_threshold_boundary(adj):
    salt, i = 3, 5
    u = exact.dropout_u(SEED, STEP, salt, i)
    scale = exact.bits_of(np.float32(2.0))
    for threshold, kept in ((u, True), (u + 1, False), (0, True), (2**32 - 1, u == 2**32 - 1)):
        case = Case(D(K.DROPOUT_MASK, (), (2, 4), (), (threshold, scale, salt)), ())
        want = scale if kept else 0
        assert int(numpy_value(case)[i]) == want
        assert check(adj, case, i, want)
        assert not check(adj, case, i, scale if not kept else 0)
    # another step, salt or seed draws another mask (the claim carries step and seed)
    case = Case(D(K.DROPOUT_MASK, (), (64,), (), (2**31, scale, salt)), ())
    masks = {tuple(numpy_value(case, s)) for s in (1, 2, 3)}
    assert len(masks) == 3
    assert exact.reads(case.desc, case.inputs, 0) == []


def test_step_is_the_claims_step_rounded_to_fp32(adj):
    case = Case(D(K.STEP, (), (1,), (), ()), ())
    assert check(adj, case, 0, exact.bits_of(7.0))
    assert not check(adj, case, 0, exact.bits_of(8.0))
    assert check(adj, case, 0, exact.bits_of(16777216.0), step=2**24 + 1)  # a tie: to even
    assert check(adj, case, 0, exact.bits_of(16777220.0), step=2**24 + 3)  # a tie: to even
    assert not check(adj, case, 0, exact.bits_of(16777218.0), step=2**24 + 3)
    assert exact.reads(case.desc, (), 0) == []


# ---------------------------------------------------------------------------------------------
# Malformed descriptors and non-canonical proofs revert (Python: MalformedOp / NonFiniteValue)


def test_malformed_new_kind_descriptors_revert(adj, errors):
    x = np.zeros((2, 5), np.float32)
    idx = np.zeros((3,), np.float32)
    bad = [
        (Case(D(K.TAKE, (0, 1), (2, 3), ((2, 5), (3,)), (2,)), (x, idx)), "BadAttrs"),
        (Case(D(K.TAKE, (0, 1), (2, 3), ((2, 5), (3,)), ()), (x, idx)), "BadAttrs"),
        (Case(D(K.TAKE, (0, 1), (3, 5), ((2, 5), (3,)), (1,)), (x, idx)), "ShapeMismatch"),
        (Case(D(K.TAKE, (0, 1), (2, 3, 1), ((2, 5), (3,)), (1,)), (x, idx)), "ShapeMismatch"),
        (Case(D(K.TAKE, (0,), (2, 3), ((2, 5),), (1,)), (x,)), "InputCount"),
        (Case(D(K.SELECT, (0, 1, 2), (2, 5), ((2, 5), (2, 5), (5,)), ()), (x, x, x[0])), "ShapeMismatch"),
        (Case(D(K.SELECT, (0, 1), (2, 5), ((2, 5), (2, 5)), ()), (x, x)), "InputCount"),
        (Case(D(K.MAX_GRAD, (0, 1), (2, 5), ((2, 5), (2, 5)), ()), (x, x)), "ShapeMismatch"),
        (Case(D(K.MAX_GRAD, (0, 1), (2, 5), ((1, 5), (2, 1)), ()), (x[:1], x[:, :1])), "ShapeMismatch"),
        (Case(D(K.DROPOUT_MASK, (), (4,), (), (1, 2)), ()), "BadAttrs"),
        (Case(D(K.DROPOUT_MASK, (), (4,), (), (2**32, 0x3F800000, 0)), ()), "BadAttrs"),
        (Case(D(K.DROPOUT_MASK, (), (4,), (), (0, 0x3F800000, 2**32)), ()), "BadAttrs"),
        (Case(D(K.DROPOUT_MASK, (0,), (2, 5), ((2, 5),), (0, 0x3F800000, 0)), (x,)), "InputCount"),
        (Case(D(K.STEP, (), (2,), (), ()), ()), "ShapeMismatch"),
        (Case(D(K.STEP, (), (1,), (), (1,)), ()), "BadAttrs"),
        (Case(D(K.CONCAT, (0, 1), (14,), ((2, 5), (3,)), ()), (x, idx)), "ShapeMismatch"),
        (Case(D(K.CONCAT, (0, 1), (13, 1), ((2, 5), (3,)), ()), (x, idx)), "ShapeMismatch"),
        (Case(D(K.CONCAT, (), (1,), (), ()), ()), "InputCount"),
    ]
    for case, name in bad:
        with pytest.raises(exact.MalformedOp):
            exact.judge_element(case.desc, case.inputs, 0, 0, None, ctx())
        proof = encode_proof([], log_opening([], 0))
        try:
            proof = build_element_proof(case.desc.encode(), list(case.inputs), 0, [], None, SEED, STEP)
        except exact.MalformedOp:
            pass
        expect_revert(lambda c=case, p=proof: on_chain(adj, c, 0, 0, [], p), errors, name)
    # an infinite keep scale: NonFinite where an element is kept
    case = Case(D(K.DROPOUT_MASK, (), (4,), (), (0, 0x7F800000, 0)), ())
    with pytest.raises(NonFiniteValue):
        exact.judge_element(case.desc, case.inputs, 0, 0, None, ctx())
    no_reads = encode_proof([], log_opening([], 0))
    expect_revert(lambda: on_chain(adj, case, 0, 0, proof=no_reads), errors, "NonFinite")
    # a NaN index (one chunk: its opening has no siblings)
    nan = np.array([np.nan], np.float32)
    case = Case(D(K.TAKE, (0, 1), (1,), ((2,), (1,)), (0,)), (np.ones(2, np.float32), nan))
    with pytest.raises(NonFiniteValue):
        exact.judge_element(case.desc, case.inputs, 0, 0, None, ctx())
    nan_proof = encode_proof([(nan.tobytes(), [])], log_opening([], 0))
    expect_revert(lambda: on_chain(adj, case, 0, 0, proof=nan_proof), errors, "NonFinite")


def test_openings_not_read_revert(adj, errors):
    """Canonical proofs: an x opening for a padding index, or g for a non-maximum, is refused."""
    x = np.arange(4, dtype=np.float32)
    case = Case(D(K.TAKE, (0, 1), (2,), ((4,), (2,)), (0,)), (x, np.array([-1.0, 2.0], np.float32)))
    openings, log = element_openings(case.desc.encode(), list(case.inputs), 1, [])
    assert len(openings) == 2
    assert on_chain(adj, case, 1, exact.bits_of(2.0), proof=encode_proof(openings, log))
    pad_openings, log0 = element_openings(case.desc.encode(), list(case.inputs), 0, [])
    assert len(pad_openings) == 1
    assert on_chain(adj, case, 0, 0, proof=encode_proof(pad_openings, log0))
    extra = pad_openings + [openings[1]]
    extra_proof = encode_proof(extra, log0)
    assert expect_revert(lambda: on_chain(adj, case, 0, 0, proof=extra_proof), errors, "OpeningCount") == (2, 1)
    case = Case(D(K.DROPOUT_MASK, (), (4,), (), (0, 0x3F800000, 0)), ())
    openings, log = element_openings(case.desc.encode(), [], 0, [], None, SEED, STEP)
    assert openings == []
    bogus = [(b"\0" * 4, [])]
    bogus_proof = encode_proof(bogus, log)
    expect_revert(lambda: on_chain(adj, case, 0, 0x3F800000, proof=bogus_proof), errors, "OpeningCount")


def test_log_entries_on_exact_kinds_only_pass_at_the_value(adj):
    """Copies have dc = 0: an explicit entry stands only at the exact value, down/up never."""
    case = Case(D(K.STEP, (), (1,), (), ()), ())
    seven = exact.bits_of(7.0)
    assert check(adj, case, 0, seven, [LogEntry(0, 3, seven)])
    assert not check(adj, case, 0, exact.neighbour(seven, True), [LogEntry(0, 3, exact.neighbour(seven, True))])
    assert not check(adj, case, 0, seven, [LogEntry(0, 1, 0)])
    assert not check(adj, case, 0, seven, [LogEntry(0, 2, 0)])


# ---------------------------------------------------------------------------------------------
# Shared vectors (tests/vectors/ops.json): the same rulings on both sides


def _vector_cases():
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "vectors" / "ops.json").read_text(encoding="utf-8"))
    seed = bytes.fromhex(data["seed"][2:])
    log_root = bytes.fromhex(data["empty_op_log_root"][2:])
    for c in data["cases"]:
        desc = exact.OpDesc.of(bytes.fromhex(c["descriptor"][2:]))
        inputs = [
            np.frombuffer(bytes.fromhex(t[2:]), "<f4").reshape(s).copy()
            for t, s in zip(c["inputs"], desc.in_shapes, strict=True)
        ]
        yield c, desc, inputs, seed, log_root


def test_ops_vectors_python_side():
    from vtrain.commit.roots import op_log_root, tensor_root

    names = set()
    for c, desc, inputs, seed, log_root in _vector_cases():
        names.add(OpKind(desc.kind))
        assert log_root == op_log_root([])
        assert [bytes.fromhex(r[2:]) for r in c["input_roots"]] == [tensor_root(t) for t in inputs]
        data = exact.DataContext(None, seed, c["step"])
        for e in c["elements"]:
            i = e["index"]
            assert exact.rn32(exact.exact_value(desc, inputs, i, data)) == e["value_bits"]
            assert [[r.input, r.start, r.length] for r in exact.reads(desc, inputs, i, data)] == e["reads"]
            proof = build_element_proof(desc.encode(), inputs, i, [], None, seed, c["step"])
            assert "0x" + proof.hex() == e["proof"]
            assert exact.judge_element(desc, inputs, i, e["value_bits"], None, data)
            for up in (False, True):
                assert not exact.judge_element(desc, inputs, i, exact.neighbour(e["value_bits"], up), None, data)
    assert names == set(NEW_KINDS)


def test_ops_vectors_contract_side(adj):
    for c, desc, _, seed, log_root in _vector_cases():
        roots = [bytes.fromhex(r[2:]) for r in c["input_roots"]]
        for e in c["elements"]:
            proof = bytes.fromhex(e["proof"][2:])
            for claimed, stands in ((e["value_bits"], True), (exact.neighbour(e["value_bits"], True), False)):
                claim = (desc.encode(), roots, e["index"], claimed, log_root, c["step"], b"\0" * 32, seed, 0)
                assert adj.functions.adjudicate(claim, proof).call({"gas": CALL_GAS}) == stands, (c["name"], e)
