"""The attack matrix: one row per attack, run against the real contracts on eth-tester (the game
harness's actors, real Merkle proofs) or, for agent behaviours, against the real agents.

Each row asserts its expected outcome -- the honest side wins, the cheating side's stake or bond
is lost, every wei is accounted for (the solvency invariant, also checked after every test by the
``dep`` fixture) -- and records the trial with ``security_report.record("attack", name, ok)``
(read by ``scripts/bench_security.py``). The table with the defence of each row is
``docs/security.md``. Long rows are marked slow; a fast subset runs by default.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import game_harness as H
import pytest
from game_harness import Cheat, GameStatus, JobStatus, Party, Phase, Reverted, Ruling, label_of, reverts
from security_report import trial

#: Two full intervals of 4 steps (an old interval root fits the next interval's slot), 2 slots.
CFG = H.JobConfig(n_steps=8, interval_length=4)
#: The cheating run of the game rows: one element of update0 off at step 6 (interval 1).
ELEMENT_CHEAT = Cheat("element", step=6, op="update0", index=5)
#: Most seconds one game may last: both chess clocks plus one second per mined move.
GAME_BOUND = 2 * CFG.clock + 100


@pytest.fixture(scope="module")
def honest() -> H.Run:
    return H.simulate(CFG)


@pytest.fixture(scope="module")
def cheater() -> H.Run:
    return H.simulate(CFG, ELEMENT_CHEAT)


def fraud_settled(dep: H.Deployment, job: int, challenger: str, fee: int = 0) -> None:
    """Challenger won the first game: its bond back and the bounty (half the stake; the rest burned),
    the payment back to the client, the trainer gets nothing; what the job still holds is the
    bonds of its other open games. ``fee``: a winning demand's answer fee, refunded with them."""
    assert dep.job_status(job) == JobStatus.FRAUDULENT
    assert dep.owed(challenger) == CFG.challenger_bond + H.bounty(CFG.trainer_stake) + fee
    assert dep.owed(dep.client) == CFG.payment
    assert dep.owed(dep.trainer) == 0
    escrow = dep.call(dep.registry.functions.escrowOf(job))
    assert escrow == dep.job(job)["openGames"] * CFG.challenger_bond
    dep.check_solvency()


# ================================================================== posting attacks


POSTING = [
    # name, interval posted before, index, which root, expected error
    ("post-twice", 1, 0, 0, "WrongInterval"),
    ("post-out-of-order", 0, 1, 1, "WrongInterval"),
    ("post-past-last-interval", 2, 2, 0, "WrongInterval"),
    ("post-zero-root", 0, 0, None, "ZeroRoot"),
]


@pytest.mark.parametrize("name,before,index,root,error", POSTING, ids=[p[0] for p in POSTING])
def test_trainer_posting_out_of_protocol_is_rejected(dep, honest, name, before, index, root, error):
    with trial(name):
        job = H.active_job(dep, honest, post=False)
        H.post_intervals(dep, job, honest, upto=before)
        value = b"\0" * 32 if root is None else honest.interval_roots[root]
        with reverts(error):
            dep.tx(dep.registry.functions.postInterval(job, index, value), dep.trainer)
        assert dep.job(job)["nextInterval"] == before
        assert [dep.call(dep.registry.functions.getInterval(job, i))[0] for i in range(before)] == (
            honest.interval_roots[:before]
        )


def test_trainer_replaying_an_old_interval_root_loses_the_game(dep, honest):
    """Interval 1 posted with interval 0's root (the chain cannot tell; the auditor's replay can):
    the trainer cannot open step 5 from a tree of steps 1..4 and loses on time."""
    with trial("replay-old-interval-root"):
        replayed = replace(honest, interval_trees=[honest.interval_trees[0], honest.interval_trees[0]])
        job = H.active_job(dep, replayed)
        ch = H.HonestChallenger(dep, honest)
        assert ch.first_bad_interval(replayed.interval_roots) == 1
        gid = H.challenge(dep, job, 1)
        res = H.play(dep, gid, H.Trainer(dep, replayed), ch)
        assert (res.status, res.ruling) == (GameStatus.CHALLENGER_WON, Ruling.TIMEOUT)
        assert res.stuck is not None and res.stuck.name == "HashMismatch"
        fraud_settled(dep, job, dep.challenger)


# ================================================================== posting deadline (gap a)


def test_trainer_that_never_posts_loses_its_stake(dep, honest):
    with trial("trainer-never-posts"):
        job = H.active_job(dep, honest, post=False)
        reg = dep.registry.functions
        deadline = dep.call(reg.postingDeadline(job, 0))
        assert deadline == dep.job(job)["acceptedAt"] + CFG.posting_period
        dep.at(deadline)  # the deadline's last second still belongs to the trainer
        with reverts("PostingNotOverdue", job, 0, deadline, deadline):
            dep.dry(reg.reclaimJob(job), dep.client)
        dep.at(deadline + 1)
        with reverts("Unauthorized", dep.anyone, dep.client):
            dep.dry(reg.reclaimJob(job), dep.anyone)
        dep.tx(reg.reclaimJob(job), dep.client)
        (ev,) = dep.events(dep.registry, "JobReclaimed")
        refund = CFG.payment + H.bounty(CFG.trainer_stake)  # the client may be the trainer's sybil
        assert (ev.job, ev.overdue, ev.refund) == (job, 0, refund)
        assert dep.job_status(job) == JobStatus.FRAUDULENT
        assert dep.owed(dep.client) == refund and dep.owed(dep.trainer) == 0
        assert dep.call(reg.totalBurned()) == CFG.trainer_stake - H.bounty(CFG.trainer_stake)
        with reverts("WrongJobStatus"):
            dep.dry(reg.postInterval(job, 0, honest.interval_roots[0]), dep.trainer)
        with reverts("WrongJobStatus"):
            dep.dry(reg.reclaimJob(job), dep.client)
        dep.tx(reg.withdraw(), dep.client)
        assert dep.call(reg.escrowOf(job)) == 0
        dep.check_solvency()


