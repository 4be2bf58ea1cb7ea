"""Compile `contracts/**/*.sol` into `build/contracts/<ContractName>.json`.

The compiler is npm `solc@0.8.28` (solcjs, wasm; no download needed), driven by py-solc-x's
`compile_standard` through `scripts/solcjs-shim.sh`. Every source is compiled in one standard-JSON
job whose source unit names are repo-relative paths, so contracts import each other by their path
from the repo root: `import {Merkle} from "contracts/lib/Merkle.sol";` (`npx hardhat compile` uses
the same names and settings, see `hardhat.config.js`, and produces the same bytecode).

Builds are cached by a hash of every source, the compiler version and the settings: a second call
with unchanged sources reads the artifacts back without starting the compiler. This module assumes
a source checkout (an editable install): it finds `contracts/`, `scripts/` and `node_modules/` next
to the `protocol` package.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTRACTS_DIR = REPO_ROOT / "contracts"
BUILD_DIR = REPO_ROOT / "build" / "contracts"
SOLC_SHIM = REPO_ROOT / "scripts" / "solcjs-shim.sh"
SOLCJS_DIR = REPO_ROOT / "node_modules" / "solc"

SOLC_VERSION = "0.8.28"
# Keep identical to SOLIDITY_SETTINGS in hardhat.config.js (tests/test_build.py compares bytecode).
# viaIR is required: DisputeGame.sol hits "stack too deep" without it. Measured (solcjs, 2 cores):
# the 11 contracts of 2026-11 (1.9k lines) build in 16-18 s with viaIR; a synthetic 600-line
# contract took 14 s vs 3.3 s without, but came out 18% smaller (EIP-170 caps code at 24 KB).
# The build cache makes it a once-per-edit cost.
# evmVersion: py-evm's newest fork is prague; solc 0.8.28 defaults to cancun, say it explicitly.
SOLC_SETTINGS: dict[str, Any] = {
    "optimizer": {"enabled": True, "runs": 200},
    "viaIR": True,
    "evmVersion": "cancun",
}
_OUTPUTS = ["abi", "evm.bytecode.object", "evm.deployedBytecode.object", "evm.deployedBytecode.immutableReferences",
            "evm.deployedBytecode.linkReferences"]
_SOURCE_OUTPUTS = ["ast"]  # per file: the names and types of the immutables (protocol.codecheck checks their values)
_MANIFEST_NAME = ".manifest.json"  # in BUILD_DIR: the build key and the contract names


class BuildError(Exception):
    """Raised when the contracts cannot be compiled: a compiler error, or node/solc missing."""


@dataclass(frozen=True)
class Immutable:
    """One immutable of a contract: its name and Solidity type (e.g. ``contract IJobRegistry``,
    ``uint64``) and the (start, length) byte ranges of the runtime code holding its value."""

    name: str
    type: str
    ranges: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "ranges": [list(r) for r in self.ranges]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Immutable:
        return cls(data["name"], data["type"], tuple((int(s), int(n)) for s, n in data["ranges"]))


@dataclass(frozen=True)
class ContractArtifact:
    """One compiled contract, as stored in `build/contracts/<name>.json`."""

    name: str
    source: str  # repo-relative path of the defining file, e.g. "contracts/lib/Merkle.sol"
    abi: list[dict[str, Any]]
    bytecode: str  # 0x-prefixed creation code; "0x" for interfaces and abstract contracts
    deployed_bytecode: str  # 0x-prefixed runtime code
    immutables: tuple[Immutable, ...] = ()
    """Where the constructor writes each immutable into the runtime code (solc's
    ``immutableReferences``: the bytes there are zero in ``deployed_bytecode``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "contractName": self.name,
            "sourceName": self.source,
            "abi": self.abi,
            "bytecode": self.bytecode,
            "deployedBytecode": self.deployed_bytecode,
            "immutables": [i.to_json() for i in self.immutables],
            "compiler": {"version": SOLC_VERSION, "settings": SOLC_SETTINGS},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContractArtifact:
        return cls(
            name=data["contractName"],
            source=data["sourceName"],
            abi=data["abi"],
            bytecode=data["bytecode"],
            deployed_bytecode=data["deployedBytecode"],
            immutables=tuple(Immutable.from_json(i) for i in data.get("immutables", [])),
        )


_memo: tuple[str, dict[str, ContractArtifact]] | None = None


def source_files() -> list[Path]:
    """Every `.sol` file under `contracts/`, sorted."""
    return sorted(CONTRACTS_DIR.rglob("*.sol"))


def _source_name(path: Path) -> str:
    return path.relative_to(REPO_ROOT).as_posix()


def _build_key(sources: dict[str, str]) -> str:
    h = hashlib.sha256()
    header = {"solc": SOLC_VERSION, "settings": SOLC_SETTINGS, "outputs": _OUTPUTS}
    header["source_outputs"] = _SOURCE_OUTPUTS
    h.update(json.dumps(header, sort_keys=True).encode())
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + hashlib.sha256(sources[name].encode()).digest())
    return h.hexdigest()


def compile_contracts(force: bool = False) -> dict[str, ContractArtifact]:
    """Compile every contract (unless the cached build matches) and return artifacts by name.

    Raises `BuildError` naming the file and the compiler's message when compilation fails, or
    when node or npm solc is missing.
    """
    global _memo
    sources = {_source_name(p): p.read_text(encoding="utf-8") for p in source_files()}
    if not sources:
        raise BuildError(f"no .sol files under {CONTRACTS_DIR}")
    key = _build_key(sources)
    memo_key = f"{BUILD_DIR}:{key}"
    if not force:
        if _memo is not None and _memo[0] == memo_key:
            return _memo[1]
        cached = _read_cached(key)
        if cached is not None:
            _memo = (memo_key, cached)
            return cached
    t0 = time.perf_counter()
    artifacts = _compile(sources)
    _write(key, artifacts)
    log.info(
        "compiled %d files (%d contracts) in %.1f s",
        len(sources),
        len(artifacts),
        time.perf_counter() - t0,
    )
    _memo = (memo_key, artifacts)
    return artifacts


