"""Challenge windows follow a chained posting schedule: interval i's window starts at start_i =
max(postedAt_i, start_{i-1} + postingPeriod) (start_0 = postedAt_0 >= acceptedAt) and ends
challengeWindow later (then demand extensions, capped from the same base), so a trainer that posts
every interval at once, early or overdue, cannot squeeze the auditors' replay of the whole job into
one window (docs/protocol.md "Challenge windows"; docs/security.md, matrix row "posts every
interval at once"). Every test ends with the solvency invariant."""

from __future__ import annotations

from dataclasses import replace

import da_harness as D
import game_harness as H
import pytest
from game_harness import JobStatus, reverts

# 12 steps, K = 4: three intervals; window 1000 s, clock 500 s, posting period 10,000 s
CFG = H.JobConfig(n_steps=12, interval_length=4)
N = CFG.n_intervals


@pytest.fixture(scope="module")
def lr() -> D.LogRun:
    return D.with_logs(H.simulate(CFG))


def _posted_at_once(dep: H.Deployment, lr: D.LogRun) -> tuple[int, int, list[int]]:
    """A job accepted and every interval posted right away: (job, acceptedAt, postedAt per interval)."""
    job = H.active_job(dep, lr.run)
    accepted = dep.job(job)["acceptedAt"]
    posted = [dep.call(dep.registry.functions.getInterval(job, i))[1] for i in range(N)]
    assert posted[-1] - accepted < CFG.challenge_window  # all of them inside the first window
    return job, accepted, posted


def _chained_ends(posted: list[int]) -> list[int]:
    """The unextended window ends of intervals posted at ``posted`` (the chained schedule)."""
    starts: list[int] = []
    for t in posted:
        starts.append(max(t, starts[-1] + CFG.posting_period) if starts else t)
    return [s + CFG.challenge_window for s in starts]


def test_intervals_posted_at_once_keep_the_windows_of_their_schedule(dep, lr):
    job, accepted, posted = _posted_at_once(dep, lr)
    reg = dep.registry.functions
    events = {ev.index: ev.windowEnd for ev in dep.events(dep.registry, "IntervalPosted", job=job)}
    ends = _chained_ends(posted)
    for i in range(N):
        assert dep.call(reg.windowEnd(job, i)) == ends[i] == events[i]
        assert ends[i] >= accepted + i * CFG.posting_period + CFG.challenge_window  # never before the schedule
        assert dep.call(reg.getInterval(job, i))[2] == ends[i] - CFG.challenge_window  # the stored start
    last = posted[0] + (N - 1) * CFG.posting_period + CFG.challenge_window
    assert dep.call(reg.windowEnd(job, N - 1)) == last > posted[-1] + CFG.challenge_window
    assert [dep.call(reg.unextendedWindowEnd(job, i)) for i in range(N + 1)] == [*events.values(), 0]
    # an auditor still replaying after postedAt + challengeWindow challenges the last interval
    dep.at(posted[-1] + CFG.challenge_window + 1)
    H.challenge(dep, job, N - 1)
    dep.at(last)  # its last second
    H.challenge(dep, job, N - 1, challenger=dep.anyone)
    assert dep.job(job)["openGames"] == 2
    with reverts("WindowClosed", job, N - 1, last, last + 1):
        dep.dry(dep.game.functions.challenge(job, N - 1), dep.challenger, value=CFG.challenger_bond)


def test_finalize_waits_for_the_last_scheduled_window(dep, lr):
    job, accepted, posted = _posted_at_once(dep, lr)
    last = posted[0] + (N - 1) * CFG.posting_period + CFG.challenge_window
    for t in (posted[-1] + CFG.challenge_window + 1, last):  # the old end has passed, the scheduled one not
        dep.at(t)
        with reverts("WindowStillOpen", job, last, t):
            dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    dep.at(last + 1)
    dep.tx(dep.registry.functions.finalize(job), dep.anyone)
    assert dep.job_status(job) == JobStatus.FINALIZED
    assert dep.owed(dep.trainer) == CFG.payment + CFG.trainer_stake


