#!/usr/bin/env python
"""Write the shared commitment test vectors to ``tests/vectors/*.json``.

The Python tests (tests/test_commit.py) and the Solidity tests read the same files; the schema is
documented in tests/vectors/README.md. Output is deterministic: running this again gives
byte-identical files (a test checks it). Merkle trees are cross-checked against pymerkle here.

    .venv/bin/python scripts/gen_vectors.py            # (re)write tests/vectors
    .venv/bin/python scripts/gen_vectors.py --check    # exit 1 if the files are stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vtrain.commit import roots as C  # noqa: E402
from vtrain.commit.merkle import MerkleTree, leaf_hash  # noqa: E402
from vtrain.graph.step_graph import OpKind  # noqa: E402
from vtrain.numerics import exact  # noqa: E402

VECTORS_DIR = ROOT / "tests" / "vectors"


def hx(b: bytes) -> str:
    return "0x" + b.hex()


def label(text: str) -> bytes:
    """A deterministic 32-byte value for placeholders (roots of states, logs, ...)."""
    return hashlib.sha256(b"vtrain-vectors/" + text.encode()).digest()


def check_pymerkle(leaves: list[bytes], tree: MerkleTree) -> None:
    """Assert that pymerkle (1-based) builds the same root and audit paths."""
    from pymerkle import InmemoryTree

    ref = InmemoryTree()
    for d in leaves:
        ref.append_entry(d)
    assert ref.get_root() == tree.root, "root differs from pymerkle"
    for i in range(len(leaves)):
        assert list(ref.prove_inclusion(i + 1).path[1:]) == list(tree.prove(i).path)


def proofs_json(tree: MerkleTree) -> list[dict[str, Any]]:
    return [tree.prove(i).to_json() for i in range(tree.size)]


# ---------------------------------------------------------------------------------------------


def merkle_leaves(n: int) -> list[bytes]:
    """Leaf ``i``: ``uint32be(i)`` repeated ``i % 3`` times (so lengths 0, 4, 8)."""
    return [i.to_bytes(4, "big") * (i % 3) for i in range(n)]


def merkle_vectors() -> dict[str, Any]:
    leaves = merkle_leaves(33)
    trees = []
    for n in range(1, 34):
        tree = MerkleTree.from_leaves(leaves[:n])
        check_pymerkle(leaves[:n], tree)
        trees.append({"size": n, "root": hx(tree.root), "proofs": proofs_json(tree)})
    full = MerkleTree.from_leaves(leaves)
    consistency = []
    for m, n in [
        (1, 1),
        (1, 2),
        (1, 8),
        (2, 5),
        (3, 7),
        (4, 8),
        (6, 8),
        (7, 33),
        (16, 33),
        (32, 33),
    ]:
        later = full if n == 33 else MerkleTree.from_leaves(leaves[:n])
        item = later.prove_consistency(m).to_json()
        item["prior_root"] = hx(MerkleTree.from_leaves(leaves[:m]).root)
        item["root"] = hx(later.root)
        consistency.append(item)
    return {
        "description": "RFC 9162 trees over leaves[:size] for size 1..33; 0-based audit paths",
        "leaves": [hx(d) for d in leaves],
        "leaf_hashes": [hx(leaf_hash(d)) for d in leaves],
        "empty_root": hx(hashlib.sha256(b"").digest()),
        "trees": trees,
        "consistency": consistency,
    }


def tensor_values(n: int) -> np.ndarray:
    """``((37 i) mod 101 - 50) / 8`` as float32, with the smallest subnormal at 1, FP32 max at 2."""
    x = np.arange(n, dtype=np.float64)
    v = (((x * 37) % 101) - 50) / 8
    if n > 2:
        v[1] = float(np.float32(1.401298464324817e-45))
        v[2] = float(np.finfo(np.float32).max)
    return v.astype(np.float32)


def tensor_vectors() -> dict[str, Any]:
    tensors = []
    for n in (1, 63, 64, 65, 130):
        arr = tensor_values(n)
        tree = C.tensor_tree(arr)
        chunks = [C.chunk_bytes(arr, c) for c in range(C.n_chunks(n))]
        check_pymerkle(chunks, tree)
        assert C.tensor_root(arr) == tree.root
        tensors.append(
            {
                "n": n,
                "data": hx(arr.astype("<f4").tobytes()),
                "chunks": [hx(c) for c in chunks],
                "root": hx(tree.root),
                "proofs": proofs_json(tree),
            }
        )
    return {
        "description": "tensor roots: FP32 LE row-major, 64-element chunks per leaf",
        "chunk_elems": C.CHUNK_ELEMS,
        "tensors": tensors,
    }


def commit_vectors() -> dict[str, Any]:
    components = [C.tensor_root(tensor_values(n)) for n in (1, 63, 64, 65, 130)]
    state = MerkleTree.from_leaves(components)
    assert C.state_root(components) == state.root
    steps: list[dict[str, Any]] = []
    step_leaves: list[bytes] = []
    for s in range(1, 7):
        sr, lr = label(f"state/{s}"), label(f"log/{s}")
        step_leaves.append(C.step_leaf(s, sr, lr))
        steps.append(
            {"s": s, "state_root": hx(sr), "log_root": hx(lr), "leaf": hx(C.step_leaf(s, sr, lr))}
        )
    k = 4
    intervals = []
    for i in range(2):
        leaves = step_leaves[i * k : i * k + k]
        tree = C.interval_tree(leaves)
        intervals.append(
            {
                "interval": i,
                "first_step": i * k + 1,
                "leaves": [hx(x) for x in leaves],
                "root": hx(tree.root),
                "proofs": proofs_json(tree),
            }
        )
    outputs = [label(f"op-output/{j}") for j in range(5)]
    trace = MerkleTree.from_leaves(outputs)
    return {
        "description": "state root, step leaves (uint64be(s) || stateRoot || logRoot), "
        "interval roots (K=4, N=6), trace root",
        "state": {
            "components": [hx(r) for r in components],
            "root": hx(state.root),
            "proofs": proofs_json(state),
        },
        "k": k,
        "steps": steps,
        "intervals": intervals,
        "trace": {
            "op_output_roots": [hx(r) for r in outputs],
            "root": hx(C.trace_root(outputs)),
            "proofs": proofs_json(trace),
        },
    }


OP_LOGS: dict[str, list[C.LogEntry]] = {
    "empty": [],
    "one": [C.LogEntry(7, 1, 0)],
    "five": [
        C.LogEntry(0, 2, 0),
        C.LogEntry(3, 1, 0),
        C.LogEntry(4, 3, 0x3F800000),
        C.LogEntry(100, 3, 0xBF000001),
        C.LogEntry(C.MAX_LOG_INDEX, 2, 0),
    ],
}
OP_LOG_QUERIES: dict[str, list[int]] = {
    "empty": [0, 1, 1000, C.MAX_LOG_INDEX],
    "one": [0, 6, 7, 8, C.MAX_LOG_INDEX],
    "five": [0, 1, 3, 4, 5, 99, 100, 101, C.MAX_LOG_INDEX - 1, C.MAX_LOG_INDEX],
}


def entry_json(e: C.LogEntry) -> dict[str, int]:
    return {"index": e.index, "code": e.code, "value_bits": e.value_bits}


def oplog_vectors() -> dict[str, Any]:
    logs = []
    roots = []
    for name, entries in OP_LOGS.items():
        leaves = C.op_log_leaves(entries)
        tree = C.op_log_tree(entries)
        check_pymerkle(leaves, tree)
        roots.append(tree.root)
        queries = []
        for index in OP_LOG_QUERIES[name]:
            proof = C.prove_log_entry(entries, index)
            found = C.verify_log_entry(tree.root, proof, index)
            # An absent entry reads as code 0 (none) with value 0, as the contract sees it.
            shown = found if found is not None else C.LogEntry(index, 0, 0)
            queries.append(
                {**proof.to_json(), "member": found is not None, "entry": entry_json(shown)}
            )
        logs.append(
            {
                "name": name,
                "entries": [entry_json(e) for e in entries],
                "leaves": [hx(x) for x in leaves],
                "root": hx(tree.root),
                "queries": queries,
            }
        )
    step_log = MerkleTree.from_leaves(roots)
    return {
        "description": "op rounding logs: leaves [LOW, entries..., HIGH], "
        "uint32be(index+1) || uint8(code) || uint32be(valueBits); membership proofs have one "
        "leaf, absence proofs two adjacent leaves",
        "low_leaf": hx(C.LOW_LEAF),
        "high_leaf": hx(C.HIGH_LEAF),
        "empty_op_log_root": hx(C.EMPTY_OP_LOG_ROOT),
        "logs": logs,
        "step_log": {
            "op_log_roots": [hx(r) for r in roots],
            "root": hx(C.step_log_root(roots)),
            "proofs": proofs_json(step_log),
        },
    }


def dataset_vectors() -> dict[str, Any]:
    samples = (np.arange(15, dtype=np.float32).reshape(5, 3) - 7) / 4
    tree = C.dataset_tree(samples)
    assert C.dataset_root(samples) == tree.root
    queries = []
    for seed_text, step, row, n in [
        ("zero", 1, 0, 5),
        ("zero", 1, 1, 5),
        ("zero", 2, 0, 5),
        ("seed-a", 1, 0, 1797),
        ("seed-a", 12345, 15, 1797),
        ("seed-a", 2**64 - 1, 2**32 - 1, 1000003),
    ]:
        seed = bytes(32) if seed_text == "zero" else label(seed_text)
        pre = seed + step.to_bytes(8, "big") + row.to_bytes(4, "big")
        queries.append(
            {
                "seed": hx(seed),
                "step": step,
                "row": row,
                "n_samples": n,
                "digest": hx(hashlib.sha256(pre).digest()),
                "index": C.sample_index(seed, step, row, n),
            }
        )
    seed = label("seed-a")
    return {
        "description": "dataset root (leaf i = FP32 LE bytes of sample i) and data order "
        "idx = uint256(sha256(seed || uint64be(step) || uint32be(row))) mod n",
        "n": int(samples.shape[0]),
        "l": int(samples.shape[1]),
        "samples": [hx(r.astype("<f4").tobytes()) for r in samples],
        "root": hx(tree.root),
        "proofs": proofs_json(tree),
        "sample_indices": queries,
        "batch": {
            "seed": hx(seed),
            "step": 3,
            "batch": 8,
            "n_samples": 1797,
            "indices": C.batch_indices(seed, 3, 8, 1797),
        },
    }


def graph_vectors() -> dict[str, Any]:
    # A tiny graph: y = relu(x @ w^T + b) * 0.5, bound to state slots; a CONST with a root attr.
    ops: list[tuple[int, list[int], list[int], list[list[int]], list[int]]] = [
        (2, [], [4, 3], [], []),  # DATA
        (0, [], [2, 3], [], [0]),  # INPUT slot 0 (w)
        (0, [], [2], [], [1]),  # INPUT slot 1 (b)
        (30, [0, 1, 2], [4, 2], [[4, 3], [2, 3], [2]], []),  # MATMUL with bias
        (41, [3], [4, 2], [[4, 2]], []),  # RELU
        (15, [4], [4, 2], [[4, 2]], [0x3F000000]),  # MUL_S 0.5
        (3, [], [2], [], [int.from_bytes(label("const"), "big")]),  # CONST root
        (1, [1], [2, 3], [[2, 3]], [0]),  # OUTPUT slot 0
    ]
    encoded = [C.encode_op_descriptor(*op) for op in ops]
    tree = C.graph_tree(encoded)
    check_pymerkle(encoded, tree)
    return {
        "description": "op descriptors abi.encode(uint8 kind, uint32[] inputs, uint32[] shape, "
        "uint32[][] inShapes, uint256[] attrs) (five top-level parameters) and the graph root; "
        "attrs are decimal strings (uint256)",
        "ops": [
            {
                "kind": k,
                "inputs": i,
                "shape": s,
                "in_shapes": ins,
                "attrs": [str(a) for a in attrs],
                "encoded": hx(e),
            }
            for (k, i, s, ins, attrs), e in zip(ops, encoded, strict=True)
        ],
        "root": hx(tree.root),
        "proofs": proofs_json(tree),
    }


def new_kind_cases() -> list[tuple[str, Any, list[np.ndarray], int]]:
    """``(name, descriptor, inputs, step)`` of the ops.json cases (issue 13's op kinds, and CONCAT)."""
    from vtrain.graph.step_graph import OpKind as K

    x = (np.arange(10, dtype=np.float32).reshape(2, 5) - 4.5) / 4
    table = np.array([[-1, 0, 1], [1, 2, 3], [3, 4, -1]], np.float32)  # conv taps, -1 pads
    wte = (np.arange(12, dtype=np.float32).reshape(4, 3) - 6) / 8
    tokens = np.array([[3, 0, -0.0], [4, 1.5, 2]], np.float32)  # 4 and 1.5 invalid, -0 is 0
    cond = np.array([[0.0], [-0.0], [2.0**-149]], np.float32)
    a = np.array([[1.0, 2.0]], np.float32)
    b = np.array([[-1.0, -2.0]], np.float32)
    mx = np.array([[1.0, 3.0, 3.0], [-0.0, 0.0, -1.0]], np.float32)  # ties: the first maximum
    g = np.array([[0.25], [-2.0]], np.float32)
    half = (1 << 31, 0x40000000, 5)  # p = 0.5, scale 2.0, salt 5
    cc = (np.array([[1.5, -0.0], [2.0**-149, -3.0]], np.float32), np.array([7.0], np.float32),
          np.array([0.0, -2.5, 3.0e38], np.float32))  # CONCAT: flattened parameters, one after another
    return [
        ("take_patch_gather", (K.TAKE, (0, 1), (2, 3, 3), ((2, 5), (3, 3)), (1,)), [x, table], 7),
        ("take_embedding", (K.TAKE, (0, 1), (2, 3, 3), ((4, 3), (2, 3)), (0,)), [wte, tokens], 7),
        ("select_mask", (K.SELECT, (0, 1, 2), (3, 2), ((3, 1), (1, 2), (1, 2)), ()), [cond, a, b], 7),
        ("max_grad_ties", (K.MAX_GRAD, (0, 1), (2, 3), ((2, 3), (2, 1)), ()), [mx, g], 7),
        ("dropout_half", (K.DROPOUT_MASK, (), (2, 4), (), half), [], 7),
        ("concat_flat", (K.CONCAT, (0, 1, 2), (8,), ((2, 2), (1,), (3,)), ()), [cc[0], cc[1], cc[2]], 7),
        ("step_7", (K.STEP, (), (1,), (), ()), [], 7),
        ("step_tie", (K.STEP, (), (1,), (), ()), [], 2**24 + 3),
    ]


def ops_vectors() -> dict[str, Any]:
    from protocol.proofs import build_element_proof
    from vtrain.numerics import exact as X

    seed = label("seed-a")
    cases = []
    for name, desc, inputs, step in new_kind_cases():
        d = X.OpDesc.of(desc)
        ctx = X.DataContext(None, seed, step)
        n = int(np.prod(d.shape))
        elements = []
        for i in range(n):
            v = X.rn32(X.exact_value(d, inputs, i, ctx))
            elements.append(
                {
                    "index": i,
                    "value_bits": v,
                    "reads": [[r.input, r.start, r.length] for r in X.reads(d, inputs, i, ctx)],
                    "proof": hx(build_element_proof(d.encode(), inputs, i, [], None, seed, step)),
                }
            )
        cases.append(
            {
                "name": name,
                "descriptor": hx(d.encode()),
                "inputs": [hx(np.ascontiguousarray(t, dtype="<f4").tobytes()) for t in inputs],
                "input_roots": [hx(C.tensor_root(t)) for t in inputs],
                "step": step,
                "elements": elements,
            }
        )
    return {
        "description": "one-step rulings of the op kinds TAKE SELECT MAX_GRAD DROPOUT_MASK STEP CONCAT: for every "
        "output element its value (RN32 of the exact value; a claim of it stands, its FP32 neighbours do "
        "not, with the empty op log), the reads (input, start, length) and the Adjudicator proof "
        "abi.encode(Opening[], LogOpening) against the empty op log",
        "seed": hx(seed),
        "empty_op_log_root": hx(C.op_log_root([])),
        "cases": cases,
    }


def spec_vectors() -> dict[str, Any]:
    spec = {
        "model": "mlp",
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.0},
        "batch_size": 16,
        "steps": 8,
        "interval": 4,
        "seed": 0,
        "mode": "certified",
        "note": "modèle ✓",
        "dataset_root": hx(label("dataset")),
        "graph_root": hx(label("graph")),
    }
    canonical = C.canonical_json(spec)
    return {
        "description": "spec hash = sha256(canonical JSON: sorted keys, no spaces, UTF-8)",
        "spec": spec,
        "canonical_hex": hx(canonical),
        "hash": hx(C.spec_hash(spec)),
    }