def test_trainer_that_stops_posting_mid_game_is_convicted_by_the_game_not_the_client(dep):
    """A cheating trainer stops posting while an honest challenger's game runs: the client cannot
    reclaim (GamesOpen: the stake would go to the client, perhaps the trainer's sybil); the game
    ends on the trainer's clock and its challenger takes the bounty."""
    with trial("trainer-stops-posting"):
        cheater = H.simulate(CFG, Cheat("element", step=2, op="update0", index=5))  # interval 0 wrong
        job = H.active_job(dep, cheater, post=False)
        reg = dep.registry.functions
        H.post_intervals(dep, job, cheater, upto=1)
        gid = H.challenge(dep, job, 0)  # the honest challenge in progress when the job is overdue
        deadline = dep.call(reg.postingDeadline(job, 1))
        assert deadline == dep.job(job)["acceptedAt"] + 2 * CFG.posting_period
        dep.at(deadline + 1)
        with reverts("GamesOpen", job, 1):
            dep.dry(reg.reclaimJob(job), dep.client)
        dep.tx(dep.game.functions.claimTimeout(gid), dep.challenger)  # the trainer never answered
        fraud_settled(dep, job, dep.challenger)
        with reverts("WrongJobStatus"):
            dep.dry(reg.reclaimJob(job), dep.client)
        assert dep.call(reg.escrowOf(job)) == 0
        dep.check_solvency()


def test_honest_trainer_on_time_cannot_be_reclaimed(dep, honest):
    with trial("client-reclaims-honest-job"):
        job = H.active_job(dep, honest, post=False)
        reg = dep.registry.functions
        # interval 0 late but posted before the client acted: the next deadline applies
        dep.at(dep.call(reg.postingDeadline(job, 0)) + 5)
        H.post_intervals(dep, job, honest, upto=1)
        with reverts("PostingNotOverdue", job, 1):
            dep.dry(reg.reclaimJob(job), dep.client)
        H.post_intervals(dep, job, honest)
        dep.at(dep.call(reg.postingDeadline(job, 5)) + 1)  # long after every deadline
        with reverts("PostingNotOverdue", job, 2):
            dep.dry(reg.reclaimJob(job), dep.client)
        dep.tx(reg.finalize(job), dep.anyone)
        assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake
        dep.check_solvency()


# ================================================================== terms and economics (issue 12)


def test_trainer_challenging_itself_through_a_sybil_recovers_only_the_bounty(dep, honest, cheater):
    """The cheating trainer's own second account challenges the bad interval first and wins (the
    trainer plays along): before, it recovered the whole stake. Now the pair gets the bond and the
    bounty back and loses stake - bounty (burned); the honest auditor's parallel game closes with
    its bond back; the client is refunded."""
    with trial("trainer-self-challenge-via-sybil"):
        sybil, auditor = dep.challenger2, dep.challenger
        job = H.active_job(dep, cheater)
        mine = H.challenge(dep, job, 1, challenger=sybil)
        theirs = H.challenge(dep, job, 1, challenger=auditor)
        res = H.play(dep, mine, H.Trainer(dep, cheater), H.HonestChallenger(dep, honest, addr=sybil))
        assert res.status == GameStatus.CHALLENGER_WON
        dep.tx(dep.game.functions.closeGame(theirs), dep.anyone)
        bounty = H.bounty(CFG.trainer_stake)
        put_in = CFG.trainer_stake + CFG.challenger_bond  # by the trainer and its sybil
        got_back = dep.owed(dep.trainer) + dep.owed(sybil)
        assert got_back == CFG.challenger_bond + bounty
        assert put_in - got_back == CFG.trainer_stake - bounty == dep.call(dep.registry.functions.totalBurned())
        assert dep.owed(auditor) == CFG.challenger_bond  # the honest auditor loses nothing
        assert dep.owed(dep.client) == CFG.payment
        dep.check_solvency()


class LateTrainer(H.Trainer):
    """An honest trainer whose every move lands ``late`` seconds after its turn began (a slow
    machine, a congested chain)."""

    late = 5

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        self.dep.at(max(self.dep.now(), v["deadline"] - v["trainerTime"] + self.late))
        return super().move(gid, v)


def test_client_colluding_with_a_challenger_cannot_set_a_one_second_clock(dep, honest):
    """A client colluding with a false challenger used to pick a 1 s clock: the honest trainer's
    first reply, one block late, lost on timeout. The registry now refuses such a job; at the
    floor (100 s here, 1 h in production) a trainer whose every move lands 5 s late wins."""
    with trial("client-colluding-challenger-1s-clock"):
        with reverts("TermBelowFloor", "clock", 1, H.MIN_CLOCK):
            dep.dry(dep.registry.functions.createJob(H.simulate(replace(CFG, clock=1)).job_params(dep.trainer)),
                    dep.client)
        short = H.simulate(replace(CFG, clock=H.MIN_CLOCK))
        job = H.active_job(dep, short)
        gid = H.challenge(dep, job, 0)
        colluder = H.FalseChallenger(dep, position=-1, op=short.graph.index["update0"], element=100)
        res = H.play(dep, gid, LateTrainer(dep, short), colluder)
        assert (res.status, res.ruling) == (GameStatus.TRAINER_WON, Ruling.ADJUDICATED), res
        trainer_moves = ("reveal", "openStep", "commitTrace", "openOp", "openChunk")
        moves = sum(1 for name, _ in dep.gas_log if name in trainer_moves)
        assert moves >= 5 and dep.view(gid)["trainerTime"] <= H.MIN_CLOCK - LateTrainer.late * moves
        assert dep.owed(dep.trainer) == CFG.challenger_bond and dep.owed(dep.challenger) == 0


def test_copycat_challenger_that_wins_first_takes_the_bounty_and_the_original_loses_nothing(dep, honest, cheater):
    """A copycat mirrors an honest auditor in a parallel game; the trainer answers the copycat's
    game and stalls the auditor's, so the copycat convicts first. It gets bond + bounty; the
    auditor's game closes with its bond back; the trainer loses stake - bounty either way (a
    known limit: the bounty goes to the first conviction, see docs/security.md)."""
    with trial("copycat-challenger-wins-first"):
        job = H.active_job(dep, cheater)
        original = H.challenge(dep, job, 1, challenger=dep.challenger)
        copycat = H.challenge(dep, job, 1, challenger=dep.challenger2)
        res = H.play(dep, copycat, H.Trainer(dep, cheater), H.HonestChallenger(dep, honest, addr=dep.challenger2))
        assert res.status == GameStatus.CHALLENGER_WON
        assert dep.view(original)["status"] == GameStatus.IN_PROGRESS
        dep.tx(dep.game.functions.closeGame(original), dep.challenger)
        assert dep.owed(dep.challenger2) == CFG.challenger_bond + H.bounty(CFG.trainer_stake)
        assert dep.owed(dep.challenger) == CFG.challenger_bond
        assert dep.owed(dep.trainer) == 0
        dep.check_solvency()


TERM_FLOORS = [("challengeWindow", H.MIN_WINDOW), ("clock", H.MIN_CLOCK), ("postingPeriod", H.MIN_POSTING),
               ("challengerBond", H.MIN_BOND)]


