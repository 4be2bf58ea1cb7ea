"""Deploying the protocol: registry (escrow), adjudicator, dispute game, data availability, and
binding them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from web3.contract import Contract

from protocol.chain import Chain, Deployment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Floors:
    """The registry's deployment parameters (immutable once deployed; docs/security.md, "Terms and
    economics"): the least challenge window, chess clock and posting period (seconds) and
    challenger bond (wei) a job may have, and the bounty paid to whoever proves a fault, in basis
    points of the convicted stake (the rest is burned)."""

    min_challenge_window: int
    min_clock: int
    min_posting_period: int
    min_challenger_bond: int
    bounty_bps: int = 5_000

    def args(self) -> tuple[int, int, int, int, int]:
        """The JobRegistry constructor's arguments, in order."""
        return (self.min_challenge_window, self.min_clock, self.min_posting_period, self.min_challenger_bond,
                self.bounty_bps)

    @staticmethod
    def of(registry: Contract, call=None) -> Floors:
        """The floors a deployed registry enforces (read from its getters)."""
        f = registry.functions
        get = call or (lambda fn: fn.call())
        return Floors(int(get(f.minChallengeWindow())), int(get(f.minClock())), int(get(f.minPostingPeriod())),
                      int(get(f.minChallengerBond())), int(get(f.bountyBps())))


#: For a public chain: a day to replay and challenge an interval, an hour on each chess clock, an
#: hour per interval, a bond of 0.01 ETH, half the convicted stake to whoever proves the fault.
PRODUCTION_FLOORS = Floors(86_400, 3_600, 3_600, 10**16, 5_000)
#: For a local development chain whose clock the demo and the tests move: short floors, the
#: production bounty.
DEV_FLOORS = Floors(60, 60, 60, 10**9, 5_000)


@dataclass
class Protocol:
    """The deployed contracts on one chain."""

    chain: Chain
    registry: Contract
    game: Contract
    adjudicator: Contract
    job_blocks: dict[int, int] = field(default_factory=dict, repr=False, compare=False)
    """Block of each job's JobCreated event, once looked up (see ``protocol.agent.job_first_block``)."""
    availability: Contract | None = None
    """The DataAvailability contract (None when attached to a deployment without one)."""

    @property
    def deployment(self) -> Deployment:
        return Deployment(
            self.registry.address,
            self.game.address,
            self.adjudicator.address,
            self.chain.w3.eth.chain_id,
            self.availability.address if self.availability is not None else None,
        )

    def check_bindings(self) -> None:
        """Raise ChainError unless these addresses are one deployment: the registry is a JobRegistry
        bound to this game and this availability contract, the game is bound to this registry and
        this adjudicator, the availability contract to this registry (each read from the contracts
        themselves, where it is immutable or set once). A deployment file is served data: an address
        from another deployment, or a look-alike contract (e.g. a DataAvailability that keeps demand
        bonds and emits made-up events) is refused before anything is sent to it or read from it."""
        from web3 import Web3

        from protocol.chain import ChainError

        def bound(what: str, contract: Contract, fn: str, want: str, holder: str) -> None:
            try:
                got = self.chain.call(getattr(contract.functions, fn)())
            except Exception as e:  # another contract: a revert, or output that does not decode
                raise ChainError(f"{contract.address} on {self.chain.name} is not a {holder} ({_short(e)})") from None
            if Web3.to_checksum_address(got) != Web3.to_checksum_address(want):
                raise ChainError(f"the {holder} at {contract.address} is bound to the {what} {got}, not {want} "
                                 "(addresses from another deployment?)")

        bound("game", self.registry, "disputeGame", self.game.address, "JobRegistry")
        bound("registry", self.game, "registry", self.registry.address, "DisputeGame")
        bound("adjudicator", self.game, "adjudicator", self.adjudicator.address, "DisputeGame")
        if self.availability is not None:
            bound("availability contract", self.registry, "availability", self.availability.address, "JobRegistry")
            bound("registry", self.availability, "registry", self.registry.address, "DataAvailability")

    @staticmethod
    def attach(chain: Chain, d: Deployment) -> Protocol:
        if chain.w3.eth.chain_id != d.chain_id:
            from protocol.chain import ChainError

            raise ChainError(f"deployment is for chain id {d.chain_id}, node {chain.name} has {chain.w3.eth.chain_id}")
        proto = Protocol(
            chain,
            chain.at("JobRegistry", d.registry),
            chain.at("DisputeGame", d.game),
            chain.at("Adjudicator", d.adjudicator),
            availability=chain.at("DataAvailability", d.availability) if d.availability else None,
        )
        proto.check_bindings()  # a deployment file is served data: its addresses must be one deployment
        return proto


#: Wei per gas of a demand's answer fee on a public chain (DataAvailability constructor): 4 gwei,
#: the price the challenger-bond floor is sized at; the dev price is protocol.availability's.
PRODUCTION_FEE_GAS_PRICE = 4 * 10**9


def _short(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def deploy(chain: Chain, deployer: str, floors: Floors = DEV_FLOORS, fee_gas_price: int | None = None) -> Protocol:
    """Deploy and bind the four contracts; returns them. ``floors``: the registry's deployment
    parameters (the development ones by default; ``vtrain deploy`` uses PRODUCTION_FLOORS);
    ``fee_gas_price``: the availability demands' answer-fee price (default: the dev price)."""
    registry = chain.deploy("JobRegistry", *floors.args(), sender=deployer)
    adjudicator = chain.deploy("Adjudicator", sender=deployer)
    game = chain.deploy("DisputeGame", registry.address, adjudicator.address, sender=deployer)
    chain.send(registry.functions.setDisputeGame(game.address), deployer, what="setDisputeGame")
    availability = deploy_availability(chain, registry, deployer, fee_gas_price)
    log.info(
        "protocol deployed: registry %s game %s adjudicator %s availability %s (%s)", registry.address,
        game.address, adjudicator.address, availability.address, floors,
    )
    return Protocol(chain, registry, game, adjudicator, availability=availability)


def deploy_availability(chain: Chain, registry: Contract, deployer: str, fee_gas_price: int | None = None) -> Contract:
    """Deploy the DataAvailability contract for ``registry`` and bind it (once, by the registry's
    deployer). ``fee_gas_price``: wei per gas of a demand's answer fee (default: the dev price)."""
    from protocol.availability import DEV_FEE_GAS_PRICE

    price = DEV_FEE_GAS_PRICE if fee_gas_price is None else fee_gas_price
    availability = chain.deploy("DataAvailability", registry.address, price, sender=deployer)
    chain.send(registry.functions.setAvailability(availability.address), deployer, what="setAvailability")
    return availability