def judge_before_exact_rule(enc: Any, claimed: int, code: int, value: int) -> bool:
    """The contract's rule before every claim had to be ``RN32(e)`` (kept to show what changed):
    down/up passed on the midpoint checks alone, explicit anywhere in ``[RN32(lo - 4dc), RN32(hi + 4dc)]``."""
    X = exact
    if not X.is_finite(claimed) or claimed == X.SIGN:
        return False
    lo, hi, dc = enc.bounds
    if code == X.NONE:
        return X.rn32(lo, True) == claimed and X.rn32(hi, True) == claimed
    if code in (X.DOWN, X.UP):
        m, sp = X.midpoint(claimed, code == X.DOWN)
        return 16 * dc <= sp and lo - 4 * dc <= m <= hi + 4 * dc
    if code == X.EXPLICIT:
        c = X.to_ordered(claimed)
        win = X.to_ordered(X.rn32(lo - 4 * dc, True)) <= c <= X.to_ordered(X.rn32(hi + 4 * dc, True))
        return claimed == value and win
    return False


def rule_cases() -> list[tuple[str, Any, int, int, int]]:
    """``(name, enclosure, claimed, code, value)`` of rule.json, from real ops' enclosures."""
    X, K = exact, OpKind
    D = X.OpDesc

    def up(b: int, k: int = 1) -> int:
        return X.from_ordered(X.to_ordered(b) + k)

    def f32(*xs: float) -> np.ndarray:
        return np.array([xs], dtype=np.float32)

    def sum_enc(*xs: float) -> Any:
        return X.enclosure(D(K.SUM, (0,), (1, 1), ((1, len(xs)),), ()), [f32(*xs)], 0)

    tie_down = sum_enc(2.0**24, 1.0)  # e = 2^24 + 1: the midpoint of 2^24 and 2^24 + 2; RN32(e) = 2^24
    tie_up = sum_enc(2.0**24, 3.0)  # e = 2^24 + 3: RN32(e) = 2^24 + 4 (ties to even)
    small = sum_enc(1.0, -1.0, 2.0**-30)  # e = 2^-30, cancelling: the old window held ~40 values
    zero = sum_enc(1.0, -1.0)  # e = 0: the old window held every value within 4dc ~ 2^-49 of 0
    e24, e24p4 = X.bits_of(2.0**24), X.bits_of(2.0**24 + 4)
    c30 = X.bits_of(2.0**-30)
    xs = (np.arange(16, dtype=np.float32).reshape(1, 16) - 7.3).astype(np.float32)
    exp_enc = X.enclosure(D(K.EXP, (0,), (1, 16), ((1, 16),), ()), [xs], 3)
    c_exp = X.rn32(exp_enc.bounds[0])
    div_enc = X.enclosure(D(K.DIV, (0, 1), (1, 1), ((1, 1), (1, 1)), ()), [f32(1.0), f32(3.0)], 0)
    c_div = X.rn32(div_enc.bounds[0])
    N, DN, UP, EX = X.NONE, X.DOWN, X.UP, X.EXPLICIT
    fmax = float(np.finfo(np.float32).max)
    b_fmax, b_inf = X.bits_of(fmax), X.POS_INF
    # next to the overflow threshold 2^128 - 2^103 (the midpoint of FLT_MAX and the virtual 2^128)
    below = sum_enc(fmax, 2.0**103 - 2.0**80, 2.0**80 - 2.0**76, 1.0)  # e = 2^128 - 2^103 - 2^76 + 1
    above = sum_enc(fmax, 2.0**103, 2.0**50)  # e = 2^128 - 2^103 + 2^50: RN32(e) overflows
    below_neg = sum_enc(-fmax, -(2.0**103 - 2.0**80), -(2.0**80 - 2.0**76), -1.0)
    edge = [
        ("near overflow: none FLT_MAX", below, b_fmax, N, 0),
        ("near overflow: down FLT_MAX", below, b_fmax, DN, 0),
        ("near overflow: explicit FLT_MAX", below, b_fmax, EX, b_fmax),
        ("near overflow: up (the virtual 2^128)", below, b_inf, UP, 0),
        ("near overflow: explicit FLT_MAX - 1 ulp", below, up(b_fmax, -1), EX, up(b_fmax, -1)),
        ("near overflow, negative: up -FLT_MAX", below_neg, b_fmax | X.SIGN, UP, 0),
        ("near overflow, negative: down -FLT_MAX (wrong code)", below_neg, b_fmax | X.SIGN, DN, 0),
        ("past overflow: none FLT_MAX", above, b_fmax, N, 0),
        ("past overflow: down FLT_MAX", above, b_fmax, DN, 0),
        ("past overflow: explicit FLT_MAX", above, b_fmax, EX, b_fmax),
        ("zero: none -0", zero, X.SIGN, N, 0),
        ("zero: explicit -0", zero, X.SIGN, EX, X.SIGN),
    ]
    return [
        ("tie down: none", tie_down, e24, N, 0),
        ("tie down: down, RN32(e)", tie_down, e24, DN, 0),
        ("tie down: wrong side (up, 2^24 + 2)", tie_down, up(e24), UP, 0),
        ("tie down: explicit RN32(e)", tie_down, e24, EX, e24),
        ("tie down: explicit 2^24 + 2 (in the old window)", tie_down, up(e24), EX, up(e24)),
        ("tie up: up, RN32(e)", tie_up, e24p4, UP, 0),
        ("tie up: wrong side (down, 2^24 + 2)", tie_up, up(e24p4, -1), DN, 0),
        ("tie up: explicit 2^24 + 2 (in the old window)", tie_up, up(e24p4, -1), EX, up(e24p4, -1)),
        ("cancelling: explicit RN32(e)", small, c30, EX, c30),
        ("cancelling: explicit 1 ulp above (in the old window)", small, up(c30), EX, up(c30)),
        ("cancelling: explicit 16 ulps below (in the old window)", small, up(c30, -16), EX, up(c30, -16)),
        ("cancelling: explicit 2^20 ulps above (outside every window)", small, up(c30, 1 << 20), EX, up(c30, 1 << 20)),
        ("cancelling: explicit value differs from the claim", small, c30, EX, up(c30)),
        ("zero: explicit +0", zero, 0, EX, 0),
        ("zero: explicit 2^-60 (in the old window)", zero, X.bits_of(2.0**-60), EX, X.bits_of(2.0**-60)),
        ("zero: explicit -2^-60 (in the old window)", zero, X.bits_of(-(2.0**-60)), EX, X.bits_of(-(2.0**-60))),
        ("exp: none RN32(e)", exp_enc, c_exp, N, 0),
        ("exp: explicit RN32(e)", exp_enc, c_exp, EX, c_exp),
        ("exp: explicit neighbour", exp_enc, up(c_exp), EX, up(c_exp)),
        ("div 1/3: explicit RN32(e)", div_enc, c_div, EX, c_div),
        ("div 1/3: down on an exact op", div_enc, c_div, DN, 0),
    ] + edge