@pytest.mark.parametrize("term,floor", TERM_FLOORS, ids=[t for t, _ in TERM_FLOORS])
def test_terms_below_the_deployments_floors_are_rejected(dep, honest, term, floor):
    """1-second windows, clocks and posting periods and near-free challenges cannot be created."""
    field = {"challengeWindow": "challenge_window", "clock": "clock", "postingPeriod": "posting_period",
             "challengerBond": "challenger_bond"}[term]
    with trial(f"term-below-floor-{term}"):
        low = H.simulate(replace(CFG, **{field: 1}))
        with reverts("TermBelowFloor", term, 1, floor):
            dep.dry(dep.registry.functions.createJob(low.job_params(dep.trainer)), dep.client)
        assert dep.call(dep.registry.functions.jobCount()) == 0


def test_agents_refuse_short_terms_and_a_job_the_chain_cannot_rule_on():
    """The real trainer agent declines (nothing staked) terms above the floors but shorter than it
    can answer within, and a batch-70,000 MLP whose reductions the chain cannot rule on."""
    from protocol.demo import create_job, default_spec
    from protocol.jobs import JobContext, Terms
    from protocol.policy import JobRefused
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    with trial("agents-refuse-short-terms-and-unrulable-specs"), tempfile.TemporaryDirectory() as d:
        proto, a = _agent_world()
        store = ArtifactStore(d)
        for spec, terms, why in [
            (default_spec("mlp"), Terms(clock=120), "clock 120 s is shorter"),
            (replace(default_spec("mlp"), batch_size=70_000), Terms(), "the chain cannot rule on this job"),
        ]:
            ctx = JobContext.of(spec)
            job = create_job(proto, a[1], a[2], ctx, terms)
            trainer = TrainerAgent(proto, a[2], ctx, store, job)
            with pytest.raises(JobRefused, match=why):
                trainer.accept(terms)
            assert trainer.status() == "open"


# ================================================================== a side that stops answering


class SilentTrainer(H.Trainer):
    """Defends its run until the game reaches ``stop_at``, then never moves again."""

    def __init__(self, dep: H.Deployment, run: H.Run, stop_at: str) -> None:
        super().__init__(dep, run)
        self.stop_at = stop_at

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        if label_of(v) == self.stop_at:
            self.last_error = Reverted("Silent", (self.stop_at,), b"")
            return False
        return super().move(gid, v)


class SilentChallenger(H.FalseChallenger):
    """Disputes an honest interval, then stops answering at ``stop_at``."""

    def __init__(self, dep: H.Deployment, stop_at: str, op: int) -> None:
        super().__init__(dep, position=0, op=op, element=100)
        self.stop_at = stop_at

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        if label_of(v) == self.stop_at:
            self.last_error = Reverted("Silent", (self.stop_at,), b"")
            return False
        return super().move(gid, v)


TRAINER_SILENT = [
    ("steps.reveal", False),  # bisection of the interval tree
    ("steps.open", True),  # openStep
    ("trace.commit", True),
    ("trace.reveal", True),
    ("trace.open", False),  # openOp
    ("element.reveal", True),
    ("element.open", True),  # openChunk
    ("onestep", False),  # the challenger asks for the ruling itself
]


@pytest.mark.parametrize(
    "stop_at",
    [pytest.param(s, marks=pytest.mark.slow) if slow else s for s, slow in TRAINER_SILENT],
)
def test_cheating_trainer_that_stops_answering_loses(dep, honest, cheater, stop_at):
    with trial(f"trainer-silent-at-{stop_at}"):
        job = H.active_job(dep, cheater)
        t0 = dep.now()
        gid = H.challenge(dep, job, 1)
        res = H.play(dep, gid, SilentTrainer(dep, cheater, stop_at), H.HonestChallenger(dep, honest))
        assert res.status == GameStatus.CHALLENGER_WON
        assert res.ruling == (Ruling.ADJUDICATED if stop_at == "onestep" else Ruling.TIMEOUT)
        assert dep.now() - t0 <= GAME_BOUND  # the stall is bounded by the trainer's clock
        fraud_settled(dep, job, dep.challenger)


CHALLENGER_SILENT = [("steps.choose", False), ("trace.choose", False), ("element.choose", True), ("pick", True)]


@pytest.mark.parametrize(
    "stop_at",
    [pytest.param(s, marks=pytest.mark.slow) if slow else s for s, slow in CHALLENGER_SILENT],
)
def test_challenger_that_stops_answering_loses_its_bond(dep, honest, stop_at):
    with trial(f"challenger-silent-at-{stop_at}"):
        job = H.active_job(dep, honest)
        t0 = dep.now()
        gid = H.challenge(dep, job, 1)
        ch = SilentChallenger(dep, stop_at, honest.graph.index["update0"])
        res = H.play(dep, gid, H.Trainer(dep, honest), ch)
        assert (res.status, res.ruling) == (GameStatus.TRAINER_WON, Ruling.TIMEOUT)
        assert res.stuck is not None and res.stuck.error_args == (stop_at,)
        assert dep.now() - t0 <= GAME_BOUND
        assert dep.owed(dep.trainer) == CFG.challenger_bond and dep.owed(dep.challenger) == 0
        dep.at(max(dep.now(), dep.call(dep.registry.functions.windowEnd(job, 1)) + 1))
        dep.tx(dep.registry.functions.finalize(job), dep.anyone)
        assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake + CFG.challenger_bond
        dep.check_solvency()


# ================================================================== griefing


class StallingChallenger(H.FalseChallenger):
    """A griefer: disputes an honest interval and makes each move at the last second of its clock."""

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        self.dep.at(max(self.dep.now(), v["deadline"]))
        return super().move(gid, v)


def play_all(dep: H.Deployment, games: list[tuple[int, H.Trainer, H.Challenger]], max_rounds: int = 400) -> None:
    """Plays concurrent games round-robin (a real trainer answers every game at once). A side
    that cannot move is timed out by the other side."""
    oracle = None
    for _ in range(max_rounds):
        live = [(gid, t, c) for gid, t, c in games if dep.view(gid)["status"] == GameStatus.IN_PROGRESS]
        if not live:
            return
        for gid, trainer, challenger in live:
            v = dep.view(gid)
            if v["status"] != GameStatus.IN_PROGRESS:
                continue
            if v["phase"] == Phase.ONE_STEP:
                oracle = oracle or H.Oracle(dep, trainer.run.graph, trainer.run.cfg)
                oracle.register(gid)
            mover, other = (trainer, challenger) if v["toMove"] == Party.TRAINER else (challenger, trainer)
            if not mover.move(gid, v):
                v = dep.view(gid)
                dep.at(max(dep.now(), v["deadline"] + 1))
                other.claim_timeout(gid)
    raise AssertionError("games did not end")


