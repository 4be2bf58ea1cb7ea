"""DataAvailability: demands for committed data, answers proven against the posted roots,
timeouts, window extension, malformed-log proofs; registry hooks. Every test ends with the
solvency invariant (fixture ``dep``)."""

from __future__ import annotations

from dataclasses import replace

import da_harness as D
import game_harness as H
import pytest
from game_harness import JobStatus, reverts

from protocol import availability as A

CFG = H.JobConfig()  # 6 steps, K = 4: intervals [1..4], [5..6]; window 1000 s, clock 500 s
OK, ANSWERED, TIMED_OUT, CONVICTED, CLOSED = 1, 2, 3, 4, 5


@pytest.fixture(scope="module")
def lr() -> D.LogRun:
    return D.with_logs(H.simulate(CFG))


def _active(dep, lr: D.LogRun, post: bool = True) -> int:
    return H.active_job(dep, lr.run, post=post)


def _update0(lr: D.LogRun) -> int:
    return lr.run.graph.index["update0"]


def test_constants_match_the_contract(dep):
    f = dep.da.functions
    assert dep.call(f.MAX_OP_ROOTS()) == A.MAX_OP_ROOTS
    assert dep.call(f.MAX_LOG_LEAVES()) == A.MAX_LOG_LEAVES
    assert dep.call(f.NO_POSITION()) == A.NO_POSITION
    assert dep.call(f.MAX_TO_INDEX()) == A.MAX_TO_INDEX
    assert dep.call(f.ANSWER_BASE_GAS()) == A.ANSWER_BASE_GAS
    assert dep.call(f.GAS_PER_ROOT()) == A.GAS_PER_ROOT
    assert dep.call(f.GAS_PER_LEAF()) == A.GAS_PER_LEAF
    assert dep.call(f.feeGasPrice()) == H.DA_FEE_GAS_PRICE == A.DEV_FEE_GAS_PRICE


# ------------------------------------------------------------------ answered demands


