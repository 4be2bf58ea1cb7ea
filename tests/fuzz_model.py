"""Python model of the contracts for the stateful fuzzer (tests/test_fuzz_contracts.py).

The model knows, independently of the chain:

- every job's terms, status, posted roots and open games, and so its escrow;
- every game's chess clocks (each move charges the mover, exactly one clock runs);
- what every account is owed, was credited in total and has withdrawn (ETH actually received),
  and what convictions burned (the part of a convicted stake beyond the winner's bounty);
- the registry's floors on the terms (``FLOORS``: a job below one is rejected with TermBelowFloor);
- who is honest: a trainer whose every posted root is the honest run's and that posted every
  interval by its posting deadline (``acceptedAt + (i+1) * postingPeriod``; a trainer that let one
  pass is *late*, and its client may ``reclaimJob``), a challenger that disputes the first wrong
  interval of a job with the honest strategy.

It predicts whether each registry call and each timeout/close succeeds and, if not, which custom
errors may explain the revert (a set, so that the order of the contract's checks is free). Who
wins an adjudicated game comes from the chain (``GameResolved``); the model then applies the
settlement rules itself, and the invariants hold the chain's outcomes against honesty.

``sabotage`` deliberately breaks one expectation so that a test can show the matching invariant
fails (see ``SABOTAGES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from game_harness import (
    BOUNTY_BPS,
    DA_FEE_GAS_PRICE,
    MIN_BOND,
    MIN_CLOCK,
    MIN_POSTING,
    MIN_WINDOW,
    GameStatus,
    JobStatus,
    Party,
)

from protocol import availability as A

#: The floors of the fuzzed registry (tests/game_harness.py's deployment), by JobParams field.
FLOORS = {"challengeWindow": MIN_WINDOW, "clock": MIN_CLOCK, "postingPeriod": MIN_POSTING, "challengerBond": MIN_BOND}

#: Deliberately wrong expectations, one per invariant (tests prove each invariant can fail):
#: ``escrow``: the model forgets challenger bonds in an Active job's escrow (solvency);
#: ``double_pay``: the model books every withdrawal twice (paid once);
#: ``honest``: the model takes every challenger for honest (honest parties never lose);
#: ``bound``: the model expects every game to be over after one clock instead of two (games end);
#: ``frozen``: the model takes a game for finished after its first move (finished games frozen);
#: ``reclaim``: the model credits a reclaiming client only the payment, not the bounty (solvency);
#: ``bounty``: the model pays a winning challenger the whole stake (the old rule; solvency);
#: ``burn``: the model forgets what convictions burn (solvency);
#: ``floor``: the model takes a term one unit below its floor as valid (every floor off by one; expectation).
#: ``demand_escrow``: the model forgets an open demand's bond in the job's escrow (solvency);
#: ``extension``: the model forgets that an answer extends the interval's window (expectation).
#: ``demand_fee``: the model forgets the answer fees of open demands in the job's escrow (solvency).
#: ``schedule``: the model closes a window ``challengeWindow`` after posting, not after its chained
#: start (the later of posting and the previous start + postingPeriod; the old rule; expectation).
SABOTAGES = ("escrow", "double_pay", "honest", "bound", "frozen", "reclaim", "bounty", "burn", "floor",
             "demand_escrow", "extension", "demand_fee", "schedule")


class Violation(AssertionError):
    """An invariant or an expectation of the model does not hold; the message names which."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"INVARIANT {invariant} violated: {message}")
        self.invariant = invariant


