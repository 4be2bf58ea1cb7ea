"""JobRegistry: job life cycle, interval posting, finalize, cancel, pull payments, reentrancy,
game hooks. Every test ends with the solvency invariant (fixture `dep`)."""

from __future__ import annotations

from dataclasses import replace

import game_harness as H
import pytest
from game_harness import JobStatus, reverts

CFG = H.JobConfig()  # 6 steps, K = 4: intervals [1..4], [5..6]


@pytest.fixture(scope="module")
def run() -> H.Run:
    return H.simulate(CFG)


def params_with(run: H.Run, trainer_addr: str, **changes: object) -> tuple:
    names = [
        "trainer", "specHash", "dataRoot", "dataSeed", "nSamples", "graphRoot", "nOps", "nSlots",
        "initialStateRoot", "nSteps", "intervalLength", "trainerStake", "challengerBond",
        "challengeWindow", "clock", "postingPeriod", "acceptPeriod",
    ]
    p = dict(zip(names, run.job_params(trainer_addr), strict=True))
    p.update(changes)
    return tuple(p[n] for n in names)


def paid(dep: H.Deployment, receipt) -> int:
    return receipt.gasUsed * receipt.effectiveGasPrice


# ------------------------------------------------------------------ createJob


def test_createJob_stores_params_and_escrows_payment(dep, run):
    job = H.create_job(dep, run)
    j = dep.job(job)
    assert job == 1 and dep.call(dep.registry.functions.jobCount()) == 1
    assert j["status"] == JobStatus.OPEN
    assert j["client"] == dep.client and j["payment"] == CFG.payment
    assert j["params"]["graphRoot"] == run.graph.root
    assert j["params"]["initialStateRoot"] == run.registered_init_root
    assert j["params"]["nOps"] == run.graph.n_ops
    assert dep.call(dep.registry.functions.escrowOf(job)) == CFG.payment
    assert dep.call(dep.registry.functions.nIntervals(job)) == 2
    assert dep.call(dep.registry.functions.intervalSpan(job, 0)) == [1, 4]
    assert dep.call(dep.registry.functions.intervalSpan(job, 1)) == [5, 2]
    (ev,) = dep.events(dep.registry, "JobCreated")
    assert ev.trainer == dep.trainer and ev.payment == CFG.payment


@pytest.mark.parametrize(
    "field,value",
    [
        ("trainer", "0x" + "00" * 20),
        ("nOps", 0),
        ("nSlots", 0),
        ("nSlots", 1025),
        ("nSteps", 0),
        ("intervalLength", 0),
        ("nSamples", 0),
        ("initialStateRoot", b"\x00" * 32),
        ("graphRoot", b"\x00" * 32),
    ],
)
def test_createJob_with_out_of_range_param_reverts(dep, run, field, value):
    with reverts("InvalidJobParam", field):
        dep.dry(dep.registry.functions.createJob(params_with(run, dep.trainer, **{field: value})), dep.client)


def test_createJob_with_nSlots_1024_is_accepted(dep, run):
    dep.tx(dep.registry.functions.createJob(params_with(run, dep.trainer, nSlots=1024)), dep.client)


# ------------------------------------------------------------------ floors on the terms

#: (JobParams field, the harness deployment's floor).
FLOOR_TERMS = [
    ("challengeWindow", H.MIN_WINDOW),
    ("clock", H.MIN_CLOCK),
    ("postingPeriod", H.MIN_POSTING),
    ("challengerBond", H.MIN_BOND),
]


def test_registry_reports_its_deployment_parameters(dep):
    reg = dep.registry.functions
    got = (reg.minChallengeWindow(), reg.minClock(), reg.minPostingPeriod(), reg.minChallengerBond(), reg.bountyBps())
    assert tuple(dep.call(f) for f in got) == H.FLOORS
    assert dep.call(reg.totalBurned()) == 0