def test_step_demand_answered_publishes_the_record_and_returns_the_bond(dep, lr):
    job = _active(dep, lr)
    s = 3
    fee = D.step_fee(dep, job)
    assert fee == A.step_demand_fee(H.DA_FEE_GAS_PRICE, CFG.n_slots, lr.run.graph.n_ops, 0) > 0
    did = D.demand_step(dep, job, 0, s)
    assert D.demand(dep, did)["fee"] == fee
    assert dep.job(job)["openGames"] == 1
    r = dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 0, s)), dep.trainer)
    (ev,) = dep.events(dep.da, "StepPublished")
    rec = lr.run.steps[s]
    assert ev.stateRoot == rec.state_root and ev.logRoot == rec.log_root
    assert list(ev.components) == rec.comp_roots and list(ev.opLogRoots) == rec.op_log_roots
    assert D.demand(dep, did)["status"] == ANSWERED
    assert dep.job(job)["openGames"] == 0
    assert dep.owed(dep.challenger) == CFG.challenger_bond  # the bond back; the fee paid the answer
    assert dep.owed(dep.trainer) == fee
    # the fee covers the answer's gas at the fee's gas price (the trainer answers at no loss)
    assert fee >= r.gasUsed * H.DA_FEE_GAS_PRICE, (fee // H.DA_FEE_GAS_PRICE, r.gasUsed)
    answered_at = dep.w3.eth.get_block(r.blockNumber)["timestamp"]
    assert dep.call(dep.registry.functions.windowEnd(job, 0)) >= answered_at + CFG.clock
    assert r.gasUsed < H.TX_GAS


def test_log_demand_answered_with_the_bracketing_run(dep, lr):
    job = _active(dep, lr)
    s, op = 2, _update0(lr)
    leaves = lr.log(s, op)  # LOW, index 3, index 70, HIGH
    fee = D.log_fee(dep, 4, 60)
    assert fee == A.log_demand_fee(H.DA_FEE_GAS_PRICE, 4, 60)  # priced on 56 + 2 leaves
    did = D.demand_log(dep, job, 0, s, op, 4, 60)  # no entry in [4, 60): the run 3 -> 70 proves it
    r = dep.tx(dep.da.functions.answerLog(did, D.answer_run_for(lr, 0, s, op, 4, 60)), dep.trainer)
    (ev,) = dep.events(dep.da, "LogPublished")
    assert ev.position == 1 and ev.size == len(leaves) and ev.leaves == leaves[1] + leaves[2]
    assert D.demand(dep, did)["status"] == ANSWERED
    assert dep.call(dep.da.functions.logSize(job, s, op)) == len(leaves)
    # the trainer earns the fee of the 2 leaves it published; the demander gets the rest back
    earned = A.log_answer_earned(H.DA_FEE_GAS_PRICE, fee, 2)
    assert earned < fee and dep.owed(dep.trainer) == earned
    assert dep.owed(dep.challenger) == CFG.challenger_bond + fee - earned
    assert earned >= r.gasUsed * H.DA_FEE_GAS_PRICE, (earned // H.DA_FEE_GAS_PRICE, r.gasUsed)


def test_long_log_is_published_in_pages_chained_by_position(dep):
    n = A.MAX_LOG_LEAVES + 900
    run = H.simulate(CFG)
    op = run.graph.index["update0"]
    raw = D.entries_leaves([(3 * k, 1 + k % 3, 0x3F800000 if k % 3 == 2 else 0) for k in range(n)])
    lr = D.with_logs(run, {(2, op): raw})
    job = _active(dep, lr)
    got: dict[int, bytes] = {}
    start, lo, gas = 0, 0, []
    while True:
        did = D.demand_log(dep, job, 0, 2, op, lo, A.MAX_TO_INDEX, start)
        before = dep.owed(dep.trainer)
        r = dep.tx(dep.da.functions.answerLog(did, D.answer_run_for(lr, 0, 2, op, lo, A.MAX_TO_INDEX, start)),
                   dep.trainer)
        gas.append(r.gasUsed)
        # every page, the full one included, earns at least its gas at the fee's price
        assert dep.owed(dep.trainer) - before >= r.gasUsed * H.DA_FEE_GAS_PRICE
        ev = dep.events(dep.da, "LogPublished")[-1]
        for k in range(len(ev.leaves) // 9):
            got[ev.position + k] = ev.leaves[9 * k: 9 * k + 9]
        if ev.position + len(ev.leaves) // 9 == ev.size:
            break
        start = ev.position + len(ev.leaves) // 9 - 1
        lo = int.from_bytes(got[start][:4], "big")
    assert [got[p] for p in range(len(raw))] == raw
    assert len(gas) == 2 and max(gas) < H.TX_GAS  # a full page of MAX_LOG_LEAVES fits one transaction
    assert dep.job(job)["openGames"] == 0


def test_step_record_of_a_large_graph_is_paged_and_fits_one_transaction(dep):
    cfg = H.JobConfig(n_steps=1, interval_length=1, n_slots=1024)  # 3076 ops: 4 pages of op roots
    lr = D.with_logs(H.simulate(cfg))
    job = H.active_job(dep, lr.run)
    n_ops = lr.run.graph.n_ops
    roots: list[bytes] = []
    for first in range(0, n_ops, A.MAX_OP_ROOTS):
        did = D.demand_step(dep, job, 0, 1, first)
        before = dep.owed(dep.trainer)
        r = dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 0, 1, first)), dep.trainer)
        assert r.gasUsed < 16_777_216, r.gasUsed  # 1024 components + 1024 op roots
        assert dep.owed(dep.trainer) - before >= r.gasUsed * H.DA_FEE_GAS_PRICE, r.gasUsed
        roots += list(dep.events(dep.da, "StepPublished")[-1].opLogRoots)
    assert roots == lr.op_roots(1)


# ------------------------------------------------------------------ timeouts


