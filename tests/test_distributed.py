"""Data-parallel training (vtrain.distributed): world sizes 1, 2, 3 give the single process's bits.

In-process tests run the ranks as threads whose all-reduce adds the partials in adversarial orders
(a random summation tree per rank and per call, so the ranks even see different FP64 sums); the
others run real ranks: `vtrain train --nproc N` processes on gloo over loopback.
"""

from __future__ import annotations

import json
import os
import random
import threading

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vtrain.cli import replay_cmd, train_cmd
from vtrain.distributed.collective import Collective, Combiner, RanksDisagree
from vtrain.distributed.launch import launch
from vtrain.distributed.sharding import Placement, analyse, shards
from vtrain.distributed.worker import FAULT_ENV, distributed_train_steps
from vtrain.errors import GraphError, VtrainError
from vtrain.graph.executor import state_tensors
from vtrain.graph.step_graph import GraphBuilder, OpKind
from vtrain.models.optim import AdamWConfig
from vtrain.numerics.canonical import decide, decide_rows, exact_element, exact_element_of_terms, op_desc
from vtrain.numerics.logfile import encode_step_log
from vtrain.numerics.rounding import gamma
from vtrain.training.loop import replay_steps, train_steps
from vtrain.training.rundir import RunDir
from vtrain.training.spec import TrainSpec, build_job

MLP = TrainSpec(batch_size=12, steps=3, interval=2)
GPT = TrainSpec(model="gpt", batch_size=6, steps=2, interval=2, corpus_chars=2000, optimizer=AdamWConfig())


# -- in-process ranks --------------------------------------------------------------------------------
class _Group:
    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=120)
        self.slots: list = [None] * world

    def exchange(self, rank: int, obj):
        self.slots[rank] = obj
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got


class AdversarialCombiner(Combiner):
    """All-reduce by a random summation tree of the partials, drawn anew per rank and per call; with
    ``skew_n`` it also moves each rank's sum by up to 0.9 g(skew_n) S (within the certified bound
    of any sum of at least ``skew_n`` terms): every rank then holds another honest FP64 value."""

    def __init__(self, group: _Group, rank: int, seed: int = 0, skew_n: int | None = None) -> None:
        self.group, self.rank, self.world = group, rank, group.world
        self.rng = random.Random(seed * 1000 + rank)
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank)
        self.skew_n = skew_n

    def all_reduce_sum(self, t):
        parts = [p.clone() for p in self.group.exchange(self.rank, t)]
        if self.rng.random() < 0.2:
            parts.reverse()
            acc = parts[0]
            for p in parts[1:]:
                acc = acc + p
        else:
            while len(parts) > 1:  # any tree: pick two, add them in FP64, put the sum back
                i, j = sorted(self.rng.sample(range(len(parts)), 2))
                b, a = parts.pop(j), parts.pop(i)
                parts.append(a + b if self.rng.random() < 0.5 else b + a)
            acc = parts[0]
        if self.skew_n and t.dtype == torch.float64 and t.shape[0] == 2:  # [partial sums, partial |t| sums]
            r = torch.rand(acc[0].shape, generator=self.gen, dtype=torch.float64) * 1.8 - 0.9
            acc[0] = acc[0] + r * gamma(self.skew_n) * acc[1]
        return acc

    def all_reduce_max(self, t):
        return torch.stack(self.group.exchange(self.rank, t)).amax(dim=0)

    def all_gather(self, t):
        return [p.clone() for p in self.group.exchange(self.rank, t)]

    def all_gather_object(self, obj):
        return self.group.exchange(self.rank, obj)


def _threads(job, world: int, steps: int, seed: int = 0, states=None, skew: bool = True):
    """Outcomes of every rank (threads), per step; ``states`` may give a rank another start state."""
    group = _Group(world)
    results: list = [None] * world
    errors: list = [None] * world

    def body(r: int) -> None:
        try:
            st = states[r] if states else state_tensors(job.initial_state)
            comb = AdversarialCombiner(group, r, seed, job.spec.batch_size if skew else None)
            results[r] = list(distributed_train_steps(job, st, 1, steps, comb))
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors[r] = e
            group.barrier.abort()

    ts = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
    if first is not None:
        raise first
    return results


def _reference(job, steps: int):
    return [(o.state_root, encode_step_log(o.log, o.step, job.graph)) for o in
            train_steps(job, state_tensors(job.initial_state), 1, steps)]