def rule_vectors() -> dict[str, Any]:
    def enc_json(e: Any) -> dict[str, Any]:
        return {"lo": str(e.lo), "hi": str(e.hi), "dc": str(e.dc), "exp": e.exp, "den": str(e.den)}

    cases = []
    for name, enc, claimed, code, value in rule_cases():
        cases.append({
            "name": name,
            "enclosure": enc_json(enc),
            "claimed": claimed,
            "code": code,
            "value": value,
            "stands": exact.judge(enc, claimed, code, value),
            "stood_before": judge_before_exact_rule(enc, claimed, code, value),
        })
    return {
        "description": "RoundingRule.judge: enclosure (integers in the unit 2^exp / den), claimed FP32 bits, "
        "log code, entry value; stands = the rule (every claim must be RN32(e)); stood_before = the rule "
        "before that (down/up on the midpoint checks alone, explicit in [RN32(lo - 4dc), RN32(hi + 4dc)])",
        "cases": cases,
    }


def wide_cases() -> list[tuple[str, Any, list[np.ndarray], int, int]]:
    """``(name, descriptor, inputs, index, wrong bits)`` of wide.json: MATMUL/SUM/MEAN elements whose
    terms span more than 2^72, with ``e`` within the first pass's width of an FP32 midpoint (or, when
    cancelling, many values in its window); ``wrong`` is a value the first-pass enclosure upheld."""
    from vtrain.graph.step_graph import OpKind as K

    def row(*xs: float) -> np.ndarray:
        return np.array([xs], dtype=np.float32)

    def wrong_of(desc: Any, inputs: list[np.ndarray], i: int, pick: int = 0) -> int:
        enc = exact.enclosure(desc, inputs, i)
        lo, hi, _ = enc.bounds
        r_lo, r_hi = exact.rn32(lo), exact.rn32(hi)
        assert r_lo != r_hi, "the first pass must leave a midpoint inside [lo, hi]"
        cands = [r for r in (r_lo, r_hi) if r != enc.rounded]
        return cands[pick] if pick < len(cands) else exact.from_ordered(exact.to_ordered(r_lo) + pick)

    t = 2.0**-100
    out: list[tuple[str, Any, list[np.ndarray], int, int]] = []
    specs: list[tuple[str, Any, list[np.ndarray], int]] = [
        ("SUM 2^24 + 1 + 2^-100 (RN32 = 2^24 + 2; 2^24 stood)", (K.SUM, (0,), (1, 1), ((1, 3),), ()),
         [row(2.0**24, 1.0, t)], 0),
        ("SUM 2^24 + 3 - 2^-100 (RN32 = 2^24 + 2; 2^24 + 4 stood)", (K.SUM, (0,), (1, 1), ((1, 3),), ()),
         [row(2.0**24, 3.0, -t)], 0),
        ("SUM 2^24 + 1 + 1.5 * 2^-95 - 2^-96 (a floored negative term: its rest holds a whole quantum; "
         "RN32 = 2^24 + 2; 2^24 stood)", (K.SUM, (0,), (1, 1), ((1, 4),), ()),
         [row(2.0**24, 1.0, 1.5 * 2.0**-95, -(2.0**-96))], 0),
        ("MEAN (2^26 + 4 + 2^-98) / 4 (RN32 = 2^24 + 2; 2^24 stood)", (K.MEAN, (0,), (2, 1), ((2, 4),), ()),
         [np.array([[1.0, 2.0, 3.0, 4.0], [2.0**26, 4.0, 2.0**-98, 0.0]], np.float32)], 1),
        ("MATMUL 2^24 + 1 + 2^-50 * 2^-50 (+bias 0; RN32 = 2^24 + 2; 2^24 stood)",
         (K.MATMUL, (0, 1, 2), (1, 2), ((1, 3), (2, 3), (2,)), ()),
         [row(2.0**24, 1.0, 2.0**-50), np.array([[1.0, 1.0, 2.0**-50], [0.5, 0.25, 1.0]], np.float32),
          np.array([0.0, 1.0], np.float32)], 0),
        ("SUM 2^100 - 2^100 + 3 * 2^-23 cancelling (every value in [0, 2^-18] stood)",
         (K.SUM, (0,), (1, 1), ((1, 3),), ()), [row(2.0**100, -(2.0**100), 3 * 2.0**-23)], 0),
    ]
    for name, desc, inputs, i in specs:
        d = exact.OpDesc.of(desc)
        out.append((name, d, inputs, i, wrong_of(d, inputs, i)))
    return out