@pytest.mark.parametrize("term,floor", FLOOR_TERMS, ids=[t for t, _ in FLOOR_TERMS])
def test_createJob_with_a_term_below_its_floor_reverts_naming_it(dep, run, term, floor):
    """One below the floor (and zero) revert with the term, its value and the floor; the floor
    itself is accepted. Every deployment has floors >= 1: no zero-second terms, no free challenge."""
    for value in (floor - 1, 0):
        with reverts("TermBelowFloor", term, value, floor):
            dep.dry(dep.registry.functions.createJob(params_with(run, dep.trainer, **{term: value})), dep.client)
    dep.tx(dep.registry.functions.createJob(params_with(run, dep.trainer, **{term: floor})), dep.client)
    assert dep.job(1)["params"][term] == floor


def test_a_one_second_clock_is_impossible_so_a_late_honest_reply_still_counts(dep, run):
    """The attack the clock floor stops: a client colluding with a challenger sets a 1 s clock and
    wins on timeout against an honest trainer whose reply lands one block later. Now the job cannot
    be created; at the floor, a reply many blocks late still lands in time."""
    with reverts("TermBelowFloor", "clock", 1, H.MIN_CLOCK):
        dep.dry(dep.registry.functions.createJob(params_with(run, dep.trainer, clock=1)), dep.client)
    short = H.simulate(replace(CFG, clock=H.MIN_CLOCK))
    job = H.active_job(dep, short)
    gid = H.challenge(dep, job, 0)
    dep.advance(H.MIN_CLOCK - 10)  # ten blocks before the trainer's clock runs out
    with reverts("ClockNotExpired"):
        dep.dry(dep.game.functions.claimTimeout(gid), dep.challenger)
    assert H.Trainer(dep, short).move(gid, dep.view(gid))


@pytest.mark.parametrize(
    "args,param",
    [
        ((0, 1, 1, 1, 5000), "minChallengeWindow"),
        ((1, 0, 1, 1, 5000), "minClock"),
        ((1, 1, 0, 1, 5000), "minPostingPeriod"),
        ((1, 1, 1, 0, 5000), "minChallengerBond"),
        ((1, 1, 1, 1, 0), "bountyBps"),
        ((1, 1, 1, 1, 10_000), "bountyBps"),
    ],
)
def test_registry_constructor_rejects_zero_floors_and_a_bounty_of_nothing_or_everything(dep, args, param):
    from eth_tester.exceptions import TransactionFailed

    from protocol.build import load_artifact

    art = load_artifact("JobRegistry")
    data = dep.w3.eth.contract(abi=art.abi, bytecode=art.bytecode).constructor(*args).data_in_transaction
    with reverts("InvalidDeployment", param):
        try:
            dep.w3.eth.call({"from": dep.deployer, "data": data, "gas": H.TX_GAS})
        except TransactionFailed as e:
            raise H._reverted(e) from None
    fresh = dep.deploy("JobRegistry", 1, 1, 1, 1, 9_999)
    assert dep.call(fresh.functions.bountyBps()) == 9_999


# ------------------------------------------------------------------ cancel


def test_cancelJob_by_client_before_accept_refunds_payment(dep, run):
    job = H.create_job(dep, run)
    H.expire_offer(dep, job)
    dep.tx(dep.registry.functions.cancelJob(job), dep.client)
    assert dep.job_status(job) == JobStatus.CANCELLED
    assert dep.owed(dep.client) == CFG.payment
    assert dep.call(dep.registry.functions.escrowOf(job)) == 0
    with reverts("WrongJobStatus", job, JobStatus.CANCELLED, JobStatus.OPEN):
        dep.dry(dep.registry.functions.cancelJob(job), dep.client)
    with reverts("WrongJobStatus"):
        H.accept_job(dep, job, run)


def test_cancelJob_by_other_than_client_reverts(dep, run):
    job = H.create_job(dep, run)
    with reverts("Unauthorized", dep.trainer, dep.client):
        dep.dry(dep.registry.functions.cancelJob(job), dep.trainer)


def test_cancelJob_after_accept_reverts(dep, run):
    job = H.create_job(dep, run)
    H.accept_job(dep, job, run)
    with reverts("WrongJobStatus", job, JobStatus.ACTIVE, JobStatus.OPEN):
        dep.dry(dep.registry.functions.cancelJob(job), dep.client)