def load_artifact(name: str) -> ContractArtifact:
    """The artifact of contract `name`, compiling first if the sources changed."""
    artifacts = compile_contracts()
    try:
        return artifacts[name]
    except KeyError:
        raise BuildError(
            f"no contract named {name!r}; known: {', '.join(sorted(artifacts))}"
        ) from None


def compile_sources(sources: dict[str, str]) -> dict[str, ContractArtifact]:
    """Compile ``sources`` (repo-relative path -> text; imports not given are read from the
    checkout) with this build's compiler and settings, without caching or writing artifacts: e.g.
    a source variant, to see that ``protocol.codecheck`` refuses its code."""
    return _compile(sources)


def _read_cached(key: str) -> dict[str, ContractArtifact] | None:
    try:
        manifest = json.loads((BUILD_DIR / _MANIFEST_NAME).read_text())
        if manifest.get("key") != key:
            return None
        return {
            name: ContractArtifact.from_json(json.loads((BUILD_DIR / f"{name}.json").read_text()))
            for name in manifest["contracts"]
        }
    except (OSError, ValueError, KeyError):
        return None


def _check_toolchain() -> None:
    if shutil.which("node") is None:
        raise BuildError("node not found on PATH: install Node.js 20 (the compiler is npm solcjs)")
    pkg = SOLCJS_DIR / "package.json"
    if not pkg.is_file():
        raise BuildError(f"npm solc not found at {SOLCJS_DIR}: run `npm ci` in {REPO_ROOT}")
    version = json.loads(pkg.read_text()).get("version")
    if version != SOLC_VERSION:
        raise BuildError(f"expected npm solc {SOLC_VERSION}, got {version}: run `npm ci`")


def _compile(sources: dict[str, str]) -> dict[str, ContractArtifact]:
    import solcx  # deferred: the cached path needs no compiler
    from solcx.exceptions import SolcError

    _check_toolchain()
    input_json = {
        "language": "Solidity",
        "sources": {name: {"content": text} for name, text in sources.items()},
        "settings": {**SOLC_SETTINGS, "outputSelection": {"*": {"*": _OUTPUTS, "": _SOURCE_OUTPUTS}}},
    }
    try:
        output = solcx.compile_standard(
            input_json, base_path=str(REPO_ROOT), solc_binary=str(SOLC_SHIM), allow_empty=True
        )
    except SolcError as e:
        raise BuildError(_format_errors(e.error_dict) if e.error_dict else str(e)) from e
    except (OSError, ValueError) as e:  # shim missing, or output that is not JSON
        raise BuildError(f"solc via {SOLC_SHIM} failed: {e}") from e
    for msg in output.get("errors", []):
        log.warning("solc: %s", msg.get("formattedMessage", msg.get("message")))

    declarations = _immutable_declarations(output)
    artifacts: dict[str, ContractArtifact] = {}
    for source, contracts in sorted(output.get("contracts", {}).items()):
        for name, out in sorted(contracts.items()):
            runtime = out["evm"]["deployedBytecode"]
            if runtime.get("linkReferences"):  # protocol.codecheck compares whole runtime codes
                raise BuildError(f"{source}:{name} needs linked libraries ({', '.join(runtime['linkReferences'])}); "
                                 "the protocol's libraries must be internal")
            if name in artifacts:
                raise BuildError(
                    f"contract name {name!r} is defined in both {artifacts[name].source} and "
                    f"{source}; artifacts are stored by name, so names must be unique"
                )
            artifacts[name] = ContractArtifact(
                name=name,
                source=source,
                abi=out["abi"],
                bytecode="0x" + out["evm"]["bytecode"]["object"],
                deployed_bytecode="0x" + out["evm"]["deployedBytecode"]["object"],
                immutables=tuple(
                    Immutable(*declarations[int(ast_id)], tuple((int(r["start"]), int(r["length"])) for r in refs))
                    for ast_id, refs in sorted(runtime.get("immutableReferences", {}).items(),
                                               key=lambda kv: int(kv[0]))
                ),
            )
    return artifacts


def _immutable_declarations(output: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """AST id -> (name, type) of every immutable state variable in the compiler's ASTs."""
    found: dict[int, tuple[str, str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("nodeType") == "VariableDeclaration" and node.get("mutability") == "immutable":
                found[int(node["id"])] = (node["name"], node["typeDescriptions"]["typeString"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for src in output.get("sources", {}).values():
        walk(src.get("ast"))
    return found


def _format_errors(errors: Any) -> str:  # solc's "errors" list (py-solc-x types it a dict)
    lines = []
    for err in errors:
        if err.get("severity") != "error":
            continue
        where = err.get("sourceLocation", {}).get("file", "<unknown file>")
        lines.append(f"{where}: {err.get('formattedMessage') or err.get('message')}".rstrip())
    return "solc " + SOLC_VERSION + " failed:\n" + "\n".join(lines)


def _atomic_write(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _write(key: str, artifacts: dict[str, ContractArtifact]) -> None:
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    for old in BUILD_DIR.glob("*.json"):
        if old.stem not in artifacts:
            old.unlink()
    for name, art in artifacts.items():
        _atomic_write(BUILD_DIR / f"{name}.json", art.to_json())
    _atomic_write(BUILD_DIR / _MANIFEST_NAME, {"key": key, "contracts": sorted(artifacts)})
