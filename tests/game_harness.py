"""Dispute-game test harness: deployment, a synthetic training run with real commitments, and
actors that play whole games on eth-tester.

Actors:
- :class:`Trainer` plays from its own :class:`Run`; an honest run makes an honest trainer, a run
  built with a :class:`Cheat` makes a cheating one. Its moves are the protocol's (reveal children
  of its own trees, open step/op/chunk with proofs, call oneStep); a move the contract rejects
  leaves it stuck (``last_error``), and its clock then runs out.
- :class:`HonestChallenger` replays (it holds the honest run) and always descends to what it can
  win: the first differing step, the first op whose record differs or breaks a bind with the
  trainer's opened state, the first differing chunk and element.
- :class:`FalseChallenger` descends to an arbitrary target (step position, op, element).

The run is synthetic: every non-bind op output is a pseudo-random FP32 tensor derived from
``(step, op, input roots)`` (:func:`synth_output`), so the toy adjudicator's truth for an element
is a function of the agreed inputs (:class:`Oracle`), as the real adjudicator's would be.
INPUT/OUTPUT/CONST ops are real binds to the state and constant roots. Commitments (tensor,
state, step leaf, interval, log, trace and graph trees) are :mod:`vtrain.commit.roots`'s.

:func:`gas_per_move` plays one full game and returns the gas used per move type
(``scripts/bench_gas.py`` calls it).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

import numpy as np
from eth_abi import encode as abi_encode
from eth_tester.exceptions import TransactionFailed
from eth_utils import keccak
from web3 import EthereumTesterProvider, Web3
from web3.logs import DISCARD

from protocol.build import load_artifact
from vtrain.commit import roots as C
from vtrain.commit.merkle import MerkleTree

#: Gas limit sent with every transaction (below the 2^24 per-transaction cap).
TX_GAS = 16_000_000
#: Seconds the chain is moved ahead of the wall clock at deployment, so that block timestamps
#: are deterministic (each mined transaction advances time by exactly one second).
TIME_OFFSET = 10_000_000

KIND_INPUT, KIND_OUTPUT, KIND_DATA, KIND_CONST = 0, 1, 2, 3
KIND_ADD, KIND_MUL, KIND_MUL_S, KIND_SUM, KIND_RESHAPE = 10, 12, 15, 31, 50


class JobStatus(IntEnum):
    NONE = 0
    OPEN = 1
    ACTIVE = 2
    CANCELLED = 3
    FINALIZED = 4
    FRAUDULENT = 5


class Phase(IntEnum):
    NONE = 0
    STEPS = 1
    TRACE_COMMIT = 2
    TRACE = 3
    ELEMENT = 4
    PICK = 5
    ONE_STEP = 6
    DONE = 7
    PARTIALS = 8
    CHUNK_CHECK = 9
    PARTIALS_RULE = 10


class Party(IntEnum):
    NONE = 0
    TRAINER = 1
    CHALLENGER = 2


class GameStatus(IntEnum):
    NONE = 0
    IN_PROGRESS = 1
    TRAINER_WON = 2
    CHALLENGER_WON = 3
    CLOSED = 4


class Ruling(IntEnum):
    NONE = 0
    TIMEOUT = 1
    BIND = 2
    ADJUDICATED = 3
    JOB_FRAUDULENT = 4


def label_of(v: dict[str, Any]) -> str:
    """The kind of move a game view waits for (e.g. ``steps.reveal``, ``trace.open``, ``pick``)."""
    name = {
        Phase.STEPS: "steps",
        Phase.TRACE_COMMIT: "trace.commit",
        Phase.TRACE: "trace",
        Phase.ELEMENT: "element",
        Phase.PICK: "pick",
        Phase.ONE_STEP: "onestep",
    }[v["phase"]]
    if v["phase"] in (Phase.STEPS, Phase.TRACE, Phase.ELEMENT):
        if v["toMove"] == Party.CHALLENGER:
            return name + ".choose"
        return name + (".open" if v["size"] == 1 else ".reveal")
    return name


# ---------------------------------------------------------------------------------------------
# Reverts


class Reverted(Exception):
    """Raised when a transaction or call reverts; ``name``/``args`` are the decoded custom error."""

    def __init__(self, name: str, args: tuple[Any, ...], data: bytes) -> None:
        super().__init__(f"{name}{args}")
        self.name = name
        self.error_args = args
        self.data = data


_ERROR_TABLE: dict[bytes, tuple[str, list[str]]] = {}


def _error_table() -> dict[bytes, tuple[str, list[str]]]:
    if not _ERROR_TABLE:
        for name in (
            "JobRegistry", "DisputeGame", "ToyAdjudicator", "ReentrantReceiver", "ChunkAdjudicator", "DataAvailability"
        ):
            for item in load_artifact(name).abi:
                if item["type"] != "error":
                    continue
                types = [_abi_type(i) for i in item["inputs"]]
                sig = f"{item['name']}({','.join(types)})"
                _ERROR_TABLE[keccak(text=sig)[:4]] = (item["name"], types)
        _ERROR_TABLE[keccak(text="Error(string)")[:4]] = ("Error", ["string"])
        _ERROR_TABLE[keccak(text="Panic(uint256)")[:4]] = ("Panic", ["uint256"])
    return _ERROR_TABLE


def _abi_type(item: dict[str, Any]) -> str:
    t = item["type"]
    if t.startswith("tuple"):
        return "(" + ",".join(_abi_type(c) for c in item["components"]) + ")" + t[5:]
    return t


@contextmanager
def reverts(name: str, *args: Any) -> Iterator[Any]:
    """Asserts that the block raises :class:`Reverted` with custom error ``name`` (and, if
    given, these leading arguments)."""
    import pytest  # test-only helper; the rest of the module (e.g. gas_per_move) needs no pytest

    with pytest.raises(Reverted) as info:
        yield info
    assert info.value.name == name, f"expected {name}, got {info.value}"
    if args:
        assert tuple(info.value.error_args[: len(args)]) == args, info.value.error_args


def decode_revert(data: bytes) -> tuple[str, tuple[Any, ...]]:
    """``(error name, args)`` of ABI revert data (``("", ())`` for an empty revert)."""
    from eth_abi import decode

    if len(data) < 4:
        return "", ()
    name, types = _error_table().get(data[:4], (f"0x{data[:4].hex()}", []))
    try:
        values = decode(types, data[4:])
    except Exception:  # undecodable arguments: keep the name
        return name, ()
    return name, tuple(
        Web3.to_checksum_address(x) if t == "address" else x for t, x in zip(types, values, strict=True)
    )


def _reverted(e: TransactionFailed) -> Reverted:
    msg = e.args[0]
    if isinstance(msg, Exception):
        msg = msg.args[0]
    if isinstance(msg, bytes):
        data = msg
    else:
        text = str(msg).removeprefix("execution reverted: ")
        if text.startswith(("b'", 'b"')):
            data = ast.literal_eval(text)
        else:  # eth-tester already decoded an Error(string)
            return Reverted("Error", (text,), b"")
    name, args = decode_revert(data)
    return Reverted(name, args, data)


# ---------------------------------------------------------------------------------------------
# Deployment


@dataclass
class Deployment:
    """The registry, the game and the toy adjudicator on one eth-tester chain."""

    w3: Web3
    registry: Any
    game: Any
    toy: Any
    deployer: str
    client: str
    trainer: str
    challenger: str
    challenger2: str
    anyone: str
    known: set[str] = field(default_factory=set)
    gas_log: list[tuple[str, int]] = field(default_factory=list)
    receipts: list[Any] = field(default_factory=list)
    _deployed: Snapshot | None = None
    da: Any = None
    """The DataAvailability contract (bound to the registry)."""

    def snapshot(self) -> Snapshot:
        """The chain (state and time) and this object's bookkeeping at this point."""
        return Snapshot(self.w3.provider.ethereum_tester.take_snapshot(), tuple(self.receipts), frozenset(self.known))

    def revert(self, snap: Snapshot) -> Deployment:
        """Returns the chain to ``snap`` (earlier or later on the same history). Returns self."""
        self.w3.provider.ethereum_tester.revert_to_snapshot(snap.block)
        self.receipts = list(snap.receipts)
        self.known = set(snap.known)
        self.gas_log.clear()
        return self

    def reset(self) -> Deployment:
        """Rewinds to just after deployment (much faster than deploying again)."""
        assert self._deployed is not None
        return self.revert(self._deployed)

    # -- transactions

    def tx(self, fn: Any, sender: str, value: int = 0, label: str | None = None) -> Any:
        """Sends ``fn`` from ``sender``; returns the receipt, raises :class:`Reverted`.

        A reverting transaction is mined (as on a real chain: its block takes one second);
        its revert data is recovered by replaying it as a call on that block's state.
        """
        params = {"from": sender, "value": value, "gas": TX_GAS}
        try:
            h = fn.transact(params)
        except TransactionFailed as e:
            raise _reverted(e) from None
        r = self.w3.eth.get_transaction_receipt(h)
        if r.status != 1:
            try:
                fn.call(params, block_identifier=r.blockNumber)
            except TransactionFailed as e:
                raise _reverted(e) from None
            raise Reverted("", (), b"")
        self.gas_log.append((label or fn.fn_name, r.gasUsed))
        self.receipts.append(r)
        return r

    def dry(self, fn: Any, sender: str, value: int = 0) -> Any:
        """Runs ``fn`` as ``sender`` on top of the pending block (the exact time and state the
        next transaction would see) without mining it; returns its result, raises
        :class:`Reverted`. Cheaper than a failing :meth:`tx` for revert checks."""
        try:
            return fn.call({"from": sender, "value": value, "gas": TX_GAS}, block_identifier="pending")
        except TransactionFailed as e:
            raise _reverted(e) from None

    def call(self, fn: Any, sender: str | None = None) -> Any:
        """Calls a view; raises :class:`Reverted`."""
        try:
            return fn.call({"from": sender or self.anyone, "gas": TX_GAS})
        except TransactionFailed as e:
            raise _reverted(e) from None

    def deploy(self, name: str, *args: Any) -> Any:
        art = load_artifact(name)
        factory = self.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        r = self.tx(factory.constructor(*args), self.deployer, label=f"deploy {name}")
        return self.w3.eth.contract(address=r.contractAddress, abi=art.abi)

    # -- time

    def now(self) -> int:
        """Timestamp the next mined transaction gets."""
        return int(self.w3.eth.get_block("pending")["timestamp"])

    def at(self, t: int) -> None:
        """Moves time so that the next transaction is mined at exactly ``t``."""
        now = self.now()
        if t < now:
            raise ValueError(f"cannot travel back: next block at {now}, asked {t}")
        if t > now:
            self.w3.provider.ethereum_tester.time_travel(t)
        assert self.now() == t

    def advance(self, seconds: int) -> None:
        self.at(self.now() + seconds)

    # -- reads

    def job(self, job: int) -> dict[str, Any]:
        return _named(self.registry, "getJob", self.call(self.registry.functions.getJob(job)))

    def job_status(self, job: int) -> JobStatus:
        return JobStatus(self.call(self.registry.functions.jobStatus(job)))

    def owed(self, addr: str) -> int:
        return int(self.call(self.registry.functions.owed(addr)))

    def view(self, gid: int) -> dict[str, Any]:
        """The game's `GameView` as a dict (enums as IntEnums)."""
        v = _named(self.game, "getGame", self.call(self.game.functions.getGame(gid)))
        v["phase"] = Phase(v["phase"])
        v["status"] = GameStatus(v["status"])
        v["toMove"] = Party(v["toMove"])
        return v

    def events(self, contract: Any, name: str, **filters: Any) -> list[Any]:
        """Events ``name`` of ``contract``'s ABI emitted by this history's transactions (an
        agent watching the chain), oldest first, as attribute dicts; ``filters`` match args."""
        event = getattr(contract.events, name)()
        out = []
        for r in self.receipts:
            for e in event.process_receipt(r, errors=DISCARD):
                if e.address == contract.address and all(e.args[k] == v for k, v in filters.items()):
                    out.append(e.args)
        return out

    # -- invariant

    def check_solvency(self) -> None:
        """INVARIANT: the registry's balance equals totalOwed + totalBurned + the sum of
        escrowOf(job) over all jobs; each account's credit equals its Credited minus its Withdrawn
        events and totalOwed is their sum; totalBurned is the sum of the JobFraudulent events'
        burned stakes; the game contract holds nothing."""
        reg = self.registry.functions
        expected: dict[str, int] = {}
        for e in self.events(self.registry, "Credited"):
            expected[e.account] = expected.get(e.account, 0) + e.amount
        for e in self.events(self.registry, "Withdrawn"):
            expected[e.account] -= e.amount
        for account, amount in expected.items():
            assert self.owed(account) == amount, (account, amount)
        total_owed = self.call(reg.totalOwed())
        assert total_owed == sum(expected.values())
        escrow = sum(self.call(reg.escrowOf(j)) for j in range(1, self.call(reg.jobCount()) + 1))
        burned = self.call(reg.totalBurned())
        assert burned == sum(e.burned for e in self.events(self.registry, "JobFraudulent"))
        balance = self.w3.eth.get_balance(self.registry.address)
        assert balance == total_owed + burned + escrow, (balance, total_owed, burned, escrow)
        assert self.w3.eth.get_balance(self.game.address) == 0
        if self.da is not None:
            assert self.w3.eth.get_balance(self.da.address) == 0