def test_cancelJob_of_unknown_job_reverts(dep):
    with reverts("UnknownJob", 7):
        dep.dry(dep.registry.functions.cancelJob(7), dep.client)


# ------------------------------------------------------------------ the accept period (a firm offer)


def test_the_client_cannot_cancel_while_the_trainer_may_accept(dep, run):
    """The griefing this stops: a client lets the named trainer train the job before it stakes, then
    takes its payment back just before acceptance, for free. Before: cancelJob succeeded at once.
    Now the offer is firm until createdAt + acceptPeriod (that second included), with the times in
    the error; from the second after, the client cancels and the trainer can no longer accept."""
    job = H.create_job(dep, run)
    created = dep.job(job)["createdAt"]
    deadline = created + CFG.accept_period
    assert dep.call(dep.registry.functions.acceptDeadline(job)) == deadline
    (ev,) = dep.events(dep.registry, "JobCreated")
    assert ev.acceptDeadline == deadline and ev.params["acceptPeriod"] == CFG.accept_period
    for t in (dep.now(), deadline - 1, deadline):
        dep.at(t)
        with reverts("CancelTooEarly", job, deadline, t):
            dep.dry(dep.registry.functions.cancelJob(job), dep.client)
        dep.dry(dep.registry.functions.acceptJob(job), dep.trainer, value=CFG.trainer_stake)  # still acceptable
    dep.at(deadline + 1)
    with reverts("AcceptDeadlinePassed", job, deadline, deadline + 1):
        dep.dry(dep.registry.functions.acceptJob(job), dep.trainer, value=CFG.trainer_stake)
    dep.tx(dep.registry.functions.cancelJob(job), dep.client)
    assert dep.job_status(job) == JobStatus.CANCELLED and dep.owed(dep.client) == CFG.payment


def test_the_trainer_accepts_at_the_deadline_second_and_the_client_cannot_cancel_then(dep, run):
    job = H.create_job(dep, run)
    deadline = dep.call(dep.registry.functions.acceptDeadline(job))
    dep.at(deadline)
    H.accept_job(dep, job, run)
    assert dep.job_status(job) == JobStatus.ACTIVE and dep.job(job)["acceptedAt"] == deadline
    with reverts("WrongJobStatus", job, JobStatus.ACTIVE, JobStatus.OPEN):
        dep.dry(dep.registry.functions.cancelJob(job), dep.client)


def test_the_accept_period_is_bounded(dep, run):
    """Zero (no firm offer) and more than a year (a period in milliseconds by mistake) revert; 1 s
    and the cap itself are taken."""
    for bad in (0, H.MAX_ACCEPT_PERIOD + 1, 86_400_000):
        with reverts("InvalidJobParam", "acceptPeriod", bad):
            dep.dry(dep.registry.functions.createJob(params_with(run, dep.trainer, acceptPeriod=bad)), dep.client)
    for ok in (1, H.MAX_ACCEPT_PERIOD):
        dep.dry(dep.registry.functions.createJob(params_with(run, dep.trainer, acceptPeriod=ok)), dep.client)
    from protocol.jobs import MAX_ACCEPT_PERIOD  # the client CLI's check before sending

    assert MAX_ACCEPT_PERIOD == H.MAX_ACCEPT_PERIOD


# ------------------------------------------------------------------ accept


def test_acceptJob_with_exact_stake_activates_job(dep, run):
    job = H.create_job(dep, run)
    H.accept_job(dep, job, run)
    j = dep.job(job)
    assert j["status"] == JobStatus.ACTIVE and j["acceptedAt"] > 0
    assert dep.call(dep.registry.functions.escrowOf(job)) == CFG.payment + CFG.trainer_stake
    with reverts("WrongJobStatus", job, JobStatus.ACTIVE, JobStatus.OPEN):
        H.accept_job(dep, job, run)


@pytest.mark.parametrize("delta", [-1, 1])
def test_acceptJob_with_wrong_stake_reverts(dep, run, delta):
    job = H.create_job(dep, run)
    with reverts("WrongValue", CFG.trainer_stake + delta, CFG.trainer_stake):
        dep.dry(dep.registry.functions.acceptJob(job), dep.trainer, value=CFG.trainer_stake + delta)


