"""A local training run on disk: spec, per-step roots, rounding logs and interval checkpoints.

Layout of ``<run>/``::

    spec.json                       the TrainSpec
    roots.jsonl                     one line per step: step, loss, state_root, log_root (hex)
    logs/step_000001.vtlog          rounding log of each step (vtrain.numerics.logfile)
    checkpoints/step_000000.safetensors   state at each interval start (step 0, K, 2K, ...)

Every file is written atomically (temp file + rename), so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from vtrain.errors import CorruptArtifact, CorruptCheckpoint, MissingArtifact, VtrainError
from vtrain.graph.executor import StepLog, state_tensors
from vtrain.graph.step_graph import Graph
from vtrain.numerics.logfile import decode_step_log, encode_step_log
from vtrain.training.spec import TrainSpec

log = logging.getLogger(__name__)

def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def encode_checkpoint(graph: Graph, state: list[torch.Tensor]) -> bytes:
    return st_save({f"{i:04d}:{s.name}": t.detach().numpy() for i, (s, t) in enumerate(zip(graph.slots, state))})


def decode_checkpoint(data: bytes, graph: Graph, what: str = "checkpoint") -> list[torch.Tensor]:
    """State tensors from a safetensors checkpoint; shape or name mismatches raise CorruptCheckpoint."""
    try:
        d = st_load(data)
    except (SafetensorError, ValueError, Exception) as e:  # safetensors raises several types
        raise CorruptCheckpoint(f"{what}: cannot decode safetensors ({e})") from None
    out: list[np.ndarray] = []
    for i, s in enumerate(graph.slots):
        key = f"{i:04d}:{s.name}"
        if key not in d:
            raise CorruptCheckpoint(f"{what}: missing tensor {key!r}")
        a = d[key]
        if a.dtype != np.float32 or tuple(a.shape) != s.shape:
            raise CorruptCheckpoint(f"{what}: tensor {key!r} expected float32{s.shape}, got {a.dtype}{a.shape}")
        out.append(a)
    if len(d) != len(graph.slots):
        raise CorruptCheckpoint(f"{what}: expected {len(graph.slots)} tensors, got {len(d)}")
    return state_tensors(out)


@dataclass
class RunDir:
    """Reader/writer of one run folder."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    # spec
    def write_spec(self, spec: TrainSpec) -> None:
        atomic_write(self.path / "spec.json", spec.to_json().encode())

    def read_spec(self) -> TrainSpec:
        p = self.path / "spec.json"
        if not p.exists():
            raise MissingArtifact(f"no spec.json in run folder {self.path}")
        return TrainSpec.from_file(p)

    # logs
    def log_path(self, step: int) -> Path:
        return self.path / "logs" / f"step_{step:06d}.vtlog"

    def write_log(self, step: int, log: StepLog, graph: Graph) -> int:
        data = encode_step_log(log, step, graph)
        atomic_write(self.log_path(step), data)
        return len(data)

    def read_log(self, step: int, graph: Graph) -> StepLog:
        p = self.log_path(step)
        if not p.exists():
            raise MissingArtifact(f"rounding log of step {step} missing: {p}")
        return decode_step_log(p.read_bytes(), step, graph)

    # checkpoints
    def ckpt_path(self, step: int) -> Path:
        return self.path / "checkpoints" / f"step_{step:06d}.safetensors"

    def write_checkpoint(self, step: int, graph: Graph, state: list[torch.Tensor]) -> None:
        atomic_write(self.ckpt_path(step), encode_checkpoint(graph, state))

    def read_checkpoint(self, step: int, graph: Graph) -> list[torch.Tensor]:
        p = self.ckpt_path(step)
        if not p.exists():
            raise MissingArtifact(f"checkpoint of step {step} missing: {p}")
        return decode_checkpoint(p.read_bytes(), graph, f"checkpoint {p}")

    # roots
    def append_roots(self, step: int, loss: float, state_root: bytes, log_root: bytes) -> None:
        """Append one record. A record is complete once its newline is on disk; a torn last line
        (a crash mid-append) is cut off first, so the file only ever holds whole records."""
        line = json.dumps({"step": step, "loss": loss, "state_root": state_root.hex(), "log_root": log_root.hex()})
        p = self.path / "roots.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size:
                f.seek(max(0, size - 4096))
                tail = f.read()
                if not tail.endswith(b"\n"):
                    keep = size - len(tail) + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
                    f.truncate(keep)
                    f.seek(0, os.SEEK_END)
            f.write((line + "\n").encode())
            f.flush()
            os.fsync(f.fileno())

    def read_roots(self) -> dict[int, dict]:
        p = self.path / "roots.jsonl"
        if not p.exists():
            raise MissingArtifact(f"no roots.jsonl in run folder {self.path}")
        out: dict[int, dict] = {}
        text = p.read_bytes().decode("utf-8", errors="replace")
        lines = text.split("\n")
        if lines and lines[-1]:  # no newline yet: an append torn by a crash, not a record
            log.warning("%s: ignoring a torn last line (%d bytes)", p, len(lines[-1]))
        for n, line in enumerate(lines[:-1], 1):
            try:
                r = json.loads(line)
                out[int(r["step"])] = r
            except (json.JSONDecodeError, KeyError, ValueError, TypeError) as e:
                raise CorruptArtifact(f"{p}: line {n} is not a roots record ({e})") from None
        return out

    def last_checkpoint_at_or_before(self, step: int, interval: int) -> int:
        s = (step // interval) * interval
        if not self.ckpt_path(s).exists():
            raise MissingArtifact(f"checkpoint of step {s} missing: {self.ckpt_path(s)}")
        return s


def reset_roots(run: RunDir) -> None:
    (run.path / "roots.jsonl").unlink(missing_ok=True)


__all__ = ["RunDir", "atomic_write", "encode_checkpoint", "decode_checkpoint", "VtrainError"]
