"""The chain client: web3 on the embedded eth-tester chain (default) or any JSON-RPC node.

Every transaction waits for its receipt; reverts are decoded into the contract's custom error
(name and arguments); connection failures are retried with backoff and then reported as a
:class:`ChainError` naming the endpoint.
"""

from __future__ import annotations

import ast
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import function_signature_to_4byte_selector
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractCustomError, ContractLogicError, TimeExhausted

from protocol.build import load_artifact
from protocol.reverts import explain
from vtrain.errors import VtrainError

log = logging.getLogger(__name__)

#: Per-transaction gas cap of current EVMs (Osaka); every transaction stays under it.
TX_GAS_CAP = 16_777_216
DEFAULT_GAS = 12_000_000


class ChainError(VtrainError):
    """Raised when the node is unreachable, a transaction reverts, or an address holds no contract."""


class RpcUnavailable(ChainError):
    """Raised when the JSON-RPC endpoint stayed unreachable through every retry; names the URL,
    the request, how many tries and how long it tried."""

    def __init__(self, url: str, what: str, tries: int, seconds: float, last: Exception) -> None:
        super().__init__(f"{what}: JSON-RPC node at {url} unreachable: {tries} tries over {seconds:.1f} s "
                         f"(last error: {_short(last)})")
        self.url = url
        self.tries = tries
        self.seconds = seconds


class Reverted(ChainError):
    """Raised when a transaction or call reverts; ``error`` is the decoded custom error name."""

    def __init__(self, message: str, error: str | None = None, args: tuple = ()) -> None:
        super().__init__(message)
        self.error = error
        self.error_args = args