def test_acceptJob_by_other_than_trainer_reverts(dep, run):
    job = H.create_job(dep, run)
    with reverts("Unauthorized", dep.challenger, dep.trainer):
        dep.dry(dep.registry.functions.acceptJob(job), dep.challenger, value=CFG.trainer_stake)


# ------------------------------------------------------------------ postInterval


def test_postInterval_in_order_records_root_and_window(dep, run):
    job = H.active_job(dep, run, post=False)
    t = dep.now()
    dep.tx(dep.registry.functions.postInterval(job, 0, run.interval_roots[0]), dep.trainer)
    iv = dep.call(dep.registry.functions.getInterval(job, 0))
    assert iv == (run.interval_roots[0], t, t)  # root, postedAt, windowStart (interval 0: postedAt)
    assert dep.call(dep.registry.functions.windowEnd(job, 0)) == t + CFG.challenge_window
    assert dep.call(dep.registry.functions.windowEnd(job, 1)) == 0
    assert dep.job(job)["nextInterval"] == 1
    (ev,) = dep.events(dep.registry, "IntervalPosted", job=job)
    assert (ev.index, ev.firstStep, ev.size, ev.windowEnd) == (0, 1, 4, t + CFG.challenge_window)


def test_postInterval_with_gap_reverts(dep, run):
    job = H.active_job(dep, run, post=False)
    with reverts("WrongInterval", 1, 0, 2):
        dep.dry(dep.registry.functions.postInterval(job, 1, run.interval_roots[1]), dep.trainer)


def test_postInterval_overwrite_reverts(dep, run):
    job = H.active_job(dep, run, post=False)
    H.post_intervals(dep, job, run, upto=1)
    with reverts("WrongInterval", 0, 1, 2):
        dep.dry(dep.registry.functions.postInterval(job, 0, b"\x11" * 32), dep.trainer)
    assert dep.call(dep.registry.functions.getInterval(job, 0))[0] == run.interval_roots[0]


def test_postInterval_past_last_interval_reverts(dep, run):
    job = H.active_job(dep, run)
    with reverts("WrongInterval", 2, 2, 2):
        dep.dry(dep.registry.functions.postInterval(job, 2, b"\x11" * 32), dep.trainer)


def test_postInterval_zero_root_reverts(dep, run):
    job = H.active_job(dep, run, post=False)
    with reverts("ZeroRoot"):
        dep.dry(dep.registry.functions.postInterval(job, 0, b"\x00" * 32), dep.trainer)


def test_postInterval_by_other_than_trainer_reverts(dep, run):
    job = H.active_job(dep, run, post=False)
    with reverts("Unauthorized", dep.client, dep.trainer):
        dep.dry(dep.registry.functions.postInterval(job, 0, run.interval_roots[0]), dep.client)


def test_postInterval_before_accept_reverts(dep, run):
    job = H.create_job(dep, run)
    with reverts("WrongJobStatus", job, JobStatus.OPEN, JobStatus.ACTIVE):
        dep.dry(dep.registry.functions.postInterval(job, 0, run.interval_roots[0]), dep.trainer)


def test_nIntervals_when_K_divides_N_has_full_last_interval(dep):
    run = H.simulate(H.JobConfig(n_steps=8, interval_length=4))
    job = H.create_job(dep, run)
    assert dep.call(dep.registry.functions.nIntervals(job)) == 2
    assert dep.call(dep.registry.functions.intervalSpan(job, 1)) == [5, 4]
    with reverts("WrongInterval", 2, 2, 2):
        dep.call(dep.registry.functions.intervalSpan(job, 2))


# ------------------------------------------------------------------ finalize