def _pairs(job, outcomes):
    return [(o.state_root, encode_step_log(o.log, o.step, job.graph)) for o in outcomes]


@pytest.fixture(scope="module")
def mlp_job():
    return build_job(MLP)


def test_sharding_analysis_finds_the_batch_reductions(mlp_job):
    g = mlp_job.graph
    plan = analyse(g)
    kinds = sorted(g.ops[i].kind.name for i in plan.reductions)
    # loss mean, and per layer the weight gradient (K = batch) and the bias gradient (sum over batch)
    assert kinds == ["MATMUL", "MATMUL", "MEAN", "SUM", "SUM"]
    assert plan.placement[next(o.id for o in g.ops if o.kind == OpKind.DATA)] == Placement(0, 1)
    for slot, op in g.grad_ops.items():
        assert plan.placement[op] is None, f"gradient of slot {slot} must be replicated"
    assert all(plan.placement[o.id] is None for o in g.ops if o.kind in (OpKind.INPUT, OpKind.OUTPUT))
    gpt = build_job(GPT).graph
    gplan = analyse(gpt)
    assert {gpt.ops[i].kind for i in gplan.reductions} == {OpKind.MATMUL, OpKind.SUM, OpKind.MEAN}
    assert len(gplan.reductions) == 19  # 7 weight matmuls, 11 bias/LN/wpe sums, the loss mean
    assert [(s.start, s.size) for s in shards(7, 3)] == [(0, 3), (3, 2), (5, 2)]


def test_sharding_refuses_a_state_that_depends_on_one_shard():
    b = GraphBuilder()
    w = b.input("w", (4, 3))
    x = b.data((4, 3))
    y = b.add(w, x)  # a per-sample value written as state
    b.output(y, 0)
    with pytest.raises(GraphError, match=r"op \d+ \(OUTPUT w\) writes a state slot from one shard"):
        analyse(b.build(y))
    with pytest.raises(GraphError, match="cannot be split over 3 ranks"):
        shards(2, 3)
    b = GraphBuilder()
    loss = b.sum(b.data((4, 3)))  # one loss per sample
    with pytest.raises(GraphError, match=r"the loss \(op 1\) is per sample"):
        analyse(b.build(loss))


def test_a_missing_spec_stops_every_rank_with_the_leaders_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(VtrainError, match=r"rank 1 \(exit status 1\): rank 1: VtrainError: leader \(rank 0\): no spec"):
        launch(tmp_path / "empty", 2, timeout_s=30)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_world_sizes_match_one_process_under_adversarial_all_reduce_orders(mlp_job, world):
    ref = _reference(mlp_job, MLP.steps)
    outs = _threads(mlp_job, world, MLP.steps, seed=world)
    for r in range(world):
        assert _pairs(mlp_job, outs[r]) == ref, f"rank {r} of {world}"


def test_uneven_shards_match_one_process():
    job = build_job(TrainSpec(batch_size=7, steps=2, interval=2))
    ref = _reference(job, 2)
    for world in (2, 3):
        outs = _threads(job, world, 2, seed=7)
        assert all(_pairs(job, outs[r]) == ref for r in range(world))


def test_gpt_world_sizes_match_one_process():
    job = build_job(GPT)
    ref = _reference(job, GPT.steps)
    for world in (2, 3):
        outs = _threads(job, world, GPT.steps, seed=world)
        assert all(_pairs(job, outs[r]) == ref for r in range(world)), f"world {world}"


def test_a_rank_with_other_bits_stops_training_naming_step_and_rank(mlp_job):
    good = state_tensors(mlp_job.initial_state)
    bad = [t.clone() for t in good]
    bad[0].view(-1)[0] = torch.nextafter(bad[0].view(-1)[0], torch.tensor(1.0))
    with pytest.raises(RanksDisagree, match=r"step 1: ranks \[1\] disagree with rank 0"):
        _threads(mlp_job, 2, 1, states=[good, bad])


