"""Concurrent false games against one honest trainer (docs/security.md, "Concurrent false games"):
griefers each dispute a different step of one long interval at once. The trainer must win every
game with its training-step computations O(games + K), not O(games x moves x K), and a restarted
trainer must reuse what it kept on disk (protocol/trainer.py, ``DisputedSteps``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from web3.logs import DISCARD

from protocol import trainer as trainer_mod
from protocol.agent import Player
from protocol.chain import Chain
from protocol.demo import create_job
from protocol.deploy import deploy
from protocol.game import (
    PARTY_CHALLENGER,
    PHASE_ELEMENT,
    PHASE_PARTIALS,
    PHASE_PICK,
    PHASE_STEPS,
    PHASE_TRACE,
    STATUS_IN_PROGRESS,
    STATUS_TRAINER_WON,
    GameView,
    Move,
    split,
)
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactStore, load_checkpoint
from protocol.trainer import TrainerAgent
from vtrain.commit.roots import chunk_bytes
from vtrain.errors import MissingArtifact
from vtrain.graph.step_graph import OpKind
from vtrain.training.spec import TrainSpec

K = 8  # one interval of 8 steps
GAMES = 6
TERMS = Terms()


class StepCounter:
    """A spy on the trainer's ``train_steps``: counts the steps it computes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps = 0
        real = trainer_mod.train_steps

        def counted(*args, **kw) -> Iterator:
            for o in real(*args, **kw):
                self.steps += 1
                yield o

        monkeypatch.setattr(trainer_mod, "train_steps", counted)


@dataclass
class Griefer:
    """A false challenger that descends to a chosen step and op, then blindly to element 0."""

    player: Player
    gid: int
    step_pos: int  # position of the disputed step in the interval
    op: int
    since: int  # the game's first block (event searches start there)
    store: ArtifactStore  # the trainer's

    def move(self, gid: int, v: GameView) -> Move | None:
        if v.status != STATUS_IN_PROGRESS or v.to_move != PARTY_CHALLENGER:
            return None
        k = split(v.size)
        if v.phase == PHASE_STEPS:
            return Move("choose", (self.step_pos >= v.lo + k,))
        if v.phase == PHASE_TRACE:
            return Move("choose", (self.op >= v.lo + k,))
        if v.phase == PHASE_ELEMENT:
            return Move("choose", (False,))
        if v.phase == PHASE_PICK:  # the chunk the trainer opened: from its store where it kept it
            # (an event search on eth-tester reads every receipt of the chain: seconds a move)
            try:
                value = load_checkpoint(self.store.get_local(v.job, f"local/disputes/ops/{v.step}-{v.op}"))["value"]
                chunk = chunk_bytes(value, v.lo)
            except MissingArtifact:  # a trainer that keeps none (the old one, for the before figure)
                logs = self.player.proto.game.events.ChunkOpened.get_logs(from_block=self.since,
                                                                          argument_filters={"game": gid})
                chunk = bytes(logs[-1]["args"]["data"])
            return Move("pickElement", (chunk, 0))
        if v.phase == PHASE_PARTIALS:
            logs = self.player.proto.game.events.PartialsPosted.get_logs(from_block=self.since,
                                                             argument_filters={"game": gid})
            return Move("disputeChunk", ([tuple(p) for p in logs[-1]["args"]["partials"]], 0))
        return None


@pytest.fixture
def posted(tmp_path):
    """An honest trainer that has posted one interval of K MLP steps."""
    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(TrainSpec(model="mlp", batch_size=16, steps=K, interval=K))
    job = create_job(proto, a[1], a[2], ctx, TERMS)
    store = ArtifactStore(tmp_path / "store")
    trainer = TrainerAgent(proto, a[2], ctx, store, job)
    trainer.accept(TERMS)
    assert trainer.run_interval() == 0
    return proto, ctx, job, store, a


def _griefers(proto, ctx, job, store, a) -> list[Griefer]:
    """GAMES false challengers, each disputing a different step (the last ones first) and the first
    op that computes (not a bind)."""
    op = next(o.id for o in ctx.job.graph.ops if o.kind not in (OpKind.INPUT, OpKind.OUTPUT, OpKind.CONST,
                                                                  OpKind.DATA))
    out = []
    for n in range(GAMES):
        p = Player(proto, a[3 + n], PARTY_CHALLENGER)
        r = proto.chain.send(proto.game.functions.challenge(job, 0), p.account, value=TERMS.challenger_bond,
                             what="challenge")
        gid = int(proto.game.events.GameCreated().process_receipt(r, errors=DISCARD)[0]["args"]["game"])
        out.append(Griefer(p, gid, K - 1 - n, op, int(r["blockNumber"]), store))
    return out


def _play(trainer: TrainerAgent, griefers: list[Griefer], until=lambda: False, passes: int = 400) -> None:
    for n in range(passes):
        # The end checked every 4th pass: a chain call per game (a pass makes a few).
        if until() or (n % 4 == 0 and all(g.player.view(g.gid).status != STATUS_IN_PROGRESS for g in griefers)):
            return
        trainer.play()
        for g in griefers:
            g.player.step(g.gid, g.move)
    raise AssertionError("the games did not end")


def _won(griefers: list[Griefer]) -> list[int]:
    return [g.player.view(g.gid).status for g in griefers]


