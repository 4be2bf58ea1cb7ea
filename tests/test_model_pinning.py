"""A user's model file is code that decides the job: the run folder pins the factory source and
its checkpoint by sha256, the job's specHash commits to those sha256 and the model args, and the
graph root on-chain is the lowered graph. A changed source, checkpoint or model argument is
refused, naming the problem, before any of the changed code runs or any step is replayed."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from protocol.chain import Chain, ChainError
from protocol.cli import main
from protocol.demo import create_job
from protocol.deploy import deploy
from protocol.jobs import JobContext, Terms, check_spec_hash
from vtrain.errors import DataChanged
from vtrain.training.rundir import RunDir
from vtrain.training.spec import TrainSpec

SOURCE = '''
import numpy as np
import torch.nn.functional as F
from torch import nn


def task(hidden: int = 4):
    from vtrain.frontend import TorchTask

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    return TorchTask(model, F.cross_entropy, {"name": "SGD", "lr": 0.1}, [x], y)
'''
# a tampered source announces that it ran: it must never run
TAMPER = "\nimport pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\n"
ARGS = ["--steps", "2", "--interval", "1", "--batch-size", "4", "--model-arg", "hidden=4"]


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def ok(r: Result) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def refused(r: Result, code: int, *words: str) -> str:
    assert isinstance(r.exception, SystemExit), f"uncaught {r.exception!r}\n{r.output}"
    assert r.exit_code == code, (r.exit_code, r.output)
    text = " ".join(r.output.split())
    assert "Traceback" not in text
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    return text


@pytest.fixture(scope="module")
def pinned_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file-model run trained from a user's folder that is then deleted."""
    base = tmp_path_factory.mktemp("user")
    (base / "net.py").write_text(SOURCE)
    torch.manual_seed(1)
    from safetensors.torch import save_file

    sd = {"0.weight": torch.randn(4, 3), "0.bias": torch.zeros(4), "2.weight": torch.randn(2, 4),
          "2.bias": torch.zeros(2)}
    save_file(sd, str(base / "w.safetensors"))
    out = tmp_path_factory.mktemp("runs") / "run"
    ok(run("train", "--out", out, "--model", f"{base}/net.py:task", "--checkpoint", base / "w.safetensors", *ARGS))
    shutil.rmtree(base)  # the user's files are gone: the run folder must be enough
    return out


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "elsewhere" / "run"
    shutil.copytree(run_dir, dst)
    return dst


def test_the_run_folder_pins_the_model_source_and_checkpoint(pinned_run: Path) -> None:
    spec = json.loads((pinned_run / "spec.json").read_text())
    src, ck = (pinned_run / "model" / "net.py").read_bytes(), (pinned_run / "model" / "w.safetensors").read_bytes()
    assert spec["model"] == "model/net.py:task" and spec["checkpoint"] == "model/w.safetensors"
    assert spec["model_sha256"] == hashlib.sha256(src).hexdigest() == hashlib.sha256(SOURCE.encode()).hexdigest()
    assert spec["checkpoint_sha256"] == hashlib.sha256(ck).hexdigest()
    files = json.loads((pinned_run / "inputs.json").read_text())["files"]
    assert files == {"model/net.py": spec["model_sha256"], "model/w.safetensors": spec["checkpoint_sha256"]}


def test_honest_replay_and_spec_hash_work_from_another_directory(pinned_run: Path, tmp_path: Path,
                                                                 monkeypatch) -> None:
    moved = _copy(pinned_run, tmp_path)
    monkeypatch.chdir(tmp_path)
    v = ok(run("replay", "--run", moved))
    assert v["matched"] == 2 and v["first_divergent_step"] is None
    # the committed spec hash does not depend on where the run folder lies
    assert JobContext(RunDir(moved).read_spec(), None).spec_hash == JobContext(RunDir(pinned_run).read_spec(),
                                                                               None).spec_hash


