#!/usr/bin/env python
"""Security report: runs the security tests and tabulates their trials.

    .venv/bin/python scripts/bench_security.py [--slow] [--list] [-k EXPR]

Runs pytest (a subprocess) over tests/test_attacks.py (the attack matrix), tests/test_served.py
(served artifacts), tests/test_fuzz_contracts.py
(contract fuzzing) and tests/test_resilience.py (crash-restart trials) -- whichever exist -- with
``VTRAIN_SECURITY_REPORT`` naming a temporary file, then reads the trials the tests recorded
(one JSON line each, ``tests/security_report.py``) and prints:

    attacks tried / caught, fuzz sequences run / invariant violations,
    crash-restart trials / correct outcomes, and pytest's exit status.

``--slow`` includes the slow tests (every cheat with the real agents, every level of every silent
side, ...). Exits 1 if any trial failed, pytest failed, or nothing was recorded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from security_report import KINDS, REPORT_ENV  # noqa: E402

log = logging.getLogger("bench_security")

#: The security test files, in report order.
SECURITY_TESTS = ("tests/test_attacks.py", "tests/test_served.py", "tests/test_fuzz_contracts.py",
                  "tests/test_resilience.py")
#: pytest exit status when no test was collected.
NO_TESTS = 5


@dataclass
class Tally:
    """Trials of one kind."""

    trials: int = 0
    ok: int = 0
    sequences: int = 0
    steps: int = 0
    violations: int = 0
    failed: list[str] = field(default_factory=list)

    def add(self, rec: dict[str, Any]) -> None:
        self.trials += 1
        ok = bool(rec.get("ok"))
        self.ok += ok
        if not ok:
            self.failed.append(str(rec.get("name", "?")))
        self.sequences += int(rec.get("sequences", 1))
        self.steps += int(rec.get("steps", 0))
        self.violations += int(rec.get("violations", 0 if ok else 1))


def read_trials(path: Path) -> list[dict[str, Any]]:
    """The JSON-line records of ``path`` (a malformed line is reported and skipped)."""
    out = []
    if not path.exists():
        return out
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            log.error("%s:%d: not a JSON record (%s): %.80s", path, n, e, line)
            continue
        if rec.get("kind") not in KINDS:
            log.error("%s:%d: unknown trial kind %r", path, n, rec.get("kind"))
            continue
        out.append(rec)
    return out


def tally(records: list[dict[str, Any]]) -> dict[str, Tally]:
    t = {k: Tally() for k in KINDS}
    for rec in records:
        t[rec["kind"]].add(rec)
    return t


def run_pytest(files: list[str], report: Path, slow: bool, keyword: str | None) -> int:
    """pytest over ``files`` with the report file set; returns its exit status."""
    env = dict(os.environ)
    env[REPORT_ENV] = str(report)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    if slow:
        cmd += ["-m", ""]
    if keyword:
        cmd += ["-k", keyword]
    log.info("running: %s", shlex.join(cmd))
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


def render(t: dict[str, Tally], rc: int, missing: list[str], seconds: float) -> str:
    a, f, c = t["attack"], t["fuzz"], t["crash_restart"]
    rows = [
        ("attacks tried / caught", f"{a.trials} / {a.ok}"),
        ("fuzz sequences run / invariant violations", f"{f.sequences if f.trials else 0} / {f.violations}"),
        ("crash-restart trials / correct outcomes", f"{c.trials} / {c.ok}"),
        ("pytest exit status", str(rc)),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if f.steps:
        lines.append(f"{'fuzz steps (transactions)':<{width}}  {f.steps}")
    for kind, tl in t.items():
        for name in tl.failed:
            lines.append(f"FAILED {kind}: {name}")
    for m in missing:
        lines.append(f"skipped (file not present): {m}")
    lines.append(f"{'wall time':<{width}}  {seconds:.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", action="store_true", help="include the slow tests")
    ap.add_argument("--list", action="store_true", help="print every trial")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression (a subset of the trials)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    files = [f for f in SECURITY_TESTS if (ROOT / f).exists()]
    missing = [f for f in SECURITY_TESTS if f not in files]
    if not files:
        log.error("none of %s exists under %s", ", ".join(SECURITY_TESTS), ROOT)
        return 1
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "security.jsonl"
        t0 = time.perf_counter()
        rc = run_pytest(files, report, args.slow, args.keyword)
        seconds = time.perf_counter() - t0
        records = read_trials(report)
    t = tally(records)
    if args.list:
        for rec in records:
            print(f"{rec['kind']:<14} {'ok  ' if rec['ok'] else 'FAIL'} {rec['name']}")
    print(render(t, rc, missing, seconds))
    failed = any(tl.failed for tl in t.values()) or t["fuzz"].violations > 0
    if failed or rc not in (0, NO_TESTS) or not records:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
