"""vtrain.commit.roots: the commitment format of docs/protocol.md, and the shared vectors."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from pymerkle import InmemoryTree

from vtrain.commit import roots as C
from vtrain.commit.merkle import EMPTY_ROOT, InclusionProof, MerkleTree, leaf_hash, verify_inclusion
from vtrain.errors import InvalidProof

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "vectors"


def unhex(s: str) -> bytes:
    assert s.startswith("0x")
    return bytes.fromhex(s[2:])


def load(name: str) -> dict:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def check_proofs(root: bytes, leaves: list[bytes], proofs: list[dict]) -> None:
    assert len(proofs) == len(leaves)
    for i, (data, obj) in enumerate(zip(leaves, proofs, strict=True)):
        proof = InclusionProof.from_json(obj)
        assert (proof.index, proof.size) == (i, len(leaves))
        verify_inclusion(root, leaf_hash(data), proof, index=i, size=len(leaves))


def gen_vectors_module():
    spec = importlib.util.spec_from_file_location(
        "gen_vectors", ROOT / "scripts" / "gen_vectors.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# Shared vectors


def test_regenerating_the_vectors_gives_byte_identical_files(tmp_path):
    gen = gen_vectors_module()
    written = gen.write_vectors(tmp_path)
    assert {p.name for p in written} == {p.name for p in VECTORS.glob("*.json")}
    for path in written:
        assert path.read_bytes() == (VECTORS / path.name).read_bytes(), path.name


def test_merkle_vectors_hold_roots_and_every_audit_path():
    v = load("merkle.json")
    leaves = [unhex(x) for x in v["leaves"]]
    assert [unhex(h) for h in v["leaf_hashes"]] == [leaf_hash(d) for d in leaves]
    assert unhex(v["empty_root"]) == EMPTY_ROOT
    assert [t["size"] for t in v["trees"]] == list(range(1, 34))
    for t in v["trees"]:
        tree = MerkleTree.from_leaves(leaves[: t["size"]])
        assert unhex(t["root"]) == tree.root
        assert [InclusionProof.from_json(p) for p in t["proofs"]] == [
            tree.prove(i) for i in range(tree.size)
        ]
        check_proofs(tree.root, leaves[: t["size"]], t["proofs"])
    for c in v["consistency"]:
        tree = MerkleTree.from_leaves(leaves[: c["size"]])
        assert tree.prove_consistency(c["prior_size"]).to_json() == {
            k: c[k] for k in ("prior_size", "size", "path")
        }
        assert unhex(c["prior_root"]) == MerkleTree.from_leaves(leaves[: c["prior_size"]]).root


def test_tensor_vectors_hold_chunks_roots_and_chunk_proofs():
    v = load("tensor.json")
    assert v["chunk_elems"] == 64
    for t in v["tensors"]:
        arr = np.frombuffer(unhex(t["data"]), dtype="<f4")
        assert arr.size == t["n"]
        chunks = [unhex(c) for c in t["chunks"]]
        assert chunks == [C.chunk_bytes(arr, c) for c in range(C.n_chunks(arr.size))]
        assert b"".join(chunks) == arr.tobytes()
        assert all(len(c) == 256 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 256
        assert unhex(t["root"]) == C.tensor_root(arr) == C.tensor_tree(arr).root
        check_proofs(C.tensor_root(arr), chunks, t["proofs"])


def test_commit_vectors_hold_state_step_interval_and_trace_roots():
    v = load("commit.json")
    comps = [unhex(r) for r in v["state"]["components"]]
    tensors = load("tensor.json")["tensors"]
    assert comps == [unhex(t["root"]) for t in tensors]
    assert unhex(v["state"]["root"]) == C.state_root(comps)
    check_proofs(C.state_root(comps), comps, v["state"]["proofs"])
    for st in v["steps"]:
        leaf = C.step_leaf(st["s"], unhex(st["state_root"]), unhex(st["log_root"]))
        assert unhex(st["leaf"]) == leaf and len(leaf) == 72
        assert C.decode_step_leaf(leaf) == (st["s"], unhex(st["state_root"]), unhex(st["log_root"]))
    k = v["k"]
    for iv in v["intervals"]:
        leaves = [unhex(x) for x in iv["leaves"]]
        assert iv["first_step"] == iv["interval"] * k + 1
        assert [C.decode_step_leaf(x)[0] for x in leaves] == [
            C.interval_position(iv["first_step"] + p, k)[0] * k + p + 1 for p in range(len(leaves))
        ]
        assert unhex(iv["root"]) == C.interval_root(leaves)
        check_proofs(C.interval_root(leaves), leaves, iv["proofs"])
    outs = [unhex(r) for r in v["trace"]["op_output_roots"]]
    assert unhex(v["trace"]["root"]) == C.trace_root(outs)
    check_proofs(C.trace_root(outs), outs, v["trace"]["proofs"])


def test_oplog_vectors_hold_roots_and_membership_and_absence_proofs():
    v = load("oplog.json")
    assert unhex(v["low_leaf"]) == C.LOW_LEAF == bytes(9)
    assert unhex(v["high_leaf"]) == C.HIGH_LEAF == b"\xff" * 4 + bytes(5)
    assert unhex(v["empty_op_log_root"]) == C.EMPTY_OP_LOG_ROOT
    roots = []
    for lg in v["logs"]:
        entries = [C.LogEntry(**e) for e in lg["entries"]]
        assert [unhex(x) for x in lg["leaves"]] == C.op_log_leaves(entries)
        root = unhex(lg["root"])
        assert root == C.op_log_root(entries)
        roots.append(root)
        for q in lg["queries"]:
            proof = C.LogEntryProof.from_json(q)
            assert proof == C.prove_log_entry(entries, q["index"])
            assert proof.is_member == q["member"] == (len(q["leaves"]) == 1)
            found = C.verify_log_entry(root, proof, q["index"])
            if q["member"]:
                assert found == C.LogEntry(**q["entry"])
            else:
                assert found is None and q["entry"] == {
                    "index": q["index"],
                    "code": 0,
                    "value_bits": 0,
                }
                assert q["proofs"][1]["index"] == q["proofs"][0]["index"] + 1
    names = {lg["name"]: lg for lg in v["logs"]}
    assert names["empty"]["root"] == v["empty_op_log_root"]
    queried = {q["index"] for q in names["one"]["queries"]}
    assert 0 in queried and C.MAX_LOG_INDEX in queried  # before the first, after the last entry
    assert unhex(v["step_log"]["root"]) == C.step_log_root(roots)
    check_proofs(C.step_log_root(roots), roots, v["step_log"]["proofs"])


def test_dataset_vectors_hold_the_root_and_the_data_order():
    v = load("dataset.json")
    samples = np.stack([np.frombuffer(unhex(s), dtype="<f4") for s in v["samples"]])
    assert samples.shape == (v["n"], v["l"])
    assert unhex(v["root"]) == C.dataset_root(samples)
    check_proofs(C.dataset_root(samples), [unhex(s) for s in v["samples"]], v["proofs"])
    for q in v["sample_indices"]:
        seed = unhex(q["seed"])
        pre = seed + q["step"].to_bytes(8, "big") + q["row"].to_bytes(4, "big")
        assert unhex(q["digest"]) == hashlib.sha256(pre).digest()
        assert q["index"] == int.from_bytes(unhex(q["digest"]), "big") % q["n_samples"]
        assert q["index"] == C.sample_index(seed, q["step"], q["row"], q["n_samples"])
    b = v["batch"]
    assert b["indices"] == C.batch_indices(unhex(b["seed"]), b["step"], b["batch"], b["n_samples"])


def test_graph_vectors_hold_descriptor_encodings_and_the_graph_root():
    v = load("graph.json")
    encoded = []
    for op in v["ops"]:
        attrs = [int(a) for a in op["attrs"]]
        enc = C.encode_op_descriptor(op["kind"], op["inputs"], op["shape"], op["in_shapes"], attrs)
        assert unhex(op["encoded"]) == enc
        assert C.decode_op_descriptor(enc) == (
            op["kind"],
            op["inputs"],
            op["shape"],
            op["in_shapes"],
            attrs,
        )
        encoded.append(enc)
    assert any(int(a) >= 1 << 255 for op in v["ops"] for a in op["attrs"])  # a full uint256
    assert unhex(v["root"]) == C.graph_root(encoded)
    check_proofs(C.graph_root(encoded), encoded, v["proofs"])


def test_spec_vector_holds_the_canonical_json_and_its_hash():
    v = load("spec.json")
    canonical = unhex(v["canonical_hex"])
    assert canonical == C.canonical_json(v["spec"])
    assert b" " not in canonical.replace("modèle ✓".encode(), b"")
    assert "modèle ✓".encode() in canonical  # UTF-8, not \\u escapes
    assert unhex(v["hash"]) == C.spec_hash(v["spec"]) == hashlib.sha256(canonical).digest()


# ---------------------------------------------------------------------------------------------
# Tensors


def test_tensor_root_is_the_tree_of_64_element_fp32_le_chunks():
    arr = np.arange(130, dtype=np.float32).reshape(2, 65) / 3
    raw = arr.astype("<f4").tobytes()
    chunks = [raw[0:256], raw[256:512], raw[512:520]]
    ref = InmemoryTree()
    for c in chunks:
        ref.append_entry(c)
    assert C.tensor_root(arr) == ref.get_root()
    assert [C.chunk_bytes(arr, c) for c in range(3)] == chunks
    assert C.n_chunks(130) == 3 and C.n_chunks(128) == 2 and C.n_chunks(0) == 0


def test_tensor_root_ignores_shape_byte_order_and_strides():
    arr = np.linspace(-3, 3, 200, dtype=np.float32).reshape(10, 20)
    root = C.tensor_root(arr)
    assert C.tensor_root(arr.reshape(-1)) == root
    assert C.tensor_root(arr.astype(">f4")) == root
    t = np.ascontiguousarray(arr.T)
    assert C.tensor_root(t.T) == root  # a strided view hashes as its row-major copy
    assert C.tensor_root(arr[:, ::2]) == C.tensor_root(np.ascontiguousarray(arr[:, ::2]))


def test_tensor_tree_proves_each_chunk():
    arr = np.arange(300, dtype=np.float32)
    tree = C.tensor_tree(arr)
    assert tree.size == 5 and tree.root == C.tensor_root(arr)
    for c in range(5):
        verify_inclusion(
            tree.root, leaf_hash(C.chunk_bytes(arr, c)), tree.prove(c), index=c, size=5
        )
    with pytest.raises(InvalidProof):
        verify_inclusion(tree.root, leaf_hash(C.chunk_bytes(arr, 1)), tree.prove(2))


def test_tensor_root_of_an_empty_tensor_is_the_empty_root():
    assert C.tensor_root(np.zeros((0, 3), np.float32)) == EMPTY_ROOT


@pytest.mark.parametrize(
    ("arr", "err", "msg"),
    [
        (np.zeros(3, np.float64), TypeError, "expected dtype float32, got float64"),
        (np.zeros(3, np.float16), TypeError, "expected dtype float32, got float16"),
        (np.zeros(3, np.int32), TypeError, "expected dtype float32, got int32"),
        ([1.0, 2.0], TypeError, "expected a numpy float32 array, got list"),
        (np.array([1, np.nan], np.float32), ValueError, "expected finite values, got 1 NaN/Inf"),
        (np.array([np.inf, 0, -np.inf], np.float32), ValueError, "got 2 NaN/Inf"),
    ],
)
def test_tensor_root_rejects_bad_input_with_expected_got_messages(arr, err, msg):
    with pytest.raises(err, match=msg):
        C.tensor_root(arr)


def test_negative_zero_is_hashed_as_is_and_canonical_zero_maps_it_to_plus_zero():
    neg = np.array([1.0, -0.0, 0.0, -2.5], np.float32)
    pos = np.array([1.0, 0.0, 0.0, -2.5], np.float32)
    assert C.tensor_root(neg) != C.tensor_root(pos)
    fixed = C.canonical_zero(neg)
    assert fixed.tobytes() == pos.tobytes()
    assert neg.view(np.uint32)[1] == 0x80000000  # the input is not modified
    odd = np.array([1e-45, -1e-45, np.nan, -np.inf], np.float32)
    assert C.canonical_zero(odd).tobytes() == odd.tobytes()  # subnormals, NaN, Inf untouched


def test_chunk_bytes_rejects_out_of_range_chunks():
    with pytest.raises(ValueError, match=r"expected an int in \[0, 1\], got 2"):
        C.chunk_bytes(np.zeros(65, np.float32), 2)


# ---------------------------------------------------------------------------------------------
# State, steps, intervals


def test_state_step_log_and_trace_roots_are_trees_over_32_byte_roots():
    roots = [hashlib.sha256(bytes([i])).digest() for i in range(5)]
    expected = MerkleTree.from_leaves(roots).root
    assert C.state_root(roots) == C.step_log_root(roots) == C.trace_root(roots) == expected
    assert C.roots_tree(roots).root == expected
    with pytest.raises(ValueError, match=r"component_roots\[1\]: expected 32 bytes, got 31"):
        C.state_root([roots[0], roots[1][:31]])
    with pytest.raises(TypeError, match="expected 32 bytes, got str"):
        C.trace_root(["00" * 32])


def test_step_leaf_is_uint64be_step_then_state_root_then_log_root():
    sr, lr = b"\x11" * 32, b"\x22" * 32
    leaf = C.step_leaf(258, sr, lr)
    assert leaf == (258).to_bytes(8, "big") + sr + lr and len(leaf) == C.STEP_LEAF_SIZE
    assert C.step_leaf(2**64 - 1, sr, lr)[:8] == b"\xff" * 8
    with pytest.raises(ValueError, match=r"s: expected an int in \[1, "):
        C.step_leaf(0, sr, lr)
    with pytest.raises(ValueError, match="log_root: expected 32 bytes, got 33"):
        C.step_leaf(1, sr, lr + b"\x00")
    with pytest.raises(TypeError, match="s: expected an int"):
        C.step_leaf(True, sr, lr)


def test_interval_root_needs_consecutive_steps():
    leaves = [C.step_leaf(s, bytes(32), bytes(32)) for s in (5, 6, 7)]
    assert C.interval_root(leaves) == MerkleTree.from_leaves(leaves).root
    with pytest.raises(ValueError, match=r"step_leaves\[1\]: expected step 6, got 7"):
        C.interval_root([leaves[0], leaves[2]])
    with pytest.raises(ValueError, match="at least one"):
        C.interval_root([])
    assert C.interval_position(1, 4) == (0, 0)
    assert C.interval_position(4, 4) == (0, 3)
    assert C.interval_position(5, 4) == (1, 0)


# ---------------------------------------------------------------------------------------------
# Op logs


def test_op_log_leaves_are_sorted_between_sentinels_with_key_index_plus_one():
    entries = [C.LogEntry(9, 3, 0x3F800000), C.LogEntry(2, 1, 0)]
    leaves = C.op_log_leaves(entries)
    assert leaves == [
        bytes(9),
        (3).to_bytes(4, "big") + b"\x01" + bytes(4),
        (10).to_bytes(4, "big") + b"\x03" + bytes.fromhex("3f800000"),
        b"\xff\xff\xff\xff" + bytes(5),
    ]
    assert (
        C.op_log_root(entries) == MerkleTree.from_leaves(leaves).root == C.op_log_tree(entries).root
    )
    assert (
        C.EMPTY_OP_LOG_ROOT
        == C.op_log_root([])
        == MerkleTree.from_leaves([bytes(9), leaves[-1]]).root
    )


def test_op_log_rejects_duplicates_and_out_of_range_fields():
    with pytest.raises(ValueError, match="expected distinct indices, got 4 twice"):
        C.op_log_root([C.LogEntry(4, 1, 0), C.LogEntry(4, 2, 0)])
    C.LogEntry(C.MAX_LOG_INDEX, 1, 0)
    with pytest.raises(ValueError, match=r"index: expected an int in \[0, 4294967293\]"):
        C.LogEntry(C.MAX_LOG_INDEX + 1, 1, 0)
    with pytest.raises(ValueError, match="code"):
        C.LogEntry(0, 256, 0)
    with pytest.raises(ValueError, match="value_bits"):
        C.LogEntry(0, 3, 1 << 32)
    with pytest.raises(TypeError, match=r"entries\[0\]: expected a LogEntry"):
        C.op_log_root([(1, 1, 0)])  # type: ignore[list-item]


def test_array_fast_path_equals_the_entry_path():
    rng = np.random.default_rng(7)
    idx = np.unique(rng.integers(0, 100_000, size=3000))
    codes = rng.integers(1, 4, size=idx.size)
    vals = np.where(codes == 3, rng.integers(0, 2**32, size=idx.size, dtype=np.uint64), 0)
    entries = [C.LogEntry(int(i), int(c), int(v)) for i, c, v in zip(idx, codes, vals, strict=True)]
    assert C.op_log_root_arrays(idx, codes, vals) == C.op_log_root(entries)
    empty = np.zeros(0, np.int64)
    assert C.op_log_root_arrays(empty, empty, empty) == C.EMPTY_OP_LOG_ROOT
    with pytest.raises(ValueError, match="strictly increasing"):
        C.op_log_root_arrays(np.array([3, 3]), np.array([1, 1]), np.array([0, 0]))


def test_log_entry_proofs_cover_members_gaps_and_both_ends():
    entries = [C.LogEntry(i, 1 + i % 3, i * 7 if i % 3 == 2 else 0) for i in (2, 3, 10, 50)]
    root = C.op_log_root(entries)
    present = {e.index: e for e in entries}
    for index in [0, 1, 2, 3, 4, 9, 10, 11, 49, 50, 51, 10**6, C.MAX_LOG_INDEX]:
        proof = C.prove_log_entry(entries, index)
        assert proof.is_member == (index in present)
        assert C.verify_log_entry(root, proof, index) == present.get(index)
        assert C.LogEntryProof.from_json(json.loads(json.dumps(proof.to_json()))) == proof
    assert C.verify_log_entry(C.EMPTY_OP_LOG_ROOT, C.prove_log_entry([], 5), 5) is None


def test_forged_log_entry_proofs_are_rejected():
    entries = [C.LogEntry(i, 1, 0) for i in (2, 3, 10, 50)]
    root = C.op_log_root(entries)
    tree = C.op_log_tree(entries)
    leaves = C.op_log_leaves(entries)
    member = C.prove_log_entry(entries, 10)
    gap = C.prove_log_entry(entries, 20)  # leaves 3 (key 11) and 4 (key 51)

    def rejects(proof, index, r=root):
        with pytest.raises(InvalidProof):
            C.verify_log_entry(r, proof, index)

    rejects(member, 11)  # asked about another element
    rejects(C.LogEntryProof(11, member.leaves, member.proofs), 11)  # key 11 != 12
    rejects(gap, 21)
    # hiding entry 10 (key 11) behind a non-adjacent pair (positions 2 and 4)
    rejects(C.LogEntryProof(10, (leaves[2], leaves[4]), (tree.prove(2), tree.prove(4))), 10)
    # hiding entry 10 (key 11) behind the adjacent pair that ends or starts at it
    rejects(C.LogEntryProof(10, (leaves[2], leaves[3]), (tree.prove(2), tree.prove(3))), 10)
    rejects(C.LogEntryProof(10, (leaves[3], leaves[4]), (tree.prove(3), tree.prove(4))), 10)
    # adjacent pair that does not bracket the index
    rejects(C.LogEntryProof(20, (leaves[1], leaves[2]), (tree.prove(1), tree.prove(2))), 20)
    # pair given in the wrong order
    rejects(C.LogEntryProof(20, (leaves[4], leaves[3]), (tree.prove(4), tree.prove(3))), 20)
    # a tampered leaf (code changed) no longer verifies
    bad_leaf = member.leaves[0][:4] + b"\x03" + member.leaves[0][5:]
    rejects(C.LogEntryProof(10, (bad_leaf,), member.proofs), 10)
    rejects(member, 10, r=C.EMPTY_OP_LOG_ROOT)
    rejects(C.LogEntryProof(10, (), ()), 10)
    rejects(C.LogEntryProof(10, member.leaves, ()), 10)
    with pytest.raises(InvalidProof):
        C.LogEntryProof.from_json({"index": 1, "leaves": ["00"], "proofs": []})


# ---------------------------------------------------------------------------------------------
# Dataset and data order


def test_dataset_root_is_the_tree_of_sample_rows():
    samples = np.arange(12, dtype=np.float32).reshape(4, 3)
    rows = [r.astype("<f4").tobytes() for r in samples]
    assert (
        C.dataset_root(samples) == MerkleTree.from_leaves(rows).root == C.dataset_tree(samples).root
    )
    with pytest.raises(ValueError, match=r"expected a 2-D \[N, L\] array, got shape \(12,\)"):
        C.dataset_root(samples.reshape(-1))
    with pytest.raises(ValueError, match="N >= 1"):
        C.dataset_root(np.zeros((0, 3), np.float32))


def test_sample_index_is_sha256_of_seed_step_row_mod_n():
    seed = bytes(range(32))
    digest = hashlib.sha256(seed + (7).to_bytes(8, "big") + (3).to_bytes(4, "big")).digest()
    assert C.sample_index(seed, 7, 3, 1797) == int.from_bytes(digest, "big") % 1797
    assert C.batch_indices(seed, 7, 5, 1797) == [C.sample_index(seed, 7, j, 1797) for j in range(5)]
    assert C.batch_indices(seed, 8, 5, 1797) != C.batch_indices(seed, 7, 5, 1797)
    with pytest.raises(ValueError, match="seed: expected 32 bytes"):
        C.sample_index(seed[:31], 7, 3, 10)
    with pytest.raises(ValueError, match="n_samples"):
        C.sample_index(seed, 7, 3, 0)
    with pytest.raises(ValueError, match="row"):
        C.sample_index(seed, 7, 2**32, 10)


# ---------------------------------------------------------------------------------------------
# Graph descriptors and spec


def test_descriptor_is_five_top_level_abi_parameters():
    enc = C.encode_op_descriptor(30, [1, 2], [4, 8], [[4, 16], [8, 16]], [])
    words = [enc[i : i + 32] for i in range(0, len(enc), 32)]
    assert int.from_bytes(words[0], "big") == 30  # kind inline in the head
    assert int.from_bytes(words[1], "big") == 5 * 32  # offset of inputs, right after 5 head words
    # not the single-tuple encoding, which starts with an offset word 0x20
    from eth_abi import encode

    as_tuple = encode(
        ["(uint8,uint32[],uint32[],uint32[][],uint256[])"],
        [(30, [1, 2], [4, 8], [[4, 16], [8, 16]], [])],
    )
    assert as_tuple[32:] == enc and int.from_bytes(as_tuple[:32], "big") == 32
    assert C.decode_op_descriptor(enc) == (30, [1, 2], [4, 8], [[4, 16], [8, 16]], [])


def test_descriptor_encoding_accepts_numpy_ints_and_rejects_bad_fields():
    ref = C.encode_op_descriptor(41, [3], [2, 2], [[2, 2]], [])
    assert (
        C.encode_op_descriptor(np.uint8(41), np.array([3]), (2, 2), [np.array([2, 2])], ()) == ref
    )
    with pytest.raises(ValueError, match="expected one shape per input"):
        C.encode_op_descriptor(41, [3], [2, 2], [], [])
    with pytest.raises(ValueError, match="kind"):
        C.encode_op_descriptor(256, [], [], [], [])
    with pytest.raises(ValueError, match=r"shape\[0\]"):
        C.encode_op_descriptor(41, [], [2**32], [], [])
    with pytest.raises(TypeError, match=r"attrs\[0\]: expected an int"):
        C.encode_op_descriptor(14, [0], [1], [[1]], [0.5])
    with pytest.raises(ValueError, match="canonical"):
        C.decode_op_descriptor(ref + bytes(32))


def test_graph_root_is_the_tree_of_encoded_descriptors():
    descs = [C.encode_op_descriptor(0, [], [3], [], [i]) for i in range(3)]
    assert C.graph_root(descs) == MerkleTree.from_leaves(descs).root == C.graph_tree(descs).root


def test_spec_hash_is_sha256_of_sorted_compact_utf8_json():
    spec = {"b": [1, 2.5], "a": {"z": "é", "y": None}}
    assert C.canonical_json(spec) == '{"a":{"y":null,"z":"é"},"b":[1,2.5]}'.encode()
    assert C.spec_hash(spec) == hashlib.sha256(C.canonical_json(spec)).digest()
    assert C.spec_hash(dict(reversed(list(spec.items())))) == C.spec_hash(spec)
    with pytest.raises(ValueError, match="finite"):
        C.spec_hash({"lr": float("nan")})
    with pytest.raises(TypeError, match="expected a dict"):
        C.spec_hash([1])  # type: ignore[arg-type]
