"""The trainer agent: trains with controlled numerics, posts one root per interval, publishes the
artifacts, and defends its commitments in every game. Restart-safe: progress is read back from
the chain (next interval) and the artifact store (records, logs, checkpoints).

Pre-training (``TrainerAgent.pretrain``, on by default): the stake is at risk from acceptance on,
and a job whose training reaches a value with no finite FP32 value can never be finished (no
honest trainer can post that step; the client reclaims payment + bounty once it is overdue). So
the agent trains every interval into its store *before* it accepts, refuses a job that diverges
(naming the step and op), and once accepted posts each interval from its store
(docs/security.md, "a job that cannot be finished")."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch

from protocol.agent import Player, checkpoint_bytes, checkpoint_state, job_first_block
from protocol.chain import Reverted
from protocol.deploy import Protocol
from protocol.game import (
    PARTY_TRAINER,
    PHASE_CHUNK_CHECK,
    PHASE_ELEMENT,
    PHASE_ONE_STEP,
    PHASE_PARTIALS_RULE,
    PHASE_TRACE,
    PHASE_TRACE_COMMIT,
    STATUS_IN_PROGRESS,
    StepBook,
    TrainerStrategy,
)
from protocol.jobs import JobContext, Terms
from protocol.policy import JobRefused, TermsPolicy
from protocol.rulability import UnrulableJob, check_rulable
from protocol.store import ArtifactStore, StepRecord, load_checkpoint, save_checkpoint
from vtrain.commit.merkle import MerkleTree
from vtrain.commit.roots import interval_root, step_log_root, tensor_root, tensor_tree
from vtrain.commit.trace import StepTrace, TraceRoots
from vtrain.errors import CorruptArtifact, MissingArtifact, NonFiniteValue, VtrainError
from vtrain.graph.executor import StepLog, state_tensors
from vtrain.graph.step_graph import OpKind
from vtrain.numerics.logfile import decode_step_log, encode_step_log
from vtrain.training.loop import Cheat, component_roots, train_steps

log = logging.getLogger(__name__)

#: Blocks searched again for new games on each pass (a game in a reorganised block is found again).
REORG_DEPTH = 16

JOB_STATUS = ["none", "open", "active", "cancelled", "finalized", "fraudulent"]

#: Local work files (never served) of pre-training: one marker per interval trained and stored
#: before acceptance, and the record of a divergence (the step with no finite value).
_PRETRAINED, _DIVERGED = "local/pretrain", "local/diverged"


class JobDiverges(NonFiniteValue):
    """Training this job reaches a value with no finite FP32 value (at ``step``, op ``op`` of kind
    ``kind`` when known): no honest trainer can post that step, so the job can never be finished.
    ``detail`` is the executor's message."""

    def __init__(self, job: int, step: int, op: int | None, kind: str | None, detail: str) -> None:
        self.job, self.step, self.op, self.kind, self.detail = job, step, op, kind, detail
        super().__init__(f"{self.site}: no finite value ({detail})", op=op)

    @property
    def site(self) -> str:
        """``step s, op o (KIND)`` (``step s`` when the op is not known)."""
        return f"step {self.step}" + (f", op {self.op} ({self.kind})" if self.op is not None else "")

    def refusal(self) -> str:
        return f"{self.site}: no finite value; not accepting job {self.job}"


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
    pretrain: bool = True
    """Train every interval into the store before staking (``accept`` does, and refuses a job that
    diverges); ``run_interval`` then posts from the store. False: stake first, train interval by
    interval after (a diverging job then costs the stake)."""
    player: Player = field(init=False)
    _responder: Any = field(default=None, init=False, repr=False)
    disputes: DisputedSteps = field(init=False, repr=False)
    """What its games need of their disputed steps, regenerated once and kept on disk (bounded)."""
    _games: set[int] = field(default_factory=set, init=False, repr=False)
    _games_searched: int = field(default=-1, init=False, repr=False)  # the last block searched for games
    _verified: dict[int, tuple[tuple, bytes]] = field(default_factory=dict, init=False, repr=False)
    """Interval -> (the store's fingerprint of its files, root) of the pre-trained intervals checked
    by :meth:`pretrained_root`: checked again only once a file changed."""

    def __post_init__(self) -> None:
        if self.nproc > 1 and self.cheat is not None:
            raise ValueError("a cheating trainer runs in one process (nproc 1)")
        # The client's spec (its model source, checkpoint) is the job's before any of it runs.
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))
        self.player = Player(self.proto, self.account, PARTY_TRAINER)
        self.disputes = DisputedSteps(self)

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
        reasons += self.policy.refusals(tuple(j[0]), int(j[2]), self.ctx.job.graph, self.ctx.spec.interval)
        if JOB_STATUS[int(j[3])] == "open":  # its offer must outlast what is left to train before accepting
            late = self.policy.pretrain_refusal(self.job_id, self.steps_left(), self.ctx.spec.interval,
                                                self.proto.chain.now(), self.accept_deadline())
            if late:
                reasons.append(late)
        return reasons

    def accept_deadline(self) -> int:
        """Last second an ``acceptJob`` can be mined (createdAt + acceptPeriod); the client cannot
        cancel before it."""
        return int(self.proto.chain.call(self.proto.registry.functions.acceptDeadline(self.job_id)))

    def steps_left(self) -> int:
        """Steps still to train before accepting: all those of the intervals not pre-trained and
        intact in the store (0 without ``pretrain``: it accepts first)."""
        if not self.pretrain:
            return 0
        return sum(self.ctx.interval_span(i)[1] for i in range(self.ctx.n_intervals) if self.pretrained_root(i) is None)

    def accept(self, terms: Terms | None = None, on_step: Callable[[int, float], None] | None = None,
               stop: Callable[[], bool] | None = None) -> bool:
        """Stake and accept the job, unless ``refusals`` gives a reason: then JobRefused (logged),
        and nothing is sent. The stake sent is the job's (``terms``, if given, must agree).

        With ``pretrain`` (the default) every interval is first trained into the store
        (:meth:`pretrain_job`, resumed where a previous run stopped): a job whose training reaches
        a value with no finite value is refused by name ("step s, op o (KIND): no finite value; not
        accepting job N") and never accepted. Returns False, with nothing sent, when ``stop()``
        ended the pre-training or the job is no longer open (the client cancelled it meanwhile).

        The job's accept deadline must leave time to pre-train what is left (``refusals``:
        ``TermsPolicy.pretrain_refusal``), checked before training and again before sending. A job
        this trainer already accepted (a restart, also one whose ``acceptJob`` was still pending:
        its own transactions are waited for first) is not accepted again: True, nothing sent."""
        status = self._settled_status()
        if status == "active":  # only the named trainer can have staked: us, before a restart
            log.info("job %d: already accepted; not sending acceptJob again", self.job_id)
            return True
        if status != "open":
            log.warning("job %d: %s; not accepting it", self.job_id, status)
            return False
        reasons = self.refusals()
        if reasons:
            log.warning("job %d: refused: %s", self.job_id, "; ".join(reasons))
            raise JobRefused(f"job {self.job_id} refused: " + "; ".join(reasons))
        stake = int(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))[11])
        if terms is not None and terms.trainer_stake != stake:
            raise JobRefused(f"job {self.job_id} refused: it asks a stake of {stake} wei, "
                             f"not the {terms.trainer_stake} wei expected")
        if self.pretrain:
            try:
                ready = self.pretrain_job(on_step, stop)
            except JobDiverges as e:
                log.warning("job %d: refused: %s", self.job_id, e.refusal())
                raise JobRefused(e.refusal()) from e
            if not ready:
                return False
            if self.status() != "open":
                log.warning("job %d: %s while pre-training; not accepting it", self.job_id, self.status())
                return False
        late = self.policy.pretrain_refusal(self.job_id, 0, self.ctx.spec.interval, self.proto.chain.now(),
                                            self.accept_deadline())
        if late:  # the pre-training outlasted the offer: acceptJob would revert (AcceptDeadlinePassed)
            log.warning("job %d: refused: %s", self.job_id, late)
            raise JobRefused(f"job {self.job_id} refused: {late}")
        self.proto.chain.send(
            self.proto.registry.functions.acceptJob(self.job_id),
            self.account,
            value=stake,
            what=f"job {self.job_id}: acceptJob",
        )
        return True

    def _settled_status(self) -> str:
        """The job's status once this account's own pending transactions are mined (an
        ``acceptJob`` sent before a restart may still be pending, the job reading open)."""
        if not self.proto.chain.wait_pending(self.account):
            log.warning("job %d: transactions of %s still pending; reading the job's status anyway",
                        self.job_id, self.account)
        return self.status()

    # -- pre-training --------------------------------------------------------------------------------
    @cached_property
    def _identity(self) -> dict[str, Any]:
        """What a local record of this job's training is valid for: this chain, registry, job and
        spec (and a cheat, for the tests' dishonest trainers). A store folder reused for another
        job of the same number holds records that do not match, and they are not used."""
        return {"chain_id": int(self.proto.chain.w3.eth.chain_id), "registry": str(self.proto.registry.address),
                "job": self.job_id, "spec_hash": self.ctx.spec_hash.hex(),
                "cheat": type(self.cheat).__name__ if self.cheat is not None else None}

    def _read_local_json(self, rel: str) -> dict | None:
        try:
            obj = json.loads(self.store.get_local(self.job_id, rel))
        except (MissingArtifact, ValueError, UnicodeDecodeError):
            return None
        return obj if isinstance(obj, dict) and obj.get("identity") == self._identity else None

    def divergence(self) -> JobDiverges | None:
        """The divergence this trainer recorded for the job (a step with no finite value), if any:
        training it again would stop at the same step (training is deterministic)."""
        d = self._read_local_json(_DIVERGED)
        if d is None:
            return None
        try:
            op = d["op"] if d["op"] is None else int(d["op"])
            return JobDiverges(self.job_id, int(d["step"]), op, d["kind"], str(d["detail"]))
        except (KeyError, TypeError, ValueError):
            return None

    def pretrained_root(self, i: int) -> bytes | None:
        """The root of interval ``i`` if it was trained before acceptance and its artifacts are
        intact in the store: marker of this job, every record, log and checkpoint readable, the
        checkpoints at both ends the states of the records around them, and the records hashing
        to the marker's root. None otherwise (it is then trained again).

        Checked once: the root is kept with the store's fingerprint of the interval's files (their
        index bytes, their blobs' size, mtime and inode; ``ArtifactStore.fingerprint``) and
        returned as long as that is unchanged, so a posting pass does not re-read and re-hash what
        ``pretrain_job`` checked. The fingerprint is taken before the check, so a file changed
        during it is checked again next time."""
        key = self._fingerprint(i)
        hit = self._verified.get(i)
        if key is not None and hit is not None and hit[0] == key:
            return hit[1]
        self._verified.pop(i, None)
        root = self._check_pretrained(i)
        if root is not None and key is not None:
            self._verified[i] = (key, root)
        return root

    def _fingerprint(self, i: int) -> tuple | None:
        fingerprint = getattr(self.store, "fingerprint", None)
        if fingerprint is None:
            return None
        first, n = self.ctx.interval_span(i)
        rels = [f"{_PRETRAINED}/{i}", f"checkpoints/{i}.json"]
        rels += [f"steps/{s}.json" for s in range(max(first - 1, 1), first + n)]
        rels += [f"logs/{s}.json" for s in range(first, first + n)]
        if first + n - 1 < self.ctx.spec.steps:
            rels.append(f"checkpoints/{i + 1}.json")
        return fingerprint(self.job_id, rels)

    def _check_pretrained(self, i: int) -> bytes | None:
        d = self._read_local_json(f"{_PRETRAINED}/{i}")
        if d is None or d.get("interval") != i or self._damage(i):
            return None
        first, n = self.ctx.interval_span(i)
        try:
            recs = [self.store.get_step(self.job_id, s) for s in range(first, first + n)]
            before = self.ctx.initial[0] if i == 0 else self.store.get_step(self.job_id, first - 1).components
            ends = [(i, tuple(before))]
            if first + n - 1 < self.ctx.spec.steps:
                ends.append((i + 1, recs[-1].components))
            for k, want in ends:
                if tuple(component_roots(self._checkpoint(k))) != tuple(want):
                    return None
        except (MissingArtifact, CorruptArtifact):
            return None
        root = interval_root([r.leaf() for r in recs])
        return root if d.get("root") == root.hex() else None

    def pretrain_job(self, on_step: Callable[[int, float], None] | None = None,
                     stop: Callable[[], bool] | None = None) -> bool:
        """Train every interval of the job into the store, as :meth:`run_interval` would after
        acceptance, without posting: the intervals already trained and intact are kept (a restart
        resumes, it does not redo), each finished one gets a marker. ``stop()`` is asked before
        each step: True ends it (returns False; what was trained is kept). Returns True when the
        whole job is trained. Raises :class:`JobDiverges` (also recorded: asked again, it raises at
        once) when a step has no finite value."""
        recorded = self.divergence()
        if recorded is not None:
            raise recorded
        for i in range(self.ctx.n_intervals):
            if self.pretrained_root(i) is not None:
                continue
            root = self._train_interval(i, on_step, stop, replace=True)
            if root is None:
                return False
            self.store.put_local(self.job_id, f"{_PRETRAINED}/{i}", json.dumps(
                {"identity": self._identity, "interval": i, "root": root.hex()}).encode())
            log.info("job %d: interval %d trained before acceptance (root %s)", self.job_id, i, root.hex()[:16])
        return True

    def _train_interval(self, i: int, on_step: Callable[[int, float], None] | None = None,
                        stop: Callable[[], bool] | None = None, replace: bool = False) -> bytes | None:
        """Train interval ``i`` into the store (its checkpoint, each step's log and record, the
        next interval's checkpoint) and return its root; None when ``stop()`` said to stop first.
        A step with no finite value: :class:`JobDiverges`, recorded in the store."""
        first, n = self.ctx.interval_span(i)
        state = self._state_at(first - 1)
        self.store.put_checkpoint(self.job_id, i, checkpoint_bytes(self.ctx, state), replace=replace)
        leaves: list[bytes] = []
        steps = self._train(state, first, first + n - 1)
        try:
            for s in range(first, first + n):
                if stop is not None and stop():
                    log.info("job %d: stopped before step %d", self.job_id, s)
                    return None
                try:
                    o = next(steps)
                except NonFiniteValue as e:  # (only the step's own computation: not on_step's)
                    raise self._diverged(s, e) from e
                self.store.put_log(self.job_id, o.step, encode_step_log(o.log, o.step, self.ctx.job.graph),
                                   replace=replace)
                rec = StepRecord(o.step, o.state_root, o.log_root, tuple(o.component_roots))
                self.store.put_step(self.job_id, rec, replace=replace)
                leaves.append(rec.leaf())
                if on_step:
                    on_step(o.step, o.loss)
        finally:
            close = getattr(steps, "close", None)
            if close is not None:
                close()
        if first + n - 1 < self.ctx.spec.steps:
            self.store.put_checkpoint(self.job_id, i + 1, checkpoint_bytes(self.ctx, o.state), replace=replace)
        return interval_root(leaves)

    def _diverged(self, step: int, e: NonFiniteValue) -> JobDiverges:
        op = e.op if isinstance(e.op, int) and 0 <= e.op < self.ctx.job.graph.n_ops else None
        kind = self.ctx.job.graph.ops[op].kind.name if op is not None else None
        d = JobDiverges(self.job_id, step, op, kind, str(e))
        self.store.put_local(self.job_id, _DIVERGED, json.dumps(
            {"identity": self._identity, "step": step, "op": op, "kind": kind, "detail": str(e)}).encode())
        log.error("job %d: %s: this job can never be finished", self.job_id, d)
        return d

    def next_interval(self) -> int:
        return int(self.proto.chain.call(self.proto.registry.functions.getJob(self.job_id))[4])

    def status(self) -> str:
        return JOB_STATUS[int(self.proto.chain.call(self.proto.registry.functions.jobStatus(self.job_id)))]

    def run_interval(self, on_step: Callable[[int, float], None] | None = None) -> int | None:
        """Post the next unposted interval: from the store when it was trained before acceptance
        (:meth:`pretrained_root`), else train it first and publish its artifacts. None when done.
        A step with no finite value: :class:`JobDiverges` (recorded: a later call raises it at once,
        without training again)."""
        i = self.next_interval()
        if i >= self.ctx.n_intervals:
            return None
        root = self.pretrained_root(i)
        if root is None:
            recorded = self.divergence()
            if recorded is not None:
                raise recorded
            root = self._train_interval(i, on_step)
            assert root is not None
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

    def book_components(self, s: int) -> tuple[bytes, ...]:
        """The state components this trainer committed after step ``s`` (0: the initial state)."""
        return tuple(self.ctx.initial[0]) if s == 0 else self.store.get_step(self.job_id, s).components

    def _steps(self, state: list[torch.Tensor], first: int, last: int, keep_trace: bool = False):
        """Re-run steps ``first..last`` from ``state`` as this trainer trained them (one process)."""
        return train_steps(self.ctx.job, state, first, last, cheat=self.cheat, keep_trace=keep_trace,
                           device=self.device)

    def games(self) -> list[int]:
        """This job's games. The first call searches the GameCreated events from the job's block;
        later ones only the blocks mined since (from ``REORG_DEPTH`` blocks back): a pass over many
        games does not search the whole chain again."""
        head = int(self.proto.chain.w3.eth.block_number)
        first = job_first_block(self.proto, self.job_id)
        start = first if self._games_searched < 0 else max(first, self._games_searched - REORG_DEPTH)
        logs = self.proto.game.events.GameCreated.get_logs(from_block=start, to_block=head,
                                                           argument_filters={"job": self.job_id})
        self._games.update(int(e["args"]["game"]) for e in logs)
        self._games_searched = head
        return sorted(self._games)

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
        strategy = TrainerStrategy(self.ctx, self.book(), self.disputes.trace)
        sent = self.answer_demands()
        games = self.games()
        try:  # every game's needs at once: one pass over each interval, not one per game
            self.disputes.prepare(_needs(self.ctx, [self.player.view(g) for g in games]))
        except VtrainError as e:
            log.warning("job %d: could not regenerate the disputed steps: %s", self.job_id, e)

        def move(gid: int, v):
            try:
                return strategy.move(v)
            except VtrainError as e:  # e.g. a step this trainer cannot recompute (no finite value)
                log.warning("job %d game %d: no answer from this trainer's artifacts: %s", self.job_id, gid, e)
                return None

        for gid in games:
            sent += self.player.step(gid, move)
        return sent


