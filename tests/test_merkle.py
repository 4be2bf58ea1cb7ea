"""vtrain.commit.merkle: RFC 9162 trees, checked against pymerkle 7, the RFC 6962 reference data and a
direct recursive transcription of RFC 9162."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymerkle import InmemoryTree

from vtrain.commit import merkle
from vtrain.commit.merkle import (
    EMPTY_ROOT,
    ConsistencyProof,
    InclusionProof,
    MerkleTree,
    chunked_root,
    hash_chunks,
    leaf_hash,
    merkle_root,
    node_hash,
    verify_consistency,
    verify_inclusion,
)
from vtrain.errors import InvalidProof, VtrainError

# ---------------------------------------------------------------------------------------------
# Reference code: RFC 9162 section 2.1, transcribed recursively.


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = _k(len(d))
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = _k(len(d))
    if m < k:
        return ref_path(m, d[:k]) + [ref_mth(d[k:])]
    return ref_path(m - k, d[k:]) + [ref_mth(d[:k])]


def ref_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [ref_mth(d)]
    k = _k(n)
    if m <= k:
        return ref_subproof(m, d[:k], b) + [ref_mth(d[k:])]
    return ref_subproof(m - k, d[k:], False) + [ref_mth(d[:k])]


def pymerkle_tree(leaves: list[bytes]) -> InmemoryTree:
    t = InmemoryTree()
    for d in leaves:
        t.append_entry(d)
    return t


def leaves_of(n: int, salt: bytes = b"") -> list[bytes]:
    return [salt + i.to_bytes(4, "big") * (i % 4) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# RFC 6962 reference data (transparency-dev/merkle testonly/constants.go, proof/verify_test.go)

CT_LEAVES = [
    bytes.fromhex(h)
    for h in ["", "00", "10", "2021", "3031", "40414243", "5051525354555657",
              "606162636465666768696a6b6c6d6e6f"]
]  # fmt: skip
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
CT_PATHS = [  # (0-based index, size, audit path)
    (0, 1, []),
    (0, 2, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"]),
    (1, 2, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (1, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
]  # fmt: skip
CT_CONSISTENCY = [  # (prior size, size, path)
    (1, 1, []),
    (1, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (6, 8, ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 5, ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]  # fmt: skip


def test_roots_match_the_rfc6962_reference_data_for_sizes_1_to_8():
    assert merkle_root([]) == bytes.fromhex(
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    for n, root in enumerate(CT_ROOTS, start=1):
        assert MerkleTree.from_leaves(CT_LEAVES[:n]).root.hex() == root


def test_audit_paths_match_the_rfc6962_reference_data():
    for index, size, path in CT_PATHS:
        tree = MerkleTree.from_leaves(CT_LEAVES[:size])
        proof = tree.prove(index)
        assert [p.hex() for p in proof.path] == path
        verify_inclusion(bytes.fromhex(CT_ROOTS[size - 1]), leaf_hash(CT_LEAVES[index]), proof)


def test_consistency_proofs_match_the_rfc6962_reference_data():
    for m, n, path in CT_CONSISTENCY:
        proof = MerkleTree.from_leaves(CT_LEAVES[:n]).prove_consistency(m)
        assert [p.hex() for p in proof.path] == path
        verify_consistency(bytes.fromhex(CT_ROOTS[m - 1]), bytes.fromhex(CT_ROOTS[n - 1]), proof)


# ---------------------------------------------------------------------------------------------
# pymerkle (1-based) as the reference, converted at the boundary


@pytest.mark.parametrize("n", range(1, 71))
def test_root_and_every_audit_path_equal_pymerkle_for_size(n):
    leaves = leaves_of(n)
    ref = pymerkle_tree(leaves)
    tree = MerkleTree.from_leaves(leaves)
    assert tree.root == ref.get_root()
    for i in range(n):
        ref_proof = ref.prove_inclusion(i + 1)  # pymerkle: 1-based, path = [leaf] + siblings
        proof = tree.prove(i)
        assert (proof.index, proof.size) == (i, n)
        assert list(proof.path) == ref_proof.path[1:]
        verify_inclusion(tree.root, tree.leaf_hash(i), proof)


@pytest.mark.parametrize("n", [127, 128, 129, 1000, 4097])
def test_large_trees_equal_pymerkle_and_the_recursive_reference(n):
    leaves = leaves_of(n, b"L")
    ref = pymerkle_tree(leaves)
    tree = MerkleTree.from_leaves(leaves)
    assert tree.root == ref.get_root() == ref_mth(leaves)
    for i in sorted({0, 1, n // 3, n // 2, n - 2, n - 1}):
        assert list(tree.prove(i).path) == ref.prove_inclusion(i + 1).path[1:]
        assert list(tree.prove(i).path) == ref_path(i, leaves)


def test_pymerkle_verifies_a_proof_converted_from_ours():
    from pymerkle import InclusionProof as PyProof
    from pymerkle.core import _inclusion_path_layout

    leaves = leaves_of(21)
    tree = MerkleTree.from_leaves(leaves)
    for i in range(21):
        ours = tree.prove(i)
        rule, _ = _inclusion_path_layout(i + 1, 21)
        py = PyProof("sha256", True, 21, i + 1, rule, [tree.leaf_hash(i), *ours.path])
        py.verify(tree.leaf_hash(i), tree.root, index=i + 1, size=21)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=40), st.data())
def test_any_tree_matches_the_recursive_reference(leaves, data):
    tree = MerkleTree.from_leaves(leaves)
    assert tree.root == ref_mth(leaves) == merkle_root(leaves)
    i = data.draw(st.integers(0, len(leaves) - 1))
    assert list(tree.prove(i).path) == ref_path(i, leaves)
    m = data.draw(st.integers(1, len(leaves)))
    assert list(tree.prove_consistency(m).path) == ref_subproof(m, leaves, True)


def test_range_root_equals_the_reference_for_every_range():
    leaves = leaves_of(19)
    tree = MerkleTree.from_leaves(leaves)
    for a in range(19):
        for b in range(a + 1, 20):
            assert tree.range_root(a, b) == ref_mth(leaves[a:b])


def test_empty_tree_has_root_sha256_of_nothing_and_no_proofs():
    tree = MerkleTree([])
    assert tree.root == EMPTY_ROOT == hashlib.sha256(b"").digest()
    with pytest.raises(IndexError):
        tree.prove(0)


# ---------------------------------------------------------------------------------------------
# Fast builders


@pytest.mark.parametrize("n_bytes", [0, 1, 255, 256, 257, 256 * 7 + 3, 256 * 64])
def test_chunk_builders_equal_hashing_each_chunk_as_leaf_data(n_bytes):
    buf = bytes(range(256)) * (n_bytes // 256 + 1)
    buf = buf[:n_bytes]
    chunks = [buf[i : i + 256] for i in range(0, n_bytes, 256)]
    assert hash_chunks(buf, 256) == [leaf_hash(c) for c in chunks]
    assert chunked_root(buf, 256) == merkle_root(chunks) == MerkleTree.from_chunks(buf, 256).root


@pytest.mark.parametrize("n_leaves", [(1 << 14) - 1, 1 << 14, (1 << 14) + 1, 2 * (1 << 14) + 5])
def test_blocked_root_is_exact_across_block_boundaries(n_leaves):
    # chunked_root hashes aligned blocks of 2^14 leaves and combines the block roots.
    buf = np.arange(n_leaves * 3, dtype=np.uint8).tobytes()[: n_leaves * 3 - 1]
    expected = merkle_root([buf[i : i + 3] for i in range(0, len(buf), 3)])
    assert chunked_root(buf, 3) == expected
    assert MerkleTree.from_chunks(np.frombuffer(buf, np.uint8), 3).root == expected


def test_chunk_builders_reject_bad_chunk_sizes_and_strided_arrays():
    with pytest.raises(ValueError, match="expected a positive int, got 0"):
        chunked_root(b"abc", 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        hash_chunks(np.zeros((4, 4), np.float32)[:, 1], 4)


# ---------------------------------------------------------------------------------------------
# Inclusion proofs: tampering is rejected


def _tree8() -> tuple[MerkleTree, list[bytes]]:
    leaves = leaves_of(13)
    return MerkleTree.from_leaves(leaves), leaves


def test_inclusion_proof_round_trips_through_json():
    tree, _ = _tree8()
    proof = tree.prove(6)
    obj = proof.to_json()
    assert obj["path"][0].startswith("0x")
    assert InclusionProof.from_json(obj) == proof


@pytest.mark.parametrize(
    "obj",
    [
        {"index": 0, "size": 1},
        {"index": "0", "size": 1, "path": []},
        {"index": True, "size": 1, "path": []},
        {"index": 0, "size": 2, "path": ["ab" * 32]},
        {"index": 0, "size": 2, "path": ["0x" + "ab" * 31]},
        {"index": 0, "size": 2, "path": ["0xzz"]},
        None,
    ],
)
def test_malformed_inclusion_json_raises_invalid_proof(obj):
    with pytest.raises(InvalidProof):
        InclusionProof.from_json(obj)


def test_every_single_bit_flip_in_a_path_is_rejected():
    tree, _ = _tree8()
    for i in range(tree.size):
        proof = tree.prove(i)
        for j, p in enumerate(proof.path):
            bad = bytearray(p)
            bad[j % 32] ^= 0x08
            tampered = InclusionProof(
                i, proof.size, (*proof.path[:j], bytes(bad), *proof.path[j + 1 :])
            )
            with pytest.raises(InvalidProof):
                verify_inclusion(tree.root, tree.leaf_hash(i), tampered)


def test_wrong_position_size_leaf_root_or_path_length_is_rejected():
    tree, leaves = _tree8()
    proof = tree.prove(5)
    leaf, root = tree.leaf_hash(5), tree.root
    verify_inclusion(root, leaf, proof)
    bad_cases = [
        (root, leaf, InclusionProof(4, 13, proof.path)),
        (root, leaf, InclusionProof(6, 13, proof.path)),
        (root, leaf, InclusionProof(5, 8, proof.path)),
        (root, leaf, InclusionProof(5, 26, proof.path)),
        (root, leaf, InclusionProof(5, 13, proof.path[:-1])),
        (root, leaf, InclusionProof(5, 13, (*proof.path, root))),
        (root, leaf, InclusionProof(5, 13, (root, *proof.path))),
        (root, leaf, InclusionProof(13, 13, proof.path)),
        (root, leaf, InclusionProof(-1, 13, proof.path)),
        (root, leaf_hash(leaves[4]), proof),
        (root, leaves[5], proof),  # data instead of its hash
        (EMPTY_ROOT, leaf, proof),
        (root[:31], leaf, proof),
    ]
    for r, lf, p in bad_cases:
        with pytest.raises(InvalidProof):
            verify_inclusion(r, lf, p)
    with pytest.raises(InvalidProof, match="expected index 4"):
        verify_inclusion(root, leaf, proof, index=4)
    with pytest.raises(InvalidProof, match="expected size 12"):
        verify_inclusion(root, leaf, proof, size=12)


def test_tree_size_is_only_bound_when_the_verifier_supplies_it():
    """A path has the same shape for some neighbouring sizes (leaf 5 of 12 and of 13), so the
    verifier must take the size from its own state (K, nOps, nChunks), never from the prover."""
    tree, _ = _tree8()
    proof = tree.prove(5)
    lying = InclusionProof(5, 12, proof.path)
    verify_inclusion(tree.root, tree.leaf_hash(5), lying)  # shape-compatible: accepted alone
    with pytest.raises(InvalidProof, match="expected size 13"):
        verify_inclusion(tree.root, tree.leaf_hash(5), lying, size=13)


def test_invalid_proof_is_a_vtrain_error():
    assert issubclass(InvalidProof, VtrainError)


def test_root_comparison_uses_hmac_compare_digest(monkeypatch):
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(merkle.hmac, "compare_digest", spy)
    tree, _ = _tree8()
    verify_inclusion(tree.root, tree.leaf_hash(0), tree.prove(0))
    assert calls and calls[-1][1] == tree.root


def test_second_preimage_forgery_works_without_prefixes_and_fails_with_them():
    """Why leaves and nodes are prefixed: without 0x00/0x01 an inner node's preimage
    (left || right) can be presented as a leaf of a shorter tree with the same root."""

    def plain_root(level: list[bytes]) -> bytes:  # no prefixes, same shape
        level = [hashlib.sha256(d).digest() for d in level]
        while len(level) > 1:
            nxt = [
                hashlib.sha256(level[i] + level[i + 1]).digest()
                for i in range(0, len(level) - 1, 2)
            ]
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        return level[0]

    a, b, c, d = b"alpha", b"beta", b"gamma", b"delta"
    h = [hashlib.sha256(x).digest() for x in (a, b, c, d)]
    forged = [h[0] + h[1], h[2] + h[3]]  # two "leaves" that are really inner nodes
    assert plain_root([a, b, c, d]) == plain_root(forged)  # the attack succeeds

    tree = MerkleTree.from_leaves([a, b, c, d])
    assert (
        MerkleTree.from_leaves([leaf_hash(a) + leaf_hash(b), leaf_hash(c) + leaf_hash(d)]).root
        != tree.root
    )
    # Nor can the left inner node be proven as a leaf of a 2-leaf tree with the same root:
    inner = node_hash(leaf_hash(a), leaf_hash(b))
    sibling = node_hash(leaf_hash(c), leaf_hash(d))
    assert node_hash(inner, sibling) == tree.root
    with pytest.raises(InvalidProof):
        verify_inclusion(
            tree.root, leaf_hash(leaf_hash(a) + leaf_hash(b)), InclusionProof(0, 2, (sibling,))
        )


# ---------------------------------------------------------------------------------------------
# Consistency proofs


def test_consistency_proofs_verify_for_every_prior_size_up_to_40():
    leaves = leaves_of(40)
    roots = [merkle_root(leaves[:m]) for m in range(41)]
    for n in range(1, 41):
        tree = MerkleTree.from_leaves(leaves[:n])
        for m in range(1, n + 1):
            proof = tree.prove_consistency(m)
            assert list(proof.path) == ref_subproof(m, leaves[:n], True)
            verify_consistency(roots[m], roots[n], proof)


def test_tampered_consistency_proofs_are_rejected():
    leaves = leaves_of(23)
    tree = MerkleTree.from_leaves(leaves)
    prior = merkle_root(leaves[:9])
    proof = tree.prove_consistency(9)
    verify_consistency(prior, tree.root, proof)
    assert ConsistencyProof.from_json(proof.to_json()) == proof
    bad = [
        (prior, tree.root, ConsistencyProof(8, 23, proof.path)),
        (prior, tree.root, ConsistencyProof(9, 16, proof.path)),
        (prior, tree.root, ConsistencyProof(9, 23, proof.path[:-1])),
        (prior, tree.root, ConsistencyProof(9, 23, (*proof.path, prior))),
        (merkle_root(leaves[:8]), tree.root, proof),
        (prior, merkle_root(leaves[:22]), proof),
        (prior, tree.root, ConsistencyProof(0, 23, proof.path)),
        (prior, tree.root, ConsistencyProof(24, 23, proof.path)),
    ]
    for j in range(len(proof.path)):
        flipped = bytearray(proof.path[j])
        flipped[0] ^= 1
        bad.append(
            (
                prior,
                tree.root,
                ConsistencyProof(9, 23, (*proof.path[:j], bytes(flipped), *proof.path[j + 1 :])),
            )
        )
    for p, r, cp in bad:
        with pytest.raises(InvalidProof):
            verify_consistency(p, r, cp)


def test_consistency_of_equal_sizes_needs_equal_roots_and_an_empty_path():
    tree = MerkleTree.from_leaves(leaves_of(6))
    proof = tree.prove_consistency(6)
    assert proof.path == ()
    verify_consistency(tree.root, tree.root, proof)
    with pytest.raises(InvalidProof):
        verify_consistency(EMPTY_ROOT, tree.root, proof)
    with pytest.raises(InvalidProof):
        verify_consistency(tree.root, tree.root, ConsistencyProof(6, 6, (tree.root,)))


def test_leaf_data_must_be_bytes_like_not_ints_or_text():
    assert merkle_root([bytearray(b"ab"), memoryview(b"c")]) == merkle_root([b"ab", b"c"])
    for bad in (5, "ab", None):
        with pytest.raises(TypeError):
            merkle_root([bad])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            MerkleTree.from_leaves([b"x", bad])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"leaf_hashes\[1\]: expected 32 bytes"):
        MerkleTree([bytes(32), bytes(31)])
