"""A deployment is served data: before anything is sent to it or read from it, the code at every
address of its graph (registry, game, adjudicator, availability contract, and the game's
ChunkAdjudicator and the adjudicator's Transcendental reached through them) must be the runtime
code this checkout compiles, and the contracts bound to each other (protocol/codecheck.py,
protocol.deploy.verify_deployment). The attacks: a look-alike set bound to each other (one
contract changed: another build, a changed constant compiled from a source variant), immutables
edited after construction, proxies, accounts without code, and served ABIs."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from web3 import Web3

import nodes
from protocol.availability import DEV_FEE_GAS_PRICE
from protocol.build import load_artifact
from protocol.chain import Chain, ChainError, Deployment
from protocol.codecheck import CodeMismatch, check_code, expected_code
from protocol.deploy import DEV_FLOORS, Protocol, deploy

REPO = Path(__file__).resolve().parent.parent
NAMES = ("JobRegistry", "DisputeGame", "Adjudicator", "DataAvailability", "ChunkAdjudicator", "Transcendental")
Tamper = dict[str, Callable[[bytes], bytes]]


def runtime_with(name: str, values: dict[str, Any]) -> bytes:
    """The build's runtime code of ``name`` with its immutables set to ``values`` (what its
    constructor would have written)."""
    art = load_artifact(name)
    code = bytearray(bytes.fromhex(art.deployed_bytecode[2:]))
    for imm in art.immutables:
        v = values[imm.name]
        word = (int(v, 16) if isinstance(v, str) else int(v)).to_bytes(32, "big")
        for start, length in imm.ranges:
            code[start:start + length] = word
    return bytes(code)


def deploy_runtime(chain: Chain, runtime: bytes, sender: str) -> str:
    """Deploy ``runtime`` as is: creation code that copies it out and returns it (no constructor)."""
    init = b"\x61" + len(runtime).to_bytes(2, "big") + bytes.fromhex("80600c6000396000f3")
    tx = chain.w3.eth.send_transaction({"from": sender, "data": init + runtime, "gas": 12_000_000})
    receipt = chain.w3.eth.wait_for_transaction_receipt(tx)
    assert receipt["status"] == 1
    return receipt["contractAddress"]


def lookalike_set(chain: Chain, sender: str, tamper: Tamper | None = None) -> tuple[Deployment, dict[str, str]]:
    """The six contracts deployed from their runtime codes with the immutables filled in, bound to
    each other like ``deploy`` binds them; ``tamper`` changes the code of the ones it names. With
    no tampering it is the code this vtrain builds: it must attach."""
    tamper = tamper or {}

    def put(name: str, values: dict[str, Any]) -> str:
        return deploy_runtime(chain, tamper.get(name, lambda c: c)(runtime_with(name, values)), sender)

    f = DEV_FLOORS
    at = {"JobRegistry": put("JobRegistry", {
        "deployer": sender, "minChallengeWindow": f.min_challenge_window, "minClock": f.min_clock,
        "minPostingPeriod": f.min_posting_period, "minChallengerBond": f.min_challenger_bond,
        "bountyBps": f.bounty_bps})}
    at["Transcendental"] = put("Transcendental", {})
    at["Adjudicator"] = put("Adjudicator", {"transcendental": at["Transcendental"]})
    at["ChunkAdjudicator"] = put("ChunkAdjudicator", {})
    at["DisputeGame"] = put("DisputeGame", {"registry": at["JobRegistry"], "adjudicator": at["Adjudicator"],
                                            "chunkAdjudicator": at["ChunkAdjudicator"]})
    at["DataAvailability"] = put("DataAvailability", {"registry": at["JobRegistry"],
                                                      "feeGasPrice": DEV_FEE_GAS_PRICE})
    registry = chain.w3.eth.contract(address=at["JobRegistry"], abi=load_artifact("JobRegistry").abi)
    chain.send(registry.functions.setDisputeGame(at["DisputeGame"]), sender, what="setDisputeGame")
    chain.send(registry.functions.setAvailability(at["DataAvailability"]), sender, what="setAvailability")
    d = Deployment(at["JobRegistry"], at["DisputeGame"], at["Adjudicator"], chain.w3.eth.chain_id,
                   at["DataAvailability"])
    return d, at


def another_build(code: bytes) -> bytes:
    """The same code with one byte of the metadata trailer's IPFS hash changed (the CBOR trailer's
    last 2 bytes are its length; the hash ends 11 bytes before the end)."""
    out = bytearray(code)
    out[-20] ^= 0xFF
    return bytes(out)


def refusal(name: str, address: str) -> str:
    return (rf"code at {address} is not the {name} this vtrain builds: codehash 0x[0-9a-f]{{64}}, "
            rf"expected {expected_code(name).codehash}.*\(another build or a look-alike contract\)")


@pytest.fixture(scope="module")
def world() -> tuple[Chain, list[str], Protocol]:
    chain = Chain.connect(None)
    accts = chain.accounts()
    return chain, accts, deploy(chain, accts[0])


def test_an_honest_deployment_attaches_also_one_deployed_from_its_runtime_codes(world) -> None:
    """Both a deployment by ``deploy`` and one written from the build's runtime codes with the
    immutables filled in attach: the masked slots are exactly where the constructor writes."""
    chain, accts, honest = world
    attached = Protocol.attach(chain, honest.deployment)
    assert attached.deployment == honest.deployment
    assert attached.registry.abi == load_artifact("JobRegistry").abi
    d, _ = lookalike_set(chain, accts[0])
    assert Protocol.attach(chain, d).deployment == d


@pytest.mark.parametrize("name", NAMES)
def test_a_lookalike_set_bound_to_each_other_is_refused_naming_the_contract(world, name: str) -> None:
    """Every contract of the set bound to the others, every binding check passes, but one
    contract's code is another build's: refused by the library's attach and by check_bindings,
    before anything is sent, naming the contract, its address and both codehashes (and, for the
    two reached through others, which contract reached it)."""
    chain, accts, _ = world
    d, at = lookalike_set(chain, accts[0], {name: another_build})
    msg = refusal(name, at[name])
    if name == "ChunkAdjudicator":
        msg += rf" \(the ChunkAdjudicator of the DisputeGame at {at['DisputeGame']}\)"
    if name == "Transcendental":
        msg += rf" \(the Transcendental of the Adjudicator at {at['Adjudicator']}\)"
    block = chain.w3.eth.block_number
    with pytest.raises(CodeMismatch, match=msg):
        Protocol.attach(chain, d)
    made = [chain.w3.eth.contract(address=a, abi=load_artifact(n).abi) for n, a in
            (("JobRegistry", d.registry), ("DisputeGame", d.game), ("Adjudicator", d.adjudicator),
             ("DataAvailability", d.availability))]
    with pytest.raises(CodeMismatch, match=msg):
        Protocol(chain, *made[:3], availability=made[3]).check_bindings()
    assert chain.w3.eth.block_number == block  # nothing was sent


def test_a_transcendental_compiled_from_a_changed_constant_is_refused_through_the_adjudicator(world) -> None:
    """The Adjudicator's code is this build's, but its immutable points at a Transcendental compiled
    (by protocol.build, from a source variant with one constant changed: tanh saturates later) and
    deployed by the adversary: the rulings on exp/log/tanh would be its. Refused."""
    from protocol.build import compile_sources

    chain, accts, _ = world
    path = "contracts/Transcendental.sol"
    source = (REPO / path).read_text(encoding="utf-8")
    variant = source.replace("TANH_SAT = 40;", "TANH_SAT = 41;")
    assert variant != source
    art = compile_sources({path: variant})["Transcendental"]
    assert art.deployed_bytecode != load_artifact("Transcendental").deployed_bytecode
    fake = nodes.deploy(chain.w3, art, sender=accts[0]).address
    adjudicator = deploy_runtime(chain, runtime_with("Adjudicator", {"transcendental": fake}), accts[0])
    registry = chain.deploy("JobRegistry", *DEV_FLOORS.args(), sender=accts[0])
    game = chain.deploy("DisputeGame", registry.address, adjudicator, sender=accts[0])
    chain.send(registry.functions.setDisputeGame(game.address), accts[0], what="setDisputeGame")
    d = Deployment(registry.address, game.address, adjudicator, chain.w3.eth.chain_id)
    with pytest.raises(CodeMismatch, match=refusal("Transcendental", fake)
                       + rf" \(the Transcendental of the Adjudicator at {adjudicator}\)"):
        Protocol.attach(chain, d)


def test_a_deployment_omitting_its_availability_contract_gets_the_registrys_verified(world) -> None:
    """A served file without the availability address (an older file, or one cut to keep an agent
    from demanding data or answering demands) attaches with the one the registry is bound to, once
    its code is checked: a look-alike there is refused all the same."""
    chain, accts, honest = world
    d = honest.deployment
    cut = Deployment(d.registry, d.game, d.adjudicator, d.chain_id)
    attached = Protocol.attach(chain, cut)
    assert attached.availability is not None and attached.availability.address == honest.availability.address
    fake, at = lookalike_set(chain, accts[0], {"DataAvailability": another_build})
    with pytest.raises(CodeMismatch, match=refusal("DataAvailability", at["DataAvailability"])):
        Protocol.attach(chain, Deployment(fake.registry, fake.game, fake.adjudicator, fake.chain_id))


def test_immutables_edited_after_construction_are_refused(world) -> None:
    """The code outside the slots is this build's, but one slot of the game's registry holds another
    address than the rest (code written without the constructor), or the adjudicator's
    Transcendental has bits above an address's 160."""
    chain, accts, honest = world
    d, at = lookalike_set(chain, accts[0])
    code = bytearray(runtime_with("DisputeGame", {"registry": at["JobRegistry"], "adjudicator": at["Adjudicator"],
                                                  "chunkAdjudicator": at["ChunkAdjudicator"]}))
    start, length = next(i for i in load_artifact("DisputeGame").immutables if i.name == "registry").ranges[-1]
    code[start:start + length] = int(honest.registry.address, 16).to_bytes(32, "big")
    with pytest.raises(CodeMismatch, match="code at 0x1 is not the DisputeGame this vtrain builds: its immutable "
                                           "registry holds 2 different values"):
        check_code("DisputeGame", "0x1", bytes(code))
    wide = runtime_with("Adjudicator", {"transcendental": (1 << 200) | int(at["Transcendental"], 16)})
    with pytest.raises(CodeMismatch, match="its immutable transcendental \\(contract Transcendental\\) holds "
                                           "0x1.*, wider than 160 bits"):
        check_code("Adjudicator", "0x1", wide)
    assert check_code("Adjudicator", "0x1", runtime_with("Adjudicator", {"transcendental": at["Transcendental"]})) \
        == {"transcendental": at["Transcendental"]}