@dataclass
class Chain:
    """A connection plus the ABIs of every deployed contract (for decoding errors and events)."""

    w3: Web3
    url: str | None = None
    retries: int = 8
    """Retries of a request that failed to connect (0: fail on the first error)."""
    backoff: float = 0.25
    """First wait (seconds); each retry doubles it, up to ``max_wait``, with jitter."""
    max_wait: float = 5.0
    deadline: float = 60.0
    """Overall limit (seconds) for one request and its retries."""
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _errors: dict[bytes, tuple[str, list[str], list[dict]]] = field(default_factory=dict)

    # -- connecting -------------------------------------------------------------------------------
    @staticmethod
    def connect(rpc: str | None = None, timeout: float = 10.0, **retry: Any) -> Chain:
        """The embedded eth-tester chain when ``rpc`` is None, else the node at ``rpc`` (``retry``:
        ``retries``, ``backoff``, ``max_wait``, ``deadline``)."""
        if rpc is None:
            from web3 import EthereumTesterProvider

            chain = Chain(Web3(EthereumTesterProvider()), None)
        else:
            chain = Chain.http(rpc, timeout, **retry)
        chain.first_contact()  # fails early and clearly when the node is not there
        return chain

    def first_contact(self, deadline: float = 10.0) -> list[str]:
        """The node's accounts, retried for at most ``deadline`` seconds (or the chain's own, if
        shorter): a node that is not there at start-up is reported promptly; later requests get the
        full retry budget (an outage mid-run is waited out)."""
        full = self.deadline
        self.deadline = min(full, deadline)
        try:
            return self.accounts()
        finally:
            self.deadline = full

    @staticmethod
    def http(rpc: str, timeout: float = 10.0, **retry: Any) -> Chain:
        """A client of the JSON-RPC node at ``rpc`` (not contacted yet). web3's own retrying is off:
        :meth:`_retry` is the one retry path. A malformed URL raises ChainError."""
        from urllib.parse import urlsplit

        try:
            u = urlsplit(rpc)
            ok = u.scheme in ("http", "https") and bool(u.hostname) and (u.port is None or u.port > 0)
        except ValueError:  # e.g. a port that is not a number or out of range
            ok = False
        if not ok:
            raise ChainError(f"RPC URL {rpc!r} is malformed: expected http(s)://HOST[:PORT][/PATH]")
        provider = Web3.HTTPProvider(rpc, request_kwargs={"timeout": timeout}, exception_retry_configuration=None)
        return Chain(Web3(provider), rpc, **retry)

    @property
    def name(self) -> str:
        return self.url or "embedded eth-tester"

    @property
    def embedded(self) -> bool:
        return self.url is None

    def waits(self) -> list[float]:
        """The upper bounds of the waits between tries (before jitter), for documentation and tests."""
        return [min(self.max_wait, self.backoff * 2**k) for k in range(self.retries)]

    def _retry(self, what: str, fn: Callable[[], Any], before_retry: Callable[[], Any] | None = None) -> Any:
        """Run ``fn``; on a connection error retry with exponential backoff and jitter (each wait
        at most ``max_wait``), for at most ``retries`` retries and ``deadline`` seconds in all, then
        raise :class:`RpcUnavailable`. ``before_retry`` (if given) runs before each retry and may
        return a result that ends the loop (not None)."""
        t0 = time.monotonic()
        tries = 0
        while True:
            try:
                tries += 1
                return fn()
            except Exception as e:
                if not _is_connection_error(e):
                    raise
                elapsed = time.monotonic() - t0
                if tries > self.retries or elapsed >= self.deadline:
                    raise RpcUnavailable(self.name, what, tries, elapsed, e) from None
                cap = min(self.max_wait, self.backoff * 2 ** (tries - 1))
                delay = min(cap / 2 + self.rng.uniform(0, cap / 2), max(0.0, self.deadline - elapsed))
                log.warning("%s: node at %s: %s; retry %d/%d in %.2f s", what, self.name, _short(e), tries,
                            self.retries, delay)
                time.sleep(delay)
            if before_retry is not None:
                done = self._retry(f"{what} (check before retrying)", before_retry)
                if done is not None:
                    return done

    def accounts(self) -> list[str]:
        accs = self._retry("eth_accounts", lambda: self.w3.eth.accounts)
        if not accs:
            raise ChainError(f"node at {self.name} has no unlocked accounts")
        return list(accs)

    # -- contracts --------------------------------------------------------------------------------
    def register_errors(self, abi: list[dict]) -> None:
        for item in abi:
            if item.get("type") == "error":
                types = [i["type"] if not i["type"].startswith("tuple") else _tuple_type(i) for i in item["inputs"]]
                sig = f"{item['name']}({','.join(types)})"
                self._errors[function_signature_to_4byte_selector(sig)] = (item["name"], types, item["inputs"])

    def deploy(self, name: str, *args: Any, sender: str, gas: int = DEFAULT_GAS) -> Contract:
        art = load_artifact(name)
        self.register_errors(art.abi)
        factory = self.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        receipt = self.send(factory.constructor(*args), sender, gas=gas, what=f"deploy {name}")
        addr = receipt["contractAddress"]
        log.info("deployed %s at %s (%d gas)", name, addr, receipt["gasUsed"])
        return self.w3.eth.contract(address=addr, abi=art.abi)

    def at(self, name: str, address: str) -> Contract:
        """The deployed contract ``name`` at ``address``, once its code is checked to be the one this
        vtrain builds (:func:`protocol.codecheck.check_code`; ``Protocol.attach`` also checks the
        immutables that bind it to the other contracts); ChainError names what is wrong."""
        return self.verified(name, address)[0]

    def verified(self, name: str, address: str) -> tuple[Contract, dict[str, int | str]]:
        """The contract ``name`` at ``address`` (decoded with this build's ABI, never a served one)
        and its immutables' values, after one ``eth_getCode``: :class:`protocol.codecheck.CodeMismatch`
        unless the code there is ``name`` as this vtrain builds it."""
        from protocol.codecheck import CodeMismatch, check_code

        if not isinstance(address, str) or not Web3.is_address(address):
            raise ChainError(f"{name}: {address!r} is not an address")
        address = Web3.to_checksum_address(address)
        code = self._retry("eth_getCode", lambda: self.w3.eth.get_code(address))
        if len(code) == 0:
            raise CodeMismatch(f"{name}: no contract at {address} on {self.name} (wrong address or chain?)")
        values = check_code(name, address, bytes(code))
        art = load_artifact(name)
        self.register_errors(art.abi)
        return self.w3.eth.contract(address=address, abi=art.abi), values

    # -- transactions -----------------------------------------------------------------------------
    def send(self, fn: Any, sender: str, value: int = 0, gas: int = DEFAULT_GAS, what: str = "") -> dict:
        """Send a transaction, wait for its receipt, and raise :class:`Reverted` on failure."""
        if gas > TX_GAS_CAP:
            raise ChainError(f"{what}: gas {gas} exceeds the per-transaction cap {TX_GAS_CAP}")
        label = what or getattr(fn, "fn_name", "transaction")
        params = {"from": sender, "value": value, "gas": gas}
        bal = self._retry("eth_getBalance", lambda: self.w3.eth.get_balance(sender))
        gas_price = self._retry("eth_gasPrice", lambda: self.w3.eth.gas_price)
        if bal < value + gas * gas_price and bal < value + gas:  # be lenient where the base fee is 0
            raise ChainError(f"{label}: account {sender} has {bal} wei, needs at least {value} + gas")
        try:
            tx = self._transact_once(fn, params, sender, label)
            receipt = self._retry(label, lambda: self.w3.eth.wait_for_transaction_receipt(tx, timeout=120))
        except (ContractCustomError, ContractLogicError) as e:
            raise self._decode_revert(label, e) from None
        except Exception as e:
            if type(e).__name__ != "TransactionFailed":
                raise
            raise self._decode_revert(label, e) from None
        except TimeExhausted as e:
            raise ChainError(f"{label}: no receipt within 120 s ({e})") from None
        if receipt["status"] != 1:
            # Re-run as a call to get the reason.
            try:
                fn.call({"from": sender, "value": value, "gas": gas}, block_identifier=receipt["blockNumber"] - 1)
            except Exception as e:  # web3's ContractLogicError, eth-tester's TransactionFailed
                raise self._decode_revert(label, e) from None
            raise Reverted(f"{label}: reverted (tx {receipt['transactionHash'].hex()})")
        return dict(receipt)

    def wait_pending(self, sender: str, timeout: float = 120.0, poll: float = 1.0) -> bool:
        """Wait until no transaction of ``sender`` is pending (its pending nonce is its mined
        one), at most ``timeout`` seconds; True when none is. An agent restarted after sending a
        transaction whose receipt it never saw reads the chain only once it is mined (an embedded
        chain mines every transaction at once)."""
        if self.embedded:
            return True
        t0 = time.monotonic()
        while True:
            pending = int(self._retry("eth_getTransactionCount",
                                      lambda: self.w3.eth.get_transaction_count(sender, "pending")))  # type: ignore[arg-type]
            mined = int(self._retry("eth_getTransactionCount",
                                    lambda: self.w3.eth.get_transaction_count(sender, "latest")))  # type: ignore[arg-type]
            if pending <= mined:
                return True
            if time.monotonic() - t0 >= timeout:
                return False
            log.info("%d transaction(s) of %s pending; waiting for them to be mined", pending - mined, sender)
            time.sleep(poll)

    def _transact_once(self, fn: Any, params: dict, sender: str, label: str) -> Any:
        """Send ``fn`` exactly once, also when the connection fails mid-request: on a node the
        transaction carries the account's next nonce, and before a retry the node is asked whether
        that nonce was used (the request got through): then the mined transaction is found and
        returned instead of sending another (never two postings, two moves, two withdrawals)."""
        if self.embedded:
            return fn.transact(params)
        nonce = int(self._retry("eth_getTransactionCount",
                                lambda: self.w3.eth.get_transaction_count(sender, "pending")))  # type: ignore[arg-type]
        first = int(self._retry("eth_blockNumber", lambda: self.w3.eth.block_number))
        params = {**params, "nonce": nonce}

        def sent_already() -> Any:
            if int(self.w3.eth.get_transaction_count(sender, "pending")) <= nonce:  # type: ignore[arg-type]
                return None
            tx = self._find_tx(sender, nonce, first, _calldata(fn))
            if tx is None:  # the nonce went to something else (another process with this account?)
                raise ChainError(f"{label}: nonce {nonce} of {sender} was used by a transaction other than this "
                                 f"one (or not found in blocks {first}..latest of {self.name}); not sending it "
                                 "again blindly")
            log.warning("%s: the node had received it before the connection failed (tx %s)", label, tx.hex())
            return tx

        return self._retry(label, lambda: fn.transact(params), before_retry=sent_already)

    def _find_tx(self, sender: str, nonce: int, first: int, data: bytes | None = None) -> Any:
        """Hash of the mined transaction of ``sender`` with ``nonce`` (and calldata ``data``, when
        given) in blocks ``first``..latest."""
        last = int(self.w3.eth.block_number)
        for b in range(max(first, last - 256), last + 1):  # bounded: the last 256 blocks at most
            for t in self.w3.eth.get_block(b, full_transactions=True)["transactions"]:
                if str(t["from"]).lower() == sender.lower() and int(t["nonce"]) == nonce:
                    return t["hash"] if data is None or bytes(t["input"]) == data else None
        return None

    def call(self, fn: Any, sender: str | None = None) -> Any:
        try:
            return self._retry(getattr(fn, "fn_name", "call"), lambda: fn.call({"from": sender} if sender else {}))
        except (ContractCustomError, ContractLogicError) as e:
            raise self._decode_revert(getattr(fn, "fn_name", "call"), e) from None
        except Exception as e:
            if type(e).__name__ != "TransactionFailed":
                raise
            raise self._decode_revert(getattr(fn, "fn_name", "call"), e) from None

    def _decode_revert(self, label: str, e: Exception) -> Reverted:
        raw = _revert_bytes(e)
        if raw is not None and len(raw) >= 4:
            sel = raw[:4]
            if sel in self._errors:
                name, types, inputs = self._errors[sel]
                try:
                    args = tuple(abi_decode(types, raw[4:]))
                except Exception:
                    args = ()
                shown = ", ".join(_show(a) for a in args)
                words = explain(label.split("(")[0], name, args, inputs if args else ())
                return Reverted(f"{label}: {words} (reverted with {name}({shown}))", name, args)
        return Reverted(f"{label}: reverted ({e})")

    # -- time ---------------------------------------------------------------------------------------
    def now(self) -> int:
        return int(self._retry("eth_getBlockByNumber", lambda: self.w3.eth.get_block("latest"))["timestamp"])

    def advance_time(self, seconds: int) -> None:
        """Move the chain's clock forward (test chains only) and mine a block."""
        if self.embedded:
            tester = self.w3.provider.ethereum_tester  # type: ignore[attr-defined]
            tester.time_travel(self.now() + seconds)
            tester.mine_blocks(1)
        else:
            self.w3.provider.make_request("evm_increaseTime", [seconds])  # type: ignore[arg-type]
            self.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]