def test_an_interval_posted_after_its_scheduled_time_keeps_a_whole_window(dep, lr):
    job = H.active_job(dep, lr.run, post=False)
    accepted = dep.job(job)["acceptedAt"]
    dep.at(accepted + CFG.posting_period - 5)  # interval 0 near its deadline
    H.post_intervals(dep, job, lr.run, upto=1)
    t0 = dep.call(dep.registry.functions.getInterval(job, 0))[1]
    assert dep.call(dep.registry.functions.windowEnd(job, 0)) == t0 + CFG.challenge_window
    H.post_intervals(dep, job, lr.run, upto=2)  # interval 1 right after: its scheduled start is later
    t1 = dep.call(dep.registry.functions.getInterval(job, 1))[1]
    assert t1 < accepted + CFG.posting_period  # before its scheduled time: the window starts there
    assert dep.call(dep.registry.functions.windowEnd(job, 1)) == t0 + CFG.posting_period + CFG.challenge_window


def test_overdue_intervals_posted_at_once_get_windows_one_posting_period_apart(dep, lr):
    """A late trainer (the client has not reclaimed) posts every overdue interval together: the
    windows still close one posting period apart, not together, so the auditors get a posting
    period per interval; finalize waits for the last."""
    job = H.active_job(dep, lr.run, post=False)
    accepted = dep.job(job)["acceptedAt"]
    dep.at(accepted + N * CFG.posting_period + 100)  # every interval overdue
    H.post_intervals(dep, job, lr.run)
    reg = dep.registry.functions
    posted = [dep.call(reg.getInterval(job, i))[1] for i in range(N)]
    assert posted[-1] - posted[0] < CFG.challenge_window  # all of them inside the first window
    events = {ev.index: ev.windowEnd for ev in dep.events(dep.registry, "IntervalPosted", job=job)}
    ends = [dep.call(reg.windowEnd(job, i)) for i in range(N)]
    assert ends == [posted[0] + i * CFG.posting_period + CFG.challenge_window for i in range(N)]
    assert ends == [events[i] for i in range(N)] == [dep.call(reg.unextendedWindowEnd(job, i)) for i in range(N)]
    assert ends[-1] > posted[-1] + CFG.challenge_window  # not the posting-time window
    # interval 1 is challenged after interval 0's window closed; then each window closes in turn
    dep.at(ends[0] + 1)
    with reverts("WindowClosed", job, 0, ends[0], ends[0] + 1):
        dep.dry(dep.game.functions.challenge(job, 0), dep.challenger, value=CFG.challenger_bond)
    dep.at(ends[1])
    H.challenge(dep, job, 1)
    dep.at(ends[1] + 1)
    with reverts("WindowClosed", job, 1, ends[1], ends[1] + 1):
        dep.dry(dep.game.functions.challenge(job, 1), dep.anyone, value=CFG.challenger_bond)
    dep.at(ends[-1])
    H.challenge(dep, job, N - 1, challenger=dep.anyone)
    assert dep.job(job)["openGames"] == 2


def test_demands_and_their_extension_cap_follow_the_scheduled_window(dep, lr):
    job, accepted, posted = _posted_at_once(dep, lr)
    base = posted[0] + (N - 1) * CFG.posting_period + CFG.challenge_window
    s = (N - 1) * CFG.interval_length + 1  # the last interval's first step
    dep.at(base - 10)  # long past postedAt + challengeWindow: still accepted
    assert dep.now() > posted[-1] + CFG.challenge_window
    did = D.demand_step(dep, job, N - 1, s)
    dep.at(base)  # answered at the window's last second (inside its clock): extended by one clock
    r = dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, N - 1, s)), dep.trainer)
    t = dep.w3.eth.get_block(r.blockNumber)["timestamp"]
    assert dep.call(dep.registry.functions.windowEnd(job, N - 1)) == t + CFG.clock
    assert dep.call(dep.registry.functions.unextendedWindowEnd(job, N - 1)) == base
    with reverts("DemandWindowClosed", job, N - 1, base, base + 1):
        dep.dry(dep.da.functions.demandStep(job, N - 1, s, 0), dep.challenger,
                value=CFG.challenger_bond + D.step_fee(dep, job))
    with reverts("WindowStillOpen", job, t + CFG.clock):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    dep.at(t + CFG.clock + 1)
    dep.tx(dep.registry.functions.finalize(job), dep.anyone)
    # the cap is counted from the same base (a registry bound to an account, to call the hook)
    fresh = dep.deploy("JobRegistry", *H.FLOORS)
    dep.tx(fresh.functions.setAvailability(dep.anyone), dep.deployer)
    dep.tx(fresh.functions.createJob(lr.run.job_params(dep.trainer)), dep.client, value=CFG.payment)
    dep.tx(fresh.functions.acceptJob(1), dep.trainer, value=CFG.trainer_stake)
    for i in range(N):
        dep.tx(fresh.functions.postInterval(1, i, lr.run.interval_roots[i]), dep.trainer)
    start0 = dep.call(fresh.functions.getInterval(1, 0))[1]
    cap = start0 + (N - 1) * CFG.posting_period + CFG.challenge_window + 2 * CFG.clock
    with reverts("ExtensionTooLong", 1, N - 1, cap + 1, cap):
        dep.dry(fresh.functions.extendWindow(1, N - 1, cap + 1), dep.anyone)
    dep.tx(fresh.functions.extendWindow(1, N - 1, cap), dep.anyone)
    assert dep.call(fresh.functions.windowEnd(1, N - 1)) == cap
    dep.tx(fresh.functions.convict(1, dep.anyone), dep.anyone)  # settled: dep's solvency check ignores it


