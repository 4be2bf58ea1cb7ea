"""Every claim must be RN32(e): the contract's rule leaves a trainer no choice of bits (issue 14, "The log").

Before, the rule upheld a down/up entry on the midpoint checks alone (so the wrong side of a near-tie
stood) and an explicit entry anywhere in ``[RN32(lo - 4dc), RN32(hi + 4dc)]``; an auditor that followed
the log reproduced either choice and never challenged it. Now the rule (``RoundingRule.judge``,
``exact.judge``) demands ``RN32(lo) <= claimed <= RN32(hi)`` for every code, and the auditor checks
every entry it applies against ``RN32(e)`` (``canonical.is_exact_rounding``).

- the shared vectors (tests/vectors/rule.json) tie Solidity and Python, with the old rule's verdicts;
- ``is_exact_rounding`` against the canonical decision on random, cancelling and tied sums;
- an honest auditor's replay overrules no honest entry;
- a trainer that logs and outputs the wrong side of a near-tie (MLP), or stores a wrong explicit value
  inside the old window (GPT), was upheld by the old rule, and now loses the game on-chain.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from small_gpt import small_gpt

import nodes
from protocol.auditor import exact_resolver
from protocol.build import load_artifact
from protocol.cheats import CHEATS, ShiftExplicit, WrongSide
from protocol.demo import default_spec, run_scenario
from protocol.jobs import JobContext, Terms
from vtrain.graph.executor import state_tensors
from vtrain.graph.step_graph import OpKind, OpNode
from vtrain.numerics import exact
from vtrain.numerics.canonical import decide_rows, is_exact_rounding
from vtrain.training.loop import replay_steps, train_steps

VECTORS = Path(__file__).resolve().parent / "vectors" / "rule.json"
CALL_GAS = 16_000_000


def _gen_vectors():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "gen_vectors.py"
    spec = importlib.util.spec_from_file_location("gen_vectors", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _enc(j: dict) -> exact.Enclosure:
    return exact.Enclosure(int(j["lo"]), int(j["hi"]), int(j["dc"]), int(j["exp"]), int(j["den"]))


# -- the rule: shared vectors, Solidity = Python ----------------------------------------------------


@pytest.fixture(scope="module")
def harness():
    w3 = nodes.eth_tester_w3()
    return nodes.deploy(w3, load_artifact("Float32Harness"), gas=5_000_000)


def test_rule_vectors_hold_in_solidity_and_python_and_show_what_the_old_rule_upheld(harness) -> None:
    cases = json.loads(VECTORS.read_text())["cases"]
    old = _gen_vectors().judge_before_exact_rule
    closed = 0
    for c in cases:
        enc, args = _enc(c["enclosure"]), (c["claimed"], c["code"], c["value"])
        e = c["enclosure"]
        sol = harness.functions.judge((int(e["lo"]), int(e["hi"]), int(e["dc"]), e["exp"], int(e["den"])), *args)
        assert sol.call({"gas": CALL_GAS}) == c["stands"], c["name"]
        assert exact.judge(enc, *args) == c["stands"], c["name"]
        assert old(enc, *args) == c["stood_before"], c["name"]
        # every claim that stands is RN32 of the enclosure: the exact values are exact here
        if c["stands"]:
            assert c["claimed"] == exact.rn32(enc.bounds[0], True) == exact.rn32(enc.bounds[1], True), c["name"]
        closed += c["stood_before"] and not c["stands"]
    assert closed >= 7  # wrong sides, in-window explicit values: upheld before, lost now
    names = {c["name"] for c in cases if c["stood_before"] and not c["stands"]}
    assert any("wrong side" in n for n in names) and any("old window" in n for n in names)


def test_rule_lets_no_neighbour_of_rn32_stand_under_any_code() -> None:
    """Random exact enclosures: RN32(e) stands with a consistent entry, its neighbours with none."""
    rng = random.Random(14)
    for _ in range(300):
        c = rng.randrange(1, 0x7F000000) | (exact.SIGN if rng.random() < 0.5 else 0)
        m, s = exact.midpoint(c, rng.random() < 0.5)
        e = m + s * rng.choice([0, 1, -1]) * Fraction(1, 1 << rng.randint(20, 60))
        exp = exact.decode(c)[2] - 120
        v = e / exact._pow2(exp)
        assert v.denominator == 1
        enc = exact.Enclosure(int(v), int(v), rng.choice([0, 1 << rng.randint(0, 90)]), exp, 1)
        right = exact.rn32(e)
        for code in (exact.NONE, exact.DOWN, exact.UP, exact.EXPLICIT):
            for claim in (exact.neighbour(right, True), exact.neighbour(right, False)):
                assert not exact.judge(enc, claim, code, claim)
        assert exact.judge(enc, right, exact.EXPLICIT, right)


# -- the auditor's entry check ----------------------------------------------------------------------


def test_is_exact_rounding_agrees_with_the_canonical_decision_and_rejects_neighbours() -> None:
    rng = np.random.default_rng(14)
    n = 24
    x = (rng.standard_normal((300, n)) * 2.0 ** rng.integers(-30, 30, (300, 1))).astype(np.float32)
    x[:100, n // 2 :] = -x[:100, : n // 2]  # cancelling rows: e = 0
    x[100:150, 2:] = 0.0
    x[100:150, 0] = 2.0**24
    x[100:150, 1] = rng.choice([1.0, 3.0, 5.0], 50)  # exact ties: 2^24 + odd
    x[150:160, 0] = np.float32(2.0**-140)  # subnormal territory
    for kind in (OpKind.SUM, OpKind.MEAN):
        ins = [torch.from_numpy(x)]
        rows = ins[0].double()
        bits, _, _ = decide_rows(kind, rows)
        right = bits.numpy().astype(np.uint32)
        op = OpNode(0, kind, (0,), (x.shape[0], 1), ())
        desc = exact.OpDesc(int(kind), (0,), (x.shape[0], 1), (x.shape,), ())
        idx = np.arange(x.shape[0])
        assert is_exact_rounding(op, desc, ins, idx, right).all()
        for k in (0, 100, 155, 299):  # the exact value agrees
            assert right[k] == exact.rn32(exact.exact_value(desc, [x], k))
        for up in (True, False):
            wrong = np.array([exact.neighbour(int(b), up) for b in right], dtype=np.uint32)
            assert not is_exact_rounding(op, desc, ins, idx, wrong).any()


def test_the_auditor_overrules_no_honest_entry_and_checks_them_all() -> None:
    # the demo GPT logs nothing since the exact-grid rule; the benchmark's small GPT (AdamW, d 64,
    # context 32, batch 8) still has directed and explicit entries
    ctx, job, _, state = small_gpt()
    outs = list(train_steps(job, state, 1, 2))
    logs = {o.step: o.log for o in outs}
    entries = sum(lg.n_entries for lg in logs.values())
    codes = {int(c) for lg in logs.values() for ol in lg.sparse.values() for c in ol.code}
    assert entries > 20 and codes >= {1, 2}  # directed entries, all applied and checked
    overruled: list[tuple[int, int]] = []
    replayed = list(replay_steps(job, state, 1, 2, logs.__getitem__, check=True,
                                 resolver_factory=exact_resolver(ctx, overruled)))
    assert overruled == []
    assert [o.state_root for o in replayed] == [o.state_root for o in outs]


def test_honest_explicit_entries_are_not_flagged_and_a_wrong_one_is_overruled(monkeypatch) -> None:
    """An honest canonical explicit entry ``c = RN32(e)`` has ``v'`` within ``d`` of a real rounding to ``c``,
    so the replay flags none (before, ``|c - v'| > 6d`` flagged those where FP32 spacing dwarfs ``d``:
    steps 1, 4 and 5 of this GPT); every entry is still checked against RN32(e), and one moved to an FP32
    neighbour is ruled, overruled and replaced by RN32(e)."""
    import copy

    from vtrain.training.loop import batch_for, component_roots

    ctx, job, ex, state = small_gpt()
    ruled: list[int] = []
    judge = exact.judge_element
    monkeypatch.setattr(exact, "judge_element", lambda *a, **k: ruled.append(a[2]) or judge(*a, **k))
    for step in range(1, 6):
        res = ex.run(state, batch_for(job, step), step=step)
        if step in (1, 4, 5):
            overruled: list[tuple[int, int]] = []
            aud = ex.run(state, batch_for(job, step), log_in=res.log, step=step, check=True,
                         resolver_factory=exact_resolver(ctx, overruled))
            assert aud.violations == [] and overruled == [] and ruled == []
            assert component_roots(aud.state) == component_roots(res.state)
        if step < 5:
            state = res.state
    explicit = [(op_id, int(i)) for op_id, ol in res.log.sparse.items() for i in ol.index[ol.code == 3]]
    assert explicit, "the honest step has explicit entries"
    op_id, index = explicit[0]  # its value moved to an FP32 neighbour: ruled, overruled, replaced by RN32(e)
    bad = copy.deepcopy(res.log)
    ol = bad.sparse[op_id]
    k = int(np.flatnonzero(ol.index == index)[0])
    ol.value[k] = np.nextafter(ol.value[k], np.float32(np.inf))
    overruled = []
    aud = ex.run(state, batch_for(job, 5), log_in=bad, step=5, check=True,
                 resolver_factory=exact_resolver(ctx, overruled))
    assert overruled == [(op_id, index)] and ruled == [index]
    assert component_roots(aud.state) == component_roots(res.state)


# -- cheating trainers on the embedded chain --------------------------------------------------------


def _cheat_at(spec, cheat):
    """Train to the cheat's step with ``cheat``; ``(enclosure, honest bits, cheating bits, code, value)``
    of the element it changed, read off the cheating step's trace and log."""
    job = JobContext.of(spec).job
    state = state_tensors(job.initial_state)
    (o,) = [o for o in train_steps(job, state, 1, cheat.step, cheat=cheat, keep_trace=True) if o.step == cheat.step]
    op_id, index, honest, bits = cheat.hit
    op = job.graph.ops[op_id]
    tensors = [o.result.trace[i].numpy() for i in op.inputs]
    desc = exact.OpDesc(int(op.kind), tuple(op.inputs), tuple(op.shape), tuple(tuple(t.shape) for t in tensors),
                        tuple(op.attrs))
    entries = o.log.sparse[op_id]
    k = int(np.flatnonzero(entries.index == index)[0])
    value = int(entries.value[k : k + 1].view(np.uint32)[0])
    assert int(o.result.trace[op_id].reshape(-1)[index : index + 1].numpy().view(np.uint32)[0]) == bits
    return exact.enclosure(desc, tensors, index), honest, bits, int(entries.code[k]), value