def wide_vectors() -> dict[str, Any]:
    from protocol.proofs import build_element_proof

    cases = []
    for name, d, inputs, i, wrong in wide_cases():
        enc = exact.enclosure(d, inputs, i)
        right = exact.rn32(exact.exact_value(d, inputs, i))
        stands = {}
        for code in (exact.NONE, exact.DOWN, exact.UP, exact.EXPLICIT):
            entry = C.LogEntry(i, code, right) if code else None
            stands[str(code)] = exact.judge_element(d, inputs, i, right, entry)
        explicit = [C.LogEntry(i, exact.EXPLICIT, right)]
        cases.append({
            "name": name,
            "descriptor": hx(d.encode()),
            "inputs": [hx(np.ascontiguousarray(t, dtype="<f4").tobytes()) for t in inputs],
            "input_roots": [hx(C.tensor_root(t)) for t in inputs],
            "index": i,
            "enclosure": {"lo": str(enc.lo), "hi": str(enc.hi), "dc": str(enc.dc), "exp": enc.exp, "den": str(enc.den)},
            "value_bits": right,
            "wrong_bits": wrong,
            "stands": stands,
            "wrong_stood_before": judge_before_exact_rule(enc, wrong, exact.EXPLICIT, wrong),
            "proof_explicit": hx(build_element_proof(d.encode(), inputs, i, explicit, None, bytes(32), 1)),
        })
    return {
        "description": "wide-span MATMUL/SUM/MEAN elements (terms spanning more than 2^72): the first-pass "
        "enclosure (ExactSum.accumulate, integers in the unit 2^exp / den) rounds to two values at its ends; "
        "value_bits = RN32(e), the only value that stands (ExactSum.roundExact); wrong_bits a value the first "
        "pass upheld with an explicit entry (wrong_stood_before, the rule before); stands[code] = whether "
        "value_bits stands under log code 0..3; proof_explicit = the Adjudicator proof of value_bits with its "
        "explicit entry (step 1, zero seed, no dataset)",
        "cases": cases,
    }


