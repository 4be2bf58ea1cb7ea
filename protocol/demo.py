"""The end-to-end demo: an honest job that finalizes, a cheating trainer the auditor beats, and a
false challenger the trainer beats, each a real game on a real EVM with real Merkle proofs."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from web3.logs import DISCARD

from protocol.auditor import AuditorAgent
from protocol.chain import Chain
from protocol.cheats import CHEATS
from protocol.deploy import Protocol, deploy
from protocol.game import (
    PHASE_ELEMENT,
    PHASE_NAMES,
    PHASE_ONE_STEP,
    PHASE_TRACE,
    STATUS_CHALLENGER_WON,
    STATUS_IN_PROGRESS,
    STATUS_TRAINER_WON,
)
from protocol.jobs import JobContext, Terms
from protocol.store import ArtifactStore
from protocol.trainer import TrainerAgent
from vtrain.errors import VtrainError
from vtrain.training.spec import TrainSpec

log = logging.getLogger(__name__)

MAX_ROUNDS = 400
RULINGS = ["none", "timeout", "bind", "adjudicated", "job fraudulent"]


@dataclass
class ScenarioResult:
    """One row of the demo's final table."""

    name: str
    job: int
    verdict: str
    ruling: str
    moves: int
    gas: int
    bonds: str
    final_status: str
    max_tx_gas: int = 0


Narrate = Callable[[str], None]


def create_job(proto: Protocol, client: str, trainer: str, ctx: JobContext, terms: Terms) -> int:
    r = proto.chain.send(
        proto.registry.functions.createJob(ctx.params(trainer, terms)), client, value=terms.payment, what="createJob"
    )
    ev = proto.registry.events.JobCreated().process_receipt(r, errors=DISCARD)
    return int(ev[0]["args"]["job"])


def run_scenario(
    proto: Protocol,
    spec: TrainSpec,
    terms: Terms,
    store: ArtifactStore,
    accounts: dict[str, str],
    name: str,
    cheat: str | None,
    false_challenge: bool,
    say: Narrate,
) -> ScenarioResult:
    chain = proto.chain
    ctx = JobContext.of(spec)
    balances0 = {k: chain.w3.eth.get_balance(a) for k, a in accounts.items()}
    first_block = int(chain.w3.eth.block_number)
    job = create_job(proto, accounts["client"], accounts["trainer"], ctx, terms)
    say(
        f"[bold]{name}[/]: job {job} ({Path(spec.model).name}, {spec.steps} steps, K={spec.interval}, "
        f"{ctx.job.graph.n_ops} ops/step)"
    )
    cheat_obj = CHEATS[cheat](spec, spec.interval + 2) if cheat else None
    trainer = TrainerAgent(proto, accounts["trainer"], ctx, store, job, cheat=cheat_obj)
    trainer.accept(terms)
    challenger_acct = accounts["false_challenger" if false_challenge else "auditor"]
    auditor = AuditorAgent(proto, challenger_acct, ctx, store, job, honest=not false_challenge)
    gid = None
    while (i := trainer.run_interval()) is not None:
        say(f"  trainer posted interval {i}" + (" (with a cheat inside)" if cheat and i == 1 else ""))
        bad = auditor.audit()
        if false_challenge and gid is None:
            bad = i  # a false challenger disputes an interval that replays fine
        if bad is not None and gid is None:
            gid = auditor.challenge(bad, terms)
            say(f"  {'false challenger' if false_challenge else 'auditor'} challenged interval {bad}: game {gid}")
            break
    moves = gas = 0
    if gid is not None:
        last = auditor.player.view(gid)
        for _ in range(MAX_ROUNDS):
            sent = trainer.play() + auditor.play()
            v = auditor.player.view(gid)
            if v.status != STATUS_IN_PROGRESS:
                break
            last = v
            if not sent:  # nobody could move: let the clock run so the timeout can be claimed
                chain.advance_time(terms.clock + 1)
        v = auditor.player.view(gid)
        winner = {STATUS_TRAINER_WON: "trainer", STATUS_CHALLENGER_WON: "challenger"}.get(v.status, "unresolved")
        resolved = proto.game.events.GameResolved.get_logs(
            from_block=first_block, argument_filters={"game": gid}
        )
        ruling = RULINGS[int(resolved[-1]["args"]["ruling"])] if resolved else "-"
        moves = trainer.player.stats.moves.get(gid, 0) + auditor.player.stats.moves.get(gid, 0)
        gas = trainer.player.stats.gas.get(gid, 0) + auditor.player.stats.gas.get(gid, 0)
        max_tx = max(trainer.player.stats.max_gas.get(gid, 0), auditor.player.stats.max_gas.get(gid, 0))
        op = last.op if last.phase >= PHASE_ELEMENT else last.lo
        where = (
            f"step {last.step}, op {op} ({ctx.job.graph.ops[op].kind.name})"
            + (f", element {last.index}" if last.phase == PHASE_ONE_STEP else "")
            if last.phase >= PHASE_TRACE
            else f"phase {PHASE_NAMES[last.phase]}"
        )
        say(f"  game {gid}: {winner} won by {ruling} after {moves} moves ({gas:,} gas); dispute narrowed to {where}")
        verdict = f"{winner} won"
        # the honest trainer goes on with the remaining intervals
        if winner == "trainer":
            while (i := trainer.run_interval()) is not None:
                say(f"  trainer posted interval {i}")
    else:
        verdict, ruling, max_tx = "no dispute", "-", 0
    if trainer.status() == "active":
        # past every interval's window: they follow the chained schedule (each starts at least one
        # posting period after the previous one), however early they were posted; extensions included
        reg = proto.registry.functions
        end = max(int(chain.call(reg.windowEnd(job, i))) for i in range(ctx.n_intervals))
        chain.advance_time(max(1, end - chain.now() + 1))
        trainer.finalize()
        say(f"  challenge window passed: job {job} finalized")
    for role in ("trainer", "auditor", "false_challenger", "client"):
        acct = accounts[role]
        owed = int(chain.call(proto.registry.functions.owed(acct)))
        if owed:
            chain.send(proto.registry.functions.withdraw(), acct, what=f"{role} withdraw")
    # what each party gained or lost through the job (transaction fees are zero on the embedded chain)
    delta = {k: chain.w3.eth.get_balance(a) - balances0[k] for k, a in accounts.items()}
    moved = ", ".join(f"{k} {v / 1e18:+.2f}" for k, v in delta.items() if abs(v) > 10**16)
    return ScenarioResult(name, job, verdict, ruling, moves, gas, moved, trainer.status(), max_tx)