def test_finalize_after_last_window_credits_trainer_payment_and_stake(dep, run):
    job = H.active_job(dep, run)
    end = dep.call(dep.registry.functions.windowEnd(job, 1))
    dep.at(end)
    with reverts("WindowStillOpen", job, end, end):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    dep.at(end + 1)
    dep.tx(dep.registry.functions.finalize(job), dep.anyone)
    assert dep.job_status(job) == JobStatus.FINALIZED
    assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake
    assert dep.call(dep.registry.functions.escrowOf(job)) == 0
    with reverts("WrongJobStatus", job, JobStatus.FINALIZED, JobStatus.ACTIVE):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)


def test_finalize_with_missing_interval_reverts(dep, run):
    job = H.active_job(dep, run, post=False)
    H.post_intervals(dep, job, run, upto=1)
    dep.advance(CFG.challenge_window + 10)
    with reverts("IntervalsMissing", job, 1, 2):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)


def test_finalize_with_open_game_reverts_until_game_ends(dep, run):
    job = H.active_job(dep, run)
    end = dep.call(dep.registry.functions.windowEnd(job, 1))
    dep.at(end - 10)
    gid = H.challenge(dep, job, 1)
    dep.at(end + 1)
    with reverts("GamesOpen", job, 1):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    # The trainer reveals; the challenger never answers and the trainer claims the timeout.
    res = H.play(dep, gid, H.Trainer(dep, run), _Silent(dep, dep.challenger))
    assert (res.status, res.ruling) == (H.GameStatus.TRAINER_WON, H.Ruling.TIMEOUT)
    dep.tx(dep.registry.functions.finalize(job), dep.anyone)
    assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake + CFG.challenger_bond


def test_finalize_before_accept_reverts(dep, run):
    job = H.create_job(dep, run)
    with reverts("WrongJobStatus", job, JobStatus.OPEN, JobStatus.ACTIVE):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)


class _Silent(H.Challenger):
    """A challenger that never moves."""

    def move(self, gid, v):
        return False


# ------------------------------------------------------------------ withdraw


def test_withdraw_pays_credit_once_and_double_withdraw_reverts(dep, run):
    job = H.create_job(dep, run)
    H.expire_offer(dep, job)
    dep.tx(dep.registry.functions.cancelJob(job), dep.client)
    before = dep.w3.eth.get_balance(dep.client)
    r = dep.tx(dep.registry.functions.withdraw(), dep.client)
    assert dep.w3.eth.get_balance(dep.client) == before + CFG.payment - paid(dep, r)
    assert dep.owed(dep.client) == 0 and dep.call(dep.registry.functions.totalOwed()) == 0
    (ev,) = dep.events(dep.registry, "Withdrawn")
    assert ev.amount == CFG.payment
    with reverts("NothingOwed", dep.client):
        dep.dry(dep.registry.functions.withdraw(), dep.client)


def test_withdraw_with_nothing_owed_reverts(dep):
    with reverts("NothingOwed", dep.anyone):
        dep.dry(dep.registry.functions.withdraw(), dep.anyone)


def _receiver_client(dep: H.Deployment, run: H.Run):
    recv = dep.deploy("ReentrantReceiver", dep.registry.address)
    dep.known.add(recv.address)
    data = dep.registry.encode_abi("createJob", [run.job_params(dep.trainer)])
    dep.tx(recv.functions.exec(dep.registry.address, data), dep.client, value=CFG.payment)
    job = dep.call(dep.registry.functions.jobCount())
    H.expire_offer(dep, job)
    dep.tx(recv.functions.exec(dep.registry.address, dep.registry.encode_abi("cancelJob", [job])), dep.client)
    assert dep.owed(recv.address) == CFG.payment
    return recv


def test_withdraw_reentered_by_malicious_receiver_pays_only_once(dep, run):
    recv = _receiver_client(dep, run)
    reg_before = dep.w3.eth.get_balance(dep.registry.address)
    dep.tx(recv.functions.exec(dep.registry.address, dep.registry.encode_abi("withdraw", [])), dep.client)
    assert dep.call(recv.functions.received()) == CFG.payment
    assert dep.call(recv.functions.reentryAttempts()) == 1
    assert dep.call(recv.functions.reentrySucceeded()) is False
    name, args = H.decode_revert(dep.call(recv.functions.lastReentryError()))
    assert (name, args) == ("NothingOwed", (recv.address,))
    assert dep.w3.eth.get_balance(dep.registry.address) == reg_before - CFG.payment
    assert dep.owed(recv.address) == 0


