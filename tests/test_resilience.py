"""Agent resilience: RPC outages (retried with backoff, then a clear error), replies lost in
transit (a transaction is never sent twice), and agents killed (SIGKILL) at seeded random points
and restarted with the same state (the game still ends with the right winner and balances).

Fast tests use a tiny fake JSON-RPC server behind :class:`nodes.FlakyProxy`; the rest run on anvil
(`@pytest.mark.node`), the kill-and-restart trials also `@pytest.mark.slow`."""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_report import record

import nodes
from protocol.chain import Chain, ChainError, RpcUnavailable

REPO = Path(__file__).resolve().parent.parent
ACCOUNTS = ["0x" + f"{i:040x}" for i in range(1, 6)]


class _FakeNode(http.server.BaseHTTPRequestHandler):
    """Answers eth_accounts / eth_chainId / eth_blockNumber; counts requests."""

    calls: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(body["method"])
        result = {"eth_accounts": ACCOUNTS, "eth_chainId": "0x7a69", "eth_blockNumber": "0x10"}.get(body["method"])
        reply = json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_node() -> Iterator[str]:
    handler = type("Handler", (_FakeNode,), {"calls": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _fast(url: str, **kw: float) -> Chain:
    return Chain.http(url, 2.0, **{"retries": 50, "backoff": 0.05, "max_wait": 0.2, "deadline": 10.0, **kw})


def test_backoff_is_exponential_capped_and_jittered() -> None:
    c = Chain.http("http://127.0.0.1:1", retries=7, backoff=0.25, max_wait=5.0)
    assert c.waits() == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    slept: list[float] = []
    c.rng = random.Random(1)
    tries = iter(range(100))

    def flaky() -> str:
        if next(tries) < 5:
            raise ConnectionError("connection refused")
        return "ok"

    real_sleep = time.sleep
    try:
        time.sleep = slept.append  # type: ignore[assignment]
        assert c._retry("probe", flaky) == "ok"
    finally:
        time.sleep = real_sleep  # type: ignore[assignment]
    assert len(slept) == 5
    for got, cap in zip(slept, c.waits(), strict=False):
        assert cap / 2 <= got <= cap  # jitter within [cap/2, cap]
    assert len({round(s / c, 6) for s, c in zip(slept, c.waits(), strict=False)}) > 1  # not a fixed fraction


def test_short_outage_is_survived(fake_node: str) -> None:
    with nodes.FlakyProxy.to(fake_node) as proxy:
        chain = _fast(proxy.url)
        assert chain.accounts() == ACCOUNTS
        proxy.down_for(0.8)
        t0 = time.monotonic()
        assert chain.accounts() == ACCOUNTS  # retried through the outage
        waited = time.monotonic() - t0
        assert proxy.refused >= 1
    assert 0.6 < waited < 5.0
    record("crash_restart", "rpc short outage (fake node)", True, waited=round(waited, 2), refused=proxy.refused)


def test_dead_endpoint_fails_clearly_within_the_deadline() -> None:
    url = f"http://127.0.0.1:{nodes.free_port()}"
    chain = _fast(url, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(RpcUnavailable) as e:
        chain.accounts()
    took = time.monotonic() - t0
    assert took < 3.0
    msg = str(e.value)
    assert url in msg and "unreachable" in msg and "tries over" in msg and e.value.url == url
    assert e.value.tries >= 3  # it did retry
    # a small retry budget ends it sooner
    with pytest.raises(RpcUnavailable, match="1 tries"):
        _fast(url, retries=0).accounts()


@pytest.mark.parametrize("url", ["localhost:8545", "http://", "http://host:99999", "ftp://x", "http://[::1"])
def test_malformed_rpc_url_is_refused_before_any_request(url: str) -> None:
    with pytest.raises(ChainError, match="malformed|expected"):
        Chain.http(url)


def test_agent_started_against_a_dead_url_exits_with_a_message(tmp_path: Path) -> None:
    from protocol.demo import default_spec

    spec = tmp_path / "spec.json"
    spec.write_text(default_spec().to_json())
    dep = tmp_path / "deployment.json"
    dep.write_text(json.dumps({"registry": "0x" + "11" * 20, "game": "0x" + "22" * 20,
                               "adjudicator": "0x" + "33" * 20, "chain_id": 31337}))
    url = f"http://127.0.0.1:{nodes.free_port()}"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "protocol.agents_cli", "trainer", "--rpc", url, "--rpc-deadline", "1",
                        "--deployment", str(dep), "--spec", str(spec), "--job", "1", "--store", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr and url in p.stderr and "unreachable" in p.stderr
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "s").exists()  # nothing created for a run that never started


# -- on anvil ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anvil_url() -> Iterator[str]:
    with nodes.start_anvil() as node:
        yield node.url


@pytest.mark.node
def test_lost_reply_to_a_transaction_is_not_sent_twice(anvil_url: str) -> None:
    """The node receives a transaction, the reply is lost: the client finds the mined transaction by
    its nonce instead of sending it again (which would be a second transfer)."""
    with nodes.FlakyProxy.to(anvil_url) as proxy:
        chain = _fast(proxy.url)
        a, b = chain.accounts()[6:8]
        bal_b = chain.w3.eth.get_balance(b)
        nonce = chain.w3.eth.get_transaction_count(a)
        proxy.drop_response_to(b"eth_sendTransaction")

        class Transfer:  # the shape of a contract function that Chain.send expects
            fn_name = "transfer"

            def transact(self, params: dict) -> bytes:
                return chain.w3.eth.send_transaction({**params, "to": b})

        receipt = chain.send(Transfer(), a, value=10**15, gas=21_000, what="transfer")
        assert len(proxy.dropped) == 1  # the reply to the first send was really lost
        assert receipt["status"] == 1
        assert chain.w3.eth.get_transaction_count(a) == nonce + 1  # exactly one transaction
        assert chain.w3.eth.get_balance(b) - bal_b == 10**15
    record("crash_restart", "lost reply to eth_sendTransaction", True)