def test_row_decisions_equal_the_tensor_decisions():
    """The data-parallel path decides a candidate from its gathered terms; the single process from
    the tensors: the exact rationals must agree, and so must the fast paths (any order of terms)."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    a_t, w_t = b.data((5, 40)), b.input("w", (3, 40))
    mm = b.matmul(a_t, w_t)
    g = b.build(mm)
    a = (rng.standard_normal((5, 40)) * 2.0 ** rng.integers(-30, 30, (5, 40))).astype(np.float32)
    w = rng.standard_normal((3, 40)).astype(np.float32)
    desc = op_desc(g, g.ops[mm.op])
    rows = torch.from_numpy(a).double().unsqueeze(1) * torch.from_numpy(w).double().unsqueeze(0)  # [5, 3, 40]
    rows = rows.reshape(15, 40)
    bits, codes, _ = decide_rows(OpKind.MATMUL, rows)
    perm = rows[:, torch.from_numpy(rng.permutation(40))]
    bits_p, codes_p, _ = decide_rows(OpKind.MATMUL, perm)
    assert torch.equal(bits, bits_p) and torch.equal(codes, codes_p)
    for i in range(15):
        want = exact_element(desc, [a, w], i)
        got = exact_element_of_terms(OpKind.MATMUL, rows[i].tolist())
        assert (got.value, got.dc, got.Dc) == (want.value, want.dc, want.Dc)
        assert (int(bits[i]), int(codes[i])) == decide(want)


# -- real ranks (processes, gloo on loopback) ----------------------------------------------------------
def test_cli_two_ranks_write_the_single_process_run_and_it_replays(tmp_path):
    """`vtrain train --nproc 2` (two gloo processes) writes the same roots, logs and checkpoints as
    one process, and `vtrain replay` in one process matches every step."""
    args = ["--steps", "3", "--interval", "2", "--batch-size", "12"]
    r1 = CliRunner().invoke(train_cmd, ["--out", str(tmp_path / "one"), *args])
    r2 = CliRunner().invoke(train_cmd, ["--out", str(tmp_path / "two"), "--nproc", "2", *args])
    assert r1.exit_code == 0, r1.output
    assert r2.exit_code == 0, r2.output
    s1, s2 = json.loads(r1.output.strip().splitlines()[-1]), json.loads(r2.output.strip().splitlines()[-1])
    assert s2["world_size"] == 2 and s2["final_state_root"] == s1["final_state_root"]
    one, two = RunDir(tmp_path / "one"), RunDir(tmp_path / "two")
    assert one.read_roots() == two.read_roots()
    for s in (1, 2, 3):
        assert one.log_path(s).read_bytes() == two.log_path(s).read_bytes()
    for s in (0, 2, 3):
        assert one.ckpt_path(s).read_bytes() == two.ckpt_path(s).read_bytes()
    rep = CliRunner().invoke(replay_cmd, ["--run", str(tmp_path / "two")])
    assert rep.exit_code == 0, rep.output
    assert json.loads(rep.output.strip().splitlines()[-1])["matched"] == 3


def _cpu_capabilities() -> list[str]:
    caps = ["default"]
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx2" in flags:
        caps.append("avx2")
    if " avx512f" in flags:
        caps.append("avx512")
    return caps


@pytest.mark.slow
def test_ranks_in_different_cpu_environments_and_three_gpt_ranks(tmp_path):
    caps = _cpu_capabilities()
    spec = GPT
    job = build_job(spec)
    ref = [o.state_root.hex() for o in train_steps(job, state_tensors(job.initial_state), 1, spec.steps)]
    run = RunDir(tmp_path / "envs")
    run.write_spec(spec)
    envs = [{"ATEN_CPU_CAPABILITY": caps[-1], "MKL_CBWR": "AUTO"},
            {"ATEN_CPU_CAPABILITY": caps[0], "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}]
    summary = launch(run.path, 2, rank_env=envs)
    assert summary["cpu_capability"] == [caps[-1].upper(), caps[0].upper()]
    assert [run.read_roots()[s]["state_root"] for s in (1, 2)] == ref
    run3 = RunDir(tmp_path / "three")
    run3.write_spec(spec)
    launch(run3.path, 3)
    assert run3.read_roots() == run.read_roots()
    st = run.read_checkpoint(0, job.graph)
    replayed = [o.state_root.hex() for o in replay_steps(job, st, 1, 2, lambda s: run3.read_log(s, job.graph))]
    assert replayed == ref


@pytest.mark.slow
def test_a_killed_rank_ends_the_run_with_an_error_and_the_folder_resumes(tmp_path):
    spec = TrainSpec(batch_size=12, steps=6, interval=2)
    job = build_job(spec)
    ref = {o.step: o.state_root.hex() for o in train_steps(job, state_tensors(job.initial_state), 1, spec.steps)}
    run = RunDir(tmp_path / "run")
    run.write_spec(spec)
    envs = [{}, {FAULT_ENV: "1:5"}]
    with pytest.raises(VtrainError, match=r"rank 1 \(killed by SIGKILL\).*resumes from its last checkpoint"):
        launch(run.path, 2, rank_env=envs, timeout_s=20)
    done = run.read_roots()
    assert max(done) == 4 and all(done[s]["state_root"] == ref[s] for s in done)
    summary = launch(run.path, 2, resume=True)
    assert summary["first_step"] == 5
    assert {s: r["state_root"] for s, r in run.read_roots().items()} == ref


class _Offset(AdversarialCombiner):
    """Each rank's FP64 sum moved by its own ``offset * g(n) * S`` (an honest value for |offset| < 1)."""

    def __init__(self, group: _Group, rank: int, offset: float, n: int) -> None:
        super().__init__(group, rank)
        self.offset, self.n = offset, n

    def all_reduce_sum(self, t):
        acc = torch.stack(self.group.exchange(self.rank, t)).sum(dim=0)
        acc[0] = acc[0] + self.offset * gamma(self.n) * acc[1]
        return acc


