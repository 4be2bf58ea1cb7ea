"""Solidity lint: solhint (node_modules) over contracts/ with the project's .solhint.json reports
nothing, its inline disables are well-formed and justified, and the config really bites.
See docs/lint.md for the rule choices."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOLHINT = REPO / "node_modules" / "solhint" / "solhint.js"
RULES_DIR = REPO / "node_modules" / "solhint" / "lib" / "rules"
CONFIG = REPO / ".solhint.json"

pytestmark = pytest.mark.skipif(
    not SOLHINT.is_file() or shutil.which("node") is None,
    reason=f"solhint not installed ({SOLHINT} missing or no `node` on PATH): run `npm ci` (make setup)",
)

# A directive names rules after its keyword; solhint splits on commas only, so any free text
# ("-- reason") becomes part of a rule id and silently disables nothing.
_DIRECTIVE = re.compile(r"//\s*solhint-(disable-next-line|disable-line|disable|enable)\b(.*)$")


def _solhint(*args: str, cwd: Path) -> tuple[int, list[dict]]:
    """Runs solhint with the JSON formatter; returns (exit code, findings without the summary)."""
    proc = subprocess.run(
        ["node", str(SOLHINT), "--disc", "--noPoster", "-f", "json", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )
    out = proc.stdout.strip()
    if not out.startswith("["):
        raise AssertionError(f"solhint (exit {proc.returncode}) gave no JSON report:\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, [f for f in json.loads(out) if "ruleId" in f]


def _fmt(findings: list[dict]) -> str:
    return "\n".join(f"{f['filePath']}:{f['line']}:{f['column']} {f['severity']} {f['ruleId']}: {f['message']}"
                     for f in findings)


def test_solhint_reports_nothing_on_contracts() -> None:
    rc, findings = _solhint("--max-warnings", "0", "contracts/**/*.sol", cwd=REPO)
    assert findings == [], f"solhint findings (fix them or justify them, see docs/lint.md):\n{_fmt(findings)}"
    assert rc == 0


def test_every_inline_disable_names_real_rules_and_has_a_reason() -> None:
    known = {p.stem for p in RULES_DIR.glob("*/*.js")}
    problems: list[str] = []
    n = 0
    for path in sorted((REPO / "contracts").rglob("*.sol")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = _DIRECTIVE.search(line)
            if not m:
                continue
            n += 1
            where = f"{path.relative_to(REPO)}:{i + 1}"
            ids = [r.strip() for r in m.group(2).split(",")]
            if ids == [""]:
                problems.append(f"{where}: blanket directive (name the rules)")
            problems += [f"{where}: unknown rule id {r!r} (reason text belongs on the line above)"
                         for r in ids if r and r not in known]
            if m.group(1) == "enable":
                continue
            # The reason: a plain `//` comment among the three lines before the directive's line
            # (a `disable-line` may sit on a declaration whose NatSpec is in between).
            before = [s.strip() for s in lines[max(0, i - 3):i]]
            if line.strip().startswith("//") and m.group(1) != "disable-line":
                before = before[-1:]
            if not any(s.startswith("//") and not s.startswith("///") and "solhint-" not in s for s in before):
                problems.append(f"{where}: no `// reason` comment just above the directive")
    assert n > 0, "expected the justified disables of docs/lint.md in contracts/"
    assert problems == [], "\n".join(problems)


CANARY = """// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title Canary
/// @notice Breaks security rules and a documentation rule.
contract Canary {
    /// @notice Owner.
    address public owner;

    function take() external returns (uint256 r) {
        require(tx.origin == owner, "no");
        owner = msg.sender;
        assembly {
            r := 1
        }
    }
}
"""


def test_config_reports_security_rules_as_errors_and_relaxes_only_test_contracts(tmp_path: Path) -> None:
    # The same layout as the repository: the root config, and the looser one of contracts/test/.
    shutil.copy(CONFIG, tmp_path / ".solhint.json")
    (tmp_path / "contracts" / "test").mkdir(parents=True)
    shutil.copy(REPO / "contracts" / "test" / ".solhint.json", tmp_path / "contracts" / "test" / ".solhint.json")
    (tmp_path / "contracts" / "Canary.sol").write_text(CANARY)
    (tmp_path / "contracts" / "test" / "Canary.sol").write_text(CANARY)
    rc, findings = _solhint("contracts/**/*.sol", cwd=tmp_path)
    got = {(Path(f["filePath"]).parent.name, f["ruleId"], f["severity"]) for f in findings}
    for where in ("contracts", "test"):
        assert (where, "avoid-tx-origin", "Error") in got, _fmt(findings)
        assert (where, "gas-custom-errors", "Error") in got, _fmt(findings)
        assert (where, "use-natspec", "Warning") in got, _fmt(findings)
    assert ("contracts", "no-inline-assembly", "Error") in got, _fmt(findings)
    assert ("test", "no-inline-assembly", "Error") not in got, _fmt(findings)
    assert rc != 0