@pytest.mark.parametrize(
    "griefers",
    [pytest.param(3, id="concurrent-3"), pytest.param(6, id="repeated-6", marks=pytest.mark.slow)],
)
def test_griefing_challengers_each_lose_their_bond_and_cannot_stall_the_job(dep, honest, griefers):
    """Challengers (some repeating) open games at the last second of the last window and stall
    every move to its deadline: each loses its bond, the trainer is paid, and the job finalizes
    within both clocks of that second."""
    with trial(f"griefing-{griefers}-challenges"):
        # both intervals posted at once: the windows follow the chained schedule, one posting
        # period apart, so the last second of the job's windows is the last interval's
        job = H.active_job(dep, honest)
        end = dep.call(dep.registry.functions.windowEnd(job, 1))
        assert dep.call(dep.registry.functions.windowEnd(job, 0)) == end - CFG.posting_period
        addrs = [dep.challenger, dep.challenger2, dep.anyone]
        dep.at(end - griefers)
        games = []
        for k in range(griefers):
            addr = addrs[k % len(addrs)]
            gid = H.challenge(dep, job, 1, challenger=addr)
            ch = StallingChallenger(dep, position=k % 4, op=honest.graph.index["update0"], element=100, addr=addr)
            games.append((gid, H.Trainer(dep, honest), ch))
        assert dep.now() <= end + 1
        play_all(dep, games)
        for gid, _, _ in games:
            assert dep.view(gid)["status"] == GameStatus.TRAINER_WON
        assert dep.now() <= end + GAME_BOUND
        dep.tx(dep.registry.functions.finalize(job), dep.anyone)
        assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake + griefers * CFG.challenger_bond
        assert all(dep.owed(a) == 0 for a in addrs)
        dep.check_solvency()


# ================================================================== challenge rules


def test_challenges_outside_the_rules_are_rejected(dep, honest):
    with trial("late-or-invalid-challenge"):
        job = H.active_job(dep, honest, post=False)
        H.post_intervals(dep, job, honest, upto=1)
        g = dep.game.functions
        bond = CFG.challenger_bond
        with reverts("IntervalNotPosted", job, 1, 1):
            dep.dry(g.challenge(job, 1), dep.challenger, value=bond)
        with reverts("WrongValue", 0, bond):
            dep.dry(g.challenge(job, 0), dep.challenger, value=0)
        H.post_intervals(dep, job, honest)
        end = dep.call(dep.registry.functions.windowEnd(job, 0))
        dep.at(end + 1)
        with reverts("WindowClosed", job, 0, end):
            dep.dry(g.challenge(job, 0), dep.challenger, value=bond)
        dep.at(dep.call(dep.registry.functions.windowEnd(job, 1)) + 1)
        dep.tx(dep.registry.functions.finalize(job), dep.anyone)
        with reverts("WrongJobStatus", job, JobStatus.FINALIZED, JobStatus.ACTIVE):
            dep.dry(g.challenge(job, 1), dep.challenger, value=bond)
        dep.check_solvency()


# ================================================================== reentrancy on every payout path


class ContractTrainer(H.Trainer):
    """The trainer is a contract (ReentrantCaller): every move goes through its ``exec``."""

    def __init__(self, dep: H.Deployment, run: H.Run, contract: Any) -> None:
        super().__init__(dep, run, addr=contract.address)
        self.contract = contract

    def send(self, fn: Any, label: str | None = None) -> bool:
        try:
            via(self.dep, self.contract, fn)
        except Reverted as e:
            self.last_error = e
            return False
        return True

    def claim_timeout(self, gid: int) -> None:
        via(self.dep, self.contract, self.dep.game.functions.claimTimeout(gid))


class ContractChallenger(H.HonestChallenger):
    """An honest challenger that is a contract (ReentrantCaller)."""

    def __init__(self, dep: H.Deployment, honest: H.Run, contract: Any) -> None:
        super().__init__(dep, honest, addr=contract.address)
        self.contract = contract

    send = ContractTrainer.send
    claim_timeout = ContractTrainer.claim_timeout


def via(dep: H.Deployment, contract: Any, fn: Any, value: int = 0) -> Any:
    """Sends ``fn`` from ``contract`` (a ReentrantCaller), driven by an EOA."""
    return dep.tx(contract.functions.exec(fn.address, fn._encode_transaction_data()), dep.deployer, value=value)


def receiver(dep: H.Deployment) -> Any:
    c = dep.deploy("ReentrantCaller")
    dep.known.add(c.address)
    return c


def withdraw_reentering(dep: H.Deployment, c: Any, reentry: Any, error: str) -> None:
    """``c`` withdraws what it is owed while its receive() re-enters with ``reentry``: it is
    paid exactly its credit once, and the re-entry reverts with ``error``."""
    owed = dep.owed(c.address)
    assert owed > 0
    before = dep.call(c.functions.received())
    dep.tx(c.functions.setReentry(reentry.address, reentry._encode_transaction_data()), dep.deployer)
    via(dep, c, dep.registry.functions.withdraw())
    assert dep.call(c.functions.received()) == before + owed
    assert dep.call(c.functions.reentrySuccesses()) == 0
    name, _ = H.decode_revert(dep.call(c.functions.lastReentryError()))
    assert name == error, name
    assert dep.owed(c.address) == 0 and dep.w3.eth.get_balance(c.address) == before + owed
    dep.check_solvency()


def test_reentrancy_on_cancel_refund(dep, honest):
    with trial("reentrancy-cancel-refund"):
        client = receiver(dep)
        reg = dep.registry.functions
        via(dep, client, reg.createJob(honest.job_params(dep.trainer)), value=CFG.payment)
        job = dep.call(reg.jobCount())
        H.expire_offer(dep, job)
        via(dep, client, reg.cancelJob(job))
        withdraw_reentering(dep, client, reg.withdraw(), "NothingOwed")
        via(dep, client, reg.createJob(honest.job_params(dep.trainer)), value=CFG.payment)
        H.expire_offer(dep, job + 1)
        via(dep, client, reg.cancelJob(job + 1))
        withdraw_reentering(dep, client, reg.cancelJob(job + 1), "WrongJobStatus")