def test_unanswered_demand_times_out_and_convicts_the_trainer(dep, lr):
    job = _active(dep, lr)
    did = D.demand_step(dep, job, 1, 5)
    deadline = D.demand(dep, did)["clock"] >> 64  # duration
    start = D.demand(dep, did)["clock"] & (2**64 - 1)
    dep.at(start + deadline)
    with reverts("DeadlineNotPassed"):
        dep.dry(dep.da.functions.claimTimeout(did), dep.anyone)
    dep.advance(1)
    with reverts("ClockExpired"):
        dep.dry(dep.da.functions.answerStep(did, *D.step_args(lr, 1, 5)), dep.trainer)
    dep.tx(dep.da.functions.claimTimeout(did), dep.anyone)
    assert dep.job_status(job) == JobStatus.FRAUDULENT
    assert D.demand(dep, did)["status"] == TIMED_OUT
    # the fee comes back with the conviction: bond + bounty + fee
    fee = D.demand(dep, did)["fee"]
    assert fee > 0 and dep.owed(dep.challenger) == CFG.challenger_bond + H.bounty(CFG.trainer_stake) + fee
    assert dep.owed(dep.trainer) == 0
    assert dep.owed(dep.client) == CFG.payment
    assert dep.job(job)["openGames"] == 0


def test_answer_at_the_deadline_second_is_valid(dep, lr):
    job = _active(dep, lr)
    did = D.demand_step(dep, job, 0, 1)
    c = D.demand(dep, did)["clock"]
    dep.at((c & (2**64 - 1)) + (c >> 64))
    dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 0, 1)), dep.trainer)
    assert D.demand(dep, did)["status"] == ANSWERED


# ------------------------------------------------------------------ forged answers


def test_forged_step_answers_revert(dep, lr):
    job = _active(dep, lr)
    did = D.demand_step(dep, job, 0, 2)
    comps, log_root, proof, page, sibs = D.step_args(lr, 0, 2)
    f = dep.da.functions
    bad = [comps[1], comps[0]]
    with reverts("InvalidProof"):
        dep.dry(f.answerStep(did, bad, log_root, proof, page, sibs), dep.trainer)
    with reverts("WrongLength"):
        dep.dry(f.answerStep(did, comps[:1], log_root, proof, page, sibs), dep.trainer)
    forged = list(page)
    forged[0] = b"\x11" * 32
    with reverts("RangeMismatch"):
        dep.dry(f.answerStep(did, comps, log_root, proof, forged, sibs), dep.trainer)
    with reverts("WrongLength"):
        dep.dry(f.answerStep(did, comps, log_root, proof, page[:-1], sibs), dep.trainer)
    with reverts("Unauthorized", dep.anyone, dep.trainer):
        dep.dry(f.answerStep(did, comps, log_root, proof, page, sibs), dep.anyone)
    with reverts("WrongKind"):
        dep.dry(f.answerLog(did, D.run_args(lr, 0, 2, 0, 0, 2)), dep.trainer)
    dep.tx(f.answerStep(did, comps, log_root, proof, page, sibs), dep.trainer)
    with reverts("DemandNotOpen", did, ANSWERED):
        dep.dry(f.answerStep(did, comps, log_root, proof, page, sibs), dep.trainer)


def test_forged_log_answers_revert(dep, lr):
    job = _active(dep, lr)
    s, op = 2, _update0(lr)
    did = D.demand_log(dep, job, 0, s, op, 0, 50)
    f = dep.da.functions
    good = D.answer_run_for(lr, 0, s, op, 0, 50)  # LOW, 3, 70
    assert good[5] == 0 and len(good[7]) == 27

    def with_(k: int, v) -> tuple:
        t = list(good)
        t[k] = v
        return tuple(t)

    forged = good[7][:9] + D.leaf(5, 1, 0) + good[7][18:]
    with reverts("RangeMismatch"):
        dep.dry(f.answerLog(did, with_(7, forged)), dep.trainer)
    with reverts("InvalidProof"):  # another op's log root
        dep.dry(f.answerLog(did, with_(3, lr.op_roots(s)[0])), dep.trainer)
    with reverts("InvalidProof"):  # a step leaf that is not in the interval
        dep.dry(f.answerLog(did, with_(0, b"\x22" * 32)), dep.trainer)
    with reverts("BadRunLength"):
        dep.dry(f.answerLog(did, with_(7, good[7][:-1])), dep.trainer)
    short = D.run_args(lr, 0, s, op, 0, 2)  # LOW, 3: does not reach key 51
    with reverts("RunDoesNotAnswer"):
        dep.dry(f.answerLog(did, short), dep.trainer)
    late = D.run_args(lr, 0, s, op, 1, 4)  # starts at key 4 > fromIndex 0
    with reverts("RunDoesNotAnswer"):
        dep.dry(f.answerLog(did, late), dep.trainer)
    dep.tx(f.answerLog(did, good), dep.trainer)
    did2 = D.demand_log(dep, job, 0, s, op, 80, 90, start=1)
    with reverts("WrongPosition", 2, 1):
        dep.dry(f.answerLog(did2, D.run_args(lr, 0, s, op, 2, 4)), dep.trainer)


