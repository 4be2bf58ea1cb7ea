"""SmokeCounter deploys, counts and hashes through the Merkle library on all three chains."""

from __future__ import annotations

import hashlib

import pytest
from pymerkle import InmemoryTree
from web3 import Web3

from nodes import TX_GAS_CAP
from protocol.build import load_artifact

CHAINS = [
    "eth_tester_w3",
    pytest.param("hardhat_w3", marks=pytest.mark.node),
    pytest.param("anvil_w3", marks=pytest.mark.node),
]


@pytest.mark.parametrize("chain", CHAINS)
def test_smoke_counter_deploys_counts_and_matches_pymerkle_on_each_chain(
    chain: str, request: pytest.FixtureRequest
) -> None:
    w3: Web3 = request.getfixturevalue(chain)
    art = load_artifact("SmokeCounter")

    factory = w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
    tx = factory.constructor().transact({"gas": 1_000_000})
    receipt = w3.eth.wait_for_transaction_receipt(tx)
    address = receipt["contractAddress"]
    assert receipt["status"] == 1 and address is not None
    assert w3.eth.get_code(address) == bytes.fromhex(art.deployed_bytecode[2:])
    counter = w3.eth.contract(address=address, abi=art.abi)

    a, b = hashlib.sha256(b"left").digest(), hashlib.sha256(b"right").digest()
    expected_root = InmemoryTree.init_from_entries([a, b]).get_root()
    assert counter.functions.pairRoot(a, b).call() == expected_root

    for n in (1, 2):
        tx = counter.functions.increment(a, b).transact({"gas": 200_000})
        receipt = w3.eth.wait_for_transaction_receipt(tx)
        assert receipt["status"] == 1
        assert receipt["gasUsed"] <= TX_GAS_CAP
        (event,) = counter.events.Incremented().process_receipt(receipt)
        assert (event["args"]["count"], event["args"]["root"]) == (n, expected_root)
    assert counter.functions.count().call() == 2
    assert counter.functions.lastRoot().call() == expected_root