def test_reentrancy_on_trainer_bond_win_and_finalize_payout(dep, honest):
    with trial("reentrancy-trainer-bond-and-finalize"):
        t = receiver(dep)
        reg, g = dep.registry.functions, dep.game.functions
        job = H.create_job(dep, honest, trainer=t.address)
        via(dep, t, reg.acceptJob(job), value=CFG.trainer_stake)
        for i in range(CFG.n_intervals):
            via(dep, t, reg.postInterval(job, i, honest.interval_roots[i]))
        gid = H.challenge(dep, job, 0)
        res = H.play(dep, gid, ContractTrainer(dep, honest, t), SilentChallenger(dep, "steps.choose", 0))
        assert res.status == GameStatus.TRAINER_WON
        withdraw_reentering(dep, t, reg.withdraw(), "NothingOwed")
        dep.at(dep.call(reg.windowEnd(job, 1)) + 1)
        dep.tx(reg.finalize(job), dep.anyone)
        withdraw_reentering(dep, t, reg.finalize(job), "WrongJobStatus")
        assert dep.call(t.functions.received()) == CFG.payment + CFG.trainer_stake + CFG.challenger_bond
        with reverts("GameOver"):
            dep.dry(g.claimTimeout(gid), dep.anyone)


def test_reentrancy_on_fraud_reward_client_refund_and_bond_refund(dep, honest):
    with trial("reentrancy-fraud-reward-refunds"):
        run = H.simulate(CFG, Cheat("initial_state", step=1))
        ch, ch2, client = receiver(dep), receiver(dep), receiver(dep)
        reg, g = dep.registry.functions, dep.game.functions
        via(dep, client, reg.createJob(run.job_params(dep.trainer)), value=CFG.payment)
        job = dep.call(reg.jobCount())
        H.accept_job(dep, job, run)
        H.post_intervals(dep, job, run)
        via(dep, ch2, g.challenge(job, 1), value=CFG.challenger_bond)
        via(dep, ch, g.challenge(job, 0), value=CFG.challenger_bond)
        (created,) = [e for e in dep.events(dep.game, "GameCreated") if e.challenger == ch.address]
        gid = int(created.game)
        other = int([e for e in dep.events(dep.game, "GameCreated") if e.challenger == ch2.address][0].game)
        res = H.play(dep, gid, H.Trainer(dep, run), ContractChallenger(dep, honest, ch))
        assert res.status == GameStatus.CHALLENGER_WON
        dep.tx(g.closeGame(other), dep.anyone)
        assert dep.owed(ch.address) == CFG.challenger_bond + H.bounty(CFG.trainer_stake)
        withdraw_reentering(dep, ch, g.challenge(job, 1), "WrongJobStatus")
        withdraw_reentering(dep, client, reg.withdraw(), "NothingOwed")
        withdraw_reentering(dep, ch2, g.closeGame(other), "GameOver")
        assert dep.call(reg.escrowOf(job)) == 0


def test_reentrancy_on_reclaim_refund(dep, honest):
    with trial("reentrancy-reclaim-refund"):
        client = receiver(dep)
        reg = dep.registry.functions
        via(dep, client, reg.createJob(honest.job_params(dep.trainer)), value=CFG.payment)
        job = dep.call(reg.jobCount())
        H.accept_job(dep, job, honest)
        dep.at(dep.call(reg.postingDeadline(job, 0)) + 1)
        via(dep, client, reg.reclaimJob(job))
        withdraw_reentering(dep, client, reg.reclaimJob(job), "WrongJobStatus")
        assert dep.call(client.functions.received()) == CFG.payment + H.bounty(CFG.trainer_stake)


# ================================================================== forged openings in the game


@dataclass
class Scenario:
    """Honest trainer vs a false challenger at step 5 (interval 1, position 0; its previous step
    is in interval 0), op update0 (3 chunks), element 100; a snapshot before each kind of move."""

    gid: int
    snaps: dict[str, tuple[H.Snapshot, dict[str, Any]]]


@pytest.fixture(scope="module")
def scenario(chain: H.Deployment, honest: H.Run) -> Scenario:
    dep = chain.reset()
    job = H.active_job(dep, honest)
    gid = H.challenge(dep, job, 1)
    ch = H.FalseChallenger(dep, position=0, op=honest.graph.index["update0"], element=100)
    snaps, res = H.play_keeping_snapshots(dep, gid, H.Trainer(dep, honest), ch, H.Oracle(dep, honest.graph, CFG))
    assert res.status == GameStatus.TRAINER_WON
    return Scenario(gid, snaps)


def _bad(x: bytes) -> bytes:
    return bytes([x[0] ^ 1]) + bytes(x[1:])


def _opening(tr: H.Trainer, v: dict[str, Any], **changes: Any) -> tuple[Any, ...]:
    names = ["outRoot", "desc", "graphProof", "opLogRoot", "logProof", "inputRoots", "inputProofs", "bindProof"]
    o = dict(zip(names, tr.op_opening(v["step"], v["lo"]), strict=True))
    o.update({k: (f(o[k]) if callable(f) else f) for k, f in changes.items()})
    return tuple(o[n] for n in names)


def _step_opening(tr: H.Trainer, v: dict[str, Any], which: int, f: Callable[[Any], Any]) -> tuple[Any, ...]:
    o = list(tr.step_opening(v["interval"], v["lo"]))
    o[which] = f(o[which])
    return tuple(o)


def _chunk(tr: H.Trainer, v: dict[str, Any]) -> bytes:
    import vtrain.commit.roots as C

    return C.chunk_bytes(tr.step_of(v).outputs[v["op"]], v["lo"])


