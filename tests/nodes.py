"""Test helpers: local chains for tests (embedded py-evm, `hardhat node`, `anvil`).

Real nodes come from `node_modules` (npm ci), listen on a free 127.0.0.1 port, are declared ready
once `eth_chainId` answers, and are stopped by killing their whole process group (the hardhat
launcher leaves children behind), also at interpreter exit if a test run is interrupted.

Every transaction must carry an explicit `gas` <= TX_GAS_CAP: hardhat and anvil enforce the
Osaka per-transaction cap, and on py-evm estimating gas costs about 11x the execution.
"""

from __future__ import annotations

import atexit
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from web3 import EthereumTesterProvider, Web3

REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_MODULES = REPO_ROOT / "node_modules"

#: Per-transaction gas cap of current EVMs (EIP-7825, 2**24); hardhat and anvil reject more.
TX_GAS_CAP = 16_777_216


class NodeError(RuntimeError):
    """Raised when a local node cannot be found, started, or does not answer JSON-RPC."""


@dataclass
class RunningNode:
    """A node process started by this module; `stop()` is idempotent."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def stop(self, timeout: float = 5.0) -> None:
        """Kill the node's whole process group (SIGTERM, then SIGKILL)."""
        if self._stopped:
            return
        self._stopped = True
        _running.discard(self)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)  # start_new_session: pgid == pid
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> RunningNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __hash__(self) -> int:
        return id(self)


_running: set[RunningNode] = set()


@atexit.register
def _stop_all() -> None:
    for node in list(_running):
        node.stop()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop_nodes_on_sigterm() -> None:
    """Make SIGTERM (a CI timeout) unwind normally, so fixtures and atexit stop the nodes."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_endpoint_files(folder: Path) -> tuple[Path, Path, str]:
    """An agent's inputs with no node behind them: ``(spec, deployment, url)``, the default spec and a
    deployment file (addresses that hold nothing, chain id 31337) in ``folder``, and the URL of a free
    port on 127.0.0.1."""
    from protocol.demo import default_spec

    spec = folder / "spec.json"
    spec.write_text(default_spec().to_json())
    dep = folder / "deployment.json"
    addresses = {"registry": "0x" + "11" * 20, "game": "0x" + "22" * 20, "adjudicator": "0x" + "33" * 20}
    dep.write_text(json.dumps({**addresses, "chain_id": 31337}))
    return spec, dep, f"http://127.0.0.1:{free_port()}"


def rpc(url: str, method: str, params: list[Any] | None = None, timeout: float = 2.0) -> Any:
    """One JSON-RPC call over HTTP; returns `result` or raises NodeError."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    req = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        reply = json.loads(resp.read())
    if "error" in reply:
        raise NodeError(f"{method} on {url}: {reply['error']}")
    return reply["result"]


def hardhat_command() -> list[str]:
    """`hardhat` from node_modules (run directly, not through npx)."""
    exe = NODE_MODULES / ".bin" / "hardhat"
    if not exe.exists():
        raise NodeError(f"hardhat not found at {exe}: run `npm ci` in {REPO_ROOT}")
    return [str(exe)]


def anvil_command() -> list[str]:
    """The native anvil binary shipped by npm `@foundry-rs/anvil-<os>-<arch>`.

    Falls back to the npm launcher script, then to an `anvil` on PATH.
    """
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    native = NODE_MODULES / "@foundry-rs" / f"anvil-{sys.platform}-{arch}" / "bin" / "anvil"
    if native.is_file() and os.access(native, os.X_OK):
        return [str(native)]
    launcher = NODE_MODULES / ".bin" / "anvil"
    if launcher.exists():
        return [str(launcher)]
    from shutil import which

    on_path = which("anvil")
    if on_path:
        return [on_path]
    raise NodeError(f"anvil not found (looked for {native}): run `npm ci` in {REPO_ROOT}")


