"""A job's history read back from the chain: its terms, intervals, games and every move.

Everything here comes from events and the transactions that emitted them (no local state), so the
client, an auditor or a third party can inspect any job: ``vtrain client status``, ``watch`` and
``vtrain report`` are views of :func:`read_job`. Each move is one transaction: the function called
(decoded from calldata with the contract's ABI), who sent it (trainer / challenger / other), its gas,
its block time, and the events it emitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol.agent import job_first_block
from protocol.reverts import enum_name

#: Registry events with ``JobId indexed job`` as the first topic (the timeline of a job).
JOB_EVENTS = (
    "JobCreated",
    "JobAccepted",
    "JobCancelled",
    "IntervalPosted",
    "BondLocked",
    "GameSettled",
    "JobFraudulent",
    "JobReclaimed",
    "JobFinalized",
)


@dataclass(frozen=True)
class EventRecord:
    """One event: its name, decoded arguments, block, time and transaction."""

    name: str
    args: dict[str, Any]
    block: int
    time: int
    tx: str


@dataclass(frozen=True)
class MoveRecord:
    """One transaction on a game: the function called with its decoded arguments, the mover's role,
    gas used, and the game events it emitted."""

    function: str
    args: dict[str, Any]
    sender: str
    role: str  # "trainer", "challenger" or "other"
    gas: int
    block: int
    time: int
    tx: str
    events: list[EventRecord]


@dataclass(frozen=True)
class IntervalRecord:
    index: int
    root: str
    first_step: int
    size: int
    posted_at: int
    window_end: int


@dataclass(frozen=True)
class GameRecord:
    game: int
    interval: int
    challenger: str
    status: str
    phase: str
    to_move: str
    deadline: int
    winner: str | None
    ruling: str | None
    moves: list[MoveRecord] = field(default_factory=list)

    @property
    def gas(self) -> int:
        return sum(m.gas for m in self.moves)


@dataclass(frozen=True)
class JobRecord:
    job: int
    status: str
    client: str
    trainer: str
    payment: int
    params: dict[str, Any]
    intervals: list[IntervalRecord]
    games: list[GameRecord]
    timeline: list[EventRecord]
    owed: dict[str, int]
    now: int

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (bytes as 0x hex), for ``vtrain client status --json``."""
        import dataclasses

        return _plain(dataclasses.asdict(self))


def _plain(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (bytes, bytearray)):
        return "0x" + bytes(x).hex()
    if hasattr(x, "hex") and not isinstance(x, (int, float, str)):  # HexBytes
        return "0x" + bytes(x).hex()
    return x


def _args(a: Any) -> dict[str, Any]:
    return {k: _plain(v) for k, v in dict(a).items()}


class _Reader:
    def __init__(self, proto: Any) -> None:
        self.proto = proto
        self.chain = proto.chain
        self._times: dict[int, int] = {}
        self._receipts: dict[str, Any] = {}

    def time(self, block: int) -> int:
        if block not in self._times:
            self._times[block] = int(self.chain._retry("eth_getBlockByNumber",
                                                       lambda: self.chain.w3.eth.get_block(block))["timestamp"])
        return self._times[block]

    def event(self, e: Any) -> EventRecord:
        block = int(e["blockNumber"])
        return EventRecord(e["event"], _args(e["args"]), block, self.time(block), _plain(e["transactionHash"]))

    def receipt(self, tx: str) -> Any:
        if tx not in self._receipts:
            self._receipts[tx] = self.chain._retry("eth_getTransactionReceipt",
                                                   lambda: self.chain.w3.eth.get_transaction_receipt(tx))
        return self._receipts[tx]