def test_an_account_without_code_a_proxy_and_a_delegating_account_are_refused(world) -> None:
    """An account (EOA), an address nobody uses, an EIP-1167 proxy to the honest adjudicator (its
    target could change) and an EIP-7702 delegation: each refused with what it is."""
    chain, accts, honest = world
    d = honest.deployment
    for addr in (accts[7], "0x" + "11" * 20):
        with pytest.raises(CodeMismatch, match=f"Adjudicator: no contract at {Web3.to_checksum_address(addr)}"):
            Protocol.attach(chain, Deployment(d.registry, d.game, addr, d.chain_id, d.availability))
    target = honest.adjudicator.address
    proxy_code = (bytes.fromhex("363d3d373d3d3d363d73") + bytes.fromhex(target[2:])
                  + bytes.fromhex("5af43d82803e903d91602b57fd5bf3"))
    proxy = deploy_runtime(chain, proxy_code, accts[0])
    with pytest.raises(CodeMismatch, match=f"code at {proxy} is not the Adjudicator this vtrain builds: it is an "
                                           f"EIP-1167 proxy to {target}"):
        Protocol.attach(chain, Deployment(d.registry, d.game, proxy, d.chain_id, d.availability))
    with pytest.raises(CodeMismatch, match=f"it is an account delegating to {target} \\(EIP-7702\\)"):
        check_code("Adjudicator", accts[7], b"\xef\x01\x00" + bytes.fromhex(target[2:]))


