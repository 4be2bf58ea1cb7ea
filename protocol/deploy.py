"""Deploying the protocol: registry (escrow), adjudicator, dispute game, data availability, and
binding them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from web3.contract import Contract

from protocol.chain import Chain, Deployment

log = logging.getLogger(__name__)


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

    @staticmethod
    def attach(chain: Chain, d: Deployment) -> Protocol:
        if chain.w3.eth.chain_id != d.chain_id:
            from protocol.chain import ChainError

            raise ChainError(f"deployment is for chain id {d.chain_id}, node {chain.name} has {chain.w3.eth.chain_id}")
        return Protocol(
            chain,
            chain.at("JobRegistry", d.registry),
            chain.at("DisputeGame", d.game),
            chain.at("Adjudicator", d.adjudicator),
            availability=chain.at("DataAvailability", d.availability) if d.availability else None,
        )


def deploy(chain: Chain, deployer: str) -> Protocol:
    """Deploy and bind the four contracts; returns them."""
    registry = chain.deploy("JobRegistry", sender=deployer)
    adjudicator = chain.deploy("Adjudicator", sender=deployer)
    game = chain.deploy("DisputeGame", registry.address, adjudicator.address, sender=deployer)
    chain.send(registry.functions.setDisputeGame(game.address), deployer, what="setDisputeGame")
    availability = deploy_availability(chain, registry, deployer)
    log.info(
        "protocol deployed: registry %s game %s adjudicator %s availability %s",
        registry.address,
        game.address,
        adjudicator.address,
        availability.address,
    )
    return Protocol(chain, registry, game, adjudicator, availability=availability)


def deploy_availability(chain: Chain, registry: Contract, deployer: str) -> Contract:
    """Deploy the DataAvailability contract for ``registry`` and bind it (once, by the registry's deployer)."""
    availability = chain.deploy("DataAvailability", registry.address, sender=deployer)
    chain.send(registry.functions.setAvailability(availability.address), deployer, what="setAvailability")
    return availability