def test_claimed_log_size_is_bound_by_the_first_answer(dep):
    """Leaves [4, 6) of a 6-leaf tree also verify as [2, 4) of a claimed 4-leaf tree (same path
    shape): once an answer bound size 6, the other claim is refused, so positions chain."""
    run = H.simulate(CFG)
    op = run.graph.index["update0"]
    lr = D.with_logs(run, {(2, op): D.entries_leaves([(1, 1, 0), (3, 2, 0), (5, 1, 0), (7, 2, 0)])})
    job = _active(dep, lr)
    f = dep.da.functions
    did = D.demand_log(dep, job, 0, 2, op, 0, 3, start=0)
    dep.tx(f.answerLog(did, D.answer_run_for(lr, 0, 2, op, 0, 3, 0)), dep.trainer)
    assert dep.call(f.logSize(job, 2, op)) == 6
    did2 = D.demand_log(dep, job, 0, 2, op, 8, 20)
    honest = D.answer_run_for(lr, 0, 2, op, 8, 20)
    assert honest[5:7] == (4, 6)
    other = honest[:5] + (2, 4) + honest[7:]
    with reverts("WrongLogSize", 4, 6):
        dep.dry(f.answerLog(did2, other), dep.trainer)
    dep.tx(f.answerLog(did2, honest), dep.trainer)


# ------------------------------------------------------------------ malformed logs


def _malformed(kind: str) -> list[bytes]:
    e = {
        "duplicate_index": [(3, 1, 0), (3, 2, 0), (9, 1, 0)],
        "out_of_order": [(9, 1, 0), (3, 2, 0)],
        "bad_code": [(3, 7, 0), (9, 1, 0)],
        "zero_code": [(3, 0, 0)],
        "down_with_value": [(3, 1, 0x3F800000)],
    }
    if kind in e:
        return D.entries_leaves(e[kind])
    if kind == "first_not_low":
        return [D.leaf(1, 1, 0), D.leaf(4, 2, 0), D.HIGH]
    if kind == "last_not_high":
        return [D.LOW, D.leaf(4, 2, 0), D.leaf(8, 1, 0)]
    if kind == "high_not_last":
        return [D.LOW, D.HIGH, D.leaf(4, 2, 0), D.HIGH]
    raise KeyError(kind)


#: (kind, run [first, end) that shows it, expected Malformation, claimed position of the fault)
MALFORMED = [
    ("duplicate_index", (1, 3), 1, 1),
    ("out_of_order", (1, 3), 1, 1),
    ("bad_code", (1, 2), 2, 1),
    ("zero_code", (1, 2), 2, 1),
    ("down_with_value", (1, 2), 2, 1),
    ("first_not_low", (0, 1), 3, 0),
    ("last_not_high", (2, 3), 4, 2),
    ("high_not_last", (1, 3), 1, 1),
]


