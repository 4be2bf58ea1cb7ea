"""Is the code at an address the contract this vtrain builds?

A deployment file is served data, and so is every address read from a contract: whoever deployed
the contracts (a trainer, say) may have deployed look-alikes bound to each other (an Adjudicator
that always rules for the trainer, a registry that hands the trainer the bonds). So before
anything is sent to an address or read from it, its runtime code (one ``eth_getCode``) is compared
with the runtime code ``protocol.build`` compiles from this checkout's ``contracts/``:

- byte for byte, the CBOR metadata trailer included: the same sources and compiler give the same
  bytes, and any other build (even one that changed only a comment) is refused, which is the
  simplest rule that is safe: the code is exactly the code that was reviewed and tested here;
- except the immutables' slots (solc's ``immutableReferences``), which the constructor fills:
  there each immutable's occurrences must all hold one value that fits its type. The values are
  returned; the caller checks those that are bindings (``Protocol.check_bindings``: a game's
  registry, adjudicator and chunk adjudicator, an adjudicator's Transcendental, ...).

The protocol's libraries are internal (``protocol.build`` refuses a contract that needs linking),
so a runtime code has no other holes. The expected code is made once per build and contract.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from eth_utils import keccak, to_checksum_address

from protocol.build import ContractArtifact, Immutable, load_artifact
from protocol.chain import ChainError

log = logging.getLogger(__name__)

#: EIP-1167 minimal proxy: this prefix, a 20-byte address, then ``_PROXY_TAIL``.
_PROXY_HEAD = bytes.fromhex("363d3d373d3d3d363d73")
_PROXY_TAIL = bytes.fromhex("5af43d82803e903d91602b57fd5bf3")
#: EIP-7702 delegation designator of an account: this prefix, then a 20-byte address.
_DELEGATION = bytes.fromhex("ef0100")


class CodeMismatch(ChainError):
    """Raised when the code at an address is not the contract this vtrain builds (names the
    contract, the address and why)."""


@dataclass(frozen=True)
class ExpectedCode:
    """The runtime code a contract must have: ``code`` with every immutable's slots zeroed."""

    name: str
    code: bytes
    immutables: tuple[Immutable, ...]

    @property
    def codehash(self) -> str:
        return "0x" + keccak(self.code).hex()

    def masked(self, code: bytes) -> bytes:
        """``code`` with this contract's immutable slots zeroed (``code`` as is when its length
        differs: it cannot be this contract)."""
        if len(code) != len(self.code):
            return code
        out = bytearray(code)
        for imm in self.immutables:
            for start, length in imm.ranges:
                out[start:start + length] = bytes(length)
        return bytes(out)


_expected: dict[str, tuple[ContractArtifact, ExpectedCode]] = {}


def expected_code(name: str) -> ExpectedCode:
    """The runtime code of contract ``name`` in this checkout's build (made once per build)."""
    art = load_artifact(name)
    hit = _expected.get(name)
    if hit is not None and hit[0] is art:
        return hit[1]
    code = bytes.fromhex(art.deployed_bytecode.removeprefix("0x"))
    if not code:
        raise CodeMismatch(f"{name} has no runtime code in this build (an interface or abstract contract?)")
    exp = ExpectedCode(name, code, art.immutables)
    if exp.masked(code) != code:  # solc leaves the slots zero; anything else is a build we do not understand
        raise CodeMismatch(f"{name}: the build's runtime code has nonzero bytes in its immutables' slots")
    _expected[name] = (art, exp)
    return exp


def check_code(name: str, address: str, code: bytes) -> dict[str, int | str]:
    """The immutables' values (addresses checksummed) of ``code``, the runtime code at ``address``,
    after checking that it is contract ``name`` as this vtrain builds it; raise :class:`CodeMismatch`
    naming the contract, the address and the reason otherwise."""
    exp = expected_code(name)
    code = bytes(code)
    if not code:
        raise CodeMismatch(f"{name}: no contract at {address} (an account without code: wrong address or chain?)")
    masked = exp.masked(code)
    if masked != exp.code:
        raise CodeMismatch(f"code at {address} is not the {name} this vtrain builds: {_why(code, masked, exp)}")
    values: dict[str, int | str] = {}
    for imm in exp.immutables:
        words = {code[s:s + n] for s, n in imm.ranges}
        if len(words) != 1:
            raise CodeMismatch(f"code at {address} is not the {name} this vtrain builds: its immutable {imm.name} "
                               f"holds {len(words)} different values (code edited after construction)")
        value = int.from_bytes(words.pop(), "big")
        bits = _bits(imm.type)
        if bits is not None and value >> bits:
            raise CodeMismatch(f"code at {address} is not the {name} this vtrain builds: its immutable {imm.name} "
                               f"({imm.type}) holds {value:#x}, wider than {bits} bits")
        values[imm.name] = to_checksum_address(value.to_bytes(20, "big")) if bits == 160 else value
    return values


def _why(code: bytes, masked: bytes, exp: ExpectedCode) -> str:
    if len(code) == 45 and code.startswith(_PROXY_HEAD) and code.endswith(_PROXY_TAIL):
        return f"it is an EIP-1167 proxy to {to_checksum_address(code[10:30])} (a proxy's target can change)"
    if len(code) == 23 and code.startswith(_DELEGATION):
        return f"it is an account delegating to {to_checksum_address(code[3:])} (EIP-7702)"
    sizes = "" if len(code) == len(exp.code) else f" ({len(code)} bytes, expected {len(exp.code)})"
    return (f"codehash 0x{keccak(masked).hex()}, expected {exp.codehash}{sizes}, immutables zeroed "
            "(another build or a look-alike contract)")


def _bits(solidity_type: str) -> int | None:
    """Width of an immutable's type where its value has one (addresses, contracts, uintN)."""
    if solidity_type == "address" or solidity_type.startswith(("contract ", "address ")):
        return 160
    if solidity_type.startswith("uint"):
        return int(solidity_type[4:] or 256)
    if solidity_type == "bool":
        return 1
    return None
