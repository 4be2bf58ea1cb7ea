"""A run folder (or an artifact server) from someone else is an adversary's: every file of it that
``vtrain replay``/``inspect``/``export``/``sample`` reads is a regular file inside the folder, of
at most the size the job implies (a log: its format's bound over the graph; a checkpoint: the
state's shapes; vocab.json: the pinned text's vocabulary; roots.jsonl: one record a step),
checked before a byte is read (``RunDir.read_member``); an artifact server cannot redirect the
reader to another host; a file model's code from a folder is run only with consent."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from protocol.cli import main

TINY = ["--steps", "2", "--interval", "1", "--batch-size", "4", "--hidden", "8"]
TEXT = "the auditor replays every step of the trainer and compares the roots. " * 6
GPT = ["--model", "gpt", "--steps", "2", "--interval", "1", "--batch-size", "2", "--context", "8",
       "--width", "8", "--heads", "1"]


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(r: Result, *words: str, code: int = 1) -> str:
    assert isinstance(r.exception, SystemExit), f"uncaught {r.exception!r}\n{r.output}"
    assert r.exit_code == code, (r.exit_code, r.output)
    text = " ".join(r.output.split())
    assert "Traceback" not in text
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    return text


@pytest.fixture(autouse=True)
def no_endless_read() -> Iterator[None]:
    """A read without end (a device, a FIFO) fails the test in 20 s instead of hanging it."""
    def hung(*_: object) -> None:
        raise TimeoutError("read a run folder's file without end")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "mlp"
    r = run("train", "--out", out, *TINY)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("gpt")
    (base / "t.txt").write_text(TEXT)
    r = run("train", "--out", base / "run", "--text", base / "t.txt", *GPT)
    assert r.exit_code == 0, r.output
    return base / "run"


def _foreign(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "handed-over" / src.name
    shutil.copytree(src, dst)
    return dst


LOG, CKPT = Path("logs/step_000002.vtlog"), Path("checkpoints/step_000000.safetensors")


def _job(folder: Path):
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import build_job

    return build_job(RunDir(folder).read_spec())


@pytest.mark.parametrize("attack", ["log->/dev/zero", "log-fifo", "log-too-big", "checkpoint-link-out",
                                    "checkpoint-too-big", "logs-dir-link-out", "roots->/dev/zero",
                                    "roots-too-big"])
def test_replay_of_a_foreign_folder_reads_only_bounded_regular_files_inside_it(mlp_run: Path, tmp_path: Path,
                                                                              attack: str) -> None:
    """Before: each of these was read whole (or without end: /dev/zero, a FIFO never written), or
    read from outside the folder (a checkpoint linked out replayed as if it were the run's)."""
    from vtrain.training.rundir import checkpoint_bytes_bound, log_bytes_bound

    run_dir = _foreign(mlp_run, tmp_path)
    graph = _job(run_dir).graph
    outside = tmp_path / "outside"
    outside.mkdir()
    if attack == "log->/dev/zero":
        (run_dir / LOG).unlink()
        (run_dir / LOG).symlink_to("/dev/zero")
        words = ["step_000002.vtlog", "leads out of the run folder", "/dev/zero"]
    elif attack == "log-fifo":
        (run_dir / LOG).unlink()
        os.mkfifo(run_dir / LOG)
        words = ["step_000002.vtlog", "not a regular file"]
    elif attack == "log-too-big":
        limit = log_bytes_bound(graph)
        with open(run_dir / LOG, "ab") as f:
            f.truncate(limit + 1)
        words = ["step_000002.vtlog", f"{limit + 1} bytes", f"more than the {limit} bytes"]
    elif attack == "checkpoint-link-out":  # every checkpoint: replay reads step 0's, export the latest
        for ck in (run_dir / "checkpoints").iterdir():
            shutil.move(ck, outside / ck.name)
            ck.symlink_to(outside / ck.name)
        words = ["safetensors", "leads out of the run folder"]
    elif attack == "checkpoint-too-big":
        limit = checkpoint_bytes_bound(graph)
        for ck in (run_dir / "checkpoints").iterdir():
            with open(ck, "ab") as f:
                f.truncate(limit + 1)
        words = ["safetensors", f"more than the {limit} bytes"]
    elif attack == "logs-dir-link-out":
        shutil.move(run_dir / "logs", outside / "logs")
        (run_dir / "logs").symlink_to(outside / "logs")
        words = ["step_00000", "leads out of the run folder"]
    elif attack == "roots->/dev/zero":
        (run_dir / "roots.jsonl").unlink()
        (run_dir / "roots.jsonl").symlink_to("/dev/zero")
        words = ["roots.jsonl", "leads out of the run folder"]
    else:
        with open(run_dir / "roots.jsonl", "ab") as f:
            f.truncate(256 * 3 + 1)  # 2 steps and a torn line: at most 768 bytes
        words = ["roots.jsonl", "more than the 768 bytes"]
    refused(run("replay", "--run", run_dir), *words)
    if attack.startswith("checkpoint") or attack == "roots-too-big":
        refused(run("export", run_dir, "--out", tmp_path / "x"), *words)
        assert not (tmp_path / "x").exists()  # nothing half-written
    if attack.startswith(("log", "roots")):
        refused(run("inspect", run_dir, "--plots", tmp_path / "p", "--json"), *words)
        assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("attack", ["huge", "device", "another"])
def test_vocab_json_is_the_pinned_texts_vocabulary_read_bounded(gpt_run: Path, tmp_path: Path, attack: str) -> None:
    """vocab.json is not pinned by inputs.json: before, `sample` and `export` took it as it was
    (another vocabulary decoded the model's tokens into other text; a huge one or a device was
    read whole). Now it must be the pinned text's vocabulary, read within its JSON size."""
    run_dir = _foreign(gpt_run, tmp_path)
    vocab = run_dir / "vocab.json"
    symbols = json.loads(vocab.read_text())["symbols"]
    if attack == "huge":
        vocab.write_text(json.dumps({"kind": "characters", "symbols": symbols}) + " " * (1 << 20))
        words = ["vocab.json", "more than the", f"{1024 + 16 * len(symbols)} bytes"]
    elif attack == "device":
        vocab.unlink()
        vocab.symlink_to("/dev/zero")
        words = ["vocab.json", "leads out of the run folder"]
    else:
        vocab.write_text(json.dumps({"kind": "characters", "symbols": symbols[::-1]}))
        words = ["vocab.json", "expected the vocabulary of the pinned text"]
    refused(run("sample", run_dir, "--tokens", "5"), *words)
    refused(run("export", run_dir, "--out", tmp_path / "x"), *words)
    assert not (tmp_path / "x").exists()


def test_honest_folders_are_within_every_bound(mlp_run: Path, gpt_run: Path, tmp_path: Path) -> None:
    from vtrain.training.rundir import RunDir, checkpoint_bytes_bound, log_bytes_bound

    for folder in (mlp_run, gpt_run):
        rd, job = RunDir(folder), _job(folder)
        assert all(rd.log_path(s).stat().st_size <= log_bytes_bound(job.graph) for s in (1, 2))
        assert rd.ckpt_path(0).stat().st_size <= checkpoint_bytes_bound(job.graph)
        assert rd.ckpt_path(0).stat().st_size > checkpoint_bytes_bound(job.graph) - 200 * len(job.graph.slots)
    assert run("sample", gpt_run, "--tokens", "5").exit_code == 0
    inside = _foreign(mlp_run, tmp_path)  # a link inside the folder is fine
    (inside / CKPT).rename(inside / "ck0")
    (inside / CKPT).symlink_to(inside / "ck0")
    assert run("replay", "--run", inside).exit_code == 0


# -- an artifact server that redirects ------------------------------------------------------------------


@pytest.mark.parametrize("to", ["other-port", "other-host", "other-scheme", "same-origin"])
def test_the_http_reader_follows_no_redirect_off_the_store(tmp_path: Path, to: str) -> None:
    """The store URL the user named answers 302 to another server (an internal address, another
    host or port: SSRF-like): before, urllib followed it and used what that server sent. Now only a
    redirect within the store's own scheme, host and port is followed."""
    import http.server
    import threading

    from protocol.store import ArtifactStore, ArtifactUnavailable, HttpArtifactReader, serve_store

    store = ArtifactStore(tmp_path / "store")
    store.put_log(7, 1, b"the log of step 1")
    inner, inner_url = serve_store(store.root)  # the other server: it serves a store that verifies
    asked: list[str] = []

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            asked.append(self.path)
            if self.path.startswith("/moved"):  # same-origin target: serve the store's bytes
                data = (store.root / self.path.removeprefix("/moved/")).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            port = self.server.server_address[1]
            target = {"other-port": inner_url, "other-host": inner_url.replace("127.0.0.1", "localhost"),
                      "other-scheme": f"https://127.0.0.1:{port}", "same-origin": "/moved"}[to]
            self.send_response(302)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        reader = HttpArtifactReader(f"http://127.0.0.1:{server.server_address[1]}", backoff=0.01)
        if to == "same-origin":
            assert reader.get_log(7, 1) == b"the log of step 1"
        else:
            with pytest.raises(ArtifactUnavailable, match="redirects .HTTP 302. to another host, scheme or port"):
                reader.get_log(7, 1)
            assert len(asked) == 1  # refused at once, not retried
    finally:
        for s in (server, inner):
            s.shutdown()
            s.server_close()


# -- a file model's code from a folder --------------------------------------------------------------------

SOURCE = '''
import pathlib

import numpy as np
import torch.nn.functional as F
from torch import nn

pathlib.Path(__file__).with_name("RAN").write_text("x")  # announces that this code ran


def task():
    from vtrain.frontend import TorchTask

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return TorchTask(nn.Sequential(nn.Linear(3, 2)), F.cross_entropy, {"name": "SGD", "lr": 0.1}, [x], y)
'''


def test_a_foreign_folders_model_code_runs_only_with_consent(tmp_path: Path, monkeypatch) -> None:
    """Before: `vtrain replay` (and sample/export/inspect) of a folder someone handed over executed
    its model/*.py silently. Now code this user did not train is refused, naming the file and its
    sha256, until --trust-model-code (said on stderr, then recorded)."""
    import hashlib

    (tmp_path / "net.py").write_text(SOURCE)
    theirs = tmp_path / "theirs" / "run"
    monkeypatch.setenv("VTRAIN_TRUSTED_MODELS", str(tmp_path / "their-trust"))
    r = run("train", "--out", theirs, "--model", f"{tmp_path}/net.py:task", "--steps", "2", "--interval", "1",
            "--batch-size", "4")
    assert r.exit_code == 0, r.output
    mine = _foreign(theirs, tmp_path)
    (mine / "model" / "RAN").unlink(missing_ok=True)
    monkeypatch.setenv("VTRAIN_TRUSTED_MODELS", str(tmp_path / "my-trust"))  # another user
    sha = hashlib.sha256(SOURCE.encode()).hexdigest()
    for cmd in (["replay", "--run", mine], ["inspect", mine, "--json"], ["export", mine, "--out", tmp_path / "x"],
                ["train", "--resume", mine]):
        refused(run(*cmd), "model/net.py", sha, "not trained or approved here", "--trust-model-code")
    assert not (mine / "model" / "RAN").exists() and not (tmp_path / "x").exists()
    r = run("replay", "--run", mine, "--trust-model-code")
    assert r.exit_code == 0, r.output
    assert f"running the model code of {mine}/model/net.py (sha256 {sha})" in " ".join(r.stderr.split())
    assert (mine / "model" / "RAN").exists()
    r = run("replay", "--run", mine)  # approved once: recorded
    assert r.exit_code == 0 and "running the model code" not in r.stderr


@pytest.mark.parametrize("record, words", [
    ({"step": 1, "loss": 0.5}, ["line 1", "missing log_root, state_root"]),
    ({"step": 1, "loss": 0.5, "state_root": ["x"], "log_root": "0" * 64}, ["line 1", "state_root: expected 64"]),
    ({"step": "1", "loss": 0.5, "state_root": "0" * 64, "log_root": "0" * 64}, ["line 1", "step: expected"]),
])
def test_roots_records_are_checked_before_use(mlp_run: Path, tmp_path: Path, record: dict, words: list[str]) -> None:
    """Before: a roots.jsonl line without a state root (or with a list as one) ended `vtrain replay`
    and `export` in a KeyError/TypeError traceback; now the line and the field are named."""
    run_dir = _foreign(mlp_run, tmp_path)
    (run_dir / "roots.jsonl").write_text(json.dumps(record) + "\n")
    refused(run("replay", "--run", run_dir), "roots.jsonl", *words)
    refused(run("export", run_dir, "--out", tmp_path / "x"), "roots.jsonl", *words)


def test_inspect_writes_no_plot_through_a_link_out_of_a_foreign_folder(mlp_run: Path, tmp_path: Path) -> None:
    """Before: `vtrain inspect RUN` wrote RUN/plots/*.png through RUN/plots linked to any folder."""
    run_dir = _foreign(mlp_run, tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (run_dir / "plots").symlink_to(target)
    refused(run("inspect", run_dir), "plots", "leads out of the run folder")
    assert not list(target.iterdir())


def test_resume_deletes_nothing_through_a_link_out_of_the_folder(mlp_run: Path, tmp_path: Path) -> None:
    """Before: `vtrain train --resume RUN` with RUN/logs linked to another folder deleted that
    folder's step_*.vtlog past the resume point (and wrote the new logs there)."""
    run_dir = _foreign(mlp_run, tmp_path)
    roots = run_dir / "roots.jsonl"
    roots.write_text(roots.read_text().splitlines()[0] + "\n")  # cut short after step 1
    outside = tmp_path / "someone-elses-logs"
    shutil.move(run_dir / "logs", outside)
    (run_dir / "logs").symlink_to(outside)
    refused(run("train", "--resume", run_dir), "logs", "leads out of the run folder")
    assert (outside / "step_000002.vtlog").exists()


@pytest.mark.parametrize("plant", ["fifo", "device"])
def test_a_local_store_reads_no_device_or_fifo_planted_in_it(tmp_path: Path, plant: str) -> None:
    """A store folder from someone else (a shared or downloaded --store): an object that is a FIFO
    (before: the open waited for a writer forever) or a link to /dev/zero (before: read up to the
    index's size, up to the job's bound) is refused unread."""
    from protocol.store import ArtifactStore
    from vtrain.errors import CorruptArtifact

    store = ArtifactStore(tmp_path / "store")
    digest = store.put_log(7, 1, b"the log of step 1")
    obj = tmp_path / "store" / "7" / "objects" / digest.hex()
    obj.unlink()
    if plant == "fifo":
        os.mkfifo(obj)
    else:
        obj.symlink_to("/dev/zero")
    with pytest.raises(CorruptArtifact, match="not a regular file"):
        store.get_log(7, 1)


@pytest.mark.parametrize("name", ["../outside.txt", "data/link.txt"])
def test_a_specs_text_file_name_cannot_lead_out_of_the_folder(gpt_run: Path, tmp_path: Path, name: str) -> None:
    """spec.json's text_path of a foreign folder (and the spec recorded in inputs.json, both the
    adversary's) naming '../outside.txt' or a link out: before, that file outside the folder was
    read and trained on (`sample` then printed text over its characters); now refused by name."""
    run_dir = _foreign(gpt_run, tmp_path)
    outside = run_dir.parent / "outside.txt"
    outside.write_text((run_dir / "data" / "t.txt").read_text())
    if name.startswith("data/"):
        (run_dir / name).symlink_to(outside)
    for f in ("spec.json", "inputs.json"):
        d = json.loads((run_dir / f).read_text())
        (d if f == "spec.json" else d["spec"])["text_path"] = name
        if f == "inputs.json":
            d["files"] = {}
        (run_dir / f).write_text(json.dumps(d))
    refused(run("replay", "--run", run_dir), "text file", name, "run folder")
    refused(run("sample", run_dir, "--tokens", "5"), "text file", name, "run folder")


@pytest.mark.parametrize("plant", ["device", "huge"])
def test_a_deployment_file_that_is_a_device_or_huge_is_refused_unread(tmp_path: Path, plant: str) -> None:
    """A deployment file handed over by someone else, linked to /dev/zero (before: read without
    end) or past 16 MiB (before: read whole and parsed), is refused before it is read."""
    from protocol.chain import MAX_DEPLOYMENT_BYTES, ChainError, Deployment

    dep = tmp_path / "deployment.json"
    if plant == "device":
        dep.symlink_to("/dev/zero")
    else:
        with open(dep, "wb") as f:
            f.truncate(MAX_DEPLOYMENT_BYTES + 1)
    with pytest.raises(ChainError, match="deployment file .*(not a regular file|more than the 16777216 bytes)"):
        Deployment.load(dep)


def test_a_bound_far_above_memory_reads_only_what_the_file_holds(tmp_path: Path) -> None:
    """A job's bound on a file (GPT-2 117M's log bound is tens of GB) is a limit, not a buffer size:
    the old read asked for ``limit + 1`` bytes at once and raised MemoryError on a 200 KB log."""
    from vtrain.training.untrusted import read_regular

    p = tmp_path / "log"
    blob = os.urandom(3 << 20) + b"tail"  # more than one 1 MiB piece past the first read
    p.write_bytes(blob)
    assert read_regular(p, 1 << 60, "log") == blob
    assert read_regular(p, len(blob), "log") == blob
    with pytest.raises(Exception, match="more than the"):
        read_regular(p, len(blob) - 1, "log")
