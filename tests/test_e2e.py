"""End to end on the embedded chain: real training, real contracts, real Merkle proofs.

An honest job finalizes; every cheating trainer loses its stake to the honest auditor; a false
challenger loses its bond to the honest trainer. Balances move exactly as the rules say."""

from __future__ import annotations

import pytest

from protocol.cheats import CHEATS
from protocol.demo import default_spec, run_scenario
from protocol.jobs import Terms

TERMS = Terms()
ETH = 10**18


def _run(demo_world, name, cheat=None, false=False):
    proto, store, accounts = demo_world
    lines: list[str] = []
    r = run_scenario(proto, default_spec("mlp"), TERMS, store, accounts, name, cheat, false, lines.append)
    # what the registry holds beyond the burned stakes of convicted jobs (never withdrawable)
    burned = proto.chain.call(proto.registry.functions.totalBurned())
    registry_balance = proto.chain.w3.eth.get_balance(proto.registry.address) - burned
    return r, lines, registry_balance


def test_honest_trainer_finalizes_and_is_paid_stake_plus_payment(demo_world) -> None:
    r, lines, _ = _run(demo_world, "honest")
    assert r.verdict == "no dispute"
    assert r.final_status == "finalized"
    assert r.bonds == "client -1.00, trainer +1.00"  # the payment moved; the stake came back


@pytest.mark.parametrize(
    "cheat",
    [
        "abuse-log",
        pytest.param("tamper-weight", marks=pytest.mark.slow),
        pytest.param("poison-sample", marks=pytest.mark.slow),
        pytest.param("skip-step", marks=pytest.mark.slow),
        pytest.param("wrong-lr", marks=pytest.mark.slow),
        pytest.param("forge-explicit", marks=pytest.mark.slow),
    ],
)
def test_cheating_trainer_loses_to_the_honest_auditor(demo_world, cheat: str) -> None:
    r, lines, _ = _run(demo_world, f"cheat {cheat}", cheat=cheat)
    assert r.verdict == "challenger won", lines
    assert r.final_status == "fraudulent"
    # the bounty (half the stake) to the auditor, the rest burned; the client is refunded
    assert r.bonds == "trainer -2.00, auditor +1.00"
    assert r.moves > 10


def test_false_challenger_loses_its_bond_to_the_honest_trainer(demo_world) -> None:
    r, lines, registry_balance = _run(demo_world, "false", false=True)
    assert r.verdict == "trainer won", lines
    assert r.final_status == "finalized"
    assert r.bonds == "client -1.00, trainer +1.50, false_challenger -0.50"
    assert registry_balance == 0  # every job settled: the escrow owes nothing and holds nothing


def test_cheat_names_in_the_cli_match_the_implemented_cheats() -> None:
    from protocol.cli import CHEAT_NAMES

    assert sorted(CHEAT_NAMES) == sorted(CHEATS)