@dataclass(frozen=True)
class Snapshot:
    block: Any
    receipts: tuple[Any, ...]
    known: frozenset[str]


def _named(contract: Any, fn_name: str, value: Any) -> dict[str, Any]:
    (fn_abi,) = [x for x in contract.abi if x.get("name") == fn_name and x["type"] == "function"]
    return _to_dict(fn_abi["outputs"][0], value)


def _to_dict(abi_item: dict[str, Any], value: Any) -> Any:
    if abi_item["type"] == "tuple":
        return {c["name"]: _to_dict(c, v) for c, v in zip(abi_item["components"], value, strict=True)}
    return value


def new_w3() -> Web3:
    """A fresh eth-tester chain."""
    w3 = Web3(EthereumTesterProvider())
    w3.eth.default_account = w3.eth.accounts[0]
    return w3


#: The registry's floors in the tests (JobRegistry constructor order): challenge window, clock and
#: posting period (seconds), challenger bond (wei), bounty (basis points of a convicted stake).
MIN_WINDOW, MIN_CLOCK, MIN_POSTING, MIN_BOND, BOUNTY_BPS = 150, 100, 200, 1_000, 5_000
FLOORS = (MIN_WINDOW, MIN_CLOCK, MIN_POSTING, MIN_BOND, BOUNTY_BPS)
#: GameTypes.sol MAX_ACCEPT_PERIOD: the longest acceptPeriod createJob takes (365 days).
MAX_ACCEPT_PERIOD = 365 * 86_400
#: Wei per gas of a demand's answer fee (DataAvailability constructor; protocol.availability.DEV_FEE_GAS_PRICE).
DA_FEE_GAS_PRICE = 10**9


