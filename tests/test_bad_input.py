"""Bad input everywhere a user can give it: command-line options, spec files (JSON/TOML), run
folders (logs, checkpoints, roots), datasets, deployment files, RPC URLs and key files. Each must
end in one clear line naming the problem (exit status != 0, no traceback), and no user file may be
left half-written: every write goes through a temp file, fsync and rename."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from protocol.cli import main
from vtrain.errors import DatasetError, SpecError
from vtrain.training.spec import TrainSpec

#: A run small enough to train in a moment.
TINY = ["--steps", "2", "--interval", "1", "--batch-size", "4", "--hidden", "8"]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def fails(r: Result, *words: str, code: int | None = None) -> str:
    """The command failed cleanly: a SystemExit (click's error path, not an uncaught exception),
    status != 0, no traceback, and the error line mentions every one of ``words``."""
    assert isinstance(r.exception, SystemExit), f"uncaught {r.exception!r}\n{r.output}"
    assert r.exit_code != 0 and (code is None or r.exit_code == code), (r.exit_code, r.output)
    assert "Traceback" not in r.output
    errors = [line for line in r.output.splitlines() if "Error" in line or "error" in line.lower()]
    text = " ".join(r.output.split())
    for w in words:
        assert w in text, f"{w!r} not in {r.output!r}"
    assert errors, r.output
    return text


# -- command-line options -----------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--steps", "ten"], ["--steps", "ten"]),
    (["--steps", "0"], ["--steps", "0"]),
    (["--model", "resnet"], ["--model", "resnet"]),
    (["--optimizer", "lion"], ["--optimizer", "lion"]),
    (["--lr", "fast"], ["--lr", "fast"]),
    (["--hidden", "8,x"], ["--hidden", "8,x"]),
    (["--spec", "/nonexistent/spec.json"], ["--spec", "does not exist"]),
    (["--text", "/nonexistent/corpus.txt", "--model", "gpt"], ["--text", "does not exist"]),
    (["--threads", "100000"], ["--threads", "100000 threads", "at most"]),  # before: the BLAS crashed the process
])
def test_bad_train_options_are_usage_errors(tmp_path: Path, args: list[str], words: list[str]) -> None:
    fails(run("train", "--out", str(tmp_path / "run"), *args), *words, code=2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, words", [
    (["--lr", "nan"], ["optimizer.lr", "finite"]),
    (["--lr", "-0.1"], ["optimizer.lr", "-0.1"]),
    (["--hidden", "0"], ["mlp.hidden[0]"]),
    (["--model", "gpt", "--width", "15", "--heads", "2"], ["d_model 15", "n_head 2"]),
])
def test_out_of_range_train_options_are_named(tmp_path: Path, args: list[str], words: list[str]) -> None:
    fails(run("train", "--out", str(tmp_path / "run"), *args), *words, code=1)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_train_out_that_is_a_file_is_refused_and_kept(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    fails(run("train", "--out", str(f), *TINY), "--out", "not a folder")
    assert f.read_text() == "keep me"


def test_train_out_holding_files_a_run_would_write_is_refused_and_kept(tmp_path: Path) -> None:
    """A folder with no run but its own ``checkpoints`` (or ``model``, ``logs``...): refused before a byte is
    written (before: the user's checkpoints/step_000000.safetensors was overwritten); other files are no clash."""
    mine = tmp_path / "mine"
    (mine / "checkpoints").mkdir(parents=True)
    (mine / "checkpoints" / "step_000000.safetensors").write_text("my weights")
    fails(run("train", "--out", str(mine), *TINY), "--out", "holds no run", "checkpoints", "new or empty folder",
          code=1)
    assert (mine / "checkpoints" / "step_000000.safetensors").read_text() == "my weights"
    assert sorted(p.name for p in mine.iterdir()) == ["checkpoints"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.txt").write_text("keep me")
    assert run("train", "--out", str(notes), *TINY).exit_code == 0
    assert (notes / "README.txt").read_text() == "keep me"


def test_a_refused_file_model_leaves_no_run_folder_and_names_the_users_file(tmp_path: Path) -> None:
    """A factory that fails: the error names the user's file (not the run folder's copy), the folder this start
    made is gone, and the fixed model trains into the same --out (before: model/ was left behind)."""
    src = tmp_path / "net.py"
    src.write_text("def task():\n    raise ValueError('no data yet')\n")
    out = tmp_path / "run"
    text = fails(run("train", "--out", str(out), "--model", f"{src}:task", "--steps", "1"), "ValueError: no data yet",
                 code=1)
    assert f"{src}:task raised" in text and f"at {src}, line 2" in text and str(out) not in text
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("keep me")
    fails(run("train", "--out", str(kept), "--model", f"{src}:task", "--steps", "1"), "no data yet", code=1)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]
    src.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parents[1] / 'examples')!r})\n"
                   "from zoo import mlp_acts as task\n")
    r = run("train", "--out", str(out), "--model", f"{src}:task", "--steps", "1", "--batch-size", "4")
    assert r.exit_code == 0, r.output


