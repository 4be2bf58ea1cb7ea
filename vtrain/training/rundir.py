"""A local training run on disk: spec, per-step roots, rounding logs and interval checkpoints.

Layout of ``<run>/``::

    spec.json                       the TrainSpec (a text file's path relative to the run folder)
    inputs.json                     sha256 of every pinned input file and of the dataset as trained on
    data/<name>                     a copy of the user's text file (GPT runs trained with --text)
    model/<file>.py, model/<ckpt>   a FILE.py:FACTORY run: copies of the factory source and the
                                    checkpoint it loads; spec.json pins both by sha256
    vocab.json                      the tokenizer: the characters of the vocabulary, id order (GPT)
    roots.jsonl                     one line per step: step, loss, state_root, log_root (hex)
    logs/step_000001.vtlog          rounding log of each step (vtrain.numerics.logfile)
    checkpoints/step_000000.safetensors   state at each interval start (step 0, K, 2K, ...)

Every file is written atomically (temp file + rename), so a crash never leaves half a file.
The folder may come from someone else: every read and write of it goes through
``vtrain.training.untrusted`` (one open, checked on its descriptor; no link inside the folder
followed, and a link out of it refused by name first: :meth:`RunDir.member`).
The folder is self-contained: a replay from any directory finds the data in it, and data that
changed since training is reported (the file and both sha256) before any step runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from vtrain.errors import CorruptArtifact, CorruptCheckpoint, DataChanged, MissingArtifact, VtrainError
from vtrain.graph.executor import StepLog, state_tensors
from vtrain.graph.step_graph import Graph
from vtrain.numerics.logfile import decode_step_log, encode_step_log
from vtrain.training.data import Dataset, dataset_sha256
from vtrain.training.spec import TrainSpec
from vtrain.training.untrusted import (
    hash_beneath,
    loads_json,
    open_append_beneath,
    open_dir_beneath,
    read_beneath,
    read_regular,
    write_beneath,
)

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


LAYOUT = ("spec.json", "inputs.json", "roots.jsonl", "vocab.json", "data", "model", "logs", "checkpoints")
"""The names a run writes in its folder (``inspect`` adds ``plots``)."""


@dataclass
class RunDir:
    """Reader/writer of one run folder."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    def foreign_entries(self) -> list[str]:
        """Entries of :data:`LAYOUT` already in a folder that holds no run (no spec.json, no roots.jsonl):
        not this project's, and a new run would write over them."""
        if not self.path.is_dir() or (self.path / "spec.json").exists() or (self.path / "roots.jsonl").exists():
            return []
        return [n for n in LAYOUT if os.path.lexists(self.path / n)]

    def remove_unstarted(self, spec: TrainSpec, made_folder: bool) -> None:
        """Undo a fresh start that failed before its spec.json was written: the pinned copies of the model
        source and checkpoint (:meth:`pin_model`, written into a folder :meth:`foreign_entries` found
        free of them), ``model/`` if that leaves it empty, and the run folder if this start made it and
        it is empty. Nothing else is touched."""
        if (self.path / "spec.json").exists():
            return
        if spec.pinned:
            for rel in (spec.model.rpartition(":")[0], spec.checkpoint):
                if rel and not Path(rel).is_absolute() and rel.startswith("model/"):
                    (self.path / rel).unlink(missing_ok=True)
        for d in ([self.path / "model"] + ([self.path] if made_folder else [])):
            with contextlib.suppress(OSError):  # not empty (or not there): kept
                d.rmdir()

    # spec
    def write_spec(self, spec: TrainSpec) -> None:
        self.write_member("spec.json", spec.to_json().encode(), "spec")

    def read_stored_spec(self) -> TrainSpec:
        """spec.json as stored (a pinned text file's path relative to the run folder)."""
        from vtrain.errors import SpecError
        from vtrain.training.spec import MAX_SPEC_BYTES

        p = self.path / "spec.json"
        if not p.exists():
            raise MissingArtifact(f"no spec.json in run folder {self.path}")
        try:  # one open, regular, bounded (as TrainSpec.from_file), no link followed inside the folder
            raw = self.read_member("spec.json", MAX_SPEC_BYTES, "spec file")
        except CorruptArtifact as e:
            raise SpecError(str(e)) from None
        try:
            return TrainSpec.from_json(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SpecError(f"spec file {p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except SpecError as e:
            raise SpecError(f"spec file {p}: {e}") from None

    def read_spec(self) -> TrainSpec:
        """The spec, ready to build the job from any working directory: pinned files' paths are
        resolved inside the run folder, every pinned file is checked against its sha256, and the
        spec must be the one trained (``inputs.json`` records it; the changed key is named)."""
        spec = self.read_stored_spec()
        self.verify_inputs()
        self.verify_spec(spec)
        return self.resolve(spec)

    def resolve(self, spec: TrainSpec) -> TrainSpec:
        """``spec`` (as stored) with its run-folder-relative paths made paths inside this folder."""
        if spec.text_path is not None and not Path(spec.text_path).is_absolute():
            spec = dataclasses.replace(spec, text_path=str(self.member(spec.text_path, "spec.json: text file")))
        elif spec.text_path is not None:
            log.warning("%s: the text file is not pinned in the run folder (%s)", self.path, spec.text_path)
        return self.resolve_model(spec)

    def resolve_model(self, spec: TrainSpec) -> TrainSpec:
        """``spec`` with a pinned model's relative paths (factory source, checkpoint) inside this folder."""
        if spec.pinned:
            path, _, factory = spec.model.rpartition(":")
            if not Path(path).is_absolute():
                spec = dataclasses.replace(spec, model=f"{self.member(path, 'spec.json: model source')}:{factory}")
            if spec.checkpoint is not None and not Path(spec.checkpoint).is_absolute():
                where = self.member(spec.checkpoint, "spec.json: checkpoint")
                spec = dataclasses.replace(spec, checkpoint=str(where))
        return spec

    def pin_model(self, spec: TrainSpec) -> TrainSpec:
        """A FILE.py:FACTORY spec: copy the factory source (and the checkpoint) into ``model/`` and
        return the spec to store: paths relative to the run folder, each file pinned by the sha256
        of the bytes copied. The job is then built from these copies (never from the user's file,
        which may change meanwhile). Other specs are returned as they are."""
        if spec.model in ("mlp", "gpt"):
            return spec
        path, _, factory = spec.model.rpartition(":")
        src = Path(path)
        if not src.is_file():
            raise MissingArtifact(f"model source {src} not found")
        raw = src.read_bytes()
        if spec.model_sha256 is not None and hashlib.sha256(raw).hexdigest() != spec.model_sha256:
            raise DataChanged(f"model source {src} is not the pinned one: sha256 "
                              f"{hashlib.sha256(raw).hexdigest()}, the spec pins {spec.model_sha256}")
        rel = f"model/{src.name}"
        self.write_member(rel, raw, "model source")
        out = dataclasses.replace(spec, model=f"{rel}:{factory}", model_sha256=hashlib.sha256(raw).hexdigest())
        if spec.checkpoint is not None:
            ck = Path(spec.checkpoint)
            if not ck.is_file():
                raise MissingArtifact(f"checkpoint {ck} not found")
            data = ck.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if spec.checkpoint_sha256 is not None and digest != spec.checkpoint_sha256:
                raise DataChanged(f"checkpoint {ck} is not the pinned one: sha256 {digest}, "
                                  f"the spec pins {spec.checkpoint_sha256}")
            crel = f"model/{ck.name}"
            if crel == rel:
                raise MissingArtifact(f"checkpoint {ck} and model source {src} have one file name; rename one")
            self.write_member(crel, data, "checkpoint")
            out = dataclasses.replace(out, checkpoint=crel, checkpoint_sha256=digest)
        return out

    def pin_initial_weights(self, spec: TrainSpec, module: torch.nn.Module) -> TrainSpec:
        """A file model without a checkpoint (``spec`` as :meth:`pin_model` returned it): write the
        weights its factory drew (``module``, before any step) to ``model/initial.safetensors`` and
        return the spec pinning them as its ``checkpoint``. Torch's random init differs between CPUs
        (:data:`~vtrain.frontend.job.RANDOM_INIT_CAUSE`): every later replay, resume, export and
        agent loads these bytes instead of drawing its own. The values are the module's, so the
        initial state root is the one the factory's weights give on this machine."""
        from vtrain.frontend.job import INITIAL_WEIGHTS, initial_weights_bytes

        rel = f"model/{INITIAL_WEIGHTS}"  # the source's copy ends in .py: never this name
        raw = initial_weights_bytes(module)
        self.write_member(rel, raw, "initial weights")
        return dataclasses.replace(spec, checkpoint=rel, checkpoint_sha256=hashlib.sha256(raw).hexdigest())

    def drawn_initial_weights(self) -> str | None:
        """The run's checkpoint that its factory drew (``inputs.json``: ``initial_weights``), if any:
        a run started without ``--checkpoint``."""
        v = (self.read_inputs() or {}).get("initial_weights")
        return v if isinstance(v, str) else None

    # pinned inputs: data copy, vocabulary, hashes
    def pin_inputs(self, spec: TrainSpec, dataset: Dataset, drawn_initial: bool = False) -> TrainSpec:
        """Copy the spec's text file into ``data/``, write ``vocab.json`` and ``inputs.json``; return
        the spec to store (its ``text_path`` relative to the run folder). ``drawn_initial``: the spec's
        checkpoint holds the weights its factory drew (:meth:`pin_initial_weights`), recorded as such."""
        files: dict[str, str] = {}
        if spec.pinned:  # copied by pin_model: record the pins with the other files
            files[spec.model.rpartition(":")[0]] = spec.model_sha256  # type: ignore[assignment]
            if spec.checkpoint is not None:
                files[spec.checkpoint] = spec.checkpoint_sha256  # type: ignore[assignment]
        if spec.text_path is not None:
            raw = Path(spec.text_path).read_bytes()
            rel = f"data/{Path(spec.text_path).name}"
            self.write_member(rel, raw, "data file")
            files[rel] = hashlib.sha256(raw).hexdigest()
            spec = dataclasses.replace(spec, text_path=rel)
        if dataset.vocab is not None:
            vocab = {"kind": "characters", "symbols": list(dataset.vocab)}
            self.write_member("vocab.json", json.dumps(vocab, ensure_ascii=False).encode(), "vocabulary")
        inputs = {"files": files, "dataset_sha256": dataset_sha256(dataset),
                  "dataset_shape": list(dataset.samples.shape), "spec": spec.to_dict()}
        if drawn_initial:
            inputs["initial_weights"] = spec.checkpoint
        self.write_member("inputs.json", json.dumps(inputs, indent=1).encode(), "inputs record")
        return spec

    def read_inputs(self) -> dict | None:
        p = self.path / "inputs.json"
        if not p.exists():
            return None  # a run folder from before inputs were pinned
        raw = self.read_member("inputs.json", _MAX_RECORD_BYTES, "inputs record")
        try:
            d = loads_json(raw.decode("utf-8"))
            if not isinstance(d, dict) or not isinstance(d.get("files", {}), dict):
                raise ValueError("expected an object with 'files'")
            return d
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptArtifact(f"{p}: not an inputs record ({e})") from None

    def verify_inputs(self) -> None:
        """Every pinned file is there with its recorded sha256 (DataChanged / MissingArtifact)."""
        inputs = self.read_inputs()
        for rel, want in (inputs or {}).get("files", {}).items():
            p = self._pinned_path(rel)
            if not p.exists():
                raise MissingArtifact(f"pinned {_what(rel)} {p} missing from the run folder")
            if not p.is_file():  # a device or a FIFO would be read without end
                raise CorruptArtifact(f"{self.path / 'inputs.json'}: pinned {_what(rel)} {p} is not a regular file")
            root, inside = self._inside(rel, f"{self.path / 'inputs.json'}: pinned file")
            got = hash_beneath(root, inside, f"pinned {_what(rel)}")  # streamed, bounded by its size, one open
            if got != want:
                raise DataChanged(f"{_what(rel)} {p} changed since training: sha256 {got}, recorded {want}")

    def _pinned_path(self, rel: object) -> Path:
        """``rel`` (a file name from ``inputs.json``, which may come from someone else) as a path
        inside this folder: an absolute name, a ``..`` or a link leading out of it is refused."""
        return self.member(rel, f"{self.path / 'inputs.json'}: pinned file")

    def member(self, rel: object, what: str) -> Path:
        """``rel`` as a path inside this folder (which may come from someone else): an absolute
        name, a ``..`` or a link leading out of the folder is refused (CorruptArtifact)."""
        if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CorruptArtifact(f"{what} {rel!r} is not a path inside the run folder")
        p = self.path / rel
        if p.exists() and not p.resolve().is_relative_to(self.path.resolve()):
            raise CorruptArtifact(f"{what} {rel!r} leads out of the run folder (to {p.resolve()})")
        return p

    def _inside(self, rel: object, what: str) -> tuple[Path, Path]:
        """``(root, inside)``: the folder resolved and ``rel``'s resolved path relative to it (links
        inside the folder resolved once, by name); a path that resolves out of it is CorruptArtifact.
        The file is then opened beneath ``root`` along ``inside`` following no link, so a link
        swapped in after this check is refused, not followed."""
        p = self.member(rel, what)
        root = self.path.resolve()
        real = p.resolve()
        if not real.is_relative_to(root) or real == root:
            raise CorruptArtifact(f"{what} {rel!r} leads out of the run folder (to {real})")
        return root, real.relative_to(root)

    def write_member(self, rel: str, data: bytes, what: str) -> None:
        """Write the folder's file ``rel`` atomically (``untrusted.write_beneath``): never through a
        link planted in the folder (one leading out is refused by name; a swap is not followed)."""
        self.path.mkdir(parents=True, exist_ok=True)
        root, inside = self._inside(rel, what)
        write_beneath(root, inside, data, what)

    def read_member(self, rel: str, limit: int, what: str) -> bytes:
        """The bytes of the folder's file ``rel``, the one guard of every read of a run folder (it
        may come from someone else): a regular file (never a device or a FIFO, which would be read
        without end) inside the folder (:meth:`member`) of at most ``limit`` bytes, checked before a
        byte is read (CorruptArtifact naming the file and the limit); absent: MissingArtifact."""
        p = self.member(rel, what)
        try:
            root, inside = self._inside(rel, what)
            return read_beneath(root, inside, limit, what)
        except FileNotFoundError:
            raise MissingArtifact(f"{what} {p} missing from the run folder") from None

    def verify_spec(self, spec: TrainSpec) -> None:
        """``spec.json`` is the spec trained (recorded in ``inputs.json``): DataChanged names the
        first setting that differs (a model argument, a pin, a hyperparameter)."""
        want = (self.read_inputs() or {}).get("spec")
        if want is None:
            return  # a run folder from before specs were recorded
        got = json.loads(json.dumps(spec.to_dict()))  # as recorded (tuples are JSON lists)
        if got != want:
            key = _first_difference(want, got)
            raise DataChanged(f"{self.path / 'spec.json'} changed since training (or the copy of the spec that "
                              f"{self.path / 'inputs.json'} records did): {key}")

    def verify_dataset(self, dataset: Dataset) -> None:
        """The dataset built for a replay is the one trained on (sha256 of its samples)."""
        want = (self.read_inputs() or {}).get("dataset_sha256")
        if want is not None and (got := dataset_sha256(dataset)) != want:
            raise DataChanged(f"the dataset of {self.path} differs from the one trained on: "
                              f"sha256 {got}, recorded in {self.path / 'inputs.json'} {want}")

    def read_vocab(self, dataset: Dataset) -> list[str] | None:
        """The vocabulary of the run: ``dataset``'s (built from the pinned text), checked against
        ``vocab.json`` when there is one (bounded by the size of ``dataset``'s vocabulary in JSON;
        a different one is DataChanged: it is not pinned by ``inputs.json``, so it is never used
        instead of the dataset's)."""
        p = self.path / "vocab.json"
        if dataset.vocab is None or not p.exists():
            return dataset.vocab
        limit = _VOCAB_OVERHEAD + _VOCAB_SYMBOL_BYTES * len(dataset.vocab)
        raw = self.read_member("vocab.json", limit, "vocabulary")
        try:
            d = loads_json(raw.decode("utf-8"))
            symbols = d["symbols"]
            if not isinstance(symbols, list) or not all(isinstance(c, str) for c in symbols):
                raise ValueError("symbols: expected a list of strings")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise CorruptArtifact(f"{p}: not a vocabulary ({e})") from None
        if symbols != list(dataset.vocab):
            raise DataChanged(f"{p}: expected the vocabulary of the pinned text ({len(dataset.vocab)} symbols), "
                              f"got another ({len(symbols)} symbols)")
        return symbols

    # logs
    def log_path(self, step: int) -> Path:
        return self.path / "logs" / f"step_{step:06d}.vtlog"

    def write_log(self, step: int, log: StepLog, graph: Graph) -> int:
        data = encode_step_log(log, step, graph)
        self.write_member(str(self.log_path(step).relative_to(self.path)), data, f"rounding log of step {step}")
        return len(data)

    def read_log(self, step: int, graph: Graph) -> StepLog:
        p = self.log_path(step)
        if not p.exists():
            raise MissingArtifact(f"rounding log of step {step} missing: {p}")
        data = self.read_member(str(p.relative_to(self.path)), log_bytes_bound(graph), f"rounding log of step {step}")
        return decode_step_log(data, step, graph)

    # checkpoints
    def ckpt_path(self, step: int) -> Path:
        return self.path / "checkpoints" / f"step_{step:06d}.safetensors"

    def write_checkpoint(self, step: int, graph: Graph, state: list[torch.Tensor]) -> None:
        self.write_member(str(self.ckpt_path(step).relative_to(self.path)), encode_checkpoint(graph, state),
                          f"checkpoint of step {step}")

    def read_checkpoint(self, step: int, graph: Graph) -> list[torch.Tensor]:
        p = self.ckpt_path(step)
        if not p.exists():
            raise MissingArtifact(f"checkpoint of step {step} missing: {p}")
        data = self.read_member(str(p.relative_to(self.path)), checkpoint_bytes_bound(graph),
                                f"checkpoint of step {step}")
        return decode_checkpoint(data, graph, f"checkpoint {p}")

    # roots
    def append_roots(self, step: int, loss: float, state_root: bytes, log_root: bytes) -> None:
        """Append one record. A record is complete once its newline is on disk; a torn last line
        (a crash mid-append) is cut off first, so the file only ever holds whole records."""
        line = json.dumps({"step": step, "loss": loss, "state_root": state_root.hex(), "log_root": log_root.hex()})
        self.path.mkdir(parents=True, exist_ok=True)
        root, inside = self._inside("roots.jsonl", "roots record")
        with os.fdopen(open_append_beneath(root, inside, "roots record"), "a+b") as f:
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
        text = self.read_member("roots.jsonl", self._roots_bound(), "roots record").decode("utf-8", errors="replace")
        lines = text.split("\n")
        if lines and lines[-1]:  # no newline yet: an append torn by a crash, not a record
            log.warning("%s: ignoring a torn last line (%d bytes)", p, len(lines[-1]))
        for n, line in enumerate(lines[:-1], 1):
            try:
                r = loads_json(line)
                out[_roots_record(r)] = r
            except (json.JSONDecodeError, KeyError, ValueError, TypeError) as e:
                raise CorruptArtifact(f"{p}: line {n} is not a roots record ({e})") from None
        return out

    def _roots_bound(self) -> int:
        """Most bytes of ``roots.jsonl``: one record a step of the spec, and a torn line."""
        steps = self.read_stored_spec().steps if (self.path / "spec.json").exists() else 0
        return _MAX_RECORD_BYTES if not steps else _ROOTS_LINE_BYTES * (steps + 1)

    def checkpoint_steps(self) -> list[int]:
        d = self.path / "checkpoints"
        out = []
        for p in d.glob("step_*.safetensors") if d.exists() else []:
            try:
                out.append(int(p.stem.split("_")[1]))
            except (IndexError, ValueError):
                continue
        return sorted(out)

    def truncate_after(self, step: int) -> None:
        """Forget everything after ``step`` (resume): roots records, logs and checkpoints. Nothing is
        deleted or written when ``logs`` or ``checkpoints`` leads out of the folder (CorruptArtifact)."""
        for sub in ("logs", "checkpoints"):
            self.member(sub, f"{sub} folder")
        roots = self.read_roots() if (self.path / "roots.jsonl").exists() else {}
        kept = "".join(json.dumps(r) + "\n" for s, r in sorted(roots.items()) if s <= step)
        self.write_member("roots.jsonl", kept.encode(), "roots record")
        for sub, suffix in (("logs", ".vtlog"), ("checkpoints", ".safetensors")):
            if not (self.path / sub).exists():
                continue
            for name in self._names_in(sub):  # names deleted in the folder opened, never through a link
                if not (name.startswith("step_") and name.endswith(suffix)):
                    continue
                try:
                    s = int(name.split("_")[1].split(".")[0])
                except (IndexError, ValueError):
                    continue
                if s > step:
                    self._unlink_in(sub, name)
        # temp files of writes cut short (write_beneath's prefix), in the folder and its subfolders (no link followed)
        for top, _dirs, names in os.walk(self.path, followlinks=False):
            rel = Path(top).relative_to(self.path)
            for name in names:
                if name.startswith((".step_", ".roots.jsonl.")) and (Path(top) / name).is_file():
                    self._unlink_in(str(rel), name)

    def _names_in(self, sub: str) -> list[str]:
        """The names in the folder's subfolder ``sub`` (opened following no link)."""
        root, inside = self._inside(sub, f"{sub} folder")
        fd = open_dir_beneath(root, inside, f"{sub} folder")
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def _unlink_in(self, sub: str, name: str) -> None:
        """Delete the name ``name`` of the folder's subfolder ``sub`` (``""``/``"."``: the folder),
        the folder opened following no link: a name is removed, never a file through a link."""
        root = self.path.resolve()
        inside = Path() if sub in ("", ".") else self._inside(sub, f"{sub} folder")[1]
        fd = open_dir_beneath(root, inside, f"{sub} folder")
        try:
            os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def last_checkpoint_at_or_before(self, step: int, interval: int) -> int:
        s = (step // interval) * interval
        if not self.ckpt_path(s).exists():
            raise MissingArtifact(f"checkpoint of step {s} missing: {self.ckpt_path(s)}")
        return s


#: Most bytes of a run folder's JSON record (inputs.json), checked before it is read.
_MAX_RECORD_BYTES = 16 << 20
#: Most bytes of one line of roots.jsonl: ``{"step": <20 digits>, "loss": <a float's repr>,
#: "state_root": "<64 hex>", "log_root": "<64 hex>"}`` is at most 227.
_ROOTS_LINE_BYTES = 256
#: vocab.json: at most 16 bytes a symbol (a character escaped as a surrogate pair, quotes, ", ")
#: and the rest of the object.
_VOCAB_SYMBOL_BYTES = 16
_VOCAB_OVERHEAD = 1024


def log_bytes_bound(graph: Graph) -> int:
    """Most bytes of a rounding log of ``graph`` (``vtrain.numerics.logfile``): a header of at most
    32 bytes and a payload of at most 5 + 10 bytes an op + 10 bytes an element (version 2; version 1
    and paper logs are smaller), zlib's worst-case growth included. A folder's log over it is
    refused before it is read."""
    payload = 5 + 10 * graph.n_ops + 10 * sum(op.numel for op in graph.ops)
    return 32 + payload + payload // 1000 + 64


def checkpoint_bytes_bound(graph: Graph) -> int:
    """Most bytes of a checkpoint of ``graph`` (:func:`encode_checkpoint`): 4 bytes an element of
    every state slot, and a safetensors header of at most 160 bytes a tensor plus its name (JSON
    escaped) and 21 bytes a dimension; more is refused before it is read."""
    data = sum(4 * math.prod(s.shape) for s in graph.slots)
    header = sum(160 + 6 * len(s.name) + 21 * len(s.shape) for s in graph.slots)
    return 16 + data + header


def _roots_record(r: object) -> int:
    """The step of one roots.jsonl record, checked (it may come from someone else): a positive
    step, a number as loss, and both roots as 64 hex digits; else ValueError naming the field."""
    if not isinstance(r, dict):
        raise ValueError(f"expected an object, got {type(r).__name__}")
    missing = sorted({"step", "loss", "state_root", "log_root"} - set(r))
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    step = r["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"step: expected a positive integer, got {step!r:.40}")
    if not isinstance(r["loss"], int | float) or isinstance(r["loss"], bool):
        raise ValueError(f"loss: expected a number, got {r['loss']!r:.40}")
    for k in ("state_root", "log_root"):
        v = r[k]
        if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError(f"{k}: expected 64 lowercase hex digits, got {v!r:.80}")
    return step


def _what(rel: str) -> str:
    """What a pinned file of the run folder is, for messages."""
    if rel.startswith("model/"):
        return "model source" if rel.endswith(".py") else "checkpoint"
    return "data file"


def _first_difference(want: object, got: object, where: str = "") -> str:
    """``"KEY: recorded X, now Y"`` for the first differing key of two nested dicts."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got)):
            if want.get(k) != got.get(k):
                return _first_difference(want.get(k), got.get(k), f"{where}{k}.")
    return f"{where.rstrip('.') or 'spec'}: recorded {json.dumps(want)}, now {json.dumps(got)}"


def read_spec_file(path: str | Path) -> TrainSpec:
    """A spec file (:meth:`TrainSpec.from_file`); a run folder's ``spec.json`` (an ``inputs.json``
    beside it) is read as that run's spec (:meth:`RunDir.read_spec`: its pinned files resolved inside
    the folder and checked), so it works from any directory."""
    path = Path(path)
    if path.name == "spec.json" and (path.parent / "inputs.json").is_file():
        return RunDir(path.parent).read_spec()
    return TrainSpec.from_file(path)


def reset_roots(run: RunDir) -> None:
    (run.path / "roots.jsonl").unlink(missing_ok=True)


__all__ = ["RunDir", "atomic_write", "read_regular", "encode_checkpoint", "decode_checkpoint", "VtrainError"]
