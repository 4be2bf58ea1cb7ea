"""Data availability end to end on the embedded chain, with real training: a trainer withholds
its artifacts from the store the auditor reads; the auditor demands them on-chain, the trainer
answers from its own store, and the auditor replays the job from the chain's data alone (every
byte re-verified against the posted roots) and signs it off. A trainer that withholds and does
not answer loses its stake to the auditor."""

from __future__ import annotations

import tempfile

from protocol.auditor import AuditorAgent
from protocol.availability import OnChainArtifacts
from protocol.demo import create_job, default_spec
from protocol.deploy import DEV_FLOORS
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactStore
from protocol.trainer import TrainerAgent

TERMS = Terms()


def _job(world):
    proto, store, accounts = world
    ctx = JobContext.of(default_spec("mlp"))
    job = create_job(proto, accounts["client"], accounts["trainer"], ctx, TERMS)
    trainer = TrainerAgent(proto, accounts["trainer"], ctx, store, job)
    trainer.accept(TERMS)
    while trainer.run_interval() is not None:
        pass
    withheld = ArtifactStore(tempfile.mkdtemp())  # what the trainer serves: nothing
    onchain = OnChainArtifacts(proto, accounts["auditor"], ctx, job, TERMS.challenger_bond)
    auditor = AuditorAgent(proto, accounts["auditor"], ctx, withheld, job, onchain=onchain)
    return proto, ctx, job, trainer, auditor, onchain


def _fee(proto, demand: int) -> int:
    return int(proto.chain.call(proto.availability.functions.getDemand(demand))[12])


def _owed(proto, account) -> int:
    return int(proto.chain.call(proto.registry.functions.owed(account)))


def test_withheld_artifacts_are_demanded_answered_and_replayed_from_chain_data(fresh_demo_world) -> None:
    proto, ctx, job, trainer, auditor, onchain = _job(fresh_demo_world)
    rounds = 0
    while not auditor.signed_off():
        assert rounds < 12, (auditor.withheld, onchain.demanded)
        assert auditor.audit() is None
        trainer.answer_demands()
        rounds += 1
    assert auditor.verified == ctx.n_intervals and not auditor.flagged
    assert onchain.demanded  # the replay ran on published data only
    registry = proto.registry.functions
    assert int(proto.chain.call(registry.getJob(job))[5]) == 0  # every demand answered (no open game)
    # bonds back, and what the answers did not earn of the fees; the trainer earned the rest, at
    # least its answers' gas at the fee's gas price (the demands cost the honest trainer nothing)
    fees = sum(_fee(proto, d) for d in onchain.demanded)
    earned = _owed(proto, trainer.account)
    assert _owed(proto, auditor.account) == TERMS.challenger_bond * len(onchain.demanded) + fees - earned
    price = int(proto.chain.call(proto.availability.functions.feeGasPrice()))
    assert earned >= price * sum(g for _, g in trainer._responder.gas) > 0
    max_gas = max(g for _, g in trainer._responder.gas)
    assert max_gas < 16_777_216
    # the answers extended the windows: finalize waits for them, then pays the trainer
    end = max(int(proto.chain.call(registry.windowEnd(job, i))) for i in range(ctx.n_intervals))
    proto.chain.advance_time(end - proto.chain.now() + 1)
    trainer.finalize()
    assert trainer.status() == "finalized"


def test_trainer_that_withholds_and_does_not_answer_loses_its_stake(fresh_demo_world) -> None:
    proto, ctx, job, trainer, auditor, onchain = _job(fresh_demo_world)
    assert auditor.audit() is None and onchain.demanded  # demands made; the trainer stays silent
    proto.chain.advance_time(TERMS.clock + 1)
    assert auditor.audit() is None  # the expired demand is claimed
    assert trainer.status() == "fraudulent"
    bounty = TERMS.trainer_stake * DEV_FLOORS.bounty_bps // 10_000  # the rest of the stake is burned
    fees = sum(_fee(proto, d) for d in onchain.demanded)  # refunded with the conviction
    assert _owed(proto, auditor.account) == TERMS.challenger_bond * len(onchain.demanded) + bounty + fees


def test_the_auditor_re_verifies_published_data_and_refuses_tampered_bytes(fresh_demo_world, monkeypatch) -> None:
    """Published data is used only after Python rebuilt the posted roots from it: event bytes
    altered after the fact (as a lying node would serve them) are refused as corrupt."""
    import pytest
    import torch

    import vtrain.numerics.canonical as canonical
    from vtrain.errors import CorruptArtifact
    from vtrain.numerics import native_rows

    # op logs to tamper with: without the exact-grid rule the demo MLP logs its exact ties (entries
    # the contract upholds as well); with it, its logs are empty
    monkeypatch.setattr(native_rows, "_LIB", None)  # the numpy path, where the rule is grid_exact
    monkeypatch.setattr(canonical, "grid_exact", lambda kind, t, s_abs=None: torch.zeros(t.shape[0], dtype=torch.bool))
    proto, ctx, job, trainer, auditor, onchain = _job(fresh_demo_world)
    for _ in range(3):  # step records, then op logs of interval 0
        auditor.audit()
        trainer.answer_demands()
    assert onchain.get_log(job, 1)  # all of interval 0 is published and verified
    ev = onchain.events
    good_steps, good_logs = [dict(a) for a in ev.steps], [dict(a) for a in ev.logs]

    ev.steps[0]["logRoot"] = b"\x01" * 32
    onchain._verified_records.clear()
    with pytest.raises(CorruptArtifact, match="do not rebuild its posted root"):
        onchain.get_step(job, 1)
    ev.steps[:] = good_steps

    onchain._verified_records.clear()
    onchain._verified_logs.clear()
    i = next(k for k, a in enumerate(ev.logs) if len(a["leaves"]) > 18)
    leaves = bytearray(ev.logs[i]["leaves"])
    leaves[9 + 4] ^= 3  # an entry's code
    ev.logs[i]["leaves"] = bytes(leaves)
    with pytest.raises(CorruptArtifact, match="do not rebuild its log root"):
        onchain.get_log(job, int(ev.logs[i]["step"]))
    ev.logs[:] = good_logs