def bounty(stake: int) -> int:
    """What a convicted stake pays the winner (the registry's rounding); the rest is burned."""
    return stake * BOUNTY_BPS // 10_000


def deploy(w3: Web3 | None = None, adjudicator: str = "ToyAdjudicator") -> Deployment:
    """Deploys JobRegistry (with :data:`FLOORS`), the adjudicator (ToyAdjudicator; ``"Adjudicator"``:
    the real one, kept in ``dep.toy`` all the same) and DisputeGame and binds the game."""
    w3 = w3 or new_w3()
    acc = w3.eth.accounts
    w3.provider.ethereum_tester.time_travel(int(w3.eth.get_block("pending")["timestamp"]) + TIME_OFFSET)
    dep = Deployment(w3, None, None, None, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5])
    dep.known.update(acc[:8])
    dep.registry = dep.deploy("JobRegistry", *FLOORS)
    dep.toy = dep.deploy(adjudicator)
    dep.game = dep.deploy("DisputeGame", dep.registry.address, dep.toy.address)
    dep.tx(dep.registry.functions.setDisputeGame(dep.game.address), dep.deployer)
    dep.da = dep.deploy("DataAvailability", dep.registry.address, DA_FEE_GAS_PRICE)
    dep.tx(dep.registry.functions.setAvailability(dep.da.address), dep.deployer)
    dep._deployed = dep.snapshot()
    return dep


# ---------------------------------------------------------------------------------------------
# Graph and synthetic run


