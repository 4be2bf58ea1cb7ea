"""Deploying the protocol: registry (escrow), adjudicator, dispute game, and binding them."""

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

    @property
    def deployment(self) -> Deployment:
        return Deployment(
            self.registry.address, self.game.address, self.adjudicator.address, self.chain.w3.eth.chain_id
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
        )


def deploy(chain: Chain, deployer: str) -> Protocol:
    """Deploy and bind the three contracts; returns them."""
    registry = chain.deploy("JobRegistry", sender=deployer)
    adjudicator = chain.deploy("Adjudicator", sender=deployer)
    game = chain.deploy("DisputeGame", registry.address, adjudicator.address, sender=deployer)
    chain.send(registry.functions.setDisputeGame(game.address), deployer, what="setDisputeGame")
    log.info(
        "protocol deployed: registry %s game %s adjudicator %s", registry.address, game.address, adjudicator.address
    )
    return Protocol(chain, registry, game, adjudicator)