@pytest.mark.parametrize("what", ["model/net.py", "model/w.safetensors"])
def test_a_tampered_model_source_or_checkpoint_is_refused_before_it_runs(pinned_run: Path, tmp_path: Path,
                                                                         what: str) -> None:
    moved = _copy(pinned_run, tmp_path)
    f = moved / what
    if what.endswith(".py"):
        f.write_text(SOURCE + TAMPER)
    else:
        b = bytearray(f.read_bytes())
        b[-1] ^= 1
        f.write_bytes(bytes(b))
    kind = "model source" if what.endswith(".py") else "checkpoint"
    text = refused(run("replay", "--run", moved), 1, kind, what.split("/")[1], "changed since training", "sha256",
                   "recorded")
    assert "replay: step" not in text and not (moved / "model" / "RAN").exists()
    # also when inputs.json is edited to match: the spec's own pin refuses the file before importing it
    inputs = json.loads((moved / "inputs.json").read_text())
    inputs["files"][what] = hashlib.sha256(f.read_bytes()).hexdigest()
    (moved / "inputs.json").write_text(json.dumps(inputs))
    refused(run("replay", "--run", moved), 1, what.split("/")[1], "is not the pinned one", "the spec pins")
    assert not (moved / "model" / "RAN").exists()


def test_a_changed_model_arg_is_refused_naming_it(pinned_run: Path, tmp_path: Path) -> None:
    moved = _copy(pinned_run, tmp_path)
    spec = json.loads((moved / "spec.json").read_text())
    spec["model_args"]["hidden"] = 5
    (moved / "spec.json").write_text(json.dumps(spec))
    refused(run("replay", "--run", moved), 1, "spec.json changed since training", "model_args.hidden",
            "recorded 4, now 5")


@pytest.fixture(scope="module")
def onchain_job(pinned_run: Path):
    chain = Chain.connect(None)
    a = chain.accounts()
    proto = deploy(chain, a[0])
    ctx = JobContext.of(RunDir(pinned_run).read_spec())
    job = create_job(proto, a[1], a[2], ctx, Terms())
    return proto, job, tuple(proto.chain.call(proto.registry.functions.jobParams(job)))


def test_auditor_refuses_a_served_tampered_model_before_replaying(pinned_run: Path, tmp_path: Path,
                                                                  onchain_job) -> None:
    """The auditor's copy of the source differs from what the job commits to: refused (a ChainError
    naming both hashes), never a challenge."""
    from protocol.auditor import AuditorAgent
    from protocol.store import ArtifactStore

    proto, job, params = onchain_job
    honest = RunDir(pinned_run).read_spec()
    check_spec_hash(honest, params)  # the honest spec, from another directory, is the job's
    served = tmp_path / "served"
    served.mkdir()
    (served / "net.py").write_text(SOURCE.replace("hidden: int = 4", "hidden: int = 4, scale: float = 2.0")
                                   .replace("[x], y)", "[x * scale], y)"))
    # 1. the honest pin with the served file: refused before the file is executed
    with pytest.raises(DataChanged, match="is not the pinned one: sha256 .* the spec pins " + honest.model_sha256):
        JobContext.for_job(TrainSpec(**{**honest.__dict__, "model": f"{served}/net.py:task"}), params)
    # 2. a spec re-pinned to the served file: its specHash is not the job's
    digest = hashlib.sha256((served / "net.py").read_bytes()).hexdigest()
    repinned = TrainSpec(**{**honest.__dict__, "model": f"{served}/net.py:task", "model_sha256": digest})
    with pytest.raises(ChainError, match="different specHash: chain has 0x[0-9a-f]{64}, this spec gives 0x"):
        check_spec_hash(repinned, params)
    # 3. an unpinned spec naming the served file: refused by the spec check, before it is built
    loose = TrainSpec(**{**honest.__dict__, "model": f"{served}/net.py:task", "model_sha256": None,
                         "checkpoint_sha256": None})
    with pytest.raises(ChainError, match="different specHash"):
        AuditorAgent(proto, proto.chain.accounts()[3], JobContext.of(loose), ArtifactStore(tmp_path / "s"), job)


