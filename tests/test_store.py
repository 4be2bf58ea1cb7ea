"""protocol.store: the content-addressed artifact store, its checkpoints and its HTTP reader."""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from protocol import store as store_mod
from protocol.store import (
    ArtifactStore,
    ArtifactUnavailable,
    HttpArtifactReader,
    StepRecord,
    load_checkpoint,
    save_checkpoint,
    serve_store,
)
from vtrain.commit.roots import state_root, step_leaf, tensor_root
from vtrain.errors import CorruptArtifact, MissingArtifact, VtrainError

ROOT = Path(__file__).resolve().parent.parent
JOB = "job-1"


def record(s: int) -> StepRecord:
    comps = tuple(tensor_root(np.full(70, s + i, np.float32)) for i in range(3))
    return StepRecord(s, state_root(comps), hashlib.sha256(b"log%d" % s).digest(), comps)


def ckpt() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "b": np.zeros(4, np.float32),
        "m.w": np.full((3, 4), -0.5, np.float32),
    }


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store")


@pytest.fixture
def served(store):
    server, url = serve_store(store.root)
    try:
        yield store, url
    finally:
        server.shutdown()
        server.server_close()


def fill(store: ArtifactStore) -> None:
    for s in (1, 2, 3):
        store.put_step(JOB, record(s))
        store.put_log(JOB, s, b"log bytes of step %d" % s)
    store.put_checkpoint(JOB, 0, save_checkpoint(ckpt()))


# ---------------------------------------------------------------------------------------------
# Local store


def test_round_trip_of_blobs_steps_logs_and_checkpoints(store):
    digest = store.put_blob(JOB, b"hello")
    assert digest == hashlib.sha256(b"hello").digest()
    assert (store.root / JOB / "objects" / digest.hex()).read_bytes() == b"hello"
    assert store.get_blob(JOB, digest) == b"hello"
    fill(store)
    for s in (1, 2, 3):
        rec = store.get_step(JOB, s)
        assert rec == record(s) and rec.leaf() == step_leaf(s, rec.state_root, rec.log_root)
        assert store.get_log(JOB, s) == b"log bytes of step %d" % s
    loaded = load_checkpoint(store.get_checkpoint(JOB, 0))
    assert set(loaded) == set(ckpt())
    for k, v in ckpt().items():
        assert loaded[k].dtype == v.dtype and loaded[k].tobytes() == v.tobytes()
    index = json.loads((store.root / JOB / "logs" / "2.json").read_text())
    assert index == {
        "digest": "0x" + hashlib.sha256(b"log bytes of step 2").hexdigest(),
        "size": 19,
    }


def test_puts_are_idempotent_and_step_records_immutable(store):
    store.put_step(JOB, record(1))
    store.put_step(JOB, record(1))
    store.put_log(JOB, 1, b"x")
    store.put_log(JOB, 1, b"x")
    other = StepRecord(1, record(2).state_root, record(2).log_root, record(2).components)
    with pytest.raises(ValueError, match="already stored with different content"):
        store.put_step(JOB, other)
    with pytest.raises(ValueError, match="already stored with different content"):
        store.put_log(JOB, 1, b"y")
    assert store.get_step(JOB, 1) == record(1) and store.get_log(JOB, 1) == b"x"


def test_corrupted_object_is_detected_naming_digest_and_path(store):
    digest = store.put_blob(JOB, b"payload")
    path = store.root / JOB / "objects" / digest.hex()
    path.write_bytes(b"pay1oad")
    with pytest.raises(CorruptArtifact, match=digest.hex()) as info:
        store.get_blob(JOB, digest)
    assert str(path) in str(info.value)
    store.put_blob(JOB, b"payload")  # a re-put repairs the corrupt object
    assert store.get_blob(JOB, digest) == b"payload"