def _needs(ctx: JobContext, views: list) -> dict[int, tuple[int, ...]]:
    """step -> the ops whose values the trainer's next moves in these games read (the summary
    of every step disputed past the step level; an op's output and inputs from the element phase)."""
    out: dict[int, set[int]] = {}
    late = (PHASE_ELEMENT, PHASE_ONE_STEP, PHASE_CHUNK_CHECK, PHASE_PARTIALS_RULE)
    for v in views:
        if v.status != STATUS_IN_PROGRESS or v.to_move != PARTY_TRAINER or v.phase not in (
                PHASE_TRACE_COMMIT, PHASE_TRACE, *late):
            continue
        ops = out.setdefault(v.step, set())
        if v.phase in late:
            ops.update((v.op, *ctx.job.graph.ops[v.op].inputs))
    return {s: tuple(sorted(ops)) for s, ops in out.items()}


# -- what the trainer's game moves need of a disputed step ------------------------------------------
# A game asks for a step's op-root tree (trace phase) and, at its end, one op's output and its
# inputs' values (element phase, one-step / chunk level). A step's full trace holds every op output
# (big for big models) and costs up to K steps to regenerate from the interval checkpoint, so the
# trainer keeps only these small parts, on disk under <job>/local/ (never served): per disputed step
# its op and log roots ("summary"), the state before it (so a later regeneration is one step), and
# the op values a game asked for. Each file is a content-digested safetensors (a partial file fails
# its digest) and is checked against the trainer's committed step records before use.