def test_gpt_text_datasets_that_are_not_usable(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 cr\u00e8me ".encode("latin-1") * 20)
    fails(run("train", "--out", str(tmp_path / "r1"), "--model", "gpt", "--text", str(latin1)), "latin1.txt",
          "UTF-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    fails(run("train", "--out", str(tmp_path / "r2"), "--model", "gpt", "--text", str(empty), *TINY[:4]),
          "empty.txt", "empty")
    short = tmp_path / "short.txt"
    short.write_text("abc")
    fails(run("train", "--out", str(tmp_path / "r3"), "--model", "gpt", "--text", str(short), *TINY[:4]),
          "short.txt", "too short")


# -- spec files -----------------------------------------------------------------------------------------


GOOD = TrainSpec(steps=2, interval=1, batch_size=4).to_dict()


@pytest.mark.parametrize("spec, words", [
    ("{not json", ["invalid training spec JSON"]),
    ("[1, 2]", ["expected an object", "list"]),
    ({**GOOD, "stepz": 3}, ["unknown key(s) 'stepz'"]),
    ({**GOOD, "optimizer": {"name": "sgd", "lr": 0.1, "nesterov": True}}, ["optimizer", "'nesterov'"]),
    ({**GOOD, "steps": "ten"}, ["steps", "expected an integer", "'ten'"]),
    ({**GOOD, "steps": 2.5}, ["steps", "expected an integer"]),
    ({**GOOD, "steps": True}, ["steps", "expected an integer"]),
    ({**GOOD, "steps": 0}, ["steps", "[1,"]),
    ({**GOOD, "seed": -1}, ["seed", "-1"]),
    ({**GOOD, "mode": "fast"}, ["mode", "'fast'"]),
    ({**GOOD, "model": "resnet"}, ["model", "'resnet'"]),
    ({**GOOD, "optimizer": {"name": "lion"}}, ["optimizer.name", "'lion'"]),
    ({**GOOD, "optimizer": {"name": "sgd", "lr": -1}}, ["optimizer.lr"]),
    ({**GOOD, "optimizer": {"name": "adamw", "beta2": 1.0}}, ["optimizer.beta2"]),
    ({**GOOD, "optimizer": "sgd"}, ["optimizer", "expected an object"]),
    ({**GOOD, "mlp": {"hidden": [8, -2]}}, ["mlp.hidden[1]"]),
    ({**GOOD, "mlp": {"hidden": 8}}, ["mlp.hidden", "list"]),
    ({**GOOD, "gpt": {"context": "long"}}, ["gpt.context"]),
])
def test_bad_spec_files_name_the_key(tmp_path: Path, spec, words: list[str]) -> None:
    p = tmp_path / "spec.json"
    p.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    with pytest.raises(SpecError) as e:
        TrainSpec.from_file(p)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert str(p) in str(e.value)
    fails(run("train", "--out", str(tmp_path / "run"), "--spec", str(p)), *words)
    assert not (tmp_path / "run").exists()


def test_spec_files_in_toml(tmp_path: Path) -> None:
    good = tmp_path / "spec.toml"
    good.write_text('model = "mlp"\nsteps = 2\ninterval = 1\nbatch_size = 4\n[optimizer]\nname = "adamw"\n'
                    'lr = 0.001\n[mlp]\nhidden = [8]\n')
    spec = TrainSpec.from_file(good)
    assert (spec.steps, spec.optimizer.name, spec.optimizer.lr, spec.mlp.hidden) == (2, "adamw", 0.001, (8,))
    bad = tmp_path / "bad.toml"
    bad.write_text('steps = \n')
    with pytest.raises(SpecError, match="invalid training spec TOML"):
        TrainSpec.from_file(bad)
    typo = tmp_path / "typo.toml"
    typo.write_text('steps = 2\n[optimiser]\nname = "sgd"\n')
    with pytest.raises(SpecError, match="unknown key.*'optimiser'"):
        TrainSpec.from_file(typo)


def test_spec_file_that_is_not_text(tmp_path: Path) -> None:
    p = tmp_path / "spec.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError, match="not UTF-8"):
        TrainSpec.from_file(p)
    with pytest.raises(SpecError, match="No such file"):
        TrainSpec.from_file(tmp_path / "missing.json")


def test_dataset_of_the_wrong_shape_for_the_model(tmp_path: Path) -> None:
    from vtrain.training.spec import build_job

    with pytest.raises(DatasetError, match="64 features.*n_in is 10"):
        build_job(TrainSpec.from_dict({**GOOD, "mlp": {"n_in": 10}}))
    with pytest.raises(DatasetError, match="no-such.txt.*No such file"):
        build_job(TrainSpec(model="gpt", text_path=str(tmp_path / "no-such.txt")))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("na\u00efve caf\u00e9 ".encode("latin-1") * 20)
    with pytest.raises(DatasetError, match="latin1.txt: not UTF-8 text"):
        build_job(TrainSpec(model="gpt", text_path=str(latin1)))
    small_vocab = tmp_path / "abc.txt"
    small_vocab.write_text("abcdefghij" * 10)
    with pytest.raises(DatasetError, match="vocab 4 too small for 10 symbols"):
        build_job(TrainSpec(model="gpt", text_path=str(small_vocab),
                            gpt=TrainSpec().gpt.__class__(vocab=4, context=8, n_head=2, d_model=16)))


# -- run folders: logs, checkpoints, roots ----------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "run"
    r = run("train", "--out", str(out), *TINY)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def copy(trained: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def test_replay_of_a_good_run_matches(copy: Path) -> None:
    r = run("replay", "--run", str(copy))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[-1])["matched"] == 2


def _flip(p: Path, at: int) -> None:
    b = bytearray(p.read_bytes())
    b[at % len(b)] ^= 0x5A
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("damage, words, code", [
    ("truncated log", ["step 2"], 1),
    ("garbled log", ["step 2"], 1),
    ("log of the wrong step", ["expected step 2", "got a log of step 1"], 1),
    ("missing log", ["rounding log of step 2 missing"], 4),  # unavailable, not malformed
    ("truncated checkpoint", ["checkpoint", "step_000000"], 1),
    ("missing spec", ["no spec.json"], 4),
    ("bad spec", ["spec.json", "unknown key"], 1),
    ("garbage roots line", ["roots.jsonl", "line 1"], 1),
    ("empty roots", ["records no steps"], 1),
    # a flipped byte that still decodes: named with its file (before: a divergence at step 1, or nothing)
    ("flipped initial checkpoint", ["checkpoint", "step_000000.safetensors", "state root", "recorded"], 1),
    ("flipped later checkpoint", ["run folder was changed", "step_000002.safetensors", "state root"], 1),
    ("changed log root record", ["roots.jsonl: step 1 records log root", "step_000001.vtlog"], 1),
    ("changed loss record", ["roots.jsonl: step 2 records loss"], 1),
])
def test_damaged_run_folders_are_refused_with_the_artifact_named(copy: Path, damage: str, words: list[str],
                                                                 code: int) -> None:
    log2, ckpt0 = copy / "logs" / "step_000002.vtlog", copy / "checkpoints" / "step_000000.safetensors"
    if damage == "truncated log":
        log2.write_bytes(log2.read_bytes()[:9])
    elif damage == "garbled log":
        _flip(log2, -3)
    elif damage == "log of the wrong step":
        shutil.copy(copy / "logs" / "step_000001.vtlog", log2)
    elif damage == "missing log":
        log2.unlink()
    elif damage == "truncated checkpoint":
        ckpt0.write_bytes(ckpt0.read_bytes()[:50])
    elif damage == "missing spec":
        (copy / "spec.json").unlink()
    elif damage == "bad spec":
        (copy / "spec.json").write_text(json.dumps({**GOOD, "colour": "red"}))
    elif damage == "garbage roots line":
        (copy / "roots.jsonl").write_text("hello\n")
    elif damage == "empty roots":
        (copy / "roots.jsonl").write_text("")
    elif damage.startswith("flipped"):
        ckpt = ckpt0 if "initial" in damage else copy / "checkpoints" / "step_000002.safetensors"
        _flip(ckpt, -2)  # a byte of the last tensor's values
    elif damage.startswith("changed"):
        lines = [json.loads(line) for line in (copy / "roots.jsonl").read_text().splitlines()]
        if "log root" in damage:
            lines[0]["log_root"] = "0" * 64
        else:
            lines[1]["loss"] *= 2
        (copy / "roots.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    fails(run("replay", "--run", str(copy)), *words, code=code)


def test_replay_options_out_of_range(copy: Path, tmp_path: Path) -> None:
    fails(run("replay", "--run", str(tmp_path / "nope")), "--run", "does not exist", code=2)
    fails(run("replay", "--run", str(copy), "--from-step", "-1"), "--from-step", code=2)
    fails(run("replay", "--run", str(copy), "--from-step", "1", "--to-step", "1"), "--to-step 1", code=1)
    fails(run("replay", "--run", str(copy), "--to-step", "9"), "--to-step 9", "up to 2 only", code=1)
    fails(run("replay", "--run", str(copy), "--mode", "turbo"), "--mode", code=2)


def test_a_torn_last_roots_line_is_cut_off_not_fatal(copy: Path) -> None:
    """A crash mid-append leaves part of a line without its newline: it is not a record."""
    from vtrain.training.rundir import RunDir

    roots = copy / "roots.jsonl"
    whole = roots.read_bytes()
    roots.write_bytes(whole + b'{"step": 3, "loss": 0.1, "sta')
    rd = RunDir(copy)
    assert sorted(rd.read_roots()) == [1, 2]
    rd.append_roots(3, 0.5, b"\x01" * 32, b"\x02" * 32)  # the next append repairs the tail
    assert roots.read_bytes().startswith(whole) and roots.read_bytes().count(b"\n") == 3
    assert sorted(rd.read_roots()) == [1, 2, 3]


# -- interrupted writes leave the old file whole --------------------------------------------------------


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_interrupted_atomic_write_keeps_the_old_file(tmp_path: Path, monkeypatch, fail_at: str) -> None:
    from vtrain.training import rundir

    target = tmp_path / "deployment.json"
    target.write_bytes(b"old contents")

    class Crash(Exception):
        pass

    def boom(*a, **k):
        raise Crash(fail_at)

    if fail_at == "write":
        real_fdopen = os.fdopen

        class HalfFile:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])
                self.f.flush()
                raise Crash("disk full half-way")

        monkeypatch.setattr(rundir.os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
    else:
        monkeypatch.setattr(rundir.os, fail_at, boom)
    with pytest.raises(Crash):
        rundir.atomic_write(target, b"new contents, much longer than the old ones")
    monkeypatch.undo()
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["deployment.json"]  # no temp file left behind


def test_every_user_file_writer_is_atomic(tmp_path: Path, monkeypatch) -> None:
    """Checkpoints, logs, spec and deployment files: a crash at the rename keeps the old file."""
    from protocol.chain import Deployment
    from vtrain.training import rundir
    from vtrain.training.spec import build_job

    spec = TrainSpec(steps=2, interval=1, batch_size=4)
    rd = rundir.RunDir(tmp_path / "run")
    job = build_job(spec)
    rd.write_spec(spec)
    rd.write_checkpoint(0, job.graph, rundir.state_tensors(job.initial_state))
    dep = tmp_path / "deployment.json"
    Deployment("0x" + "11" * 20, "0x" + "22" * 20, "0x" + "33" * 20, 31337).save(dep)
    files = [rd.path / "spec.json", rd.ckpt_path(0), dep]
    before = {p: p.read_bytes() for p in files}

    def crash(*a, **k):
        raise OSError("power cut")

    monkeypatch.setattr(rundir.os, "replace", crash)
    for write in (lambda: rd.write_spec(TrainSpec(steps=3, interval=1, batch_size=4)),
                  lambda: rd.write_checkpoint(0, job.graph, rundir.state_tensors(
                      [a * 0 for a in job.initial_state])),
                  lambda: Deployment("0x" + "44" * 20, "0x" + "22" * 20, "0x" + "33" * 20, 1).save(dep)):
        with pytest.raises(OSError, match="power cut"):
            write()
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in files} == before
    leftovers = [p for p in tmp_path.rglob(".*") if p.is_file()]
    assert leftovers == []


