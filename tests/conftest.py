"""Shared fixtures: the three chains. Helpers live in tests/nodes.py (on sys.path via pytest's
`pythonpath` setting)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from web3 import Web3

import nodes


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """The suite's tensors are tiny: torch's thread pool costs more than it saves (up to 100x on a
    loaded 2-core machine). Cross-thread-count replication runs in subprocesses with their own env.
    ``OMP_NUM_THREADS=1`` is also the default of ``--threads`` for commands run in-process and of
    the suite's child processes (tests/test_replication.py sets its own)."""
    import os

    import torch

    n = torch.get_num_threads()
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = old or "1"
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
    if old is None:
        os.environ.pop("OMP_NUM_THREADS", None)


@pytest.fixture(autouse=True, scope="session")
def _trusted_models_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Model sources the suite trains are recorded as approved (vtrain.training.trust) in a file of
    the session, never in the user's own record; child processes inherit it."""
    import os

    old = os.environ.get("VTRAIN_TRUSTED_MODELS")
    os.environ["VTRAIN_TRUSTED_MODELS"] = str(tmp_path_factory.mktemp("trust") / "trusted-models")
    yield
    if old is None:
        os.environ.pop("VTRAIN_TRUSTED_MODELS", None)
    else:
        os.environ["VTRAIN_TRUSTED_MODELS"] = old


@pytest.fixture
def eth_tester_w3() -> Web3:
    """A fresh in-process chain (eth-tester on py-evm), the embedded default. Pass `gas`."""
    return nodes.eth_tester_w3()


@pytest.fixture(scope="session")
def hardhat_w3() -> Iterator[Web3]:
    """Web3 on a `hardhat node` started for this session (stopped even if tests fail)."""
    with nodes.start_hardhat() as node:
        yield nodes.http_w3(node.url)


@pytest.fixture(scope="session")
def anvil_w3() -> Iterator[Web3]:
    """Web3 on an `anvil` started for this session (stopped even if tests fail)."""
    with nodes.start_anvil() as node:
        yield nodes.http_w3(node.url)


# -- the game harness's deployment, shared by test_registry.py and test_game.py -----------------
@pytest.fixture(scope="module")
def chain():
    """Registry + game + toy adjudicator deployed once per test module (tests/game_harness.py)."""
    import game_harness as H

    return H.deploy()


@pytest.fixture
def dep(chain):
    """The deployment rewound to a fresh state; the solvency invariant is checked after the test."""
    d = chain.reset()
    yield d
    d.check_solvency()


# -- the demo's world: the real protocol on a fresh embedded chain (test_e2e, test_gpt_dispute, ...) --
def _demo_world() -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """``(proto, store, accounts)``: the protocol deployed by account 0 on a new eth-tester chain, an
    artifact store in a temporary folder, and the demo's roles on accounts 1-4."""
    from protocol.chain import Chain
    from protocol.deploy import deploy
    from protocol.store import ArtifactStore

    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    accounts = {"client": a[1], "trainer": a[2], "auditor": a[3], "false_challenger": a[4]}
    with tempfile.TemporaryDirectory() as d:
        yield proto, ArtifactStore(d), accounts


@pytest.fixture(scope="module")
def demo_world() -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """The demo's world, shared by the tests of one module."""
    yield from _demo_world()


@pytest.fixture
def fresh_demo_world() -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """The demo's world on a new chain per test (eth-tester's log queries slow down as a chain grows)."""
    yield from _demo_world()
