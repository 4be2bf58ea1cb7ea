"""Disputes on the torch front end's models (issue 13): the ResNet on digits and the HF GPT-2 of
``examples/``, trained through ``vtrain.frontend`` (its graph uses TAKE SELECT MAX_GRAD
DROPOUT_MASK STEP), played by the real agents (protocol.trainer/auditor) against the real
contracts. A trainer that tampers with one element of one op (a conv patch gather, the conv
MATMUL, a batch norm, the max-pool gradient, the clipping scale, the LR schedule; GPT-2: the
embedding gather, the attention mask, a dropout mask, the clipping scale, the AdamW's flat gradient
CONCAT) is caught at that op and
element, the Adjudicator rules and the stake moves to the auditor; a false challenger loses its
bond. (HF GPT-2's causal mask reaches the graph constant-folded, as an ADD of a CONST 0 / -FLT_MAX
mask; the SELECT form is played on the hand-built block of tests/test_new_kind_disputes.py.)

Skipped where the front end (vtrain.frontend, transformers) is not installed. The ResNet's conv
gather and the GPT-2 dropout mask run by default; the rest are marked slow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vtrain.frontend")

from protocol.auditor import AuditorAgent  # noqa: E402
from protocol.cheats import TamperAttention  # noqa: E402
from protocol.demo import create_job  # noqa: E402
from protocol.game import STATUS_IN_PROGRESS  # noqa: E402
from protocol.jobs import JobContext, Terms  # noqa: E402
from protocol.trainer import TrainerAgent  # noqa: E402
from vtrain.frontend.job import pin_files  # noqa: E402
from vtrain.graph.step_graph import Graph, OpKind  # noqa: E402
from vtrain.training.spec import TrainSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TERMS = Terms()
STEPS, INTERVAL = 4, 2
CHEAT_STEP = INTERVAL + 1  # the first step of interval 1
RULING_ADJUDICATED = 3
WINNER_CHALLENGER, WINNER_TRAINER = 2, 1


def resnet_spec() -> TrainSpec:
    args = {"width": 4, "clip": 1.0, "warmup": 1, "total_steps": STEPS}
    return pin_files(TrainSpec.from_dict({"model": f"{ROOT}/examples/resnet_digits.py:task", "model_args": args,
                                          "steps": STEPS, "interval": INTERVAL, "batch_size": 4}))


def gpt2_spec() -> TrainSpec:
    args = {"context": 8, "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 260, "dropout": 0.1,
            "clip": 1.0, "warmup": 1, "total_steps": STEPS}
    return pin_files(TrainSpec.from_dict({"model": f"{ROOT}/examples/hf_gpt2.py:small", "model_args": args,
                                          "steps": STEPS, "interval": INTERVAL, "batch_size": 2}))


# -- finding the ops the cheats aim at --------------------------------------------------------------


def _consumers(g: Graph, j: int) -> list[int]:
    return [o.id for o in g.ops if j in o.inputs]


def _first(g: Graph, kind: OpKind, after: int = -1, where=lambda o: True) -> int:
    return next(o.id for o in g.ops[after + 1 : g.loss_op] if o.kind == kind and where(o))


def targets(g: Graph) -> dict[str, int]:
    """Op ids of the disputed ops, found by structure (the front end's lowering may renumber)."""
    const_take = [o.id for o in g.ops[: g.loss_op] if o.kind == OpKind.TAKE
                  and g.ops[o.inputs[1]].kind == OpKind.CONST and o.attrs[0] == len(o.shape) - 2]
    out: dict[str, int] = {}
    if const_take:  # the ResNet
        gather = const_take[0]
        out["conv-patch-gather"] = gather
        out["conv-matmul"] = _first(g, OpKind.MATMUL, gather)
        out["batch-norm"] = _first(g, OpKind.SQRT, out["conv-matmul"])
    for o in g.ops[g.loss_op :]:
        if o.kind == OpKind.MAX_GRAD:
            out.setdefault("max-pool-grad", o.id)
        if o.kind == OpKind.STEP:
            out.setdefault("lr-schedule", next(c for c in _consumers(g, _consumers(g, o.id)[0])
                                               if g.ops[c].kind == OpKind.TAKE))
        if o.kind == OpKind.SELECT and o.shape == (1, 1):  # the clipping scale: min(1, c / norm)
            out.setdefault("clipping-scale", o.id)
        if o.kind == OpKind.CONCAT and g.ops[o.inputs[0]].kind != OpKind.INPUT:  # the flat optimizer's gradients
            out.setdefault("optimizer-concat", o.id)
    for o in g.ops[: g.loss_op]:
        if o.kind == OpKind.TAKE and g.ops[o.inputs[1]].kind != OpKind.CONST:
            out.setdefault("embedding-gather", o.id)
        # the causal mask: a SELECT of a CONST condition, or (HF GPT-2 as exported: the mask
        # constant-folded) an ADD of a CONST of 0 / -FLT_MAX
        if len(o.shape) == 4 and (
            (o.kind == OpKind.SELECT and g.ops[o.inputs[0]].kind == OpKind.CONST)
            or (o.kind == OpKind.ADD and g.ops[o.inputs[1]].kind == OpKind.CONST)
        ):
            out.setdefault("attention-mask", o.id)
        if o.kind == OpKind.DROPOUT_MASK:
            out.setdefault("dropout-mask", o.id)
    return out


RESNET_CHEATS = ("conv-patch-gather", "conv-matmul", "batch-norm", "max-pool-grad", "clipping-scale", "lr-schedule")
GPT2_CHEATS = ("embedding-gather", "attention-mask", "dropout-mask", "clipping-scale", "optimizer-concat")
DEFAULT = {("resnet", "conv-patch-gather"), ("gpt2", "dropout-mask")}


@pytest.fixture(scope="module")
def contexts() -> dict[str, JobContext]:
    return {}


def _ctx(contexts: dict[str, JobContext], model: str) -> JobContext:
    if model not in contexts:
        if model == "gpt2":
            pytest.importorskip("transformers")
        contexts[model] = JobContext.of(resnet_spec() if model == "resnet" else gpt2_spec())
    return contexts[model]


def _honest_outputs(ctx: JobContext, step: int, op: int) -> np.ndarray:
    from vtrain.commit.trace import StepTrace
    from vtrain.graph.executor import state_tensors
    from vtrain.training.loop import train_steps

    state = state_tensors(ctx.job.initial_state)
    for o in train_steps(ctx.job, state, 1, step, keep_trace=True):
        if o.step == step:
            return StepTrace.of(step, ctx.job.graph, o.result).outputs[op].reshape(-1)
    raise AssertionError(step)


def _element(ctx: JobContext, name: str, op: int) -> int:
    """An element whose change reaches the state: a non-zero one (for a mask: a kept one; for the
    attention mask: an unmasked one), else 0."""
    out = _honest_outputs(ctx, CHEAT_STEP, op)
    if name == "attention-mask":
        return int(np.nonzero(np.abs(out) < 1e8)[0][1])
    nz = np.nonzero(out)[0]
    return int(nz[len(nz) // 2]) if len(nz) else 0


def _play(proto, store, accounts, ctx: JobContext, cheat=None, false_interval: int | None = None):
    job = create_job(proto, accounts["client"], accounts["trainer"], ctx, TERMS)
    trainer = TrainerAgent(proto, accounts["trainer"], ctx, store, job, cheat=cheat)
    trainer.accept(TERMS)
    who = "auditor" if false_interval is None else "false_challenger"
    auditor = AuditorAgent(proto, accounts[who], ctx, store, job, honest=false_interval is None)
    bad = None
    while bad is None and (i := trainer.run_interval()) is not None:
        bad = auditor.audit() if false_interval is None else (i if i == false_interval else None)
    assert bad is not None, "the cheat must reach a posted interval"
    gid = auditor.challenge(bad, TERMS)
    for _ in range(300):
        sent = trainer.play() + auditor.play()
        if auditor.player.view(gid).status != STATUS_IN_PROGRESS:
            break
        if not sent:
            proto.chain.advance_time(TERMS.clock + 1)
    return job, gid, trainer


def _game_of(proto, gid: int) -> dict:
    game = proto.game.events
    (resolved,) = game.GameResolved.get_logs(from_block=0, argument_filters={"game": gid})
    (op,) = game.OpOpened.get_logs(from_block=0, argument_filters={"game": gid})
    (step,) = game.StepOpened.get_logs(from_block=0, argument_filters={"game": gid})
    picked = game.ElementPicked.get_logs(from_block=0, argument_filters={"game": gid})
    return {
        "step": int(step["args"]["step"]),
        "op": int(op["args"]["op"]),
        "kind": int(op["args"]["kind"]),
        "index": int(picked[0]["args"]["index"]) if picked else None,
        "winner": int(resolved["args"]["winner"]),
        "ruling": int(resolved["args"]["ruling"]),
    }


CASES = [(m, n) for m, names in (("resnet", RESNET_CHEATS), ("gpt2", GPT2_CHEATS)) for n in names]


@pytest.mark.parametrize(
    "model,name", [c if c in DEFAULT else pytest.param(*c, marks=pytest.mark.slow) for c in CASES]
)
def test_cheat_on_a_front_end_model_is_caught_at_its_op(fresh_demo_world, contexts, model, name) -> None:
    proto, store, accounts = fresh_demo_world
    ctx = _ctx(contexts, model)
    op = targets(ctx.job.graph)[name]
    element = _element(ctx, name, op)
    cheat = TamperAttention(step=CHEAT_STEP, op=op, element=element, delta=0.5 if name != "lr-schedule" else 0.01)
    job, gid, trainer = _play(proto, store, accounts, ctx, cheat=cheat)
    game = _game_of(proto, gid)
    assert (game["step"], game["op"], game["index"]) == (CHEAT_STEP, op, element), game
    assert game["kind"] == int(ctx.job.graph.ops[op].kind)
    assert (game["winner"], game["ruling"]) == (WINNER_CHALLENGER, RULING_ADJUDICATED), game
    assert trainer.status() == "fraudulent"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet", "gpt2"])
def test_false_challenger_on_a_front_end_model_loses(fresh_demo_world, contexts, model) -> None:
    proto, store, accounts = fresh_demo_world
    ctx = _ctx(contexts, model)
    job, gid, trainer = _play(proto, store, accounts, ctx, false_interval=1)
    game = _game_of(proto, gid)
    assert game["winner"] == WINNER_TRAINER, game
    assert trainer.status() == "active"


def test_the_front_end_graphs_hold_every_disputed_op(contexts) -> None:
    g = _ctx(contexts, "resnet").job.graph
    found = targets(g)
    assert set(RESNET_CHEATS) <= set(found), found
    assert g.ops[found["conv-patch-gather"]].kind == OpKind.TAKE
    assert g.ops[found["lr-schedule"]].kind == OpKind.TAKE
    assert g.ops[found["clipping-scale"]].kind == OpKind.SELECT


# -- every op of the front-end graphs on the real Adjudicator ---------------------------------------

NEW_KINDS = (OpKind.TAKE, OpKind.SELECT, OpKind.MAX_GRAD, OpKind.DROPOUT_MASK, OpKind.STEP)


@pytest.mark.parametrize("model", ["resnet", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_every_new_kind_op_of_a_front_end_graph_stands_on_chain(contexts, model) -> None:
    """Step 1 of the honest job: for every op of the new kinds, its first, middle and last element
    stand on the real Adjudicator with real proofs and a 1-ulp change does not; every other op kind
    of the graph stands under the contract's rule in Python (vtrain.numerics.exact)."""
    from test_adjudicator import deploy_adjudicator

    from protocol.proofs import build_element_proof
    from vtrain.commit.roots import op_log_root, tensor_root
    from vtrain.commit.trace import StepTrace, op_log_entries
    from vtrain.graph.executor import state_tensors
    from vtrain.numerics import exact
    from vtrain.training.loop import train_steps

    ctx = _ctx(contexts, model)
    g, seed, samples = ctx.job.graph, ctx.spec.data_seed, ctx.job.dataset.samples
    (o,) = train_steps(ctx.job, state_tensors(ctx.job.initial_state), 1, 1, keep_trace=True)
    t = StepTrace.of(1, g, o.result)
    data = exact.DataContext(samples, seed, 1)
    adj = deploy_adjudicator()
    ruled = 0
    for op in g.ops:
        if op.kind in (OpKind.INPUT, OpKind.CONST) or exact.is_chunked(ctx.graph.descriptors[op.id]):
            continue
        desc, inputs = ctx.graph.descriptors[op.id], t.inputs_of(op.id)
        entries = op_log_entries(t.log, op.id)
        by_index = {e.index: e for e in entries}
        bits = t.outputs[op.id].reshape(-1).view(np.uint32)
        for i in sorted({0, op.numel // 2, op.numel - 1}):
            assert exact.judge_element(desc, inputs, i, int(bits[i]), by_index.get(i), data), (op, i)
            if op.kind not in NEW_KINDS:
                continue
            proof = build_element_proof(desc, inputs, i, entries, samples, seed, 1)
            for claimed, stands in ((int(bits[i]), True), (exact.neighbour(int(bits[i]), True), False)):
                claim = (desc, [tensor_root(x) for x in inputs], i, claimed, op_log_root(entries), 1,
                         ctx.data_root, seed, ctx.job.dataset.n)
                assert adj.functions.adjudicate(claim, proof).call({"gas": 16_000_000}) == stands, (op, i)
            ruled += 1
    assert ruled >= 3 * len({op.kind for op in g.ops} & set(NEW_KINDS))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet", "gpt2"])
def test_the_demo_plays_its_three_scenarios_on_the_front_end_models(model: str) -> None:
    """`vtrain demo --model resnet|gpt2`: honest job finalizes, the cheater loses by adjudication,
    the false challenger loses at a bind."""
    from protocol.demo import run_demo

    rows = run_demo(None, lambda _msg: None, model=model)
    assert [(r.verdict, r.final_status) for r in rows] == [
        ("no dispute", "finalized"), ("challenger won", "fraudulent"), ("trainer won", "finalized")]
    assert rows[1].ruling == "adjudicated" and rows[2].ruling == "bind"