@dataclass
class JobModel:
    job: int
    client: str
    trainer: str
    payment: int
    stake: int
    bond: int
    window: int
    clock: int
    n_intervals: int
    honest_roots: list[bytes]
    honest_run: bool  # the trainer plays from the honest run
    posting_period: int = 10_000
    status: JobStatus = JobStatus.OPEN
    posted: list[bytes] = field(default_factory=list)
    posted_at: list[int] = field(default_factory=list)
    open_games: int = 0
    accepted_at: int | None = None
    late: bool = False  # an interval was not posted by its deadline (seen while Active)
    reclaimed: bool = False
    extended: dict[int, int] = field(default_factory=dict)
    """Window ends moved later by answered availability demands (interval -> last second)."""
    fees_held: int = 0
    """Answer fees of the job's open demands (held in its escrow until answered or refunded)."""
    scheduled_windows: bool = True
    """Windows follow the chained schedule, one posting period apart at least (False: sabotage ``schedule``)."""
    created_at: int = 0
    accept_period: int = 1

    @property
    def accept_deadline(self) -> int:
        """Last second the trainer may accept; the client may cancel only after it."""
        return self.created_at + self.accept_period

    @property
    def honest_posts(self) -> bool:
        """Plays the honest run and every root it posted is the honest one (it wins every game)."""
        return self.honest_run and all(r == h for r, h in zip(self.posted, self.honest_roots, strict=False))

    @property
    def honest_trainer(self) -> bool:
        """Honest: honest roots, each posted by its deadline (a late trainer may be reclaimed)."""
        return self.honest_posts and not self.late

    def posting_deadline(self, index: int) -> int:
        """Last second at which interval ``index`` is on time (the registry's ``postingDeadline``)."""
        assert self.accepted_at is not None
        return self.accepted_at + (index + 1) * self.posting_period

    def overdue(self, now: int) -> bool:
        """Active, an interval still to post, and its deadline passed: the client may reclaim."""
        nxt = len(self.posted)
        return self.status == JobStatus.ACTIVE and nxt < self.n_intervals and now > self.posting_deadline(nxt)

    def see(self, now: int) -> None:
        """Marks the trainer late once a posting deadline passed with its interval unposted."""
        if self.overdue(now):
            self.late = True

    def first_bad_interval(self) -> int | None:
        for i, root in enumerate(self.posted):
            if root != self.honest_roots[i]:
                return i
        return None

    def window_end(self, index: int) -> int:
        """Last second interval ``index`` can be challenged (extended by answered demands)."""
        return max(self.base_window_end(index), self.extended.get(index, 0))

    def window_start(self, index: int) -> int:
        """The chained window start: start_0 = max(postedAt_0, acceptedAt), start_i =
        max(postedAt_i, start_{i-1} + postingPeriod) (sabotage ``schedule``: postedAt_i)."""
        assert self.accepted_at is not None
        start = self.accepted_at - self.posting_period
        for i in range(index + 1):
            start = max(self.posted_at[i], start + self.posting_period) if self.scheduled_windows else self.posted_at[i]
        return start

    def base_window_end(self, index: int) -> int:
        """The unextended window end, the chained window start + challengeWindow (the registry's
        ``unextendedWindowEnd``): the last second a demand on ``index`` can be made."""
        return self.window_start(index) + self.window

    def bounty(self) -> int:
        """What a conviction of this job pays its winner beyond its bond (the registry's rounding)."""
        return self.stake * BOUNTY_BPS // 10_000

    def finalize_after(self) -> int:
        """Last second before finalize: the last window's end or a later extended one."""
        return max([self.window_end(self.n_intervals - 1), *self.extended.values()])

    def escrow(self, sabotage: str | None = None) -> int:
        bonds = 0 if sabotage == "escrow" else self.open_games * self.bond
        bonds += 0 if sabotage == "demand_fee" else self.fees_held
        if self.status == JobStatus.OPEN:
            return self.payment
        if self.status == JobStatus.ACTIVE:
            return self.payment + self.stake + bonds
        if self.status == JobStatus.FRAUDULENT:
            return bonds
        return 0


