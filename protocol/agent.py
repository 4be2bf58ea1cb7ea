"""What both agents share: reading games from the chain, making moves, claiming timeouts."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from protocol.chain import Reverted
from protocol.deploy import Protocol
from protocol.game import PARTY_CHALLENGER, PARTY_TRAINER, STATUS_IN_PROGRESS, GameView, Move
from protocol.jobs import JobContext
from protocol.store import load_checkpoint, save_checkpoint
from vtrain.errors import CorruptCheckpoint

log = logging.getLogger(__name__)


def checkpoint_bytes(ctx: JobContext, state: list[torch.Tensor]) -> bytes:
    return save_checkpoint(
        {f"{i:04d}:{s.name}": t.detach().numpy() for i, (s, t) in enumerate(zip(ctx.job.graph.slots, state))}
    )


def checkpoint_state(ctx: JobContext, data: bytes, what: str) -> list[torch.Tensor]:
    """The state in a checkpoint of ``ctx``'s job: one finite float32 tensor per slot, of the slot's
    shape, and nothing else. Raises CorruptCheckpoint (naming ``what``) otherwise."""
    try:
        d = load_checkpoint(data)
    except CorruptCheckpoint as e:
        raise CorruptCheckpoint(f"{what}: {e}") from None
    slots = ctx.job.graph.slots
    if len(d) != len(slots):
        raise CorruptCheckpoint(f"{what}: expected {len(slots)} tensors, got {len(d)}")
    out = []
    for i, s in enumerate(slots):
        name = f"{i:04d}:{s.name}"
        a = d.get(name)
        if a is None:
            raise CorruptCheckpoint(f"{what}: expected a tensor {name!r} for slot {i}, got none")
        if a.dtype != np.float32 or tuple(a.shape) != tuple(s.shape):
            raise CorruptCheckpoint(
                f"{what}: slot {i} ({s.name}): expected float32{tuple(s.shape)}, got {a.dtype}{tuple(a.shape)}"
            )
        if not bool(np.isfinite(a).all()):
            raise CorruptCheckpoint(f"{what}: slot {i} ({s.name}): expected finite values, got NaN/Inf")
        out.append(torch.from_numpy(a.copy()))
    return out


def job_first_block(proto: Protocol, job_id: int) -> int:
    """The block of ``job_id``'s JobCreated event (looked up once per deployment object and job):
    event searches about a job start there, not at block 0, so they do not slow down as the chain
    grows. Cached on ``proto``, never globally: two chains can hold a registry at one address."""
    if job_id not in proto.job_blocks:
        logs = proto.registry.events.JobCreated.get_logs(from_block=0, argument_filters={"job": job_id})
        if not logs:
            return 0  # not mined yet: search everything, cache nothing
        proto.job_blocks[job_id] = int(logs[0]["blockNumber"])
    return proto.job_blocks[job_id]


@dataclass
class MoveStats:
    """Moves and gas one agent spent, per game."""

    moves: dict[int, int] = field(default_factory=dict)
    gas: dict[int, int] = field(default_factory=dict)
    max_gas: dict[int, int] = field(default_factory=dict)

    def add(self, gid: int, gas: int) -> None:
        self.moves[gid] = self.moves.get(gid, 0) + 1
        self.gas[gid] = self.gas.get(gid, 0) + gas
        self.max_gas[gid] = max(self.max_gas.get(gid, 0), gas)


@dataclass
class Player:
    """A party in games of one job: sends the strategy's moves, claims the other side's timeouts."""

    proto: Protocol
    account: str
    party: int
    stats: MoveStats = field(default_factory=MoveStats)

    def view(self, gid: int) -> GameView:
        return GameView.decode(self.proto.chain.call(self.proto.game.functions.getGame(gid)))

    def send(self, gid: int, move: Move, value: int = 0) -> dict:
        fn = getattr(self.proto.game.functions, move.fn)(gid, *move.args)
        r = self.proto.chain.send(fn, self.account, value=value, what=f"game {gid}: {move.fn}")
        self.stats.add(gid, int(r["gasUsed"]))
        log.info("game %d: %s (%d gas)", gid, move.fn, r["gasUsed"])
        return r

    def step(self, gid: int, strategy_move) -> bool:
        """Make at most one move in game ``gid``; True when something was sent."""
        v = self.view(gid)
        if v.status != STATUS_IN_PROGRESS:
            return False
        if v.to_move == self.party:
            move = strategy_move(gid, v)
            if move is None:
                return False
            try:
                self.send(gid, move)
            except Reverted as e:
                log.warning("game %d: %s reverted: %s", gid, move.fn, e)
                return False
            return True
        other = PARTY_CHALLENGER if self.party == PARTY_TRAINER else PARTY_TRAINER
        if v.to_move == other and self.proto.chain.now() > v.deadline:
            self.send(gid, Move("claimTimeout", ()))
            return True
        return False

    def withdraw(self) -> int:
        """Pull every credit the registry holds for this account (pull payments)."""
        owed = int(self.proto.chain.call(self.proto.registry.functions.owed(self.account)))
        if owed:
            self.proto.chain.send(self.proto.registry.functions.withdraw(), self.account, what="withdraw")
        return owed

    def games_of(self, job_id: int) -> list[int]:
        ev = self.proto.game.events.GameCreated
        logs = ev.get_logs(from_block=job_first_block(self.proto, job_id), argument_filters={"job": job_id})
        return sorted(int(e["args"]["game"]) for e in logs)
