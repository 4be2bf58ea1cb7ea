"""Gas benchmarks on the embedded py-evm chain (cancun rules).

Adjudicator part: the gas of one `adjudicate()` transaction per op kind (total receipt gas:
21k intrinsic + calldata + execution), and MATMUL at 64 / 768 / 4096 terms; every figure must
stay under the 16,777,216 per-transaction cap.

    .venv/bin/python scripts/bench_gas.py            # all tables
    .venv/bin/python scripts/bench_gas.py adjudicator
    .venv/bin/python scripts/bench_gas.py gpt gpt-disputes   # the demo GPT: per op kind, whole disputes
    .venv/bin/python scripts/bench_gas.py new-kinds new-kind-disputes   # TAKE SELECT MAX_GRAD DROPOUT_MASK STEP CONCAT
    .venv/bin/python scripts/bench_gas.py availability       # publishing one whole step on-chain (DA)
    .venv/bin/python scripts/bench_gas.py rule chunks        # the rounding rule: per family and log code

Each table is a function returning rows, so other parts (game figures) can be added beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.build import load_artifact  # noqa: E402
from protocol.proofs import build_element_proof  # noqa: E402
from vtrain.commit.roots import LogEntry, dataset_root, op_log_root, tensor_root  # noqa: E402
from vtrain.graph.step_graph import OpKind as K  # noqa: E402
from vtrain.numerics import exact  # noqa: E402

TX_GAS_CAP = 16_777_216
SEED = hashlib.sha256(b"bench seed").digest()
STEP = 3


@dataclass(frozen=True)
class BenchCase:
    """One element to adjudicate: an op, its inputs, the element and (DATA) the dataset."""

    name: str
    desc: exact.OpDesc
    inputs: tuple[np.ndarray, ...]
    index: int
    dataset: np.ndarray | None = None


@dataclass(frozen=True)
class GasRow:
    name: str
    gas: int
    calldata: int
    seconds: float
    stands: bool


def chain():
    """A fresh embedded chain with the Adjudicator deployed: ``(w3, contract)``."""
    from web3 import EthereumTesterProvider, Web3

    w3 = Web3(EthereumTesterProvider())
    w3.eth.default_account = w3.eth.accounts[0]
    art = load_artifact("Adjudicator")
    tx = w3.eth.contract(abi=art.abi, bytecode=art.bytecode).constructor().transact({"gas": 8_000_000})
    addr = w3.eth.get_transaction_receipt(tx)["contractAddress"]
    return w3, w3.eth.contract(address=addr, abi=art.abi)


def _claim(case: BenchCase) -> tuple[int, list[LogEntry]]:
    """A standing claim for the element: RN32 of the enclosure, logged explicitly if it must be."""
    data = exact.DataContext(case.dataset, SEED, STEP)
    enc = exact.enclosure(case.desc, case.inputs, case.index, data)
    lo, hi, dc = enc.bounds
    c = exact.rn32(lo, saturate=True) if enc.rounded is None else enc.rounded
    if exact.judge(enc, c, exact.NONE):
        return c, []
    return c, [LogEntry(case.index, exact.EXPLICIT, c)]


def measure(w3, adj, case: BenchCase, claim: tuple[int, list[LogEntry]] | None = None) -> GasRow:
    """Send one adjudicate() transaction and read its receipt (``claim``: ``(bits, entries)``,
    default the standing claim of :func:`_claim`)."""
    claimed, entries = claim if claim is not None else _claim(case)
    proof = build_element_proof(case.desc.encode(), list(case.inputs), case.index, entries, case.dataset, SEED, STEP)
    claim = (
        case.desc.encode(),
        [tensor_root(x) for x in case.inputs],
        case.index,
        claimed,
        op_log_root(entries),
        STEP,
        dataset_root(case.dataset) if case.dataset is not None else b"\0" * 32,
        SEED,
        0 if case.dataset is None else case.dataset.shape[0],
    )
    fn = adj.functions.adjudicate(claim, proof)
    stands = fn.call({"gas": TX_GAS_CAP})
    t0 = time.perf_counter()
    tx = fn.transact({"gas": TX_GAS_CAP})
    receipt = w3.eth.get_transaction_receipt(tx)
    seconds = time.perf_counter() - t0
    assert receipt["status"] == 1, f"{case.name}: transaction failed"
    calldata = len(fn._encode_transaction_data()) // 2 - 1
    return GasRow(case.name, receipt["gasUsed"], calldata, seconds, stands)


def _f32(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.5).astype(np.float32) + np.float32(0)


def op_cases() -> list[BenchCase]:
    """One element of each supported op kind on realistic tensor sizes (256x256 inputs: a
    1024-chunk tree, so every opening carries a 10-level proof), then MATMUL rows."""
    rng = np.random.default_rng(0)
    D = exact.OpDesc
    s = (256, 256)
    x, y = _f32(rng, s), _f32(rng, s)
    pos = np.abs(x)
    idx = rng.integers(0, 256, (256, 1)).astype(np.float32)
    mid = 256 * 100 + 37
    cases = [
        BenchCase("ADD", D(K.ADD, (0, 1), s, (s, s), ()), (x, y), mid),
        BenchCase("SUB", D(K.SUB, (0, 1), s, (s, s), ()), (x, y), mid),
        BenchCase("MUL", D(K.MUL, (0, 1), s, (s, s), ()), (x, y), mid),
        BenchCase("DIV", D(K.DIV, (0, 1), s, (s, s), ()), (x, y), mid),
        BenchCase("ADD_S", D(K.ADD_S, (0,), s, (s,), (exact.bits_of(0.1),)), (x,), mid),
        BenchCase("MUL_S", D(K.MUL_S, (0,), s, (s,), (exact.bits_of(0.1),)), (x,), mid),
        BenchCase("DIV_S", D(K.DIV_S, (0,), s, (s,), (exact.bits_of(3.0),)), (x,), mid),
        BenchCase("RSUB_S", D(K.RSUB_S, (0,), s, (s,), (exact.bits_of(1.0),)), (x,), mid),
        BenchCase("SQRT", D(K.SQRT, (0,), s, (s,), ()), (pos,), mid),
        BenchCase("SUM (n=256)", D(K.SUM, (0,), (256, 1), (s,), ()), (x,), 100),
        BenchCase("MEAN (n=256)", D(K.MEAN, (0,), (256, 1), (s,), ()), (x,), 100),
        BenchCase("MAX (n=256)", D(K.MAX, (0,), (256, 1), (s,), ()), (x,), 100),
        BenchCase("RELU", D(K.RELU, (0,), s, (s,), ()), (x,), mid),
        BenchCase("RELU_GRAD", D(K.RELU_GRAD, (0, 1), s, (s, s), ()), (pos, y), mid),
        BenchCase("OUTPUT", D(K.OUTPUT, (0,), s, (s,), (0,)), (x,), mid),
        BenchCase("RESHAPE", D(K.RESHAPE, (0,), (65536,), (s,), ()), (x,), mid),
        BenchCase("PERMUTE", D(K.PERMUTE, (0,), s, (s,), (1, 0)), (x,), mid),
        BenchCase("SLICE", D(K.SLICE, (0,), (256, 128), (s,), (1, 64)), (x,), 128 * 100 + 37),
        BenchCase("PAD", D(K.PAD, (0,), (256, 320), (s,), (1, 32)), (x,), 320 * 100 + 77),
        BenchCase("EXPAND", D(K.EXPAND, (0,), s, ((1, 256),), ()), (x[:1],), mid),
        BenchCase("ONE_HOT (C=256)", D(K.ONE_HOT, (0,), (256, 256), ((256,),), (256,)), (idx[:, 0],), mid),
        BenchCase("GATHER (n=256)", D(K.GATHER, (0, 1), (256, 1), (s, (256, 1)), ()), (x, idx), 100),
        BenchCase(
            "DATA (L=784, 60000 samples)",
            D(K.DATA, (), (32, 784), (), ()),
            (),
            784 * 5 + 300,
            _f32(rng, (60000, 784)),
        ),
    ]
    return cases + transcendental_cases() + matmul_cases()


def transcendental_cases() -> list[BenchCase]:
    """EXP LOG TANH ERF (256x256 inputs): a typical element, and one from each costlier branch (ERF: its
    series sums more terms as |x| grows, up to x just below 6; from 6 on it is a constant)."""
    rng = np.random.default_rng(2)
    s = (256, 256)
    x = _f32(rng, s)
    mid = 256 * 100 + 37
    out = []
    for kind, name, value in (
        (K.EXP, "EXP", None),
        (K.EXP, "EXP (x = -100)", -100.0),
        (K.LOG, "LOG", None),
        (K.LOG, "LOG (x = 2^-140)", 2.0**-140),
        (K.TANH, "TANH", None),
        (K.TANH, "TANH (x = 5)", 5.0),
        (K.ERF, "ERF (x = 1e-30)", 1e-30),
        (K.ERF, "ERF (x = 1)", 1.0),
        (K.ERF, "ERF (x = 3)", 3.0),
        (K.ERF, "ERF (x = 5.9999995)", float(np.nextafter(np.float32(6.0), np.float32(0.0)))),
        (K.ERF, "ERF (x = 8, saturated)", 8.0),
    ):
        a = np.abs(x) if kind == K.LOG else x.copy()
        if value is not None:
            a.reshape(-1)[mid] = np.float32(value)
        out.append(BenchCase(name, exact.OpDesc(kind, (0,), s, (s,), ()), (a,), mid))
    return out


def matmul_cases(sizes: tuple[int, ...] = (64, 768, 4096)) -> list[BenchCase]:
    """MATMUL with bias at K terms per element: a [16, K], b [16, K] (NT form), bias [16]."""
    rng = np.random.default_rng(1)
    out = []
    for k in sizes:
        a, b, bias = _f32(rng, (16, k)), _f32(rng, (16, k)), _f32(rng, (16,))
        desc = exact.OpDesc(K.MATMUL, (0, 1, 2), (16, 16), ((16, k), (16, k), (16,)), ())
        out.append(BenchCase(f"MATMUL K={k} (+bias)", desc, (a, b, bias), 16 * 7 + 9))
    return out


def new_kind_cases() -> list[BenchCase]:
    """Issue 13's op kinds on model-sized tensors: a 3x3 conv patch gather of 16 channels of a
    32x32 image (x [16, 1024] by a CONST table [1024, 9], -1 padding), an embedding lookup
    (wte [4096, 256] by token ids [8, 64]), a causal-mask SELECT and MAX_GRAD on 256x256 scores,
    a 2x2 max-pool MAX_GRAD, a 256x256 dropout mask, STEP, and CONCAT (the flat optimizer's buffers)."""
    rng = np.random.default_rng(3)
    D = exact.OpDesc
    s = (256, 256)
    img = _f32(rng, (16, 1024))
    r = np.arange(1024)
    table = np.stack([r + dy * 32 + dx for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=1).astype(np.float32)
    yx = np.stack([(r // 32 + dy, r % 32 + dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=2)
    table[((yx < 0) | (yx >= 32)).any(axis=0)] = -1.0
    wte = _f32(rng, (4096, 256))
    tokens = rng.integers(0, 4096, (8, 64)).astype(np.float32)
    causal = np.tril(np.ones((1, 256, 256), np.float32))
    scores = _f32(rng, (1, 256, 256))
    neg = np.full((1, 1, 1), -1e9, np.float32)
    x = _f32(rng, s)
    g = _f32(rng, (256, 1))
    row = 100
    first_max = int(np.argmax(x[row]))
    pool = _f32(rng, (16384, 4))
    half = (1 << 31, exact.bits_of(2.0), 0)
    return [
        BenchCase("TAKE conv patch (x[16,1024])", D(K.TAKE, (0, 1), (16, 1024, 9), ((16, 1024), (1024, 9)), (1,)),
                  (img, table), (5 * 1024 + 500) * 9 + 4),
        BenchCase("TAKE conv patch (padding)", D(K.TAKE, (0, 1), (16, 1024, 9), ((16, 1024), (1024, 9)), (1,)),
                  (img, table), 5 * 1024 * 9),
        BenchCase("TAKE embedding (wte[4096,256])", D(K.TAKE, (0, 1), (8, 64, 256), ((4096, 256), (8, 64)), (0,)),
                  (wte, tokens), (3 * 64 + 17) * 256 + 100),
        BenchCase("SELECT causal mask (256x256)", D(K.SELECT, (0, 1, 2), (1, 256, 256),
                  ((1, 256, 256), (1, 256, 256), (1, 1, 1)), ()), (causal, scores, neg), 256 * 100 + 37),
        BenchCase("MAX_GRAD (n=256, at the max)", D(K.MAX_GRAD, (0, 1), s, (s, (256, 1)), ()), (x, g),
                  row * 256 + first_max),
        BenchCase("MAX_GRAD (n=256, elsewhere)", D(K.MAX_GRAD, (0, 1), s, (s, (256, 1)), ()), (x, g),
                  row * 256 + (first_max + 1) % 256),
        BenchCase("MAX_GRAD 2x2 pool (n=4)", D(K.MAX_GRAD, (0, 1), (16384, 4), ((16384, 4), (16384, 1)), ()),
                  (pool, _f32(rng, (16384, 1))), 4 * 5000 + int(np.argmax(pool[5000]))),
        BenchCase("DROPOUT_MASK (256x256)", D(K.DROPOUT_MASK, (), s, (), half), (), 256 * 100 + 37),
        BenchCase("STEP", D(K.STEP, (), (1,), (), ()), (), 0),
        BenchCase("CONCAT 2 x [256,256]", D(K.CONCAT, (0, 1), (2 * 65536,), (s, s), ()), (x, x), 65536 + 37),
        BenchCase("CONCAT 16 x [64,64] (last input)", D(K.CONCAT, tuple(range(16)), (16 * 4096,), ((64, 64),) * 16,
                  ()), tuple(_f32(rng, (64, 64)) for _ in range(16)), 15 * 4096 + 100),
    ]


def rule_cases() -> list[tuple[BenchCase, int, int]]:
    """A standing ruling of each family under each log code: ``(case, code, claimed bits)``.
    Near-ties are exact ties (``2^24 + 1`` rounds down to ``2^24``, ``2^24 + 3`` up to ``2^24 + 4``),
    so a down/up entry stands; explicit entries store ``RN32(e)``."""
    rng = np.random.default_rng(4)
    D = exact.OpDesc
    out: list[tuple[BenchCase, int, int]] = []

    def add(case: BenchCase, codes: tuple[int, ...]) -> None:
        enc = exact.enclosure(case.desc, case.inputs, case.index, exact.DataContext(case.dataset, SEED, STEP))
        c = exact.rn32(enc.bounds[0], saturate=True) if enc.rounded is None else enc.rounded
        out.extend((case, code, c) for code in codes)

    def wide_row(n: int) -> np.ndarray:
        """2^24 + 1 plus n - 2 terms of ~2^-100 (all floored by the first pass): e is within the first
        pass's width of the midpoint 2^24 + 1, so the exact second pass decides (its worst case: it
        walks every term and keeps the floored bits of all but two)."""
        r = (rng.standard_normal(n) * 2.0**-100).astype(np.float32)
        r[0], r[1] = 2.0**24, 1.0
        return r

    k = 64
    a, b, bias = _f32(rng, (16, k)), _f32(rng, (16, k)), _f32(rng, (16,))
    mm = D(K.MATMUL, (0, 1, 2), (16, 16), ((16, k), (16, k), (16,)), ())
    add(BenchCase("MATMUL K=64 (+bias)", mm, (a, b, bias), 16 * 7 + 9), (exact.NONE,))
    for name, tail, code in (("tie, down", 1.0, exact.DOWN), ("tie, up", 3.0, exact.UP)):
        ta, tb = a.copy(), b.copy()
        ta[7] = 0.0
        ta[7, 0], ta[7, 1], tb[9, 0], tb[9, 1] = 2.0**24, tail, 1.0, 1.0
        add(BenchCase(f"MATMUL K=64 (+bias) {name}", mm, (ta, tb, np.zeros(16, np.float32)), 16 * 7 + 9),
            (code, exact.EXPLICIT))
    s2 = (256, 256)
    x = _f32(rng, s2)
    add(BenchCase("SUM (n=256)", D(K.SUM, (0,), (256, 1), (s2,), ()), (x,), 100), (exact.NONE,))
    xt = x.copy()
    xt[100] = 0.0
    xt[100, 0], xt[100, 5] = 2.0**24, 1.0
    add(BenchCase("SUM (n=256) tie, down", D(K.SUM, (0,), (256, 1), (s2,), ()), (xt,), 100),
        (exact.DOWN, exact.EXPLICIT))
    mid = 256 * 100 + 37
    for kind, name in ((K.EXP, "EXP"), (K.LOG, "LOG"), (K.TANH, "TANH")):
        arg = np.abs(x) if kind == K.LOG else x
        add(BenchCase(name, D(kind, (0,), s2, (s2,), ()), (arg,), mid), (exact.NONE, exact.EXPLICIT))
    y = _f32(rng, s2)
    add(BenchCase("DIV", D(K.DIV, (0, 1), s2, (s2, s2), ()), (x, y), mid), (exact.NONE, exact.EXPLICIT))
    add(BenchCase("SQRT", D(K.SQRT, (0,), s2, (s2,), ()), (np.abs(x),), mid), (exact.NONE, exact.EXPLICIT))
    wa = np.ones((16, k), np.float32)
    wa[7] = wide_row(k)
    add(BenchCase("MATMUL K=64 (+bias) wide: second pass", mm, (wa, np.ones((16, k), np.float32),
                                                                 np.zeros(16, np.float32)), 16 * 7 + 9),
        (exact.NONE, exact.EXPLICIT))
    xw = x.copy()
    xw[100] = wide_row(256)
    add(BenchCase("SUM (n=256) wide: second pass", D(K.SUM, (0,), (256, 1), (s2,), ()), (xw,), 100),
        (exact.NONE, exact.EXPLICIT))
    s4 = (2, 4096)
    x4 = _f32(rng, s4)
    add(BenchCase("SUM (n=4096)", D(K.SUM, (0,), (2, 1), (s4,), ()), (x4,), 1), (exact.NONE,))
    x4w = x4.copy()
    x4w[1] = wide_row(4096)
    add(BenchCase("SUM (n=4096) wide: second pass", D(K.SUM, (0,), (2, 1), (s4,), ()), (x4w,), 1),
        (exact.NONE, exact.EXPLICIT))
    take = new_kind_cases()[2]
    add(take, (exact.NONE, exact.EXPLICIT))
    return out


def rule_table() -> None:
    """Gas of a standing adjudicate() ruling per family and log code (``rule`` mode): what the
    contract's rule costs on top of the proof checks; compare before/after a rule change."""
    w3, adj = chain()
    names = {exact.NONE: "none", exact.DOWN: "down", exact.UP: "up", exact.EXPLICIT: "explicit"}
    print("\n## adjudicate() per family and log code (py-evm, cancun; every claim stands)\n")
    print("| case | code | gas | stands |\n|---|---|---:|---|")
    for case, code, c in rule_cases():
        entries = [] if code == exact.NONE else [LogEntry(case.index, code, c if code == exact.EXPLICIT else 0)]
        row = measure(w3, adj, case, (c, entries))
        print(f"| {case.name} | {names[code]} | {row.gas:,} | {row.stands} |")
        assert row.stands, (case.name, code)


def new_kind_disputes() -> None:
    """Whole games on the real step graphs of tests/graph_games.py (conv net, GPT block; 4 steps,
    K=2), real Adjudicator: each cheat caught at its op; the oneStep (ruling) gas and the largest
    transaction of the game."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import game_harness as H
    import graph_games as G
    from test_new_kind_disputes import CHEATS, _cheat_caught, _false_challenger_loses

    dep = H.deploy(adjudicator="Adjudicator")
    graphs = {"conv": G.conv_net(steps=4), "gpt": G.gpt_block(), "adamw": G.adamw_net()}
    print("\n## disputes with the new op kinds (real Adjudicator, py-evm)\n")
    print("| cheat | lands on | oneStep gas (cheat caught) | oneStep gas (false challenger loses) | largest tx |")
    print("|---|---|---:|---:|---:|")
    for name, (which, *_rest, kind) in CHEATS.items():
        game, caught = _cheat_caught(dep, graphs[which], name)
        biggest = max(gas for _, gas in dep.gas_log)
        lost = _false_challenger_loses(dep, graphs[which], name)
        biggest = max(biggest, *(gas for _, gas in dep.gas_log))
        where = f"{K(kind).name} op {game['op']}, element {game['index']}"
        print(f"| {name} | {where} | {caught:,} | {lost:,} | {biggest:,} |")
        assert biggest < TX_GAS_CAP


def adjudicator_table(cases: list[BenchCase] | None = None) -> list[GasRow]:
    """Gas of adjudicate() per case (a fresh chain)."""
    w3, adj = chain()
    return [measure(w3, adj, c) for c in (cases if cases is not None else op_cases())]


def print_rows(title: str, rows: list[GasRow]) -> None:
    print(f"\n{title}")
    print(f"| {'case':<30} | {'gas (tx total)':>14} | {'calldata B':>10} | {'% of cap':>8} | stands |")
    print(f"|{'-' * 32}|{'-' * 16}:|{'-' * 11}:|{'-' * 9}:|--------|")
    for r in rows:
        print(
            f"| {r.name:<30} | {r.gas:>14,} | {r.calldata:>10,} | {100 * r.gas / TX_GAS_CAP:>7.1f}% |"
            f" {'yes' if r.stands else 'no':<6} |"
        )
    worst = max(r.gas for r in rows)
    assert worst < TX_GAS_CAP, f"a case exceeds the per-transaction cap: {worst}"


def game_moves() -> None:
    """Gas of every kind of move in one full game (toy adjudicator, 2 state slots, 10 ops)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from game_harness import gas_per_move

    moves = gas_per_move()
    print("\n## gas per move (one full game, py-evm)\n")
    print("| move | gas |\n|---|---:|")
    for name, gas in moves.items():
        print(f"| {name} | {gas:,} |")
    assert max(moves.values()) < TX_GAS_CAP


def full_disputes(cheats: tuple[str, ...] = ("abuse-log", "poison-sample", "tamper-weight")) -> None:
    """Whole disputes on the demo's MLP job (8 steps, K=4, 69 ops/step): moves, total gas, largest tx."""
    import tempfile

    from protocol.chain import Chain
    from protocol.demo import default_spec, run_scenario
    from protocol.deploy import deploy
    from protocol.jobs import Terms
    from protocol.store import ArtifactStore

    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    accounts = {"client": a[1], "trainer": a[2], "auditor": a[3], "false_challenger": a[4]}
    print("\n## full disputes on the MLP job (embedded chain)\n")
    print("| scenario | winner | ruling | moves | total gas | largest tx |\n|---|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        store = ArtifactStore(d)
        runs = [(f"cheat: {c}", c, False) for c in cheats] + [("false challenger", None, True)]
        for name, cheat, false in runs:
            r = run_scenario(proto, default_spec("mlp"), Terms(), store, accounts, name, cheat, false, lambda _: None)
            print(f"| {name} | {r.verdict} | {r.ruling} | {r.moves} | {r.gas:,} | {r.max_tx_gas:,} |")
            assert r.max_tx_gas < TX_GAS_CAP


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # tiny tensors: intra-op threads only contend


def gpt_cases() -> list[tuple[str, BenchCase | None]]:
    """One element of every op kind in the demo GPT's step graph, on real values (step 1 of the
    honest job): per kind the op with the most input elements (the longest openings), its middle
    element. ``None`` for a kind the Adjudicator does not rule: EXP/LOG/TANH (until issue 8's
    transcendental adjudication lands: then they are measured here too) and the bind kinds."""
    from protocol.demo import default_spec
    from protocol.jobs import JobContext
    from vtrain.graph.executor import state_tensors
    from vtrain.training.loop import train_steps

    _one_torch_thread()
    ctx = JobContext.of(default_spec("gpt"))
    g = ctx.job.graph
    (o,) = train_steps(ctx.job, state_tensors(ctx.job.initial_state), 1, 1, keep_trace=True)
    trace = o.result.trace
    assert trace is not None
    samples = np.ascontiguousarray(ctx.job.dataset.samples, dtype=np.float32)
    out: list[tuple[str, BenchCase | None]] = []
    for kind in sorted({op.kind for op in g.ops}):
        op = max((x for x in g.ops if x.kind == kind), key=lambda x: sum(g.ops[i].numel for i in x.inputs))
        shapes = " x ".join(str(list(sh)) for sh in g.in_shapes(op)) or "-"
        name = f"{kind.name} op {op.id} {shapes} -> {list(op.shape)}"
        desc = exact.OpDesc.of(ctx.graph.descriptors[op.id])
        inputs = tuple(trace[i].detach().numpy().astype(np.float32).reshape(g.ops[i].shape) for i in op.inputs)
        case = BenchCase(name, desc, inputs, op.numel // 2, samples if kind == K.DATA else None)
        data = exact.DataContext(samples, SEED, STEP) if kind == K.DATA else None
        try:
            exact.enclosure(desc, inputs, case.index, data)
        except exact.UnsupportedOp:
            case = None
        out.append((name, case))
    return out


def gpt_table() -> None:
    """adjudicate() gas for one element of every op kind of the demo GPT (real shapes and values)."""
    w3, adj = chain()
    print("\n## adjudicate() per op kind of the demo GPT (1 layer, 2 heads, d=16, T=8, B=4; py-evm)\n")
    print("| op kind, op id, input shapes -> output | gas (tx total) | calldata B | stands |\n|---|---:|---:|---|")
    worst = 0
    for name, case in gpt_cases():
        if case is None:
            kind = name.split()[0]
            why = "bind (ruled at openOp)" if kind in ("INPUT", "CONST") else "unsupported"
            print(f"| {name} | {why} | - | - |")
            continue
        r = measure(w3, adj, case)
        worst = max(worst, r.gas)
        print(f"| {name} | {r.gas:,} | {r.calldata:,} | {'yes' if r.stands else 'no'} |")
    assert worst < TX_GAS_CAP


def gpt_disputes(cheats: tuple[str, ...] = ("tamper-softmax", "tamper-attention", "abuse-log")) -> None:
    """Whole disputes on the demo's GPT job (8 steps, K=4, 454 ops/step): moves, total gas, largest tx."""
    import tempfile

    from protocol.chain import Chain
    from protocol.demo import default_spec, run_scenario
    from protocol.deploy import deploy
    from protocol.jobs import Terms
    from protocol.store import ArtifactStore

    _one_torch_thread()
    chain_ = Chain.connect(None)
    a = chain_.accounts()
    proto = deploy(chain_, a[0])
    accounts = {"client": a[1], "trainer": a[2], "auditor": a[3], "false_challenger": a[4]}
    print("\n## full disputes on the GPT job (embedded chain)\n")
    print("| scenario | winner | ruling, where | moves | total gas | largest tx |\n|---|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        store = ArtifactStore(d)
        runs = [(f"cheat: {c}", c, False) for c in cheats] + [("false challenger", None, True)]
        for name, cheat, false in runs:
            lines: list[str] = []
            r = run_scenario(proto, default_spec("gpt"), Terms(), store, accounts, name, cheat, false, lines.append)
            where = next((ln.split("narrowed to ")[1] for ln in lines if "narrowed to " in ln), "-")
            print(f"| {name} | {r.verdict} | {r.ruling}: {where} | {r.moves} | {r.gas:,} | {r.max_tx_gas:,} |")
            assert r.max_tx_gas < TX_GAS_CAP


def chunk_level(sizes: tuple[int, ...] = (16_384, 65_536)) -> None:
    """The chunk level of long reductions: posting the partials, disputing one chunk and having it
    recomputed (a full 2048-term chunk), or accepting and ruling from the partials; MATMUL
    ``[1, n] x [1, n]`` and SUM of ``[1, n]`` (65,536 = ExactSum.MAX_TERMS, the longest)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from game_harness import chunk_level_gas

    moves = ("postPartials", "disputeChunk", "settlePartials (chunk check)", "acceptPartials", "settlePartials (rule)")
    print("\n## chunk level of long reductions (py-evm; 2048 terms per chunk)\n")
    print("| op | terms | " + " | ".join(moves) + " | largest tx in the game |")
    print("|---|---:|" + "---:|" * (len(moves) + 1))
    for op, label in (("mm", "MATMUL"), ("sm", "SUM")):
        for n in sizes:
            g = chunk_level_gas(n, op=op)
            print(f"| {label} | {n:,} | " + " | ".join(f"{g[m]:,}" for m in moves) + f" | {g['max']:,} |")
            assert g["max"] < TX_GAS_CAP, g


TABLES: dict[str, Callable[[], None]] = {
    "adjudicator": lambda: print_rows("adjudicate() per op kind (py-evm, cancun)", adjudicator_table()),
    "moves": game_moves,
    "disputes": full_disputes,
    "gpt": gpt_table,
    "gpt-disputes": gpt_disputes,
    "chunks": chunk_level,
    "new-kinds": lambda: print_rows("adjudicate() per new op kind (issue 13; py-evm, cancun)",
                                    adjudicator_table(new_kind_cases())),
    "new-kind-disputes": new_kind_disputes,
    "rule": rule_table,
}


def publish_step(model: str, s: int = 1) -> dict[str, int]:
    """Gas to make the trainer publish one whole step of the demo ``model`` through DataAvailability:
    the step record (all pages of op log roots) and every op log with entries (empty logs are known
    from their root), in as many demands and answers as the bounds need."""
    import tempfile

    from protocol.availability import MAX_OP_ROOTS, MAX_TO_INDEX, AvailabilityResponder, demand_fee
    from protocol.chain import Chain
    from protocol.demo import create_job, default_spec
    from protocol.deploy import deploy
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent
    from vtrain.commit.roots import op_log_leaves
    from vtrain.commit.trace import op_log_entries
    from vtrain.numerics.logfile import decode_step_log

    _one_torch_thread()
    chain = Chain.connect(None)
    acct = chain.accounts()
    proto = deploy(chain, acct[0])
    ctx = JobContext.of(default_spec(model))
    terms = Terms()
    store = ArtifactStore(tempfile.mkdtemp())
    job = create_job(proto, acct[1], acct[2], ctx, terms)
    trainer = TrainerAgent(proto, acct[2], ctx, store, job)
    trainer.accept(terms)
    trainer.run_interval()
    resp = AvailabilityResponder(proto, acct[2], ctx, store, job)
    da = proto.availability
    demand_gas: list[int] = []
    fees: list[int] = []

    def demand(fn) -> None:
        fee = demand_fee(proto, fn)
        fees.append(fee)
        demand_gas.append(int(chain.send(fn, acct[3], value=terms.challenger_bond + fee, what="demand")["gasUsed"]))
        assert resp.respond() == 1, "the trainer did not answer"

    n_ops = ctx.job.graph.n_ops
    for first in range(0, n_ops, MAX_OP_ROOTS):
        demand(da.functions.demandStep(job, 0, s, first))
    step_log = decode_step_log(store.get_log(job, s), s, ctx.job.graph)
    with_entries = leaves_total = 0
    for op in range(n_ops):
        entries = op_log_entries(step_log, op)
        if not entries:
            continue
        with_entries += 1
        leaves_total += len(entries) + 2
        start = key = 0
        while True:
            demand(da.functions.demandLog(job, 0, s, op, key, MAX_TO_INDEX, start))
            ev = da.events.LogPublished.get_logs(from_block=chain.w3.eth.block_number)[-1]["args"]
            count = len(ev["leaves"]) // 9
            if ev["position"] + count >= ev["size"]:
                break
            start = ev["position"] + count - 1
            key = int.from_bytes(ev["leaves"][-9:-5], "big")
        assert len(op_log_leaves(entries)) == len(entries) + 2
    answers = [g for _, g in resp.gas]
    price = int(chain.call(da.functions.feeGasPrice()))
    earned = int(chain.call(proto.registry.functions.owed(acct[2])))  # the trainer is owed only the fees yet
    return {
        "fees_gas": sum(fees) // price,
        "earned_gas": earned // price,
        "ops": n_ops,
        "ops_with_entries": with_entries,
        "log_leaves": leaves_total,
        "answers": len(answers),
        "answer_gas": sum(answers),
        "demand_gas": sum(demand_gas),
        "largest_tx": max(answers + demand_gas),
    }


def availability_table(models: tuple[str, ...] = ("mlp", "gpt")) -> None:
    print("\n## data availability: publishing one whole step on-chain (py-evm)\n")
    print("| model | ops | ops with log entries | log leaves | answers | answer gas (sum) | demand gas (sum) "
          "| fees paid (gas) | trainer earned (gas) | largest tx | % of cap |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in models:
        r = publish_step(model)
        print(f"| {model} | {r['ops']} | {r['ops_with_entries']} | {r['log_leaves']:,} | {r['answers']} "
              f"| {r['answer_gas']:,} | {r['demand_gas']:,} | {r['fees_gas']:,} | {r['earned_gas']:,} "
              f"| {r['largest_tx']:,} | {100 * r['largest_tx'] / TX_GAS_CAP:.1f} |")
        assert r["largest_tx"] < TX_GAS_CAP
        assert r["earned_gas"] >= r["answer_gas"], "the fees do not cover the trainer's answers"


def availability_bounds() -> None:
    """Gas of the largest answers the bounds allow: a full page of MAX_LOG_LEAVES log leaves, a page
    of 1024 leaves, and a step record of 1024 state components with MAX_OP_ROOTS op log roots."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import da_harness as D
    import game_harness as H

    from protocol.availability import MAX_LOG_LEAVES, MAX_TO_INDEX

    dep = H.deploy()
    rows = []
    for n in (1024, MAX_LOG_LEAVES):
        dep.reset()
        run = H.simulate(H.JobConfig())
        op = run.graph.index["update0"]
        lr = D.with_logs(run, {(2, op): D.entries_leaves([(2 * k, 1, 0) for k in range(n - 2)])})
        job = H.active_job(dep, lr.run)
        did = D.demand_log(dep, job, 0, 2, op, 0, MAX_TO_INDEX, 0)
        r = dep.tx(dep.da.functions.answerLog(did, D.run_args(lr, 0, 2, op, 0, n)), dep.trainer)
        rows.append((f"log page of {n:,} leaves ({9 * n:,} B)", r.gasUsed))
    dep.reset()
    lr = D.with_logs(H.simulate(H.JobConfig(n_steps=1, interval_length=1, n_slots=1024)))
    job = H.active_job(dep, lr.run)
    did = D.demand_step(dep, job, 0, 1, 0)
    r = dep.tx(dep.da.functions.answerStep(did, *D.step_args(lr, 0, 1, 0)), dep.trainer)
    rows.append(("step record: 1,024 components + 1,024 op roots", r.gasUsed))
    print("\n## data availability: largest answers (py-evm)\n")
    print("| answer | gas | % of cap |\n|---|---:|---:|")
    for name, gas in rows:
        print(f"| {name} | {gas:,} | {100 * gas / TX_GAS_CAP:.1f} |")
        assert gas < TX_GAS_CAP
    per_leaf = (rows[1][1] - rows[0][1]) / (MAX_LOG_LEAVES - 1024)
    print(f"\nmarginal gas per log leaf: {per_leaf:,.0f}; a 1 MB op log ({2**20 // 9:,} leaves) needs "
          f"{-(-(2**20 // 9) // MAX_LOG_LEAVES)} pages, about {per_leaf * 2**20 / 9 / 1e6:,.0f}M gas in all")


TABLES["availability"] = lambda: (availability_bounds(), availability_table())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="*", choices=[*TABLES, []], help="tables to print (default: all)")
    args = ap.parse_args(argv)
    for name in args.tables or TABLES:
        TABLES[name]()


if __name__ == "__main__":
    main()