def test_corrupted_log_and_step_index_are_detected(store):
    fill(store)
    ref = json.loads((store.root / JOB / "logs" / "1.json").read_text())
    (store.root / JOB / "objects" / ref["digest"][2:]).write_bytes(b"log bytes of step 9")
    with pytest.raises(CorruptArtifact):
        store.get_log(JOB, 1)
    step2 = store.root / JOB / "steps" / "2.json"
    obj = json.loads(step2.read_text())
    obj["components"][0] = "0x" + "00" * 32  # no longer the tree of the state root
    step2.write_text(json.dumps(obj))
    with pytest.raises(CorruptArtifact, match="expected the tree of the components"):
        store.get_step(JOB, 2)
    (store.root / JOB / "steps" / "3.json").write_text('{"s": 3, "state_')
    with pytest.raises(CorruptArtifact, match="expected JSON"):
        store.get_step(JOB, 3)
    (store.root / JOB / "steps" / "4.json").write_text(json.dumps(record(1).to_json()))
    with pytest.raises(CorruptArtifact, match="expected step 4, got 1"):
        store.get_step(JOB, 4)


def test_missing_artifacts_raise_missing_artifact(store):
    fill(store)
    with pytest.raises(MissingArtifact, match="steps/9.json"):
        store.get_step(JOB, 9)
    with pytest.raises(MissingArtifact):
        store.get_log("other-job", 1)
    with pytest.raises(MissingArtifact):
        store.get_checkpoint(JOB, 1)
    with pytest.raises(MissingArtifact):
        store.get_blob(JOB, bytes(32))
    assert issubclass(MissingArtifact, VtrainError) and issubclass(CorruptArtifact, VtrainError)


def test_job_names_cannot_escape_the_store(store):
    for bad in ("..", "../x", "a/b", "", ".hidden", "x" * 200, -1, True):
        with pytest.raises(ValueError, match="job"):
            store.put_blob(bad, b"x")
    assert store.put_blob(7, b"x") == store.put_blob("7", b"x")


def test_step_record_validates_itself():
    rec = record(2)
    assert StepRecord.from_json(rec.to_json()) == rec
    with pytest.raises(ValueError, match="s: expected an int"):
        StepRecord(0, rec.state_root, rec.log_root, rec.components)
    with pytest.raises(ValueError, match="non-empty tuple"):
        StepRecord(2, rec.state_root, rec.log_root, ())
    with pytest.raises(ValueError, match="expected keys"):
        StepRecord.from_json({**rec.to_json(), "extra": 1})


# ---------------------------------------------------------------------------------------------
# Atomic writes


