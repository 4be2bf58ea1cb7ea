"""Data-parallel training of front-end graphs (vtrain.frontend): the ResNet (convs as patch TAKEs,
batch norm, pools, residuals) and a tiny HF GPT-2 (embedding TAKEs, DROPOUT_MASK, causal SELECT,
clipping) give the single process's state roots and log bytes at world sizes 1, 2 and 3."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_distributed import _pairs, _reference, _threads
from torch import nn

from vtrain.cli import replay_cmd, train_cmd
from vtrain.distributed.sharding import analyse
from vtrain.distributed.worker import FAULT_ENV, backend_for, rank_device
from vtrain.errors import GraphError
from vtrain.frontend import TorchTask, capture
from vtrain.graph.step_graph import GraphBuilder, OpKind
from vtrain.training.rundir import RunDir
from vtrain.training.spec import TrainSpec, build_job

RESNET = TrainSpec(model="examples/resnet_digits.py:task", model_args={"width": 4}, batch_size=7, steps=2,
                   interval=2)
GPT2 = TrainSpec(model="examples/hf_gpt2.py:small", model_args={"n_layer": 1, "n_embd": 16, "n_head": 2,
                 "vocab_size": 300, "context": 8, "dropout": 0.1}, batch_size=5, steps=2, interval=2)


@pytest.fixture(scope="module")
def resnet_job():
    return build_job(RESNET)


@pytest.fixture(scope="module")
def gpt2_job():
    pytest.importorskip("transformers")
    return build_job(GPT2)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_resnet_world_sizes_match_one_process(resnet_job, world):
    ref = _reference(resnet_job, RESNET.steps)
    outs = _threads(resnet_job, world, RESNET.steps, seed=world)
    for r in range(world):
        assert _pairs(resnet_job, outs[r]) == ref, f"rank {r} of {world}"


@pytest.mark.parametrize("world", [2, 3])
def test_gpt2_with_dropout_world_sizes_match_one_process(gpt2_job, world):
    names = {o.name for o in gpt2_job.graph.ops}
    assert any(o.kind == OpKind.DROPOUT_MASK for o in gpt2_job.graph.ops)
    assert {"clip_norm", "lr_table", "mask_keep"} <= names  # global-norm clipping, schedule, causal mask
    ref = _reference(gpt2_job, GPT2.steps)
    outs = _threads(gpt2_job, world, GPT2.steps, seed=world)
    for r in range(world):
        assert _pairs(gpt2_job, outs[r]) == ref, f"rank {r} of {world}"


def test_resnet_plan_combines_batch_norm_statistics_and_weight_gradients(resnet_job):
    """Batch norm's training-mode MEANs run over batch x positions (a block of H*W entries per
    sample on the last axis): batch reductions, as are the conv weight gradients (K = N*P)."""
    g = resnet_job.graph
    plan = analyse(g)
    means = [i for i in plan.reductions if g.ops[i].kind == OpKind.MEAN]
    assert len(means) == 12  # mean and variance of the six batch norms (stem, 2 x 2 blocks, shortcut)
    for i in means:
        p = plan.placement[g.ops[i].inputs[0]]
        assert p is not None and p.block in (64, 49, 16), (i, p)  # 8x8, 7x7, 4x4 positions per sample
    assert sum(g.ops[i].kind == OpKind.MATMUL for i in plan.reductions) == 7  # 6 convs + the head
    for slot, op in g.grad_ops.items():
        assert plan.placement[op] is None, f"gradient of slot {slot} must be replicated"
    takes = [o for o in g.ops if o.kind == OpKind.TAKE and plan.placement[o.id] is not None]
    assert takes and all(plan.placement[t.id].axis == 0 for t in takes)  # patch gathers keep the batch axis


def test_gpt2_plan_generates_dropout_masks_whole_and_cuts_them(gpt2_job):
    """A DROPOUT_MASK hashes each element's GLOBAL index: every rank generates the whole mask and
    cuts its shard where the mask meets the sharded activations (never a mask of local indices)."""
    g = gpt2_job.graph
    plan = analyse(g)
    masks = [o.id for o in g.ops if o.kind == OpKind.DROPOUT_MASK]
    assert masks and all(plan.placement[m] is None for m in masks)
    cut = {op.inputs[pos] for op in g.ops for pos, _ in plan.slice_inputs.get(op.id, [])}
    assert set(masks) <= cut
    emb = [o for o in g.ops if o.kind == OpKind.TAKE and plan.placement[o.inputs[1]] is not None]
    assert emb and all(plan.placement[o.id].axis == 0 for o in emb)  # token-id lookups: sharded by idx
    assert g.ops[emb[0].inputs[0]].kind == OpKind.INPUT  # from the replicated embedding table


def _take_batch(b, x):
    return b.take(x, b.const(np.array([1.0, 0.0], np.float32), "idx"), 0)


def _gather_batch(b, x):
    return b.gather(b.transpose(x), b.const(np.zeros((3, 1), np.float32), "idx"))


def _max_grad_batch(b, x):
    xt = b.transpose(x)  # (3, 4): the batch on the last axis
    return b.max_grad(xt, b.max(xt, differentiable=True))


def _slice_batch(b, x):
    return b.slice(b.reshape(x, (12,)), 0, 2, 5)


def _take_sharded_by_sharded(b, x):
    return b.take(x, b.reshape(x, (4, 3)), 1)


@pytest.mark.parametrize("build, kind, why", [
    (_take_batch, "TAKE", "takes along the batch axis 0"),
    (_gather_batch, "GATHER", "gathers along the batch axis"),
    (_max_grad_batch, "MAX_GRAD", "first maximum over the batch axis"),
    (_slice_batch, "SLICE", "slices the batch axis 0"),
    (_take_sharded_by_sharded, "TAKE", "takes from a tensor sharded as"),
])
def test_ops_that_mix_samples_are_refused_naming_the_op_and_why(build, kind, why):
    b = GraphBuilder()
    out = build(b, b.data((4, 3)))
    with pytest.raises(GraphError, match=rf"sharding: op {out.op} \({kind}\b.*{why}"):
        analyse(b.build(out))


def test_the_backend_follows_the_device():
    assert backend_for("cpu") == "gloo"
    assert backend_for("cuda") == backend_for("cuda:1") == "nccl"
    assert rank_device("cpu") == "cpu"


# -- real ranks (processes, gloo on loopback) ----------------------------------------------------------
def _ref_run(tmp_path, args: list[str]) -> RunDir:
    r = CliRunner().invoke(train_cmd, ["--out", str(tmp_path / "ref"), *args])
    assert r.exit_code == 0, r.output
    return RunDir(tmp_path / "ref")


def _same_run(a: RunDir, b: RunDir, steps: int, interval: int) -> None:
    assert a.read_roots() == b.read_roots()
    for s in range(1, steps + 1):
        assert a.log_path(s).read_bytes() == b.log_path(s).read_bytes(), f"log of step {s}"
    for s in [0, *range(interval, steps + 1, interval), steps]:
        assert a.ckpt_path(s).read_bytes() == b.ckpt_path(s).read_bytes(), f"checkpoint of step {s}"


@pytest.mark.slow
def test_cli_two_ranks_train_the_resnet_resume_after_a_killed_rank_and_replay(tmp_path, monkeypatch):
    """`vtrain train --model resnet --nproc 2` over gloo: rank 1 dies in step 3, `--resume RUN
    --nproc 2` finishes it, and the folder equals a one-process run's; `vtrain replay` matches."""
    args = ["--model", RESNET.model, "--model-arg", "width=4", "--steps", "4", "--interval", "2", "--batch-size", "7"]
    ref = _ref_run(tmp_path, args)
    run = tmp_path / "two"
    monkeypatch.setenv(FAULT_ENV, "1:3")
    monkeypatch.setenv("VTRAIN_DIST_TIMEOUT", "20")
    r = CliRunner().invoke(train_cmd, ["--out", str(run), "--nproc", "2", *args])
    assert r.exit_code != 0 and "rank 1 (killed by SIGKILL)" in r.output, r.output
    assert sorted(RunDir(run).read_roots()) == [1, 2]
    monkeypatch.delenv(FAULT_ENV)
    r = CliRunner().invoke(train_cmd, ["--resume", str(run), "--nproc", "2"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["first_step"] == 3 and summary["world_size"] == 2 and summary["backend"] == "gloo"
    _same_run(ref, RunDir(run), 4, 2)
    rep = CliRunner().invoke(replay_cmd, ["--run", str(run)])
    assert rep.exit_code == 0, rep.output
    assert json.loads(rep.output.strip().splitlines()[-1])["matched"] == 4
    r = CliRunner().invoke(train_cmd, ["--resume", str(run), "--nproc", "2"])
    assert r.exit_code != 0 and "already holds a complete run of 4 steps" in r.output


@pytest.mark.slow
def test_a_killed_two_rank_run_resumes_under_any_world_size(tmp_path, monkeypatch):
    """A 2-rank run whose rank 1 dies in step 4 (step 3 recorded, no checkpoint after step 2)
    resumes from step 2 with --nproc 2, 1 or 3 and ends as an uninterrupted one-process run."""
    args = ["--steps", "5", "--interval", "2", "--batch-size", "9"]
    ref = _ref_run(tmp_path, args)
    killed = tmp_path / "killed"
    monkeypatch.setenv(FAULT_ENV, "1:4")
    monkeypatch.setenv("VTRAIN_DIST_TIMEOUT", "20")
    r = CliRunner().invoke(train_cmd, ["--out", str(killed), "--nproc", "2", *args])
    assert r.exit_code != 0 and "resumes from its last checkpoint" in r.output, r.output
    assert sorted(RunDir(killed).read_roots()) == [1, 2, 3] and not RunDir(killed).ckpt_path(3).exists()
    monkeypatch.delenv(FAULT_ENV)
    for nproc in (2, 1, 3):
        run = tmp_path / f"resumed{nproc}"
        shutil.copytree(killed, run)
        r = CliRunner().invoke(train_cmd, ["--resume", str(run), "--nproc", str(nproc)])
        assert r.exit_code == 0, (nproc, r.output)
        _same_run(ref, RunDir(run), 5, 2)


class _Mix(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 3))
        self.fn = fn

    def forward(self, x):
        return self.fn(x * self.w)


def _captured(fn):
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    task = TorchTask(_Mix(fn), lambda out, y: (out * out).sum(), {"name": "SGD", "lr": 0.1}, [x], x)
    return capture(task, 4).graph


@pytest.mark.parametrize("fn, why", [
    (lambda h: h.index_select(0, torch.tensor([3, 2, 1, 0])), "along the batch axis"),
    (lambda h: h[1:] - h[:-1], "slices the batch axis"),
])
def test_a_torch_model_that_mixes_samples_is_refused_naming_the_op(fn, why):
    with pytest.raises(GraphError, match=rf"sharding: op \d+ \((TAKE|SLICE|PAD)\b.*{why}"):
        analyse(_captured(fn))


def test_a_torch_model_that_centres_the_batch_is_a_batch_reduction():
    g = _captured(lambda h: h - h.mean(0, keepdim=True))
    plan = analyse(g)
    assert any(g.ops[i].kind == OpKind.MEAN for i in plan.reductions)