# -- the agents' inputs: RPC URL, deployment file, key file, numbers ---------------------------------------


@pytest.fixture
def agent_files(tmp_path: Path) -> tuple[Path, Path]:
    spec = tmp_path / "spec.json"
    spec.write_text(TrainSpec(steps=8, interval=4).to_json())
    dep = tmp_path / "deployment.json"
    dep.write_text(json.dumps({"registry": "0x" + "11" * 20, "game": "0x" + "22" * 20,
                               "adjudicator": "0x" + "33" * 20, "chain_id": 31337}))
    return spec, dep


def _trainer(spec: Path, dep: Path, tmp_path: Path, *extra: str, rpc: str = "http://127.0.0.1:9") -> Result:
    return run("trainer", "--rpc", rpc, "--rpc-retries", "0", "--deployment", str(dep), "--spec", str(spec),
               "--job", "1", "--store", str(tmp_path / "store"), *extra)


@pytest.mark.parametrize("rpc, words", [
    ("localhost:8545", ["--rpc", "http(s)://"]),
    ("http://", ["malformed"]),
    ("http://127.0.0.1:99999", ["malformed"]),
])
def test_malformed_rpc_urls(agent_files, tmp_path: Path, rpc: str, words: list[str]) -> None:
    spec, dep = agent_files
    fails(_trainer(spec, dep, tmp_path, rpc=rpc), *words, code=1)
    fails(run("deploy", "--rpc", rpc, "--out", str(tmp_path / "d.json")), code=1)
    assert not (tmp_path / "d.json").exists()


