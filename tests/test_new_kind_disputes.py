"""Dispute games on real step graphs that use issue 13's op kinds, ruled by the real Adjudicator
with real proofs (tests/graph_games.py): a cheat inside a conv (its TAKE patch gather, its
MATMUL), a batch norm, a dropout mask, a clipping scale, a committed LR schedule (conv net), an
embedding gather and an attention mask (GPT block), the flat AdamW's gradient CONCAT, its update
and a SLICE back to a slot (a two-layer net) is each caught at that very op and element and
the trainer loses its stake; a false challenger disputing the same honest element loses.

~40 s CPU in all (one deployment, reset between games); the extra cheats are marked slow."""

from __future__ import annotations

import game_harness as H
import graph_games as G
import numpy as np
import pytest

from vtrain.graph.step_graph import OpKind
from vtrain.numerics import exact as X

N_STEPS, INTERVAL, CHEAT_STEP = 4, 2, 3


@pytest.fixture(scope="module")
def dep() -> H.Deployment:
    return H.deploy(adjudicator="Adjudicator")


@pytest.fixture(scope="module")
def conv() -> G.GameGraph:
    return G.conv_net(steps=N_STEPS)


@pytest.fixture(scope="module")
def gpt() -> G.GameGraph:
    return G.gpt_block()


@pytest.fixture(scope="module")
def adamw() -> G.GameGraph:
    return G.adamw_net()


def flip_dropout(bits: int) -> int:
    return X.bits_of(2.0) if bits == 0 else 0


#: name -> (graph, target op, element, edit, kind the game must land on)
CHEATS = {
    "conv-patch-gather": ("conv", "patches", 4, G.add(0.5), OpKind.TAKE),
    "conv-matmul": ("conv", "conv", 3, G.add(0.25), OpKind.MATMUL),
    "batch-norm": ("conv", "bn", 3, G.add(0.25), OpKind.DIV),
    "dropout-mask": ("conv", "dropout", 1, flip_dropout, OpKind.DROPOUT_MASK),
    "clipping-scale": ("conv", "clip", 0, G.add(0.01), OpKind.MUL_S),
    "lr-schedule": ("conv", "lr", 0, G.add(0.01), OpKind.TAKE),
    "embedding-gather": ("gpt", "embedding", 2, G.add(0.5), OpKind.TAKE),
    "attention-mask": ("gpt", "mask", 1, lambda b: X.bits_of(0.5), OpKind.SELECT),
    "grad-concat": ("adamw", "grad-concat", 81, G.add(0.5), OpKind.CONCAT),  # b1[1]: input 1 of the CONCAT
    "adamw-flat-step": ("adamw", "adam-step", 83, G.add(0.25), OpKind.DIV),  # w2[1], past the first chunk
    "param-slice": ("adamw", "param-slice", 5, G.add(0.5), OpKind.SLICE),
}
DEFAULT = ("conv-patch-gather", "conv-matmul", "batch-norm", "dropout-mask", "clipping-scale", "embedding-gather",
           "grad-concat")


def _graph(request, which: str) -> G.GameGraph:
    return request.getfixturevalue(which)


def _game(dep: H.Deployment, gid: int) -> dict:
    (step,) = dep.events(dep.game, "StepOpened", game=gid)
    (op,) = dep.events(dep.game, "OpOpened", game=gid)
    (picked,) = dep.events(dep.game, "ElementPicked", game=gid)
    return {"step": step.step, "op": op.op, "kind": op.kind, "index": picked.index, "claimed": picked.claimed}


def _cheat(gg: G.GameGraph, name: str) -> G.OpCheat:
    _, target, element, edit, _ = CHEATS[name]
    return G.OpCheat(CHEAT_STEP, gg.ops[target], element, edit)


