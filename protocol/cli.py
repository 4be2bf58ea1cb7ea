"""The `vtrain` command line (console script `vtrain = protocol.cli:main`).

Every subcommand is registered in one place, `main.add_command(...)` at the bottom of this file.
Heavy imports (web3, the compiler driver) happen inside the commands so `vtrain --help` is quick.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.logging import RichHandler

if TYPE_CHECKING:
    from web3 import Web3

log = logging.getLogger("vtrain")
console = Console()

#: Explicit gas for the demo deployment (py-evm estimation is ~11x slower; cap is 2**24).
DEPLOY_GAS = 1_000_000


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """Verifiable training with an on-chain dispute game."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(
        level=level,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False)],
    )


def connect(rpc: str | None) -> Web3:
    """Web3 on `rpc`, or on a fresh in-process eth-tester chain; default account = first account."""
    from web3 import EthereumTesterProvider, Web3

    w3 = Web3(Web3.HTTPProvider(rpc)) if rpc else Web3(EthereumTesterProvider())
    try:
        accounts = w3.eth.accounts
    except Exception as e:  # connection refused, bad URL, not JSON-RPC
        raise click.ClickException(f"cannot reach JSON-RPC node at {rpc}: {e}") from e
    if not accounts:
        raise click.ClickException(f"node at {rpc} has no unlocked accounts to deploy from")
    w3.eth.default_account = accounts[0]
    return w3


@click.command()
@click.option(
    "--rpc", metavar="URL", default=None, help="JSON-RPC node (default: in-process eth-tester)."
)
def demo(rpc: str | None) -> None:
    """Placeholder demo: compile the contracts and deploy SmokeCounter."""
    from protocol.build import BuildError, load_artifact

    try:
        with console.status("compiling contracts"):
            art = load_artifact("SmokeCounter")
    except BuildError as e:
        raise click.ClickException(str(e)) from e
    w3 = connect(rpc)
    factory = w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
    tx = factory.constructor().transact({"gas": DEPLOY_GAS})
    receipt = w3.eth.wait_for_transaction_receipt(tx)
    if receipt["status"] != 1:
        raise click.ClickException(f"deployment reverted (tx {tx.hex()})")
    chain = rpc or "embedded eth-tester"
    log.info("deployed with %d gas", receipt["gasUsed"])
    console.print(f"SmokeCounter deployed on {chain} (chain id {w3.eth.chain_id}) at")
    console.print(receipt["contractAddress"], style="bold green", highlight=False)


main.add_command(demo)


if __name__ == "__main__":
    main()