def read_job(proto: Any, job: int) -> JobRecord:
    """Everything the chain says about ``job``: raises ``ChainError`` when it does not exist."""
    from protocol.chain import ChainError

    chain = proto.chain
    reg = proto.registry
    status_code = int(chain.call(reg.functions.jobStatus(job)))
    if status_code == 0:
        count = int(chain.call(reg.functions.jobCount()))
        has = f"it has jobs 1..{count}" if count else "it has no jobs"
        raise ChainError(f"job {job} does not exist on the registry {reg.address} ({has})")
    r = _Reader(proto)
    first = job_first_block(proto, job)
    rec = chain.call(reg.functions.getJob(job))
    params_t = chain.call(reg.functions.jobParams(job))
    names = [c["name"] for c in _struct_components(reg.abi, "jobParams")]
    params = {n: _plain(v) for n, v in zip(names, params_t)} if names else {}
    timeline: list[EventRecord] = []
    for name in JOB_EVENTS:
        ev = getattr(reg.events, name, None)
        if ev is None:
            continue
        timeline += [r.event(e) for e in ev.get_logs(from_block=first, argument_filters={"job": job})]
    timeline.sort(key=lambda e: (e.block, e.name))
    intervals = [
        IntervalRecord(int(e.args["index"]), e.args["root"], int(e.args["firstStep"]), int(e.args["size"]), e.time,
                       int(chain.call(reg.functions.windowEnd(job, int(e.args["index"])))))
        for e in timeline if e.name == "IntervalPosted"
    ]
    created = proto.game.events.GameCreated.get_logs(from_block=first, argument_filters={"job": job})
    games = [_read_game(r, int(e["args"]["game"]), first) for e in sorted(created, key=lambda e: e["args"]["game"])]
    trainer = params.get("trainer", "")
    client = _plain(_field(reg.abi, "getJob", rec, "client"))
    accounts = {a for a in (client, trainer, *(g.challenger for g in games)) if a}
    owed = {a: int(chain.call(reg.functions.owed(a))) for a in sorted(accounts)}
    return JobRecord(
        job=job,
        status=enum_name("JobStatus", status_code),
        client=client,
        trainer=trainer,
        payment=int(_field(reg.abi, "getJob", rec, "payment") or 0),
        params=params,
        intervals=intervals,
        games=games,
        timeline=timeline,
        owed=owed,
        now=chain.now(),
    )


def _read_game(r: _Reader, gid: int, first: int) -> GameRecord:
    game = r.proto.game
    view = r.chain.call(game.functions.getGame(gid))
    v = dict(zip([c["name"] for c in _struct_components(game.abi, "getGame")], view))
    logs = r.chain._retry("eth_getLogs", lambda: r.chain.w3.eth.get_logs(
        {"address": game.address, "fromBlock": first, "toBlock": "latest",
         "topics": [None, "0x" + gid.to_bytes(32, "big").hex()]}))
    by_tx: dict[str, list[EventRecord]] = {}
    for raw in logs:
        e = _decode_log(game, raw)
        if e is not None:
            rec = r.event(e)
            by_tx.setdefault(rec.tx, []).append(rec)
    moves: list[MoveRecord] = []
    winner = ruling = None
    for tx, events in sorted(by_tx.items(), key=lambda kv: kv[1][0].block):
        t = r.chain._retry("eth_getTransactionByHash", lambda tx=tx: r.chain.w3.eth.get_transaction(tx))
        fname, fargs = events[0].name, {}  # a contract calling the game: name the event instead
        if _sent_to(t, game.address):  # else its calldata is the outer contract's, maybe a look-alike
            try:
                fn, decoded = game.decode_function_input(t["input"])
                fname, fargs = fn.fn_name, _args(decoded)
            except ValueError:
                pass
        sender = t["from"]
        role = "trainer" if sender == v["trainer"] else "challenger" if sender == v["challenger"] else "other"
        moves.append(MoveRecord(fname, fargs, sender, role, int(r.receipt(tx)["gasUsed"]), events[0].block,
                                events[0].time, tx, events))
        for e in events:
            if e.name == "GameResolved":
                winner = enum_name("Party", int(e.args["winner"]))
                ruling = enum_name("Ruling", int(e.args["ruling"]))
    return GameRecord(
        game=gid,
        interval=int(v["interval"]),
        challenger=v["challenger"],
        status=enum_name("GameStatus", int(v["status"])),
        phase=enum_name("Phase", int(v["phase"])),
        to_move=enum_name("Party", int(v["toMove"])),
        deadline=int(v["deadline"]),
        winner=winner,
        ruling=ruling,
        moves=moves,
    )