def _cheat_caught(dep: H.Deployment, gg: G.GameGraph, name: str) -> tuple[dict, int]:
    kind = CHEATS[name][4]
    cfg = G.job_config(gg, N_STEPS, INTERVAL)
    cheat = _cheat(gg, name)
    assert gg.graph.ops[cheat.op].kind == kind
    honest, bad = G.real_run(gg, cfg), G.real_run(gg, cfg, cheat)
    bad_interval = (CHEAT_STEP - 1) // INTERVAL
    diff = [i for i, (a, b) in enumerate(zip(honest.interval_roots, bad.interval_roots, strict=True)) if a != b]
    assert diff and diff[0] == bad_interval, "the cheat must reach the posted state"
    dep.reset()
    job = H.active_job(dep, bad)
    gid = H.challenge(dep, job, bad_interval)
    trainer, auditor = G.ProvingTrainer(dep, bad, gg.dataset), G.ProvingChallenger(dep, honest, gg.dataset)
    res = G.play_real(dep, gid, trainer, auditor)
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.ADJUDICATED), res
    game = _game(dep, gid)
    assert (game["step"], game["op"], game["index"], game["kind"]) == (cheat.step, cheat.op, cheat.element, kind)
    honest_bits = int(honest.steps[cheat.step].outputs[cheat.op].reshape(-1).view(np.uint32)[cheat.element])
    assert game["claimed"] == cheat.edit(honest_bits) != honest_bits
    assert dep.job_status(job) == H.JobStatus.FRAUDULENT
    return game, G.one_step_gas(dep)


def _false_challenger_loses(dep: H.Deployment, gg: G.GameGraph, name: str) -> int:
    cfg = G.job_config(gg, N_STEPS, INTERVAL)
    cheat = _cheat(gg, name)
    honest = G.real_run(gg, cfg)
    dep.reset()
    job = H.active_job(dep, honest)
    interval, position = cfg.interval_of(cheat.step)
    gid = H.challenge(dep, job, interval)
    false = H.FalseChallenger(dep, position=position, op=cheat.op, element=cheat.element)
    res = G.play_real(dep, gid, G.ProvingTrainer(dep, honest, gg.dataset), false)
    assert (res.status, res.ruling) == (H.GameStatus.TRAINER_WON, H.Ruling.ADJUDICATED), res
    game = _game(dep, gid)
    assert (game["step"], game["op"], game["index"]) == (cheat.step, cheat.op, cheat.element)
    assert dep.job_status(job) == H.JobStatus.ACTIVE
    return G.one_step_gas(dep)


@pytest.mark.parametrize(
    "name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in CHEATS]
)
def test_cheat_is_caught_at_its_op_and_element_by_the_adjudicator(request, dep, name) -> None:
    gg = _graph(request, CHEATS[name][0])
    _cheat_caught(dep, gg, name)


@pytest.mark.parametrize(
    "name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in CHEATS]
)
def test_false_challenger_on_the_same_honest_element_loses(request, dep, name) -> None:
    gg = _graph(request, CHEATS[name][0])
    _false_challenger_loses(dep, gg, name)


def test_graphs_use_every_new_kind_and_the_trainer_declining_the_ruling_still_loses(request, dep, conv, gpt) -> None:
    kinds = {op.kind for gg in (conv, gpt) for op in gg.graph.ops}
    assert {OpKind.TAKE, OpKind.SELECT, OpKind.MAX_GRAD, OpKind.DROPOUT_MASK, OpKind.STEP} <= kinds
    # a cheater that never asks for the ruling: the honest challenger asks with its own proof
    cfg = G.job_config(conv, N_STEPS, INTERVAL)
    cheat = _cheat(conv, "dropout-mask")
    honest, bad = G.real_run(conv, cfg), G.real_run(conv, cfg, cheat)
    dep.reset()
    job = H.active_job(dep, bad)
    gid = H.challenge(dep, job, (CHEAT_STEP - 1) // INTERVAL)
    res = G.play_real(dep, gid, G.ProvingTrainer(dep, bad, conv.dataset, one_step=False),
                      G.ProvingChallenger(dep, honest, conv.dataset))
    assert (res.status, res.ruling) == (H.GameStatus.CHALLENGER_WON, H.Ruling.ADJUDICATED), res
    assert _game(dep, gid)["op"] == cheat.op