def test_every_contract_object_the_protocol_makes_from_an_address_is_verified() -> None:
    """No attach path around the check: in protocol/, contract objects at an address are made only
    by Chain.verified (after check_code) and Chain.deploy (code it sent itself), and Protocol
    objects only by verify_deployment and deploy."""
    import ast

    makers: dict[tuple[str, str], set[str]] = {}
    for path in sorted((REPO / "protocol").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tops = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        tops += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
        for fn in tops:
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                f = call.func
                if isinstance(f, ast.Name) and f.id == "Protocol":
                    makers.setdefault((path.name, "Protocol("), set()).add(fn.name)
                if (isinstance(f, ast.Attribute) and f.attr == "contract"
                        and any(k.arg == "address" for k in call.keywords)):
                    makers.setdefault((path.name, "eth.contract(address="), set()).add(fn.name)
    assert makers == {("chain.py", "eth.contract(address="): {"deploy", "verified"},
                      ("deploy.py", "Protocol("): {"verify_deployment", "deploy"}}, makers


@pytest.mark.parametrize("node", [None, pytest.param("anvil_w3", marks=pytest.mark.node),
                                  pytest.param("hardhat_w3", marks=pytest.mark.node)])
def test_each_chain_gives_the_builds_code_and_the_check_holds(node: str | None, request) -> None:
    """eth-tester, anvil and hardhat: a deployment by Chain.deploy attaches (each node returns the
    build's runtime code with the immutables written), a look-alike adjudicator is refused."""
    chain = Chain.connect(None if node is None else request.getfixturevalue(node).provider.endpoint_uri)
    accts = chain.accounts()
    Protocol.attach(chain, deploy(chain, accts[0]).deployment)
    d, at = lookalike_set(chain, accts[0], {"Adjudicator": another_build})
    with pytest.raises(CodeMismatch, match=refusal("Adjudicator", at["Adjudicator"])):
        Protocol.attach(chain, d)


# -- the command line: every command that attaches, on a real node ----------------------------------
COMMANDS = {
    "client create-job": ["client", "create-job", "--spec", "{spec}"],
    "client reclaim-job": ["client", "reclaim-job", "--job", "1"],
    "client withdraw": ["client", "withdraw"],
    "client status": ["client", "status", "--job", "1"],
    "client watch": ["client", "watch", "--job", "1"],
    "client cancel-job": ["client", "cancel-job", "--job", "1"],
    "report": ["report", "--job", "1"],
    "trainer": ["trainer", "--job", "1", "--spec", "{spec}", "--store", "{tmp}/store"],
    "auditor": ["auditor", "--job", "1", "--spec", "{spec}", "--store-url", "http://127.0.0.1:9"],
}


@pytest.fixture(scope="module")
def node_world(anvil_w3) -> tuple[Chain, list[str], Protocol]:
    chain = Chain.connect(anvil_w3.provider.endpoint_uri)
    accts = chain.accounts()
    return chain, accts, deploy(chain, accts[0])


@pytest.mark.node
def test_every_command_refuses_a_lookalike_deployment_file(node_world, tmp_path: Path) -> None:
    """Each command of the command line that attaches (client, trainer with its availability
    responder, auditor, status/report tooling) refuses a deployment file of a bound look-alike set
    (its adjudicator another build), with the clear error and no traceback, sending nothing."""
    from protocol.agents_cli import save_deployment
    from protocol.cli import main
    from vtrain.training.spec import TrainSpec

    chain, accts, _ = node_world
    d, at = lookalike_set(chain, accts[0], {"Adjudicator": another_build})
    file = tmp_path / "deployment.json"
    d.save(file)
    honest_file = tmp_path / "honest.json"
    honest, _ = lookalike_set(chain, accts[0])
    save_deployment(Protocol.attach(chain, honest), honest_file)
    spec = tmp_path / "spec.json"
    spec.write_text(TrainSpec(steps=8, interval=4).to_json())
    block = chain.w3.eth.block_number
    for what, args in COMMANDS.items():
        argv = [a.format(spec=spec, tmp=tmp_path) for a in args]
        n = len(what.split())
        argv[n:n] = ["--rpc", chain.url, "--deployment", str(file), "--rpc-retries", "0"]
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 1 and "Traceback" not in r.output, (what, r.output)
        assert re.search(refusal("Adjudicator", at["Adjudicator"]), " ".join(r.output.split())), (what, r.output)
    assert chain.w3.eth.block_number == block
    r = CliRunner().invoke(main, ["client", "status", "--rpc", chain.url, "--deployment", str(honest_file),
                                  "--job", "1"])
    assert "is not the" not in r.output, r.output  # the honest file attaches (job 1 does not exist there)


@pytest.mark.node
def test_served_abis_are_never_used_to_decode(node_world, tmp_path: Path, caplog) -> None:
    """A deployment file's ABIs are served: one whose getJob result is reordered (decoding would read
    the job's fields in another order: its spec hash as its data root, ...) is ignored, with a
    warning; the verified code's ABI is used."""
    from protocol.agents_cli import connect, save_deployment

    chain, _, proto = node_world
    file = tmp_path / "deployment.json"
    save_deployment(proto, file)
    data = json.loads(file.read_text())
    served = data["abis"]["JobRegistry"]
    for item in served:
        if item.get("name") == "getJob":
            spec = item["outputs"][0]["components"][0]["components"]
            spec[1], spec[2] = spec[2], spec[1]
    file.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="protocol.agents_cli"):
        _, attached = connect(chain.url, file, 0)
    assert attached.registry.abi == load_artifact("JobRegistry").abi != served
    assert "its ABIs of JobRegistry differ from the verified code's; they are not used" in caplog.text
    old = {k: v for k, v in data.items() if k != "abis"}  # a file without ABIs (older vtrain) still attaches
    file.write_text(json.dumps(old))
    assert connect(chain.url, file, 0)[1].deployment == proto.deployment


def test_a_bad_address_in_a_binding_reads_as_an_error_not_a_crash(world) -> None:
    """An address that is not one (the file's availability) is refused by name."""
    chain, _, honest = world
    d = honest.deployment
    with pytest.raises(ChainError, match="DataAvailability: 'nope' is not an address"):
        Protocol.attach(chain, Deployment(d.registry, d.game, d.adjudicator, d.chain_id, "nope"))