@dataclass
class GameModel:
    game: int
    job: int
    interval: int
    trainer: str
    challenger: str
    honest_challenger: bool
    t0: int
    clock: int
    status: GameStatus = GameStatus.IN_PROGRESS
    trainer_left: int = 0
    challenger_left: int = 0
    running: Party = Party.TRAINER
    started: int = 0
    moves: int = 0
    returned: int | None = None  # wei the chain credited the challenger when the game ended

    def __post_init__(self) -> None:
        self.trainer_left = self.challenger_left = self.clock
        self.started = self.t0

    @property
    def live(self) -> bool:
        return self.status == GameStatus.IN_PROGRESS

    def left(self, party: Party) -> int:
        return self.trainer_left if party == Party.TRAINER else self.challenger_left

    def deadline(self) -> int:
        """Last second at which the side to move may still move."""
        return self.started + self.left(self.running)

    def bound(self, sabotage: str | None = None) -> int:
        """Last second a game can still be live with nobody able to end it: both clocks spent."""
        return self.t0 + (1 if sabotage == "bound" else 2) * self.clock

    def expired(self, now: int) -> bool:
        return now > self.deadline()

    def charge(self, t: int) -> None:
        """The clock of the side to move stops at ``t`` (a move): the elapsed time is charged."""
        used = t - self.started
        if used < 0 or used > self.left(self.running):
            raise Violation("games_end", f"game {self.game}: a move at {t} outside the mover's clock "
                            f"(started {self.started}, {self.left(self.running)} s left)")
        if self.running == Party.TRAINER:
            self.trainer_left -= used
        else:
            self.challenger_left -= used

    def start(self, party: Party, t: int) -> None:
        self.running, self.started = party, t


@dataclass
class Ledger:
    """Wei owed to, credited to and withdrawn by each account; wei deposited in total."""

    owed: dict[str, int] = field(default_factory=dict)
    credited: dict[str, int] = field(default_factory=dict)
    withdrawn: dict[str, int] = field(default_factory=dict)
    deposited: int = 0
    burned: int = 0
    touched: set[str] = field(default_factory=set)

    def credit(self, account: str, amount: int) -> None:
        self.owed[account] = self.owed.get(account, 0) + amount
        self.credited[account] = self.credited.get(account, 0) + amount
        self.touched.add(account)

    def paid(self, account: str, received: int, times: int = 1) -> None:
        """``account`` withdrew and received ``received`` wei (booked ``times`` times)."""
        self.withdrawn[account] = self.withdrawn.get(account, 0) + times * received
        self.owed[account] = 0
        self.touched.add(account)

    @property
    def total_owed(self) -> int:
        return sum(self.owed.values())

    @property
    def total_withdrawn(self) -> int:
        return sum(self.withdrawn.values())


