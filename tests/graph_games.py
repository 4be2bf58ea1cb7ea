"""Dispute games on real step graphs with the real Adjudicator (issue 13's op kinds).

A :class:`~vtrain.graph.step_graph.Graph` built with ``GraphBuilder`` (a small conv net with batch
norm, dropout, max pooling, a committed LR schedule and gradient-norm clipping; a GPT-style block
with an embedding lookup and a causal attention mask) is run for a few steps; every op's output
is the exact reference of the one-step check (:mod:`vtrain.numerics.exact`: ``RN32`` of the exact
value, so the rounding logs are empty), INPUT/CONST/OUTPUT ops are real binds, DATA reads a real
dataset in the committed data order. A cheating run changes one element of one op's output at one
step and computes everything after it honestly from there. The runs plug into
``tests/game_harness.py``'s actors; :class:`ProvingTrainer` and :class:`ProvingChallenger` ask
the real ``Adjudicator`` with real proofs (:func:`protocol.proofs.build_element_proof`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import game_harness as H
import numpy as np

from protocol.proofs import build_element_proof
from vtrain.commit import roots as C
from vtrain.commit.merkle import MerkleTree
from vtrain.commit.trace import op_descriptors
from vtrain.graph.step_graph import Graph, GraphBuilder, OpKind, T, f32_bits
from vtrain.numerics import exact as X

SEED = hashlib.sha256(b"graph games seed").digest()


# ---------------------------------------------------------------------------------------------
# The new kinds on the builder (as NEWKINDS.md; the front end's GraphBuilder has methods for them)


def take(g: GraphBuilder, x: T, idx: T, axis: int) -> T:
    return g._op(OpKind.TAKE, [x, idx], x.shape[:axis] + idx.shape + x.shape[axis + 1 :], [axis], "take")


def select(g: GraphBuilder, cond: T, a: T, b: T) -> T:
    shape = tuple(max(x, y, z) for x, y, z in zip(cond.shape, a.shape, b.shape, strict=True))
    return g._op(OpKind.SELECT, [cond, a, b], shape, [], "select")


def max_grad(g: GraphBuilder, x: T, grad: T) -> T:
    return g._op(OpKind.MAX_GRAD, [x, grad], x.shape, [], "max_grad")


def dropout_mask(g: GraphBuilder, shape: tuple[int, ...], p: float, salt: int) -> T:
    return g._op(OpKind.DROPOUT_MASK, [], shape, [round(p * 2**32), f32_bits(1.0 / (1.0 - p)), salt], "dropout")


def step_number(g: GraphBuilder) -> T:
    return g._op(OpKind.STEP, [], (1,), [], "step")


# ---------------------------------------------------------------------------------------------
# Graphs


@dataclass
class GameGraph:
    """A step graph, its dataset, initial state and the op ids the cheats aim at."""

    graph: Graph
    dataset: np.ndarray
    init: list[np.ndarray]
    ops: dict[str, int]


def patch_table(h: int, w: int, k: int = 3) -> np.ndarray:
    """Conv patch positions of an ``h x w`` image, ``k x k`` taps, zero padding ``k // 2``: for
    output pixel ``p`` and tap ``t`` the flat input position, or -1 where the tap is padding."""
    r = k // 2
    out = np.full((h * w, k * k), -1.0, np.float32)
    for y in range(h):
        for x in range(w):
            for dy in range(k):
                for dx in range(k):
                    yy, xx = y + dy - r, x + dx - r
                    if 0 <= yy < h and 0 <= xx < w:
                        out[y * w + x, dy * k + dx] = yy * w + xx
    return out


def conv_net(batch: int = 2, side: int = 4, filters: int = 2, steps: int = 8) -> GameGraph:
    """conv 3x3 (TAKE of a CONST patch table + MATMUL) -> batch norm -> ReLU -> dropout ->
    max pool over windows of 4 (MAX; its VJP MAX_GRAD) -> loss; an update scaled by a clipped norm (the
    clipping scale ``min(1, c / (|g| + eps))``) and by a committed LR schedule (TAKE of a CONST
    table by ``STEP - 1``). The state keeps the conv weights, the post-dropout activations and
    the update (so a change of any op reaches the state root)."""
    g = GraphBuilder()
    px = side * side
    n = batch * px
    w = g.input("conv.w", (filters, 9))
    b = g.input("conv.b", (filters,))
    gamma = g.input("bn.gamma", (filters, 1))
    beta = g.input("bn.beta", (filters, 1))
    g.input("act", (filters, n))  # replaced by the post-dropout activations each step
    acc = g.input("acc", (filters, n))
    x = g.data((batch, px))
    ids: dict[str, int] = {}
    patches = take(g, x, g.const(patch_table(side, side), "patches.table"), 1)  # [B, px, 9]
    ids["patches"] = patches.op
    conv = g.matmul(g.reshape(patches, (n, 9)), w, b)  # [n, F]
    ids["conv"] = conv.op
    ct = g.transpose(conv)  # [F, n]
    mu = g.mean(ct)
    d = g.sub(ct, mu)
    var = g.mean(g.mul(d, d))
    std = g.sqrt(g.add_s(var, 1e-5))
    xhat = g.div(d, std)
    ids["bn"] = xhat.op
    y = g.add(g.mul(xhat, gamma), beta)
    r = g.relu(y)
    mask = dropout_mask(g, (filters, n), 0.5, salt=0)
    ids["dropout"] = mask.op
    h = g.mul(r, mask)
    win = g.reshape(h, (filters, n // 4, 4))
    pooled = g.max(win)  # [F, n/4, 1]
    mg = max_grad(g, win, pooled)  # [F, n/4, 4]
    ids["max_grad"] = mg.op
    loss = g.mean(g.reshape(pooled, (1, filters * n // 4)))
    # gradient-norm clipping: scale = min(1, c / (|mg| + eps)) = -max(-t, -1)
    flat = g.reshape(mg, (1, filters * n))
    norm = g.sqrt(g.sum(g.mul(flat, flat)))  # [1, 1]
    t = g.div(g.const(np.array([[0.5]], np.float32), "clip.c"), g.add_s(norm, 1e-6))
    two = g.add(g.pad(g.neg(t), 1, 0, 2), g.const(np.array([[0.0, -1.0]], np.float32), "clip.one"))
    scale = g.neg(g.max(two))  # [1, 1]
    ids["clip"] = scale.op
    # the LR schedule: lr_s = table[s - 1]
    schedule = g.const(np.linspace(0.1, 0.01, steps).astype(np.float32), "lr.table")
    lr = take(g, schedule, g.add_s(step_number(g), -1.0), 0)
    ids["lr"] = lr.op
    upd = g.mul(g.mul(g.reshape(mg, (filters, n)), scale), g.reshape(lr, (1, 1)))
    new_w = g.add(w, g.mul_s(g.reshape(loss, (1, 1)), 2.0**-10))
    for slot, out in enumerate([new_w, b, gamma, beta, h, g.add(acc, upd)]):
        g.output(out, slot)
    graph = g.build(loss)
    rng = np.random.default_rng(1)
    dataset = rng.standard_normal((9, px)).astype(np.float32)
    init = [
        rng.standard_normal((filters, 9)).astype(np.float32) / 3,
        rng.standard_normal(filters).astype(np.float32) / 10,
        np.ones((filters, 1), np.float32),
        np.zeros((filters, 1), np.float32),
        np.zeros((filters, n), np.float32),
        np.zeros((filters, n), np.float32),
    ]
    return GameGraph(graph, dataset, init, ids)


def gpt_block(batch: int = 2, ctx: int = 4, vocab: int = 7, dim: int = 3) -> GameGraph:
    """Token embedding (TAKE of ``wte`` by the data's token ids, axis 0), self-attention scores
    with a causal mask (SELECT of a CONST mask, the scores and -1e9), the row max, and a loss;
    the state keeps ``wte`` (updated) and the masked scores."""
    g = GraphBuilder()
    wte = g.input("wte", (vocab, dim))
    probe = g.input("scores", (batch, ctx, ctx))
    tokens = g.data((batch, ctx))
    emb = take(g, wte, tokens, 0)  # [B, T, d]
    ids = {"embedding": emb.op}
    scores = g.matmul(emb, emb)  # [B, T, T]
    causal = np.tril(np.ones((ctx, ctx), np.float32)).reshape(1, ctx, ctx)
    masked = select(g, g.const(causal, "causal"), scores, g.const(np.full((1, 1, 1), -1e9, np.float32), "neg"))
    ids["mask"] = masked.op
    loss = g.mean(g.reshape(g.max(masked), (1, batch * ctx)))
    g.output(g.add(wte, g.mul_s(g.reshape(loss, (1, 1)), 2.0**-8)), 0)
    g.output(g.add(probe, masked), 1)
    graph = g.build(loss)
    rng = np.random.default_rng(2)
    dataset = rng.integers(0, vocab, (11, ctx)).astype(np.float32)
    init = [rng.standard_normal((vocab, dim)).astype(np.float32), np.zeros((batch, ctx, ctx), np.float32)]
    return GameGraph(graph, dataset, init, ids)


def adamw_net(batch: int = 2, n_in: int = 3, hidden: int = 2) -> GameGraph:
    """A two-layer net trained by the flat AdamW of ``vtrain.models.optim``: the update runs once over
    CONCATs of the parameters, gradients, ``m`` and ``v``, then SLICEs go back to the slots (a
    parameter tensor of more than one 64-element chunk's worth: ``w1`` [hidden, 40])."""
    from vtrain.models.optim import AdamWConfig, apply_optimizer, optimizer_slots

    cfg = AdamWConfig(lr=0.01)
    g = GraphBuilder()
    shapes = [("w1", (hidden, n_in * 13 + 1)), ("b1", (hidden,)), ("w2", (1, hidden))]
    params = [g.input(n, s) for n, s in shapes]
    slots = optimizer_slots(cfg, shapes)
    state = [g.input(n, s) for n, s, _ in slots]
    x = g.data((batch, n_in * 13 + 1))
    h = g.relu(g.matmul(x, params[0], params[1]))
    y = g.matmul(h, params[2])  # [B, 1]
    loss = g.mean(g.reshape(g.mul(y, y), (1, batch)))
    grads = g.grad(loss, params)
    start = len(g.ops)
    new_p, new_s = apply_optimizer(g, cfg, params, grads, state)
    for slot, t in enumerate(new_p + new_s):
        g.output(t, slot)
    graph = g.build(loss)
    opt = graph.ops[start:]
    concats = [o.id for o in opt if o.kind == OpKind.CONCAT]
    ids = {
        "grad-concat": concats[1],  # concat(params), concat(grads), concat(m), concat(v)
        "adam-step": [o.id for o in opt if o.kind == OpKind.DIV][2],  # m_hat / (sqrt(v_hat) + eps)
        "param-slice": next(o.id for o in opt if o.kind == OpKind.SLICE),
    }
    rng = np.random.default_rng(3)
    dataset = (rng.standard_normal((9, n_in * 13 + 1)) / 2).astype(np.float32)
    init = [(rng.standard_normal(s) / 3).astype(np.float32) for _, s in shapes] + [v for _, _, v in slots]
    return GameGraph(graph, dataset, init, ids)


# ---------------------------------------------------------------------------------------------
# Runs


@dataclass(frozen=True)
class OpCheat:
    """At step ``step``, element ``element`` of op ``op``'s output becomes ``edit(honest bits)``."""

    step: int
    op: int
    element: int
    edit: Callable[[int], int]


def add(delta: float) -> Callable[[int], int]:
    return lambda bits: X.bits_of(np.float32(np.uint32(bits).view(np.float32)) + np.float32(delta))


def honest_output(desc: bytes, inputs: list[np.ndarray], data: X.DataContext) -> np.ndarray:
    """Every element of an op: RN32 of its exact value (the enclosure's ends must round alike,
    so no rounding-log entry is ever needed)."""
    d = X.OpDesc.of(desc)
    numel = int(np.prod(d.shape, dtype=np.int64))
    out = np.empty(numel, np.uint32)
    for i in range(numel):
        enc = X.enclosure(d, inputs, i, data)
        assert enc is not None, (d.kind, i)
        lo, hi, _ = enc.bounds
        v = X.rn32(lo)
        assert X.rn32(hi) == v, f"op kind {d.kind} element {i}: a near tie (needs a log entry)"
        out[i] = v
    return out.view(np.float32).reshape(d.shape)


def job_config(gg: GameGraph, n_steps: int, interval: int) -> H.JobConfig:
    return H.JobConfig(
        n_steps=n_steps,
        interval_length=interval,
        n_slots=len(gg.graph.slots),
        n_samples=gg.dataset.shape[0],
        data_seed=SEED,
        data_root=C.dataset_root(gg.dataset),
    )


def harness_graph(graph: Graph) -> H.Graph:
    descs = op_descriptors(graph)
    ops = []
    for op, desc in zip(graph.ops, descs, strict=True):
        kind, inputs, shape, _, attrs = C.decode_op_descriptor(desc)
        name = f"output{op.attrs[0]}" if op.kind == OpKind.OUTPUT else f"{op.id}:{op.name or op.kind.name}"
        ops.append(H.OpSpec(name, int(kind), tuple(inputs), tuple(shape), tuple(attrs)))
    return H.Graph(ops, descs, C.graph_tree(descs), {o.name: j for j, o in enumerate(ops)})


def real_run(gg: GameGraph, cfg: H.JobConfig, cheat: OpCheat | None = None) -> H.Run:
    """The trainer's record of ``cfg.n_steps`` steps of ``gg`` (honest, or with ``cheat``)."""
    graph = gg.graph
    hg = harness_graph(graph)
    state = [np.ascontiguousarray(a, np.float32) for a in gg.init]
    init_roots = [C.tensor_root(a) for a in state]
    steps: dict[int, H.StepRecord] = {}
    empty_log = C.op_log_root([])
    for s in range(1, cfg.n_steps + 1):
        data = X.DataContext(gg.dataset, cfg.data_seed, s)
        outs: list[np.ndarray] = []
        for op in graph.ops:
            if op.kind == OpKind.INPUT:
                out = state[op.attrs[0]].reshape(op.shape)
            elif op.kind == OpKind.CONST:
                out = graph.consts[op.id]
            else:
                out = honest_output(hg.descriptors[op.id], [outs[i] for i in op.inputs], data)
            if cheat is not None and cheat.step == s and cheat.op == op.id:
                flat = out.reshape(-1).view(np.uint32).copy()
                flat[cheat.element] = cheat.edit(int(flat[cheat.element]))
                out = flat.view(np.float32).reshape(op.shape)
            outs.append(out)
        components = [outs[hg.output_op(k)] for k in range(cfg.n_slots)]
        comp_roots = [C.tensor_root(a) for a in components]
        state_tree = C.roots_tree(comp_roots)
        log_tree = C.roots_tree([empty_log] * len(outs))
        steps[s] = H.StepRecord(
            s, outs, [empty_log] * len(outs), C.roots_tree([C.tensor_root(o) for o in outs]), log_tree,
            components, comp_roots, state_tree, C.step_leaf(s, state_tree.root, log_tree.root),
        )
        state = components
    trees = [MerkleTree.from_leaves([steps[s].leaf for s in cfg.interval_steps(i)]) for i in range(cfg.n_intervals)]
    registered = C.state_root(init_roots)
    return H.Run(cfg, hg, init_roots, C.roots_tree(init_roots), registered, steps, trees)


# ---------------------------------------------------------------------------------------------
# Actors with real proofs


def element_proof(run: H.Run, dataset: np.ndarray, step: int, op: int, index: int) -> bytes:
    rec = run.steps[step]
    inputs = [rec.outputs[i] for i in run.graph.ops[op].inputs]
    return build_element_proof(run.graph.descriptors[op], inputs, index, [], dataset, run.cfg.data_seed, step)


class ProvingTrainer(H.Trainer):
    """A harness trainer that asks the real Adjudicator with a real proof from its own run."""

    def __init__(self, dep: H.Deployment, run: H.Run, dataset: np.ndarray, one_step: bool = True) -> None:
        super().__init__(dep, run, one_step=one_step)
        self.dataset = dataset

    def move(self, gid: int, v: dict[str, Any]) -> bool:
        if v["phase"] == H.Phase.ONE_STEP and self.one_step:
            desc, roots = self.op_inputs(v["step"], v["op"])
            proof = element_proof(self.run, self.dataset, v["step"], v["op"], v["index"])
            return self.send(self.dep.game.functions.oneStep(gid, desc, roots, proof))
        return super().move(gid, v)


class ProvingChallenger(H.HonestChallenger):
    """The honest challenger; when the trainer declines the ruling it asks with a real proof."""

    def __init__(self, dep: H.Deployment, honest: H.Run, dataset: np.ndarray) -> None:
        super().__init__(dep, honest)
        self.dataset = dataset

    def one_step(self, gid: int) -> bool:
        v = self.dep.view(gid)
        ev = self.dep.events(self.dep.game, "OpOpened", game=gid)[-1]
        roots = [bytes(r) for r in ev.inputRoots]
        proof = element_proof(self.honest, self.dataset, v["step"], v["op"], v["index"])
        return self.send(self.dep.game.functions.oneStep(gid, bytes(ev.descriptor), roots, proof))


class NoOracle:
    """The real Adjudicator needs no registered truth."""

    def register(self, gid: int) -> None:
        return None


def play_real(dep: H.Deployment, gid: int, trainer: H.Trainer, challenger: H.Challenger) -> H.GameResult:
    return H.play(dep, gid, trainer, challenger, oracle=NoOracle())  # type: ignore[arg-type]


def one_step_gas(dep: H.Deployment) -> int:
    """Gas of the last oneStep transaction in ``dep.gas_log``."""
    return [gas for name, gas in dep.gas_log if name == "oneStep"][-1]