@pytest.mark.parametrize("content, words", [
    ("{not json", ["deployment file", "not JSON"]),
    ("[]", ["expected an object"]),
    ('{"registry": "0x11"}', ["missing game, adjudicator, chain_id"]),
    ('{"registry": "0x11", "game": "0x22", "adjudicator": "0x33", "chain_id": 1}', ["registry", "not an address"]),
    (json.dumps({"registry": "0x" + "11" * 20, "game": "0x" + "22" * 20, "adjudicator": "0x" + "33" * 20,
                 "chain_id": "mainnet"}), ["chain_id", "'mainnet'"]),
])
def test_bad_deployment_files_are_named_before_the_node_is_asked(agent_files, tmp_path: Path, content: str,
                                                                  words: list[str]) -> None:
    spec, dep = agent_files
    dep.write_text(content)
    fails(_trainer(spec, dep, tmp_path), str(dep), *words, code=1)
    fails(_trainer(spec, tmp_path / "none.json", tmp_path), "none.json", "No such file", code=1)


@pytest.mark.parametrize("key, words", [
    ("0x" + "zz" * 32, ["not a private key", "non-hex"]),
    ("0x" + "ab" * 31, ["32 bytes", "got 62 hex digits"]),
    ("ab" * 33, ["got 66 hex digits"]),
    ("", ["not a private key"]),
    ("0x" + "00" * 32, ["not a valid secp256k1 private key"]),
    ("0x" + "ff" * 32, ["not a valid secp256k1 private key"]),
])
def test_malformed_key_files(agent_files, tmp_path: Path, key: str, words: list[str]) -> None:
    spec, dep = agent_files
    kf = tmp_path / "key"
    kf.write_text(key + "\n")
    text = fails(_trainer(spec, dep, tmp_path, "--key-file", str(kf)), "--key-file", *words, code=1)
    if len(key) > 8:
        assert key[2:20] not in text  # the key itself is never echoed
    fails(_trainer(spec, dep, tmp_path, "--key-file", str(tmp_path / "nokey")), "nokey", "No such file", code=1)
    kf.write_bytes(b"\x00\xff" * 32)
    fails(_trainer(spec, dep, tmp_path, "--key-file", str(kf)), "binary", code=1)