def nonfinite_cases() -> list[tuple[str, Any, list[np.ndarray], int]]:
    """``(name, descriptor, inputs, index)`` of nonfinite.json: elements whose exact value is
    undefined or rounds past FLT_MAX (and, as controls, neighbours that round to a finite value)."""
    from vtrain.graph.step_graph import OpKind as K

    fmax = float(np.finfo(np.float32).max)

    def f32(*xs: float) -> np.ndarray:
        return np.array(xs, np.float32)

    def unary(kind: K, x: float, attrs: tuple = ()) -> tuple[Any, list[np.ndarray], int]:
        return (kind, (0,), (1,), ((1,),), attrs), [f32(x)], 0

    def binary(kind: K, a: float, b: float) -> tuple[Any, list[np.ndarray], int]:
        return (kind, (0, 1), (1,), ((1,), (1,)), ()), [f32(a), f32(b)], 0

    def row_sum(*xs: float) -> tuple[Any, list[np.ndarray], int]:
        return (K.SUM, (0,), (1, 1), ((1, len(xs)),), ()), [np.array([xs], np.float32)], 0

    def dot(a: list[float], b: list[float], bias: float) -> tuple[Any, list[np.ndarray], int]:
        n = len(a)
        return (K.MATMUL, (0, 1, 2), (1, 1), ((1, n), (1, n), (1,)), ()), [f32(*a)[None], f32(*b)[None], f32(bias)], 0

    ten = int(np.array(1e10, np.float32).view(np.uint32))
    cases = [
        ("sum past the threshold (e = B + 2^50)", *row_sum(fmax, 2.0**103, 2.0**50)),
        ("sum on the threshold (ties to inf)", *row_sum(fmax, 2.0**103, 1.0, -1.0)),
        ("sum below the threshold (control: FLT_MAX)", *row_sum(fmax, 2.0**103, -(2.0**50))),
        ("exp overflow, enclosed (88.75)", *unary(K.EXP, 88.75)),
        ("exp undefined (x >= 89)", *unary(K.EXP, 100.0)),
        ("exp below overflow (control: 88.5)", *unary(K.EXP, 88.5)),
        ("div by zero", *binary(K.DIV, 1.0, 0.0)),
        ("div zero by zero", *binary(K.DIV, 0.0, 0.0)),
        ("div overflow", *binary(K.DIV, 1e30, 1e-30)),
        ("log of zero", *unary(K.LOG, 0.0)),
        ("log of a negative", *unary(K.LOG, -1.0)),
        ("sqrt of a negative", *unary(K.SQRT, -4.0)),
        ("mul overflow", *binary(K.MUL, 1e20, -1e20)),
        ("add overflow", *binary(K.ADD, fmax, fmax)),
        ("mul_s overflow", *unary(K.MUL_S, 1e30, (ten,))),
        ("sub overflow", *binary(K.SUB, -fmax, fmax)),
        ("matmul of FLT_MAX products", *dot([fmax, fmax], [fmax, -1.0], 1.0)),
        ("matmul past the threshold (8e38)", *dot([2e19, 2e19], [2e19, 2e19], 0.0)),
        ("matmul below it (control: 2e38)", *dot([1e19, 1e19], [1e19, 1e19], 0.0)),
    ]
    return [(name, desc, inputs, index) for name, desc, inputs, index in cases]


