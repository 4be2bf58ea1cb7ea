"""The auditor agent: replays every posted interval with the trainer's logs on its own hardware,
settles any element the rounding rule alone cannot with exact arithmetic (the same rule the
contract applies), and challenges the first interval whose root differs from its own."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from web3.logs import DISCARD

from protocol.agent import Player, checkpoint_bytes, checkpoint_state, job_first_block
from protocol.deploy import Protocol
from protocol.game import PARTY_CHALLENGER, ChallengerStrategy, StepBook
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactReader, ArtifactStore, ArtifactUnavailable, StepRecord
from vtrain.commit.roots import LogEntry, interval_root, state_root
from vtrain.commit.trace import StepTrace
from vtrain.errors import CorruptArtifact, MissingArtifact, VtrainError
from vtrain.graph.executor import state_tensors
from vtrain.graph.step_graph import OpNode
from vtrain.numerics.exact import Partial
from vtrain.numerics.logfile import decode_step_log
from vtrain.training.loop import component_roots, replay_steps, step_log_root_of
from vtrain.training.rundir import atomic_write

log = logging.getLogger(__name__)


def exact_resolver(ctx: JobContext, overruled: list[tuple[int, int]] | None = None):
    """Resolver factory for :func:`vtrain.numerics.rounding.apply_log`: keep the trainer's value where the
    contract would uphold it, else take the exact rounding (``vtrain.numerics.exact``; EXP LOG TANH: the
    value at 400 bits, mpmath, whose RN32 is the correctly rounded result). Every overruled element
    (op, index) is appended to ``overruled``."""
    from vtrain.numerics.exact import UnsupportedOp, exact_value, judge_element, rn32

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
    withheld: dict[int, str] = field(default_factory=dict)
    """Intervals that could not be replayed because the trainer's artifacts (step records, logs,
    checkpoints) are missing or unreachable: interval -> why. Retried on every :meth:`audit`; the
    job is not signed off while any is left (see :meth:`signed_off`)."""
    flagged: list[int] = field(default_factory=list)
    """Intervals the replay found wrong (returned by :meth:`audit`)."""
    _states: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    _committed: dict[int, dict[int, StepRecord]] = field(default_factory=dict)
    state: ArtifactStore | None = None
    """Where the auditor keeps its own replay results (records, the state at each interval's end,
    progress): a restarted auditor resumes from them instead of replaying the whole job again."""
    _pending_bad: int | None = None
    onchain: Any = None
    """A :class:`protocol.availability.OnChainArtifacts`: step records and logs the reader cannot
    serve are demanded on-chain and read back, verified, from the published events."""

    def __post_init__(self) -> None:
        if self.onchain is not None:
            from protocol.availability import FallbackReader

            self.reader = FallbackReader(self.reader, self.onchain)
        self.book = StepBook(self.ctx)
        self.player = Player(self.proto, self.account, PARTY_CHALLENGER)
        self._states[0] = state_tensors(self.ctx.job.initial_state)
        self._trace = lru_cache(maxsize=4)(self._regenerate)
        self.ctx.check_onchain(tuple(self.proto.chain.call(self.proto.registry.functions.jobParams(self.job_id))))
        if self.state is not None:
            self._restore()

    # -- its own progress, on disk ------------------------------------------------------------------
    def _progress_path(self) -> Path:
        assert self.state is not None
        return Path(self.state.root) / str(self.job_id) / "audit.json"

    def _save(self, roots: list[bytes], bad: int | None) -> None:
        """Persist the interval just replayed (its records and end state, then the progress file:
        a crash in between leaves the old progress, which is still true)."""
        if self.state is None:
            return
        i = self.verified - 1
        first, n = self.ctx.interval_span(i)
        if i not in self.skipped:
            for s in range(first, first + n):
                self.state.put_step(self.job_id, self.book.records[s], replace=True)
            self.state.put_checkpoint(
                self.job_id, i + 1, checkpoint_bytes(self.ctx, self._states[first + n - 1]), replace=True
            )
        old = self._read_progress() or {}
        progress = {
            "job": self.job_id,
            "verified": self.verified,
            "roots": [r.hex() for r in roots[: self.verified]],
            "skipped": self.skipped,
            "bad": old.get("bad") if old.get("bad") is not None else bad,
            "overruled": {str(k): v for k, v in self.overruled_steps.items()},
        }
        atomic_write(self._progress_path(), json.dumps(progress, sort_keys=True).encode())

    def _read_progress(self) -> dict | None:
        p = self._progress_path()
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            log.warning("job %d: ignoring unreadable progress file %s (%s)", self.job_id, p, e)
            return None
        return d if isinstance(d, dict) else None

    def _restore(self) -> None:
        """Resume from the saved progress; anything missing, corrupt or not matching the chain
        means a full replay (never a verdict taken from a damaged file)."""
        d = self._read_progress()
        if not d:
            return
        try:
            verified = int(d["verified"])
            roots = self.posted()
            if (
                d.get("job") != self.job_id
                or verified > len(roots)
                or [bytes.fromhex(r) for r in d["roots"]] != roots[:verified]
            ):
                raise ValueError("does not match the roots posted on-chain")
            skipped = [int(i) for i in d.get("skipped", [])]
            records: dict[int, StepRecord] = {}
            states: dict[int, list[torch.Tensor]] = {}
            for i in range(verified):
                if i in skipped:
                    continue
                first, n = self.ctx.interval_span(i)
                for s in range(first, first + n):
                    records[s] = self.state.get_step(self.job_id, s)  # type: ignore[union-attr]
                end = self.state.get_checkpoint(self.job_id, i + 1)  # type: ignore[union-attr]
                states[first + n - 1] = checkpoint_state(self.ctx, end, f"saved state after interval {i}")
                if state_root(component_roots(states[first + n - 1])) != records[first + n - 1].state_root:
                    raise CorruptArtifact(f"saved state after interval {i} is not the state its record commits to")
            overruled = {int(k): [tuple(e) for e in v] for k, v in d.get("overruled", {}).items()}
            bad = d.get("bad")
        except (KeyError, TypeError, ValueError, VtrainError) as e:
            log.warning(
                "job %d: not resuming from %s (%s); replaying from the start", self.job_id, self._progress_path(), e
            )
            return
        self.book.records.update(records)
        self._states.update(states)
        self.verified, self.skipped = verified, skipped
        self.overruled_steps.update(overruled)  # type: ignore[arg-type]
        self._pending_bad = int(bad) if bad is not None else None
        log.info(
            "job %d: resumed the audit after interval %d from %s", self.job_id, verified - 1, self._progress_path()
        )

    def _logs(self, s: int):
        """Step ``s``'s rounding log as the trainer committed to it. A log that does not decode, or
        whose root is not the log root of the trainer's step record (itself checked against the
        posted interval root), is corrupt: CorruptArtifact, and it is fetched again next time."""
        graph = self.ctx.job.graph
        data = self.reader.get_log(self.job_id, s)
        what = f"rounding log of step {s} (sha256 {hashlib.sha256(data).hexdigest()}, {len(data)} bytes)"
        try:
            lg = decode_step_log(data, s, graph)
        except CorruptArtifact as e:
            self._forget("log", s)
            raise CorruptArtifact(f"{what}: {e}") from None
        rec = self._committed_record(s)
        if rec is not None and rec.log_root != bytes(32):
            got = step_log_root_of(lg, graph)
            if got != rec.log_root:
                self._forget("log", s)
                raise CorruptArtifact(
                    f"{what}: its root {got.hex()} is not the log root {rec.log_root.hex()} "
                    f"the trainer committed for step {s}"
                )
        return lg

    def _forget(self, kind: str, key: int) -> None:
        forget = getattr(self.reader, "forget", None)
        if forget is not None:
            forget(kind, self.job_id, key)

    def _committed_record(self, s: int) -> StepRecord | None:
        """The trainer's record of step ``s`` if its interval's records hash to the posted root;
        None when they do not (the replay alone then decides)."""
        i = (s - 1) // self.ctx.spec.interval
        if i not in self._committed:
            first, n = self.ctx.interval_span(i)
            posted = bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0])
            recs = [self.reader.get_step(self.job_id, t) for t in range(first, first + n)]
            if interval_root([r.leaf() for r in recs]) != posted:
                log.warning(
                    "job %d: the trainer's step records of interval %d do not hash to its posted root", self.job_id, i
                )
                for t in range(first, first + n):
                    self._forget("step", t)
                return None
            self._committed[i] = {r.s: r for r in recs}
        return self._committed[i].get(s)

    def posted(self) -> list[bytes]:
        n = int(self.proto.chain.call(self.proto.registry.functions.getJob(self.job_id))[4])
        return [
            bytes(self.proto.chain.call(self.proto.registry.functions.getInterval(self.job_id, i))[0]) for i in range(n)
        ]

    def audit(self) -> int | None:
        """Replay every newly posted interval; return the first interval whose root differs."""
        if self._pending_bad is not None:  # found before a restart, maybe not challenged yet
            bad, self._pending_bad = self._pending_bad, None
            if bad not in self.flagged:
                self.flagged.append(bad)
            return bad
        roots = self.posted()
        while self.verified < len(roots):
            i = self.verified
            first, n = self.ctx.interval_span(i)
            if not self._sampled(i):
                self.skipped.append(i)
                self.verified += 1
                self._save(roots, None)
                continue
            state = self._states.get(first - 1)
            overruled: list[tuple[int, int]] = []
            try:
                if state is None:
                    state = self._trainer_checkpoint(i, roots)
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
            except (MissingArtifact, ArtifactUnavailable) as e:
                # Withheld (or unreachable) artifacts: nothing to replay, so nothing to sign off.
                self.withheld[i] = str(e)
                log.warning(
                    "job %d: interval %d cannot be replayed, the trainer's artifacts are unavailable (%s); "
                    "NOT signing off this job",
                    self.job_id,
                    i,
                    e,
                )
                return None
            self.withheld.pop(i, None)
            self._states[first + n - 1] = state
            mine = interval_root([self.book.records[s].leaf() for s in range(first, first + n)])
            self.verified += 1
            abused = any(first <= s < first + n for s in self.overruled_steps)
            self._save(roots, i if mine != roots[i] or abused else None)
            if mine != roots[i]:
                log.info(
                    "job %d: interval %d differs (posted %s, replayed %s)",
                    self.job_id,
                    i,
                    roots[i].hex()[:16],
                    mine.hex()[:16],
                )
                self.flagged.append(i)
                return i
            if abused:
                self.flagged.append(i)
                return i
        return None

    def signed_off(self) -> bool:
        """True only when every interval of the job was audited, none was found wrong and none
        is waiting for withheld artifacts."""
        return self.verified == self.ctx.n_intervals and not self.withheld and not self.flagged

    def _sampled(self, i: int) -> bool:
        if self.sample >= 1.0:
            return True
        digest = hashlib.sha256(f"{self.account}:{self.job_id}:{i}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.sample

    def _trainer_checkpoint(self, i: int, roots: list[bytes]) -> list[torch.Tensor]:
        """The trainer's state at the start of interval ``i``, accepted only if it is the state its
        posted interval ``i-1`` commits to."""
        first, _ = self.ctx.interval_span(i)
        data = self.reader.get_checkpoint(self.job_id, i)
        try:
            state = checkpoint_state(
                self.ctx, data, f"checkpoint of interval {i} (sha256 {hashlib.sha256(data).hexdigest()})"
            )
        except (CorruptArtifact, ValueError, TypeError) as e:
            self._forget("checkpoint", i)
            raise CorruptArtifact(str(e)) from None
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
        logs = self.proto.game.events.StepOpened.get_logs(
            from_block=job_first_block(self.proto, self.job_id), argument_filters={"game": gid}
        )
        return [bytes(c) for c in logs[-1]["args"]["components"]] if logs else None

    def _chunk(self, gid: int) -> bytes | None:
        logs = self.proto.game.events.ChunkOpened.get_logs(
            from_block=job_first_block(self.proto, self.job_id), argument_filters={"game": gid}
        )
        return bytes(logs[-1]["args"]["data"]) if logs else None

    def _partials(self, gid: int) -> list[Partial] | None:
        logs = self.proto.game.events.PartialsPosted.get_logs(
            from_block=job_first_block(self.proto, self.job_id), argument_filters={"game": gid}
        )
        return [Partial.of(p) for p in logs[-1]["args"]["partials"]] if logs else None

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
            partials_of=self._partials,
        )
        sent = 0
        for gid in self.disputed:
            sent += self.player.step(gid, strategy.move)
        return sent

    def withdraw(self) -> int:
        """Pull everything the registry owes this agent's account; returns the amount (wei)."""
        return self.player.withdraw()