@dataclass
class Model:
    sabotage: str | None = None
    jobs: dict[int, JobModel] = field(default_factory=dict)
    games: dict[int, GameModel] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=Ledger)
    touched_jobs: set[int] = field(default_factory=set)
    finished: list[int] = field(default_factory=list)  # games over since the last check
    demands: dict[int, DemandModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sabotage is not None and self.sabotage not in SABOTAGES:
            raise ValueError(f"unknown sabotage {self.sabotage!r}; expected one of {SABOTAGES}")

    # -- totals

    def escrow_total(self) -> int:
        return sum(j.escrow(self.sabotage) for j in self.jobs.values())

    def live_games(self) -> list[GameModel]:
        return [g for g in self.games.values() if g.live]

    def claims_honest_challenger(self, g: GameModel) -> bool:
        return g.honest_challenger or self.sabotage == "honest"

    # -- expectations: the custom errors that may explain a revert; empty: the call must succeed

    def expect_create(self, terms: dict[str, int], zeroed: str | None) -> set[str]:
        """createJob with these terms (JobParams field -> value); ``zeroed``: a field set to 0."""
        errs = set()
        if zeroed is not None and zeroed not in FLOORS:
            errs.add("InvalidJobParam")
        for name, floor in FLOORS.items():
            if self.sabotage == "floor":
                floor -= 1
            if terms[name] < floor:
                errs.add("TermBelowFloor")
        return errs

    def expect_cancel(self, job: int, sender: str, t: int) -> set[str]:
        j = self.jobs[job]
        errs = set()
        if sender != j.client:
            errs.add("Unauthorized")
        if j.status != JobStatus.OPEN:
            errs.add("WrongJobStatus")
        elif t <= j.accept_deadline:  # the offer is firm until its deadline, that second included
            errs.add("CancelTooEarly")
        return errs

    def expect_accept(self, job: int, sender: str, value: int, t: int) -> set[str]:
        j = self.jobs[job]
        errs = set()
        if sender != j.trainer:
            errs.add("Unauthorized")
        if j.status != JobStatus.OPEN:
            errs.add("WrongJobStatus")
        elif t > j.accept_deadline:
            errs.add("AcceptDeadlinePassed")
        if value != j.stake:
            errs.add("WrongValue")
        return errs

    def expect_post(self, job: int, sender: str, index: int, root: bytes) -> set[str]:
        j = self.jobs[job]
        errs = set()
        if sender != j.trainer:
            errs.add("Unauthorized")
        if j.status != JobStatus.ACTIVE:
            errs.add("WrongJobStatus")
        if index != len(j.posted) or index >= j.n_intervals:
            errs.add("WrongInterval")
        if root == b"\x00" * 32:
            errs.add("ZeroRoot")
        return errs

    def expect_finalize(self, job: int, now: int) -> set[str]:
        j = self.jobs[job]
        errs = set()
        if j.status != JobStatus.ACTIVE:
            errs.add("WrongJobStatus")
        if len(j.posted) != j.n_intervals:
            errs.add("IntervalsMissing")
        elif now <= j.finalize_after():
            errs.add("WindowStillOpen")
        if j.open_games:
            errs.add("GamesOpen")
        return errs

    def expect_reclaim(self, job: int, sender: str, now: int) -> set[str]:
        j = self.jobs[job]
        errs = set()
        if sender != j.client:
            errs.add("Unauthorized")
        if j.status != JobStatus.ACTIVE:
            errs.add("WrongJobStatus")
        elif not j.overdue(now):
            errs.add("PostingNotOverdue")
        elif j.open_games:
            errs.add("GamesOpen")
        return errs

    def expect_withdraw(self, account: str) -> set[str]:
        return set() if self.ledger.owed.get(account, 0) > 0 else {"NothingOwed"}

    def expect_challenge(self, job: int, interval: int, value: int, now: int) -> set[str]:
        j = self.jobs[job]
        errs = set()
        if j.status != JobStatus.ACTIVE:
            errs.add("WrongJobStatus")
        if interval >= len(j.posted):
            errs.add("IntervalNotPosted")
        elif now > j.window_end(interval):
            errs.add("WindowClosed")
        if value != j.bond:
            errs.add("WrongValue")
        return errs

    def expect_live(self, game: int) -> set[str]:
        """Errors of any move on ``game`` before the turn and clock checks."""
        g = self.games[game]
        errs = set()
        if not g.live:
            errs.add("GameOver")
        if self.jobs[g.job].status != JobStatus.ACTIVE:
            errs.add("WrongJobStatus")
        return errs

    def expect_claim_timeout(self, game: int, now: int) -> set[str]:
        errs = self.expect_live(game)
        if not errs and not self.games[game].expired(now):
            errs.add("ClockNotExpired")
        return errs

    def expect_close(self, game: int) -> set[str]:
        g = self.games[game]
        errs = set()
        if not g.live:
            errs.add("GameOver")
        if self.jobs[g.job].status != JobStatus.FRAUDULENT:
            errs.add("JobNotFraudulent")
        return errs

    # -- effects of successful calls

    def create(self, job: JobModel) -> None:
        if job.job in self.jobs:
            raise Violation("solvency", f"job id {job.job} issued twice")
        self.jobs[job.job] = job
        job.scheduled_windows = self.sabotage != "schedule"
        self.ledger.deposited += job.payment
        self.touched_jobs.add(job.job)

    def cancel(self, job: int) -> None:
        j = self.jobs[job]
        j.status = JobStatus.CANCELLED
        self.ledger.credit(j.client, j.payment)
        self.touched_jobs.add(job)

    def accept(self, job: int, t: int) -> None:
        j = self.jobs[job]
        j.status = JobStatus.ACTIVE
        j.accepted_at = t
        self.ledger.deposited += j.stake
        self.touched_jobs.add(job)

    def post(self, job: int, root: bytes, t: int) -> None:
        j = self.jobs[job]
        if t > j.posting_deadline(len(j.posted)):
            j.late = True
        j.posted.append(root)
        j.posted_at.append(t)
        self.touched_jobs.add(job)

    def finalize(self, job: int) -> None:
        j = self.jobs[job]
        j.status = JobStatus.FINALIZED
        self.ledger.credit(j.trainer, j.payment + j.stake)
        self.touched_jobs.add(job)

    def reclaim(self, job: int, t: int) -> int:
        """The client reclaimed ``job`` at ``t`` (no game open): Fraudulent, client credited
        payment + bounty, the rest of the stake burned. Returns the refund."""
        j = self.jobs[job]
        j.see(t)
        j.reclaimed = True
        refund = j.payment + (0 if self.sabotage == "reclaim" else j.bounty())
        self._convict(j, j.client, 0, refund - j.payment)
        self.touched_jobs.add(job)
        return refund

    def _convict(self, j: JobModel, winner: str, bond: int, bounty: int) -> None:
        """The registry's ``_convict``: payment to the client, bond + bounty to the winner, burn."""
        j.status = JobStatus.FRAUDULENT
        self.ledger.credit(winner, bond + bounty)
        self.ledger.credit(j.client, j.payment)
        if self.sabotage != "burn":
            self.ledger.burned += j.stake - j.bounty()

    def withdraw(self, account: str, received: int) -> None:
        self.ledger.paid(account, received, times=2 if self.sabotage == "double_pay" else 1)

    def challenge(self, g: GameModel) -> None:
        j = self.jobs[g.job]
        j.open_games += 1
        self.ledger.deposited += j.bond
        self.games[g.game] = g
        self.touched_jobs.add(g.job)

    def moved(self, game: int, t: int, next_party: Party) -> None:
        """A move at ``t`` that did not end the game; ``next_party`` moves next."""
        g = self.games[game]
        g.charge(t)
        g.start(next_party, t)
        g.moves += 1
        if self.sabotage == "frozen" and g.moves == 1:
            self.finished.append(game)

    def resolve(self, game: int, trainer_won: bool) -> None:
        """The game ended with a winner: the registry settles it."""
        g = self.games[game]
        j = self.jobs[g.job]
        if not g.live:
            raise Violation("finished_games_frozen", f"game {game} resolved again after {g.status.name}")
        if j.status != JobStatus.ACTIVE:
            raise Violation("solvency", f"game {game} resolved on job {j.job} in status {j.status.name}")
        j.open_games -= 1
        if trainer_won:
            g.status = GameStatus.TRAINER_WON
            self.ledger.credit(j.trainer, j.bond)
        else:
            g.status = GameStatus.CHALLENGER_WON
            self._convict(j, g.challenger, j.bond, j.stake if self.sabotage == "bounty" else j.bounty())
        self.finished.append(game)
        self.touched_jobs.add(j.job)

    def close(self, game: int) -> None:
        g = self.games[game]
        j = self.jobs[g.job]
        j.open_games -= 1
        g.status = GameStatus.CLOSED
        self.ledger.credit(g.challenger, j.bond)
        self.finished.append(game)
        self.touched_jobs.add(j.job)


# ---------------------------------------------------------------- data-availability demands


@dataclass
class DemandModel:
    """A DataAvailability demand: the trainer has ``clock`` seconds from ``t0`` to answer."""

    demand: int
    job: int
    interval: int
    step: int
    kind: int  # 1 step record, 2 op log
    demander: str
    t0: int
    clock: int
    fee: int = 0  # the answer fee paid with the bond
    status: str = "open"  # open, answered, timed_out, closed
    returned: int | None = None  # wei the chain credited the demander when it ended

    @property
    def live(self) -> bool:
        return self.status == "open"

    def deadline(self) -> int:
        return self.t0 + self.clock


def step_fee(n_slots: int, n_ops: int, first_op: int = 0) -> int:
    """``stepDemandFee`` at the fuzzed deployment's price (protocol.availability's mirror)."""
    return A.step_demand_fee(DA_FEE_GAS_PRICE, n_slots, n_ops, first_op)


def log_fee(from_index: int, to_index: int, start_position: int = A.NO_POSITION) -> int:
    """``logDemandFee`` at the fuzzed deployment's price."""
    return A.log_demand_fee(DA_FEE_GAS_PRICE, from_index, to_index, start_position)


def expect_demand(m: Model, job: int, interval: int, step: int, value: int, now: int, fee: int = 0) -> set[str]:
    """Errors that may explain a reverted demandStep/demandLog (``value`` must be bond + ``fee``)."""
    j = m.jobs[job]
    errs = set()
    if j.status != JobStatus.ACTIVE:
        errs.add("WrongJobStatus")
    if interval >= len(j.posted):
        errs.add("IntervalNotPosted")
    elif now > j.base_window_end(interval):
        errs.add("DemandWindowClosed")
    if value != j.bond + fee:
        errs.add("WrongValue")
    return errs


def expect_answer(m: Model, d: DemandModel, sender: str, now: int, proof_ok: bool) -> set[str]:
    j = m.jobs[d.job]
    errs = set()
    if not d.live:
        errs.add("DemandNotOpen")
    if sender != j.trainer:
        errs.add("Unauthorized")
    if j.status != JobStatus.ACTIVE:
        errs.add("WrongJobStatus")
    if now > d.deadline():
        errs.add("ClockExpired")
    if not proof_ok:
        errs.add("InvalidProof")
    return errs


def expect_demand_timeout(m: Model, d: DemandModel, now: int) -> set[str]:
    errs = set()
    if not d.live:
        errs.add("DemandNotOpen")
    elif m.jobs[d.job].status != JobStatus.ACTIVE:
        errs.add("WrongJobStatus")
    elif now <= d.deadline():
        errs.add("DeadlineNotPassed")
    return errs


def expect_close_demand(m: Model, d: DemandModel) -> set[str]:
    if not d.live:
        return {"DemandNotOpen"}
    return set() if m.jobs[d.job].status == JobStatus.FRAUDULENT else {"WrongJobStatus"}


def demanded(m: Model, d: DemandModel) -> None:
    j = m.jobs[d.job]
    j.open_games += 0 if m.sabotage == "demand_escrow" else 1
    j.fees_held += d.fee
    m.ledger.deposited += j.bond + d.fee
    m.demands[d.demand] = d
    m.touched_jobs.add(d.job)


def answered(m: Model, d: DemandModel, t: int, leaves: int = 0) -> None:
    """Bond back to the demander, the fee to the trainer (a Log answer: the fee of its ``leaves``
    leaves, the rest back to the demander); the interval's window moved to at least t + clock."""
    j = m.jobs[d.job]
    j.open_games -= 0 if m.sabotage == "demand_escrow" else 1
    d.status = "answered"
    earned = d.fee if d.kind == 1 else A.log_answer_earned(DA_FEE_GAS_PRICE, d.fee, leaves)
    j.fees_held -= d.fee
    m.ledger.credit(d.demander, j.bond + d.fee - earned)
    m.ledger.credit(j.trainer, earned)
    if m.sabotage != "extension":
        j.extended[d.interval] = max(j.extended.get(d.interval, 0), t + j.clock)
    m.touched_jobs.add(d.job)


def demand_timed_out(m: Model, d: DemandModel) -> None:
    """The trainer is convicted (the registry's ``_convict``): the demander wins its bond + the
    bounty, the client its payment, the rest of the stake is burned."""
    j = m.jobs[d.job]
    j.open_games -= 0 if m.sabotage == "demand_escrow" else 1
    d.status = "timed_out"
    j.fees_held -= d.fee
    m.ledger.credit(d.demander, d.fee)  # the fee comes back with the conviction
    m._convict(j, d.demander, j.bond, j.stake if m.sabotage == "bounty" else j.bounty())
    m.touched_jobs.add(d.job)


def demand_closed(m: Model, d: DemandModel) -> None:
    j = m.jobs[d.job]
    j.open_games -= 0 if m.sabotage == "demand_escrow" else 1
    d.status = "closed"
    j.fees_held -= d.fee
    m.ledger.credit(d.demander, j.bond + d.fee)
    m.touched_jobs.add(d.job)