def test_withdraw_to_rejecting_receiver_reverts_and_keeps_credit(dep, run):
    recv = _receiver_client(dep, run)
    dep.tx(recv.functions.setRejectPayments(True), dep.client)
    with reverts("TransferFailed", recv.address, CFG.payment):
        dep.dry(recv.functions.exec(dep.registry.address, dep.registry.encode_abi("withdraw", [])), dep.client)
    assert dep.owed(recv.address) == CFG.payment
    dep.tx(recv.functions.setRejectPayments(False), dep.client)
    dep.tx(recv.functions.exec(dep.registry.address, dep.registry.encode_abi("withdraw", [])), dep.client)
    assert dep.owed(recv.address) == 0 and dep.call(recv.functions.received()) == CFG.payment


def test_registry_rejects_plain_ether_transfers(dep):
    h = dep.w3.eth.send_transaction({"from": dep.anyone, "to": dep.registry.address, "value": 1, "gas": 100_000})
    assert dep.w3.eth.get_transaction_receipt(h).status == 0


# ------------------------------------------------------------------ game hooks and binding


def test_setDisputeGame_twice_reverts(dep):
    with reverts("GameAlreadySet", dep.game.address):
        dep.dry(dep.registry.functions.setDisputeGame(dep.anyone), dep.deployer)


def test_setDisputeGame_by_other_than_deployer_reverts(dep):
    fresh = dep.deploy("JobRegistry", *H.FLOORS)
    with reverts("Unauthorized", dep.anyone, dep.deployer):
        dep.dry(fresh.functions.setDisputeGame(dep.anyone), dep.anyone)


def test_game_hooks_called_by_other_than_game_revert(dep, run):
    job = H.active_job(dep, run)
    reg = dep.registry.functions
    with reverts("Unauthorized", dep.challenger, dep.game.address):
        dep.dry(reg.lockBond(job, 0, dep.challenger), dep.challenger, value=CFG.challenger_bond)
    with reverts("Unauthorized"):
        dep.dry(reg.settleGame(job, dep.challenger, False), dep.challenger)
    with reverts("Unauthorized"):
        dep.dry(reg.refundGame(job, dep.challenger), dep.challenger)


# ------------------------------------------------------------------ convictions: bounty and burn


def _convicted_by_timeout(dep: H.Deployment, job: int, challenger: str, interval: int = 0) -> int:
    """``challenger`` opens a game on ``interval`` and the trainer never answers: it is convicted."""
    gid = H.challenge(dep, job, interval, challenger=challenger)
    dep.advance(CFG.clock + 1)
    dep.tx(dep.game.functions.claimTimeout(gid), challenger)
    return gid


def test_a_trainer_challenging_itself_through_a_sybil_recovers_only_the_bounty(dep, run):
    """Before: the first winning challenger took the whole stake, so a trainer whose own second
    account convicts it first got it all back. Now the sybil gets its bond + the bounty (half the
    stake) and the rest is burned: the pair loses stake - bounty whoever of them wins."""
    sybil = dep.challenger  # the trainer's second account
    job = H.active_job(dep, run)
    _convicted_by_timeout(dep, job, sybil)
    bounty = H.bounty(CFG.trainer_stake)
    burned = CFG.trainer_stake - bounty
    assert 0 < bounty < CFG.trainer_stake
    assert dep.job_status(job) == JobStatus.FRAUDULENT
    assert dep.owed(sybil) == CFG.challenger_bond + bounty and dep.owed(dep.trainer) == 0
    assert dep.owed(dep.client) == CFG.payment
    assert dep.call(dep.registry.functions.totalBurned()) == burned
    (ev,) = dep.events(dep.registry, "JobFraudulent")
    assert (ev.job, ev.winner, ev.reward, ev.refund, ev.burned) == (
        job, sybil, CFG.challenger_bond + bounty, CFG.payment, burned
    )
    # The pair put in the stake and a bond and gets back the bond and the bounty: it loses the burn.
    put_in = CFG.trainer_stake + CFG.challenger_bond
    assert put_in - (dep.owed(dep.trainer) + dep.owed(sybil)) == burned
    for who in (sybil, dep.client):
        dep.tx(dep.registry.functions.withdraw(), who)
    # Nothing left but the burn: balance = totalOwed + totalBurned + escrow.
    assert dep.w3.eth.get_balance(dep.registry.address) == burned
    assert dep.call(dep.registry.functions.totalOwed()) == 0