@dataclass(frozen=True)
class JobConfig:
    """Job parameters of a test job (the graph and roots come from the run)."""

    n_steps: int = 6
    interval_length: int = 4
    n_slots: int = 2
    payment: int = 10**18
    trainer_stake: int = 3 * 10**18
    challenger_bond: int = 10**17
    challenge_window: int = 1_000
    clock: int = 500
    posting_period: int = 10_000
    accept_period: int = 5_000
    n_samples: int = 100
    data_seed: bytes = hashlib.sha256(b"seed").digest()
    data_root: bytes = hashlib.sha256(b"dataset").digest()
    spec_hash: bytes = hashlib.sha256(b"spec").digest()

    @property
    def n_intervals(self) -> int:
        return -(-self.n_steps // self.interval_length)

    def interval_of(self, s: int) -> tuple[int, int]:
        """``(interval, position)`` of step ``s``."""
        return (s - 1) // self.interval_length, (s - 1) % self.interval_length

    def interval_steps(self, i: int) -> range:
        k = self.interval_length
        return range(i * k + 1, min(i * k + k, self.n_steps) + 1)


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: int
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    attrs: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


#: The CONST op's tensor.
CONST_TENSOR = np.array([0.5], dtype=np.float32)


def slot_shape(k: int) -> tuple[int, ...]:
    """State component shapes: slot 0 has 130 elements (3 chunks, the last one of 2 elements)."""
    return {0: (130,), 1: (2, 5)}.get(k, (8,))


@dataclass
class Graph:
    ops: list[OpSpec]
    descriptors: list[bytes]
    tree: MerkleTree
    index: dict[str, int]

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def n_ops(self) -> int:
        return len(self.ops)

    def output_op(self, slot: int) -> int:
        return self.index[f"output{slot}"]


def make_graph(n_slots: int) -> Graph:
    """Ops: data [2, 5], const [1], input_k, update_k, output_k (k < n_slots), sum (of update0),
    empty (0 elements, of data). update0 = input0 + const (130 elements, 3 chunks), update1 =
    input1 * data (10 elements, 1 chunk), update_k = input_k * 0.5 (k >= 2)."""
    ops: list[OpSpec] = [
        OpSpec("data", KIND_DATA, (), (2, 5)),
        OpSpec("const", KIND_CONST, (), (1,), (int.from_bytes(C.tensor_root(CONST_TENSOR), "big"),)),
    ]
    for k in range(n_slots):
        ops.append(OpSpec(f"input{k}", KIND_INPUT, (), slot_shape(k), (k,)))
    for k in range(n_slots):
        if k == 0:
            ops.append(OpSpec("update0", KIND_ADD, (2, 1), slot_shape(0)))
        elif k == 1:
            ops.append(OpSpec("update1", KIND_MUL, (3, 0), slot_shape(1)))
        else:
            ops.append(OpSpec(f"update{k}", KIND_MUL_S, (2 + k,), slot_shape(k), (0x3F000000,)))
    for k in range(n_slots):
        ops.append(OpSpec(f"output{k}", KIND_OUTPUT, (2 + n_slots + k,), slot_shape(k), (k,)))
    ops.append(OpSpec("sum", KIND_SUM, (2 + n_slots,), (1,)))
    ops.append(OpSpec("empty", KIND_RESHAPE, (0,), (0, 5)))
    return graph_of(ops)


def graph_of(ops: list[OpSpec]) -> Graph:
    """The graph (descriptors, tree, name index) of a list of ops."""
    descriptors = [
        C.encode_op_descriptor(op.kind, op.inputs, op.shape, [ops[i].shape for i in op.inputs], op.attrs)
        for op in ops
    ]
    return Graph(ops, descriptors, C.graph_tree(descriptors), {op.name: j for j, op in enumerate(ops)})


def synth_output(s: int, j: int, input_roots: Sequence[bytes], numel: int) -> np.ndarray:
    """The synthetic semantics of every non-bind op: FP32 values derived from (s, j, inputs)."""
    seed = hashlib.sha256(b"synth" + s.to_bytes(8, "big") + j.to_bytes(4, "big") + b"".join(input_roots))
    rng = np.random.default_rng(int.from_bytes(seed.digest()[:8], "big"))
    return rng.uniform(-2.0, 2.0, numel).astype(np.float32)


def synth_log(s: int, j: int, numel: int) -> list[C.LogEntry]:
    """A few rounding-log entries for update0 (so op log roots differ from the empty log)."""
    return [C.LogEntry(3, 1, 0), C.LogEntry(min(70, numel - 1), 3, 0x3F800000 + s)]


@dataclass(frozen=True)
class Cheat:
    """How a cheating trainer deviates, at step ``step``.

    kinds: ``element`` (one element of op ``op`` is off by one), ``record_length`` (op ``op``'s
    output has one element too many), ``input_bind`` (INPUT of ``slot`` reads a tampered
    tensor), ``output_bind`` (state component ``slot`` is tampered after the trace),
    ``const_bind`` (the CONST op's output is tampered), ``step_leaf`` (step leaf encodes the
    wrong step number), ``initial_state`` (training starts from a state other than the
    registered one; step must be 1).
    """

    kind: str
    step: int
    op: str = "update0"
    slot: int = 0
    index: int = 100


@dataclass
class StepRecord:
    s: int
    outputs: list[np.ndarray]
    op_log_roots: list[bytes]
    trace: MerkleTree
    log_tree: MerkleTree
    components: list[np.ndarray]
    comp_roots: list[bytes]
    state_tree: MerkleTree
    leaf: bytes

    @property
    def state_root(self) -> bytes:
        return self.state_tree.root

    @property
    def log_root(self) -> bytes:
        return self.log_tree.root


@dataclass
class Run:
    """A trainer's complete record of a job: every step's trace, logs, state and the interval trees."""

    cfg: JobConfig
    graph: Graph
    init_comp_roots: list[bytes]
    init_state_tree: MerkleTree
    registered_init_root: bytes
    steps: dict[int, StepRecord]
    interval_trees: list[MerkleTree]

    def state_tree(self, s: int) -> MerkleTree:
        """Tree of stateRoot_s (s = 0: the state the run started from)."""
        return self.init_state_tree if s == 0 else self.steps[s].state_tree

    def comp_roots(self, s: int) -> list[bytes]:
        return self.init_comp_roots if s == 0 else self.steps[s].comp_roots

    def log_root(self, s: int) -> bytes:
        return self.steps[s].log_root

    @property
    def interval_roots(self) -> list[bytes]:
        return [t.root for t in self.interval_trees]

    def job_params(self, trainer: str) -> tuple[Any, ...]:
        c = self.cfg
        return (
            trainer, c.spec_hash, c.data_root, c.data_seed, c.n_samples, self.graph.root,
            self.graph.n_ops, c.n_slots, self.registered_init_root, c.n_steps, c.interval_length,
            c.trainer_stake, c.challenger_bond, c.challenge_window, c.clock, c.posting_period,
            c.accept_period,
        )


def initial_state(n_slots: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.uniform(-1, 1, int(np.prod(slot_shape(k)))).astype(np.float32) for k in range(n_slots)]


def _bump(a: np.ndarray, index: int | None = None) -> np.ndarray:
    out = a.copy().reshape(-1)
    if index is None:
        out = (out + np.float32(1.0)).astype(np.float32)
    else:
        out[index] = np.float32(out[index] + np.float32(1.0))
    return out


def simulate(cfg: JobConfig, cheat: Cheat | None = None, graph: Graph | None = None) -> Run:
    """Trains the synthetic model for ``cfg.n_steps`` steps, honestly or with ``cheat``."""
    graph = graph or make_graph(cfg.n_slots)
    honest_init = initial_state(cfg.n_slots)
    registered = C.state_root([C.tensor_root(a) for a in honest_init])
    state = honest_init
    if cheat and cheat.kind == "initial_state":
        state = [_bump(state[0])] + state[1:]
    init_roots = [C.tensor_root(a) for a in state]
    init_tree = C.roots_tree(init_roots)

    def at(kind: str, s: int) -> bool:
        return cheat is not None and cheat.kind == kind and cheat.step == s

    steps: dict[int, StepRecord] = {}
    for s in range(1, cfg.n_steps + 1):
        done: dict[int, np.ndarray] = {}

        def output(
            j: int, s: int = s, done: dict[int, np.ndarray] = done, state: list[np.ndarray] = state
        ) -> np.ndarray:
            # Evaluated in dependency order, so a (malformed) graph reading a later op still runs.
            if j in done:
                return done[j]
            op = graph.ops[j]
            if op.kind == KIND_INPUT:
                out = state[op.attrs[0]]
                if at("input_bind", s) and cheat.slot == op.attrs[0]:  # type: ignore[union-attr]
                    out = _bump(out)
            elif op.kind == KIND_CONST:
                out = _bump(CONST_TENSOR) if at("const_bind", s) else CONST_TENSOR
            elif op.kind == KIND_OUTPUT:
                out = output(op.inputs[0])
            else:
                roots = [C.tensor_root(output(i)) for i in op.inputs]
                out = synth_output(s, j, roots, op.numel)
                if at("element", s) and graph.index[cheat.op] == j:  # type: ignore[union-attr]
                    out = _bump(out, cheat.index)  # type: ignore[union-attr]
                if at("record_length", s) and graph.index[cheat.op] == j:  # type: ignore[union-attr]
                    out = np.append(out, np.float32(0.25)).astype(np.float32)
            done[j] = out
            return out

        outs = [output(j) for j in range(graph.n_ops)]
        logs = [
            C.op_log_root(synth_log(s, j, op.numel) if op.name == "update0" else [])
            for j, op in enumerate(graph.ops)
        ]
        components = [outs[graph.output_op(k)] for k in range(cfg.n_slots)]
        if at("output_bind", s):
            components[cheat.slot] = _bump(components[cheat.slot])  # type: ignore[union-attr]
        comp_roots = [C.tensor_root(a) for a in components]
        state_tree = C.roots_tree(comp_roots)
        log_tree = C.roots_tree(logs)
        number = s + 1 if at("step_leaf", s) else s
        leaf = C.step_leaf(number, state_tree.root, log_tree.root)
        steps[s] = StepRecord(
            s, outs, logs, C.roots_tree([C.tensor_root(o) for o in outs]), log_tree, components,
            comp_roots, state_tree, leaf,
        )
        state = components
    trees = [
        MerkleTree.from_leaves([steps[s].leaf for s in cfg.interval_steps(i)])
        for i in range(cfg.n_intervals)
    ]
    return Run(cfg, graph, init_roots, init_tree, registered, steps, trees)


# ---------------------------------------------------------------------------------------------
# Job helpers


def create_job(dep: Deployment, run: Run, client: str | None = None, trainer: str | None = None) -> int:
    client = client or dep.client
    trainer = trainer or dep.trainer
    r = dep.tx(dep.registry.functions.createJob(run.job_params(trainer)), client, value=run.cfg.payment)
    (ev,) = dep.registry.events.JobCreated().process_receipt(r, errors=DISCARD)
    return int(ev.args.job)


def expire_offer(dep: Deployment, job: int) -> int:
    """Moves time past the job's accept deadline (the client may cancel from then on); returns it."""
    deadline = int(dep.call(dep.registry.functions.acceptDeadline(job)))
    dep.at(max(dep.now(), deadline + 1))
    return deadline


def accept_job(dep: Deployment, job: int, run: Run, trainer: str | None = None) -> None:
    dep.tx(dep.registry.functions.acceptJob(job), trainer or dep.trainer, value=run.cfg.trainer_stake)


def post_intervals(dep: Deployment, job: int, run: Run, upto: int | None = None) -> None:
    """Posts intervals ``next .. upto-1`` (all by default)."""
    start = dep.job(job)["nextInterval"]
    for i in range(start, run.cfg.n_intervals if upto is None else upto):
        dep.tx(dep.registry.functions.postInterval(job, i, run.interval_roots[i]), dep.trainer)


def active_job(dep: Deployment, run: Run, post: bool = True) -> int:
    """Creates, accepts and (by default) fully posts a job for ``run``."""
    job = create_job(dep, run)
    accept_job(dep, job, run)
    if post:
        post_intervals(dep, job, run)
    return job


def challenge(dep: Deployment, job: int, interval: int, challenger: str | None = None, bond: int | None = None) -> int:
    challenger = challenger or dep.challenger
    if bond is None:
        bond = dep.job(job)["params"]["challengerBond"]
    r = dep.tx(dep.game.functions.challenge(job, interval), challenger, value=bond)
    (ev,) = dep.game.events.GameCreated().process_receipt(r, errors=DISCARD)
    return int(ev.args.game)


def split(size: int) -> int:
    """The RFC 9162 split: the largest power of two below ``size`` (size >= 2)."""
    return 1 << ((size - 1).bit_length() - 1)


def children(tree: MerkleTree, lo: int, size: int) -> tuple[bytes, bytes]:
    k = split(size)
    return tree.range_root(lo, lo + k), tree.range_root(lo + k, lo + size)


def _path(tree: MerkleTree, index: int) -> list[bytes]:
    return list(tree.prove(index).path)


# ---------------------------------------------------------------------------------------------
# Actors


class Actor:
    def __init__(self, dep: Deployment, addr: str) -> None:
        self.dep = dep
        self.addr = addr
        self.last_error: Reverted | None = None

    def send(self, fn: Any, label: str | None = None) -> bool:
        """Sends a move; False (and ``last_error``) when the contract rejects it."""
        try:
            self.dep.tx(fn, self.addr, label=label)
        except Reverted as e:
            self.last_error = e
            return False
        return True

    def claim_timeout(self, gid: int) -> None:
        self.dep.tx(self.dep.game.functions.claimTimeout(gid), self.addr)


class Trainer(Actor):
    """Plays from its run; honest when the run is."""

    def __init__(self, dep: Deployment, run: Run, addr: str | None = None, one_step: bool = True) -> None:
        super().__init__(dep, addr or dep.trainer)
        self.run = run
        self.one_step = one_step  # False: never asks for the ruling (a cheater that knows it loses)

    def step_of(self, v: dict[str, Any]) -> StepRecord:
        return self.run.steps[v["step"]]

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        g = self.dep.game.functions
        phase, lo, size = v["phase"], v["lo"], v["size"]
        try:
            if phase == Phase.STEPS:
                tree = self.run.interval_trees[v["interval"]]
                if size > 1:
                    return self.send(g.reveal(gid, *children(tree, lo, size)))
                return self.send(g.openStep(gid, *self.step_opening(v["interval"], lo)))
            if phase == Phase.TRACE_COMMIT:
                return self.send(g.commitTrace(gid, self.step_of(v).trace.root))
            if phase == Phase.TRACE:
                if size > 1:
                    return self.send(g.reveal(gid, *children(self.step_of(v).trace, lo, size)))
                return self.send(g.openOp(gid, self.op_opening(v["step"], lo)))
            if phase == Phase.ELEMENT:
                out = self.step_of(v).outputs[v["op"]]
                if size > 1:
                    return self.send(g.reveal(gid, *children(C.tensor_tree(out), lo, size)))
                return self.send(g.openChunk(gid, C.chunk_bytes(out, lo)))
            if phase == Phase.ONE_STEP:
                if not self.one_step:
                    self.last_error = Reverted("TrainerDeclinesOneStep", (), b"")
                    return False
                desc, roots = self.op_inputs(v["step"], v["op"])
                return self.send(g.oneStep(gid, desc, roots, b""))
        except (IndexError, ValueError) as e:  # its own record does not even fit the node
            self.last_error = Reverted("TrainerCannotBuildMove", (str(e),), b"")
            return False
        raise AssertionError(f"trainer asked to move in phase {phase!r}")

    def step_opening(self, interval: int, lo: int) -> tuple[Any, ...]:
        cfg = self.run.cfg
        s = interval * cfg.interval_length + lo + 1
        prev_log, prev_proof = b"\x00" * 32, []
        if s > 1:
            pi, pp = cfg.interval_of(s - 1)
            prev_log = self.run.log_root(s - 1)
            prev_proof = _path(self.run.interval_trees[pi], pp)
        return (
            self.run.comp_roots(s - 1), self.run.comp_roots(s), self.run.log_root(s), prev_log, prev_proof,
        )

    def op_inputs(self, s: int, j: int) -> tuple[bytes, list[bytes]]:
        rec = self.run.steps[s]
        op = self.run.graph.ops[j]
        return self.run.graph.descriptors[j], [C.tensor_root(rec.outputs[i]) for i in op.inputs]

    def op_opening(self, s: int, j: int) -> tuple[Any, ...]:
        rec = self.run.steps[s]
        graph = self.run.graph
        op = graph.ops[j]
        desc, input_roots = self.op_inputs(s, j)
        bind: list[bytes] = []
        if op.kind == KIND_INPUT:
            bind = _path(self.run.state_tree(s - 1), op.attrs[0])
        elif op.kind == KIND_OUTPUT:
            bind = _path(rec.state_tree, op.attrs[0])
        return (
            C.tensor_root(rec.outputs[j]),
            desc,
            _path(graph.tree, j),
            rec.op_log_roots[j],
            _path(rec.log_tree, j),
            input_roots,
            [_path(rec.trace, i) for i in op.inputs],
            bind,
        )


class Challenger(Actor):
    """Base challenger: subclasses decide which child to take and which element to pick."""

    #: Whether it asks for the ruling itself when the trainer does not.
    asks_ruling = False

    def one_step(self, gid: int) -> bool:
        """Asks the adjudicator, with the descriptor and input roots from the OpOpened event."""
        ev = self.dep.events(self.dep.game, "OpOpened", game=gid)[-1]
        roots = [bytes(r) for r in ev.inputRoots]
        return self.send(self.dep.game.functions.oneStep(gid, bytes(ev.descriptor), roots, b""))

    def side(self, gid: int, v: dict[str, Any]) -> bool:
        raise NotImplementedError

    def element(self, gid: int, v: dict[str, Any], chunk: bytes) -> int:
        raise NotImplementedError

    def chunk(self, gid: int) -> bytes:
        return bytes(self.dep.events(self.dep.game, "ChunkOpened", game=gid)[-1].data)

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        g = self.dep.game.functions
        if v["phase"] in (Phase.STEPS, Phase.TRACE, Phase.ELEMENT):
            return self.send(g.choose(gid, self.side(gid, v)))
        if v["phase"] == Phase.PICK:
            chunk = self.chunk(gid)
            return self.send(g.pickElement(gid, chunk, self.element(gid, v, chunk)))
        raise AssertionError(f"challenger asked to move in phase {v['phase']!r}")


class FalseChallenger(Challenger):
    """Disputes an honest claim: walks to ``(position, op, element)`` whatever it sees."""

    def __init__(self, dep: Deployment, position: int = -1, op: int = 0, element: int = 0, addr: str | None = None):
        super().__init__(dep, addr or dep.challenger)
        self.position, self.op, self.element_index = position, op, element

    def side(self, gid: int, v: dict[str, Any]) -> bool:
        target = {Phase.STEPS: self.position, Phase.TRACE: self.op, Phase.ELEMENT: self.element_index // 64}[
            v["phase"]
        ]
        if target < 0:
            target = v["lo"] + v["size"] - 1
        return target >= v["lo"] + split(v["size"])

    def element(self, gid: int, v: dict[str, Any], chunk: bytes) -> int:
        return min(self.element_index % 64, len(chunk) // 4 - 1)


class HonestChallenger(Challenger):
    """Replays honestly and descends to the first thing the trainer cannot defend."""

    asks_ruling = True

    def __init__(self, dep: Deployment, honest: Run, addr: str | None = None):
        super().__init__(dep, addr or dep.challenger)
        self.honest = honest

    def first_bad_interval(self, posted: Sequence[bytes]) -> int:
        for i, root in enumerate(posted):
            if root != self.honest.interval_roots[i]:
                return i
        raise AssertionError("every posted interval is honest")

    def opened_components(self, gid: int) -> list[bytes]:
        return [bytes(c) for c in self.dep.events(self.dep.game, "StepOpened", game=gid)[-1].components]

    def side(self, gid: int, v: dict[str, Any]) -> bool:
        lo, size = v["lo"], v["size"]
        k = split(size)
        if v["phase"] == Phase.STEPS:
            tree = self.honest.interval_trees[v["interval"]]
            return v["left"] == tree.range_root(lo, lo + k)
        rec = self.honest.steps[v["step"]]
        if v["phase"] == Phase.TRACE:
            if v["left"] != rec.trace.range_root(lo, lo + k):
                return False
            # An honest record can still break a bind with the trainer's opened stateRoot_s.
            bad = self.first_broken_bind(gid, v["step"])
            return not (bad is not None and lo <= bad < lo + k)
        tree = C.tensor_tree(rec.outputs[v["op"]])
        return v["left"] == tree.range_root(lo, lo + k)

    def first_broken_bind(self, gid: int, s: int) -> int | None:
        comps = self.opened_components(gid)
        rec = self.honest.steps[s]
        bad = [
            self.honest.graph.output_op(k)
            for k in range(self.honest.cfg.n_slots)
            if C.tensor_root(rec.outputs[self.honest.graph.output_op(k)]) != comps[k]
        ]
        return min(bad) if bad else None

    def element(self, gid: int, v: dict[str, Any], chunk: bytes) -> int:
        honest = C.chunk_bytes(self.honest.steps[v["step"]].outputs[v["op"]], v["lo"])
        for e in range(len(chunk) // 4):
            if chunk[4 * e : 4 * e + 4] != honest[4 * e : 4 * e + 4]:
                return e
        return 0


# ---------------------------------------------------------------------------------------------
# Oracle (the toy adjudicator's truth) and the game loop


def claim_key(
    desc: bytes, input_roots: Sequence[bytes], index: int, op_log_root: bytes, step: int, cfg: JobConfig
) -> bytes:
    """ToyAdjudicator.keyOf: the claim's context without the claimed value."""
    return keccak(
        abi_encode(
            ["bytes", "bytes32[]", "uint256", "bytes32", "uint64", "bytes32", "bytes32", "uint64"],
            [desc, list(input_roots), index, op_log_root, step, cfg.data_root, cfg.data_seed, cfg.n_samples],
        )
    )


class Oracle:
    """Registers with the toy adjudicator the true value of a picked element: the synthetic
    semantics applied to the agreed input roots."""

    def __init__(self, dep: Deployment, graph: Graph, cfg: JobConfig) -> None:
        self.dep, self.graph, self.cfg = dep, graph, cfg

    def register(self, gid: int) -> tuple[bytes, int]:
        v = self.dep.view(gid)
        ev = self.dep.events(self.dep.game, "OpOpened", game=gid)[-1]
        roots = [bytes(r) for r in ev.inputRoots]
        j = v["op"]
        truth = synth_output(v["step"], j, roots, self.graph.ops[j].numel)[v["index"]]
        bits = int(np.float32(truth).view(np.uint32))
        key = claim_key(bytes(ev.descriptor), roots, v["index"], v["opLogRoot"], v["step"], self.cfg)
        self.dep.tx(self.dep.toy.functions.setTruth(key, bits), self.dep.anyone, label="setTruth")
        return key, bits


@dataclass
class GameResult:
    gid: int
    status: GameStatus
    ruling: Ruling
    phases: list[Phase]
    stuck: Reverted | None = None


def play(
    dep: Deployment,
    gid: int,
    trainer: Trainer,
    challenger: Challenger,
    *,
    oracle: Oracle | None = None,
    until: Callable[[dict[str, Any]], bool] | None = None,
    max_moves: int = 400,
) -> GameResult:
    """Plays game ``gid`` to the end (or until ``until(view)``). A side that cannot make its
    move (the contract rejects it) is timed out: time moves to its deadline + 1 and the other
    side claims the timeout."""
    phases: list[Phase] = []
    oracle = oracle or Oracle(dep, trainer.run.graph, trainer.run.cfg)
    for _ in range(max_moves):
        v = dep.view(gid)
        if v["status"] != GameStatus.IN_PROGRESS:
            break
        if until is not None and until(v):
            return GameResult(gid, v["status"], Ruling.NONE, phases)
        if not phases or phases[-1] != v["phase"]:
            phases.append(v["phase"])
        if v["phase"] == Phase.ONE_STEP:
            oracle.register(gid)
        mover, other = (trainer, challenger) if v["toMove"] == Party.TRAINER else (challenger, trainer)
        if not mover.move(gid, v):
            if v["phase"] == Phase.ONE_STEP and challenger.asks_ruling and challenger.one_step(gid):
                continue
            dep.at(max(dep.now(), v["deadline"] + 1))
            other.claim_timeout(gid)
            break
    else:
        raise AssertionError("game did not end")
    v = dep.view(gid)
    (ev,) = dep.events(dep.game, "GameResolved", game=gid) or [None]
    ruling = Ruling(ev.ruling) if ev is not None else Ruling.NONE
    return GameResult(gid, v["status"], ruling, phases, trainer.last_error or challenger.last_error)


def play_keeping_snapshots(
    dep: Deployment, gid: int, trainer: Trainer, challenger: Challenger, oracle: Oracle
) -> tuple[dict[str, tuple[Snapshot, dict[str, Any]]], GameResult]:
    """Plays game ``gid`` to the end, keeping a snapshot and the view at the first move of each
    kind (:func:`label_of`); at the one-step move the oracle knows the claim before the snapshot."""
    snaps: dict[str, tuple[Snapshot, dict[str, Any]]] = {}

    def keep(v: dict[str, Any]) -> bool:
        label = label_of(v)
        if label not in snaps:
            if label == "onestep":
                oracle.register(gid)
                v = dep.view(gid)
            snaps[label] = (dep.snapshot(), v)
        return False

    return snaps, play(dep, gid, trainer, challenger, oracle=oracle, until=keep)


# ---------------------------------------------------------------------------------------------
# Gas


def gas_per_move(
    n_slots: int = 2,
    n_steps: int = 6,
    interval_length: int = 4,
    op: str = "update0",
    dep: Deployment | None = None,
) -> dict[str, int]:
    """Gas used by each move type in one full game, plus the job's life cycle.

    Plays an honest trainer against a false challenger that descends to the last step of
    interval 0, to op ``op`` and to element 100 (a full-depth game ending in `oneStep` with the
    toy adjudicator, whose own cost is a few thousand gas), then finalizes and withdraws.
    Returns ``{move: max gas used by one transaction of that move}``; keys: createJob,
    acceptJob, postInterval, challenge, reveal, choose, openStep, commitTrace, openOp,
    openChunk, pickElement, oneStep, finalize, withdraw. ``dep``: a fresh deployment to use
    (default: a new chain).
    """
    cfg = JobConfig(n_steps=n_steps, interval_length=interval_length, n_slots=n_slots)
    dep = dep or deploy()
    run = simulate(cfg)
    dep.gas_log.clear()
    job = active_job(dep, run)
    gid = challenge(dep, job, 0)
    ch = FalseChallenger(dep, position=-1, op=run.graph.index[op], element=100)
    res = play(dep, gid, Trainer(dep, run), ch)
    assert res.status == GameStatus.TRAINER_WON, res
    dep.at(dep.call(dep.registry.functions.windowEnd(job, cfg.n_intervals - 1)) + 1)
    dep.tx(dep.registry.functions.finalize(job), dep.anyone)
    dep.tx(dep.registry.functions.withdraw(), dep.trainer)
    out: dict[str, int] = {}
    for name, gas in dep.gas_log:
        if name == "setTruth":
            continue
        out[name] = max(out.get(name, 0), gas)
    return out


# ---------------------------------------------------------------------------------------------
# Chunk level: long reductions with their real semantics (the chunk adjudicator is real)

KIND_MATMUL, KIND_MEAN = 30, 32
_REDUCTIONS = (KIND_MATMUL, KIND_SUM, KIND_MEAN)


def long_graph(k: int, rows: int = 2, cols: int = 3, bias: bool = True) -> Graph:
    """make_graph(2)'s ops plus long reductions over synthetic inputs: ``mm`` = MATMUL of ``xa
    [rows, k]`` and ``xb [cols, k]`` (+ ``xbias [cols]``), ``sm`` = SUM and ``mean`` = MEAN of
    ``xs [rows, k]``. The synthetic ops (kind ADD of ``data``) are random, as in :func:`simulate`."""
    ops = list(make_graph(2).ops)
    j = len(ops)
    ops.append(OpSpec("xa", KIND_ADD, (0,), (rows, k)))
    ops.append(OpSpec("xb", KIND_ADD, (0,), (cols, k)))
    ops.append(OpSpec("xbias", KIND_ADD, (0,), (cols,)))
    ops.append(OpSpec("mm", KIND_MATMUL, (j, j + 1, j + 2) if bias else (j, j + 1), (rows, cols)))
    ops.append(OpSpec("xs", KIND_ADD, (0,), (rows, k)))
    ops.append(OpSpec("sm", KIND_SUM, (j + 4,), (rows, 1)))
    ops.append(OpSpec("mean", KIND_MEAN, (j + 4,), (rows, 1)))
    return graph_of(ops)


def honest_reduction(desc: bytes, inputs: Sequence[np.ndarray], numel: int) -> np.ndarray:
    """Every output element of a MATMUL/SUM/MEAN rounded to nearest from its exact value."""
    from vtrain.numerics import exact as X

    bits = []
    for i in range(numel):
        enc = X.enclosure(desc, inputs, i)  # integer arithmetic; exact unless terms span > 2^72
        assert enc is not None
        e = enc.value(enc.lo) if enc.lo == enc.hi else X.exact_value(desc, inputs, i)
        bits.append(X.rn32(e))
    return np.array(bits, dtype=np.uint32).view(np.float32)


def simulate_real(cfg: JobConfig, graph: Graph, cheat: Cheat | None = None) -> Run:
    """:func:`simulate` where MATMUL/SUM/MEAN ops compute their real semantics (no log entries)
    from synthetic inputs; the other ops stay synthetic."""
    global synth_output
    synth = synth_output
    produced: dict[bytes, np.ndarray] = {}

    def real(s: int, j: int, input_roots: Sequence[bytes], numel: int) -> np.ndarray:
        if graph.ops[j].kind in _REDUCTIONS:
            missing = [r.hex() for r in input_roots if r not in produced]
            if missing:
                raise ValueError(f"op {graph.ops[j].name}: inputs must be synthetic ops, missing {missing}")
            return honest_reduction(graph.descriptors[j], [produced[r] for r in input_roots], numel)
        out = synth(s, j, input_roots, numel)
        produced[C.tensor_root(out)] = out
        return out

    synth_output = real
    try:
        return simulate(cfg, cheat, graph)
    finally:
        synth_output = synth


def op_log(run: Run, s: int, j: int) -> list[C.LogEntry]:
    """The op log entries :func:`simulate` commits for op ``j`` at step ``s``."""
    op = run.graph.ops[j]
    return synth_log(s, j, op.numel) if op.name == "update0" else []


def posted_partials(dep: Deployment, gid: int) -> list[Any]:
    """The partials of the game's PartialsPosted event."""
    from vtrain.numerics.exact import Partial

    ev = dep.events(dep.game, "PartialsPosted", game=gid)[-1]
    return [Partial.of(p) for p in ev.partials]


class ChunkTrainer(Trainer):
    """A :class:`Trainer` that also plays the chunk level: posts the partials of its own run
    (through ``tamper`` when given: a cheat) and asks for the chunk level's ruling (``settles``)."""

    def __init__(
        self,
        dep: Deployment,
        run: Run,
        addr: str | None = None,
        tamper: Callable[[list[Any]], list[Any]] | None = None,
        settles: bool = True,
    ) -> None:
        super().__init__(dep, run, addr)
        self.tamper = tamper
        self.settles = settles

    def tensors(self, v: dict[str, Any]) -> tuple[bytes, list[np.ndarray]]:
        rec = self.run.steps[v["step"]]
        j = v["op"]
        return self.run.graph.descriptors[j], [rec.outputs[i] for i in self.run.graph.ops[j].inputs]

    def partials(self, v: dict[str, Any]) -> list[Any]:
        from vtrain.numerics import exact as X

        desc, ins = self.tensors(v)
        p = X.element_partials(desc, ins, v["index"])
        return self.tamper(p) if self.tamper is not None else p

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        from protocol.proofs import build_chunk_proof, build_log_proof
        from vtrain.numerics import exact as X

        g = self.dep.game.functions
        phase = v["phase"]
        if phase == Phase.ONE_STEP and X.is_chunked(self.run.graph.descriptors[v["op"]]):
            desc, _ = self.tensors(v)
            return self.send(g.postPartials(gid, desc, [p.as_tuple() for p in self.partials(v)]))
        if phase in (Phase.CHUNK_CHECK, Phase.PARTIALS_RULE):
            desc, ins = self.tensors(v)
            if not self.settles:
                self.last_error = Reverted("TrainerDeclinesRuling", (), b"")
                return False
            if phase == Phase.CHUNK_CHECK:
                proof = build_chunk_proof(desc, ins, v["index"], v["chunk"])
            else:
                proof = build_log_proof(op_log(self.run, v["step"], v["op"]), v["index"])
            _, roots = self.op_inputs(v["step"], v["op"])
            tuples = [p.as_tuple() for p in self.partials(v)]
            return self.send(g.settlePartials(gid, desc, roots, tuples, proof))
        return super().move(gid, v)


class ChunkChallenger(HonestChallenger):
    """An :class:`HonestChallenger` that also answers posted partials: disputes the first chunk
    whose partial differs from its recomputation at the posted scale, else accepts."""

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        from vtrain.numerics import exact as X

        if v["phase"] != Phase.PARTIALS:
            return super().move(gid, v)
        g = self.dep.game.functions
        posted = posted_partials(self.dep, gid)
        j = v["op"]
        rec = self.honest.steps[v["step"]]
        ins = [rec.outputs[i] for i in self.honest.graph.ops[j].inputs]
        bad = X.first_wrong_chunk(self.honest.graph.descriptors[j], ins, v["index"], posted)
        if bad is None:
            return self.send(g.acceptPartials(gid))
        return self.send(g.disputeChunk(gid, [p.as_tuple() for p in posted], bad))


class FalseChunkChallenger(FalseChallenger):
    """A :class:`FalseChallenger` that, at the chunk level, disputes chunk ``chunk`` whatever the
    partials (``chunk=None``: accepts them)."""

    def __init__(self, dep: Deployment, op: int, element: int = 0, chunk: int | None = 0) -> None:
        super().__init__(dep, position=-1, op=op, element=element)
        self.disputed = chunk

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        if v["phase"] != Phase.PARTIALS:
            return super().move(gid, v)
        g = self.dep.game.functions
        if self.disputed is None:
            return self.send(g.acceptPartials(gid))
        posted = [p.as_tuple() for p in posted_partials(self.dep, gid)]
        return self.send(g.disputeChunk(gid, posted, self.disputed))


def chunk_level_gas(terms: int, op: str = "mm", dep: Deployment | None = None) -> dict[str, int]:
    """Gas of the chunk level for one element of a ``terms``-term reduction (``mm``: MATMUL of
    ``[1, terms]`` by ``[1, terms]``, no bias; ``sm``: SUM of ``[1, terms]``), honest trainer:
    postPartials, then either disputeChunk + settlePartials (the chunk check of the last full
    chunk) or acceptPartials + settlePartials (the ruling from the partials). Returns
    ``{move: gas}`` plus ``max`` (the largest transaction of the whole game)."""
    cfg = JobConfig(n_steps=1, interval_length=1)
    graph = long_graph(terms, rows=1, cols=1, bias=False)
    run = simulate_real(cfg, graph)
    dep = dep or deploy()
    dep.gas_log.clear()
    job = active_job(dep, run)
    gid = challenge(dep, job, 0)
    j = graph.index[op]
    trainer = ChunkTrainer(dep, run)
    n_chunks = -(-terms // 2048)
    res = play(dep, gid, trainer, FalseChunkChallenger(dep, op=j), until=lambda v: v["phase"] == Phase.PARTIALS)
    assert res.status == GameStatus.IN_PROGRESS, res
    start = len(dep.gas_log)
    snap = dep.snapshot()
    out: dict[str, int] = {"postPartials": dict(dep.gas_log)["postPartials"]}
    last_full = terms // 2048 - 1 if terms % 2048 == 0 else max(0, n_chunks - 2)
    res = play(dep, gid, trainer, FalseChunkChallenger(dep, op=j, chunk=last_full))
    assert res.status == GameStatus.TRAINER_WON, res
    log = dict(dep.gas_log[start:])
    out["disputeChunk"], out["settlePartials (chunk check)"] = log["disputeChunk"], log["settlePartials"]
    whole = max(g for _, g in dep.gas_log)
    dep.revert(snap)
    res = play(dep, gid, trainer, FalseChunkChallenger(dep, op=j, chunk=None))
    assert res.status == GameStatus.TRAINER_WON, res
    log = dict(dep.gas_log)
    out["acceptPartials"], out["settlePartials (rule)"] = log["acceptPartials"], log["settlePartials"]
    out["max"] = max(whole, max(g for _, g in dep.gas_log))
    return out


__all__ = [
    "Cheat",
    "ChunkChallenger",
    "ChunkTrainer",
    "FalseChunkChallenger",
    "chunk_level_gas",
    "long_graph",
    "simulate_real",
    "Deployment",
    "FalseChallenger",
    "GameResult",
    "GameStatus",
    "HonestChallenger",
    "JobConfig",
    "JobStatus",
    "Oracle",
    "Party",
    "Phase",
    "Reverted",
    "Ruling",
    "Run",
    "Trainer",
    "active_job",
    "challenge",
    "deploy",
    "gas_per_move",
    "make_graph",
    "play",
    "replace",
    "reverts",
    "simulate",
]
