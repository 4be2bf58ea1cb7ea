"""Which model code this user has agreed to run.

A run of a ``FILE.py:FACTORY`` model is built by executing the factory source pinned in the run
folder, with the user's permissions (no sandbox). A folder someone else handed over therefore
holds code: ``vtrain replay`` (and ``sample``, ``export``, ``inspect``, ``export-paper-log``,
``train --resume``) runs a folder's model source only when its sha256 is one this user trained
(``vtrain train`` records the sources it pins) or approved with ``--trust-model-code`` (recorded
then). The record is one line per source, ``<sha256> <where it was first seen>``, in
``$VTRAIN_TRUSTED_MODELS`` (default ``$XDG_STATE_HOME/vtrain/trusted-models``, else
``~/.local/state/vtrain/trusted-models``). A line is appended whole (one ``write`` of an
``O_APPEND`` file); a line that is not a sha256 is ignored.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")
#: Most bytes of the record read (a line is ~100 bytes: a million approved sources).
_MAX_RECORD_BYTES = 128 << 20


def trust_file() -> Path:
    """Where the approved sources are recorded."""
    if os.environ.get("VTRAIN_TRUSTED_MODELS"):
        return Path(os.environ["VTRAIN_TRUSTED_MODELS"])
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "vtrain" / "trusted-models"


def is_trusted(sha256: str | None) -> bool:
    """True when the model source of this sha256 was trained or approved by this user."""
    if sha256 is None or not _SHA256.fullmatch(sha256):
        return False
    p = trust_file()
    try:
        with p.open("rb") as f:
            raw = f.read(_MAX_RECORD_BYTES)
    except OSError:
        return False
    return any(line.split(b" ", 1)[0].decode("ascii", "replace") == sha256 for line in raw.splitlines())


def trust(sha256: str | None, where: str) -> None:
    """Record that this user runs the model source of ``sha256`` (first seen at ``where``). A record
    that cannot be written is a warning: the next run from a folder asks again."""
    if sha256 is None or not _SHA256.fullmatch(sha256) or is_trusted(sha256):
        return
    p = trust_file()
    line = f"{sha256} {where}".replace("\n", " ")[:4000] + "\n"
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError as e:
        log.warning("cannot record the approved model source %s in %s (%s)", sha256, p, e.strerror or e)
