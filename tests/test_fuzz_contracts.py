"""Stateful fuzzing of JobRegistry + DisputeGame (+ the toy adjudicator) on eth-tester.

A hypothesis ``RuleBasedStateMachine`` drives random sequences of: job creation (random payment,
stake, bond, window, clock, posting period and interval count, sometimes one below the registry's
floor or at it; sometimes an invalid parameter), cancel, accept (right and wrong stake), interval
posts (the trainer's roots, honest roots, garbage, zero, out of order, wrong sender), reclaimJob
(by the client, the trainer or a third party; sometimes one second before, at or after the next
posting deadline), challenges (honest and false challengers, several per job and per interval,
right and wrong bond), game moves by honest and cheating actors of tests/game_harness.py (whole
games played out; moves out of turn, by third parties and with wrong data, which must revert and
leave the game unchanged), time jumps (to clock deadlines, window ends and game bounds, one
second either side), claimTimeout, closeGame, finalize and withdrawals (twice); and data-availability moves
(DataAvailability: step-record and op-log demands inside and around the unextended window,
answers by the trainer or a third party, demand timeouts, closeDemand), whose window extensions
the model follows (``DemandMachine`` starts every sequence with demands). An honest trainer
answers each demand ``RESERVE`` seconds before its deadline.

tests/fuzz_model.py keeps a model of every job, game clock and account; every call's success or
revert (and its custom error) is predicted. Checked after every rule:

- solvency: the registry's balance is exactly what is owed plus what was burned plus every job's
  escrow (payment, stake, locked bonds); the game contract holds nothing; totalOwed, totalBurned,
  each touched account's credit and each touched job's record and escrowOf match the model; a
  winning challenger (whoever it is: perhaps the trainer's sybil) was credited exactly its bond +
  the bounty, never the stake;
- paid_once: for every account, ETH received by withdraw + still owed == credited; received +
  owed + burned + escrow == deposited (so withdrawing twice pays once, and nothing is paid twice);
- honest_never_loses: a job whose trainer posted only honest roots, each by its posting deadline,
  never turns fraudulent; one that posted only honest roots but late can only be reclaimed (no
  game takes its stake), and only once its next interval is overdue on chain; an on-time trainer
  (``on_time`` jobs: it posts before time passes its deadline) is never late; a game of an
  honest challenger (the first wrong interval, honest strategy) never ends with the trainer
  winning, and every finished one credited it at least its bond (``Credited`` events: a game
  closed because another convicted the job refunds it; reclaimJob waits for open games);
- games_end: a live game's mover has a deadline within t0 + 2 * clock and, past it, claimTimeout
  (or closeGame on a fraudulent job) succeeds; no live game sits on a finalized or cancelled job;
- finished_games_frozen: once over, a game rejects every move, timeout and close with GameOver;
- clocks: each game's deadline and stopped clock match the model's chess clocks.

Honest actors are diligent: before time passes, an honest side to move moves while it still has
``RESERVE`` seconds left (an honest agent is online), and an on-time trainer posts its next
interval (honest root) ``RESERVE`` seconds before its posting deadline; dishonest actors move, and
other trainers post, only when a rule says. A trainer that lets a posting deadline pass is marked
late (``JobModel.late``) and is no longer honest as a trainer (it still defends its games).
Each sequence ends by draining: every game ended, overdue jobs reclaimed, every job settled,
every account withdrawn, and the registry left holding exactly the escrow of unfinished jobs plus
the burned stakes.

``SABOTAGE`` (tests/fuzz_model.py) breaks one expectation on purpose: the tests below show each
invariant fails when it should. Counts (sequences, steps, checks, violations) go to
tests/security_report.py.

Mutation checks (run by hand on a copy, never committed), each caught within the default budget
unless noted: withdraw keeps the credit (solvency); Clock.expired at the deadline second
(expectation: claimTimeout accepted one second early; caught by 60 x 30); finalize ignores open
games (expectation); closeGame without its GameOver check (finished_games_frozen); a won game
leaves the job Active (solvency); a closed game's bond refunded to the trainer (expectation);
reclaimJob at its posting deadline second (``<`` for ``<=``: expectation, reclaim accepted at the
deadline; caught by 10 x 20).
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import da_harness as D
import fuzz_model as FM
import game_harness as H
import pytest
import security_report
from eth_utils import keccak
from fuzz_model import FLOORS, GameModel, JobModel, Model, Violation
from game_harness import Cheat, GameStatus, JobStatus, Party, Phase, Reverted, Ruling
from hypothesis import HealthCheck, settings
from hypothesis import Phase as HPhase
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from web3.logs import DISCARD

from vtrain.commit import roots as C

log = logging.getLogger(__name__)

#: (nSteps, intervalLength) of the fuzzed jobs: 1 to 3 intervals, the last one sometimes short.
CONFIGS = ((2, 1), (3, 2), (4, 2), (5, 2), (6, 4))
CHEAT_KINDS = ("element", "record_length", "input_bind", "output_bind", "const_bind", "step_leaf", "initial_state")
#: Fields of JobParams (index in Run.job_params) a bad createJob sets to zero.
BAD_FIELDS = {
    "nSteps": 9, "intervalLength": 10, "challengerBond": 12, "challengeWindow": 13, "clock": 14, "postingPeriod": 15
}
#: Index in Run.job_params of each term with a floor.
TERM_FIELDS = {"challengerBond": 12, "challengeWindow": 13, "clock": 14, "postingPeriod": 15}
#: Honest sides move while at least this many seconds are left (each move costs 1-2 s; a game
#: has at most ~16 moves per side), and clocks are at least MIN_CLOCK.
RESERVE = 60
MIN_CLOCK = 100
MAX_LIVE_GAMES = 6
MAX_JOBS = 5
MAX_LIVE_DEMANDS = 4
ZERO = b"\x00" * 32
FM_MAX_TO_INDEX = 0xFFFFFFFE
DEMAND_STATUS = {1: "open", 2: "answered", 3: "timed_out", 4: "convicted", 5: "closed"}


@dataclass
class Stats:
    """What one fuzz test ran (the machine's instances add to it)."""

    sequences: int = 0
    steps: int = 0
    checks: int = 0
    violations: int = 0
    counts: Counter[str] = field(default_factory=Counter)


def cheat_for(kind: str, n_steps: int) -> Cheat:
    """A cheat of ``kind`` that falls within a run of ``n_steps`` steps."""
    return {
        "element": Cheat("element", step=min(3, n_steps), op="update0", index=129),
        "record_length": Cheat("record_length", step=min(2, n_steps), op="update0"),
        "input_bind": Cheat("input_bind", step=n_steps, slot=1),
        "output_bind": Cheat("output_bind", step=n_steps, slot=0),
        "const_bind": Cheat("const_bind", step=n_steps),
        "step_leaf": Cheat("step_leaf", step=min(3, n_steps)),
        "initial_state": Cheat("initial_state", step=1),
    }[kind]


@functools.cache
def base_run(n_steps: int, interval_length: int, cheat: Cheat | None) -> H.Run:
    return H.simulate(H.JobConfig(n_steps=n_steps, interval_length=interval_length), cheat)


_DEPLOYMENT: list[H.Deployment] = []


def fresh_deployment() -> H.Deployment:
    """One deployment per process, rewound to just after deployment for each sequence."""
    if not _DEPLOYMENT:
        _DEPLOYMENT.append(H.deploy())
    return _DEPLOYMENT[0].reset()


# (hypothesis draws the first entry of a sampled_from most often: the ordinary case comes first.)
amounts = st.one_of(st.sampled_from([10**18, 10**17, 1, 0]), st.integers(0, 5 * 10**18))
job_specs = st.fixed_dictionaries(
    {
        "config": st.integers(0, len(CONFIGS) - 1),
        "cheat": st.one_of(st.none(), st.sampled_from(CHEAT_KINDS)),
        "payment": amounts,
        "stake": amounts,
        # Terms at and one below the registry's floors (FLOORS) too; 0: a bad field (BAD_FIELDS).
        "bond": st.one_of(st.sampled_from([10**18, 10**17, H.MIN_BOND, H.MIN_BOND - 1, 1]),
                          st.integers(H.MIN_BOND, 5 * 10**18)),
        "window": st.sampled_from([3000, 600, 150, 601, 1000, 1001, 300, 2000, 4000, 5000, 6000, 7000, 149, 1, 2]),
        "clock": st.one_of(st.integers(MIN_CLOCK, 1000), st.sampled_from([MIN_CLOCK - 1, 1])),
        "client": st.integers(0, 1),
        "trainer": st.integers(0, 1),
        "one_step": st.booleans(),  # a cheating trainer asks for the ruling it will lose
        # Short periods too, so that trainers fall behind (and are reclaimed) within a sequence.
        "posting": st.one_of(st.sampled_from([600, 10_000, 200, 201, 1000, 3000, 199, 1]), st.integers(200, 20_000)),
        "on_time": st.booleans(),  # an honest-run trainer posts each interval by its deadline
        "posts": st.sampled_from([3, 1, 3, 0, 2]),  # intervals the initial jobs post at once (at most all)
    }
)
picks = st.integers(0, 99)
#: None, or a time offset from a boundary (deadline, window end): -1, the last valid second, +1.
boundary = st.sampled_from([None, None, None, 0, 1, -1])
challenges = st.fixed_dictionaries(
    {
        "honest": st.booleans(),  # honest: disputes the first wrong interval (if any) honestly
        "interval": st.integers(0, 3),  # 3: the next, unposted interval
        "who": st.integers(0, 1),
        "position": st.integers(-1, 3),  # a false challenger's target: step position, op, element
        "op": st.integers(0, 9),
        "element": st.integers(0, 129),
        "delta": st.sampled_from([0, 0, 0, 0, 1]),  # wrong bond
        "moves": st.integers(0, 4),  # moves played at once (initial games only)
        "at": boundary,  # first moves time to the window's end + at
    }
)


def _step(fn: Callable[..., None]) -> Callable[..., None]:
    """Counts a rule and marks the sequence unchecked until the invariants ran."""

    @functools.wraps(fn)
    def wrapper(self: ContractMachine, **kwargs: Any) -> None:
        self.clean = False
        self.stats.steps += 1
        self.stats.counts[f"rule.{fn.__name__}"] += 1
        fn(self, **kwargs)

    return wrapper


class ContractMachine(RuleBasedStateMachine):
    """Random protocol histories against the model (see the module docstring)."""

    SABOTAGE: str | None = None
    stats = Stats()

    def __init__(self) -> None:
        super().__init__()
        self.stats.sequences += 1
        self.dep = fresh_deployment()
        self.model = Model(sabotage=self.SABOTAGE)
        a = self.dep.w3.eth.accounts
        self.clients = [a[1], a[7]]
        self.trainer_addrs = [a[2], a[6]]
        self.challenger_addrs = [a[3], a[4]]
        self.anyone = a[5]
        self.accounts = [a[1], a[7], a[2], a[6], a[3], a[4], a[5]]
        self.names = dict(zip(self.accounts, ["client", "client2", "trainer", "trainer2", "challenger",
                                              "challenger2", "anyone"], strict=True))
        self.runs: dict[int, H.Run] = {}
        self.honest_runs: dict[int, H.Run] = {}
        self.one_step: dict[int, bool] = {}
        self.on_time: set[int] = set()  # jobs whose (honest-run) trainer posts by every deadline
        self.trainers: dict[int, H.Trainer] = {}
        self.challengers: dict[int, H.Challenger] = {}
        self.truth: set[int] = set()
        self._views: dict[int, dict[str, Any]] = {}
        self.clean = True
        self._diligent = False
        self._da_runs: dict[int, D.LogRun] = {}
        self.demand_ops: dict[int, int] = {}

    # ------------------------------------------------------------------ plumbing

    def _violation(self, invariant: str, message: str) -> Violation:
        self.clean = False
        return Violation(invariant, message)

    def _send(
        self,
        fn: Any,
        sender: str,
        expect: Callable[[int], set[str] | None],
        what: str,
        value: int = 0,
        mine: bool = False,
    ) -> tuple[Any, int]:
        """Sends ``fn`` after the honest sides moved. ``expect(t)``: the errors that may explain
        the predicted revert at block time t (empty: must succeed; None: must revert, any error).
        A predicted revert runs on the pending block (exactly what the transaction would see)
        unless ``mine``. Returns ``(receipt or None, t)``."""
        t = self._diligence()
        expected = expect(t)
        try:
            if expected != set() and not mine:
                self.dep.dry(fn, sender, value=value)
                r = None
            else:
                r = self.dep.tx(fn, sender, value=value)
                self._views.clear()
        except Reverted as e:
            if expected is not None and not expected:
                raise self._violation("expectation", f"{what} at t={t} reverted with {e}; expected success") from None
            if expected and e.name not in expected:
                raise self._violation(
                    "expectation", f"{what} at t={t} reverted with {e}; the model expected one of {sorted(expected)}"
                ) from None
            self.stats.counts[f"reverted.{what.split('(')[0].split(' on game')[0]}.{e.name}"] += 1
            return None, t
        if expected is None or expected:
            raise self._violation(
                "expectation", f"{what} at t={t} succeeded; the model expected a revert ({sorted(expected or [])})"
            )
        return r, t

    def _last_receipt(self) -> Any:
        w3 = self.dep.w3
        return w3.eth.get_transaction_receipt(w3.eth.get_block("latest")["transactions"][-1])

    def _pick(self, items: list[Any], i: int, preferred: list[Any] | None = None) -> Any:
        """Item ``i`` of ``preferred`` (when any) for i < 80, else of ``items`` (i < 100)."""
        pool = preferred if preferred and i < 80 else items
        return pool[i % len(pool)]

    def _job(self, i: int, *statuses: JobStatus) -> JobModel:
        jobs = list(self.model.jobs.values())
        return self._pick(jobs, i, [j for j in jobs if j.status in statuses])

    def _game(self, i: int, live: bool = True) -> GameModel:
        games = list(self.model.games.values())
        return self._pick(games, i, [g for g in games if g.live] if live else None)

    def _honest_side(self, g: GameModel, party: Party) -> bool:
        if party == Party.TRAINER:
            return self.model.jobs[g.job].honest_posts  # late or not, it defends its honest roots
        return g.honest_challenger

    # ------------------------------------------------------------------ games

    def _view(self, g: GameModel) -> dict[str, Any]:
        """The chain's view of ``g``, checked against the model's status and clocks."""
        return self._check_view(g, self.dep.view(g.game))

    def _check_view(self, g: GameModel, v: dict[str, Any]) -> dict[str, Any]:
        if (v["status"] == GameStatus.IN_PROGRESS) != g.live or (not g.live and v["status"] != g.status):
            raise self._violation("clocks", f"game {g.game} is {v['status'].name} on chain, {g.status.name} in model")
        if not g.live:
            return v
        if v["toMove"] != g.running:
            raise self._violation("clocks", f"game {g.game}: {v['toMove'].name} to move on chain, not {g.running.name}")
        if v["deadline"] != g.deadline():
            raise self._violation("clocks", f"game {g.game}: deadline {v['deadline']} on chain, model {g.deadline()}")
        other = Party.CHALLENGER if g.running == Party.TRAINER else Party.TRAINER
        stopped = v["challengerTime"] if other == Party.CHALLENGER else v["trainerTime"]
        if stopped != g.left(other):
            left = g.left(other)
            raise self._violation("clocks", f"game {g.game}: {other.name} clock stopped at {stopped} s, not {left}")
        return v

    def _resolved(self, g: GameModel, receipt: Any) -> tuple[Party, Ruling] | None:
        evs = self.dep.game.events.GameResolved().process_receipt(receipt, errors=DISCARD)
        if not evs:
            return None
        (ev,) = evs
        if ev.args.game != g.game or ev.args.job != g.job:
            raise self._violation("expectation", f"GameResolved for game {ev.args.game}, expected {g.game}")
        winner, ruling = Party(ev.args.winner), Ruling(ev.args.ruling)
        g.returned = self._credited(receipt, g.challenger)
        self.model.resolve(g.game, winner == Party.TRAINER)
        self.stats.counts[f"game.{winner.name.lower()}_won.{ruling.name.lower()}"] += 1
        return winner, ruling

    def _credited(self, receipt: Any, account: str) -> int:
        """Wei the registry credited ``account`` in ``receipt`` (its Credited events)."""
        evs = self.dep.registry.events.Credited().process_receipt(receipt, errors=DISCARD)
        return sum(int(e.args.amount) for e in evs if e.args.account == account)

    def _move_once(self, g: GameModel, asks: bool) -> bool:
        """The side to move plays its actor's move; False when it cannot or will not. ``asks``:
        the challenger asks for the ruling when the trainer does not."""
        t = self._diligence()
        if not g.live or self.model.jobs[g.job].status != JobStatus.ACTIVE:
            return False
        v = self._views.pop(g.game, None) or self._view(g)
        mover = v["toMove"]
        actor: H.Actor = self.trainers[g.game] if mover == Party.TRAINER else self.challengers[g.game]
        ok = actor.move(g.game, v)
        if not ok and mover == Party.TRAINER and v["phase"] == Phase.ONE_STEP and asks:
            t = self.dep.now()
            actor = self.challengers[g.game]
            ok = actor.one_step(g.game)
        if not ok:
            err = actor.last_error
            if self._honest_side(g, mover) and t <= g.deadline():
                raise self._violation(
                    "honest_never_loses", f"the honest {mover.name.lower()} of game {g.game} cannot move at "
                    f"t={t} (deadline {g.deadline()}): {err}"
                )
            if err is not None and err.name == "ClockExpired" and t <= g.deadline():
                raise self._violation("clocks", f"game {g.game}: move at {t} rejected as late, deadline {g.deadline()}")
            self.stats.counts["move.rejected"] += 1
            return False
        self.stats.counts["move.ok"] += 1
        receipt = self.dep.receipts[-1]
        if self.dep.game.events.GameResolved().process_receipt(receipt, errors=DISCARD):
            g.charge(t)  # raises when the move came after the deadline
            self._resolved(g, receipt)
            return True
        v = self.dep.view(g.game)
        if v["toMove"] == Party.NONE:
            raise self._violation("clocks", f"game {g.game} in progress with nobody to move")
        self.model.moved(g.game, t, v["toMove"])
        self._check_view(g, v)
        if v["phase"] == Phase.ONE_STEP and g.game not in self.truth:
            H.Oracle(self.dep, self.runs[g.job].graph, self.runs[g.job].cfg).register(g.game)
            self.truth.add(g.game)
        self._views[g.game] = v  # the next move starts from it (only moves change a game's view)
        return True

    def _diligence(self, horizon: int | None = None) -> int:
        """Honest sides to move whose deadline falls before ``horizon`` (default: now) +
        ``RESERVE`` move now, and on-time trainers post an interval whose posting deadline falls
        there. Returns the time the next transaction gets."""
        now = self.dep.now()
        if self._diligent:
            return now
        horizon = now if horizon is None else horizon
        self._diligent = True
        try:
            for _ in range(200):
                if self._answer_urgent_demand(horizon):  # (data availability: an honest trainer answers)
                    now = self.dep.now()
                    continue
                urgent = [
                    g for g in self.model.live_games()
                    if self.model.jobs[g.job].status == JobStatus.ACTIVE
                    and self._honest_side(g, g.running) and g.deadline() <= horizon + RESERVE
                ]
                due = [
                    j for j in self.model.jobs.values()
                    if j.job in self.on_time and j.status == JobStatus.ACTIVE and j.honest_posts
                    and len(j.posted) < j.n_intervals and j.posting_deadline(len(j.posted)) <= horizon + RESERVE
                ]
                if not urgent and not due:
                    return now
                post = min(due, key=lambda j: j.posting_deadline(len(j.posted)), default=None)
                g = min(urgent, key=GameModel.deadline, default=None)
                if post is not None and (g is None or post.posting_deadline(len(post.posted)) <= g.deadline()):
                    n = len(post.posted)
                    self._post(post, post.trainer, n, post.honest_roots[n])
                    if len(post.posted) == n:
                        raise self._violation("honest_never_loses", f"the on-time trainer of job {post.job} cannot "
                                              f"post interval {n} at t={now}")
                    self.stats.counts["interval.posted.diligent"] += 1
                else:
                    assert g is not None
                    self._move_once(g, asks=True)  # an honest side that cannot move raises
                    self.stats.counts["move.diligent"] += 1
                now = self.dep.now()
            raise self._violation("games_end", "honest sides kept moving for 200 moves")
        finally:
            self._diligent = False

    def _jump_to(self, t: int) -> None:
        if t > self._diligence(t):
            self.dep.at(t)

    def _claim_timeout(self, g: GameModel, sender: str) -> None:
        mover = g.running
        r, _ = self._send(
            self.dep.game.functions.claimTimeout(g.game), sender,
            lambda t: self.model.expect_claim_timeout(g.game, t), f"claimTimeout({g.game})",
        )
        if r is None:
            return
        res = self._resolved(g, r)
        expected = Party.CHALLENGER if mover == Party.TRAINER else Party.TRAINER
        if res != (expected, Ruling.TIMEOUT):
            raise self._violation("expectation", f"claimTimeout({g.game}) ruled {res}, not {expected.name} on time")

    def _close(self, g: GameModel, sender: str) -> None:
        r, _ = self._send(
            self.dep.game.functions.closeGame(g.game), sender, lambda t: self.model.expect_close(g.game),
            f"closeGame({g.game})",
        )
        if r is None:
            return
        if not self.dep.game.events.GameClosed().process_receipt(r, errors=DISCARD):
            raise self._violation("expectation", f"closeGame({g.game}) emitted no GameClosed")
        g.returned = self._credited(r, g.challenger)
        self.model.close(g.game)
        self.stats.counts["game.closed"] += 1

    # ------------------------------------------------------------------ jobs

    def _create(self, spec: dict[str, Any], bad: str | None = None) -> JobModel | None:
        n_steps, k = CONFIGS[spec["config"]]
        cheat = cheat_for(spec["cheat"], n_steps) if spec["cheat"] else None
        cfg = replace(
            base_run(n_steps, k, None).cfg, payment=spec["payment"], trainer_stake=spec["stake"],
            challenger_bond=spec["bond"], challenge_window=spec["window"], clock=spec["clock"],
            posting_period=spec["posting"], accept_period=spec["window"],  # (no new draw: the same sequences)
        )
        run = replace(base_run(n_steps, k, cheat), cfg=cfg)
        honest = replace(base_run(n_steps, k, None), cfg=cfg)
        client, trainer = self.clients[spec["client"]], self.trainer_addrs[spec["trainer"]]
        params = list(run.job_params(trainer))
        if bad is not None:
            params[BAD_FIELDS[bad]] = 0
        terms = {name: params[TERM_FIELDS[name]] for name in FLOORS}
        r, created = self._send(
            self.dep.registry.functions.createJob(tuple(params)), client,
            lambda t: self.model.expect_create(terms, bad), f"createJob({bad or 'valid'})", value=cfg.payment,
        )
        if r is None:
            return None
        (ev,) = self.dep.registry.events.JobCreated().process_receipt(r, errors=DISCARD)
        job = int(ev.args.job)
        if job != len(self.model.jobs) + 1:
            raise self._violation("expectation", f"createJob returned job {job}, expected {len(self.model.jobs) + 1}")
        jm = JobModel(
            job, client, trainer, cfg.payment, cfg.trainer_stake, cfg.challenger_bond, cfg.challenge_window,
            cfg.clock, cfg.n_intervals, honest.interval_roots, cheat is None, cfg.posting_period,
            created_at=created, accept_period=cfg.accept_period,
        )
        deadline = self.dep.call(self.dep.registry.functions.acceptDeadline(job))
        if deadline != jm.accept_deadline:
            raise self._violation("expectation", f"acceptDeadline({job}) is {deadline}, not {jm.accept_deadline}")
        self.model.create(jm)
        self.runs[job], self.honest_runs[job] = run, honest
        self.one_step[job] = cheat is None or spec["one_step"]
        if cheat is None and spec["on_time"]:
            self.on_time.add(job)
        self.stats.counts["job.created" + (".cheat" if cheat else "")] += 1
        return jm

    def _accept(self, j: JobModel, sender: str, value: int) -> None:
        r, t = self._send(
            self.dep.registry.functions.acceptJob(j.job), sender,
            lambda t: self.model.expect_accept(j.job, sender, value, t), f"acceptJob({j.job})", value=value,
        )
        if r is not None:
            self.model.accept(j.job, t)
            d = self.dep.call(self.dep.registry.functions.postingDeadline(j.job, 0))
            if d != j.posting_deadline(0):
                raise self._violation("expectation", f"postingDeadline({j.job}, 0) is {d}, not {j.posting_deadline(0)}")

    def _post(self, j: JobModel, sender: str, index: int, root: bytes) -> None:
        r, t = self._send(
            self.dep.registry.functions.postInterval(j.job, index, root), sender,
            lambda t: self.model.expect_post(j.job, sender, index, root), f"postInterval({j.job}, {index})",
        )
        if r is not None:
            self.model.post(j.job, root, t)
            self.stats.counts["interval.posted" + ("" if root == j.honest_roots[index] else ".wrong")] += 1
            (ev,) = self.dep.registry.events.IntervalPosted().process_receipt(r, errors=DISCARD)
            view = self.dep.call(self.dep.registry.functions.windowEnd(j.job, index))
            if not ev.args.windowEnd == view == j.base_window_end(index):
                raise self._violation("expectation", f"interval {index} of job {j.job} posted at {t}: window end "
                                      f"{ev.args.windowEnd} (event), {view} (view); the model says "
                                      f"{j.base_window_end(index)}")

    # ------------------------------------------------------------------ rules

    @initialize(specs=st.lists(job_specs, min_size=1, max_size=2), games=st.lists(challenges, min_size=1, max_size=3))
    @_step
    def ready_jobs(self, specs: list[dict[str, Any]], games: list[dict[str, Any]]) -> None:
        """Jobs created, accepted and posted (mostly all intervals) with the trainer's own roots;
        games on the first."""
        for spec in specs:
            spec = {**spec, "window": max(spec["window"], H.MIN_WINDOW), "clock": max(spec["clock"], MIN_CLOCK),
                    "posting": max(spec["posting"], H.MIN_POSTING), "bond": max(spec["bond"], H.MIN_BOND)}
            j = self._create(spec)
            assert j is not None
            self._accept(j, j.trainer, j.stake)
            for i in range(min(j.n_intervals, spec["posts"])):
                self._post(j, j.trainer, i, self.runs[j.job].interval_roots[i])
        for c in games:
            g = self._challenge(self.model.jobs[1], c)
            for _ in range(c["moves"] if g is not None else 0):
                if not self._move_once(g, asks=False):
                    break

    @precondition(lambda self: len(self.model.jobs) < MAX_JOBS)
    @rule(spec=job_specs, bad=st.sampled_from([None] * 6 + sorted(BAD_FIELDS)))
    @_step
    def create_job(self, spec: dict[str, Any], bad: str | None) -> None:
        self._create(spec, bad)

    @precondition(lambda self: any(j.status == JobStatus.OPEN for j in self.model.jobs.values()))
    @rule(i=picks, as_client=st.sampled_from([True, True, True, False]))
    @_step
    def cancel_job(self, i: int, as_client: bool) -> None:
        j = self._job(i, JobStatus.OPEN)
        sender = j.client if as_client else j.trainer
        r, _ = self._send(
            self.dep.registry.functions.cancelJob(j.job), sender,
            lambda t: self.model.expect_cancel(j.job, sender, t), f"cancelJob({j.job})",
        )
        if r is not None:
            self.model.cancel(j.job)
            self.stats.counts["job.cancelled"] += 1

    @precondition(lambda self: any(j.status == JobStatus.OPEN for j in self.model.jobs.values()))
    @rule(i=picks, as_trainer=st.sampled_from([True, True, True, False]), delta=st.sampled_from([0, 0, 0, 1, -1]))
    @_step
    def accept_job(self, i: int, as_trainer: bool, delta: int) -> None:
        j = self._job(i, JobStatus.OPEN)
        self._accept(j, j.trainer if as_trainer else self.anyone, max(0, j.stake + delta))

    @precondition(
        lambda self: any(j.status == JobStatus.ACTIVE and len(j.posted) < j.n_intervals
            for j in self.model.jobs.values())
    )
    @rule(
        i=picks,
        root=st.sampled_from(["own", "own", "own", "honest", "garbage", "zero"]),
        wrong=st.sampled_from([None, None, None, None, "index", "sender"]),
    )
    @_step
    def post_interval(self, i: int, root: str, wrong: str | None) -> None:
        j = self._job(i, JobStatus.ACTIVE)
        index = len(j.posted) + (1 if wrong == "index" else 0)
        k = min(index, j.n_intervals - 1)
        value = {
            "own": self.runs[j.job].interval_roots[k], "honest": j.honest_roots[k], "zero": ZERO,
            "garbage": keccak(text=f"garbage {j.job} {index}"),
        }[root]
        self._post(j, self.anyone if wrong == "sender" else j.trainer, index, value)

    @precondition(
        lambda self: len(self.model.live_games()) < MAX_LIVE_GAMES and any(j.posted for j in self.model.jobs.values())
    )
    @rule(i=picks, c=challenges)
    @_step
    def challenge(self, i: int, c: dict[str, Any]) -> None:
        jobs = [j for j in self.model.jobs.values() if j.posted]
        self._challenge(self._pick(jobs, i, [x for x in jobs if x.status == JobStatus.ACTIVE]), c)

    def _challenge(self, j: JobModel, c: dict[str, Any]) -> GameModel | None:
        """A challenge of ``j`` by an honest challenger (on the first wrong interval, if any) or a
        false one walking to ``(position, op, element)``."""
        bad = j.first_bad_interval()
        honest = c["honest"] and bad is not None
        if honest:
            interval = bad
        elif c["interval"] < 3 and j.posted:
            interval = c["interval"] % len(j.posted)
        else:
            interval = len(j.posted)  # not posted (yet)
        challenger = self.challenger_addrs[c["who"]]
        value = j.bond + c["delta"]
        if c["at"] is not None and interval < len(j.posted):
            self._jump_to(j.window_end(interval) + c["at"])
        r, t = self._send(
            self.dep.game.functions.challenge(j.job, interval), challenger,
            lambda t: self.model.expect_challenge(j.job, interval, value, t), f"challenge({j.job}, {interval})",
            value=value,
        )
        if r is None:
            return None
        (ev,) = self.dep.game.events.GameCreated().process_receipt(r, errors=DISCARD)
        gid = int(ev.args.game)
        if gid != len(self.model.games) + 1:
            raise self._violation("expectation", f"challenge created game {gid}, expected {len(self.model.games) + 1}")
        g = GameModel(gid, j.job, interval, j.trainer, challenger, honest, t, j.clock)
        self.model.challenge(g)
        self.trainers[gid] = H.Trainer(self.dep, self.runs[j.job], addr=j.trainer, one_step=self.one_step[j.job])
        if honest:
            self.challengers[gid] = H.HonestChallenger(self.dep, self.honest_runs[j.job], addr=challenger)
        else:
            self.challengers[gid] = H.FalseChallenger(self.dep, c["position"], c["op"], c["element"], addr=challenger)
        self.stats.counts["game.created" + (".honest_challenger" if honest else "")] += 1
        return g

    @precondition(lambda self: self.model.live_games())
    @rule(i=picks, n=st.integers(1, 10), asks=st.booleans())
    @_step
    def move(self, i: int, n: int, asks: bool) -> None:
        g = self._game(i)
        for _ in range(n):
            if not self._move_once(g, asks):
                return

    @precondition(lambda self: self.model.live_games())
    @rule(i=picks, asks=st.booleans())
    @_step
    def play_out(self, i: int, asks: bool) -> None:
        """Plays a game to its end; a side that cannot or will not move is timed out."""
        g = self._game(i)
        for _ in range(100):
            if not g.live or self.model.jobs[g.job].status != JobStatus.ACTIVE:
                return
            if not self._move_once(g, asks or g.honest_challenger):
                self._jump_to(g.deadline() + 1)
                winner = g.challenger if g.running == Party.TRAINER else g.trainer
                self._claim_timeout(g, winner)
                return
        raise self._violation("games_end", f"game {g.game} still live after 100 moves")

    @precondition(lambda self: self.model.games)
    @rule(i=picks, kind=st.sampled_from(["out_of_turn", "third_party", "wrong_data"]))
    @_step
    def bad_move(self, i: int, kind: str) -> None:
        """A move out of turn, by a third party or with wrong data (or any move of a finished
        game): it must revert and leave the game as it was."""
        g = self._game(i)
        now = self._diligence()
        gf = self.dep.game.functions
        rand = keccak(text=f"bad {g.game} {now}")
        trainer_move = gf.reveal(g.game, rand, keccak(rand))
        challenger_move = gf.choose(g.game, True)
        mover = g.running if g.live else Party.NONE
        if kind == "out_of_turn":
            fn, sender = (challenger_move, g.challenger) if mover == Party.TRAINER else (trainer_move, g.trainer)
            expect: set[str] | None = self.model.expect_live(g.game) | {"NotYourTurn"}
        elif kind == "third_party":
            fn = trainer_move if mover == Party.TRAINER else challenger_move
            sender = self.anyone
            expect = self.model.expect_live(g.game) | {"NotYourTurn"}
        else:
            if mover == Party.CHALLENGER:
                fn, sender = gf.pickElement(g.game, b"\x00" * 4, 0), g.challenger
            elif g.live and self.dep.view(g.game)["phase"] == Phase.ONE_STEP:
                fn, sender = gf.oneStep(g.game, b"\x01", [], b""), g.trainer
            else:
                fn, sender = trainer_move, g.trainer
            expect = self.model.expect_live(g.game) or None
        what = f"{kind} move on game {g.game} ({g.status.name})"
        if kind != "wrong_data":  # rejected before any state is read: a call on the pending block
            self._send(fn, sender, lambda t: expect, what)
            return
        before = self.dep.view(g.game)
        self._send(fn, sender, lambda t: expect, what, mine=True)
        after = self.dep.view(g.game)
        volatile = ("trainerTime", "challengerTime")
        changed = sorted(k for k in before if k not in volatile and before[k] != after[k])
        if changed:
            name = "finished_games_frozen" if not g.live else "expectation"
            raise self._violation(name, f"a rejected {kind} move changed game {g.game}: {changed}")

    @rule(
        i=picks,
        what=st.sampled_from(["seconds", "seconds", "deadline", "window", "bound"]),
        seconds=st.one_of(st.integers(1, 100), st.integers(1, 100), st.integers(100, 2000)),
        delta=st.sampled_from([-1, 0, 1]),
    )
    @_step
    def jump(self, i: int, what: str, seconds: int, delta: int) -> None:
        """Time moves on by ``seconds``, or to one second before, at or after a clock deadline, a
        window end or a game bound (the honest sides to move move first)."""
        if what == "window":  # (and an open job's accept deadline: accept and cancel at its edges)
            times = [j.window_end(k) for j in self.model.jobs.values() if j.status == JobStatus.ACTIVE
                     for k in range(len(j.posted))]
            times += [j.accept_deadline for j in self.model.jobs.values() if j.status == JobStatus.OPEN]
        elif what in ("deadline", "bound"):
            times = [g.deadline() if what == "deadline" else g.bound() for g in self.model.live_games()]
        else:
            times = []
        self._jump_to(times[i % len(times)] + delta if times else self.dep.now() + seconds)

    @precondition(lambda self: self.model.games)
    @rule(i=picks, who=st.integers(0, 6), at=boundary)
    @_step
    def claim_timeout(self, i: int, who: int, at: int | None) -> None:
        """Anyone claims a timeout (``at``: first moves time to the mover's deadline + at)."""
        g = self._game(i)
        if at is not None and g.live:
            self._jump_to(g.deadline() + at)
        self._claim_timeout(g, self.accounts[who])

    @precondition(lambda self: self.model.games)
    @rule(i=picks, who=st.integers(0, 6))
    @_step
    def close_game(self, i: int, who: int) -> None:
        games = list(self.model.games.values())
        frozen = [g for g in games if g.live and self.model.jobs[g.job].status == JobStatus.FRAUDULENT]
        self._close(self._pick(games, i, frozen), self.accounts[who])

    @precondition(lambda self: any(j.status == JobStatus.ACTIVE for j in self.model.jobs.values()))
    @rule(i=picks, who=st.integers(0, 6), at=boundary)
    @_step
    def finalize(self, i: int, who: int, at: int | None) -> None:
        """Anyone finalizes (``at``: first moves time to the last window's end + at)."""
        jobs = list(self.model.jobs.values())
        j = self._pick(jobs, i, [x for x in jobs if x.status == JobStatus.ACTIVE and len(x.posted) == x.n_intervals])
        if at is not None and j.posted:
            self._jump_to(j.window_end(len(j.posted) - 1) + at)
        r, _ = self._send(
            self.dep.registry.functions.finalize(j.job), self.accounts[who],
            lambda t: self.model.expect_finalize(j.job, t), f"finalize({j.job})",
        )
        if r is not None:
            self.model.finalize(j.job)
            self.stats.counts["job.finalized"] += 1

    @precondition(lambda self: any(j.status == JobStatus.ACTIVE for j in self.model.jobs.values()))
    @rule(i=picks, who=st.sampled_from(["client"] * 4 + ["trainer", "anyone"]), at=st.sampled_from([0, 1, None, -1]))
    @_step
    def reclaim(self, i: int, who: str, at: int | None) -> None:
        """The client (sometimes the trainer or a third party) reclaims a job, mostly an Active one
        still posting (``at``: first moves time to its next posting deadline + at; on-time
        trainers post first)."""
        jobs = list(self.model.jobs.values())
        active = [x for x in jobs if x.status == JobStatus.ACTIVE]
        j = self._pick(jobs, i, [x for x in active if len(x.posted) < x.n_intervals] or active)
        if at is not None and j.status == JobStatus.ACTIVE and len(j.posted) < j.n_intervals:
            self._jump_to(j.posting_deadline(len(j.posted)) + at)
        self._reclaim(j, {"client": j.client, "trainer": j.trainer, "anyone": self.anyone}[who])

    def _reclaim(self, j: JobModel, sender: str) -> None:
        nxt = len(j.posted)
        r, t = self._send(
            self.dep.registry.functions.reclaimJob(j.job), sender,
            lambda t: self.model.expect_reclaim(j.job, sender, t), f"reclaimJob({j.job})",
        )
        if r is None:
            return
        (ev,) = self.dep.registry.events.JobReclaimed().process_receipt(r, errors=DISCARD)
        want = (j.job, nxt, j.payment + j.bounty())  # the terms, not the model's (sabotaged) credit
        if (got := (int(ev.args.job), int(ev.args.overdue), int(ev.args.refund))) != want:
            raise self._violation("expectation", f"JobReclaimed{got}; expected {want}")
        if (d := self.dep.call(self.dep.registry.functions.postingDeadline(j.job, nxt))) >= t:
            raise self._violation("honest_never_loses", f"job {j.job} reclaimed at t={t}, but interval {nxt} is due "
                                  f"by {d}")
        self.model.reclaim(j.job, t)
        self.stats.counts["job.reclaimed" + ("" if j.honest_posts else ".cheat")] += 1

    @precondition(lambda self: self.model.ledger.total_owed)
    @rule(i=picks, twice=st.booleans())
    @_step
    def withdraw(self, i: int, twice: bool) -> None:
        """An account (mostly one that is owed) withdraws, and sometimes at once again."""
        owed = [a for a in self.accounts if self.model.ledger.owed.get(a, 0)]
        account = self._pick(self.accounts, i, owed)
        self._withdraw(account)
        if twice:
            self._withdraw(account)

    def _withdraw(self, account: str) -> None:
        w3 = self.dep.w3
        self._diligence()
        owed = self.model.ledger.owed.get(account, 0)
        before = w3.eth.get_balance(account)
        r, _ = self._send(
            self.dep.registry.functions.withdraw(), account, lambda t: self.model.expect_withdraw(account),
            f"withdraw by {self.names[account]}", mine=True,
        )
        receipt = r if r is not None else self._last_receipt()
        received = w3.eth.get_balance(account) - before + receipt.gasUsed * receipt.effectiveGasPrice
        if received != (owed if r is not None else 0):
            raise self._violation(
                "paid_once", f"withdraw by {self.names[account]} paid {received} wei; it was owed {owed}"
                + ("" if r is not None else " and the call reverted")
            )
        if r is not None:
            self.model.withdraw(account, received)
            self.stats.counts["withdrawn"] += 1

    # ------------------------------------------------------------------ data availability

    def _da_run(self, job: int) -> D.LogRun:
        if job not in self._da_runs:
            self._da_runs[job] = D.with_logs(self.runs[job])
        return self._da_runs[job]

    def _live_demands(self) -> list[FM.DemandModel]:
        return [d for d in self.model.demands.values() if d.live]

    def _demand(self, j: JobModel, interval: int, pos: int, log: bool, op: int, who: str, delta: int) -> None:
        """``delta``: wei sent beyond bond + fee (0 mostly; else the demand must revert)."""
        run = self.runs[j.job]
        k = min(interval, run.cfg.n_intervals - 1)
        steps = list(run.cfg.interval_steps(k))
        step = steps[pos % len(steps)]
        op %= run.graph.n_ops
        da = self.dep.da.functions
        fn = da.demandLog(j.job, interval, step, op, 0, FM_MAX_TO_INDEX, 0) if log else da.demandStep(
            j.job, interval, step, 0)
        # the fee from the Python mirror of the contract's fee model (a wrong mirror: WrongValue)
        fee = FM.log_fee(0, FM_MAX_TO_INDEX, 0) if log else FM.step_fee(run.cfg.n_slots, run.graph.n_ops)
        value = j.bond + fee + delta
        r, t = self._send(fn, who, lambda t: FM.expect_demand(self.model, j.job, interval, step, value, t, fee),
                          f"demand{'Log' if log else 'Step'}({j.job}, {interval}, {step})", value=value)
        if r is None:
            return
        (ev,) = self.dep.da.events.DemandCreated().process_receipt(r, errors=DISCARD)
        did = int(ev.args.id)
        if did != len(self.model.demands) + 1:
            raise self._violation("expectation", f"demand id {did}, expected {len(self.model.demands) + 1}")
        if int(ev.args.deadline) != t + j.clock:
            raise self._violation("clocks", f"demand {did}: deadline {ev.args.deadline}, expected {t + j.clock}")
        FM.demanded(self.model, FM.DemandModel(did, j.job, interval, step, 2 if log else 1, who, t, j.clock, fee))
        self.demand_ops[did] = op
        self.stats.counts["demand.created" + (".log" if log else ".step")] += 1

    def _answer(self, d: FM.DemandModel, sender: str) -> bool:
        """The job's trainer (or ``sender``) answers ``d`` from its own run; True when accepted."""
        j = self.model.jobs[d.job]
        lr = self._da_run(d.job)
        proof_ok = d.interval < len(j.posted) and j.posted[d.interval] == lr.run.interval_roots[d.interval]
        # a trainer whose committed step leaf names another step number (the ``step_leaf`` cheat) cannot
        # prove that leaf as step ``d.step``'s: its answer reverts and the demand times out
        proof_ok = proof_ok and C.decode_step_leaf(self.runs[d.job].steps[d.step].leaf)[0] == d.step
        da = self.dep.da.functions
        leaves = 0
        if d.kind == 1:
            fn = da.answerStep(d.demand, *D.step_args(lr, d.interval, d.step))
        else:
            op = self.demand_ops[d.demand]
            run_args = D.answer_run_for(lr, d.interval, d.step, op, 0, FM_MAX_TO_INDEX, 0)
            leaves = len(run_args[7]) // 9  # the answer earns the fee of the leaves it publishes
            fn = da.answerLog(d.demand, run_args)
        r, t = self._send(fn, sender, lambda t: FM.expect_answer(self.model, d, sender, t, proof_ok),
                          f"answer({d.demand})", mine=True)
        if r is None:
            return False
        FM.answered(self.model, d, t, leaves)
        d.returned = self._credited(r, d.demander)
        earned = self._credited(r, j.trainer) if d.demander != j.trainer else None
        # griefing costs the demander: the trainer's answer is paid at least its gas at the fee's price
        if earned is not None and earned < r.gasUsed * H.DA_FEE_GAS_PRICE:
            raise self._violation("fee_covers_gas", f"answer {d.demand} used {r.gasUsed} gas, the trainer earned "
                                  f"{earned} wei ({earned // H.DA_FEE_GAS_PRICE} gas at the fee's price)")
        if (end := self.dep.call(self.dep.registry.functions.windowEnd(d.job, d.interval))) != j.window_end(d.interval):
            raise self._violation("expectation", f"windowEnd({d.job}, {d.interval}) is {end} after answer "
                                  f"{d.demand}, model {j.window_end(d.interval)}")
        self.stats.counts["demand.answered"] += 1
        return True

    def _answer_urgent_demand(self, horizon: int) -> bool:
        """An honest trainer answers its open demand closest to its deadline, once that falls
        before ``horizon`` + RESERVE. True when it answered one."""
        urgent = [d for d in self._live_demands() if self.model.jobs[d.job].status == JobStatus.ACTIVE
                  and self.model.jobs[d.job].honest_posts and d.deadline() <= horizon + RESERVE]
        if not urgent:
            return False
        d = min(urgent, key=FM.DemandModel.deadline)
        if not self._answer(d, self.model.jobs[d.job].trainer):
            raise self._violation("honest_never_loses", f"the honest trainer of job {d.job} cannot answer demand "
                                  f"{d.demand} by {d.deadline()}")
        self.stats.counts["demand.answered.diligent"] += 1
        return True

    def _demand_timeout(self, d: FM.DemandModel, sender: str) -> None:
        r, _ = self._send(self.dep.da.functions.claimTimeout(d.demand), sender,
                          lambda t: FM.expect_demand_timeout(self.model, d, t), f"demandTimeout({d.demand})")
        if r is not None:
            FM.demand_timed_out(self.model, d)
            d.returned = self._credited(r, d.demander)
            self.stats.counts["demand.timed_out"] += 1

    def _close_demand(self, d: FM.DemandModel, sender: str) -> None:
        r, _ = self._send(self.dep.da.functions.closeDemand(d.demand), sender,
                          lambda t: FM.expect_close_demand(self.model, d), f"closeDemand({d.demand})")
        if r is not None:
            FM.demand_closed(self.model, d)
            d.returned = self._credited(r, d.demander)
            self.stats.counts["demand.closed"] += 1

    def _drain_demands(self) -> None:
        for _ in range(3 * len(self.model.demands) + 5):
            live = self._live_demands()
            if not live:
                return
            d = min(live, key=FM.DemandModel.deadline)
            if self.model.jobs[d.job].status == JobStatus.FRAUDULENT:
                self._close_demand(d, self.anyone)
            elif self.dep.now() <= d.deadline():
                self._jump_to(d.deadline() + 1)  # an honest trainer answers first
            else:
                self._demand_timeout(d, self.anyone)
        raise self._violation("games_end", f"demands {[d.demand for d in self._live_demands()]} open after draining")

    @precondition(lambda self: len(self._live_demands()) < MAX_LIVE_DEMANDS
                  and any(j.posted for j in self.model.jobs.values()))
    @rule(i=picks, interval=st.integers(0, 3), pos=st.integers(0, 3), log=st.booleans(), op=st.integers(0, 9),
          who=st.integers(0, 6), delta=st.sampled_from([0, 0, 0, 0, 1]), at=boundary)
    @_step
    def demand(self, i: int, interval: int, pos: int, log: bool, op: int, who: int, delta: int,
               at: int | None) -> None:
        """Anyone demands a step record or an op log of a posted interval (``at``: first moves time
        to the interval's unextended window end + at; 3: the next, unposted interval)."""
        jobs = [j for j in self.model.jobs.values() if j.posted]
        j = self._pick(jobs, i, [x for x in jobs if x.status == JobStatus.ACTIVE])
        interval = interval % len(j.posted) if interval < 3 else len(j.posted)
        if at is not None and interval < len(j.posted):
            self._jump_to(j.base_window_end(interval) + at)
        self._demand(j, interval, pos, log, op, self.accounts[who], delta)

    @precondition(lambda self: self.model.demands)
    @rule(i=picks, as_trainer=st.sampled_from([True, True, True, False]))
    @_step
    def answer(self, i: int, as_trainer: bool) -> None:
        """The trainer (sometimes someone else) answers a demand, mostly an open one."""
        demands = list(self.model.demands.values())
        d = self._pick(demands, i, [x for x in demands if x.live])
        self._answer(d, self.model.jobs[d.job].trainer if as_trainer else self.anyone)

    @precondition(lambda self: self.model.demands)
    @rule(i=picks, who=st.integers(0, 6), at=boundary)
    @_step
    def demand_timeout(self, i: int, who: int, at: int | None) -> None:
        """Anyone claims a demand's timeout (``at``: first moves time to its deadline + at)."""
        demands = list(self.model.demands.values())
        d = self._pick(demands, i, [x for x in demands if x.live])
        if at is not None and d.live:
            self._jump_to(d.deadline() + at)
        self._demand_timeout(d, self.accounts[who])

    @precondition(lambda self: self.model.demands)
    @rule(i=picks, who=st.integers(0, 6))
    @_step
    def close_demand(self, i: int, who: int) -> None:
        demands = list(self.model.demands.values())
        frozen = [d for d in demands if d.live and self.model.jobs[d.job].status == JobStatus.FRAUDULENT]
        self._close_demand(self._pick(demands, i, frozen), self.accounts[who])

    def check_demands(self) -> None:
        """Each demand's status is the model's; an open one ends by its deadline (claimTimeout, or
        closeDemand on a fraudulent job, succeeds past it); every ended demand returned at least
        the demander's bond."""
        self.stats.checks += 1
        d_, m = self.dep, self.model
        now = d_.now()
        for d in m.demands.values():
            chain = DEMAND_STATUS[int(d_.call(d_.da.functions.getDemand(d.demand))[4])]
            if chain != d.status:
                raise self._violation("expectation", f"demand {d.demand} is {chain} on chain, {d.status} in model")
            bond = m.jobs[d.job].bond
            if not d.live and (d.returned or 0) < bond:
                raise self._violation("honest_never_loses", f"demand {d.demand} ({d.status}) returned {d.returned} "
                                      f"wei, less than its bond {bond}")
            if d.live and now > d.deadline():
                status = m.jobs[d.job].status
                fn = d_.da.functions.claimTimeout if status == JobStatus.ACTIVE else d_.da.functions.closeDemand
                try:
                    d_.dry(fn(d.demand), self.anyone)
                except Reverted as e:
                    raise self._violation("games_end", f"demand {d.demand} open at t={now} past its deadline "
                                          f"{d.deadline()} and {fn.fn_name} reverts {e}") from None

    demand_again = demand
    answer_again = answer

    # Rules that drive games are drawn twice as often as the others (hypothesis draws uniformly
    # among rules whose precondition holds).
    challenge_again = challenge
    move_again = move
    play_out_again = play_out
    bad_move_again = bad_move
    claim_timeout_again = claim_timeout
    reclaim_again = reclaim

    # ------------------------------------------------------------------ invariants

    @invariant()
    def invariants(self) -> None:
        now = self.dep.now()
        for j in self.model.jobs.values():
            j.see(now)
        self.check_solvency(full=False)
        self.check_paid_once()
        self.check_honest_never_loses()
        self.check_games_end()
        self.check_finished_games_frozen()
        self.check_demands()
        self.clean = True

    def check_solvency(self, full: bool) -> None:
        """The registry holds exactly what is owed plus escrow; the chain's credits and job records
        are the model's (the accounts and jobs touched since the last check, or all)."""
        self.stats.checks += 1
        d, m = self.dep, self.model
        owed, escrow, burned = m.ledger.total_owed, m.escrow_total(), m.ledger.burned
        balance = d.w3.eth.get_balance(d.registry.address)
        if balance != owed + burned + escrow:
            raise self._violation(
                "solvency", f"registry holds {balance} wei; the model says owed {owed} + burned {burned} + escrow "
                f"{escrow} = {owed + burned + escrow} (difference {balance - owed - burned - escrow})"
            )
        if (chain_burned := d.call(d.registry.functions.totalBurned())) != burned:
            raise self._violation("solvency", f"totalBurned is {chain_burned}; the model's convictions burned {burned}")
        for g in m.games.values():
            j = m.jobs[g.job]
            if g.status == GameStatus.CHALLENGER_WON and g.returned != j.bond + j.bounty():
                raise self._violation("solvency", f"the winner of game {g.game} was credited {g.returned} wei, not "
                                      f"its bond + the bounty ({j.bond} + {j.bounty()}): a sybil gets only the bounty")
        if (held := d.w3.eth.get_balance(d.game.address)) != 0:
            raise self._violation("solvency", f"the game contract holds {held} wei")
        if (total := d.call(d.registry.functions.totalOwed())) != owed:
            raise self._violation("solvency", f"totalOwed is {total}; the model's credits sum to {owed}")
        for account in self.accounts if full else sorted(m.ledger.touched):
            if (chain := d.owed(account)) != (model := m.ledger.owed.get(account, 0)):
                raise self._violation("solvency", f"{self.names[account]} is owed {chain} on chain, {model} in model")
        for job in m.jobs if full else sorted(m.touched_jobs):
            j = m.jobs[job]
            if full:
                rec = d.job(job)
                got = (JobStatus(rec["status"]), rec["openGames"], rec["nextInterval"], rec["payment"])
                want: tuple[Any, ...] = (j.status, j.open_games, len(j.posted), j.payment)
            else:
                got, want = (d.job_status(job),), (j.status,)
            if got != want:
                raise self._violation("solvency", f"job {job}'s record (status, openGames, nextInterval, payment) "
                                      f"is {got} on chain, {want} in the model")
            if (e := d.call(d.registry.functions.escrowOf(job))) != j.escrow(m.sabotage):
                raise self._violation("solvency", f"escrowOf({job}) is {e}; the model says {j.escrow(m.sabotage)}")
        m.ledger.touched.clear()
        m.touched_jobs.clear()

    def check_paid_once(self) -> None:
        """ETH received + still owed is exactly what was credited; nothing leaves twice."""
        self.stats.checks += 1
        L, escrow = self.model.ledger, self.model.escrow_total()
        for account in sorted(set(L.credited) | set(L.withdrawn)):
            got, owed, credited = L.withdrawn.get(account, 0), L.owed.get(account, 0), L.credited.get(account, 0)
            if got + owed != credited:
                raise self._violation(
                    "paid_once", f"{self.names[account]} received {got} + is owed {owed} = {got + owed} wei but was "
                    f"credited {credited}"
                )
        if L.total_withdrawn + L.total_owed + L.burned + escrow != L.deposited:
            raise self._violation(
                "paid_once", f"withdrawn {L.total_withdrawn} + owed {L.total_owed} + burned {L.burned} + escrow "
                f"{escrow} != deposited {L.deposited}"
            )

    def check_honest_never_loses(self) -> None:
        self.stats.checks += 1
        m = self.model
        for j in m.jobs.values():
            if j.honest_trainer and j.status == JobStatus.FRAUDULENT:
                raise self._violation("honest_never_loses", f"job {j.job}'s trainer posted only honest roots, each "
                                      "on time, and lost its stake (job Fraudulent)")
            if j.honest_posts and j.status == JobStatus.FRAUDULENT and not j.reclaimed:
                raise self._violation("honest_never_loses", f"job {j.job}'s trainer posted only honest roots and "
                                      "lost a game")
            if j.job in self.on_time and j.honest_posts and j.late:
                raise self._violation("honest_never_loses", f"the on-time trainer of job {j.job} missed a posting "
                                      "deadline")
        for g in m.games.values():
            if m.claims_honest_challenger(g) and g.status == GameStatus.TRAINER_WON:
                raise self._violation("honest_never_loses", f"the honest challenger of game {g.game} (job {g.job}, "
                                      f"interval {g.interval}) lost its bond")
            if g.honest_challenger and not g.live and (g.returned or 0) < m.jobs[g.job].bond:
                raise self._violation("honest_never_loses", f"the honest challenger of game {g.game} "
                                      f"({g.status.name}) got {g.returned} wei back, less than its bond")

    def check_games_end(self) -> None:
        self.stats.checks += 1
        d, m = self.dep, self.model
        now = d.now()
        for g in m.live_games():
            status = m.jobs[g.job].status
            bound = g.bound(m.sabotage)
            if status not in (JobStatus.ACTIVE, JobStatus.FRAUDULENT):
                raise self._violation("games_end", f"game {g.game} is live on job {g.job} in status {status.name}")
            if status == JobStatus.ACTIVE and g.deadline() > bound:
                raise self._violation("games_end", f"game {g.game}: the side to move has until {g.deadline()}, past "
                                      f"the game's bound {bound}")
            if now > bound:
                fn = d.game.functions.claimTimeout if status == JobStatus.ACTIVE else d.game.functions.closeGame
                try:
                    d.dry(fn(g.game), self.anyone)
                except Reverted as e:
                    raise self._violation(
                        "games_end", f"game {g.game} is live at t={now} > bound {bound} and {fn.fn_name} reverts {e}"
                    ) from None

    def check_finished_games_frozen(self) -> None:
        self.stats.checks += 1
        d, m = self.dep, self.model
        gf = d.game.functions
        for gid in m.finished:
            g = m.games[gid]
            tries = [
                (gf.claimTimeout(gid), self.anyone), (gf.closeGame(gid), self.anyone),
                (gf.reveal(gid, b"\x01" * 32, b"\x02" * 32), g.trainer), (gf.choose(gid, False), g.challenger),
                (gf.oneStep(gid, b"", [], b""), g.trainer),
            ]
            for fn, sender in tries:
                try:
                    d.dry(fn, sender)
                except Reverted as e:
                    if e.name != "GameOver":
                        raise self._violation("finished_games_frozen", f"{fn.fn_name} on finished game {gid} "
                                              f"({g.status.name}) reverts {e}, not GameOver") from None
                    continue
                raise self._violation("finished_games_frozen", f"{fn.fn_name} on finished game {gid} "
                                      f"({g.status.name}) succeeded")
        m.finished.clear()

    # ------------------------------------------------------------------ end of a sequence

    def teardown(self) -> None:
        if self.clean:
            self.drain()

    def drain(self) -> None:
        """Ends every game, settles every job that can be, withdraws everything; then the
        registry holds exactly the escrow of the jobs left Open-less and unfinished."""
        d, m = self.dep, self.model
        self._drain_demands()
        for _ in range(4 * len(m.games) + 10):
            live = m.live_games()
            if not live:
                break
            g = min(live, key=GameModel.deadline)
            if m.jobs[g.job].status == JobStatus.FRAUDULENT:
                self._close(g, self.anyone)
            elif not g.expired(d.now()):
                self._jump_to(g.deadline() + 1)  # the honest side (if to move) moves first
            else:
                self._claim_timeout(g, self.anyone)
        else:
            raise self._violation("games_end", f"games {[g.game for g in m.live_games()]} still live after draining")
        self._drain_demands()
        now = self._diligence()  # reclaimJob waits for open games: reclaim once they are over
        for j in list(m.jobs.values()):
            if j.overdue(now):
                self._reclaim(j, j.client)
        self.check_solvency(full=False)  # the reclaims' credits, before anything is withdrawn
        offers = [j.accept_deadline for j in m.jobs.values() if j.status == JobStatus.OPEN]
        if offers:  # the client may cancel once the trainer can no longer accept
            self._jump_to(max(d.now(), max(offers) + 1))
        for j in m.jobs.values():
            if j.status == JobStatus.OPEN:
                self._send(
                    d.registry.functions.cancelJob(j.job), j.client,
                    lambda t, j=j: m.expect_cancel(j.job, j.client, t), f"drain cancelJob({j.job})",
                )
                m.cancel(j.job)
        done = [j for j in m.jobs.values() if j.status == JobStatus.ACTIVE and len(j.posted) == j.n_intervals]
        if done:
            self._jump_to(max(j.finalize_after() for j in done) + 1)
            for j in done:
                self._send(
                    d.registry.functions.finalize(j.job), self.anyone,
                    lambda t, j=j: m.expect_finalize(j.job, t), f"drain finalize({j.job})",
                )
                m.finalize(j.job)
        for account in self.accounts:
            if m.ledger.owed.get(account, 0):
                self._withdraw(account)
        self.check_solvency(full=True)
        self.check_paid_once()
        self.check_honest_never_loses()
        self.check_finished_games_frozen()
        left = sum(j.escrow() for j in m.jobs.values()) + m.ledger.burned
        if m.ledger.total_owed or d.w3.eth.get_balance(d.registry.address) != left:
            raise self._violation("solvency", f"after draining the registry holds "
                                  f"{d.w3.eth.get_balance(d.registry.address)} wei, expected {left}")
        d.check_solvency()  # the harness's own check, from Credited/Withdrawn events
        self.stats.counts["drained"] += 1


# ---------------------------------------------------------------------- tests

COMMON = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    "print_blob": False,
}
FAST = settings(max_examples=10, stateful_step_count=20, **COMMON)
#: The contracts machine's small budget: enough sequences to reach every outcome the test asserts
#: (reclaims included) from its fixed seed (see ``contract_machine``).
FAST_CONTRACTS = settings(max_examples=24, stateful_step_count=20, **COMMON)
SLOW = settings(max_examples=200, stateful_step_count=40, **COMMON)