_SUMMARIES, _STATES, _OPS = "local/disputes/summaries", "local/disputes/states", "local/disputes/ops"


@dataclass(frozen=True)
class StepSummary:
    """The op-root and log-root lists of one step: what the trace phase reads (a few KB)."""

    step: int
    op_roots: tuple[bytes, ...]
    log_roots: tuple[bytes, ...]


class StoredTrace(TraceRoots):
    """A disputed step as :class:`~protocol.game.TrainerStrategy` reads it (the attributes of a
    :class:`StepTrace` that the trainer's moves use): roots in memory, op values read from disk
    on demand (``outputs[j]``, regenerated once per game if not stored)."""

    def __init__(self, summary: StepSummary, graph: Any, values: Callable[[int, int], np.ndarray],
                 step_log: Callable[[int], StepLog]) -> None:
        self.step = summary.step
        self.graph = graph
        self.op_roots = list(summary.op_roots)
        self.log_roots = list(summary.log_roots)
        self._values = values
        self._step_log = step_log
        self.outputs = _OpValues(lambda j: values(self.step, j))

    @cached_property
    def log(self) -> StepLog:
        return self._step_log(self.step)

    def tensor_tree(self, op: int) -> MerkleTree:
        return tensor_tree(self.outputs[op])

    def inputs_of(self, op: int) -> list[np.ndarray]:
        return [self.outputs[i].reshape(self.graph.ops[i].shape) for i in self.graph.ops[op].inputs]

    def output(self, op: int) -> np.ndarray:
        return self.outputs[op].reshape(self.graph.ops[op].shape)