def _sent_to(tx: Any, address: str) -> bool:
    """True when transaction ``tx`` called ``address`` itself. A move sent through another contract
    (a wallet, a proxy) carries that contract's calldata: a function of the same signature there
    could pass the game other arguments than its calldata shows, so it is never decoded as the move."""
    to = tx.get("to")
    return isinstance(to, str) and to.lower() == address.lower()


def _decode_log(contract: Any, raw: Any) -> Any:
    from eth_utils import event_abi_to_log_topic
    from web3._utils.events import get_event_data

    topic = bytes(raw["topics"][0])
    for item in contract.abi:
        if item.get("type") == "event" and event_abi_to_log_topic(item) == topic:
            return get_event_data(contract.w3.codec, item, raw)
    return None


def _struct_components(abi: list[dict], fn: str) -> list[dict]:
    for item in abi:
        if item.get("type") == "function" and item.get("name") == fn and item.get("outputs"):
            out = item["outputs"][0]
            return out.get("components", [])
    return []


def _field(abi: list[dict], fn: str, value: Any, name: str) -> Any:
    names = [c["name"] for c in _struct_components(abi, fn)]
    return value[names.index(name)] if name in names else None


# -- text ---------------------------------------------------------------------------------------------
def describe(j: JobRecord) -> list[str]:
    """Human lines for ``vtrain client status``."""
    from protocol.reverts import _span

    p = j.params
    lines = [
        f"job {j.job}: {j.status}  client {j.client}  trainer {j.trainer}",
        f"  terms: payment {j.payment / 1e18:g} ETH, stake {int(p.get('trainerStake', 0)) / 1e18:g} ETH, "
        f"bond {int(p.get('challengerBond', 0)) / 1e18:g} ETH, window {_span(int(p.get('challengeWindow', 0)))}, "
        f"clock {_span(int(p.get('clock', 0)))}, posting period {_span(int(p.get('postingPeriod', 0)))}, "
        f"accept period {_span(int(p.get('acceptPeriod', 0)))}",
        f"  steps {p.get('nSteps')}, K {p.get('intervalLength')}, ops/step {p.get('nOps')}; "
        f"intervals posted {len(j.intervals)}",
    ]
    for iv in j.intervals:
        left = iv.window_end - j.now
        window = f"window open {_span(left)} more" if left >= 0 else "window closed"
        lines.append(f"  interval {iv.index} (steps {iv.first_step}..{iv.first_step + iv.size - 1}): "
                     f"root {iv.root[:18]}..., {window}")
    for g in j.games:
        end = f"{g.winner} won by {g.ruling}" if g.winner else (
            g.status if g.status != "InProgress" else f"{g.phase}, {g.to_move.lower()} to move "
            f"({_span(g.deadline - j.now)} left)")
        lines.append(f"  game {g.game} on interval {g.interval} by {g.challenger}: {end}; "
                     f"{len(g.moves)} moves, {g.gas:,} gas")
    for acct, amount in j.owed.items():
        if amount:
            lines.append(f"  owed to {acct}: {amount / 1e18:g} ETH (withdraw to collect)")
    return lines


def describe_move(m: MoveRecord) -> str:
    """One line for a move, e.g. ``choose by challenger (right): Steps lo=2 size=2 [31,420 gas]``."""
    parts = []
    for e in m.events:
        a = e.args
        if "phase" in a and "lo" in a:
            parts.append(f"{enum_name('Phase', int(a['phase']))} lo={a['lo']} size={a['size']}")
        elif e.name == "StepOpened":
            parts.append(f"step {a['step']}")
        elif e.name == "OpOpened":
            parts.append(f"op {a['op']} (kind {a['kind']}, {a['numel']} elements)")
        elif e.name == "ElementPicked":
            parts.append(f"element {a['index']} claimed 0x{int(a['claimed']):08x}")
        elif e.name == "GameResolved":
            parts.append(f"{enum_name('Party', int(a['winner']))} won by {enum_name('Ruling', int(a['ruling']))}")
        else:
            parts.append(e.name)
    return f"{m.function} by {m.role}: {'; '.join(parts)} [{m.gas:,} gas]"