def nonfinite_vectors() -> dict[str, Any]:
    from protocol.proofs import build_element_proof

    fmax = int(np.array(np.finfo(np.float32).max, np.float32).view(np.uint32))
    cases = []
    for name, desc, inputs, i in nonfinite_cases():
        d = exact.OpDesc.of(desc)
        enc = exact.enclosure(d, inputs, i)
        none = exact.has_no_finite_value(enc)
        claims_of = [(fmax, exact.NONE, 0), (fmax, exact.DOWN, 0), (fmax, exact.EXPLICIT, fmax),
                     (fmax | exact.SIGN, exact.NONE, 0), (0, exact.NONE, 0), (exact.POS_INF, exact.NONE, 0)]
        if not none:
            right = exact.rn32(exact.exact_value(d, inputs, i))
            claims_of = [(right, exact.NONE, 0), (right, exact.EXPLICIT, right), *claims_of]
        claims = []
        for bits, code, value in dict.fromkeys(claims_of):
            entries = [C.LogEntry(i, code, value)] if code else []
            claims.append({
                "bits": bits, "code": code, "value": value,
                "stands": exact.judge_element(d, inputs, i, bits, entries[0] if entries else None),
                "proof": hx(build_element_proof(d.encode(), inputs, i, entries, None, bytes(32), 1)),
            })
        cases.append({
            "name": name,
            "descriptor": hx(d.encode()),
            "inputs": [hx(np.ascontiguousarray(t, dtype="<f4").tobytes()) for t in inputs],
            "in_shapes": [list(t.shape) for t in inputs],
            "input_roots": [hx(C.tensor_root(t)) for t in inputs],
            "index": i,
            "no_finite_value": none,
            "claims": claims,
        })
    return {
        "description": "elements with no finite FP32 value (the exact value undefined, or RN32(e) past FLT_MAX at "
        "both ends of the contract's enclosure: no_finite_value), and finite controls: for each claim (bits, log "
        "code, entry value) whether it stands under the rule (Adjudicator.adjudicate = exact.judge_element; no "
        "finite claim stands where no_finite_value, and the ruling never reverts there) and its proof "
        "abi.encode(Opening[], LogOpening) (step 1, zero seed, no dataset)",
        "cases": cases,
    }