@pytest.mark.parametrize("args, words", [
    (["--job", "0"], ["--job"]),
    (["--job", "one"], ["--job"]),
    (["--timeout", "soon"], ["--timeout"]),
    (["--poll", "0"], ["--poll"]),
    (["--rpc-retries", "-1"], ["--rpc-retries"]),
    (["--rpc-deadline", "0"], ["--rpc-deadline"]),
    (["--cheat", "lie"], ["--cheat"]),
    (["--account-index", "x"], ["--account-index"]),
])
def test_bad_agent_numbers_are_usage_errors(agent_files, tmp_path: Path, args: list[str], words: list[str]) -> None:
    spec, dep = agent_files
    fails(_trainer(spec, dep, tmp_path, *args), *words, code=2)


@pytest.mark.parametrize("amount", ["1.5", "-1", "lots", "1e-3", "0.1wei"])
def test_bad_amounts_of_wei(agent_files, amount: str) -> None:
    spec, dep = agent_files
    r = run("client", "create-job", "--rpc", "http://127.0.0.1:9", "--deployment", str(dep), "--spec", str(spec),
            "--payment", amount)
    fails(r, "--payment", code=2)


def test_bad_spec_file_for_an_agent(agent_files, tmp_path: Path) -> None:
    spec, dep = agent_files
    spec.write_text(json.dumps({**GOOD, "batchsize": 4}))
    fails(_trainer(spec, dep, tmp_path), str(spec), "'batchsize'", code=1)