# name, label, forged move (dep, gid, trainer, view) -> contract function, sender, expected error
FORGED: list[tuple[str, str, Callable[..., Any], str]] = [
    (
        "forged-interval-children", "steps.reveal",
        lambda g, gid, tr, v: g.reveal(gid, b"\x01" * 32, b"\x02" * 32), "HashMismatch",
    ),
    (
        "forged-step-state-components", "steps.open",
        lambda g, gid, tr, v: g.openStep(gid, *_step_opening(tr, v, 1, lambda c: [_bad(c[0])] + c[1:])),
        "HashMismatch",
    ),
    (
        "forged-previous-step-proof", "steps.open",
        lambda g, gid, tr, v: g.openStep(gid, *_step_opening(tr, v, 4, lambda p: [_bad(p[0])] + p[1:])),
        "InvalidProof",
    ),
    (
        "forged-previous-state", "steps.open",
        lambda g, gid, tr, v: g.openStep(gid, *_step_opening(tr, v, 0, lambda c: [_bad(c[0])] + c[1:])),
        "InvalidProof",
    ),
    (
        "forged-trace-children", "trace.reveal",
        lambda g, gid, tr, v: g.reveal(gid, b"\x03" * 32, b"\x04" * 32), "HashMismatch",
    ),
    (
        "forged-op-output-root", "trace.open",
        lambda g, gid, tr, v: g.openOp(gid, _opening(tr, v, outRoot=_bad)), "HashMismatch",
    ),
    (
        "wrong-op-descriptor", "trace.open",
        lambda g, gid, tr, v: g.openOp(gid, _opening(tr, v, desc=tr.run.graph.descriptors[v["lo"] - 1])),
        "InvalidProof",
    ),
    (
        "forged-graph-proof", "trace.open",
        lambda g, gid, tr, v: g.openOp(gid, _opening(tr, v, graphProof=lambda p: [_bad(p[0])] + p[1:])),
        "InvalidProof",
    ),
    (
        "forged-op-log-root", "trace.open",
        lambda g, gid, tr, v: g.openOp(gid, _opening(tr, v, opLogRoot=_bad)), "InvalidProof",
    ),
    (
        "forged-input-root", "trace.open",
        lambda g, gid, tr, v: g.openOp(gid, _opening(tr, v, inputRoots=lambda r: [_bad(r[0])] + r[1:])),
        "InvalidProof",
    ),
    (
        "inputs-proven-against-wrong-root", "trace.open",
        lambda g, gid, tr, v: g.openOp(gid, _opening(tr, v, inputRoots=lambda r: [r[1], r[0]])),
        "InvalidProof",
    ),
    (
        "forged-chunk-bytes", "element.open",
        lambda g, gid, tr, v: g.openChunk(gid, _bad(_chunk(tr, v))), "HashMismatch",
    ),
    (
        "forged-oneStep-descriptor", "onestep",
        lambda g, gid, tr, v: g.oneStep(gid, _bad(tr.op_inputs(v["step"], v["op"])[0]), tr.op_inputs(
            v["step"], v["op"])[1], b""),
        "OpeningMismatch",
    ),
    (
        "forged-oneStep-input-roots", "onestep",
        lambda g, gid, tr, v: g.oneStep(gid, tr.op_inputs(v["step"], v["op"])[0], [
            _bad(r) for r in tr.op_inputs(v["step"], v["op"])[1]], b""),
        "OpeningMismatch",
    ),
]


@pytest.mark.parametrize("name,label,forge,error", FORGED, ids=[f[0] for f in FORGED])
def test_forged_opening_reverts_and_the_honest_move_still_wins(dep, honest, scenario, name, label, forge, error):
    """A forged opening is a move the forger cannot make (the game is unchanged, its clock runs);
    the honest opening at the same point is accepted."""
    with trial(name):
        snap, v = scenario.snaps[label]
        dep.revert(snap)
        gid = scenario.gid
        tr = H.Trainer(dep, honest)
        before = dep.view(gid)
        with reverts(error):
            dep.dry(forge(dep.game.functions, gid, tr, v), dep.trainer)
        assert dep.view(gid) == before
        assert tr.move(gid, v), tr.last_error
        after = dep.view(gid)
        assert after != before and after["status"] in (GameStatus.IN_PROGRESS, GameStatus.TRAINER_WON)