def test_ranks_whose_sums_differ_decide_the_union_of_their_candidates():
    """An exact sum 4d from a midpoint: rank 0's honest FP64 sum is a candidate, rank 1's is not.
    Both must still take part in deciding it (else rank 0 waits forever for rank 1's terms)."""
    b = GraphBuilder()
    x = b.data((4, 1))
    total = b.sum(b.reshape(x, (1, 4)))
    g = b.build(total)
    plan = analyse(g)
    assert plan.reductions == {total.op}
    t3 = np.float32(4 * 1.01 * gamma(4) * (1 + 2**-24))  # 1 + 2^-24 is the midpoint above 1
    data = torch.tensor([[1.0], [2**-24], [float(t3)], [0.0]], dtype=torch.float32)
    group = _Group(2)
    group.barrier = threading.Barrier(2, timeout=10)
    outs: list = [None, None]

    def body(r: int) -> None:
        sh = shards(4, 2)[r]
        coll = Collective(plan, sh, _Offset(group, r, -0.5 if r == 0 else 0.5, 4))
        local = data[sh.start : sh.start + sh.size].reshape(1, sh.size)
        outs[r] = coll.reduce(g.ops[total.op], [local])

    ts = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert outs[0] is not None and outs[1] is not None, "a rank hung deciding the candidates"
    (o0, l0, _), (o1, l1, _) = outs
    assert torch.equal(o0, o1) and float(o0) == 1 + 2**-23  # e is 4d above the midpoint: no entry
    assert len(l0) == len(l1) == 0


@pytest.mark.slow
def test_a_data_parallel_trainer_agent_posts_the_single_process_roots(tmp_path):
    """The trainer agent with nproc=2 runs the same on-chain flow; its posted roots and published
    artifacts equal a one-process trainer's, and an auditor (one process) finds nothing wrong."""
    from protocol.auditor import AuditorAgent
    from protocol.chain import Chain
    from protocol.demo import create_job, default_spec
    from protocol.deploy import deploy
    from protocol.jobs import JobContext, Terms
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(default_spec("mlp"))
    store = ArtifactStore(tmp_path)
    jobs = []
    for nproc in (1, 2):
        job = create_job(proto, a[1], a[2], ctx, Terms())
        trainer = TrainerAgent(proto, a[2], ctx, store, job, nproc=nproc)
        trainer.accept(Terms())
        while trainer.run_interval() is not None:
            pass
        jobs.append(job)
    one, two = jobs
    for i in range(ctx.n_intervals):
        get = proto.registry.functions.getInterval
        assert bytes(chain.call(get(one, i))[0]) == bytes(chain.call(get(two, i))[0])
        assert store.get_checkpoint(one, i) == store.get_checkpoint(two, i)
    for s in range(1, ctx.spec.steps + 1):
        assert store.get_log(one, s) == store.get_log(two, s)
        assert store.get_step(one, s) == store.get_step(two, s)
    assert AuditorAgent(proto, a[3], ctx, store, two).audit() is None


