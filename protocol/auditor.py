"""The auditor agent: replays every posted interval with the trainer's logs on its own hardware,
settles any element the rounding rule alone cannot with exact arithmetic (the same rule the
contract applies), and challenges the first interval whose root differs from its own."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from web3.logs import DISCARD

from protocol.agent import Player, checkpoint_state
from protocol.deploy import Protocol
from protocol.game import PARTY_CHALLENGER, ChallengerStrategy, StepBook
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactReader, StepRecord
from vtrain.commit import LogEntry, interval_root, state_root
from vtrain.errors import CorruptArtifact, VtrainError
from vtrain.executor import state_tensors
from vtrain.graph import OpNode
from vtrain.logfile import decode_step_log
from vtrain.trace import StepTrace
from vtrain.train import component_roots, replay_steps

log = logging.getLogger(__name__)


def exact_resolver(ctx: JobContext, overruled: list[tuple[int, int]] | None = None):
    """Resolver factory for :func:`vtrain.numerics.apply_log`: keep the trainer's value where the
    contract would uphold it, else take the exact rounding (``vtrain.exact``; EXP LOG TANH: the
    value at 400 bits, mpmath, whose RN32 is the correctly rounded result). Every overruled element
    (op, index) is appended to ``overruled``."""
    from vtrain.exact import UnsupportedOp, exact_value, judge_element, rn32

    descs = ctx.graph.descriptors

    def factory(op: OpNode, ins: list[torch.Tensor]):
        tensors = [t.detach().numpy() for t in ins]

        def resolve(indices: np.ndarray, proposed: np.ndarray, codes: np.ndarray) -> np.ndarray:
            out = proposed.copy()
            bits = proposed.view(np.uint32)
            for k, (i, c) in enumerate(zip(indices.tolist(), codes.tolist(), strict=False)):
                entry = LogEntry(int(i), int(c), int(bits[k]) if c == 3 else 0) if c else None
                try:
                    if judge_element(descs[op.id], tensors, int(i), int(bits[k]), entry):
                        continue
                    out[k] = np.array(rn32(exact_value(descs[op.id], tensors, int(i))), np.uint32).view(np.float32)
                    if overruled is not None:
                        overruled.append((op.id, int(i)))
                except UnsupportedOp:
                    continue  # a kind the adjudicator does not rule on (none rounds today): follow the log
            return out

        return resolve

    return factory


@dataclass
class AuditorAgent:
    proto: Protocol
    account: str
    ctx: JobContext
    reader: ArtifactReader
    job_id: int
    honest: bool = True
    sample: float = 1.0
    """Fraction of intervals to replay (1.0: all). A skipped interval is trusted; the next sampled
    one starts from the trainer's checkpoint, checked against the trainer's committed step leaf."""
    book: StepBook = field(init=False)
    player: Player = field(init=False)
    verified: int = 0  # intervals processed so far (replayed or skipped)
    skipped: list[int] = field(default_factory=list)
    disputed: list[int] = field(default_factory=list)
    overruled_steps: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Steps where the trainer's log claimed a value the contract would not uphold (log abuse),
    even if the difference was absorbed before the state: still a provable lie in the trace."""
    _states: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.book = StepBook(self.ctx)
        self.player = Player(self.proto, self.account, PARTY_CHALLENGER)
        self._states[0] = state_tensors(self.ctx.job.initial_state)
        self._trace = lru_cache(maxsize=4)(self._regenerate)
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))

    def _logs(self, s: int):
        return decode_step_log(self.reader.get_log(self.job_id, s), s, self.ctx.job.graph)

    def posted(self) -> list[bytes]:
        n = int(self.proto.chain.call(self.proto.registry.functions.getJob(self.job_id))[4])
        return [
            bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0]) for i in range(n)
        ]

    def audit(self) -> int | None:
        """Replay every newly posted interval; return the first interval whose root differs."""
        roots = self.posted()
        while self.verified < len(roots):
            i = self.verified
            first, n = self.ctx.interval_span(i)
            if not self._sampled(i):
                self.skipped.append(i)
                self.verified += 1
                continue
            state = self._states.get(first - 1)
            if state is None:
                state = self._trainer_checkpoint(i, roots)
            overruled: list[tuple[int, int]] = []
            for o in replay_steps(
                self.ctx.job,
                state,
                first,
                first + n - 1,
                self._logs,
                check=True,
                resolver_factory=exact_resolver(self.ctx, overruled),
            ):
                self.book.records[o.step] = StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots))
                state = o.state
                if overruled:
                    self.overruled_steps[o.step] = list(overruled)
                    log.info(
                        "job %d: step %d: trainer's log claims values exact arithmetic overrules: %s",
                        self.job_id,
                        o.step,
                        overruled[:4],
                    )
                    overruled.clear()
            self._states[first + n - 1] = state
            mine = interval_root([self.book.records[s].leaf() for s in range(first, first + n)])
            self.verified += 1
            if mine != roots[i]:
                log.info(
                    "job %d: interval %d differs (posted %s, replayed %s)",
                    self.job_id,
                    i,
                    roots[i].hex()[:16],
                    mine.hex()[:16],
                )
                return i
            if any(first <= s < first + n for s in self.overruled_steps):
                return i
        return None

    def _sampled(self, i: int) -> bool:
        if self.sample >= 1.0:
            return True
        digest = hashlib.sha256(f"{self.account}:{self.job_id}:{i}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.sample

    def _trainer_checkpoint(self, i: int, roots: list[bytes]) -> list[torch.Tensor]:
        """The trainer's state at the start of interval ``i``, accepted only if it is the state its
        posted interval ``i-1`` commits to."""
        first, _ = self.ctx.interval_span(i)
        state = checkpoint_state(self.ctx, self.reader.get_checkpoint(self.job_id, i), f"checkpoint of interval {i}")
        pf, pn = self.ctx.interval_span(i - 1)
        records = [self.reader.get_step(self.job_id, s) for s in range(pf, pf + pn)]
        if interval_root([r.leaf() for r in records]) != roots[i - 1]:
            raise CorruptArtifact(f"the trainer's step records of interval {i - 1} do not match its posted root")
        if state_root(component_roots(state)) != records[-1].state_root:
            raise CorruptArtifact(f"checkpoint of interval {i} is not the state committed at step {first - 1}")
        self._states[first - 1] = state
        return state

    def challenge(self, interval: int, terms: Terms) -> int:
        r = self.proto.chain.send(
            self.proto.game.functions.challenge(self.job_id, interval),
            self.account,
            value=terms.challenger_bond,
            what=f"job {self.job_id}: challenge interval {interval}",
        )
        ev = self.proto.game.events.GameCreated().process_receipt(r, errors=DISCARD)
        gid = int(ev[0]["args"]["game"])
        self.disputed.append(gid)
        self.player.stats.add(gid, int(r["gasUsed"]))
        return gid

    def _regenerate(self, s: int) -> StepTrace:
        i = (s - 1) // self.ctx.spec.interval
        first, _ = self.ctx.interval_span(i)
        state = self._states.get(first - 1)
        if state is None:
            raise VtrainError(f"auditor has no replayed state before step {first}")
        if s > first:
            for o in replay_steps(
                self.ctx.job, state, first, s - 1, self._logs, resolver_factory=exact_resolver(self.ctx)
            ):
                state = o.state
        (o,) = list(
            replay_steps(
                self.ctx.job, state, s, s, self._logs, resolver_factory=exact_resolver(self.ctx), keep_trace=True
            )
        )
        return StepTrace.of(s, self.ctx.job.graph, o.result)

    def _opened_components(self, gid: int) -> list[bytes] | None:
        logs = self.proto.game.events.StepOpened.get_logs(from_block=0, argument_filters={"game": gid})
        return [bytes(c) for c in logs[-1]["args"]["components"]] if logs else None

    def _chunk(self, gid: int) -> bytes | None:
        logs = self.proto.game.events.ChunkOpened.get_logs(from_block=0, argument_filters={"game": gid})
        return bytes(logs[-1]["args"]["data"]) if logs else None

    def _target_step(self, interval: int) -> int | None:
        first, n = self.ctx.interval_span(interval)
        return next((s for s in sorted(self.overruled_steps) if first <= s < first + n), None)

    def play(self) -> int:
        strategy = ChallengerStrategy(
            self.ctx,
            self.book,
            self._trace,
            self._opened_components,
            self._chunk,
            honest=self.honest,
            target_step=self._target_step,
        )
        sent = 0
        for gid in self.disputed:
            sent += self.player.step(gid, strategy.move)
        return sent

    def withdraw(self) -> int:
        """Pull everything the registry owes this agent's account; returns the amount (wei)."""
        return self.player.withdraw()
