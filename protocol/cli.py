"""The `vtrain` command line (console script `vtrain = protocol.cli:main`).

Every subcommand is registered in one place, `main.add_command(...)` at the bottom of this file.
Heavy imports (web3, the compiler driver) happen inside the commands so `vtrain --help` is quick.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click
from rich.console import Console
from rich.logging import RichHandler

from protocol.agents_cli import AGENT_COMMANDS, client
from protocol.client_cli import CLIENT_COMMANDS, report_cmd
from vtrain.cli import COMMANDS as VTRAIN_COMMANDS

CHEAT_NAMES = (
    "tamper-weight",
    "poison-sample",
    "skip-step",
    "wrong-lr",
    "abuse-log",
    "forge-explicit",
    "tamper-attention",
    "tamper-softmax",
    "wrong-side",
    "shift-explicit",
)

log = logging.getLogger("vtrain")
console = Console(width=None if Console().is_terminal else 120)


@click.group(epilog="Exit status (train, replay, sample, export, inspect): 0 done, 1 bad input, 2 usage error, "
             "3 replay diverged, 4 unavailable (a needed file is missing), 130 interrupted; agents: see their --help.")
@click.version_option(package_name="vtrain", prog_name="vtrain")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Verifiable training with an on-chain dispute game."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(name)s: %(message)s", handlers=[log_handler()])


def log_handler() -> logging.Handler:
    """Rich on a terminal; elsewhere (a CI log, a pipe) one plain line per record (rich wrapped each at 80
    columns under a timestamp)."""
    import sys

    if sys.stderr.isatty():
        return RichHandler(console=Console(stderr=True), show_path=False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    return handler


@click.command()
@click.option("--rpc", metavar="URL", default=None, help="JSON-RPC node (default: the embedded eth-tester chain).")
@click.option(
    "--model",
    type=click.Choice(["mlp", "gpt", "resnet", "gpt2"]),
    default="mlp",
    show_default=True,
    help="Model of the demo jobs: the MLP, the character-level GPT (1 layer, 2 heads), or through the torch "
    "front end our ResNet on digits (examples/resnet_digits.py) or HF GPT-2 (examples/hf_gpt2.py, small config).",
)
@click.option(
    "--cheat",
    type=click.Choice(sorted(CHEAT_NAMES)),
    default=None,
    help="How the cheating trainer cheats. [default: abuse-log for mlp, tamper-attention for gpt]",
)
def demo(rpc: str | None, model: str, cheat: str | None) -> None:
    """Deploy the contracts, then run three jobs: honest (finalizes), cheating (auditor wins),
    and a false challenge (trainer wins). With --rpc the agents run as separate processes."""
    import torch
    from rich.table import Table

    from protocol.demo import DEFAULT_CHEAT, run_demo
    from vtrain.errors import VtrainError

    # The demo's tensors are tiny: torch's intra-op threads only contend with each other (and with
    # the chain), making a small FP64 matmul up to 100x slower on a busy machine.
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    cheat = cheat or DEFAULT_CHEAT[model]
    try:  # both paths check the cheat against the model before deploying anything
        if rpc is None:
            results = run_demo(rpc, console.print, model=model, cheat=cheat)
        else:  # a real node: trainer and auditor run as separate OS processes
            from protocol.multiproc import run_demo_processes

            results = run_demo_processes(rpc, console.print, cheat, model=model)
    except VtrainError as e:
        raise click.ClickException(str(e)) from None
    table = Table(title=f"vtrain demo on {rpc or 'the embedded eth-tester chain'} ({time.perf_counter() - t0:.0f} s)")
    for col in ("job", "scenario", "verdict", "ruling", "game moves", "game gas", "ETH moved", "job status"):
        table.add_column(col)
    for r in results:
        table.add_row(str(r.job), r.name, r.verdict, r.ruling, str(r.moves), f"{r.gas:,}", r.bonds, r.final_status)
    console.print(table)


@click.command()
@click.option("--rpc", metavar="URL", default=None, help="JSON-RPC node (default: the embedded eth-tester chain).")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("deployment.json"), show_default=True
)
@click.option(
    "--dev-floors",
    is_flag=True,
    help="Deploy the registry with the short floors of a development chain (60 s window, clock and posting "
    "period) instead of the production ones (1 day window, 1 h clock, 1 h posting period, 0.01 ETH bond).",
)
def deploy(rpc: str | None, out: Path, dev_floors: bool) -> None:
    """Deploy JobRegistry, Adjudicator, DisputeGame and DataAvailability and write their addresses to OUT."""
    from protocol.agents_cli import save_deployment
    from protocol.chain import Chain
    from protocol.deploy import DEV_FLOORS, PRODUCTION_FEE_GAS_PRICE, PRODUCTION_FLOORS
    from protocol.deploy import deploy as deploy_all
    from vtrain.errors import VtrainError

    try:
        chain = Chain.connect(rpc)
        proto = deploy_all(chain, chain.accounts()[0], DEV_FLOORS if dev_floors else PRODUCTION_FLOORS,
                           None if dev_floors else PRODUCTION_FEE_GAS_PRICE)
        save_deployment(proto, out)
    except VtrainError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # --out unwritable (a folder, no permission): nothing half-written
        raise click.ClickException(f"--out {out}: {e.strerror or e}") from None
    console.print(
        f"deployed on {chain.name}: registry {proto.registry.address}, game {proto.game.address}, "
        f"adjudicator {proto.adjudicator.address}, availability {proto.availability.address} -> {out}"
    )


main.add_command(demo)
main.add_command(deploy)
main.add_command(report_cmd)
for _cmd in CLIENT_COMMANDS:
    client.add_command(_cmd)
for _cmd in AGENT_COMMANDS:
    main.add_command(_cmd)
for _cmd in VTRAIN_COMMANDS:
    main.add_command(_cmd)


if __name__ == "__main__":
    main()