def test_cli_refuses_more_ranks_than_samples_and_uncertified_modes(tmp_path):
    r = CliRunner().invoke(train_cmd, ["--out", str(tmp_path / "a"), "--nproc", "5", "--batch-size", "4"])
    assert r.exit_code != 0 and "batch_size 4 is smaller than the 5 ranks" in r.output
    r = CliRunner().invoke(train_cmd, ["--out", str(tmp_path / "b"), "--nproc", "2", "--mode", "paper"])
    assert r.exit_code != 0 and "expected mode 'certified', got 'paper'" in r.output
    assert not (tmp_path / "a" / "spec.json").exists()


def test_a_biased_batch_matmul_and_a_batch_max_match_one_process():
    """Reductions the models do not use yet: a MATMUL over the batch with a bias (one term, added by
    rank 0 only) and a MAX over the batch (exact MAX all-reduce); a replicated operand is cut to the shard."""
    from vtrain.distributed.collective import Collective as Coll
    from vtrain.graph.executor import StepExecutor

    rng = np.random.default_rng(5)
    B = 7
    b = GraphBuilder()
    x = b.data((B, 5))
    w = b.const(rng.standard_normal((3, B)).astype(np.float32), "w")
    bias = b.const(rng.standard_normal(3).astype(np.float32), "bias")
    mm = b.matmul(b.transpose(x), w, bias)  # (5, 3), K = batch
    mx = b.max(b.reshape(x, (1, B * 5)))  # (1, 1)
    loss = b.add(b.sum(b.reshape(mm, (1, 15))), mx)
    g = b.build(loss)
    plan = analyse(g)
    assert {mm.op, mx.op} <= plan.reductions and mm.op in plan.slice_inputs
    data = torch.from_numpy(rng.standard_normal((B, 5)).astype(np.float32))
    ref = StepExecutor(g).run([], data, keep_trace=True).trace
    for world in (2, 3):
        group = _Group(world)
        got: list = [None] * world

        def body(r: int, world: int = world, group: _Group = group, got: list = got) -> None:
            sh = shards(B, world)[r]
            ex = StepExecutor(plan.local_graph(sh), collective=Coll(plan, sh, AdversarialCombiner(group, r, 1)))
            got[r] = ex.run([], data[sh.start : sh.start + sh.size], keep_trace=True).trace

        ts = [threading.Thread(target=body, args=(r,)) for r in range(world)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for r in range(world):
            for op in (mm.op, mx.op, loss.op):
                assert torch.equal(got[r][op], ref[op]), f"op {op}, rank {r} of {world}"


@pytest.mark.slow
def test_torchrun_runs_the_worker_with_its_rendezvous(tmp_path):
    """The multi-host path: torchrun sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE (here one node, 2 ranks)."""
    import subprocess
    import sys
    from pathlib import Path

    from vtrain.distributed.launch import free_port

    spec = TrainSpec(batch_size=12, steps=3, interval=2)
    job = build_job(spec)
    ref = [o.state_root.hex() for o in train_steps(job, state_tensors(job.initial_state), 1, spec.steps)]
    run = RunDir(tmp_path / "tr")
    run.write_spec(spec)
    torchrun = Path(sys.executable).with_name("torchrun")
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root), GLOO_SOCKET_IFNAME="lo")
    cmd = [str(torchrun), "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "vtrain.distributed.worker", str(run.path)]
    done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [run.read_roots()[s]["state_root"] for s in (1, 2, 3)] == ref


def test_a_step_with_no_finite_value_on_two_ranks_is_a_divergence_as_in_one_process():
    """lr 1e6 on the MLP: step 3's MUL (op 17) overflows. Two real ranks give the steps before it and
    then the same typed error as one process (op named), not an anonymous failed rank: a trainer
    agent with --nproc 2 refuses such a job by name (protocol.trainer.JobDiverges) instead of a
    generic rank failure."""
    from dataclasses import replace

    from vtrain.distributed.launch import train_span
    from vtrain.errors import NonFiniteValue

    spec = TrainSpec(model="mlp", batch_size=16, steps=4, interval=4)
    job = build_job(replace(spec, optimizer=replace(spec.optimizer, lr=1e6)))
    state = state_tensors(job.initial_state)
    one, two = [], []
    with pytest.raises(NonFiniteValue) as e1:
        for o in train_steps(job, state, 1, 4):
            one.append(o.state_root)
    with pytest.raises(NonFiniteValue) as e2:
        for o in train_span(job, state, 1, 4, nproc=2):
            two.append(o.state_root)
    assert len(one) == 2 and two == one
    assert e1.value.op == e2.value.op == 17, (e1.value, e2.value)
    assert "step 3" in str(e2.value)
