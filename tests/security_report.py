"""Trial records for ``scripts/bench_security.py`` (attack matrix, contract fuzzing, crash-restart).

A security test calls :func:`record` once per trial and then asserts the outcome. When the
environment variable ``VTRAIN_SECURITY_REPORT`` names a file, each record is appended to it as one
JSON line; otherwise recording does nothing, so the tests run the same either way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

REPORT_ENV = "VTRAIN_SECURITY_REPORT"
KINDS = ("attack", "fuzz", "crash_restart")


def record(kind: str, name: str, ok: bool, **detail: Any) -> None:
    """Append one trial: ``kind`` (one of :data:`KINDS`), a short ``name``, whether the expected
    outcome held (``ok``), and any JSON-serialisable detail (for fuzzing: ``sequences``,
    ``steps``, ``violations``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trial kind {kind!r}; expected one of {KINDS}")
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "name": name, "ok": bool(ok), **detail}, sort_keys=True)
    with open(path, "a", encoding="utf-8") as f:  # one short append per trial
        f.write(line + "\n")


@contextmanager
def trial(name: str, prefix: str = "") -> Iterator[None]:
    """Records an attack row's outcome (named ``prefix + name``): ok when the body (the row's
    assertions) completes."""
    ok = False
    try:
        yield
        ok = True
    finally:
        record("attack", prefix + name, ok)