def _is_connection_error(e: Exception) -> bool:
    """True for the node being unreachable (requests wraps socket errors in its own types) or a
    proxy in front of it answering 502/503/504."""
    name = type(e).__name__
    if isinstance(e, (ConnectionError, OSError, TimeoutError)) or "Connection" in name or "Timeout" in name:
        return True
    status = getattr(getattr(e, "response", None), "status_code", None)
    return name == "HTTPError" and status in (502, 503, 504)


def _calldata(fn: Any) -> bytes | None:
    """The calldata a contract function call sends (None when it cannot be told in advance)."""
    encode = getattr(fn, "_encode_transaction_data", None)
    if encode is None:
        return None
    try:
        return bytes.fromhex(str(encode())[2:])
    except Exception:  # a constructor or an unusual function object: match on the nonce alone
        return None


def _short(e: Exception) -> str:
    """An exception in one line of at most 160 characters (requests' messages nest deeply)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _revert_bytes(e: Exception) -> bytes | None:
    """Revert data of a failed call, from web3 (``e.data``) or eth-tester (``b'...'`` in the message)."""
    data = getattr(e, "data", None)
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        return bytes.fromhex(data[2:])
    msg = str(e.args[0]) if e.args else ""
    marker = "execution reverted: "
    if marker in msg:
        tail = msg.split(marker, 1)[1]
        if tail.startswith(("b'", 'b"')):
            try:
                return ast.literal_eval(tail)
            except (ValueError, SyntaxError):
                return None
    return None


def _tuple_type(item: dict) -> str:
    inner = ",".join(c["type"] if not c["type"].startswith("tuple") else _tuple_type(c) for c in item["components"])
    return f"({inner}){item['type'][5:]}"


def _show(a: Any) -> str:
    if isinstance(a, (bytes, bytearray)):
        return "0x" + bytes(a).hex()
    return repr(a)


#: Most bytes of a deployment file (addresses and the contracts' ABIs: a few hundred KB).
MAX_DEPLOYMENT_BYTES = 16 << 20


@dataclass(frozen=True)
class Deployment:
    """Addresses of one deployment of the protocol's contracts."""

    registry: str
    game: str
    adjudicator: str
    chain_id: int
    availability: str | None = None
    """The DataAvailability contract (None in a deployment file written before it existed)."""

    def save(self, path: Path) -> None:
        from vtrain.training.rundir import atomic_write

        atomic_write(Path(path), json.dumps(self.__dict__, indent=2).encode())

    @staticmethod
    def read(path: Path) -> dict:
        """The deployment file's JSON (it may come from someone else: a regular file of at most
        :data:`MAX_DEPLOYMENT_BYTES`, checked before it is read); ChainError names the problem."""
        from vtrain.errors import CorruptArtifact
        from vtrain.training.untrusted import loads_json, read_regular

        try:
            d = loads_json(read_regular(Path(path), MAX_DEPLOYMENT_BYTES, "deployment file").decode("utf-8"))
        except CorruptArtifact as e:
            raise ChainError(str(e)) from None
        except OSError as e:
            raise ChainError(f"deployment file {path}: {e.strerror or e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ChainError(f"deployment file {path}: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ChainError(f"deployment file {path}: expected an object, got {type(d).__name__}")
        return d

    @staticmethod
    def load(path: Path) -> Deployment:
        d = Deployment.read(path)
        missing = [k for k in ("registry", "game", "adjudicator", "chain_id") if k not in d]
        if missing:
            raise ChainError(f"deployment file {path}: missing {', '.join(missing)}")
        for k in ("registry", "game", "adjudicator"):
            if not isinstance(d[k], str) or not Web3.is_address(d[k]):
                raise ChainError(f"deployment file {path}: {k}: {d[k]!r} is not an address")
        if isinstance(d["chain_id"], bool) or not isinstance(d["chain_id"], int) or d["chain_id"] <= 0:
            raise ChainError(f"deployment file {path}: chain_id: expected a positive integer, got {d['chain_id']!r}")
        da = d.get("availability")
        if da is not None and (not isinstance(da, str) or not Web3.is_address(da)):
            raise ChainError(f"deployment file {path}: availability: {da!r} is not an address")
        return Deployment(d["registry"], d["game"], d["adjudicator"], d["chain_id"], da)