def reclaims(stats: Stats) -> int:
    """Jobs reclaimed (successful reclaimJob calls) in ``stats``."""
    return stats.counts["job.reclaimed"] + stats.counts["job.reclaimed.cheat"]


def contract_machine() -> ContractMachine:
    """The machine's factory. Hypothesis derives a derandomized run's seed from the factory's
    source: this function's is fixed, so editing the machine does not reshuffle the budgets'
    sequences (with the class itself as the factory, the seed changed with every edit)."""
    return ContractMachine()


def run_fuzz(name: str, budget: settings) -> Stats:
    """Runs the machine under ``budget``, records the trial and returns its counts."""
    stats = Stats()
    ContractMachine.stats = stats
    start = time.perf_counter()
    try:
        run_state_machine_as_test(contract_machine, settings=budget)
    except Exception:
        stats.violations += 1
        raise
    finally:
        seconds = round(time.perf_counter() - start, 1)
        security_report.record(
            "fuzz", name, stats.violations == 0, sequences=stats.sequences, steps=stats.steps,
            checks=stats.checks, violations=stats.violations, seconds=seconds, reclaims=reclaims(stats),
        )
        log.info("fuzz %s: %d sequences, %d steps, %d invariant checks, %d reclaims, %d violations, %.1f s; %s",
                 name, stats.sequences, stats.steps, stats.checks, reclaims(stats), stats.violations, seconds,
                 dict(stats.counts))
    return stats


