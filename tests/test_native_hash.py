"""The C SHA-256 tree builder (vtrain/commit/native.py, csrc/sha256tree.c) against the
pure-Python reference builder, hashlib and tests/vectors, bit for bit; and its build/fallback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vtrain.commit import merkle, native
from vtrain.commit.merkle import (
    MerkleTree,
    chunked_root,
    chunked_roots,
    hash_chunks,
    reference_chunked_root,
    reference_hash_chunks,
    root_from_path,
    root_of_leaf_hashes,
)
from vtrain.commit.roots import reference_tensor_root, state_root, tensor_root, tensor_roots, tensor_tree

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "vectors"

needs_native = pytest.mark.skipif(not native.available(), reason="C tree builder not built (make native)")

IMPLS = ["portable", "sha-ni", "avx2"]
# Element counts of the issue: empty, one short leaf, around one leaf, and 4097 leaves (odd tree
# sizes at every level, several aligned blocks of the C builder).
SIZES = [0, 1, 63, 64, 65, 4096 * 64 + 7]


def _cpu_has(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest):
    if not native.available():
        pytest.skip("C tree builder not built (make native)")
    flag = {"sha-ni": "sha_ni", "avx2": "avx2"}.get(request.param)
    if flag and not _cpu_has(flag):
        pytest.skip(f"this CPU has no {request.param}")
    assert native.select(request.param) == request.param
    yield request.param
    native.select("best")


def _hashlib_root(data: bytes, chunk: int) -> bytes:
    """The tree straight from the RFC 9162 definition (recursive split), with hashlib."""

    def mth(leaves: list[bytes]) -> bytes:
        if len(leaves) == 1:
            return hashlib.sha256(b"\x00" + leaves[0]).digest()
        k = 1 << ((len(leaves) - 1).bit_length() - 1)
        return hashlib.sha256(b"\x01" + mth(leaves[:k]) + mth(leaves[k:])).digest()

    if not data:
        return hashlib.sha256(b"").digest()
    return mth([data[i : i + chunk] for i in range(0, len(data), chunk)])


@needs_native
def test_best_is_sha_ni_when_the_cpu_has_it() -> None:
    best = "sha-ni" if _cpu_has("sha_ni") else "avx2" if _cpu_has("avx2") else "portable"
    assert native.implementation() == best


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_tensor_root_matches_reference(impl: str, n: int, threads: int) -> None:
    a = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    want = reference_tensor_root(a)
    assert tensor_root(a, threads=threads) == want
    if n < 5000:
        assert want == _hashlib_root(a.tobytes(), 256)


@pytest.mark.parametrize("chunk", [1, 9, 32, 55, 63, 64, 65, 119, 120, 256, 1000])
def test_chunked_root_random_sizes(impl: str, chunk: int) -> None:
    rng = np.random.default_rng(chunk)
    # Lengths around the padding boundaries (55/56, 63/64, 119/120 message bytes) and block sizes.
    lengths = {0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 1, int(rng.integers(1, 40_000))}
    lengths |= {(1 << 14) * chunk + 3} if chunk <= 32 else set()
    for length in sorted(x for x in lengths if x >= 0):
        data = rng.integers(0, 256, length, dtype=np.uint8)
        want = reference_chunked_root(data, chunk)
        assert chunked_root(data, chunk, threads=1) == want, (chunk, length)
        assert chunked_root(data, chunk, threads=3) == want, (chunk, length)
        if length < 3000:
            assert want == _hashlib_root(data.tobytes(), chunk), (chunk, length)


def test_many_buffers_in_one_threaded_call(impl: str) -> None:
    rng = np.random.default_rng(7)
    arrs = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(0, 70_000, 23)]
    arrs[5] = arrs[5][:0]
    want = [reference_tensor_root(a) for a in arrs]
    for threads in (1, 4):
        assert tensor_roots(arrs, threads=threads) == want
    u8s = [a.view(np.uint8) for a in arrs]
    assert chunked_roots(u8s, 36, threads=3) == [reference_chunked_root(b, 36) for b in u8s]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 65, 1000, 4097])
def test_full_tree_levels_and_proofs(impl: str, n: int) -> None:
    a = np.random.default_rng(n).standard_normal(64 * n - 3).astype(np.float32)
    ref = reference_hash_chunks(a, 256)
    assert hash_chunks(a, 256, threads=3) == ref
    tree = tensor_tree(a, threads=2)
    assert tree.root == reference_tensor_root(a)
    # Every level, against the pure-Python pairing.
    level = list(ref)
    for j in range(tree.depth + 1):
        assert tree._levels[j] == b"".join(level), j
        level = merkle._level_up(level)
    for i in sorted({0, n // 2, n - 1}):
        p = tree.prove(i)
        assert root_from_path(ref[i], p.index, p.size, p.path) == tree.root


def test_level_up_odd_sizes(impl: str) -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 7, 4095, 4096, 4097, 8193, 9001):
        level = [rng.bytes(32) for _ in range(n)]
        assert native.level_up(b"".join(level), threads=3) == b"".join(merkle._level_up(level)), n
        assert root_of_leaf_hashes(level) == merkle._fold(level)
    odd = [b"ab", b"cd", rng.bytes(32)]  # not all digests: the same (meaningless) root as the reference
    assert root_of_leaf_hashes(odd) == merkle._fold(odd)


def test_nan_and_inf_are_caught_by_the_fused_check(impl: str) -> None:
    good = np.zeros(1000, dtype=np.float32)
    for bad_value, at in ((np.nan, 999), (np.inf, 0), (-np.inf, 640)):
        bad = np.ones(300_000, dtype=np.float32)
        bad[at] = bad_value
        with pytest.raises(ValueError, match=rf"state\[1\]: expected finite values.*flat index {at}"):
            tensor_roots([good, bad, good], "state", threads=2)
        with pytest.raises(ValueError, match="tensor: expected finite"):
            tensor_root(bad)
    # -0.0, subnormals and the largest finite values are hashed as they are.
    edge = np.array([-0.0, 1e-45, 3.4028235e38, -3.4028235e38], dtype=np.float32)
    assert tensor_root(edge) == reference_tensor_root(edge)


def test_tensor_vectors(impl: str) -> None:
    doc = json.loads((VECTORS / "tensor.json").read_text())
    for t in doc["tensors"]:
        a = np.frombuffer(bytes.fromhex(t["data"][2:]), dtype="<f4")
        assert "0x" + tensor_root(a, threads=2).hex() == t["root"], t["n"]


def test_merkle_vectors(impl: str) -> None:
    doc = json.loads((VECTORS / "merkle.json").read_text())
    hashes = [bytes.fromhex(h[2:]) for h in doc["leaf_hashes"]]
    for t in doc["trees"]:
        assert "0x" + root_of_leaf_hashes(hashes[: t["size"]]).hex() == t["root"]
        assert "0x" + MerkleTree(hashes[: t["size"]]).root.hex() == t["root"]


def test_state_and_trace_vectors(impl: str) -> None:
    doc = json.loads((VECTORS / "commit.json").read_text())
    for roots, root in ((doc["state"]["components"], doc["state"]["root"]),
                        (doc["trace"]["op_output_roots"], doc["trace"]["root"])):
        assert "0x" + state_root([bytes.fromhex(r[2:]) for r in roots]).hex() == root


# ---------------------------------------------------------------------------------------------
# Build and fallback


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VTRAIN_NATIVE_HASH")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "PYTHONPATH": str(ROOT), "VTRAIN_NATIVE_HASH": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


_FALLBACK = """
import logging, numpy as np
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
from vtrain.commit import native
from vtrain.commit.roots import tensor_root, tensor_roots
a = np.arange(4099, dtype=np.float32)
print("available", native.available(), native.implementation())
print("root", tensor_root(a).hex(), tensor_roots([a, a[:7]])[1].hex())
"""


def test_missing_library_falls_back_with_one_warning(tmp_path: Path) -> None:
    a = np.arange(4099, dtype=np.float32)
    want = f"root {tensor_root(a).hex()} {tensor_root(a[:7]).hex()}"
    r = _run_python(_FALLBACK, VTRAIN_NATIVE_HASH_LIB=str(tmp_path / "missing.so"))
    assert r.returncode == 0, r.stderr
    assert "available False python" in r.stdout
    assert want in r.stdout
    warnings = [line for line in r.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "pure-Python" in warnings[0], r.stderr
    r = _run_python(_FALLBACK, VTRAIN_NATIVE_HASH="0")
    assert r.returncode == 0 and want in r.stdout and "WARNING" not in r.stderr, r.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_native_builds_or_degrades(tmp_path: Path) -> None:
    lib = tmp_path / "_sha256tree.so"
    r = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "native", f"NATIVE_LIB={lib}", "CC=/nonexistent/cc"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "WARNING" in r.stderr and "pure-Python" in r.stderr and not lib.exists()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here")
    r = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "native", f"NATIVE_LIB={lib}", f"CC={cc}"],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0 and lib.exists(), r.stderr
    r = _run_python(_FALLBACK, VTRAIN_NATIVE_HASH_LIB=str(lib))
    assert r.returncode == 0 and "available True" in r.stdout and "WARNING" not in r.stderr, r.stderr