@pytest.mark.parametrize(("kind", "span", "reason", "at"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_proveMalformedLog_convicts_for_each_malformation(dep, kind, span, reason, at):
    run = H.simulate(CFG)
    op = run.graph.index["update0"]
    lr = D.with_logs(run, {(2, op): _malformed(kind)})
    job = _active(dep, lr)
    args = D.run_args(lr, 0, 2, op, *span)
    dep.tx(dep.da.functions.proveMalformedLog(job, 0, 2, op, args), dep.anyone)
    (ev,) = dep.events(dep.da, "LogMalformed")
    assert (ev.reason, ev.at, ev.winner) == (reason, at, dep.anyone)
    assert dep.job_status(job) == JobStatus.FRAUDULENT
    assert dep.owed(dep.anyone) == H.bounty(CFG.trainer_stake)
    assert dep.owed(dep.client) == CFG.payment


def test_proveMalformedLog_of_a_well_formed_log_reverts(dep, lr):
    job = _active(dep, lr)
    op = _update0(lr)
    f = dep.da.functions
    for span in [(0, 4), (0, 1), (3, 4), (1, 3)]:
        with reverts("LogWellFormed"):
            dep.dry(f.proveMalformedLog(job, 0, 2, op, D.run_args(lr, 0, 2, op, *span)), dep.anyone)
    # a malformed run of another step's log does not count for this one
    run = H.simulate(CFG)
    bad = D.with_logs(run, {(2, op): _malformed("out_of_order")})
    with reverts("InvalidProof"):
        dep.dry(f.proveMalformedLog(job, 0, 2, op, D.run_args(bad, 0, 2, op, 1, 3)), dep.anyone)


def test_answer_showing_a_malformed_log_convicts_the_trainer(dep):
    run = H.simulate(CFG)
    op = run.graph.index["update0"]
    lr = D.with_logs(run, {(2, op): _malformed("duplicate_index")})
    job = _active(dep, lr)
    did = D.demand_log(dep, job, 0, 2, op, 0, 20, start=0)
    dep.tx(dep.da.functions.answerLog(did, D.run_args(lr, 0, 2, op, 0, 5)), dep.trainer)
    assert D.demand(dep, did)["status"] == CONVICTED
    assert dep.job_status(job) == JobStatus.FRAUDULENT
    fee = D.demand(dep, did)["fee"]  # a malformed answer earns nothing: the fee goes back too
    assert dep.owed(dep.challenger) == CFG.challenger_bond + H.bounty(CFG.trainer_stake) + fee
    assert dep.owed(dep.trainer) == 0
    assert dep.job(job)["openGames"] == 0


def test_proveMalformedLog_needs_an_active_job(dep):
    run = H.simulate(CFG)
    op = run.graph.index["update0"]
    lr = D.with_logs(run, {(2, op): _malformed("bad_code")})
    job = _active(dep, lr)
    args = D.run_args(lr, 0, 2, op, 1, 2)
    dep.tx(dep.da.functions.proveMalformedLog(job, 0, 2, op, args), dep.anyone)
    with reverts("WrongJobStatus"):
        dep.dry(dep.da.functions.proveMalformedLog(job, 0, 2, op, args), dep.challenger)


# ------------------------------------------------------------------ windows and finalize


def test_finalize_waits_for_open_demands_and_the_extended_window(dep, lr):
    job = _active(dep, lr)
    end1 = dep.call(dep.registry.functions.windowEnd(job, 1))
    dep.at(end1)  # the last second of the last window
    did = D.demand_step(dep, job, 1, 6)
    dep.advance(CFG.clock - 1)  # the answer comes at the deadline second
    with reverts("GamesOpen"):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    r = dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 1, 6)), dep.trainer)
    t = dep.w3.eth.get_block(r.blockNumber)["timestamp"]
    ext = dep.call(dep.registry.functions.windowEnd(job, 1))
    assert ext == t + CFG.clock <= end1 + 2 * CFG.clock
    with reverts("WindowStillOpen"):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    # the auditor can still challenge in the extension; a further demand cannot extend it again
    with reverts("DemandWindowClosed"):
        dep.dry(dep.da.functions.demandStep(job, 1, 6, 0), dep.challenger, value=CFG.challenger_bond)
    H.challenge(dep, job, 1)
    assert dep.job(job)["openGames"] == 1


@pytest.fixture(scope="module")
def lr_short_period() -> D.LogRun:
    """CFG with the posting period at its floor (200 s), under two clocks (1,000 s)."""
    return D.with_logs(H.simulate(replace(CFG, posting_period=H.MIN_POSTING)))