_FRESH_PROCESS_FUZZ = """
import dataclasses, json, sys
sys.path[:0] = ["tests", "."]
import test_fuzz_contracts as T
stats = T.run_fuzz("contracts_small", T.FAST_CONTRACTS)
print(json.dumps({**dataclasses.asdict(stats), "counts": dict(stats.counts)}))
"""


def run_fuzz_in_fresh_process() -> Stats:
    """:func:`run_fuzz` of the small budget in a new interpreter. The draws of a derandomized run are
    fixed for a fresh process (26 sequences, 357 steps, 6 reclaims here, run after run), but tests run
    before it in the same process changed them (after the front-end zoo's tests: 403 steps and no
    reclaim, so the budget's coverage claim failed only inside the full suite)."""
    p = subprocess.run([sys.executable, "-c", _FRESH_PROCESS_FUZZ], cwd=Path(__file__).resolve().parent.parent,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-6000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    return Stats(got["sequences"], got["steps"], got["checks"], got["violations"], Counter(got["counts"]))


def test_fuzz_contracts_small_budget():
    stats = run_fuzz_in_fresh_process()
    assert stats.sequences >= FAST_CONTRACTS.max_examples and stats.violations == 0
    # The budget reaches games that end (not only reverts): a sequence that never plays is no test.
    assert stats.counts["game.created"] + stats.counts["game.created.honest_challenger"] > 0, stats.counts
    assert stats.counts["drained"] == stats.sequences, stats.counts
    # ... and reclaims that succeed (the job's games then close with their bonds back).
    assert reclaims(stats) > 0, stats.counts


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fuzz_contracts_large_budget():
    stats = run_fuzz("contracts_large", SLOW)
    assert stats.sequences >= SLOW.max_examples and stats.violations == 0


demands = st.fixed_dictionaries(
    {"interval": st.integers(0, 2), "pos": st.integers(0, 3), "log": st.booleans(), "op": st.integers(0, 9),
     "who": st.integers(0, 6)}
)


class DemandMachine(ContractMachine):
    """The machine with data-availability demands on the first job from the start (posted intervals,
    inside their windows), so that answers, timeouts, closes and extended windows are reached."""

    @initialize(specs=st.lists(job_specs, min_size=1, max_size=2), ds=st.lists(demands, min_size=1, max_size=3),
                games=st.lists(challenges, min_size=0, max_size=2))
    @_step
    def ready_jobs(self, specs: list[dict[str, Any]], ds: list[dict[str, Any]],  # type: ignore[override]
                   games: list[dict[str, Any]]) -> None:
        """As ContractMachine.ready_jobs (every interval posted), then demands on the first job."""
        for spec in specs:
            spec = {**spec, "window": max(spec["window"], H.MIN_WINDOW), "clock": max(spec["clock"], MIN_CLOCK),
                    "posting": max(spec["posting"], H.MIN_POSTING), "bond": max(spec["bond"], H.MIN_BOND)}
            j = self._create(spec)
            assert j is not None
            self._accept(j, j.trainer, j.stake)
            for i in range(j.n_intervals):
                self._post(j, j.trainer, i, self.runs[j.job].interval_roots[i])
        j = self.model.jobs[1]
        for d in ds:
            self._demand(j, d["interval"] % len(j.posted), d["pos"], d["log"], d["op"], self.accounts[d["who"]], 0)
        for c in games:
            self._challenge(j, c)


@pytest.mark.slow  # ~35 s; the demand machine still runs in the default suite through its sabotages
def test_fuzz_demands_small_budget():
    stats = Stats()
    machine = type("DemandFuzz", (DemandMachine,), {"stats": stats})
    run_state_machine_as_test(machine, settings=FAST)
    security_report.record("fuzz", "demands_small", stats.violations == 0, sequences=stats.sequences,
                           steps=stats.steps, checks=stats.checks, violations=stats.violations)
    log.info("fuzz demands_small: %s", dict(stats.counts))
    c = stats.counts
    assert c["demand.created.step"] + c["demand.created.log"] > 0, c
    assert c["demand.answered"] > 0 and c["drained"] == stats.sequences, c


#: Budget for the sabotage runs: a failure is reported as found, not shrunk. A run stops at its first
#: violation (a few sequences when the sabotage is found), so the cap costs time only when it is not;
#: 60, not 20: the floor sabotage was missed once within 20 in a full suite on a loaded machine
#: (sequences that depend on the chain's clock draw other terms there), and passed alone.
SABOTAGE_BUDGET = settings(FAST, max_examples=60, stateful_step_count=20, phases=[HPhase.generate])


def _slow(*args: str):
    """A sabotage whose run takes 5-35 s to find it: checked with ``-m slow`` (the default suite keeps
    one sabotage of each of solvency, paid_once, honest_never_loses and games_end)."""
    return pytest.param(*args, marks=pytest.mark.slow)


@pytest.mark.parametrize(
    "sabotage,invariant",
    [
        ("escrow", "solvency"),
        ("double_pay", "paid_once"),
        ("honest", "honest_never_loses"),
        ("bound", "games_end"),
        _slow("frozen", "finished_games_frozen"),
        _slow("reclaim", "solvency"),
        _slow("bounty", "solvency"),
        _slow("burn", "solvency"),
        _slow("floor", "expectation"),
        ("schedule", "expectation"),
    ],
)
def test_fuzzer_finds_a_deliberately_wrong_expectation(sabotage, invariant):
    """Each invariant can fail: with one expectation broken on purpose, the fuzzer reports it."""
    machine = type(f"Sabotaged_{sabotage}", (ContractMachine,), {"SABOTAGE": sabotage, "stats": Stats()})
    with pytest.raises(Violation) as info:
        run_state_machine_as_test(machine, settings=SABOTAGE_BUDGET)
    assert info.value.invariant == invariant, str(info.value)
    assert f"INVARIANT {invariant} violated" in str(info.value)
    log.info("sabotage %s found after %d sequences, %d steps: %s", sabotage, machine.stats.sequences,
             machine.stats.steps, info.value)


@pytest.mark.parametrize("sabotage,invariant", [("demand_escrow", "solvency"), _slow("extension", "expectation"),
                                                ("demand_fee", "solvency")])
def test_fuzzer_finds_a_deliberately_wrong_demand_expectation(sabotage, invariant):
    """The data-availability rules can fail too: a model that forgets demand bonds or window
    extensions is caught."""
    machine = type(f"Sabotaged_{sabotage}", (DemandMachine,), {"SABOTAGE": sabotage, "stats": Stats()})
    with pytest.raises(Violation) as info:
        run_state_machine_as_test(machine, settings=SABOTAGE_BUDGET)
    assert info.value.invariant == invariant, str(info.value)