# ------------------------------------------------------------------ agents: the attack end to end


def test_a_slow_auditor_still_wins_against_a_cheat_in_the_last_of_intervals_posted_at_once(fresh_demo_world):
    """An honest-looking pre-training trainer (it trains the whole job, then posts every interval at
    once) cheats in the last of four intervals. The auditor replays one interval in 1,800 s (chain
    time passes while it replays: 7,200 s for the job), as its policy declared: the old windows
    (postedAt + 3,600 s) had all closed before it found the cheat; the chained one of interval 3
    (postedAt_0 + 3 x 7,200 + 3,600 s) is still open, and the auditor challenges and wins."""
    from protocol.agents_cli import job_refusals
    from protocol.auditor import AuditorAgent
    from protocol.cheats import PoisonSample
    from protocol.demo import MAX_ROUNDS, create_job, default_spec
    from protocol.game import STATUS_CHALLENGER_WON, STATUS_IN_PROGRESS
    from protocol.jobs import JobContext, Terms
    from protocol.policy import TermsPolicy
    from protocol.trainer import TrainerAgent

    proto, store, a = fresh_demo_world
    chain, reg = proto.chain, proto.registry.functions
    replay = 1_800
    terms = Terms(challenge_window=3_600, posting_period=7_200)
    ctx = JobContext.of(replace(default_spec("mlp"), steps=8, interval=2))
    job = create_job(proto, a["client"], a["trainer"], ctx, terms)
    last = ctx.n_intervals - 1
    assert last == 3
    # the auditor's policy takes these terms: window and posting period >= 2 x 1,800 s
    assert job_refusals(proto, job, ctx, TermsPolicy("auditor", replay_seconds=replay)) == []
    trainer = TrainerAgent(proto, a["trainer"], ctx, store, job, cheat=PoisonSample(7))  # step 7: interval 3
    trainer.accept(terms)  # pre-trains the whole job first
    while trainer.run_interval() is not None:
        pass
    accepted = int(chain.call(reg.getJob(job))[6])  # acceptedAt
    posted = [int(chain.call(reg.getInterval(job, i))[1]) for i in range(ctx.n_intervals)]
    assert posted[-1] - accepted < 60  # every interval posted at once
    assert int(chain.call(reg.windowEnd(job, last))) == posted[0] + last * terms.posting_period + terms.challenge_window

    auditor = AuditorAgent(proto, a["auditor"], ctx, store, job)
    fetch = auditor._verified_step_data

    def slow(i: int):  # noqa: ANN202 (each interval's replay takes `replay` seconds of chain time)
        chain.advance_time(replay)
        return fetch(i)

    auditor._verified_step_data = slow  # type: ignore[method-assign]
    assert auditor.audit() == last
    assert chain.now() > posted[last] + terms.challenge_window  # where the old window ended
    gid = auditor.challenge(last, terms)
    for _ in range(MAX_ROUNDS):
        sent = trainer.play() + auditor.play()
        if auditor.player.view(gid).status != STATUS_IN_PROGRESS:
            break
        if not sent:
            chain.advance_time(terms.clock + 1)
    assert auditor.player.view(gid).status == STATUS_CHALLENGER_WON
    assert trainer.status() == "fraudulent"
    bounty = terms.trainer_stake * int(chain.call(reg.bountyBps())) // 10_000
    assert int(chain.call(reg.owed(a["auditor"]))) == terms.challenger_bond + bounty