def _tampered(tmp_path: Path, honest: TrainSpec) -> tuple[Path, dict[str, TrainSpec]]:
    """A served copy of the model source that writes a marker file ``RAN`` when executed, and the
    specs a counterparty could serve with it."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "net.py").write_text(SOURCE + TAMPER)
    digest = hashlib.sha256((served / "net.py").read_bytes()).hexdigest()
    model = f"{served}/net.py:task"
    return served / "RAN", {
        "honest-pin": TrainSpec(**{**honest.__dict__, "model": model}),
        "repinned": TrainSpec(**{**honest.__dict__, "model": model, "model_sha256": digest}),
        "unpinned": TrainSpec(**{**honest.__dict__, "model": model, "model_sha256": None}),
    }


@pytest.mark.parametrize("agent", ["auditor", "trainer", "onchain", "for_job"])
@pytest.mark.parametrize("served", ["honest-pin", "repinned", "unpinned"])
def test_library_agents_never_run_a_served_model_that_is_not_the_committed_one(
        pinned_run: Path, tmp_path: Path, onchain_job, agent: str, served: str) -> None:
    """Through the library API (no CLI): a counterparty serves a tampered model source; the agent
    refuses it naming both hashes, and the source never runs (its marker file never appears)."""
    from protocol.auditor import AuditorAgent
    from protocol.store import ArtifactStore
    from protocol.trainer import TrainerAgent

    proto, job, params = onchain_job
    ran, specs = _tampered(tmp_path, RunDir(pinned_run).read_spec())
    spec = specs[served]
    a = proto.chain.accounts()
    with pytest.raises((ChainError, DataChanged)) as e:
        if agent == "auditor":
            AuditorAgent(proto, a[3], JobContext.of(spec), ArtifactStore(tmp_path / "s"), job)
        elif agent == "trainer":
            TrainerAgent(proto, a[2], JobContext.of(spec), ArtifactStore(tmp_path / "s"), job)
        elif agent == "onchain":
            from protocol.availability import OnChainArtifacts

            OnChainArtifacts(proto, a[3], JobContext.of(spec), job, Terms().challenger_bond)
        else:
            JobContext.for_job(spec, params)
    assert not ran.exists(), "the served model source was executed"
    text = str(e.value)
    if served == "honest-pin":  # the spec is the job's; the served bytes are not the pinned ones
        assert isinstance(e.value, DataChanged)
        got = hashlib.sha256(ran.with_name("net.py").read_bytes()).hexdigest()
        assert f"sha256 {got}, the spec pins {spec.model_sha256}" in text
    else:
        assert f"chain has 0x{bytes(params[1]).hex()}, this spec gives 0x" in text and "nothing of its model" in text
    if served == "repinned":
        assert f"model source sha256 {spec.model_sha256}" in text


def test_a_job_committing_to_an_unpinned_file_model_is_refused_before_it_runs(
        pinned_run: Path, tmp_path: Path, onchain_job) -> None:
    """A job whose specHash is an unpinned spec's commits to a file name, not bytes: whatever file is
    served under that name is refused unrun, by the library agents and by the CLI's create-job."""
    from protocol.auditor import AuditorAgent
    from protocol.store import ArtifactStore
    from vtrain.commit.roots import spec_hash

    proto, _, params = onchain_job
    ran, specs = _tampered(tmp_path, RunDir(pinned_run).read_spec())
    loose = TrainSpec(**{**specs["unpinned"].__dict__, "checkpoint_sha256": None})
    a = proto.chain.accounts()
    committed = (params[0], spec_hash(loose.commitment()), *params[2:])
    r = proto.chain.send(proto.registry.functions.createJob(committed), a[1], value=Terms().payment, what="createJob")
    from web3.logs import DISCARD

    job = int(proto.registry.events.JobCreated().process_receipt(r, errors=DISCARD)[0]["args"]["job"])
    with pytest.raises(ChainError, match="by file name only .* refusing to run them"):
        AuditorAgent(proto, a[3], JobContext.of(loose), ArtifactStore(tmp_path / "s"), job)
    assert not ran.exists()
    spec_file = tmp_path / "loose.json"
    spec_file.write_text(loose.to_json())
    text = refused(run("client", "create-job", "--rpc", "http://127.0.0.1:1", "--deployment", tmp_path / "none.json",
                       "--spec", spec_file), 1, "is not pinned", "nothing was sent")
    assert "Traceback" not in text and not ran.exists()


def test_a_graph_other_than_the_committed_one_is_refused_naming_both_roots(pinned_run: Path, onchain_job) -> None:
    _, _, params = onchain_job
    ctx = JobContext.of(RunDir(pinned_run).read_spec())
    other = bytes(32 * [7])
    fake = (*params[:5], other, *params[6:])
    with pytest.raises(ChainError, match=f"has graph root 0x{ctx.graph.root.hex()}, the job commits to graph root "
                                         f"0x{other.hex()}: refusing"):
        ctx.check_onchain(fake)


def test_a_text_runs_spec_hash_does_not_depend_on_where_the_run_folder_lies(tmp_path: Path) -> None:
    a = TrainSpec(model="gpt", text_path=str(tmp_path / "one" / "run" / "data" / "t.txt"))
    b = TrainSpec(model="gpt", text_path="data/t.txt")
    assert a.commitment() == b.commitment() and a.to_dict() != b.to_dict()
