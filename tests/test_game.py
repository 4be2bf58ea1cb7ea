"""DisputeGame: whole games on eth-tester with real commitments and the toy adjudicator.

- honest trainer vs false challenger: the trainer wins at every level (bind ops, elements);
- cheating trainer vs honest challenger: the challenger wins (wrong element, wrong record,
  broken INPUT/OUTPUT/CONST binds, malformed step leaf, wrong initial state);
- chess clocks: a timeout at every phase for the side to move, the last-second move;
- fraud: the job becomes Fraudulent, other games close with refunds;
- move validation (turns, phases, proofs), challenge rules, gas per move, contract sizes.

Every test ends with the solvency invariant (fixture `dep`). Games start from chain snapshots
(the job posted, or a game paused at each phase) so the default run stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import game_harness as H
import pytest
from game_harness import Cheat, GameStatus, JobStatus, Party, Phase, Ruling, reverts

CFG = H.JobConfig()  # 6 steps, K = 4 (intervals [1..4], [5..6]), 2 slots, 10 ops, clock 500 s
EIP170 = 24_576


@pytest.fixture(scope="module")
def honest() -> H.Run:
    return H.simulate(CFG)


@pytest.fixture(scope="module")
def posted(chain: H.Deployment, honest: H.Run) -> H.Snapshot:
    """Job 1 (honest run) accepted and fully posted."""
    chain.reset()
    assert H.active_job(chain, honest) == 1
    return chain.snapshot()


def settle_ok(dep: H.Deployment, job: int, winner: Party, challenger: str | None = None) -> None:
    """The registry settled the game for ``winner``."""
    challenger = challenger or dep.challenger
    if winner == Party.TRAINER:
        assert dep.job_status(job) == JobStatus.ACTIVE
        assert dep.owed(dep.trainer) == CFG.challenger_bond
        assert dep.owed(challenger) == 0
    else:
        assert dep.job_status(job) == JobStatus.FRAUDULENT
        assert dep.owed(challenger) == CFG.challenger_bond + H.bounty(CFG.trainer_stake)
        assert dep.owed(dep.client) == CFG.payment
        assert dep.owed(dep.trainer) == 0
    assert dep.job(job)["openGames"] == 0


# ------------------------------------------------------------------ a paused game per phase

LABELS = [
    "steps.reveal", "steps.choose", "steps.open", "trace.commit", "trace.reveal", "trace.choose",
    "trace.open", "element.reveal", "element.choose", "element.open", "pick", "onestep",
]
TRAINER_LABELS = [x for x in LABELS if not x.endswith(("choose", "pick"))]


@dataclass
class Scenario:
    """Honest trainer vs a false challenger aiming at step 5 (interval 1, its prev step in
    interval 0), op update0 (3 chunks), element 100; a snapshot before each kind of move."""

    gid: int
    snaps: dict[str, tuple[H.Snapshot, dict]]
    end: H.Snapshot
    result: H.GameResult


@pytest.fixture(scope="module")
def scenario(chain: H.Deployment, honest: H.Run, posted: H.Snapshot) -> Scenario:
    dep = chain.revert(posted)
    gid = H.challenge(dep, 1, 1)
    trainer = H.Trainer(dep, honest)
    ch = H.FalseChallenger(dep, position=0, op=honest.graph.index["update0"], element=100)
    snaps, result = H.play_keeping_snapshots(dep, gid, trainer, ch, H.Oracle(dep, honest.graph, CFG))
    assert sorted(snaps) == sorted(LABELS)
    return Scenario(gid, snaps, dep.snapshot(), result)


def at_label(dep: H.Deployment, sc: Scenario, label: str) -> dict:
    snap, v = sc.snaps[label]
    dep.revert(snap)
    return v


def test_full_game_honest_trainer_vs_false_challenger_at_element_trainer_wins(dep, scenario):
    dep.revert(scenario.end)
    r = scenario.result
    assert (r.status, r.ruling) == (GameStatus.TRAINER_WON, Ruling.ADJUDICATED)
    assert r.phases == [Phase.STEPS, Phase.TRACE_COMMIT, Phase.TRACE, Phase.ELEMENT, Phase.PICK, Phase.ONE_STEP]
    v = dep.view(scenario.gid)
    assert (v["step"], v["index"], v["toMove"], v["phase"]) == (5, 100, Party.NONE, Phase.DONE)
    settle_ok(dep, 1, Party.TRAINER)


@pytest.mark.parametrize("label", LABELS)
def test_claimTimeout_at_each_phase_side_to_move_loses_one_second_after_deadline(dep, scenario, label):
    v = at_label(dep, scenario, label)
    party = v["toMove"]
    challenger_moves = ("steps.choose", "trace.choose", "element.choose", "pick")
    assert party == (Party.CHALLENGER if label in challenger_moves else Party.TRAINER)
    dep.at(v["deadline"])
    with reverts("ClockNotExpired", party, v["deadline"], v["deadline"]):
        dep.dry(dep.game.functions.claimTimeout(scenario.gid), dep.anyone)
    dep.at(v["deadline"] + 1)
    dep.tx(dep.game.functions.claimTimeout(scenario.gid), dep.anyone)
    (ev,) = dep.events(dep.game, "GameResolved", game=scenario.gid)
    winner = Party.CHALLENGER if party == Party.TRAINER else Party.TRAINER
    assert (Party(ev.winner), Ruling(ev.ruling)) == (winner, Ruling.TIMEOUT)
    settle_ok(dep, 1, winner)
    with reverts("GameOver"):
        dep.dry(dep.game.functions.claimTimeout(scenario.gid), dep.anyone)


@pytest.mark.parametrize("label", LABELS)
def test_move_at_last_second_is_valid_and_one_second_later_reverts(dep, scenario, honest, label):
    snap, v = scenario.snaps[label]
    trainer = H.Trainer(dep, honest)
    ch = H.FalseChallenger(dep, position=0, op=honest.graph.index["update0"], element=100)
    mover = trainer if v["toMove"] == Party.TRAINER else ch
    dep.revert(snap)
    dep.at(v["deadline"] + 1)
    assert not mover.move(scenario.gid, v)
    assert mover.last_error.name == "ClockExpired"
    assert mover.last_error.error_args == (v["deadline"], v["deadline"] + 1)
    dep.revert(snap)
    dep.at(v["deadline"])
    assert mover.move(scenario.gid, v), mover.last_error
    after = dep.view(scenario.gid)
    if after["status"] == GameStatus.IN_PROGRESS:  # the mover used all its time
        left = after["trainerTime"] if v["toMove"] == Party.TRAINER else after["challengerTime"]
        assert left == 0


def test_clocks_charge_only_the_side_to_move(dep, honest, posted):
    dep.revert(posted)
    t0 = dep.now()
    gid = H.challenge(dep, 1, 0)
    g = dep.game.functions
    tree = honest.interval_trees[0]
    dep.at(t0 + 100)
    dep.tx(g.reveal(gid, *H.children(tree, 0, 4)), dep.trainer)
    v = dep.view(gid)
    assert (v["trainerTime"], v["challengerTime"]) == (CFG.clock - 100, CFG.clock)
    assert (v["toMove"], v["deadline"]) == (Party.CHALLENGER, t0 + 100 + CFG.clock)
    dep.at(t0 + 130)
    dep.tx(g.choose(gid, False), dep.challenger)
    dep.at(t0 + 150)
    v = dep.view(gid)  # views run on the latest block (t0 + 149)
    assert (v["toMove"], v["deadline"]) == (Party.TRAINER, t0 + 130 + CFG.clock - 100)
    assert v["challengerTime"] == CFG.clock - 30
    assert v["trainerTime"] == CFG.clock - 100 - (149 - 130)


# ------------------------------------------------------------------ honest trainer wins


@pytest.mark.parametrize(
    "op,interval,position,ruling",
    [
        ("input0", 0, 0, Ruling.BIND),  # s = 1: bound to the registered initial state
        ("output1", 1, 1, Ruling.BIND),  # s = 6
        ("data", 0, 1, Ruling.ADJUDICATED),  # DATA element: the adjudicator gets the data context
        pytest.param("const", 0, 2, Ruling.BIND, marks=pytest.mark.slow),
        pytest.param("empty", 0, 3, Ruling.BIND, marks=pytest.mark.slow),  # zero elements: empty root
        pytest.param("update1", 1, 0, Ruling.ADJUDICATED, marks=pytest.mark.slow),  # one chunk
    ],
)
def test_honest_trainer_vs_false_challenger_trainer_wins(dep, honest, posted, op, interval, position, ruling):
    dep.revert(posted)
    gid = H.challenge(dep, 1, interval)
    ch = H.FalseChallenger(dep, position=position, op=honest.graph.index[op], element=3)
    res = H.play(dep, gid, H.Trainer(dep, honest), ch)
    assert (res.status, res.ruling, res.stuck) == (GameStatus.TRAINER_WON, ruling, None)
    v = dep.view(gid)
    assert v["step"] == interval * CFG.interval_length + position + 1
    assert v["op"] == honest.graph.index[op]
    settle_ok(dep, 1, Party.TRAINER)


@pytest.mark.slow
@pytest.mark.parametrize("op", H.make_graph(CFG.n_slots).index)
@pytest.mark.parametrize("interval,position", [(0, 0), (0, 3), (1, 0), (1, 1)])
def test_honest_trainer_vs_false_challenger_every_op_every_position_trainer_wins(
    dep, honest, posted, op, interval, position
):
    dep.revert(posted)
    gid = H.challenge(dep, 1, interval)
    ch = H.FalseChallenger(dep, position=position, op=honest.graph.index[op], element=129)
    res = H.play(dep, gid, H.Trainer(dep, honest), ch)
    assert (res.status, res.stuck) == (GameStatus.TRAINER_WON, None)
    settle_ok(dep, 1, Party.TRAINER)


# ------------------------------------------------------------------ cheating trainer loses

CHEATS = [
    # (cheat, interval, expected ruling, the trainer's rejected move or None)
    (Cheat("element", step=3, op="update0", index=129), 0, Ruling.ADJUDICATED, None),  # last chunk
    (Cheat("record_length", step=2, op="update0"), 0, Ruling.TIMEOUT, "WrongLength"),
    (Cheat("input_bind", step=4, slot=1), 0, Ruling.TIMEOUT, "InvalidProof"),
    (Cheat("output_bind", step=5, slot=0), 1, Ruling.TIMEOUT, "InvalidProof"),
    (Cheat("const_bind", step=6), 1, Ruling.TIMEOUT, "BindMismatch"),
    (Cheat("step_leaf", step=3), 0, Ruling.TIMEOUT, "HashMismatch"),
    (Cheat("initial_state", step=1), 0, Ruling.TIMEOUT, "InitialStateMismatch"),
]


def cheating_job(dep: H.Deployment, cheat: Cheat) -> H.Run:
    run = H.simulate(CFG, cheat)
    assert H.active_job(dep, run) == 1
    return run


@pytest.mark.parametrize("cheat,interval,ruling,stuck", CHEATS, ids=[c[0].kind for c in CHEATS])
def test_cheating_trainer_vs_honest_challenger_challenger_wins(dep, honest, cheat, interval, ruling, stuck):
    run = cheating_job(dep, cheat)
    ch = H.HonestChallenger(dep, honest)
    assert ch.first_bad_interval(run.interval_roots) == interval
    gid = H.challenge(dep, 1, interval)
    # A cheater never asks for a ruling it would lose: the challenger asks (either may).
    res = H.play(dep, gid, H.Trainer(dep, run, one_step=False), ch)
    assert (res.status, res.ruling) == (GameStatus.CHALLENGER_WON, ruling)
    assert (res.stuck.name if res.stuck else None) == (stuck or "TrainerDeclinesOneStep")
    assert dep.view(gid)["step"] in (0, cheat.step)  # 0: stuck before opening the step
    settle_ok(dep, 1, Party.CHALLENGER)
    # Payouts: everyone withdraws once; the job's escrow is gone.
    for who in (dep.challenger, dep.client):
        dep.tx(dep.registry.functions.withdraw(), who)
    assert dep.call(dep.registry.functions.escrowOf(1)) == 0
    with reverts("NothingOwed", dep.trainer):
        dep.dry(dep.registry.functions.withdraw(), dep.trainer)


# ------------------------------------------------------------------ fraud closes other games


def test_fraudulent_job_closes_other_games_with_refunds(dep, honest):
    # The cheater asks for the ruling itself here, and loses it.
    run = cheating_job(dep, Cheat("element", step=3, op="update0", index=5))
    g = dep.game.functions
    first = H.challenge(dep, 1, 0)
    other = H.challenge(dep, 1, 1, challenger=dep.challenger2)
    with reverts("JobNotFraudulent", 1, JobStatus.ACTIVE):
        dep.dry(g.closeGame(other), dep.anyone)
    dep.tx(g.reveal(other, *H.children(run.interval_trees[1], 0, 2)), dep.trainer)
    res = H.play(dep, first, H.Trainer(dep, run), H.HonestChallenger(dep, honest))
    assert (res.status, res.ruling, res.stuck) == (GameStatus.CHALLENGER_WON, Ruling.ADJUDICATED, None)
    assert dep.view(first)["index"] == 5
    assert dep.job(1)["openGames"] == 1
    # Moves and timeouts on the other game revert; anyone closes it and the bond is refunded.
    with reverts("WrongJobStatus", 1, JobStatus.FRAUDULENT, JobStatus.ACTIVE):
        dep.dry(g.choose(other, False), dep.challenger2)
    dep.advance(CFG.clock + 1)
    with reverts("WrongJobStatus"):
        dep.dry(g.claimTimeout(other), dep.anyone)
    dep.tx(g.closeGame(other), dep.anyone)
    assert dep.view(other)["status"] == GameStatus.CLOSED
    (ev,) = dep.events(dep.game, "GameClosed", game=other)
    assert dep.owed(dep.challenger2) == CFG.challenger_bond
    assert dep.owed(dep.challenger) == CFG.challenger_bond + H.bounty(CFG.trainer_stake)  # first win only
    assert dep.owed(dep.client) == CFG.payment
    assert dep.job(1)["openGames"] == 0 and dep.call(dep.registry.functions.escrowOf(1)) == 0
    with reverts("GameOver", other, GameStatus.CLOSED):
        dep.dry(g.closeGame(other), dep.anyone)
    # The fraudulent job takes no more challenges, intervals or finalization.
    with reverts("WrongJobStatus"):
        H.challenge(dep, 1, 1)
    with reverts("WrongJobStatus"):
        dep.dry(dep.registry.functions.finalize(1), dep.anyone)
    for who in (dep.challenger, dep.challenger2, dep.client):
        dep.tx(dep.registry.functions.withdraw(), who)
        with reverts("NothingOwed", who):
            dep.dry(dep.registry.functions.withdraw(), who)


def test_several_games_won_by_trainer_then_finalize_pays_everything(dep, honest, posted):
    dep.revert(posted)
    games = [H.challenge(dep, 1, 0), H.challenge(dep, 1, 1, challenger=dep.challenger2)]
    end = dep.call(dep.registry.functions.windowEnd(1, 1))
    for gid in games:  # the trainer reveals; the challengers never answer
        v = dep.view(gid)
        H.Trainer(dep, honest).move(gid, v)
    dep.at(max(dep.view(g)["deadline"] for g in games) + 1)
    for gid in games:
        dep.tx(dep.game.functions.claimTimeout(gid), dep.trainer)
    dep.at(max(dep.now(), end + 1))
    dep.tx(dep.registry.functions.finalize(1), dep.anyone)
    assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake + 2 * CFG.challenger_bond


# ------------------------------------------------------------------ move validation


def test_moves_out_of_turn_or_by_third_party_revert(dep, scenario):
    g = dep.game.functions
    gid = scenario.gid
    v = at_label(dep, scenario, "steps.reveal")
    left, right = b"\x01" * 32, b"\x02" * 32
    with reverts("NotYourTurn", dep.challenger, Party.TRAINER):
        dep.dry(g.reveal(gid, left, right), dep.challenger)
    with reverts("NotYourTurn", dep.anyone, Party.TRAINER):
        dep.dry(g.reveal(gid, left, right), dep.anyone)
    with reverts("NotYourTurn", dep.trainer, Party.TRAINER):
        dep.dry(g.choose(gid, True), dep.trainer)
    with reverts("HashMismatch", v["root"]):
        dep.dry(g.reveal(gid, left, right), dep.trainer)
    with reverts("ZeroRoot"):
        dep.dry(g.reveal(gid, b"\x00" * 32, right), dep.trainer)
    with reverts("WrongPhase", gid, Phase.STEPS):
        dep.dry(g.commitTrace(gid, left), dep.trainer)
    with reverts("NotALeaf", 2):
        dep.dry(g.openStep(gid, [], [], left, left, []), dep.trainer)
    with reverts("WrongPhase", gid, Phase.STEPS):
        dep.dry(g.openChunk(gid, b""), dep.trainer)
    with reverts("WrongPhase", gid, Phase.STEPS):
        dep.dry(g.oneStep(gid, b"", [], b""), dep.trainer)
    v = at_label(dep, scenario, "steps.choose")
    with reverts("NotYourTurn", dep.trainer, Party.CHALLENGER):
        dep.dry(g.reveal(gid, v["left"], v["right"]), dep.trainer)
    with reverts("UnknownGame", 99):
        dep.dry(g.reveal(99, left, right), dep.trainer)
    with reverts("UnknownGame", 99):
        dep.call(g.getGame(99))


def test_openStep_with_wrong_openings_reverts(dep, scenario, honest):
    g = dep.game.functions
    at_label(dep, scenario, "steps.open")
    prev, comps, log, prev_log, proof = H.Trainer(dep, honest).step_opening(1, 0)  # s = 5
    with reverts("WrongLength", 1, 2):
        dep.dry(g.openStep(scenario.gid, prev[:1], comps, log, prev_log, proof), dep.trainer)
    with reverts("HashMismatch"):
        dep.dry(g.openStep(scenario.gid, prev, comps[::-1], log, prev_log, proof), dep.trainer)
    with reverts("InvalidProof"):  # a state s-1 other than the one in step leaf 4
        dep.tx(g.openStep(scenario.gid, comps, comps, log, prev_log, proof), dep.trainer)
    with reverts("InvalidProof"):
        dep.dry(g.openStep(scenario.gid, prev, comps, log, prev_log, proof[1:]), dep.trainer)
    dep.tx(g.openStep(scenario.gid, prev, comps, log, prev_log, proof), dep.trainer)
    (ev,) = dep.events(dep.game, "StepOpened", game=scenario.gid)
    assert (ev.step, list(ev.components), list(ev.prevComponents)) == (5, comps, prev)


def test_openOp_with_wrong_openings_reverts(dep, scenario, honest):
    g = dep.game.functions
    v = at_label(dep, scenario, "trace.open")
    opening = H.Trainer(dep, honest).op_opening(5, v["lo"])
    out, desc, gproof, olog, lproof, roots, rproofs, bind = opening
    other = honest.graph.descriptors[0]
    with reverts("HashMismatch"):
        dep.dry(g.openOp(scenario.gid, (b"\x05" * 32, *opening[1:])), dep.trainer)
    with reverts("InvalidProof"):  # a descriptor that is not op j of the graph
        dep.tx(g.openOp(scenario.gid, (out, other, *opening[2:])), dep.trainer)
    with reverts("InvalidProof"):  # an op log root that is not the one in logRoot_s
        dep.tx(g.openOp(scenario.gid, (out, desc, gproof, b"\x06" * 32, *opening[4:])), dep.trainer)
    with reverts("InvalidProof"):  # an input record that is not in the trace
        dep.tx(g.openOp(scenario.gid, (*opening[:5], [b"\x07" * 32, roots[1]], rproofs, bind)), dep.trainer)
    with reverts("WrongLength", 1, 2):
        dep.dry(g.openOp(scenario.gid, (*opening[:5], roots[:1], rproofs, bind)), dep.trainer)
    dep.tx(g.openOp(scenario.gid, opening), dep.trainer)
    (ev,) = dep.events(dep.game, "OpOpened", game=scenario.gid)
    assert (ev.op, ev.numel, ev.nChunks, bytes(ev.descriptor)) == (v["lo"], 130, 3, desc)


def test_openChunk_and_pickElement_with_wrong_data_revert(dep, scenario, honest):
    g = dep.game.functions
    v = at_label(dep, scenario, "element.open")
    chunk = H.C.chunk_bytes(honest.steps[5].outputs[v["op"]], v["lo"])
    assert (v["lo"], len(chunk)) == (1, 256)
    with reverts("WrongLength", 252, 256):
        dep.dry(g.openChunk(scenario.gid, chunk[:-4]), dep.trainer)
    with reverts("HashMismatch"):
        dep.dry(g.openChunk(scenario.gid, chunk[4:] + chunk[:4]), dep.trainer)
    v = at_label(dep, scenario, "pick")
    with reverts("OffsetOutOfRange", 64, 64):
        dep.dry(g.pickElement(scenario.gid, chunk, 64), dep.challenger)
    with reverts("HashMismatch"):
        dep.dry(g.pickElement(scenario.gid, chunk[4:] + chunk[:4], 0), dep.challenger)
    dep.tx(g.pickElement(scenario.gid, chunk, 36), dep.challenger)
    (ev,) = dep.events(dep.game, "ElementPicked", game=scenario.gid)
    assert ev.index == 100 and ev.claimed == int.from_bytes(chunk[144:148], "little")


def test_oneStep_revert_leaves_game_unchanged(dep, scenario, honest):
    g = dep.game.functions
    v = at_label(dep, scenario, "onestep")
    desc, roots = H.Trainer(dep, honest).op_inputs(5, v["op"])
    with reverts("ToyRejectedProof"):
        dep.dry(g.oneStep(scenario.gid, desc, roots, b"\xff"), dep.trainer)
    with reverts("OpeningMismatch"):
        dep.dry(g.oneStep(scenario.gid, honest.graph.descriptors[0], roots, b""), dep.trainer)
    with reverts("OpeningMismatch"):
        dep.dry(g.oneStep(scenario.gid, desc, roots[::-1], b""), dep.trainer)
    with reverts("Unauthorized"):
        dep.dry(g.oneStep(scenario.gid, desc, roots, b""), dep.anyone)
    after = dep.view(scenario.gid)
    assert (after["phase"], after["status"], after["toMove"]) == (Phase.ONE_STEP, GameStatus.IN_PROGRESS, Party.TRAINER)
    assert after["deadline"] == v["deadline"]
    # Either party may ask for the ruling: the challenger's own call makes the trainer win.
    dep.tx(g.oneStep(scenario.gid, desc, roots, b""), dep.challenger)
    assert dep.view(scenario.gid)["status"] == GameStatus.TRAINER_WON
    with reverts("GameOver"):
        dep.dry(g.oneStep(scenario.gid, desc, roots, b""), dep.trainer)


# ------------------------------------------------------------------ challenge rules


def test_challenge_window_includes_its_last_second(dep, posted):
    dep.revert(posted)
    end = dep.call(dep.registry.functions.windowEnd(1, 0))
    snap = dep.snapshot()
    dep.at(end)
    H.challenge(dep, 1, 0)
    assert dep.job(1)["openGames"] == 1
    dep.revert(snap)
    dep.at(end + 1)
    with reverts("WindowClosed", 1, 0, end, end + 1):
        H.challenge(dep, 1, 0)


def test_challenge_with_wrong_bond_or_unposted_interval_or_inactive_job_reverts(dep, honest):
    job = H.active_job(dep, honest, post=False)
    H.post_intervals(dep, job, honest, upto=1)
    with reverts("WrongValue", CFG.challenger_bond - 1, CFG.challenger_bond):
        H.challenge(dep, job, 0, bond=CFG.challenger_bond - 1)
    with reverts("IntervalNotPosted", job, 1, 1):
        H.challenge(dep, job, 1)
    open_job = H.create_job(dep, honest)
    with reverts("WrongJobStatus", open_job, JobStatus.OPEN, JobStatus.ACTIVE):
        H.challenge(dep, open_job, 0, bond=CFG.challenger_bond)


# ------------------------------------------------------------------ sizes and gas


def test_deployed_contracts_fit_eip170():
    for name in ("JobRegistry", "DisputeGame"):
        size = (len(H.load_artifact(name).deployed_bytecode) - 2) // 2
        assert 0 < size < EIP170, (name, size)


def test_gas_per_move_covers_every_move_under_the_tx_cap(chain):
    gas = H.gas_per_move(dep=chain.reset())
    moves = {
        "createJob", "acceptJob", "postInterval", "challenge", "reveal", "choose", "openStep",
        "commitTrace", "openOp", "openChunk", "pickElement", "oneStep", "finalize", "withdraw",
    }
    assert set(gas) == moves
    assert all(21_000 < g < 16_777_216 for g in gas.values()), gas


@pytest.mark.slow
def test_openStep_with_1024_slots_fits_one_transaction(chain):
    gas = H.gas_per_move(n_slots=1024, n_steps=2, interval_length=2, dep=chain.reset())
    assert gas["openStep"] < 16_777_216, gas


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg",
    [
        H.JobConfig(n_steps=3, interval_length=1),  # one-leaf intervals: no step bisection
        H.JobConfig(n_steps=5, interval_length=5),  # 5 leaves: 4 | 1 split
        H.JobConfig(n_steps=7, interval_length=3, n_slots=3),  # 13 ops
    ],
    ids=["K1", "K5", "K3-slots3"],
)
def test_other_shapes_cheater_loses_and_honest_trainer_wins(chain, cfg):
    dep = chain.reset()
    honest = H.simulate(cfg)
    for cheat in (Cheat("element", step=cfg.n_steps, op="update0", index=64), None):
        dep.reset()
        run = H.simulate(cfg, cheat)
        H.active_job(dep, run)
        interval = cfg.interval_of(cfg.n_steps)[0]
        gid = H.challenge(dep, 1, interval)
        if cheat:
            res = H.play(dep, gid, H.Trainer(dep, run), H.HonestChallenger(dep, honest))
            assert res.status == GameStatus.CHALLENGER_WON
        else:
            ch = H.FalseChallenger(dep, position=-1, op=run.graph.index["update0"], element=64)
            res = H.play(dep, gid, H.Trainer(dep, run), ch)
            assert res.status == GameStatus.TRAINER_WON
        dep.check_solvency()


def test_openOp_reading_a_later_op_reverts_and_trainer_loses_on_time(dep):
    # A malformed (non-topological) graph: `sum` reads `empty`, a later op, whose record is not
    # agreed. The trainer accepted the graph; it cannot open that op and loses on time.
    graph = H.make_graph(CFG.n_slots)
    ops = list(graph.ops)
    j = graph.index["sum"]
    ops[j] = H.replace(ops[j], inputs=(graph.index["empty"],))
    run = H.simulate(CFG, graph=H.graph_of(ops))
    H.active_job(dep, run)
    gid = H.challenge(dep, 1, 0)
    res = H.play(dep, gid, H.Trainer(dep, run), H.FalseChallenger(dep, position=0, op=j))
    assert (res.status, res.ruling) == (GameStatus.CHALLENGER_WON, Ruling.TIMEOUT)
    assert res.stuck.name == "InputNotBefore" and res.stuck.error_args == (j + 1, j)