@pytest.mark.parametrize("name,model", [("wrong-side", "mlp"), ("shift-explicit", "gpt")])
def test_a_trainer_using_the_old_rules_room_loses_on_chain(fresh_demo_world, name: str, model: str) -> None:
    spec = default_spec(model)
    cheat = CHEATS[name](spec, spec.interval + 2)
    assert isinstance(cheat, WrongSide if name == "wrong-side" else ShiftExplicit)
    enc, honest, bits, code, value = _cheat_at(spec, cheat)
    old = _gen_vectors().judge_before_exact_rule
    assert bits != honest == exact.rn32(enc.bounds[0], True) == exact.rn32(enc.bounds[1], True)
    assert old(enc, bits, code, value), "the old rule upheld the cheating claim"
    assert not exact.judge(enc, bits, code, value), "the rule now rejects it"
    assert exact.judge(enc, honest, exact.EXPLICIT, honest)
    proto, store, accounts = fresh_demo_world
    lines: list[str] = []
    r = run_scenario(proto, spec, Terms(), store, accounts, f"cheat {name}", name, False, lines.append)
    assert (r.verdict, r.ruling, r.final_status) == ("challenger won", "adjudicated", "fraudulent"), lines
    assert r.bonds == "trainer -2.00, auditor +1.00"
    game = proto.game.events
    (resolved,) = game.GameResolved.get_logs(from_block=0)
    gid = resolved["args"]["game"]
    (op,) = game.OpOpened.get_logs(from_block=0, argument_filters={"game": gid})
    (picked,) = game.ElementPicked.get_logs(from_block=0, argument_filters={"game": gid})
    assert (int(op["args"]["op"]), int(picked["args"]["index"])) == cheat.hit[:2]
    assert int(picked["args"]["claimed"]) == bits