def test_forged_pick_by_the_challenger_reverts(dep, honest, scenario):
    with trial("forged-pick-chunk"):
        snap, v = scenario.snaps["pick"]
        dep.revert(snap)
        gid = scenario.gid
        chunk = bytes(dep.events(dep.game, "ChunkOpened", game=gid)[-1].data)
        with reverts("HashMismatch"):
            dep.dry(dep.game.functions.pickElement(gid, _bad(chunk), 0), dep.challenger)
        with reverts("OffsetOutOfRange"):
            dep.dry(dep.game.functions.pickElement(gid, chunk, len(chunk) // 4), dep.challenger)
        dep.tx(dep.game.functions.pickElement(gid, chunk, 36), dep.challenger)
        assert dep.view(gid)["phase"] == Phase.ONE_STEP


@pytest.mark.parametrize("op", ["input1", pytest.param("output0", marks=pytest.mark.slow)])
def test_forged_bind_proof_reverts_and_the_honest_bind_wins(dep, honest, op):
    """INPUT/OUTPUT ops end the game on a bind proof into stateRoot_{s-1} / stateRoot_s: a forged
    one is rejected, the honest one wins the game for the trainer."""
    with trial(f"forged-bind-proof-{op}"):
        job = H.active_job(dep, honest)
        gid = H.challenge(dep, job, 1)
        j = honest.graph.index[op]
        ch = H.FalseChallenger(dep, position=1, op=j, element=0)
        tr = H.Trainer(dep, honest)
        H.play(dep, gid, tr, ch, until=lambda v: label_of(v) == "trace.open")
        v = dep.view(gid)
        assert v["lo"] == j
        forged = _opening(tr, v, bindProof=lambda p: [_bad(p[0])] + p[1:])
        with reverts("InvalidProof"):
            dep.dry(dep.game.functions.openOp(gid, forged), dep.trainer)
        res = H.play(dep, gid, tr, ch)
        assert (res.status, res.ruling) == (GameStatus.TRAINER_WON, Ruling.BIND)
        assert dep.owed(dep.trainer) == CFG.challenger_bond


# ================================================================== forged one-step proofs (real Adjudicator)


@pytest.fixture(scope="module")
def adjudicator():
    import test_adjudicator as TA

    adj = TA.deploy_adjudicator()
    return TA, adj, TA.adjudicator_errors(adj)


ADJ_FORGED = [
    "forged-input-chunk", "forged-input-sibling", "missing-input-sibling", "inputs-against-wrong-root",
    "forged-log-leaf", "log-opening-hides-entry", "wrong-descriptor-shape", "wrong-input-count",
]


@pytest.mark.parametrize("name", ADJ_FORGED)
def test_forged_one_step_proof_reverts_at_the_adjudicator(adjudicator, name):
    """The element level's proofs (input chunk openings, log openings, the descriptor) are checked
    by the real Adjudicator: each forgery reverts with a named error, the honest proof stands."""
    TA, adj, errors = adjudicator
    from revert_helpers import expect_revert

    from protocol.proofs import element_openings, encode_proof, range_siblings
    from vtrain.commit.merkle import MerkleTree
    from vtrain.commit.roots import LogEntry, op_log_leaves

    with trial(f"adjudicator-{name}"):
        case = TA.basic_case()
        index = 3
        claimed, _ = TA.honest(case, index)
        entries = [LogEntry(1, 3, 0), LogEntry(index, 1, 0), LogEntry(5, 1, 0)]
        desc = case.desc.encode()
        openings, log = element_openings(desc, list(case.inputs), index, entries)
        assert TA.on_chain(adj, case, index, claimed, entries, encode_proof(openings, log)) is not None
        over: dict[str, Any] = {}
        c = case
        if name == "forged-input-chunk":
            openings = [(_bad(openings[0][0]), openings[0][1]), openings[1]]
            error = "RangeMismatch"
        elif name == "forged-input-sibling":
            openings = [openings[0], (openings[1][0], [b"\x11" * 32] + openings[1][1][1:])]
            error = "RangeMismatch"
        elif name == "missing-input-sibling":
            openings = [(openings[0][0], openings[0][1][:-1]), openings[1]]
            error = "SiblingCount"
        elif name == "inputs-against-wrong-root":
            over["roots"] = [TA.root_of(case.inputs[1]), TA.root_of(case.inputs[0])]
            error = "RangeMismatch"
        elif name == "forged-log-leaf":
            position, size, leaves, siblings = log
            log = (position, size, leaves[:13] + bytes([3]) + leaves[14:], siblings)
            error = "RangeMismatch"
        elif name == "log-opening-hides-entry":
            all_leaves = op_log_leaves(entries)
            tree = MerkleTree.from_leaves(all_leaves)
            p = log[0] - 1
            log = (p, log[1], all_leaves[p] + all_leaves[p + 1], range_siblings(tree, p, p + 2))
            error = "LogBracket"
        elif name == "wrong-descriptor-shape":
            c = replace(case, desc=replace(case.desc, in_shapes=((3, 70), (2, 71))))
            error = "ShapeMismatch"
        else:
            over["roots"] = [TA.root_of(case.inputs[0])]
            error = "InputCount"
        proof = encode_proof(openings, log)
        expect_revert(lambda: TA.on_chain(adj, c, index, claimed, entries, proof, **over), errors, error)


# ================================================================== withheld artifacts (gap b)


def _agent_world():
    from protocol.chain import Chain
    from protocol.deploy import deploy

    chain = Chain.connect(None)
    a = chain.accounts()
    return deploy(chain, a[0]), a


def test_auditor_detects_withheld_artifacts_and_does_not_sign_off(tmp_path):
    """The trainer posts roots but publishes nothing: the auditor cannot replay, says so, and
    does not sign off (it retries on every audit)."""
    from protocol.auditor import AuditorAgent
    from protocol.demo import create_job, default_spec
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore

    with trial("trainer-withholds-artifacts"):
        proto, a = _agent_world()
        terms = Terms()
        ctx = JobContext.of(default_spec("mlp"))
        job = create_job(proto, a[1], a[2], ctx, terms)
        proto.chain.send(proto.registry.functions.acceptJob(job), a[2], value=terms.trainer_stake)
        for i in range(ctx.n_intervals):
            proto.chain.send(proto.registry.functions.postInterval(job, i, bytes([i + 1]) * 32), a[2])
        auditor = AuditorAgent(proto, a[3], ctx, ArtifactStore(tmp_path), job)
        assert auditor.audit() is None
        assert list(auditor.withheld) == [0] and "not found" in auditor.withheld[0]
        assert auditor.verified == 0 and not auditor.signed_off()
        assert auditor.audit() is None and list(auditor.withheld) == [0]  # retried, still withheld


@pytest.mark.slow
def test_auditor_with_logs_of_one_interval_withheld_replays_the_rest_and_does_not_sign_off():
    from protocol.auditor import AuditorAgent
    from protocol.demo import create_job, default_spec
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent
    from vtrain.errors import MissingArtifact

    class Withholding(ArtifactStore):
        """The trainer's store, minus the logs of interval 1."""

        hidden: set[int] = set()

        def get_log(self, job, s):
            if s in self.hidden:
                raise MissingArtifact(f"job {job}: log of step {s} withheld")
            return super().get_log(job, s)

    with trial("trainer-withholds-one-interval"), tempfile.TemporaryDirectory() as d:
        proto, a = _agent_world()
        terms = Terms()
        ctx = JobContext.of(default_spec("mlp"))
        job = create_job(proto, a[1], a[2], ctx, terms)
        store = Withholding(d)
        trainer = TrainerAgent(proto, a[2], ctx, store, job)
        trainer.accept(terms)
        while trainer.run_interval() is not None:
            pass
        first, n = ctx.interval_span(1)
        store.hidden = set(range(first, first + n))
        auditor = AuditorAgent(proto, a[3], ctx, store, job)
        assert auditor.audit() is None
        assert auditor.verified == 1 and list(auditor.withheld) == [1] and not auditor.signed_off()
        store.hidden = set()  # published late: the auditor replays it and signs off
        assert auditor.audit() is None and auditor.withheld == {} and auditor.signed_off()


# ================================================================== data availability (contracts/DataAvailability.sol)


def test_trainer_that_withholds_a_demanded_step_loses_its_stake(dep, honest):
    """A demand the trainer leaves unanswered: anyone claims the timeout, the demander wins."""
    import da_harness as D

    with trial("da-withheld-demand-times-out"):
        job = H.active_job(dep, honest)
        did = D.demand_step(dep, job, 1, 6)
        dep.advance(CFG.clock + 1)
        fee = D.demand(dep, did)["fee"]
        dep.tx(dep.da.functions.claimTimeout(did), dep.anyone)
        fraud_settled(dep, job, dep.challenger, fee)


def test_honest_trainer_answers_griefing_demands_and_finalizes_within_the_cap(dep, honest):
    """Many demanders, each at the last second of the window: the honest trainer answers all, every
    demander gets its bond back and has paid the trainer each answer's fee (at least the answer's
    gas at the fee's gas price: griefing costs the griefer, not the trainer), the trainer is paid,
    finalize comes by windowEnd + 2 clock."""
    import da_harness as D

    with trial("da-griefing-demands-bounded"):
        lr = D.with_logs(honest)
        job = H.active_job(dep, honest)
        end = dep.call(dep.registry.functions.windowEnd(job, 1))
        dep.at(end - 3)
        ids = [D.demand_step(dep, job, 1, 5 + k % 4, who=w) for k, w in
               enumerate([dep.challenger, dep.challenger2, dep.anyone, dep.client])]
        dep.at(end + CFG.clock - 4)
        fees = answer_gas = 0
        for did in ids:
            step = D.demand(dep, did)["step"]
            fees += D.demand(dep, did)["fee"]
            answer_gas += dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 1, step)), dep.trainer).gasUsed
        assert fees >= answer_gas * H.DA_FEE_GAS_PRICE > 0
        with reverts("DemandWindowClosed"):
            dep.dry(dep.da.functions.demandStep(job, 1, 5, 0), dep.challenger,
                    value=CFG.challenger_bond + D.step_fee(dep, job))
        ext = dep.call(dep.registry.functions.windowEnd(job, 1))
        assert ext <= end + 2 * CFG.clock
        dep.at(ext + 1)
        dep.tx(dep.registry.functions.finalize(job), dep.anyone)
        for w in (dep.challenger, dep.challenger2, dep.anyone):
            assert dep.owed(w) == CFG.challenger_bond
        assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake + fees