@pytest.mark.node
def test_key_files_on_a_node_no_funds_then_funded(agent_files, tmp_path: Path, anvil_w3) -> None:
    """An empty account is refused up front; a funded key signs locally (the node does not know it)."""
    from eth_account import Account

    from protocol.agents_cli import save_deployment
    from protocol.chain import Chain
    from protocol.deploy import deploy

    url = anvil_w3.provider.endpoint_uri
    chain = Chain.connect(url)
    save_deployment(deploy(chain, chain.accounts()[0]), tmp_path / "dep.json")
    spec, _ = agent_files
    acct = Account.create()
    kf = tmp_path / "client.key"
    kf.write_text(acct.key.hex())
    base = ["client", "create-job", "--rpc", url, "--deployment", str(tmp_path / "dep.json"), "--spec", str(spec),
            "--key-file", str(kf)]
    fails(run(*base), "--key-file", acct.address, "has no funds", code=1)
    anvil_w3.eth.send_transaction({"from": chain.accounts()[0], "to": acct.address, "value": 5 * 10**18,
                                   "gas": 21_000})
    r = run(*base, "--payment", "1eth")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["client"] == acct.address and acct.address not in chain.accounts()
    assert anvil_w3.eth.get_balance(acct.address) < 4 * 10**18  # it paid the job from its own funds


def test_a_deployment_mixing_addresses_of_two_deployments_is_refused_before_use() -> None:
    """A deployment file is served data: each address must be bound to the others on-chain (the
    registry to its game and availability contract, the game to its registry and adjudicator, the
    availability contract to its registry). Before, only registry -> game was checked, so an
    availability address of another deployment (or a look-alike that keeps demand bonds) was used."""
    from protocol.chain import Chain, ChainError
    from protocol.deploy import Protocol, deploy

    chain = Chain.connect(None)
    a, b = deploy(chain, chain.accounts()[0]), deploy(chain, chain.accounts()[0])
    a.check_bindings()
    for swap, msg in (
        ({"availability": b.availability}, f"is bound to the availability contract {a.availability.address}, "
                                           f"not {b.availability.address}"),
        ({"adjudicator": b.adjudicator}, f"is bound to the adjudicator {a.adjudicator.address}, "
                                         f"not {b.adjudicator.address}"),
        ({"game": b.game}, f"is bound to the game {a.game.address}, not {b.game.address}"),
    ):
        mixed = Protocol(chain, swap.get("registry", a.registry), swap.get("game", a.game),
                         swap.get("adjudicator", a.adjudicator), availability=swap.get("availability", a.availability))
        with pytest.raises(ChainError, match=msg):
            mixed.check_bindings()