@pytest.mark.slow
def test_concurrent_false_games_cost_the_trainer_o_games_steps(posted, monkeypatch) -> None:
    proto, ctx, job, store, a = posted
    spy = StepCounter(monkeypatch)
    trainer = TrainerAgent(proto, a[2], ctx, store, job)
    griefers = _griefers(proto, ctx, job, store, a)
    _play(trainer, griefers)
    assert _won(griefers) == [STATUS_TRAINER_WON] * GAMES
    # One pass over the interval gives every disputed step's roots (<= K steps), then one step per
    # game for its op's values (from the state kept before the step). The old per-move regeneration
    # (4 traces cached) ran several hundred steps here.
    assert spy.steps <= K + GAMES, spy.steps
    assert trainer.disputes.steps_run == spy.steps
    local = store.root / str(job) / "local" / "disputes"
    assert len(list((local / "summaries").iterdir())) == GAMES
    assert len(list((local / "states").iterdir())) <= trainer.disputes.max_states


@pytest.mark.slow  # ~20 s; with the other game-load tests under -m slow
def test_concurrent_false_games_cost_o_games_steps_across_a_restart(posted, monkeypatch) -> None:
    """The default-suite row: the games above with the trainer restarted mid-game and one of its
    kept files damaged (a crash mid-write): the restarted trainer reuses what it kept."""
    proto, ctx, job, store, a = posted
    spy = StepCounter(monkeypatch)
    griefers = _griefers(proto, ctx, job, store, a)
    first = TrainerAgent(proto, a[2], ctx, store, job)
    # Play until every game is past its trace commitment (the trainer has every step's roots).
    _play(first, griefers, until=lambda: all(g.player.view(g.gid).phase >= PHASE_TRACE for g in griefers))
    before = spy.steps
    assert 0 < before <= K  # one pass over the interval for all the games
    # A damaged file is redone: the roots of one step, truncated.
    damaged = store.root / str(job) / "local" / "disputes" / "summaries" / str(K - 1)
    damaged.write_bytes(damaged.read_bytes()[:40])
    restarted = TrainerAgent(proto, a[2], ctx, store, job)
    _play(restarted, griefers)
    assert _won(griefers) == [STATUS_TRAINER_WON] * GAMES
    # After the restart: one step per game for its op's values (from the state kept before its
    # step, not K each) and one to redo the damaged roots. The old code: several hundred steps.
    assert spy.steps - before <= GAMES + 1, (before, spy.steps)
    assert restarted.disputes.steps_run == spy.steps - before
    # Every game reached the element level (the trainer kept its op's values), not a timeout.
    ops = {n.split("-")[0] for n in os.listdir(store.root / str(job) / "local" / "disputes" / "ops")}
    assert ops == {str(g.step_pos + 1) for g in griefers}


@pytest.mark.slow
def test_the_kept_states_are_bounded(posted, monkeypatch) -> None:
    proto, ctx, job, store, a = posted
    trainer = TrainerAgent(proto, a[2], ctx, store, job)
    trainer.disputes.max_states = 2
    griefers = _griefers(proto, ctx, job, store, a)
    _play(trainer, griefers)
    assert _won(griefers) == [STATUS_TRAINER_WON] * GAMES
    assert len(list((store.root / str(job) / "local" / "disputes" / "states").iterdir())) <= 2


def test_the_trainer_refuses_a_clock_that_cannot_cover_regenerating_its_step() -> None:
    from protocol.policy import CLOCK, POSTING, game_moves, trainer_regen_steps
    from protocol.policy import TermsPolicy as P

    graph = JobContext.of(TrainSpec(model="mlp", batch_size=16, steps=K, interval=K)).job.graph
    moves = game_moves(graph, K)
    covers_moves = 2 * moves * 15
    params = [0] * 16
    params[CLOCK], params[POSTING] = covers_moves + 10, 10**6
    assert P("trainer").refusals(tuple(params), 10**18, graph, K) == []
    slow = P("trainer", step_seconds=60.0)
    assert trainer_regen_steps(K) == K + 1
    (why,) = slow.refusals(tuple(params), 10**18, graph, K)
    need = 2 * (moves * 15 + (K + 1) * 60)
    assert f"{K + 1} regenerated steps x 60 s) = {need} s" in why
    params[CLOCK] = need
    assert slow.refusals(tuple(params), 10**18, graph, K) == []
    with pytest.raises(ValueError, match="step_seconds"):
        P("trainer", step_seconds=-1.0)


def test_local_work_files_have_checked_names_and_are_never_served(tmp_path) -> None:
    from protocol.store import _PATH_RE

    store = ArtifactStore(tmp_path)
    store.put_local(1, "local/disputes/states/3", b"state")
    assert store.get_local(1, "local/disputes/states/3") == b"state"
    assert [n for n, _ in store.local_names(1, "local/disputes/states")] == ["3"]
    store.remove_local(1, "local/disputes/states/3")
    with pytest.raises(MissingArtifact):
        store.get_local(1, "local/disputes/states/3")
    for bad in ("steps/1.json", "local/../steps/1.json", "local", "/etc/passwd", "local/a/b/c/d"):
        with pytest.raises(ValueError, match="local file name"):
            store.put_local(1, bad, b"x")
    assert _PATH_RE.fullmatch("/1/local/disputes/states/3") is None  # the HTTP reader serves none of it