def erf_inputs() -> list[tuple[str, int]]:
    """``(name, FP32 bits)`` of erf.json: zeros, subnormals, tiny values, the ordinary range, the
    FP32 rounds-to-1 threshold (3.92), the series' last inputs and the saturation threshold (6),
    large values, and the non-finite patterns the contract rejects."""
    fmax = 0x7F7FFFFF

    def b(x: float) -> int:
        return exact.bits_of(x)

    named = [
        ("+0", 0), ("-0", exact.SIGN), ("smallest subnormal", 1), ("-smallest subnormal", exact.SIGN | 1),
        ("largest subnormal", 0x007FFFFF), ("smallest normal", 0x00800000), ("tiny 1e-30", b(1e-30)),
        ("-tiny 3e-20", b(-3e-20)), ("2^-12", b(2.0**-12)), ("0.1", b(0.1)), ("0.5", b(0.5)), ("-0.5", b(-0.5)),
        ("1", b(1.0)), ("-1", b(-1.0)), ("1/sqrt(2) (FP32)", b(2.0**-0.5)), ("2.5", b(2.5)), ("-2.5", b(-2.5)),
        ("3.9", b(3.9)), ("3.92 (below the rounds-to-1 threshold)", b(3.9192)),
        ("3.925 (above it)", b(3.925)), ("4", b(4.0)), ("-4", b(-4.0)),
        ("largest below 6 (the series' largest input)", exact.neighbour(b(6.0), False)),
        ("6 (saturated)", b(6.0)), ("-6 (saturated)", b(-6.0)), ("just above 6", exact.neighbour(b(6.0), True)),
        ("10", b(10.0)), ("-1e10", b(-1e10)), ("FLT_MAX", fmax), ("-FLT_MAX", fmax | exact.SIGN),
        ("+inf", exact.POS_INF), ("-inf", exact.POS_INF | exact.SIGN), ("NaN", 0x7FC00000),
    ]
    rng = np.random.default_rng(2024)
    named += [(f"random {i}", b(float(x))) for i, x in enumerate(rng.uniform(-6.5, 6.5, 12))]
    return named