@pytest.mark.parametrize("name", ["abs", "dotdot", "device-link", "outside-link"])
def test_a_run_folders_pinned_names_must_stay_inside_it(tmp_path: Path, name: str) -> None:
    """inputs.json may come from someone else (a run folder handed to an auditor as its spec): a
    pinned name that is absolute, climbs out with '..', or is a link out of the folder (to an
    endless device such as /dev/zero: before, read whole into memory to hash it) is refused."""
    import signal

    from vtrain.errors import CorruptArtifact
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import TrainSpec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(TrainSpec().to_json())
    outside = tmp_path / "secret.txt"
    outside.write_text("not the run's")
    rel = {"abs": str(outside), "dotdot": "../secret.txt", "device-link": "data/t.txt",
           "outside-link": "data/u.txt"}[name]
    if name.endswith("link"):
        (run_dir / "data").mkdir()
        (run_dir / rel).symlink_to("/dev/zero" if name == "device-link" else outside)
    (run_dir / "inputs.json").write_text(json.dumps({"files": {rel: "0" * 64}}))

    def hung(*_: object) -> None:
        raise TimeoutError("read the pinned file without end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(CorruptArtifact,
                           match="inputs.json: pinned .*(not a path inside|leads out of|not a regular)"):
            RunDir(run_dir).read_spec()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_specs_text_path_naming_a_device_is_refused_unread() -> None:
    """A served spec's text_path is read to build the dataset before dataRoot can be compared: a
    device (/dev/zero, endless) is refused before a byte is read (before: read into memory)."""
    import signal

    from vtrain.errors import DatasetError
    from vtrain.training.data import load_text_file

    def hung(*_: object) -> None:
        raise TimeoutError("read the device without end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(DatasetError, match="text dataset /dev/zero: not a regular file"):
            load_text_file(Path("/dev/zero"), 8)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("which", ["spec.json", "inputs.json", "big-spec"])
def test_a_run_folders_records_that_are_devices_or_huge_are_refused_unread(tmp_path: Path, which: str) -> None:
    """spec.json / inputs.json of a run folder from someone else, linked to /dev/zero (endless) or
    a 2 MiB spec: refused before being read whole (before: read into memory without end)."""
    import signal

    from vtrain.errors import VtrainError
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import TrainSpec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if which == "spec.json":
        (run_dir / "spec.json").symlink_to("/dev/zero")
        (run_dir / "inputs.json").write_text(json.dumps({"files": {}}))
    elif which == "inputs.json":
        (run_dir / "spec.json").write_text(TrainSpec().to_json())
        (run_dir / "inputs.json").symlink_to("/dev/zero")
    else:
        (run_dir / "spec.json").write_text(" " * (2 << 20) + TrainSpec().to_json())
        (run_dir / "inputs.json").write_text(json.dumps({"files": {}}))

    def hung(*_: object) -> None:
        raise TimeoutError("read a record without end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(VtrainError, match="not a regular file|leads out of the run folder|more than the 1048576"):
            RunDir(run_dir).read_spec()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_attaching_to_a_deployment_file_with_another_deployments_availability_is_refused(tmp_path: Path) -> None:
    """The library's Protocol.attach checks the bindings too (not only the CLI's connect)."""
    from protocol.chain import Chain, ChainError, Deployment
    from protocol.deploy import Protocol, deploy

    chain = Chain.connect(None)
    a, b = deploy(chain, chain.accounts()[0]), deploy(chain, chain.accounts()[0])
    d = a.deployment
    Protocol.attach(chain, d)
    with pytest.raises(ChainError, match=f"bound to the availability contract {a.availability.address}"):
        Protocol.attach(chain, Deployment(d.registry, d.game, d.adjudicator, d.chain_id, b.availability.address))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("agent", ["trainer", "auditor"])
def test_an_agent_asked_for_cuda_without_it_says_so_before_the_node(agent_files, tmp_path: Path, agent: str) -> None:
    spec, dep = agent_files
    if agent == "trainer":
        r = _trainer(spec, dep, tmp_path, "--device", "cuda")
    else:
        r = run("auditor", "--rpc", "http://127.0.0.1:9", "--rpc-retries", "0", "--deployment", str(dep),
                "--spec", str(spec), "--job", "1", "--store-url", "http://127.0.0.1:9/", "--device", "cuda")
    fails(r, "--device", "CUDA is not available", code=2)
