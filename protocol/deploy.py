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
        """Raise ChainError unless these contracts are one deployment of the code this vtrain
        builds (see :func:`verify_deployment`)."""
        verify_deployment(self.chain, self.deployment)

    @staticmethod
    def attach(chain: Chain, d: Deployment) -> Protocol:
        """The deployment ``d`` (served data: e.g. a file from whoever deployed it), once
        :func:`verify_deployment` found it to be the contracts this vtrain builds, bound to each
        other; decoded with this build's ABIs."""
        if chain.w3.eth.chain_id != d.chain_id:
            from protocol.chain import ChainError

            raise ChainError(f"deployment is for chain id {d.chain_id}, node {chain.name} has {chain.w3.eth.chain_id}")
        return verify_deployment(chain, d)


def verify_deployment(chain: Chain, d: Deployment) -> Protocol:
    """The deployment ``d`` once checked, before anything is sent to it or read from it otherwise:
    the code at every address of the graph (the four in ``d``, the game's ChunkAdjudicator, the
    adjudicator's Transcendental) is the runtime code this checkout compiles (one eth_getCode
    each; ``protocol.codecheck``), and each is bound to the others: the registry (storage set
    once by its deployer) to this game and this availability contract, the game (immutables) to
    this registry and this adjudicator, the availability contract to this registry (a deployment
    that omits the availability contract gets the registry's, if it has one: served data cannot
    hide it from an agent, which would then neither demand nor answer). So neither
    addresses of another deployment nor a look-alike set bound to each other (an Adjudicator that
    always rules for the trainer, a registry that pays the trainer the bonds) pass. ChainError
    (``CodeMismatch`` for the code) names the contract, the address and the reason."""
    from web3 import Web3

    from protocol.chain import ChainError
    from protocol.codecheck import CodeMismatch

    def bound(holder: str, at: Contract, what: str, got: str, want: str) -> None:
        if Web3.to_checksum_address(got) != Web3.to_checksum_address(want):
            raise ChainError(f"the {holder} at {at.address} is bound to the {what} {got}, not {want} "
                             "(addresses from another deployment?)")

    def reached(name: str, address: str, via: str, at: Contract) -> None:
        try:
            chain.verified(name, address)
        except CodeMismatch as e:
            raise CodeMismatch(f"{e} (the {name} of the {via} at {at.address})") from None

    registry, _ = chain.verified("JobRegistry", d.registry)
    game, game_bindings = chain.verified("DisputeGame", d.game)
    adjudicator, adjudicator_bindings = chain.verified("Adjudicator", d.adjudicator)
    # the registry's code is this build's, so its getters can be read now
    bound("JobRegistry", registry, "game", chain.call(registry.functions.disputeGame()), game.address)
    bound_availability = chain.call(registry.functions.availability())
    if d.availability is None and int(bound_availability, 16) != 0:  # a file without it: the registry's
        log.info("deployment: the registry's availability contract %s (not in the deployment)", bound_availability)
        availability, availability_bindings = chain.verified("DataAvailability", bound_availability)
    elif d.availability is not None:
        availability, availability_bindings = chain.verified("DataAvailability", d.availability)
        bound("JobRegistry", registry, "availability contract", bound_availability, availability.address)
    else:
        availability, availability_bindings = None, {}
    bound("DisputeGame", game, "registry", str(game_bindings["registry"]), registry.address)
    bound("DisputeGame", game, "adjudicator", str(game_bindings["adjudicator"]), adjudicator.address)
    reached("ChunkAdjudicator", str(game_bindings["chunkAdjudicator"]), "DisputeGame", game)
    reached("Transcendental", str(adjudicator_bindings["transcendental"]), "Adjudicator", adjudicator)
    if availability is not None:
        bound("DataAvailability", availability, "registry", str(availability_bindings["registry"]), registry.address)
    return Protocol(chain, registry, game, adjudicator, availability=availability)


#: Wei per gas of a demand's answer fee on a public chain (DataAvailability constructor): 4 gwei,
#: the price the challenger-bond floor is sized at; the dev price is protocol.availability's.
PRODUCTION_FEE_GAS_PRICE = 4 * 10**9


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