def erf_vectors() -> dict[str, Any]:
    import mpmath

    from vtrain.numerics import transcendental

    cases = []
    for name, bits in erf_inputs():
        case: dict[str, Any] = {"name": name, "bits": bits, "finite": exact.is_finite(bits)}
        if case["finite"]:
            lo, hi, dc, e, den = transcendental.enclose_erf(bits)
            x = exact.value_of(bits)
            with mpmath.workprec(400):
                y = mpmath.erf(mpmath.mpf(x.numerator) / x.denominator)
                sign, man, ex, _ = y._mpf_
            ref = Fraction(0) if man == 0 else Fraction(-int(man) if sign else int(man)) * Fraction(2) ** int(ex)
            rn = exact.rn32(ref)
            enc = exact.Enclosure(lo, hi, dc, e, den)
            case["enclosure"] = {"lo": str(lo), "hi": str(hi), "dc": str(dc), "exp": e, "den": str(den)}
            case["rn32"] = rn
            case["claims"] = [
                {"bits": c, "code": exact.NONE, "value": 0, "stands": exact.judge(enc, c, exact.NONE, 0)}
                for c in dict.fromkeys([rn, exact.neighbour(rn, True), exact.neighbour(rn, False)])
            ]
        cases.append(case)
    return {
        "description": "ERF (op kind 24): for FP32 bits, the contract's enclosure of erf(x) "
        "(Transcendental.enclose(24, bits) = vtrain.numerics.transcendental.enclose_erf: integers in the unit "
        "2^exp / den, dc the certified bound 8u(1 - 2^-40)|e|_low), rn32 = RN32(erf(x)) from mpmath at 400 bits, "
        "and unlogged claims with whether they stand (RoundingRule.judge); finite = false: the contract reverts "
        "with Float32.NonFinite(bits) and the Python reference rejects the input",
        "cases": cases,
    }


BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    "merkle.json": merkle_vectors,
    "tensor.json": tensor_vectors,
    "commit.json": commit_vectors,
    "oplog.json": oplog_vectors,
    "dataset.json": dataset_vectors,
    "graph.json": graph_vectors,
    "spec.json": spec_vectors,
    "ops.json": ops_vectors,
    "rule.json": rule_vectors,
    "wide.json": wide_vectors,
    "nonfinite.json": nonfinite_vectors,
    "erf.json": erf_vectors,
}


def render(obj: Any) -> str:
    return json.dumps(obj, indent=1, ensure_ascii=False) + "\n"


def build_vectors() -> dict[str, str]:
    """File name -> file text, for every vector file."""
    return {name: render(build()) for name, build in BUILDERS.items()}


def write_vectors(out_dir: Path) -> list[Path]:
    """Write every vector file into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in build_vectors().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=VECTORS_DIR, help="output folder")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    if args.check:
        stale = [
            name
            for name, text in build_vectors().items()
            if not (args.out / name).exists()
            or (args.out / name).read_text(encoding="utf-8") != text
        ]
        for name in stale:
            print(f"stale: {args.out / name}")
        return 1 if stale else 0
    for path in write_vectors(args.out):
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
