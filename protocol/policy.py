"""What an agent requires of a job's terms before it takes part (docs/security.md, "Terms and
economics"). The registry's floors stop terms nobody can answer within (a 1-second clock); an
agent also refuses terms shorter than *it* can safely answer within, with a margin:

- every agent: the chess clock must cover ``margin`` x the moves one side makes in a game of this
  job (``game_moves``) x the seconds one of its moves may take (computing it and getting it mined);
  a trainer that declares ``step_seconds`` (one training step of this job, measured or declared)
  also needs the clock to cover regenerating its disputed step: at most K steps once (from the
  interval checkpoint) and one more for the disputed op's values (``trainer_regen_steps``);
- the trainer: the posting period must cover ``margin`` x the seconds it needs to train and post
  one interval; it stakes at most ``max_stake_ratio`` x the payment, and wants a challenger bond
  of at least ``min_bond`` (a false challenge costs the trainer gas; the bond pays for it);
- the trainer, before it trains a job it has not accepted: the job's accept deadline
  (``createdAt + acceptPeriod``; the client cannot cancel before it, the trainer cannot accept
  after it) must leave ``margin`` x the steps still to pre-train x the seconds of one step
  (``step_seconds``, else ``interval_seconds / K``) (``pretrain_refusal``): otherwise the offer
  would expire while it trains, and the compute would be wasted;
- the auditor: the challenge window must cover ``margin`` x the seconds it needs to fetch and
  replay one interval and challenge it, and so must the posting period: interval i's window starts
  no earlier than one posting period after interval i-1's (so never before ``acceptedAt + i x
  postingPeriod``), however early or late it is posted (docs/protocol.md, "Challenge windows"), so
  an auditor that replays one interval within a posting period keeps up with a trainer that posts
  every interval at once, on time or overdue; one that needs longer
  falls behind by the difference every interval and runs out of window in a long job.

Refusals are values (``TermsPolicy.refusals``: one line each, naming the term, what the job gives
and what is needed); ``JobRefused`` carries them when an agent declines a job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from vtrain.commit.roots import n_chunks
from vtrain.errors import VtrainError
from vtrain.graph.step_graph import Graph

#: Indices in the on-chain JobParams tuple.
STAKE, BOND, WINDOW, CLOCK, POSTING, ACCEPT = 11, 12, 13, 14, 15, 16
#: Moves one side makes beyond the three bisections: openStep, commitTrace, openOp, openChunk,
#: oneStep or postPartials + settlePartials (the challenger: pickElement, disputeChunk; fewer).
FIXED_MOVES = 6


def trainer_regen_steps(interval_length: int) -> int:
    """Training steps an honest trainer computes for one game at most (``DisputedSteps``): the
    interval up to the disputed step once (the step's roots), then that step again from the state
    kept before it (the disputed op's values)."""
    return interval_length + 1


class JobRefused(VtrainError):
    """Raised when an agent declines a job (terms it cannot safely answer within, or a job the chain
    cannot rule on); the message gives every reason."""


def game_moves(graph: Graph, interval_length: int) -> int:
    """Most moves one side makes in a game of a job with this graph and interval length: a
    bisection of the interval (K step leaves), of the trace (nOps), of the largest op output
    (its 64-element chunks), and ``FIXED_MOVES`` more."""
    chunks = max((n_chunks(op.numel) for op in graph.ops), default=1)
    depth = sum(math.ceil(math.log2(max(n, 1))) for n in (interval_length, graph.n_ops, chunks))
    return depth + FIXED_MOVES


@dataclass(frozen=True)
class TermsPolicy:
    """What one agent needs of a job's terms (seconds, wei), before and with the margin."""

    role: Literal["trainer", "auditor"]
    move_seconds: float = 15.0
    """Seconds one of its game moves may take: computing it and getting it mined."""
    interval_seconds: float = 600.0
    """Trainer: seconds to train and post one interval."""
    replay_seconds: float = 600.0
    """Auditor: seconds to fetch and replay one interval and challenge it."""
    margin: float = 2.0
    """Terms must give at least this many times what the agent needs."""
    max_stake_ratio: float | None = 10.0
    """Trainer: most stake per wei of payment (None: any)."""
    min_bond: int = 0
    """Trainer: least challenger bond (wei)."""
    step_seconds: float | None = None
    """Trainer: seconds one training step of the job takes (measured or declared); when given, the
    clock must also cover the steps a game makes it regenerate (``trainer_regen_steps``)."""

    def __post_init__(self) -> None:
        if self.role not in ("trainer", "auditor"):
            raise ValueError(f"role: expected 'trainer' or 'auditor', got {self.role!r}")
        for name in ("move_seconds", "interval_seconds", "replay_seconds", "step_seconds"):
            if name == "step_seconds" and self.step_seconds is None:
                continue
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected seconds >= 0, got {getattr(self, name)}")
        if not self.margin >= 1:
            raise ValueError(f"margin: expected a factor >= 1, got {self.margin}")

    def step_estimate(self, interval_length: int) -> tuple[float, str]:
        """Seconds one training step takes by this policy, and the option it comes from."""
        if self.step_seconds is not None:
            return self.step_seconds, "--step-seconds"
        return self.interval_seconds / max(interval_length, 1), f"--interval-seconds / K={interval_length}"

    def pretrain_refusal(self, job: int, steps_left: int, interval_length: int, now: int,
                         deadline: int) -> str | None:
        """Why this trainer does not start (or carry on) training job ``job`` before accepting it:
        its accept deadline (last second an ``acceptJob`` can be mined) leaves less than ``margin``
        x the ``steps_left`` steps still to train x one step's seconds (at least 1 s, for the
        ``acceptJob`` itself). None: it fits."""
        per_step, source = self.step_estimate(interval_length)
        need = max(1, math.ceil(self.margin * steps_left * per_step))
        left = deadline - now
        if left >= need:
            return None
        if left <= 0:
            return (f"accept deadline passed: job {job} could be accepted until {deadline}, the chain is at "
                    f"{now} ({-left} s later); not accepting it")
        return (f"accept deadline in {left} s (at {deadline}) is too soon: training the {steps_left} steps left "
                f"before accepting needs {self.margin:g} x {steps_left} x {per_step:g} s = {need} s "
                f"({source}, --term-margin); not starting job {job}")

    def refusals(self, params: tuple, payment: int, graph: Graph, interval_length: int) -> list[str]:
        """Why this agent declines a job with these on-chain params (empty: it takes part)."""
        out = []
        moves = game_moves(graph, interval_length)
        need = math.ceil(self.margin * moves * self.move_seconds)
        regen = ""
        if self.role == "trainer" and self.step_seconds is not None:
            steps = trainer_regen_steps(interval_length)
            need = math.ceil(self.margin * (moves * self.move_seconds + steps * self.step_seconds))
            regen = f" + {steps} regenerated steps x {self.step_seconds:g} s"
        if int(params[CLOCK]) < need:
            out.append(f"clock {int(params[CLOCK])} s is shorter than this {self.role} needs: {self.margin:g} x "
                       + (f"({moves} moves x {self.move_seconds:g} s{regen})" if regen else
                          f"{moves} moves x {self.move_seconds:g} s") + f" = {need} s (--move-seconds, --term-margin)")
        if self.role == "trainer":
            need = math.ceil(self.margin * self.interval_seconds)
            if int(params[POSTING]) < need:
                out.append(f"posting period {int(params[POSTING])} s is shorter than this trainer needs per "
                           f"interval: {self.margin:g} x {self.interval_seconds:g} s = {need} s "
                           "(--interval-seconds, --term-margin)")
            stake = int(params[STAKE])
            if self.max_stake_ratio is not None and stake > self.max_stake_ratio * payment:
                out.append(f"stake {stake} wei is more than {self.max_stake_ratio:g} x the payment ({payment} wei) "
                           "(--max-stake-ratio)")
            if int(params[BOND]) < self.min_bond:
                out.append(f"challenger bond {int(params[BOND])} wei is less than the {self.min_bond} wei a false "
                           "challenge costs this trainer to defend (--min-bond)")
        else:
            need = math.ceil(self.margin * self.replay_seconds)
            if int(params[WINDOW]) < need:
                out.append(f"challenge window {int(params[WINDOW])} s is shorter than this auditor needs to "
                           f"replay and challenge an interval: {self.margin:g} x {self.replay_seconds:g} s = "
                           f"{need} s (--replay-seconds, --term-margin)")
            if int(params[POSTING]) < need:
                out.append(f"posting period {int(params[POSTING])} s is shorter than this auditor needs to "
                           f"replay an interval: {self.margin:g} x {self.replay_seconds:g} s = {need} s; intervals "
                           "posted on that schedule would outrun its replay (--replay-seconds, --term-margin)")
        return out
