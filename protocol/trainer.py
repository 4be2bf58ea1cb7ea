"""The trainer agent: trains with controlled numerics, posts one root per interval, publishes the
artifacts, and defends its commitments in every game. Restart-safe: progress is read back from
the chain (next interval) and the artifact store (records, logs, checkpoints)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from protocol.agent import Player, checkpoint_bytes, checkpoint_state
from protocol.chain import Reverted
from protocol.deploy import Protocol
from protocol.game import PARTY_TRAINER, StepBook, TrainerStrategy
from protocol.jobs import JobContext, Terms
from protocol.policy import JobRefused, TermsPolicy
from protocol.rulability import UnrulableJob, check_rulable
from protocol.store import ArtifactStore, StepRecord
from vtrain.commit.roots import interval_root
from vtrain.commit.trace import StepTrace
from vtrain.errors import CorruptArtifact, MissingArtifact, VtrainError
from vtrain.graph.executor import state_tensors
from vtrain.numerics.logfile import decode_step_log, encode_step_log
from vtrain.training.loop import Cheat, train_steps

log = logging.getLogger(__name__)

JOB_STATUS = ["none", "open", "active", "cancelled", "finalized", "fraudulent"]


@dataclass
class TrainerAgent:
    proto: Protocol
    account: str
    ctx: JobContext
    store: ArtifactStore
    job_id: int
    cheat: Cheat | None = None
    nproc: int = 1
    device: str = "cpu"  # where the steps compute (cpu or cuda[:N]); logs and roots are device independent
    """Data-parallel ranks for training an interval (vtrain.distributed): the same artifacts and roots."""
    policy: TermsPolicy = field(default_factory=lambda: TermsPolicy("trainer"))
    """What this trainer requires of a job's terms before it stakes (``accept`` checks it)."""
    player: Player = field(init=False)
    _responder: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.nproc > 1 and self.cheat is not None:
            raise ValueError("a cheating trainer runs in one process (nproc 1)")
        # The client's spec (its model source, checkpoint) is the job's before any of it runs.
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))
        self.player = Player(self.proto, self.account, PARTY_TRAINER)
        self._trace = lru_cache(maxsize=4)(self._regenerate)

    # -- job life cycle -----------------------------------------------------------------------------
    def refusals(self) -> list[str]:
        """Why this trainer declines the job: an op the chain cannot rule on (an honest trainer
        would lose a game that reaches it), terms shorter than it can answer within, or a stake or
        bond outside its policy. Empty: it accepts."""
        j = self.proto.chain.call(self.proto.registry.functions.getJob(self.job_id))
        reasons = []
        try:
            check_rulable(self.ctx.job.graph)
        except UnrulableJob as e:
            reasons.append(str(e))
        return reasons + self.policy.refusals(tuple(j[0]), int(j[2]), self.ctx.job.graph, self.ctx.spec.interval)

    def accept(self, terms: Terms | None = None) -> None:
        """Stake and accept the job, unless ``refusals`` gives a reason: then JobRefused (logged),
        and nothing is sent. The stake sent is the job's (``terms``, if given, must agree)."""
        reasons = self.refusals()
        if reasons:
            log.warning("job %d: refused: %s", self.job_id, "; ".join(reasons))
            raise JobRefused(f"job {self.job_id} refused: " + "; ".join(reasons))
        stake = int(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))[11])
        if terms is not None and terms.trainer_stake != stake:
            raise JobRefused(f"job {self.job_id} refused: it asks a stake of {stake} wei, "
                             f"not the {terms.trainer_stake} wei expected")
        self.proto.chain.send(
            self.proto.registry.functions.acceptJob(self.job_id),
            self.account,
            value=stake,
            what=f"job {self.job_id}: acceptJob",
        )

    def next_interval(self) -> int:
        return int(self.proto.chain.call(self.proto.registry.functions.getJob(self.job_id))[4])

    def status(self) -> str:
        return JOB_STATUS[int(self.proto.chain.call(self.proto.registry.functions.jobStatus(self.job_id)))]

    def run_interval(self, on_step: Callable[[int, float], None] | None = None) -> int | None:
        """Train the next unposted interval, publish its artifacts, post its root. None when done."""
        i = self.next_interval()
        if i >= self.ctx.n_intervals:
            return None
        first, n = self.ctx.interval_span(i)
        state = self._state_at(first - 1)
        self.store.put_checkpoint(self.job_id, i, checkpoint_bytes(self.ctx, state))
        leaves = []
        for o in self._train(state, first, first + n - 1):
            self.store.put_log(self.job_id, o.step, encode_step_log(o.log, o.step, self.ctx.job.graph))
            rec = StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots))
            self.store.put_step(self.job_id, rec)
            leaves.append(rec.leaf())
            if on_step:
                on_step(o.step, o.loss)
        if first + n - 1 < self.ctx.spec.steps:
            self.store.put_checkpoint(self.job_id, i + 1, checkpoint_bytes(self.ctx, o.state))
        root = interval_root(leaves)
        try:
            self.proto.chain.send(
                self.proto.registry.functions.postInterval(self.job_id, i, root),
                self.account,
                what=f"job {self.job_id}: postInterval {i}",
            )
        except Reverted:
            # Posted meanwhile (a run of ours before a restart, mined late): the chain has it.
            onchain = self.next_interval() > i and bytes(
                self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0]) == root
            if not onchain:
                raise
            log.warning("job %d: interval %d was already posted with this root; not posting it again", self.job_id, i)
            return None
        log.info("job %d: posted interval %d root %s", self.job_id, i, root.hex()[:16])
        return i

    def _train(self, state: list[torch.Tensor], first: int, last: int):
        if self.nproc > 1:
            from vtrain.distributed.launch import train_span

            return train_span(self.ctx.job, state, first, last, self.nproc, self.device)
        return train_steps(self.ctx.job, state, first, last, cheat=self.cheat, device=self.device)

    def _state_at(self, step: int) -> list[torch.Tensor]:
        """State after ``step`` (an interval boundary): initial state or the stored checkpoint. A
        checkpoint that is missing or corrupt in the local store is rebuilt (deterministically)
        from the last good one before it, and stored again."""
        if step == 0:
            return state_tensors(self.ctx.job.initial_state)
        target = step // self.ctx.spec.interval
        i, state = target, None
        while i > 0:  # the latest readable checkpoint at or before ``target``
            try:
                state = self._checkpoint(i)
                break
            except (CorruptArtifact, MissingArtifact) as e:
                log.warning("job %d: %s; rebuilding it from the checkpoint before", self.job_id, e)
                i -= 1
        if state is None:
            state = state_tensors(self.ctx.job.initial_state)
        while i < target:
            first, n = self.ctx.interval_span(i)
            for o in train_steps(self.ctx.job, state, first, first + n - 1, cheat=self.cheat, device=self.device):
                state = o.state
            i += 1
            self.store.put_checkpoint(self.job_id, i, checkpoint_bytes(self.ctx, state), replace=True)
            log.warning("job %d: rebuilt the checkpoint of interval %d", self.job_id, i)
        return state

    def _checkpoint(self, i: int) -> list[torch.Tensor]:
        data = self.store.get_checkpoint(self.job_id, i)
        try:
            return checkpoint_state(self.ctx, data, f"checkpoint of interval {i} in {self.store!r}")
        except (ValueError, TypeError) as e:
            raise CorruptArtifact(f"checkpoint of interval {i} in {self.store!r}: {e}") from None

    def repair(self) -> list[int]:
        """Check the local artifacts of every posted interval (and the checkpoint the next one
        starts from) and regenerate the intervals with anything missing or corrupt; each
        regenerated interval must hash to the root posted on-chain. Returns the repaired intervals.
        Run at start-up: an auditor must never be served a damaged artifact of ours."""
        posted = self.next_interval()
        repaired = []
        for i in range(posted):
            damage = self._damage(i)
            if not damage:
                continue
            log.warning("job %d: interval %d: damaged in the local store (%s); regenerating it", self.job_id, i,
                        "; ".join(damage))
            first, n = self.ctx.interval_span(i)
            state = self._state_at(first - 1)
            self.store.put_checkpoint(self.job_id, i, checkpoint_bytes(self.ctx, state), replace=True)
            leaves = []
            for o in train_steps(self.ctx.job, state, first, first + n - 1, cheat=self.cheat, device=self.device):
                self.store.put_log(self.job_id, o.step, encode_step_log(o.log, o.step, self.ctx.job.graph),
                                   replace=True)
                rec = StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots))
                self.store.put_step(self.job_id, rec, replace=True)
                leaves.append(rec.leaf())
            if first + n - 1 < self.ctx.spec.steps:
                self.store.put_checkpoint(self.job_id, i + 1, checkpoint_bytes(self.ctx, o.state), replace=True)
            onchain = bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0])
            if interval_root(leaves) != onchain:
                raise CorruptArtifact(f"job {self.job_id}: interval {i} regenerated to a root other than the one "
                                      f"posted on-chain ({onchain.hex()}): wrong spec, cheat or machine?")
            repaired.append(i)
        return repaired

    def _damage(self, i: int) -> list[str]:
        """What is missing or corrupt among interval ``i``'s artifacts in the local store."""
        first, n = self.ctx.interval_span(i)
        checks: list[tuple[str, Callable[[], object]]] = [(f"checkpoint {i}", lambda: self._checkpoint(i))]
        if first + n - 1 < self.ctx.spec.steps:
            checks.append((f"checkpoint {i + 1}", lambda: self._checkpoint(i + 1)))
        for s in range(first, first + n):
            checks.append((f"step {s}", lambda s=s: self.store.get_step(self.job_id, s)))
            checks.append((f"log {s}", lambda s=s: decode_step_log(self.store.get_log(self.job_id, s), s,
                                                                   self.ctx.job.graph)))
        bad = []
        for name, check in checks:
            try:
                check()
            except (CorruptArtifact, MissingArtifact) as e:
                bad.append(f"{name}: {e}")
        return bad

    def finalize(self) -> None:
        self.proto.chain.send(
            self.proto.registry.functions.finalize(self.job_id), self.account, what=f"job {self.job_id}: finalize"
        )

    def withdraw(self) -> int:
        """Pull everything the registry owes this agent's account; returns the amount (wei)."""
        return self.player.withdraw()

    # -- games --------------------------------------------------------------------------------------
    def book(self) -> StepBook:
        b = StepBook(self.ctx)
        for s in range(1, self.next_interval_steps() + 1):
            b.records[s] = self.store.get_step(self.job_id, s)
        return b

    def next_interval_steps(self) -> int:
        i = self.next_interval()
        return min(i * self.ctx.spec.interval, self.ctx.spec.steps)

    def _regenerate(self, s: int) -> StepTrace:
        """Step ``s``'s trace, re-run from the interval checkpoint (deterministic on this machine)."""
        i = (s - 1) // self.ctx.spec.interval
        first, _ = self.ctx.interval_span(i)
        state = self._state_at(first - 1)
        if s > first:
            for o in train_steps(self.ctx.job, state, first, s - 1, cheat=self.cheat, device=self.device):
                state = o.state
        (o,) = list(train_steps(self.ctx.job, state, s, s, cheat=self.cheat, keep_trace=True, device=self.device))
        return StepTrace.of(s, self.ctx.job.graph, o.result)

    def answer_demands(self) -> int:
        """Answer every open data-availability demand on this job from the store (found by their
        events, so a restarted trainer answers what is still open). Returns answers sent."""
        if self.proto.availability is None:
            return 0
        from protocol.availability import AvailabilityResponder

        if self._responder is None:
            self._responder = AvailabilityResponder(self.proto, self.account, self.ctx, self.store, self.job_id)
        return self._responder.respond()

    def play(self) -> int:
        """One pass over this job's games (at most one move each) and its open demands. Returns moves sent."""
        strategy = TrainerStrategy(self.ctx, self.book(), self._trace)
        sent = self.answer_demands()

        def move(gid: int, v):
            try:
                return strategy.move(v)
            except VtrainError as e:  # e.g. a step this trainer cannot recompute (no finite value)
                log.warning("job %d game %d: no answer from this trainer's artifacts: %s", self.job_id, gid, e)
                return None

        for gid in self.player.games_of(self.job_id):
            sent += self.player.step(gid, move)
        return sent