def test_extension_of_an_earlier_interval_delays_finalize(dep, lr_short_period):
    # both intervals posted at once: their windows end one posting period (200 s) apart, less than
    # the 2 * clock an answered demand may extend interval 0's by
    lr = lr_short_period
    job = _active(dep, lr)
    end0 = dep.call(dep.registry.functions.windowEnd(job, 0))
    end1 = dep.call(dep.registry.functions.windowEnd(job, 1))
    assert end1 - end0 == H.MIN_POSTING < 2 * CFG.clock
    dep.at(end0)
    did = D.demand_step(dep, job, 0, 1)
    dep.advance(CFG.clock - 2)
    dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 0, 1)), dep.trainer)
    ext0 = dep.call(dep.registry.functions.windowEnd(job, 0))
    assert ext0 > end1  # interval 0's window now closes after the last one
    assert dep.now() > end1
    with reverts("WindowStillOpen", job, ext0):
        dep.dry(dep.registry.functions.finalize(job), dep.anyone)
    dep.at(ext0 + 1)
    dep.tx(dep.registry.functions.finalize(job), dep.anyone)
    assert dep.job_status(job) == JobStatus.FINALIZED


def test_demand_outside_its_window_or_interval_reverts(dep, lr):
    job = _active(dep, lr, post=False)
    H.post_intervals(dep, job, lr.run, upto=1)
    f = dep.da.functions
    fee = D.step_fee(dep, job)
    b = CFG.challenger_bond + fee
    with reverts("IntervalNotPosted"):
        dep.dry(f.demandStep(job, 1, 5, 0), dep.challenger, value=b)
    with reverts("StepNotInInterval"):
        dep.dry(f.demandStep(job, 0, 5, 0), dep.challenger, value=b)
    with reverts("OpOutOfRange"):
        dep.dry(f.demandStep(job, 0, 1, lr.run.graph.n_ops), dep.challenger, value=b)
    with reverts("BadIndexRange"):
        dep.dry(f.demandLog(job, 0, 1, 0, 5, 5, A.NO_POSITION), dep.challenger, value=b)
    with reverts("BadIndexRange"):
        dep.dry(f.demandLog(job, 0, 1, 0, 0, A.MAX_TO_INDEX + 1, A.NO_POSITION), dep.challenger, value=b)
    with reverts("WrongValue", b - 1, b):
        dep.dry(f.demandStep(job, 0, 1, 0), dep.challenger, value=b - 1)
    with reverts("WrongValue", CFG.challenger_bond, b):  # the bond alone: a demand is not free
        dep.dry(f.demandStep(job, 0, 1, 0), dep.challenger, value=CFG.challenger_bond)
    dep.at(dep.call(dep.registry.functions.windowEnd(job, 0)) + 1)
    with reverts("DemandWindowClosed"):
        dep.dry(f.demandStep(job, 0, 1, 0), dep.challenger, value=b)