def test_exception_mid_write_leaves_neither_final_nor_temp_file(store, monkeypatch):
    def boom(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(store_mod.os, "fsync", boom)  # after the bytes are written, before rename
    with pytest.raises(OSError, match="disk gone"):
        store.put_blob(JOB, b"important")
    objects = store.root / JOB / "objects"
    assert list(objects.iterdir()) == []
    with pytest.raises(MissingArtifact):
        store.get_blob(JOB, hashlib.sha256(b"important").digest())


def test_crash_between_write_and_rename_leaves_no_final_file(tmp_path):
    """A process killed before os.replace leaves only a .tmp- file, which readers never see."""
    root = tmp_path / "store"
    code = (
        "import os, sys\n"
        "from protocol import store\n"
        "os.replace = lambda *a: os._exit(9)\n"  # die hard, no cleanup, right before the rename
        f"store.ArtifactStore({str(root)!r}).put_log('j', 1, b'x' * 100000)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()
    objects = root / "j" / "objects"
    leftovers = list(objects.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".tmp-")
    assert not (root / "j" / "logs" / "1.json").exists()
    s = ArtifactStore(root)
    with pytest.raises(MissingArtifact):
        s.get_log("j", 1)
    s.put_log("j", 1, b"x" * 100000)  # a rerun completes normally
    assert s.get_log("j", 1) == b"x" * 100000


# ---------------------------------------------------------------------------------------------
# Checkpoints


def test_checkpoint_bytes_are_deterministic_and_round_trip():
    data = save_checkpoint(ckpt())
    assert save_checkpoint(dict(reversed(list(ckpt().items())))) == data
    out = load_checkpoint(data)
    assert {k: v.tobytes() for k, v in out.items()} == {k: v.tobytes() for k, v in ckpt().items()}


@pytest.mark.parametrize("cut", [0, 7, 8, 30, -1, -13])
def test_truncated_checkpoint_is_detected(cut):
    data = save_checkpoint(ckpt())
    with pytest.raises(CorruptArtifact):
        load_checkpoint(data[:cut])


def test_garbled_checkpoint_header_or_body_is_detected():
    data = save_checkpoint(ckpt())
    hlen = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + hlen]
    renamed = (
        data[:8] + header.replace(b'"w"', b'"v"') + data[8 + hlen :]
    )  # still valid safetensors
    with pytest.raises(CorruptArtifact, match="content digest"):
        load_checkpoint(renamed)
    body = bytearray(data)
    body[-1] ^= 0x40
    with pytest.raises(CorruptArtifact, match="content digest"):
        load_checkpoint(bytes(body))
    with pytest.raises(CorruptArtifact):
        load_checkpoint(data + b"trailing")


def test_checkpoint_without_the_vtrain_digest_is_refused():
    from safetensors.numpy import save

    with pytest.raises(CorruptArtifact, match="vtrain_sha256"):
        load_checkpoint(save({"w": np.zeros(3, np.float32)}))
    with pytest.raises(ValueError, match="non-empty dict"):
        save_checkpoint({})
    with pytest.raises(TypeError, match="expected a numpy array"):
        save_checkpoint({"w": [1.0]})  # type: ignore[dict-item]


# ---------------------------------------------------------------------------------------------
# HTTP


def test_http_reader_reads_a_served_store_with_the_same_api(served):
    store, url = served
    fill(store)
    reader = HttpArtifactReader(url)
    for s in (1, 2, 3):
        assert reader.get_step(JOB, s) == store.get_step(JOB, s)
        assert reader.get_log(JOB, s) == store.get_log(JOB, s)
    assert reader.get_checkpoint(JOB, 0) == store.get_checkpoint(JOB, 0)
    with pytest.raises(MissingArtifact, match="steps/7.json"):
        reader.get_step(JOB, 7)


def test_http_reader_detects_corruption_on_the_server(served):
    store, url = served
    fill(store)
    ref = json.loads((store.root / JOB / "checkpoints" / "0.json").read_text())
    path = store.root / JOB / "objects" / ref["digest"][2:]
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CorruptArtifact, match=ref["digest"][2:]) as info:
        HttpArtifactReader(url).get_checkpoint(JOB, 0)
    assert url in str(info.value)


def test_http_server_is_read_only_and_serves_only_the_layout(served):
    import urllib.error
    import urllib.request

    store, url = served
    fill(store)
    (store.root / "secret.txt").write_text("no")
    for bad in (
        "/secret.txt",
        f"/{JOB}/../secret.txt",
        f"/{JOB}/objects/xyz",
        f"/{JOB}/steps/01.json",
    ):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url + bad, timeout=5)
        assert info.value.code == 404
        info.value.close()
    req = urllib.request.Request(f"{url}/{JOB}/steps/1.json", data=b"{}", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 405
    info.value.close()


def test_http_reader_retries_server_errors_then_succeeds(store):
    fill(store)
    failures = {"left": 2}

    class Flaky(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if failures["left"]:
                failures["left"] -= 1
                self.send_error(503)
                return
            data = (store.root / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        reader = HttpArtifactReader(f"http://127.0.0.1:{server.server_address[1]}", backoff=0.01)
        assert reader.get_step(JOB, 1) == record(1)
        assert failures["left"] == 0
        failures["left"] = 10
        with pytest.raises(ArtifactUnavailable, match="after 4 attempts"):
            reader.get_step(JOB, 1)
    finally:
        server.shutdown()
        server.server_close()


def test_http_reader_gives_up_on_a_dead_server_after_bounded_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before use: nothing listens there
    reader = HttpArtifactReader(f"http://127.0.0.1:{port}", retries=2, backoff=0.01, timeout=2)
    with pytest.raises(ArtifactUnavailable, match="after 3 attempts"):
        reader.get_blob(JOB, bytes(32))
    with pytest.raises(ValueError, match="expected an http"):
        HttpArtifactReader("ftp://x")
