"""protocol.build: cached compilation, clear errors, and the same bytecode as `hardhat compile`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from protocol import build

SMOKE_SOURCES = ("contracts/test/SmokeCounter.sol", "contracts/lib/Merkle.sol")


def test_compile_contracts_writes_artifacts_and_second_call_is_cached() -> None:
    artifacts = build.compile_contracts()
    smoke = artifacts["SmokeCounter"]
    assert smoke.source == "contracts/test/SmokeCounter.sol"
    assert len(smoke.bytecode) > 2 and smoke.abi
    stored = json.loads((build.BUILD_DIR / "SmokeCounter.json").read_text())
    assert build.ContractArtifact.from_json(stored) == smoke

    build._memo = None  # force the on-disk cache path, not the in-process memo
    t0 = time.perf_counter()
    again = build.compile_contracts()
    assert time.perf_counter() - t0 < 0.5
    assert again == artifacts
    assert build.load_artifact("Merkle").source == "contracts/lib/Merkle.sol"


def test_load_artifact_of_an_unknown_name_raises_build_error_listing_known_names() -> None:
    with pytest.raises(build.BuildError, match="SmokeCounter"):
        build.load_artifact("NoSuchContract")


def _fake_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> Path:
    (tmp_path / "contracts").mkdir()
    (tmp_path / "contracts" / "Broken.sol").write_text(source)
    monkeypatch.setattr(build, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(build, "CONTRACTS_DIR", tmp_path / "contracts")
    monkeypatch.setattr(build, "BUILD_DIR", tmp_path / "build" / "contracts")
    return tmp_path


def test_compile_error_raises_build_error_naming_the_file_and_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_repo(tmp_path, monkeypatch, "pragma solidity 0.8.28;\ncontract Broken { uint x = ; }\n")
    with pytest.raises(build.BuildError) as err:
        build.compile_contracts()
    assert "contracts/Broken.sol" in str(err.value)
    assert "ParserError" in str(err.value)


def test_compiler_output_over_64_kib_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # solcjs cuts piped output at 64 KiB (console.log, then process.exit); the shim avoids it.
    # Interfaces give a large ABI without code generation, so this compiles in about a second.
    funcs = "".join(
        f"    function someRatherLongFunctionName{i}(uint256 a, bytes32 b) external;\n"
        for i in range(50)
    )
    ifaces = "".join(f"interface IWide{k} {{\n{funcs}}}\n" for k in range(12))
    _fake_repo(tmp_path, monkeypatch, "pragma solidity 0.8.28;\n" + ifaces)
    artifacts = build.compile_contracts()
    size = sum(len(json.dumps(a.abi)) for a in artifacts.values())
    assert len(artifacts) == 12 and size > 65536


def test_missing_node_raises_build_error_before_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_repo(tmp_path, monkeypatch, "pragma solidity 0.8.28;\ncontract Ok {}\n")
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.BuildError, match="node not found"):
        build.compile_contracts()


def test_hardhat_compile_produces_the_same_bytecode_as_protocol_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both pipelines compile the same copy of SmokeCounter and the library it imports, so the
    # test neither depends on (nor slows down with) the rest of contracts/ nor touches the repo's
    # artifacts/ and cache/.
    root = build.REPO_ROOT
    for rel in ("hardhat.config.js", "package.json", *SMOKE_SOURCES):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, tmp_path / rel)
    (tmp_path / "node_modules").symlink_to(root / "node_modules")
    proc = subprocess.run(
        [str(root / "node_modules" / ".bin" / "hardhat"), "compile", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    monkeypatch.setattr(build, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(build, "CONTRACTS_DIR", tmp_path / "contracts")
    monkeypatch.setattr(build, "BUILD_DIR", tmp_path / "build" / "contracts")
    ours = build.load_artifact("SmokeCounter")
    theirs = json.loads((tmp_path / "artifacts" / ours.source / "SmokeCounter.json").read_text())
    assert theirs["bytecode"] == ours.bytecode
    assert theirs["deployedBytecode"] == ours.deployed_bytecode
    assert theirs["abi"] == ours.abi