def test_registry_caps_window_extensions(dep, lr):
    """extendWindow is only the availability contract's, and never past postedAt + window + 2 clock."""
    job = _active(dep, lr)
    reg = dep.registry.functions
    with reverts("Unauthorized"):
        dep.dry(reg.extendWindow(job, 0, 1), dep.anyone)
    with reverts("Unauthorized"):
        dep.dry(reg.releaseDemand(job, dep.anyone, 0, 0), dep.anyone)
    with reverts("Unauthorized"):
        dep.dry(reg.refundFee(job, dep.anyone, 0), dep.anyone)
    with reverts("Unauthorized"):
        dep.dry(reg.lockDemand(job, 0, dep.anyone, 0), dep.anyone, value=CFG.challenger_bond)
    with reverts("Unauthorized"):
        dep.dry(reg.convict(job, dep.anyone), dep.anyone)
    # a registry bound to an account as its availability contract, to call the hook directly
    fresh = dep.deploy("JobRegistry", *H.FLOORS)
    dep.tx(fresh.functions.setAvailability(dep.anyone), dep.deployer)
    dep.tx(fresh.functions.createJob(lr.run.job_params(dep.trainer)), dep.client, value=CFG.payment)
    dep.tx(fresh.functions.acceptJob(1), dep.trainer, value=CFG.trainer_stake)
    dep.tx(fresh.functions.postInterval(1, 0, lr.run.interval_roots[0]), dep.trainer)
    base = dep.call(fresh.functions.windowEnd(1, 0))
    cap = base + 2 * CFG.clock
    with reverts("ExtensionTooLong", 1, 0, cap + 1, cap):
        dep.dry(fresh.functions.extendWindow(1, 0, cap + 1), dep.anyone)
    dep.tx(fresh.functions.extendWindow(1, 0, base - 5), dep.anyone)  # earlier: no change
    assert dep.call(fresh.functions.windowEnd(1, 0)) == base
    dep.tx(fresh.functions.extendWindow(1, 0, cap), dep.anyone)
    assert dep.call(fresh.functions.windowEnd(1, 0)) == cap
    with reverts("IntervalNotPosted"):
        dep.dry(fresh.functions.extendWindow(1, 1, cap), dep.anyone)
    # settle the fresh job so the solvency check (of dep's registry) is not concerned with it
    dep.tx(fresh.functions.convict(1, dep.anyone), dep.anyone)
    assert dep.call(fresh.functions.jobStatus(1)) == JobStatus.FRAUDULENT


def test_setAvailability_once_and_by_the_deployer_only(dep):
    with reverts("AvailabilityAlreadySet", dep.da.address):
        dep.dry(dep.registry.functions.setAvailability(dep.anyone), dep.deployer)
    fresh = dep.deploy("JobRegistry", *H.FLOORS)
    with reverts("Unauthorized", dep.anyone, dep.deployer):
        dep.dry(fresh.functions.setAvailability(dep.anyone), dep.anyone)


# ------------------------------------------------------------------ fraudulent jobs


def test_demands_on_a_fraudulent_job_close_with_the_bond_refunded(dep, lr):
    job = _active(dep, lr)
    first = D.demand_step(dep, job, 0, 1)
    second = D.demand_step(dep, job, 0, 2, who=dep.challenger2)
    with reverts("WrongJobStatus"):
        dep.dry(dep.da.functions.closeDemand(second), dep.anyone)
    dep.advance(CFG.clock + 1)
    dep.tx(dep.da.functions.claimTimeout(first), dep.anyone)
    with reverts("WrongJobStatus"):
        dep.dry(dep.da.functions.answerStep(second, *D.step_args(lr, 0, 2)), dep.trainer)
    with reverts("WrongJobStatus"):
        dep.dry(dep.da.functions.claimTimeout(second), dep.anyone)
    dep.tx(dep.da.functions.closeDemand(second), dep.anyone)
    assert D.demand(dep, second)["status"] == CLOSED
    assert dep.owed(dep.challenger2) == CFG.challenger_bond + D.demand(dep, second)["fee"]
    assert dep.job(job)["openGames"] == 0
    with reverts("DemandNotOpen"):
        dep.dry(dep.da.functions.closeDemand(second), dep.anyone)


@pytest.mark.parametrize("price", [0, 2**128 // (A.ANSWER_BASE_GAS + A.GAS_PER_LEAF * A.MAX_LOG_LEAVES) + 1])
def test_constructor_rejects_a_free_or_overflowing_fee_price(dep, price):
    """A zero price makes demands free again (griefing); one whose full-page fee overflows the
    Demand record's uint128 is refused too."""
    from eth_tester.exceptions import TransactionFailed

    from protocol.build import load_artifact

    art = load_artifact("DataAvailability")
    data = dep.w3.eth.contract(abi=art.abi, bytecode=art.bytecode).constructor(dep.registry.address, price)
    with reverts("InvalidDeployment", "feeGasPrice", price):
        try:
            dep.w3.eth.call({"from": dep.deployer, "data": data.data_in_transaction, "gas": H.TX_GAS})
        except TransactionFailed as e:
            raise H._reverted(e) from None