@dataclass(frozen=True)
class _OpValues:
    get: Callable[[int], np.ndarray]

    def __getitem__(self, op: int) -> np.ndarray:
        return self.get(op)


@dataclass
class DisputedSteps:
    """The trainer's regenerations for its games, bounded per game whatever the number of games
    and the interval length K: a step's summary comes from one pass over its interval (shared by
    every step disputed in it when asked together, :meth:`prepare`), an op's values from one step
    re-run from the state stored before it. At most ``max_states`` states are kept (the least
    recently written are dropped: a step whose state was dropped starts from the nearest state
    kept before it, or the checkpoint)."""

    agent: TrainerAgent
    max_states: int = 16
    steps_run: int = 0
    """Training steps computed for games (a spy for tests and benchmarks)."""
    _fresh: dict[int, StepSummary] = field(default_factory=dict, repr=False)

    @property
    def _graph(self):
        return self.agent.ctx.job.graph

    # -- reading what is stored, checked ------------------------------------------------------------
    def summary(self, s: int) -> StepSummary:
        got = self._load_summary(s)
        if got is None:
            self.prepare({s: ()})
            got = self._load_summary(s)
        if got is None:  # its own records disagree with its regeneration (a cheating trainer)
            got = self._fresh.pop(s)
        return got

    def trace(self, s: int) -> StoredTrace:
        return StoredTrace(self.summary(s), self._graph, self.values, self._step_log)

    def values(self, s: int, op: int) -> np.ndarray:
        """Op ``op``'s output values at step ``s`` (flat FP32); with it, its inputs' are stored."""
        summ = self.summary(s)
        got = self._load_values(s, op, summ)
        if got is None:
            self.prepare({s: (op, *self._graph.ops[op].inputs)})
            got = self._load_values(s, op, summ)
        if got is None:
            raise CorruptArtifact(f"job {self.agent.job_id}: step {s} op {op}: the regenerated output does not "
                                  "hash to this trainer's op root")
        return got

    def _read(self, rel: str) -> dict[str, np.ndarray] | None:
        try:
            return load_checkpoint(self.agent.store.get_local(self.agent.job_id, rel))
        except (MissingArtifact, CorruptArtifact):
            return None

    def _load_summary(self, s: int) -> StepSummary | None:
        d = self._read(f"{_SUMMARIES}/{s}")
        n = self._graph.n_ops
        if d is None or set(d) != {"op_roots", "log_roots"} or any(
                a.dtype != np.uint8 or a.shape != (n, 32) for a in d.values()):
            return None
        summ = StepSummary(s, tuple(bytes(r) for r in d["op_roots"]), tuple(bytes(r) for r in d["log_roots"]))
        return summ if self._bound(summ) else None

    def _bound(self, summ: StepSummary) -> bool:
        """The summary agrees with this trainer's step records: its INPUT / OUTPUT op roots are the
        state components before / after the step, its log roots the step's log root."""
        try:
            before = self.agent.book_components(summ.step - 1)
            rec = self.agent.store.get_step(self.agent.job_id, summ.step)
        except (MissingArtifact, CorruptArtifact):
            return False
        for op in self._graph.ops:
            want = before if op.kind == OpKind.INPUT else rec.components if op.kind == OpKind.OUTPUT else None
            if want is not None and summ.op_roots[op.id] != want[op.attrs[0]]:
                return False
        return rec.log_root in (b"\x00" * 32, step_log_root(summ.log_roots))

    def _load_values(self, s: int, op: int, summ: StepSummary) -> np.ndarray | None:
        d = self._read(f"{_OPS}/{s}-{op}")
        numel = self._graph.ops[op].numel
        if d is None or set(d) != {"value"} or d["value"].dtype != np.float32 or d["value"].shape != (numel,):
            return None
        return d["value"] if tensor_root(d["value"]) == summ.op_roots[op] else None

    def _load_state(self, s: int) -> list[torch.Tensor] | None:
        """The stored state before step ``s``, if it is the one this trainer's records commit."""
        try:
            data = self.agent.store.get_local(self.agent.job_id, f"{_STATES}/{s}")
            state = checkpoint_state(self.agent.ctx, data, f"state before step {s}")
            ok = component_roots(state) == list(self.agent.book_components(s - 1))
        except (MissingArtifact, CorruptArtifact, ValueError, TypeError):
            return None
        return state if ok else None

    def _step_log(self, s: int) -> StepLog:
        return decode_step_log(self.agent.store.get_log(self.agent.job_id, s), s, self._graph)

    # -- regenerating -------------------------------------------------------------------------------
    def prepare(self, wanted: dict[int, tuple[int, ...]]) -> None:
        """Store the summary of every step in ``wanted`` lacking one and the values of the ops
        listed for it, re-running each interval once in step order from the nearest state kept."""
        todo: dict[int, tuple[int, ...]] = {}
        for s, ops in wanted.items():
            summ = self._load_summary(s)
            need = tuple(j for j in ops if summ is None or self._load_values(s, j, summ) is None)
            if summ is None or need:
                todo[s] = need
        K = self.agent.ctx.spec.interval
        running: tuple[int, list[torch.Tensor]] | None = None  # (next step, the state before it)
        for s in sorted(todo):
            first, _ = self.agent.ctx.interval_span((s - 1) // K)
            if running is not None and not first <= running[0] <= s:
                running = None
            stored = self._nearest_state(running[0] + 1 if running else first, s)
            if stored is not None:
                running = stored
            elif running is None:
                running = (first, self.agent._state_at(first - 1))
            at, state = running
            if at < s:
                for o in self.agent._steps(state, at, s - 1):
                    state = o.state
                self.steps_run += s - at
            if stored is None or stored[0] != s:
                self._save_state(s, state)
            (o,) = list(self.agent._steps(state, s, s, keep_trace=True))
            self.steps_run += 1
            t = StepTrace.of(s, self._graph, o.result)
            self._save(s, t, todo[s])
            running = (s + 1, o.state)
            del t, o

    def _nearest_state(self, lo: int, s: int) -> tuple[int, list[torch.Tensor]] | None:
        """The latest readable stored state before a step in ``lo..s``."""
        have = sorted((int(n) for n, _ in self.agent.store.local_names(self.agent.job_id, _STATES)
                       if n.isdigit() and lo <= int(n) <= s), reverse=True)
        for p in have:
            state = self._load_state(p)
            if state is not None:
                return p, state
        return None

    def _save_state(self, s: int, state: list[torch.Tensor]) -> None:
        store, job = self.agent.store, self.agent.job_id
        store.put_local(job, f"{_STATES}/{s}", checkpoint_bytes(self.agent.ctx, state))
        kept = sorted(store.local_names(job, _STATES), key=lambda e: e[1])
        for name, _ in kept[: max(0, len(kept) - self.max_states)]:
            if name != str(s):
                store.remove_local(job, f"{_STATES}/{name}")

    def _save(self, s: int, t: StepTrace, ops: tuple[int, ...]) -> None:
        store, job = self.agent.store, self.agent.job_id
        roots = {"op_roots": np.frombuffer(b"".join(t.op_roots), np.uint8).reshape(-1, 32),
                 "log_roots": np.frombuffer(b"".join(t.log_roots), np.uint8).reshape(-1, 32)}
        store.put_local(job, f"{_SUMMARIES}/{s}", save_checkpoint(roots))
        summ = StepSummary(s, tuple(t.op_roots), tuple(t.log_roots))
        if not self._bound(summ):
            log.warning("job %d: step %d regenerated to roots other than this trainer's records", job, s)
            self._fresh[s] = summ
        for j in ops:
            store.put_local(job, f"{_OPS}/{s}-{j}", save_checkpoint({"value": np.ascontiguousarray(t.outputs[j])}))
