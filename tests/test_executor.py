"""The executor's fast paths against its eager reference path, device plumbing and thread control.

The plain trainer/replay path defers NaN/Inf checks to one FP64 sum per step and runs the rounding
rule through the fast filter; the eager path (taken with an op hook, ``check`` or a resolver)
checks every op as it goes. Both must give the same state, loss, log and trace bits, and the same
error naming the first bad op.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.graph.executor import StepExecutor, exp64, physical_cores, resolve_device, set_threads, state_tensors
from vtrain.models.nn import GPTConfig, MLPConfig
from vtrain.models.optim import AdamWConfig, SGDConfig
from vtrain.numerics.logfile import encode_step_log
from vtrain.training.loop import batch_for
from vtrain.training.spec import TrainSpec, build_job


def _gpt_job():
    return build_job(TrainSpec(model="gpt", optimizer=AdamWConfig(), batch_size=4,
                               gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))


def _identity_hook(op, ins, out, log):
    return out


def _bits(ts: list[torch.Tensor]) -> list[bytes]:
    return [t.contiguous().view(torch.int32).numpy().tobytes() for t in ts]


@pytest.mark.parametrize("mode", ["certified", "round-nolog", "paper"])
def test_deferred_checks_give_the_eager_paths_bits(mode: str) -> None:
    job = _gpt_job()
    ex = StepExecutor(job.graph, mode)
    fast = eager = state_tensors(job.initial_state)
    for s in (1, 2):
        data = batch_for(job, s)
        a = ex.run(fast, data, step=s, keep_trace=True)
        b = ex.run(eager, data, step=s, keep_trace=True, op_hook=_identity_hook)  # eager path
        assert _bits(a.state) == _bits(b.state)
        assert _bits(a.trace) == _bits(b.trace)
        assert a.loss == b.loss
        if mode != "round-nolog":
            assert encode_step_log(a.log, s, job.graph) == encode_step_log(b.log, s, job.graph)
        if mode == "certified":  # replay: deferred vs eager (check=True)
            r1 = ex.run(fast, data, log_in=a.log, step=s)
            r2 = ex.run(fast, data, log_in=a.log, step=s, check=True)
            assert _bits(r1.state) == _bits(a.state) == _bits(r2.state)
            assert r2.violations == []
        fast, eager = a.state, b.state


def test_concat_of_parts_back_to_back_is_a_view_and_else_a_copy() -> None:
    from vtrain.graph.executor import concat_flat

    buf = torch.arange(10, dtype=torch.float32)
    parts = [buf[0:3], buf[3:3], buf[3:7], buf[7:10]]
    got = concat_flat(parts)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(got, buf)  # no copy
    for spoiled in ([buf[0:3], buf[4:7]], [buf[3:7], buf[0:3]], [buf[0:3], buf.double()[3:7]],
                    [buf[0:3], torch.arange(3.0, 7.0)], [buf[0:4:2], buf[4:6]]):
        out = concat_flat(spoiled)
        assert torch.equal(out, torch.cat(spoiled)) and out.data_ptr() != buf.data_ptr()


@pytest.mark.parametrize("optimizer", [AdamWConfig(), SGDConfig(momentum=0.9)])
def test_a_step_from_a_handed_on_state_leaves_it_intact(optimizer) -> None:
    """The flat optimizer's state comes back from a step as views of one buffer per kind, which the
    next step's CONCATs read in place (``concat_flat``): that step, run twice from it and once from
    a copy of it, gives the same bits, trace, log and loss and leaves the state it read unchanged."""
    job = build_job(TrainSpec(model="gpt", optimizer=optimizer, batch_size=4,
                              gpt=GPTConfig(n_layer=1, d_model=32, n_head=2, context=16)))
    ex = StepExecutor(job.graph, "certified")
    handed = ex.run(state_tensors(job.initial_state), batch_for(job, 1), step=1).state
    before = _bits(handed)
    copied = [t.clone() for t in handed]
    data = batch_for(job, 2)
    runs = [ex.run(handed, data, step=2), ex.run(handed, data, step=2), ex.run(copied, data, step=2),
            ex.run(handed, data, step=2, keep_trace=True)]
    assert _bits(handed) == before
    for r in runs[1:]:
        assert _bits(r.state) == _bits(runs[0].state) and r.loss == runs[0].loss
        assert encode_step_log(r.log, 2, job.graph) == encode_step_log(runs[0].log, 2, job.graph)
    rep = ex.run(handed, data, log_in=runs[0].log, step=2, check=True)
    assert _bits(rep.state) == _bits(runs[0].state) and not rep.violations and _bits(handed) == before


def test_a_non_finite_value_names_the_first_bad_op_on_the_fast_path() -> None:
    job = build_job(TrainSpec(model="mlp", batch_size=4, mlp=MLPConfig(hidden=(8,))))
    state = state_tensors(job.initial_state)
    state[0] = state[0].clone()
    state[0][0, :] = float(np.float32(3e38))  # the first matmul overflows FP32
    ex = StepExecutor(job.graph, "certified")
    msgs = []
    for hook in (None, _identity_hook):
        with pytest.raises(NonFiniteValue) as e:
            ex.run(state, batch_for(job, 1), step=1, op_hook=hook)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
    assert "step 1, op" in msgs[0] and "expected finite values" in msgs[0]


def test_a_replay_on_another_device_object_gives_the_same_bits() -> None:
    """Device plumbing, tested on the CPU: explicit 'cpu' and torch.device('cpu') executors agree."""
    job = build_job(TrainSpec(model="mlp", optimizer=SGDConfig(), batch_size=4))
    state = state_tensors(job.initial_state)
    res = StepExecutor(job.graph, "certified", "cpu").run(state, batch_for(job, 1), step=1)
    rep = StepExecutor(job.graph, "certified", torch.device("cpu")).run(state, batch_for(job, 1), log_in=res.log)
    assert _bits(res.state) == _bits(rep.state)
    assert all(t.device.type == "cpu" for t in rep.state)


def test_cuda_requested_without_a_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(VtrainError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(VtrainError, match="expected cpu or cuda"):
        resolve_device("tpu")


def test_set_threads_sets_torch_and_rejects_nonsense() -> None:
    n = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        assert set_threads(None) == physical_cores() >= 1
    finally:
        torch.set_num_threads(n)
    with pytest.raises(VtrainError, match="positive"):
        set_threads(0)


def test_cli_train_and_replay_take_device_and_threads(tmp_path) -> None:
    from vtrain.cli import replay_cmd, train_cmd

    n = torch.get_num_threads()
    try:
        run = tmp_path / "run"
        r = CliRunner().invoke(train_cmd, ["--out", str(run), "--steps", "2", "--interval", "2",
                                           "--device", "cpu", "--threads", "1"])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output.strip().splitlines()[-1])
        assert (out["device"], out["threads"]) == ("cpu", 1)
        r = CliRunner().invoke(replay_cmd, ["--run", str(run), "--device", "cpu", "--threads", "1"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output.strip().splitlines()[-1])["matched"] == 2
        if not torch.cuda.is_available():
            r = CliRunner().invoke(replay_cmd, ["--run", str(run), "--device", "cuda"])
            assert r.exit_code == 2 and "CUDA is not available" in r.output
    finally:
        torch.set_num_threads(n)


def test_gpu_check_script_cpu_path_replays_bit_exactly() -> None:
    """scripts/gpu_check.sh with the CPU on both sides (its GPU path needs a GPU: run by hand)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run(["bash", "scripts/gpu_check.sh", "--device", "cpu", "--tiny", "--steps", "2"], cwd=root,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "| small-gpt | cpu | cpu | 2/2 bit-exact |" in p.stdout
    if not torch.cuda.is_available():
        p = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=root, capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and "CUDA is not available" in p.stderr


def test_exp64_is_torch_exp_bit_for_bit() -> None:
    """The executor's FP64 exp skips torch's slow path below -746 and must still be torch.exp."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**64, 400_000, dtype=np.uint64)
    x = torch.from_numpy(bits.view(np.float64).copy())
    edges = torch.tensor([-746.0, np.nextafter(-746.0, 0.0), np.nextafter(-746.0, -np.inf), -745.1332191019412,
                          -745.13321910194122, -744.0, -1e9, -np.inf, np.inf, np.nan, -0.0, 0.0, 709.78, 710.0],
                         dtype=torch.float64)
    near = torch.linspace(-760.0, -700.0, 100_001, dtype=torch.float64)
    for t in (x, edges, near, torch.full((7,), -1e9, dtype=torch.float64), torch.randn(999, dtype=torch.float64)):
        got, ref = exp64(t), torch.exp(t)
        assert torch.equal(torch.isnan(got), torch.isnan(ref))
        ok = ~torch.isnan(ref)
        assert torch.equal(got[ok].view(torch.int64), ref[ok].view(torch.int64))


def test_a_cpu_executor_pins_the_malloc_thresholds_once_unless_told_not_to(monkeypatch) -> None:
    """Building a CPU executor pins glibc's malloc thresholds (where the process runs glibc), once;
    ``VTRAIN_MALLOC_PIN=0`` leaves them alone."""
    import platform
    import sys

    import vtrain.graph.executor as E

    StepExecutor(build_job(TrainSpec(batch_size=4, steps=1)).graph, "certified")
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert E._MALLOC_PINNED == glibc
    assert E.pin_malloc_thresholds() == glibc  # (a second call: nothing more to do)
    monkeypatch.setattr(E, "_MALLOC_PINNED", False)
    monkeypatch.setenv("VTRAIN_MALLOC_PIN", "0")
    assert E.pin_malloc_thresholds() is False and E._MALLOC_PINNED is False
