"""Wide-span sums are ruled on their exact value: no choice of bits left (docs/numerics.md, "What
choice is left").

ExactSum's first pass floors terms more than ~2^72 below the largest, so its enclosure of ``e`` has
width up to ``2^-19 dc``; where an FP32 midpoint lies inside it, ``RN32(lo)`` and ``RN32(hi)``
are adjacent values that both stood. The second pass (``ExactSum.tailAt``/``roundOf``: the floored
bits in three more int256 limbs) decides on the exact ``e``, so only ``RN32(e)`` stands.

- ``roundExact`` and the tail limbs, Solidity = Python = the exact sum, on random wide sums
  (subnormal products to 2^254, cancellation, MEAN's division);
- the shared vectors (tests/vectors/wide.json): wide MATMUL/SUM/MEAN elements whose old enclosure
  upheld both neighbours, ruled by the real Adjudicator and by ``exact.judge_element``;
- on the embedded chain: a trainer claiming the wrong neighbour with an explicit entry (what the
  old rule upheld) loses, the honest value wins, whatever its code.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import nodes
from protocol.build import load_artifact
from protocol.proofs import build_element_proof
from vtrain.commit.roots import LogEntry, op_log_root, tensor_root
from vtrain.graph.step_graph import OpKind
from vtrain.numerics import exact

VECTORS = Path(__file__).resolve().parent / "vectors" / "wide.json"
CALL_GAS = 16_000_000


@pytest.fixture(scope="module")
def w3():
    return nodes.eth_tester_w3()


@pytest.fixture(scope="module")
def harness(w3):
    return nodes.deploy(w3, load_artifact("Float32Harness"))


@pytest.fixture(scope="module")
def adj(w3):
    return nodes.deploy(w3, load_artifact("Adjudicator"))


def _bits(x: float) -> int:
    return int(np.array(x, np.float32).view(np.uint32))


def _wide_pattern(rng: random.Random) -> int:
    """An FP32 pattern over the whole exponent range (subnormals included), random sign."""
    e = rng.choice([0, 1, 2, rng.randrange(1, 255), 253, 254])
    return (rng.random() < 0.5) << 31 | e << 23 | rng.randrange(1 << 23)


def _exact_of(xs: list[int], products: bool) -> Fraction:
    v = [exact.value_of(x) for x in xs]
    if products:
        return sum((v[2 * i] * v[2 * i + 1] for i in range(len(v) // 2)), Fraction(0))
    return sum(v, Fraction(0))


def test_round_exact_and_the_tail_limbs_match_python_and_the_exact_sum(harness) -> None:
    rng = random.Random(72)
    for trial in range(40):
        products = trial % 2 == 1
        n = rng.choice([1, 2, 3, 5, 9, 33])
        xs = [_wide_pattern(rng) for _ in range(2 * n if products else n)]
        if trial % 4 < 2:  # cancel the largest term(s), leaving the tiny ones to decide
            xs += [x ^ exact.SIGN for x in xs[: 2 if products else 1]]
        if trial % 5 == 0:  # a huge pair that cancels and a subnormal product / value
            xs += [0x7F000000, 0x3F800000, 0xFF000000, 0x3F800000] if products else [0x7F000000, 0xFF000000]
            xs += [0x00000001, 0x00000003] if products else [0x00000005]
        m = len(xs) // 2 if products else len(xs)
        den = m if trial % 3 == 0 else 1
        rounded, tail = harness.functions.roundExact(xs, products, den).call({"gas": CALL_GAS})
        e = _exact_of(xs, products)
        assert rounded == exact.rn32(e / den, True), (trial, xs)
        terms = [exact._product(xs[2 * i], xs[2 * i + 1]) if products else exact._product(x, exact.ONE)
                 for i, x in enumerate(xs[:m])]
        total, _, _, lsb = exact._accumulate(terms)
        top = exact._max_est(terms)
        want = exact._tail_at(terms, top) if top else (0, 0, 0, 0)
        assert tuple(tail) == want, trial
        if top:
            assert exact._tail_value(total, want, lsb) == e, trial


# -- the shared vectors: wide elements, Solidity = Python ------------------------------------------


def _cases():
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    for c in data["cases"]:
        desc = exact.OpDesc.of(bytes.fromhex(c["descriptor"][2:]))
        inputs = [
            np.frombuffer(bytes.fromhex(t[2:]), "<f4").reshape(s).copy()
            for t, s in zip(c["inputs"], desc.in_shapes, strict=True)
        ]
        yield c, desc, inputs


def _claim(c: dict, desc: exact.OpDesc, claimed: int, entries: list[LogEntry]) -> tuple:
    roots = [bytes.fromhex(r[2:]) for r in c["input_roots"]]
    return (desc.encode(), roots, c["index"], claimed, op_log_root(entries), 1, b"\0" * 32, b"\0" * 32, 0)


def _entries(c: dict, claimed: int, code: int) -> list[LogEntry]:
    return [] if code == exact.NONE else [LogEntry(c["index"], code, claimed if code == exact.EXPLICIT else 0)]


def test_wide_vectors_python_side() -> None:
    kinds = set()
    for c, desc, inputs in _cases():
        kinds.add(OpKind(desc.kind))
        assert [bytes.fromhex(r[2:]) for r in c["input_roots"]] == [tensor_root(t) for t in inputs]
        i, right, wrong = c["index"], c["value_bits"], c["wrong_bits"]
        e = exact.exact_value(desc, inputs, i)
        assert exact.rn32(e) == right != wrong
        enc = exact.enclosure(desc, inputs, i)
        assert enc is not None and enc.rounded == right
        assert (str(enc.lo), str(enc.hi), str(enc.dc), enc.exp, str(enc.den)) == tuple(c["enclosure"].values())
        # the first pass alone leaves a midpoint inside [lo, hi]: both ends, and all between, stood before
        lo, hi, dc = enc.bounds
        o_lo, o_hi = exact.to_ordered(exact.rn32(lo)), exact.to_ordered(exact.rn32(hi))
        assert o_lo < o_hi and o_lo <= exact.to_ordered(wrong) <= o_hi and o_lo <= exact.to_ordered(right) <= o_hi
        assert 0 < hi - lo <= dc / (1 << 19)
        old = replace(enc, rounded=None)
        assert exact.judge(old, wrong, exact.EXPLICIT, wrong) and exact.judge(old, right, exact.EXPLICIT, right)
        assert c["wrong_stood_before"]
        assert [exact.judge(enc, right, code, right) for code in (exact.NONE, exact.EXPLICIT)] == [True, True]
        for code in (exact.NONE, exact.DOWN, exact.UP, exact.EXPLICIT):
            assert exact.judge_element(desc, inputs, i, right, LogEntry(i, code, right) if code else None) == (
                c["stands"][str(code)]
            ), (c["name"], code)
            assert not exact.judge_element(desc, inputs, i, wrong, LogEntry(i, code, wrong) if code else None)
        proof = build_element_proof(desc.encode(), inputs, i, _entries(c, right, exact.EXPLICIT), None, b"\0" * 32, 1)
        assert "0x" + proof.hex() == c["proof_explicit"]
    assert kinds == {OpKind.MATMUL, OpKind.SUM, OpKind.MEAN}


def test_wide_vectors_contract_side_the_wrong_neighbour_loses_the_honest_value_wins(adj) -> None:
    """The real Adjudicator on the embedded chain: the wrong neighbour with the explicit entry the old
    rule upheld loses; RN32(e) stands (none, explicit, and the near-tie code the canonical trainer logs)."""
    for c, desc, inputs in _cases():
        i, right, wrong = c["index"], c["value_bits"], c["wrong_bits"]
        for code in (exact.NONE, exact.DOWN, exact.UP, exact.EXPLICIT):
            for claimed in (right, wrong):
                entries = _entries(c, claimed, code)
                proof = build_element_proof(desc.encode(), inputs, i, entries, None, b"\0" * 32, 1)
                got = adj.functions.adjudicate(_claim(c, desc, claimed, entries), proof).call({"gas": CALL_GAS})
                want = c["stands"][str(code)] if claimed == right else False
                assert got == want, (c["name"], code, claimed == right)
        proof = bytes.fromhex(c["proof_explicit"][2:])
        assert adj.functions.adjudicate(_claim(c, desc, right, _entries(c, right, exact.EXPLICIT)), proof).call(
            {"gas": CALL_GAS}
        )


# -- the chunk level: a long wide SUM ruled from its partials --------------------------------------

#: Terms of the long SUM (three chunks): 2^24 in chunk 0, 1.0 in chunk 1, 2^-100 in chunk 2.
K = 5000


def _wide_long_run(monkeypatch, wrong: bool):
    """A run of ``long_graph(K)`` whose ``xs`` row 0 is ``2^24, 1, 2^-100`` spread over three chunks
    (``e = 2^24 + 1 + 2^-100``, RN32 ``2^24 + 2``; the first pass holds the midpoint ``2^24 + 1``);
    ``wrong``: its trainer outputs the neighbour ``2^24`` for ``sm`` element 0 (no log entry)."""
    import game_harness as H

    graph = H.long_graph(K)
    xs_op, sm_op = graph.index["xs"], graph.index["sm"]
    synth, reduce_ = H.synth_output, H.honest_reduction

    def crafted(s, j, roots, numel):
        out = synth(s, j, roots, numel)
        if j == xs_op:
            out = out.copy()
            out[:K] = 0.0
            out[0], out[2100], out[4500] = 2.0**24, 1.0, 2.0**-100
        return out

    def reduction(desc, inputs, numel):
        out = reduce_(desc, inputs, numel)
        if wrong and exact.OpDesc.of(desc) == exact.OpDesc.of(graph.descriptors[sm_op]):
            out = out.copy()
            out[0] = np.float32(2.0**24)
        return out

    monkeypatch.setattr(H, "synth_output", crafted)
    monkeypatch.setattr(H, "honest_reduction", reduction)
    run = H.simulate_real(H.JobConfig(n_steps=1, interval_length=1), graph)
    monkeypatch.undo()
    return run


def test_long_wide_sum_partials_carry_the_tail_and_decide(monkeypatch) -> None:
    run = _wide_long_run(monkeypatch, wrong=False)
    j = run.graph.index["sm"]
    desc, ins = run.graph.descriptors[j], [run.steps[1].outputs[i] for i in run.graph.ops[j].inputs]
    p = exact.element_partials(desc, ins, 0)
    assert [q.inexact for q in p] == [0, 0, 1] and p[2].tail != (0, 0, 0, 0) and p[0].tail == (0, 0, 0, 0)
    enc = exact.partials_enclosure(desc, p)
    assert enc == exact.enclosure(desc, ins, 0) and enc.rounded == _bits(2.0**24 + 2)
    wrong = _bits(2.0**24)
    assert exact.judge(replace(enc, rounded=None), wrong, exact.EXPLICIT, wrong)  # the first pass upheld it
    assert not exact.judge_partials(desc, p, 0, wrong, LogEntry(0, exact.EXPLICIT, wrong))
    assert exact.judge_partials(desc, p, 0, _bits(2.0**24 + 2), None)
    # a wrong tail is a wrong partial: the challenger disputes that chunk
    bad = [*p[:2], replace(p[2], tail=(p[2].tail[0], p[2].tail[1] + 1, *p[2].tail[2:]))]
    assert exact.first_wrong_chunk(desc, ins, 0, bad) == 2


@pytest.mark.parametrize("wrong", [True, False])
def test_long_wide_sum_wrong_neighbour_loses_the_honest_value_wins(dep, monkeypatch, wrong: bool) -> None:
    """Whole games through the chunk level (real ChunkAdjudicator): the partials are accepted and the
    element is ruled from them; only RN32(e) stands (the first pass alone upheld neither with no entry)."""
    import game_harness as H

    honest = _wide_long_run(monkeypatch, wrong=False)
    run = _wide_long_run(monkeypatch, wrong=True) if wrong else honest
    job = H.active_job(dep, run)
    gid = H.challenge(dep, job, 0)
    j = run.graph.index["sm"]
    if wrong:
        challenger = H.ChunkChallenger(dep, honest)
    else:
        challenger = H.FalseChunkChallenger(dep, op=j, element=0, chunk=None)
    res = H.play(dep, gid, H.ChunkTrainer(dep, run), challenger)
    want = H.GameStatus.CHALLENGER_WON if wrong else H.GameStatus.TRAINER_WON
    assert (res.status, res.ruling) == (want, H.Ruling.ADJUDICATED), res
    assert res.phases[-2:] == [H.Phase.PARTIALS, H.Phase.PARTIALS_RULE]
    assert (dep.view(gid)["op"], dep.view(gid)["index"]) == (j, 0)


def test_a_forged_tail_propping_up_the_wrong_neighbour_loses_the_chunk_check(dep, monkeypatch) -> None:
    """The trainer of the wrong neighbour negates chunk 2's tail, so that the partials' exact value
    falls below the midpoint and rounds to its claim: the challenger disputes that chunk, and the
    recomputed tail differs."""
    import game_harness as H

    honest = _wide_long_run(monkeypatch, wrong=False)
    run = _wide_long_run(monkeypatch, wrong=True)
    j = run.graph.index["sm"]

    def forge(p: list[exact.Partial]) -> list[exact.Partial]:
        forged = replace(p[2], tail=tuple(-t for t in p[2].tail))
        desc = run.graph.descriptors[j]
        assert exact.judge_partials(desc, [*p[:2], forged], 0, _bits(2.0**24), None)  # it would stand
        return [*p[:2], forged]

    job = H.active_job(dep, run)
    gid = H.challenge(dep, job, 0)
    res = H.play(dep, gid, H.ChunkTrainer(dep, run, tamper=forge), H.ChunkChallenger(dep, honest))
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.ADJUDICATED), res
    assert res.phases[-1] == H.Phase.CHUNK_CHECK and dep.view(gid)["chunk"] == 2
