"""Run-folder reads and writes never follow a link planted in the folder, nor a swap after the check.

Every file is opened once, beneath the folder, following no link at any component
(``untrusted.open_beneath``), and checked on that descriptor; writes are a new file and a rename
(never into an existing file), and the one file written in place (``roots.jsonl``, appended) must
have a single name. Hard links are read like copies (the same bytes, checked like any other):
docs/security.md."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from vtrain.errors import CorruptArtifact
from vtrain.training import untrusted as U
from vtrain.training.rundir import RunDir

ROOT_LINE = '{"step": 1, "loss": 0.5, "state_root": "' + "ab" * 32 + '", "log_root": "' + "cd" * 32 + '"}\n'


@pytest.fixture()
def folder(tmp_path: Path) -> tuple[RunDir, Path]:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "roots.jsonl").write_text(ROOT_LINE)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jsonl").write_text(ROOT_LINE.replace("0.5", "9.5"))
    return RunDir(run), outside


def test_a_file_swapped_for_a_link_after_the_check_is_not_read(folder, monkeypatch) -> None:
    """Before: ``member`` checked the name, then ``read_regular`` opened it again by name and
    followed the link swapped in meanwhile (here to a file outside the folder)."""
    rd, outside = folder
    orig = RunDir.member

    def member_then_swap(self, rel, what):
        got = orig(self, rel, what)
        if rel == "roots.jsonl":
            link = self.path / ".swap"
            link.symlink_to(outside / "secret.jsonl")
            os.replace(link, self.path / "roots.jsonl")
        return got

    monkeypatch.setattr(RunDir, "member", member_then_swap)
    with pytest.raises(CorruptArtifact, match="roots.jsonl"):
        rd.read_member("roots.jsonl", 1 << 20, "roots record")


def test_no_component_is_followed_beneath_the_folder(folder) -> None:
    rd, outside = folder
    root = rd.path
    (root / "link.jsonl").symlink_to(outside / "secret.jsonl")
    (root / "dir").symlink_to(outside)
    for rel in ("link.jsonl", "dir/secret.jsonl"):
        with pytest.raises(CorruptArtifact, match="a link in the folder"):
            U.read_beneath(root, Path(rel), 1 << 20, "file")
        with pytest.raises(CorruptArtifact, match="a link in the folder"):
            U.hash_beneath(root, Path(rel), "file")
        with pytest.raises(CorruptArtifact, match="a link in the folder"):
            U.write_beneath(root, Path(rel).parent / "new", b"x", "file") if "/" in rel else (
                U.open_append_beneath(root, Path(rel), "file"))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.jsonl"]
    assert U.hash_beneath(root, Path("roots.jsonl"), "file") == hashlib.sha256(ROOT_LINE.encode()).hexdigest()
    os.mkfifo(root / "fifo")
    with pytest.raises(CorruptArtifact, match="not a regular file"):
        U.hash_beneath(root, Path("fifo"), "file")  # opened without blocking, never read


def test_writes_never_go_through_a_link_planted_in_a_foreign_folder(folder) -> None:
    """Before: ``write_log`` (``atomic_write``) wrote into ``logs/`` linked to another folder, and
    ``append_roots`` appended to the file ``roots.jsonl`` linked to (and cut its torn tail there)."""
    from vtrain.graph.step_graph import GraphBuilder

    rd, outside = folder
    g = GraphBuilder()
    x = g.input("x", (2,))
    g.output(g.add(x, x), 0)
    graph = g.build(g.sum(g.reshape(x, (1, 2))))
    os.rename(rd.path / "logs", rd.path / "logs.real")
    (rd.path / "logs").symlink_to(outside)
    from vtrain.graph.executor import StepLog
    from vtrain.numerics.rounding import Mode

    with pytest.raises(CorruptArtifact, match="leads out of the run folder"):
        rd.write_log(3, StepLog(Mode.CERTIFIED), graph)
    (rd.path / "roots.jsonl").unlink()
    (rd.path / "roots.jsonl").symlink_to(outside / "secret.jsonl")
    with pytest.raises(CorruptArtifact, match="leads out of the run folder"):
        rd.append_roots(2, 0.25, bytes(32), bytes(32))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.jsonl"]
    assert (outside / "secret.jsonl").read_text() == ROOT_LINE.replace("0.5", "9.5")


def test_a_hard_link_is_read_like_a_copy_but_never_appended_to(folder) -> None:
    rd, outside = folder
    (rd.path / "roots.jsonl").unlink()
    os.link(outside / "secret.jsonl", rd.path / "roots.jsonl")  # the same inode, two names
    assert rd.read_member("roots.jsonl", 1 << 20, "roots record") == (outside / "secret.jsonl").read_bytes()
    with pytest.raises(CorruptArtifact, match="2 names"):
        rd.append_roots(2, 0.25, bytes(32), bytes(32))
    rd.truncate_after(1)  # a rewrite replaces the name: the other name keeps its bytes
    assert (outside / "secret.jsonl").read_text() == ROOT_LINE.replace("0.5", "9.5")
    assert os.stat(rd.path / "roots.jsonl").st_nlink == 1
    rd.append_roots(2, 0.25, bytes(32), bytes(32))
    assert len(rd.read_roots()) == 2


def test_honest_writes_and_reads_still_work_with_a_link_inside_the_folder(folder) -> None:
    rd, _ = folder
    os.rename(rd.path / "logs", rd.path / "logs.real")
    (rd.path / "logs").symlink_to("logs.real")  # a link inside the folder: resolved once by name
    rd.write_member("logs/a.bin", b"abc", "file")
    assert (rd.path / "logs.real" / "a.bin").read_bytes() == b"abc"
    assert rd.read_member("logs/a.bin", 3, "file") == b"abc"
    rd.append_roots(2, 0.25, bytes(32), bytes(32))
    assert sorted(rd.read_roots()) == [1, 2]


def test_a_text_dataset_is_read_once_and_bounded(tmp_path: Path, monkeypatch) -> None:
    """Before: read whole by name, of any size (after a separate is_file check)."""
    from vtrain.errors import DatasetError
    from vtrain.training import data as D

    text = tmp_path / "t.txt"
    text.write_text("abcdefgh" * 8)
    assert D.load_text_file(text, 4).vocab is not None
    monkeypatch.setattr(D, "MAX_TEXT_BYTES", 63)
    with pytest.raises(DatasetError, match="64 bytes, more than the 63 bytes"):
        D.load_text_file(text, 4)