SCENARIOS = [
    ("honest trainer", None, False),
    ("cheating trainer", "tamper-weight", False),  # run_demo puts its ``cheat`` here
    ("false challenger", None, True),
]

MODELS = ("mlp", "gpt", "resnet", "gpt2")
DEFAULT_CHEAT = {"mlp": "abuse-log", "gpt": "tamper-softmax", "resnet": "abuse-log", "gpt2": "abuse-log"}
"""The demo's cheat per model when none is given: one whose dispute the auditor wins today (the
GPT's lands on an attention MATMUL, op and element named by :class:`protocol.cheats.TamperAttention`)."""


def check_cheat(model: str, cheat: str) -> None:
    """Raise a VtrainError naming the problem if ``cheat`` cannot be played on the demo's ``model``
    (e.g. ``tamper-attention`` on the MLP), before anything is deployed or trained."""
    if model not in MODELS:
        raise VtrainError(f"demo: model {model!r} is not one of {MODELS}")
    if cheat not in CHEATS:
        raise VtrainError(f"demo: cheat {cheat!r} is not one of {sorted(CHEATS)}")
    spec = default_spec(model)
    CHEATS[cheat](spec, spec.interval + 2)


#: The torch front end's examples (``examples/``, beside ``protocol/``): ``--model resnet`` and ``gpt2``.
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def default_spec(model: str = "mlp") -> TrainSpec:
    """The demo's spec of ``model``; a file model's source is pinned by its sha256 (a job commits to it)."""
    from vtrain.frontend.job import pin_files

    if model == "resnet":  # our ResNet on digits 1x8x8: conv patch gathers, batch norm, max pool, clipping
        return pin_files(TrainSpec.from_dict({
            "model": f"{EXAMPLES}/resnet_digits.py:task", "steps": 8, "interval": 4, "batch_size": 4,
            "model_args": {"width": 4, "clip": 1.0, "warmup": 1, "total_steps": 8},
        }))
    if model == "gpt2":  # HF GPT2LMHeadModel (a small config, random init): embedding gather, dropout, tied weights
        return pin_files(TrainSpec.from_dict({
            "model": f"{EXAMPLES}/hf_gpt2.py:small", "steps": 8, "interval": 4, "batch_size": 2,
            "model_args": {"context": 8, "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 260,
                           "dropout": 0.1, "clip": 1.0, "warmup": 1, "total_steps": 8},
        }))
    if model == "gpt":
        from vtrain.models.nn import GPTConfig

        return TrainSpec(
            model="gpt",
            batch_size=4,
            steps=8,
            interval=4,
            gpt=GPTConfig(vocab=32, context=8, n_layer=1, n_head=2, d_model=16),
        )
    return TrainSpec(model="mlp", batch_size=16, steps=8, interval=4)


def run_demo(
    rpc: str | None, say: Narrate, model: str = "mlp", cheat: str | None = None, store_dir: Path | None = None
) -> list[ScenarioResult]:
    """The three scenarios (honest, cheating with ``cheat`` or the model's :data:`DEFAULT_CHEAT`,
    false challenger) on the demo job of ``model`` ("mlp" or "gpt"), agents in this process."""
    cheat = cheat or DEFAULT_CHEAT.get(model, "")
    check_cheat(model, cheat)
    chain = Chain.connect(rpc)
    accts = chain.accounts()
    if len(accts) < 5:
        from protocol.chain import ChainError

        raise ChainError(f"the demo needs 5 unlocked accounts, node {chain.name} has {len(accts)}")
    accounts = {"client": accts[1], "trainer": accts[2], "auditor": accts[3], "false_challenger": accts[4]}
    say(f"chain: {chain.name} (chain id {chain.w3.eth.chain_id})")
    proto = deploy(chain, accts[0])
    say(
        f"deployed JobRegistry {proto.registry.address}, DisputeGame {proto.game.address}, "
        f"Adjudicator {proto.adjudicator.address}"
    )
    tmp = tempfile.TemporaryDirectory() if store_dir is None else None
    store = ArtifactStore(store_dir or tmp.name)  # type: ignore[union-attr]
    terms = Terms()
    results = []
    try:
        for name, ch, false in SCENARIOS:
            results.append(
                run_scenario(
                    proto, default_spec(model), terms, store, accounts, name, cheat if ch else None, false, say
                )
            )
    finally:
        if tmp is not None:
            tmp.cleanup()
    return results
