"""Mode ``paper`` is the seed paper's scheme as its code does it (vtrain.numerics.paper): its trit
code, its decimal threshold, its auditor correction, the ops its hooks log, and its file layout,
read back by a decoder written here from the paper's documented layout (not vtrain's reader)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from protocol.cli import main
from vtrain.graph.step_graph import ROUNDING_KINDS, OpKind
from vtrain.models.nn import MLPConfig
from vtrain.numerics.paper import apply_paper, hooked_ops, paper_log_bytes, round_paper
from vtrain.numerics.rounding import DenseLog
from vtrain.training.spec import TrainSpec, build_job

E = 2.0**-23


def trits(values: list[float]) -> list[int]:
    return round_paper(torch.tensor(values, dtype=torch.float64))[1].trits.tolist()


def test_the_trit_code_is_0_down_1_none_2_up() -> None:
    # near 1 the FP32 spacing is 2^-23 and the threshold 0.25 * 2^-23
    assert trits([1 + 0.3 * E, 1 + 0.7 * E, 1.0, 0.0, -(1 + 0.3 * E)]) == [0, 2, 1, 1, 2]


def test_the_threshold_is_decimal_not_the_fp32_spacing() -> None:
    # the same place between two FP32 neighbours (20% of the way): not logged at 1, logged at 8,
    # because 8 shares the decade of 1 (threshold 0.25 * 2^-23) but has 8x the spacing
    assert trits([1 + 0.2 * E]) == [1]
    assert trits([8 + 0.2 * 8 * E]) == [0]
    # and just past 10 the decade changes: the threshold grows 10x
    assert trits([10 + 0.2 * 8 * E]) == [1]


def test_the_auditor_moves_one_step_only_where_its_own_threshold_fires() -> None:
    mid = 1 + 0.5 * E  # the midpoint between 1 and its upper neighbour
    t_v = torch.tensor([mid - 1e-3 * E], dtype=torch.float64)  # trainer: rounds down, logs 0
    _, log = round_paper(t_v)
    assert log.trits.tolist() == [0]
    a_v = torch.tensor([mid + 1e-3 * E], dtype=torch.float64)  # auditor: would round up
    assert float(a_v.float()) == 1 + E
    assert float(apply_paper(a_v, log)) == 1.0  # corrected to the trainer's value
    # an auditor whose own threshold does not fire is not corrected (the paper's rule)
    quiet = torch.tensor([1 + 0.1 * E], dtype=torch.float64)
    assert float(apply_paper(quiet, DenseLog(np.array([2], np.uint8)))) == 1.0
    with pytest.raises(Exception, match="expected 1 trits"):
        apply_paper(a_v, DenseLog(np.array([0, 1], np.uint8)))


def test_the_hooks_log_forward_outputs_and_activation_gradients_only() -> None:
    job = build_job(TrainSpec(mlp=MLPConfig(hidden=(8,)), batch_size=4))
    g = job.graph
    h = hooked_ops(g)
    forward = [op.id for op in g.ops if op.kind in ROUNDING_KINDS and op.id <= g.loss_op]
    assert [o for o, w in h.items() if w == "forward"] == forward
    back_mm = sorted(g.ops[o].shape for o, w in h.items() if w == "backward" and g.ops[o].kind == OpKind.MATMUL)
    assert back_mm == [(4, 8)]  # dL/dh of the hidden layer; not dL/dW (10x8, 8x64) nor dL/d(data)
    last_grad = max(g.grad_ops.values())
    assert not [o for o in h if o > last_grad]  # the optimizer update is not logged
    assert not set(h) & g.weight_grad_ops
    assert {g.ops[o].shape for o in g.weight_grad_ops if g.ops[o].kind == OpKind.MATMUL} == {(10, 8), (8, 64)}


def _decode_paper_log(log_file: Path) -> list[np.ndarray]:
    """The paper's layout, read from its description (docs/numerics.md, paper-code notes): a
    ``_metadata`` sidecar with ``numel, nbytes`` per tensor; per tensor ``nbytes`` raw bytes, each
    byte five base-3 digits, the first trit in the lowest digit; padding past ``numel`` dropped."""
    meta = [tuple(int(x) for x in line.split(",")) for line in
            Path(str(log_file) + "_metadata").read_text().splitlines()]
    raw = log_file.read_bytes()
    assert sum(nb for _, nb in meta) == len(raw)  # no header, no compression
    out, pos = [], 0
    for numel, nbytes in meta:
        assert nbytes == -(-numel // 5)
        digits = []
        for byte in raw[pos:pos + nbytes]:
            for _ in range(5):
                digits.append(byte % 3)
                byte //= 3
        out.append(np.array(digits[:numel], np.uint8))
        pos += nbytes
    return out


def test_export_paper_log_is_readable_in_the_papers_layout(tmp_path: Path) -> None:
    from vtrain.graph.executor import StepExecutor, state_tensors
    from vtrain.training.loop import batch_for

    r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "run"), "--mode", "paper", "--steps", "2",
                                  "--interval", "1", "--batch-size", "4", "--hidden", "8"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["export-paper-log", str(tmp_path / "run"), "--out", str(tmp_path / "paper")])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout.splitlines()[-1])
    assert info["files"] == 8 and 1.6 <= info["bits_per_value"] < 1.7
    job = build_job(TrainSpec(mlp=MLPConfig(hidden=(8,)), batch_size=4, steps=2, interval=1, mode="paper"))
    res = StepExecutor(job.graph, "paper").run(state_tensors(job.initial_state), batch_for(job, 1), step=1)
    h = hooked_ops(job.graph)
    for where in ("forward", "backward"):
        got = _decode_paper_log(tmp_path / "paper" / f"{where}_hooks_log_b_1_e_0")
        want = [res.log.dense[o].trits for o, w in h.items() if w == where]
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    size = sum((tmp_path / "paper" / f"{w}_hooks_log_b_1_e_0").stat().st_size for w in ("forward", "backward"))
    assert size == paper_log_bytes(job.graph)
    fired = sum(int((d.trits != 1).sum()) for d in res.log.dense.values())
    hooked = sum(d.trits.size for d in res.log.dense.values())
    assert 0.2 < fired / hooked < 0.8  # the paper's rule logs a large share of the hooked values
    r = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "c"), "--steps", "1", "--hidden", "8"])
    r = CliRunner().invoke(main, ["export-paper-log", str(tmp_path / "c"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "no paper log" in r.output


def test_paper_mode_trains_the_same_states_as_round_to_nearest() -> None:
    """The trainer's outputs are RN32 in every mode: the log only helps the auditor."""
    from vtrain.graph.executor import StepExecutor, state_tensors
    from vtrain.training.loop import batch_for

    job = build_job(TrainSpec(mlp=MLPConfig(hidden=(8,)), batch_size=4))
    outs = {}
    for mode in ("paper", "round-nolog", "certified"):
        st = state_tensors(job.initial_state)
        for s in (1, 2):
            st = StepExecutor(job.graph, mode).run(st, batch_for(job, s), step=s).state
        outs[mode] = [t.numpy().tobytes() for t in st]
    assert outs["paper"] == outs["round-nolog"] == outs["certified"]
