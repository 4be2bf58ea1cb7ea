"""A step whose correct value is not finite is disputed and won on-chain (docs/protocol.md,
"Steps with no finite value").

The honest trainer stops with NonFiniteValue at the first op whose value overflows FP32 (or has
none); a trainer that posts the step anyway (e.g. clamping to FLT_MAX, :class:`SaturateOverflow`)
commits a claim no rule upholds. The auditor's checked replay stops there too: it locates the
element (:func:`vtrain.training.loop.locate_nonfinite`), challenges, disagrees with every step and
op from it on and wins the element ruling (the contract rules every finite claim of it false).

- on the embedded chain: real MLP training with a huge learning rate, real agents and contracts;
- the resolver overrules a FLT_MAX claim whose exact value overflows, naming the element;
- Solidity = Python on tests/vectors/nonfinite.json (sum past the threshold, EXP overflow,
  division by zero, LOG of 0 and of a negative, MUL overflow, SQRT of a negative).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import game_harness as H
import numpy as np
import pytest
import torch

import nodes
from protocol.auditor import AuditorAgent, exact_resolver
from protocol.build import load_artifact
from protocol.cheats import SaturateOverflow
from protocol.game import PHASE_ONE_STEP, STATUS_CHALLENGER_WON, STATUS_IN_PROGRESS
from protocol.jobs import JobContext, Terms
from protocol.trainer import TrainerAgent
from vtrain.commit.roots import LogEntry, op_log_root
from vtrain.commit.trace import op_descriptors
from vtrain.errors import NonFiniteValue, nonfinite_origin
from vtrain.graph.executor import StepExecutor, StepLog
from vtrain.graph.step_graph import GraphBuilder, OpKind
from vtrain.numerics import exact as X
from vtrain.numerics.rounding import Mode
from vtrain.training.loop import locate_nonfinite_in
from vtrain.training.spec import TrainSpec

VECTORS = Path(__file__).resolve().parent / "vectors" / "nonfinite.json"
CALL_GAS = 16_000_000
FMAX = float(np.finfo(np.float32).max)
#: lr 1e6 on the demo's MLP: step 3's MUL (the squared error) overflows; steps 1-2 are finite.
DIVERGING = TrainSpec(model="mlp", batch_size=16, steps=4, interval=4)
DIVERGING = replace(DIVERGING, optimizer=replace(DIVERGING.optimizer, lr=1e6))
TERMS = Terms()


# ------------------------------------------------------------------ on the embedded chain


def test_an_honest_trainer_stops_where_the_step_has_no_finite_value(demo_world) -> None:
    proto, store, accounts = demo_world
    from protocol.demo import create_job

    ctx = JobContext.of(DIVERGING)
    job = create_job(proto, accounts["client"], accounts["trainer"], ctx, TERMS)
    trainer = TrainerAgent(proto, accounts["trainer"], ctx, store, job, pretrain=False)  # stakes first
    trainer.accept(TERMS)
    with pytest.raises(NonFiniteValue, match="step 3, op 17"):
        trainer.run_interval()


def test_a_trainer_posting_saturated_values_past_an_overflow_loses_the_element_ruling(demo_world) -> None:
    proto, store, accounts = demo_world
    from protocol.demo import create_job

    chain = proto.chain
    ctx = JobContext.of(DIVERGING)
    job = create_job(proto, accounts["client"], accounts["trainer"], ctx, TERMS)
    trainer = TrainerAgent(proto, accounts["trainer"], ctx, store, job, cheat=SaturateOverflow(3))
    trainer.accept(TERMS)
    auditor = AuditorAgent(proto, accounts["auditor"], ctx, store, job)
    assert trainer.run_interval() == 0  # steps 1-4 posted: 3 and 4 hold FLT_MAX where the values overflow
    assert auditor.audit() == 0  # before: blocked as "unavailable", never challenged
    site = auditor.nonfinite[0]
    assert (site.step, site.op) == (3, 17) and not auditor.signed_off()
    gid = auditor.challenge(0, TERMS)
    phases = []
    for _ in range(200):
        sent = trainer.play() + auditor.play()
        v = auditor.player.view(gid)
        if v.status != STATUS_IN_PROGRESS:
            break
        phases.append((v.phase, v.step, v.op, v.index))
        if not sent:
            chain.advance_time(TERMS.clock + 1)
    assert v.status == STATUS_CHALLENGER_WON
    ev = proto.game.events.GameResolved.get_logs(from_block=0, argument_filters={"game": gid})
    assert int(ev[-1]["args"]["ruling"]) == 3  # adjudicated: the contract ruled the claim, no timeout
    assert (PHASE_ONE_STEP, 3, 17, site.index) in phases  # the element with no finite value was ruled
    biggest = max(p.player.stats.max_gas.get(gid, 0) for p in (trainer, auditor))
    assert 0 < biggest < 2**24  # every transaction of the game under the Osaka cap
    owed = int(chain.call(proto.registry.functions.owed(accounts["auditor"])))
    assert owed == TERMS.challenger_bond + H.bounty(TERMS.trainer_stake)  # bond back and the bounty
    assert int(chain.call(proto.registry.functions.owed(accounts["trainer"]))) == 0


def test_a_trainer_that_cannot_recompute_its_posted_step_loses_on_time_without_crashing(demo_world) -> None:
    """The trainer posted saturated steps, then regenerates its trace honestly: step 3 has no finite
    value, so it has no answer to commitTrace (its play logs that and sends nothing, before: the
    NonFiniteValue escaped its play), and the auditor claims the timeout."""
    proto, store, accounts = demo_world
    from protocol.demo import create_job

    ctx = JobContext.of(DIVERGING)
    job = create_job(proto, accounts["client"], accounts["trainer"], ctx, TERMS)
    trainer = TrainerAgent(proto, accounts["trainer"], ctx, store, job, cheat=SaturateOverflow(3))
    trainer.accept(TERMS)
    auditor = AuditorAgent(proto, accounts["auditor"], ctx, store, job)
    trainer.run_interval()
    gid = auditor.challenge(auditor.audit(), TERMS)
    trainer.cheat = None  # its moves now come from an honest recomputation, which stops at step 3
    for _ in range(100):
        sent = trainer.play() + auditor.play()
        v = auditor.player.view(gid)
        if v.status != STATUS_IN_PROGRESS:
            break
        if not sent:
            proto.chain.advance_time(TERMS.clock + 1)
    assert v.status == STATUS_CHALLENGER_WON
    ev = proto.game.events.GameResolved.get_logs(from_block=0, argument_filters={"game": gid})
    assert int(ev[-1]["args"]["ruling"]) == 1  # timeout


# ------------------------------------------------------------------ the resolver


def _sum_graph(row: list[float]):
    g = GraphBuilder()
    y = g.sum(g.input("x", (1, len(row))))
    graph = g.build(y)
    return graph, graph.ops[y.op], np.array([row], np.float32)


def _resolve(row: list[float], claimed: float, code: int, overruled: list, flagged: bool = True) -> np.ndarray:
    """The auditor's resolver on a one-element SUM over ``row`` whose log claims ``claimed``
    (``flagged`` by the replay's checks, or not: then checked against RN32(e) in the batch)."""
    graph, op, x = _sum_graph(row)
    ctx = SimpleNamespace(graph=SimpleNamespace(descriptors=op_descriptors(graph)))
    resolve = exact_resolver(ctx, overruled)(op, [torch.from_numpy(x)])
    return resolve(np.array([0]), np.array([claimed], np.float32), np.array([code], np.uint8), np.array([flagged]))


def test_the_resolver_overrules_a_flt_max_claim_whose_exact_value_overflows() -> None:
    """e = FLT_MAX + 2^103 + 2^50 > FLT_MAX + ulp/2: RN32(e) is +inf. The trainer's FLT_MAX claim
    (explicit or down) does not stand; the resolver overrules it and names the element (before:
    its ``rn32(exact_value)`` raised a bare NonFiniteValue, and the auditor never challenged)."""
    for code, flagged in ((3, True), (1, True), (3, False)):
        overruled: list[tuple[int, int]] = []
        with pytest.raises(NonFiniteValue) as info:
            _resolve([FMAX, 2.0**103, 2.0**50], FMAX, code, overruled, flagged)
        origin = nonfinite_origin(info.value)
        assert origin is not None and (origin.op, origin.index) == (1, 0), info.value
        assert overruled == [(1, 0)]
    graph, op, x = _sum_graph([FMAX, 2.0**103, 2.0**50])
    assert X.no_finite_value(op_descriptors(graph)[op.id], [x], 0)
    # one term lower (e = FLT_MAX + 2^103 - 2^50 rounds to FLT_MAX) the explicit claim stands
    overruled = []
    got = _resolve([FMAX, 2.0**103, -(2.0**50)], FMAX, 3, overruled)
    assert float(got[0]) == FMAX and not overruled


# ------------------------------------------------------------------ locating the element


def _unary_step(kind: str, x: list[float]):
    """A one-slot graph: y = kind(x) (x * x for "square") written back to the slot."""
    g = GraphBuilder()
    xi = g.input("x", (1, len(x)))
    y = g.mul(xi, xi) if kind == "square" else getattr(g, kind)(xi)
    g.output(y, 0)
    graph = g.build(g.sum(y))
    return graph, [torch.tensor([x], dtype=torch.float32)]


@pytest.mark.parametrize("kind,x,at", [
    ("exp", [1.0, 2.0, 100.0, 88.75], 2),  # exp(x) for x >= 89 has no value; 88.75 overflows too
    ("exp", [1.0, 88.75, 0.0], 1),
    ("log", [1.0, 2.0, 0.0, -1.0], 2),
    ("sqrt", [4.0, -1.0], 1),
    ("square", [1.0, 1.0, -1e20], 2),
])
def test_the_replay_locates_the_first_element_with_no_finite_value(kind: str, x: list[float], at: int) -> None:
    graph, state = _unary_step(kind, x)
    ex = StepExecutor(graph, Mode.CERTIFIED)
    data = torch.zeros(graph.data_shape)
    with pytest.raises(NonFiniteValue):  # the honest trainer stops here
        ex.run([t.clone() for t in state], data, step=1)
    site = locate_nonfinite_in(ex, state, data, 1, StepLog(Mode.CERTIFIED))
    assert site is not None and (site.step, site.op, site.index) == (1, 1, at)
    assert len(site.outputs) == 1 and np.array_equal(site.outputs[0], state[0].numpy().reshape(-1))
    # a finite step is no site
    assert locate_nonfinite_in(ex, [torch.ones_like(state[0])], data, 1, StepLog(Mode.CERTIFIED)) is None


# ------------------------------------------------------------------ Solidity = Python


@pytest.fixture(scope="module")
def adj():
    w3 = nodes.eth_tester_w3()
    return nodes.deploy(w3, load_artifact("Adjudicator"))


def _hex(x: str) -> bytes:
    return bytes.fromhex(x.removeprefix("0x"))


def _vectors() -> list[dict]:
    return json.loads(VECTORS.read_text())["cases"]


def _claim(c: dict, claimed: int, entries: list[LogEntry]) -> tuple:
    roots = [_hex(r) for r in c["input_roots"]]
    return (_hex(c["descriptor"]), roots, c["index"], claimed, op_log_root(entries), 1, bytes(32), bytes(32), 0)


def test_nonfinite_vectors_cover_the_kinds() -> None:
    kinds = {X.OpDesc.of(_hex(c["descriptor"])).kind for c in _vectors()}
    assert {OpKind.SUM, OpKind.MATMUL, OpKind.EXP, OpKind.DIV, OpKind.LOG, OpKind.MUL, OpKind.SQRT} <= kinds


def test_python_rules_no_finite_claim_on_the_nonfinite_vectors() -> None:
    for c in _vectors():
        desc = _hex(c["descriptor"])
        inputs = [np.frombuffer(_hex(t), "<f4").reshape(s) for t, s in zip(c["inputs"], c["in_shapes"],
                                                                                      strict=True)]
        assert X.no_finite_value(desc, inputs, c["index"]) == c["no_finite_value"], c["name"]
        for claim in c["claims"]:
            entry = LogEntry(c["index"], claim["code"], claim["value"]) if claim["code"] else None
            stands = X.judge_element(desc, inputs, c["index"], claim["bits"], entry)
            assert stands == claim["stands"], (c["name"], claim)


def test_the_contract_rules_as_python_on_the_nonfinite_vectors(adj) -> None:
    """Every finite claim of an element with no finite value is ruled false (never a revert: a
    revert would leave the challenger unable to win); the control rows' RN32(e) stands."""
    for c in _vectors():
        for claim in c["claims"]:
            entries = [LogEntry(c["index"], claim["code"], claim["value"])] if claim["code"] else []
            proof = _hex(claim["proof"])
            got = adj.functions.adjudicate(_claim(c, claim["bits"], entries), proof).call({"gas": CALL_GAS})
            assert got == claim["stands"], (c["name"], claim)


def test_the_agents_say_why_they_challenge_a_step_with_no_finite_value() -> None:
    from protocol.agents_cli import _why
    from vtrain.training.loop import NonFiniteSite

    agent = SimpleNamespace(honest=True, nonfinite={0: NonFiniteSite(3, 17, 5, ())})
    assert _why(agent, 0) == "step 3 has no finite value at op 17 element 5, yet it was posted"


def test_the_challenger_descends_to_the_chunk_and_the_element_with_no_finite_value() -> None:
    """Element 200 of op 17 (chunk 3 of 4, offset 8): the element descent goes right twice, the
    pick is offset 8; in the trace every node holding op 17 or later is disputed (left)."""
    from protocol.game import (
        PARTY_CHALLENGER,
        PHASE_ELEMENT,
        PHASE_PICK,
        PHASE_TRACE,
        ChallengerStrategy,
        GameView,
    )
    from vtrain.training.loop import NonFiniteSite

    site = NonFiniteSite(3, 17, 200, ())
    strategy = ChallengerStrategy(None, None, None, lambda g: None, lambda g: bytes(256),  # type: ignore[arg-type]
                                  nonfinite_of=lambda i: site)

    def view(phase: int, lo: int, size: int, op: int = 17) -> GameView:
        z = bytes(32)
        return GameView(0, 0, "", "", phase, STATUS_IN_PROGRESS, PARTY_CHALLENGER, 0, 0, 0, z, lo, size, z, z, 3,
                        z, z, z, z, op, z, 256, 0, 0)

    assert [strategy.move(0, view(PHASE_ELEMENT, lo, size)).args for lo, size in ((0, 4), (2, 2))] == [(True,)] * 2
    assert strategy.move(0, view(PHASE_PICK, 3, 1)).args == (bytes(256), 8)
    assert strategy.move(0, view(PHASE_TRACE, 0, 68)).args == (False,)  # ops 0..63 hold op 17
    assert strategy.move(0, view(PHASE_TRACE, 16, 4)).args == (False,)  # ops 16, 17