def test_several_honest_challengers_of_one_fraudulent_job_never_lose(dep, run):
    """Three challengers dispute a job that is then convicted: the first winner gets bond + bounty,
    the others close their games with their bonds back; none ends below its bond."""
    job = H.active_job(dep, run)
    others = [H.challenge(dep, job, 1, challenger=c) for c in (dep.challenger2, dep.anyone)]
    _convicted_by_timeout(dep, job, dep.challenger)
    for gid in others:
        dep.tx(dep.game.functions.closeGame(gid), dep.anyone)
    assert dep.owed(dep.challenger) == CFG.challenger_bond + H.bounty(CFG.trainer_stake)
    assert dep.owed(dep.challenger2) == dep.owed(dep.anyone) == CFG.challenger_bond
    assert dep.call(dep.registry.functions.escrowOf(job)) == 0
    assert dep.call(dep.registry.functions.totalBurned()) == CFG.trainer_stake - H.bounty(CFG.trainer_stake)


def test_burned_stakes_add_up_over_jobs_and_are_never_withdrawable(dep, run):
    jobs = [H.active_job(dep, run) for _ in range(2)]
    for job in jobs:
        _convicted_by_timeout(dep, job, dep.challenger)
    burned = 2 * (CFG.trainer_stake - H.bounty(CFG.trainer_stake))
    assert dep.call(dep.registry.functions.totalBurned()) == burned
    for who in (dep.challenger, dep.client):
        dep.tx(dep.registry.functions.withdraw(), who)
    for who in (dep.deployer, dep.trainer, dep.game.address):  # nobody is owed the burn
        assert dep.owed(who) == 0
    with reverts("NothingOwed", dep.deployer):
        dep.dry(dep.registry.functions.withdraw(), dep.deployer)
    assert dep.w3.eth.get_balance(dep.registry.address) == burned


def test_reclaim_pays_the_client_the_bounty_not_the_stake_and_waits_for_open_games(dep, run):
    """The client of an overdue job may be the trainer's sybil: it gets its payment and the bounty,
    the rest is burned. While a game runs, reclaim reverts: the game's winner earns the bounty."""
    run = H.simulate(replace(CFG, challenge_window=3 * CFG.posting_period))
    job = H.active_job(dep, run, post=False)
    H.post_intervals(dep, job, run, upto=1)
    deadline = dep.call(dep.registry.functions.postingDeadline(job, 1))
    dep.at(deadline - 100)
    gid = H.challenge(dep, job, 0)  # a false challenge; the trainer reveals, the challenger is silent
    assert H.Trainer(dep, run).move(gid, dep.view(gid))
    dep.at(deadline + 1)
    with reverts("GamesOpen", job, 1):
        dep.dry(dep.registry.functions.reclaimJob(job), dep.client)
    res = H.play(dep, gid, H.Trainer(dep, run), _Silent(dep, dep.challenger))
    assert res.status == H.GameStatus.TRAINER_WON
    dep.tx(dep.registry.functions.reclaimJob(job), dep.client)
    bounty = H.bounty(CFG.trainer_stake)
    assert dep.owed(dep.client) == CFG.payment + bounty
    assert dep.owed(dep.trainer) == CFG.challenger_bond  # the game it won
    assert dep.call(dep.registry.functions.totalBurned()) == CFG.trainer_stake - bounty
    (ev,) = dep.events(dep.registry, "JobReclaimed")
    assert (ev.job, ev.overdue, ev.refund) == (job, 1, CFG.payment + bounty)
