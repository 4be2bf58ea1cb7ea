"""Concurrent false games against one honest trainer (docs/security.md, "Concurrent false games"):
griefers each dispute a different step of one long interval at once. The trainer must win every
game with its training-step computations O(games + K), not O(games x moves x K), and a restarted
trainer must reuse what it kept on disk (protocol/trainer.py, ``DisputedSteps``)."""

from __future__ import annotations

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
from protocol.store import ArtifactStore
from protocol.trainer import TrainerAgent
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
        proto = self.player.proto
        if v.phase == PHASE_PICK:
            logs = proto.game.events.ChunkOpened.get_logs(from_block=self.since,
                                                          argument_filters={"game": gid})
            return Move("pickElement", (bytes(logs[-1]["args"]["data"]), 0))
        if v.phase == PHASE_PARTIALS:
            logs = proto.game.events.PartialsPosted.get_logs(from_block=self.since,
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


def _griefers(proto, ctx, job, a) -> list[Griefer]:
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
        out.append(Griefer(p, gid, K - 1 - n, op, int(r["blockNumber"])))
    return out


def _play(trainer: TrainerAgent, griefers: list[Griefer], until=lambda: False, passes: int = 400) -> None:
    for _ in range(passes):
        if until() or all(g.player.view(g.gid).status != STATUS_IN_PROGRESS for g in griefers):
            return
        trainer.play()
        for g in griefers:
            g.player.step(g.gid, g.move)
    raise AssertionError("the games did not end")


def _won(griefers: list[Griefer]) -> list[int]:
    return [g.player.view(g.gid).status for g in griefers]


def test_concurrent_false_games_cost_the_trainer_o_games_steps(posted, monkeypatch) -> None:
    proto, ctx, job, store, a = posted
    spy = StepCounter(monkeypatch)
    trainer = TrainerAgent(proto, a[2], ctx, store, job)
    griefers = _griefers(proto, ctx, job, a)
    _play(trainer, griefers)
    assert _won(griefers) == [STATUS_TRAINER_WON] * GAMES
    # One pass over the interval gives every disputed step's roots (<= K steps), then one step per
    # game for its op's values (from the state kept before the step). The old per-move regeneration
    # (4 traces cached) ran about (moves x K / 2) steps per game: several hundred here.
    assert spy.steps <= K + GAMES, spy.steps
    assert trainer.disputes.steps_run == spy.steps
    local = store.root / str(job) / "local" / "disputes"
    assert len(list((local / "summaries").iterdir())) == GAMES
    assert len(list((local / "states").iterdir())) <= trainer.disputes.max_states


def test_a_restarted_trainer_reuses_what_it_kept(posted, monkeypatch) -> None:
    proto, ctx, job, store, a = posted
    spy = StepCounter(monkeypatch)
    griefers = _griefers(proto, ctx, job, a)
    first = TrainerAgent(proto, a[2], ctx, store, job)
    # Play until every game is past the step level (the trainer has regenerated every step once).
    _play(first, griefers, until=lambda: all(g.player.view(g.gid).phase >= PHASE_TRACE for g in griefers))
    before = spy.steps
    assert 0 < before <= K
    # A crash can leave a damaged file: the summary of one step is truncated, it is redone.
    damaged = store.root / str(job) / "local" / "disputes" / "summaries" / str(K - 1)
    damaged.write_bytes(damaged.read_bytes()[:40])
    restarted = TrainerAgent(proto, a[2], ctx, store, job)
    _play(restarted, griefers)
    assert _won(griefers) == [STATUS_TRAINER_WON] * GAMES
    # After the restart: one step per game for its op values (from the stored states, not K each)
    # and one to redo the damaged summary (from the state kept before its step).
    assert spy.steps - before <= GAMES + 1, (before, spy.steps)
    assert restarted.disputes.steps_run == spy.steps - before


def test_the_kept_states_are_bounded(posted, monkeypatch) -> None:
    proto, ctx, job, store, a = posted
    trainer = TrainerAgent(proto, a[2], ctx, store, job)
    trainer.disputes.max_states = 2
    griefers = _griefers(proto, ctx, job, a)
    _play(trainer, griefers)
    assert _won(griefers) == [STATUS_TRAINER_WON] * GAMES
    assert len(list((store.root / str(job) / "local" / "disputes" / "states").iterdir())) <= 2