def test_forged_availability_answer_reverts_and_the_honest_answer_is_accepted(dep, honest):
    import da_harness as D

    with trial("da-forged-answer"):
        lr = D.with_logs(honest)
        job = H.active_job(dep, honest)
        op = honest.graph.index["update0"]
        did = D.demand_log(dep, job, 0, 2, op, 0, 100)
        good = D.answer_run_for(lr, 0, 2, op, 0, 100)
        forged = good[:7] + (good[7][:9] + D.leaf(4, 3, 0x40000000) + good[7][18:],) + good[8:]
        with reverts("RangeMismatch"):
            dep.dry(dep.da.functions.answerLog(did, forged), dep.trainer)
        dep.tx(dep.da.functions.answerLog(did, good), dep.trainer)
        assert D.demand(dep, did)["status"] == 2
        fee, earned = D.demand(dep, did)["fee"], dep.owed(dep.trainer)
        assert 0 < earned <= fee and dep.owed(dep.challenger) == CFG.challenger_bond + fee - earned


@pytest.mark.parametrize("kind", ["duplicate-index", "out-of-order", "bad-code"])
def test_malformed_committed_log_is_proven_and_convicts_the_trainer(dep, kind):
    """A log the trainer could open either way (two entries for one element) or with a code
    outside the alphabet: anyone proves it from two adjacent leaves (or one) while Active."""
    import da_harness as D

    with trial(f"da-malformed-log-{kind}"):
        run = H.simulate(CFG)
        op = run.graph.index["update0"]
        entries = {"duplicate-index": [(5, 1, 0), (5, 2, 0)], "out-of-order": [(9, 1, 0), (5, 2, 0)],
                   "bad-code": [(5, 9, 0)]}[kind]
        lr = D.with_logs(run, {(6, op): D.entries_leaves(entries)})
        job = H.active_job(dep, lr.run)
        span = (1, 2) if kind == "bad-code" else (1, 3)
        dep.tx(dep.da.functions.proveMalformedLog(job, 1, 6, op, D.run_args(lr, 1, 6, op, *span)), dep.anyone)
        assert dep.job_status(job) == JobStatus.FRAUDULENT
        assert dep.owed(dep.anyone) == H.bounty(CFG.trainer_stake) and dep.owed(dep.client) == CFG.payment


def test_reentrancy_on_demand_bond_refund_and_reward(dep, honest):
    """Demanders that are contracts: the answered demand's bond and the timeout reward are credits;
    withdraw pays each exactly once while the receiver re-enters the availability contract."""
    import da_harness as D

    with trial("reentrancy-demand-refund-and-reward"):
        lr = D.with_logs(honest)
        a, b = receiver(dep), receiver(dep)
        da = dep.da.functions
        job = H.active_job(dep, honest)
        fee = D.step_fee(dep, job)
        via(dep, a, da.demandStep(job, 0, 1, 0), value=CFG.challenger_bond + fee)
        did_a = dep.call(da.demandCount())
        dep.tx(da.answerStep(did_a, *D.step_args(lr, 0, 1)), dep.trainer)
        withdraw_reentering(dep, a, da.claimTimeout(did_a), "DemandNotOpen")
        via(dep, b, da.demandStep(job, 0, 2, 0), value=CFG.challenger_bond + fee)
        did_b = dep.call(da.demandCount())
        dep.advance(CFG.clock + 1)
        dep.tx(da.claimTimeout(did_b), dep.anyone)
        withdraw_reentering(dep, b, da.claimTimeout(did_b), "DemandNotOpen")
        assert dep.call(b.functions.received()) == CFG.challenger_bond + H.bounty(CFG.trainer_stake) + fee


# ================================================================== every cheat of protocol/cheats.py (real agents)


def _cheat_names() -> list[str]:
    from protocol.cheats import CHEATS

    return sorted(CHEATS)


@pytest.mark.slow
@pytest.mark.parametrize("cheat", _cheat_names())
def test_every_cheat_loses_its_stake_to_the_honest_auditor(demo_world, cheat):
    from protocol.demo import check_cheat, default_spec, run_scenario
    from protocol.jobs import Terms
    from vtrain.errors import GraphError

    proto, store, accounts = demo_world
    try:
        check_cheat("mlp", cheat)
        model = "mlp"
    except GraphError:  # the attention cheats need the GPT
        model = "gpt"
    with trial(f"cheat-{cheat}"):
        r = run_scenario(proto, default_spec(model), Terms(), store, accounts, cheat, cheat, False, lambda _: None)
        assert (r.verdict, r.final_status) == ("challenger won", "fraudulent")
        # the bounty (half the stake) to the auditor, the rest burned, the client refunded
        assert r.bonds == "trainer -2.00, auditor +1.00"
        burned = proto.chain.call(proto.registry.functions.totalBurned())
        assert burned > 0 and proto.chain.w3.eth.get_balance(proto.registry.address) == burned  # all else paid out


# ================================================================== the report script


def test_bench_security_tallies_trials_and_fails_on_any_failed_trial(tmp_path):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "bench_security.py"
    spec = importlib.util.spec_from_file_location("bench_security", path)
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["bench_security"] = bench  # dataclasses look their module up
    spec.loader.exec_module(bench)
    report = tmp_path / "r.jsonl"
    report.write_text(
        "\n".join(
            [
                '{"kind": "attack", "name": "a", "ok": true}',
                '{"kind": "attack", "name": "b", "ok": false}',
                '{"kind": "fuzz", "name": "f", "ok": true, "sequences": 50, "steps": 900, "violations": 0}',
                '{"kind": "crash_restart", "name": "c", "ok": true}',
                "not json",
            ]
        )
    )
    t = bench.tally(bench.read_trials(report))
    assert (t["attack"].trials, t["attack"].ok, t["attack"].failed) == (2, 1, ["b"])
    assert (t["fuzz"].sequences, t["fuzz"].violations, t["crash_restart"].ok) == (50, 0, 1)
    text = bench.render(t, 1, ["tests/test_resilience.py"], 1.0)
    assert "attacks tried / caught                     2 / 1" in text and "FAILED attack: b" in text
    assert "fuzz sequences run / invariant violations  50 / 0" in text