def start_node(name: str, argv: list[str], port: int, timeout: float) -> RunningNode:
    """Start `argv` in its own process group and wait until it answers `eth_chainId`."""
    _stop_nodes_on_sigterm()
    fd, log_name = tempfile.mkstemp(prefix=f"{name}-{port}-", suffix=".log")
    env = {**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true", "NO_COLOR": "1"}
    try:
        proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    except OSError as e:
        raise NodeError(f"cannot start {name} ({argv[0]}): {e}") from e
    finally:
        os.close(fd)  # the child holds its own copy
    node = RunningNode(name, f"http://127.0.0.1:{port}", proc, Path(log_name))
    _running.add(node)
    try:
        wait_ready(node, timeout)
    except BaseException:
        node.stop()
        raise
    return node


def wait_ready(node: RunningNode, timeout: float) -> None:
    """Poll `eth_chainId` until it answers; NodeError (with the node's log) on exit or timeout."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if node.proc.poll() is not None:
            raise NodeError(
                f"{node.name} exited with code {node.proc.returncode} before answering on "
                f"{node.url}; its log:\n{node.log_tail()}"
            )
        try:
            rpc(node.url, "eth_chainId", timeout=1.0)
            return
        except (OSError, urllib.error.URLError, ValueError) as e:
            last = e
            time.sleep(0.1)
    raise NodeError(
        f"{node.name} did not answer eth_chainId on {node.url} within {timeout:.0f} s "
        f"(last error: {last}); its log:\n{node.log_tail()}"
    )


def _start_on_port(
    name: str, argv_for: Callable[[int], list[str]], port: int | None, timeout: float
) -> RunningNode:
    if port is not None:
        return start_node(name, argv_for(port), port, timeout)
    try:
        port = free_port()
        return start_node(name, argv_for(port), port, timeout)
    except NodeError:  # the free port may have been taken in between: one more try
        port = free_port()
        return start_node(name, argv_for(port), port, timeout)


def start_hardhat(port: int | None = None, timeout: float = 60.0) -> RunningNode:
    """`hardhat node` on 127.0.0.1 (chain id 31337, 20 unlocked funded accounts)."""
    cmd = hardhat_command()
    return _start_on_port(
        "hardhat",
        lambda p: cmd + ["node", "--hostname", "127.0.0.1", "--port", str(p)],
        port,
        timeout,
    )


def start_anvil(port: int | None = None, timeout: float = 30.0) -> RunningNode:
    """`anvil` on 127.0.0.1 (chain id 31337, 10 unlocked funded accounts)."""
    cmd = anvil_command()
    return _start_on_port(
        "anvil", lambda p: cmd + ["--host", "127.0.0.1", "--port", str(p)], port, timeout
    )


def http_w3(url: str) -> Web3:
    """Web3 on a JSON-RPC URL with `default_account` set to the node's first account."""
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 60}))
    w3.eth.default_account = w3.eth.accounts[0]
    return w3


def eth_tester_w3() -> Web3:
    """A fresh in-process chain (eth-tester on py-evm) with `default_account` set."""
    w3 = Web3(EthereumTesterProvider())
    w3.eth.default_account = w3.eth.accounts[0]
    return w3


def deploy(w3: Web3, art: Any, *args: Any, gas: int = 12_000_000, sender: str | None = None) -> Any:
    """Deploy a compiled artifact (``protocol.build`` ``Artifact``: abi, bytecode) with constructor
    ``args`` from ``sender`` (default: the node's default account); the bound contract object."""
    tx: dict[str, Any] = {"gas": gas}
    if sender is not None:
        tx["from"] = sender
    h = w3.eth.contract(abi=art.abi, bytecode=art.bytecode).constructor(*args).transact(tx)
    addr = w3.eth.wait_for_transaction_receipt(h)["contractAddress"]
    return w3.eth.contract(address=addr, abi=art.abi)


class FlakyProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (host, port) that can fail on demand:
    ``down()`` closes every connection (accepted ones at once, open ones too) until ``up()``;
    ``drop_response_to(marker)`` forwards the next request containing ``marker`` to the target
    but closes the client's connection instead of returning the answer (a reply lost in transit).
    Threads only; ``close()`` (or the context manager) stops it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind(("127.0.0.1", 0))
        self._listen.listen(64)
        self.port = int(self._listen.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._down = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._drop_marker: bytes | None = None
        self.dropped: list[bytes] = []  # requests whose answers were dropped
        self.refused = 0  # connections closed because the proxy was down
        threading.Thread(target=self._accept, daemon=True, name="flaky-proxy").start()

    @staticmethod
    def to(url: str) -> FlakyProxy:
        from urllib.parse import urlsplit

        u = urlsplit(url)
        return FlakyProxy((u.hostname or "127.0.0.1", int(u.port or 80)))

    def down(self) -> None:
        self._down.set()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            _close(c)

    def up(self) -> None:
        self._down.clear()

    def down_for(self, seconds: float) -> threading.Timer:
        """Down now, up again after ``seconds`` (in a timer thread)."""
        self.down()
        t = threading.Timer(seconds, self.up)
        t.daemon = True
        t.start()
        return t

    def drop_response_to(self, marker: bytes) -> None:
        self._drop_marker = marker

    def close(self) -> None:
        self._closed.set()
        self.down()
        _close(self._listen)

    def __enter__(self) -> FlakyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listen.accept()
            except OSError:
                return
            if self._down.is_set():
                self.refused += 1
                _close(client)
                continue
            try:
                backend = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            backend.settimeout(None)
            with self._lock:
                self._conns += [client, backend]
            state = {"drop": False}
            threading.Thread(target=self._pipe, args=(client, backend, state, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(backend, client, state, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, state: dict, upstream: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self._down.is_set():
                    break
                if upstream:
                    marker = self._drop_marker
                    if marker is not None and marker in data:
                        self._drop_marker = None
                        self.dropped.append(data)
                        state["drop"] = True
                    dst.sendall(data)
                elif state["drop"]:  # the answer is lost: the client sees its connection closed
                    break
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
