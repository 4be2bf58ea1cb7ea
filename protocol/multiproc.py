"""`vtrain demo --rpc URL` with the agents as separate OS processes on a real JSON-RPC node.

The orchestrator deploys the contracts and creates each job (it is the client), then starts
``python -m protocol.agents_cli trainer ...`` and ``... auditor ...``. The trainer serves its
artifact store over HTTP on 127.0.0.1; the auditor reads it only from there.

The agents never touch the node's clock; the orchestrator does, only when the run is stalled:
both agents have reported ``idle`` at the current block (or have exited cleanly) for ``grace``
seconds. Then, if a game of the job is in progress, it moves the clock past the deadline of the
party to move (that party's chess clock runs out and the other claims the timeout); else, once
every interval is posted, past the last challenge window (the trainer then finalizes). Game moves
and gas are counted from the chain (every game event is indexed by game id), so they stay right
when an agent is killed and restarted.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexbytes import HexBytes

from protocol.agents_cli import last_window_end, save_deployment
from protocol.chain import Chain, ChainError
from protocol.demo import (
    DEFAULT_CHEAT,
    RULINGS,
    SCENARIOS,
    Narrate,
    ScenarioResult,
    check_cheat,
    create_job,
    default_spec,
)
from protocol.deploy import Protocol, deploy
from protocol.game import PHASE_NAMES, STATUS_IN_PROGRESS, GameView
from protocol.jobs import JobContext, Terms
from vtrain.errors import VtrainError
from vtrain.training.rundir import atomic_write

#: Short terms for a dev node: the orchestrator moves the clock anyway.
DEMO_TERMS = Terms(challenge_window=600, clock=300)
#: What the agents need on a dev node (moves are mined at once, an interval trains in seconds), so
#: that they accept DEMO_TERMS (``protocol.policy``: they refuse terms they cannot answer within).
DEMO_NEEDS = {
    "trainer": ["--move-seconds", "2", "--interval-seconds", "60"],
    "auditor": ["--move-seconds", "2", "--replay-seconds", "60"],
}
ROLE_ACCOUNTS = {"client": 1, "trainer": 2, "auditor": 3, "false_challenger": 4}
PARTIES = {1: "trainer", 2: "challenger"}
JOB_STATUS = ["none", "open", "active", "cancelled", "finalized", "fraudulent"]


class AgentFailed(VtrainError):
    """An agent process exited with an error, or the scenario did not finish in time."""


@dataclass
class AgentProc:
    """One run of one agent process."""

    role: str  # "trainer" or "auditor"
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes]
    reader: threading.Thread
    result: dict | None = None
    idle_block: int = -1
    killed: bool = False
    abandoned: bool = False  # killed for good: counts as waiting (its chess clock may run out)

    @property
    def exited_ok(self) -> bool:
        return self.proc.poll() == 0

    @property
    def done(self) -> bool:
        """Exited cleanly, or killed and abandoned: nothing more to expect from this agent."""
        return self.abandoned or self.exited_ok

    def log_tail(self, n: int = 25) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(lines[-n:])

    def kill(self, sig: int = signal.SIGTERM, wait: float = 5.0) -> None:
        """Kill the agent's whole process group (``sig``, then SIGKILL)."""
        self.killed = True
        for s in (sig, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, s)  # start_new_session: pgid == pid
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.proc.wait()
        self.reader.join(timeout=5)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ProcessScenario:
    """One job played by a trainer process and an auditor process; the orchestrator is the client.

    ``run()`` does it all; tests drive it step by step (``start``, ``tick``, ``wait_until``,
    ``kill``, ``finish``) to kill and restart an agent mid-game.
    """

    proto: Protocol
    rpc: str
    work: Path
    deployment_path: Path
    spec_path: Path
    ctx: JobContext
    terms: Terms
    name: str
    cheat: str | None = None
    false_challenge: bool = False
    say: Narrate = print
    timeout: float = 300.0
    cheat_step: int | None = None
    grace: float = 1.5
    verbose: bool = True
    job: int = 0
    runs: list[AgentProc] = field(default_factory=list)
    advances: list[tuple[str, int]] = field(default_factory=list)
    _events: queue.Queue = field(default_factory=queue.Queue)
    _store_port: int = 0
    _stall: tuple[int, float] | None = None
    _balances0: dict[str, int] = field(default_factory=dict)
    _t0: float = 0.0
    _from_block: int = 0

    @property
    def chain(self) -> Chain:
        return self.proto.chain

    @property
    def accounts(self) -> dict[str, Any]:  # role -> address (web3 wants ChecksumAddress)
        accts = self.chain.accounts()
        return {role: accts[i] for role, i in ROLE_ACCOUNTS.items()}

    @property
    def store_url(self) -> str:
        return f"http://127.0.0.1:{self._store_port}"

    # -- set-up -----------------------------------------------------------------------------------
    def create_job(self) -> int:
        accts = self.accounts
        self._balances0 = {k: self.chain.w3.eth.get_balance(a) for k, a in accts.items()}
        self._from_block = int(self.chain.w3.eth.block_number)
        self.job = create_job(self.proto, accts["client"], accts["trainer"], self.ctx, self.terms)
        self._store_port = free_port()
        self._t0 = time.monotonic()
        spec = self.ctx.spec
        self.say(f"[bold]{self.name}[/]: job {self.job} ({spec.model}, {spec.steps} steps, K={spec.interval}, "
                 f"{self.ctx.job.graph.n_ops} ops/step; agents are separate processes)")
        return self.job

    def argv(self, role: str) -> list[str]:
        base = [sys.executable, "-m", "protocol.agents_cli"] + (["-v"] if self.verbose else []) + [role,
                "--rpc", self.rpc, "--deployment", str(self.deployment_path), "--job", str(self.job),
                "--spec", str(self.spec_path), "--events", "--timeout", str(int(self.timeout + 60)),
                *DEMO_NEEDS[role]]
        if role == "trainer":
            base += ["--store", str(self.work / f"store-{self.job}"), "--serve-store", str(self._store_port),
                     "--account-index", str(ROLE_ACCOUNTS["trainer"])]
            if self.cheat:
                base += ["--cheat", self.cheat] + (["--cheat-step", str(self.cheat_step)] if self.cheat_step else [])
            return base
        base += ["--store-url", self.store_url, "--state-dir", str(self.work / f"auditor-state-{self.job}")]
        if self.false_challenge:
            return base + ["--false-challenger", "--account-index", str(ROLE_ACCOUNTS["false_challenger"])]
        return base + ["--account-index", str(ROLE_ACCOUNTS["auditor"])]

    def start(self, role: str) -> AgentProc:
        """Start (or restart, with the same arguments) the ``role`` agent."""
        n = sum(r.role == role for r in self.runs)
        log_path = self.work / f"job{self.job}-{role}-{n}.log"
        argv = self.argv(role)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "140", "NO_COLOR": "1"}
        with open(log_path, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=True, env=env)
        reader = threading.Thread(target=self._read, args=(proc,), daemon=True, name=f"{role}-stdout")
        run = AgentProc(role, argv, log_path, proc, reader)
        self.runs.append(run)
        reader.start()
        if n:
            self.say(f"  {self._who(role)} process restarted (pid {proc.pid})")
        return run

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self._events.put((proc.pid, obj))

    def current(self, role: str) -> AgentProc | None:
        runs = [r for r in self.runs if r.role == role]
        return runs[-1] if runs else None

    def kill(self, role: str, sig: int = signal.SIGKILL, abandon: bool = False) -> None:
        """Kill the ``role`` agent. While it is down the clock never moves, unless ``abandon``:
        then it counts as an agent that stopped for good and its chess clock may run out."""
        run = self.current(role)
        if run is not None and run.proc.poll() is None:
            run.kill(sig)
            run.abandoned = abandon
            self.say(f"  {self._who(role)} process killed (pid {run.proc.pid})" + (", for good" if abandon else ""))

    def close(self) -> None:
        for r in self.runs:
            if r.proc.poll() is None:
                r.kill()

    def _who(self, role: str) -> str:
        return "false challenger" if role == "auditor" and self.false_challenge else role

    # -- the loop ---------------------------------------------------------------------------------
    def tick(self) -> bool:
        """One round: read events, check the processes, move the clock if stalled. True when both
        agents have exited cleanly."""
        self._drain()
        live = [self.current(r) for r in ("trainer", "auditor")]
        for r in live:
            if r is None:
                return False
            rc = r.proc.poll()
            if rc not in (None, 0) and not r.killed:
                r.reader.join(timeout=5)
                self._drain()
                raise AgentFailed(f"{self.name}: the {self._who(r.role)} process exited with status {rc}"
                                  f"{self._error_of(r)}; its log ({r.log_path}):\n{r.log_tail()}")
        if all(r.done for r in live):  # type: ignore[union-attr]
            for r in live:
                r.reader.join(timeout=5)  # type: ignore[union-attr]
            self._drain()
            return True
        if time.monotonic() - self._t0 > self.timeout:
            raise AgentFailed(f"{self.name}: not finished after {self.timeout:.0f} s; logs:\n" + "\n".join(
                f"--- {r.role} ({r.log_path}):\n{r.log_tail()}" for r in live if r is not None))
        block = int(self.chain.w3.eth.block_number)
        stalled = all(r.done or (r.proc.poll() is None and r.idle_block >= block) for r in live)  # type: ignore[union-attr]
        if not stalled:
            self._stall = None
        elif self._stall is None or self._stall[0] != block:
            self._stall = (block, time.monotonic())
        elif time.monotonic() - self._stall[1] >= self.grace:
            self._stall = None
            self._advance()
        return False

    def _error_of(self, r: AgentProc) -> str:
        if r.result and r.result.get("error"):
            return f" ({r.result['error']})"
        return ""

    def _drain(self) -> None:
        while True:
            try:
                pid, ev = self._events.get_nowait()
            except queue.Empty:
                return
            run = next((r for r in self.runs if r.proc.pid == pid), None)
            if run is None:
                continue
            kind = ev.get("event")
            if kind == "idle":
                run.idle_block = max(run.idle_block, int(ev.get("block", -1)))
            elif kind == "result":
                run.result = ev
            else:
                self._narrate(run, ev)

    def _narrate(self, run: AgentProc, ev: dict) -> None:
        kind = ev.get("event")
        who = self._who(run.role)
        if kind == "accepted":
            self.say(f"  trainer accepted job {self.job} (staked {ev['stake'] / 1e18:g} ETH)")
        elif kind == "posted":
            i = int(ev["interval"])
            first, n = self.ctx.interval_span(i)
            step = self.cheat_step or self.ctx.spec.interval + 2
            inside = self.cheat and first <= step < first + n
            self.say(f"  trainer posted interval {i}" + (" (with a cheat inside)" if inside else ""))
        elif kind == "challenged":
            self.say(f"  {who} challenged interval {ev['interval']}: game {ev['game']}")
        elif kind == "finalized":
            self.say(f"  challenge window passed: job {self.job} finalized")
        elif kind == "serving":
            pass

    def _advance(self) -> None:
        """Move the node's clock just past the next deadline that matters."""
        now = self.chain.now()
        views = [self.view(g) for g in self.games()]
        live = [v for v in views if v.status == STATUS_IN_PROGRESS]
        if live:
            v = min(live, key=lambda v: v.deadline)
            secs, why = max(1, v.deadline - now + 1), f"the {PARTIES.get(v.to_move, '?')}'s chess clock runs out"
        else:
            j = self.chain.call(self.proto.registry.functions.getJob(self.job))
            if JOB_STATUS[int(j[3])] != "active" or int(j[4]) < self.ctx.n_intervals:
                return
            end = last_window_end(self.proto, self.job, self.ctx.n_intervals)  # every window, extensions too
            if now > end:
                return
            secs, why = end - now + 1, "past the challenge window"
        self.chain.advance_time(secs)
        self.advances.append((why, secs))
        self.say(f"  both agents waiting: moved the node's clock {secs} s ({why})")

    def wait_until(self, pred: Callable[[], bool], timeout: float, poll: float = 0.25) -> None:
        """Tick until ``pred()``; AgentFailed after ``timeout`` s or if the agents finish first."""
        deadline = time.monotonic() + timeout
        while not pred():
            if self.tick():
                raise AgentFailed(f"{self.name}: the agents finished before the awaited condition")
            if time.monotonic() > deadline:
                raise AgentFailed(f"{self.name}: condition not reached within {timeout:.0f} s")
            time.sleep(poll)

    def finish(self, poll: float = 0.25) -> ScenarioResult:
        while not self.tick():
            time.sleep(poll)
        return self.result()

    def run(self) -> ScenarioResult:
        try:
            if not self.job:
                self.create_job()
            self.start("trainer")
            self.start("auditor")
            return self.finish()
        finally:
            self.close()

    # -- reading the outcome off the chain ----------------------------------------------------------
    def games(self) -> list[int]:
        logs = self.proto.game.events.GameCreated.get_logs(from_block=self._from_block,
                                                          argument_filters={"job": self.job})
        return sorted(int(e["args"]["game"]) for e in logs)

    def view(self, gid: int) -> GameView:
        return GameView.decode(self.chain.call(self.proto.game.functions.getGame(gid)))

    def game_cost(self, gid: int) -> tuple[int, int]:
        """(transactions, gas) of every move of game ``gid``, the challenge included."""
        w3 = self.chain.w3
        logs = w3.eth.get_logs({"address": self.proto.game.address, "fromBlock": self._from_block,
                                "toBlock": "latest", "topics": [None, "0x" + gid.to_bytes(32, "big").hex()]})
        txs = {HexBytes(e["transactionHash"]) for e in logs}
        gas = 0
        for t in txs:
            gas += int(w3.eth.get_transaction_receipt(t)["gasUsed"])
        return len(txs), gas

    def agent_cost(self, gid: int) -> tuple[int, int]:
        """(moves, gas) of game ``gid`` as the agents' final JSON lines report them (every run)."""
        moves = gas = 0
        for r in self.runs:
            g = (r.result or {}).get("games", {}).get(str(gid))
            if g:
                moves += int(g.get("moves", 0))
                gas += int(g.get("gas", 0))
        return moves, gas

    def result(self) -> ScenarioResult:
        chain, reg = self.chain, self.proto.registry
        accts = self.accounts
        owed = int(chain.call(reg.functions.owed(accts["client"])))
        if owed:  # the orchestrator is the client: collect a refund
            chain.send(reg.functions.withdraw(), accts["client"], what="client withdraw")
        games = self.games()
        verdict, ruling, moves, gas = "no dispute", "-", 0, 0
        if games:
            gid = games[0]
            resolved = self.proto.game.events.GameResolved.get_logs(from_block=self._from_block,
                                                                    argument_filters={"game": gid})
            if resolved:
                args = resolved[-1]["args"]
                verdict = f"{PARTIES.get(int(args['winner']), '?')} won"
                ruling = RULINGS[int(args["ruling"])]
            else:
                verdict = "closed" if self.view(gid).status != STATUS_IN_PROGRESS else "unresolved"
            moves, gas = self.game_cost(gid)
            self.say(f"  game {gid}: {verdict} by {ruling} after {moves} moves ({gas:,} gas); "
                     f"dispute narrowed to {self._where(gid)}")
        status = JOB_STATUS[int(chain.call(reg.functions.jobStatus(self.job)))]
        delta = {k: chain.w3.eth.get_balance(a) - self._balances0.get(k, 0) for k, a in accts.items()}
        moved = ", ".join(f"{k} {v / 1e18:+.2f}" for k, v in delta.items() if abs(v) > 10**16)
        self.say(f"  job {self.job} {status} ({time.monotonic() - self._t0:.0f} s)")
        return ScenarioResult(self.name, self.job, verdict, ruling, moves, gas, moved, status)

    def _where(self, gid: int) -> str:
        v = self.view(gid)
        opened = self.proto.game.events.OpOpened.get_logs(from_block=self._from_block, argument_filters={"game": gid})
        if opened:
            op = int(opened[-1]["args"]["op"])
            return f"step {v.step}, op {op} ({self.ctx.job.graph.ops[op].kind.name})"
        if v.step:
            return f"step {v.step}"
        return f"phase {PHASE_NAMES[v.phase]}"


