"""Data from a user's files for a :class:`~vtrain.frontend.TorchTask` (no downloads, no tokenizer).

- text: characters (a sorted character vocabulary) or GPT-2 byte-level tokens (each UTF-8 byte is
  its token id, 0..255, valid ids of GPT-2's 50,257-token vocabulary without a tokenizer);
- arrays: ``.npz`` (named arrays) or ``.npy`` (one array, the last column the target or a separate file);
- sklearn's bundled 8x8 digits as ``1x8x8`` images with integer labels.

Windows of ``context + 1`` tokens give ``input = w[:-1]``, ``target = w[1:]`` (next-token prediction).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vtrain.errors import DatasetError


def _read(path: str | Path) -> bytes:
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise DatasetError(f"data file {path}: {e.strerror or e}") from None
    if not raw:
        raise DatasetError(f"data file {path}: the file is empty")
    return raw


def token_windows(ids: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping windows of ``context + 1`` ids: (inputs ``[N, context]``, targets ``[N, context]``)."""
    L = context + 1
    n = len(ids) // L
    if n == 0:
        raise DatasetError(f"text too short: expected at least {L} tokens, got {len(ids)}")
    w = np.asarray(ids[: n * L], np.int64).reshape(n, L)
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def text_bytes(path: str | Path, context: int) -> tuple[np.ndarray, np.ndarray]:
    """A file's bytes as GPT-2 byte-level token ids (0..255), in next-token windows."""
    raw = _read(path)
    return token_windows(np.frombuffer(raw, np.uint8).astype(np.int64), context)


def text_chars(path: str | Path, context: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A UTF-8 file's characters as ids into its sorted character set, in windows; and that vocabulary."""
    raw = _read(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"data file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    vocab = sorted(set(text))
    lut = {c: i for i, c in enumerate(vocab)}
    ids = np.fromiter((lut[c] for c in text), np.int64, count=len(text))
    x, y = token_windows(ids, context)
    return x, y, vocab


def arrays(path: str | Path, inputs: str = "x", target: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, target)`` from an ``.npz`` (arrays named ``inputs`` and ``target``) or an ``.npy``
    (a 2-D array whose last column is the target)."""
    path = Path(path)
    _read(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DatasetError(f"data file {path}: not a numpy .npy/.npz file ({e})") from None
    if isinstance(loaded, np.ndarray):
        if loaded.ndim != 2 or loaded.shape[1] < 2:
            raise DatasetError(f"data file {path}: expected a 2-D array (features then the target column), "
                               f"got shape {loaded.shape}")
        return np.ascontiguousarray(loaded[:, :-1]), np.ascontiguousarray(loaded[:, -1])
    with loaded:
        missing = [k for k in (inputs, target) if k not in loaded.files]
        if missing:
            raise DatasetError(f"data file {path}: no array named {missing} (it has {loaded.files})")
        x, y = loaded[inputs], loaded[target]
    if len(x) != len(y):
        raise DatasetError(f"data file {path}: {inputs} has {len(x)} samples, {target} has {len(y)}")
    return x, y


def digits_images() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's 8x8 digits as ``[N, 1, 8, 8]`` float32 images in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8), d.target.astype(np.int64)
