"""Datasets as fixed-length FP32 samples (rows), so each sample is one leaf of the dataset root.

No downloads: sklearn's bundled digits, a deterministic synthetic corpus, or a user's text file.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vtrain.errors import DatasetError, MissingDataset

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Dataset:
    """Samples ``(N, L)`` float32 plus what a model needs to know about them."""

    samples: np.ndarray
    vocab: list[str] | None = None

    @property
    def n(self) -> int:
        return int(self.samples.shape[0])

    @property
    def sample_len(self) -> int:
        return int(self.samples.shape[1])


def dataset_sha256(ds: Dataset) -> str:
    """sha256 of the samples as the model sees them (float32, C order, with their shape): what a
    replay must get from its own copy of the data before any step runs."""
    h = hashlib.sha256(repr(tuple(ds.samples.shape)).encode())
    h.update(np.ascontiguousarray(ds.samples, dtype=np.float32).tobytes())
    return h.hexdigest()


def digits_dataset() -> Dataset:
    """sklearn's 8x8 digits (bundled with the package): 64 features in [0, 1] then the label."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.float32).reshape(-1, 1)
    return Dataset(np.ascontiguousarray(np.concatenate([x, y], axis=1)))


_WORDS = (
    "the a one every some model trainer auditor chain proof step weight log root game bond "
    "checks posts replays trains rounds commits disputes wins loses verifies computes "
    "quickly slowly honestly exactly again never always"
).split()


def synthetic_corpus(n_chars: int = 200_000, seed: int = 0) -> str:
    """A deterministic toy language: sentences from a small grammar (no randomness from the OS)."""
    rng = np.random.default_rng(seed)
    parts: list[str] = []
    total = 0
    while total < n_chars:
        k = int(rng.integers(3, 9))
        words = [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), k)]
        s = " ".join(words) + (". " if rng.random() < 0.8 else "! ")
        parts.append(s)
        total += len(s)
    return "".join(parts)[:n_chars]


def text_dataset(text: str, context: int) -> Dataset:
    """Character-level samples of ``context + 1`` tokens (non-overlapping windows)."""
    if len(text) < context + 1:
        raise DatasetError(f"text too short: expected at least {context + 1} characters, got {len(text)}")
    vocab = sorted(set(text))
    if len(vocab) > 2**24:
        raise DatasetError("vocabulary too large for exact FP32 token ids")
    lut = {c: i for i, c in enumerate(vocab)}
    ids = np.fromiter((lut[c] for c in text), dtype=np.float32, count=len(text))
    L = context + 1
    n = len(ids) // L
    return Dataset(np.ascontiguousarray(ids[: n * L].reshape(n, L)), vocab)


#: Most bytes of a text dataset file (read whole, then tokenised): checked before a byte is read.
MAX_TEXT_BYTES = 1 << 30


def load_text_file(path: Path, context: int) -> Dataset:
    """A user's UTF-8 text file as character-level samples; DatasetError names the file and problem.
    Only a regular file is read (a spec may come from someone else: a device such as /dev/zero
    would be read without end before the data could be checked against the job's dataRoot)."""
    from vtrain.errors import CorruptArtifact
    from vtrain.training.untrusted import read_regular

    p = Path(path)
    try:  # one open, checked on its descriptor: a regular file of at most MAX_TEXT_BYTES
        raw = read_regular(p, MAX_TEXT_BYTES, "text dataset")
    except CorruptArtifact as e:
        raise DatasetError(str(e)) from None
    except FileNotFoundError as e:
        raise MissingDataset(f"text dataset {path}: {e.strerror or e}") from None
    except OSError as e:
        raise DatasetError(f"text dataset {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"text dataset {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text:
        raise DatasetError(f"text dataset {path}: the file is empty")
    try:
        return text_dataset(text, context)
    except DatasetError as e:
        raise DatasetError(f"text dataset {path}: {e}") from None