@dataclass
class ProcessDemo:
    """A deployment on a node plus the files the agent processes read (deployment and spec)."""

    proto: Protocol
    rpc: str
    work: Path
    deployment_path: Path
    spec_path: Path
    ctx: JobContext

    @staticmethod
    def setup(rpc: str, work: Path, say: Narrate, model: str = "mlp") -> ProcessDemo:
        chain = Chain.connect(rpc)
        if chain.embedded:
            raise ChainError("agents as separate processes need a JSON-RPC node (--rpc URL)")
        accts = chain.accounts()
        if len(accts) < 5:
            raise ChainError(f"the demo needs 5 unlocked accounts, node {chain.name} has {len(accts)}")
        say(f"chain: {chain.name} (chain id {chain.w3.eth.chain_id})")
        proto = deploy(chain, accts[0])
        say(f"deployed JobRegistry {proto.registry.address}, DisputeGame {proto.game.address}, "
            f"Adjudicator {proto.adjudicator.address}")
        work.mkdir(parents=True, exist_ok=True)
        deployment_path = work / "deployment.json"
        save_deployment(proto, deployment_path)
        spec = default_spec(model)
        spec_path = work / "spec.json"
        atomic_write(spec_path, spec.to_json().encode())
        return ProcessDemo(proto, rpc, work, deployment_path, spec_path, JobContext.of(spec))

    def scenario(self, name: str, cheat: str | None, false_challenge: bool, say: Narrate,
                 terms: Terms = DEMO_TERMS, timeout: float = 300.0, **kw: Any) -> ProcessScenario:
        return ProcessScenario(self.proto, self.rpc, self.work, self.deployment_path, self.spec_path, self.ctx, terms,
                               name, cheat, false_challenge, say, timeout, **kw)


def run_demo_processes(rpc: str, say: Narrate, cheat: str | None = None, *, model: str = "mlp",
                       timeout: float = 300.0, work_dir: Path | None = None) -> list[ScenarioResult]:
    """The three demo scenarios (honest, cheating with ``cheat`` or the model's default, false
    challenger) on the ``model`` job ("mlp" or "gpt") on the node at ``rpc``, each with the trainer
    and the auditor as separate processes. Raises VtrainError (ChainError, AgentFailed) with the
    failing agent's log tail."""
    cheat = cheat or DEFAULT_CHEAT.get(model, "")
    check_cheat(model, cheat)
    tmp = tempfile.TemporaryDirectory(prefix="vtrain-demo-") if work_dir is None else None
    work = Path(work_dir or tmp.name)  # type: ignore[union-attr]
    try:
        demo = ProcessDemo.setup(rpc, work, say, model)
        return [demo.scenario(name, cheat if ch else None, false, say, timeout=timeout).run()
                for name, ch, false in SCENARIOS]
    finally:
        if tmp is not None:
            tmp.cleanup()
