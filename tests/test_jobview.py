"""A job read back from the chain (protocol/jobview.py), its HTML page (protocol/report.py), and
reverts said in words (protocol/reverts.py): on the demo's cheating job, played on the embedded chain
with the real agents and the real Adjudicator."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from protocol.reverts import ENUMS, explain

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cheating_job(demo_world):
    from protocol.demo import default_spec, run_scenario
    from protocol.jobs import Terms

    proto, store, accounts = demo_world
    r = run_scenario(proto, default_spec("mlp"), Terms(), store, accounts, "cheating trainer", "abuse-log", False,
                     lambda _msg: None)
    return proto, accounts, r


def test_enum_names_mirror_the_contracts_declarations() -> None:
    src = (REPO / "contracts/lib/GameTypes.sol").read_text()
    declared = {m[1]: tuple(x.strip() for x in m[2].split(",") if x.strip())
                for m in re.finditer(r"enum (\w+) \{([^}]*)\}", src) for m in [(None, m[1], m[2])]}
    assert declared == ENUMS


def test_every_custom_error_of_the_contracts_is_said_in_words() -> None:
    from protocol.build import compile_contracts

    errors = {}
    for art in compile_contracts().values():
        for item in art.abi:
            if item.get("type") == "error":
                errors[item["name"]] = item["inputs"]
    assert len(errors) > 30
    for name, inputs in errors.items():
        args = tuple(0 if not i["type"].startswith(("bytes", "string", "address")) else
                     ("0x" + "00" * 20 if i["type"] == "address" else b"" if i["type"] != "string" else "x")
                     for i in inputs)
        words = explain("someCall", name, args, inputs)
        assert words and "Traceback" not in words, name


def test_a_wrong_status_revert_reads_as_a_sentence(cheating_job) -> None:
    from protocol.chain import Reverted

    proto, accounts, r = cheating_job
    with pytest.raises(Reverted) as e:
        proto.chain.send(proto.registry.functions.cancelJob(r.job), accounts["client"], what=f"cancelJob({r.job})")
    assert f"job {r.job} is Fraudulent; cancelJob needs Open" in str(e.value)
    assert e.value.error == "WrongJobStatus"  # the decoded error stays available to code


def test_the_job_record_holds_every_move_of_the_game_with_its_gas(cheating_job) -> None:
    from protocol.jobview import read_job

    proto, accounts, r = cheating_job
    j = read_job(proto, r.job)
    assert j.status == "Fraudulent" and j.trainer == accounts["trainer"] and j.client == accounts["client"]
    assert [iv.index for iv in j.intervals] == [0, 1]
    (g,) = j.games
    assert (g.winner, g.ruling, g.interval) == ("Challenger", "Adjudicated", 1)
    assert len(g.moves) == r.moves and g.gas == r.gas  # the agents' own count of moves and gas
    assert {m.role for m in g.moves} == {"trainer", "challenger"}
    assert g.moves[-1].function == "oneStep"
    names = [e.name for e in j.timeline]
    assert names[:2] == ["JobCreated", "JobAccepted"] and "JobFraudulent" in names
    as_json = j.to_json()
    assert as_json["games"][0]["moves"][0]["gas"] == g.moves[0].gas


def test_the_report_shows_the_bisection_path_down_to_the_ruled_element(cheating_job, tmp_path: Path) -> None:
    from protocol.report import render_report

    proto, _, r = cheating_job
    page = render_report(proto, r.job)
    assert "<script" not in page and "http" not in page.split("</style>", 1)[1]  # static, self-contained
    assert page.count("<tr><td class='num'>") >= r.moves
    for must in ("Disputed step", "Disputed op", "Disputed element", "Inputs read", "Log entries around the element",
                 "Challenger won by Adjudicated"):
        assert must in page, must
    out = tmp_path / f"job-{r.job}.html"
    out.write_text(page)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("VTRAIN_SKIP_BROWSER"):
            pytest.skip("chromium could not be installed on this machine (.ci/run said so)")
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium here: `apt-get install chromium` to screenshot the page")
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
         "--window-size=1200,2400", out.as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a rendered page, not a blank one
    kept = Path(os.environ.get("VTRAIN_TEST_OUTPUT", REPO / "build" / "test-output"))
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, kept / "report.png")
    print(f"report screenshot: {kept / 'report.png'}")


def test_agents_never_move_the_chains_clock() -> None:
    """Only the demo (on a dev chain) moves time; the agents wait in real time on a real node."""
    for name in ("trainer.py", "auditor.py", "agent.py", "agents_cli.py", "game.py", "client_cli.py"):
        src = (REPO / "protocol" / name).read_text()
        assert "advance_time" not in src and "evm_increaseTime" not in src, name


def test_the_production_trainer_offers_no_cheats() -> None:
    """`vtrain trainer` has no --cheat; only the demo's and the tests' agent processes do."""
    from click.testing import CliRunner

    from protocol.agents_cli import agents_main
    from protocol.cli import main

    prod = CliRunner().invoke(main, ["trainer", "--help"])
    demo = CliRunner().invoke(agents_main, ["trainer", "--help"])
    assert prod.exit_code == 0 and demo.exit_code == 0
    assert "--cheat" not in prod.output and "--cheat" in demo.output
    refused = CliRunner().invoke(main, ["trainer", "--cheat", "tamper-weight"])
    assert refused.exit_code == 2 and "No such option '--cheat'" in refused.output


def test_a_move_sent_through_another_contract_is_not_decoded_as_a_game_call(cheating_job, monkeypatch) -> None:
    """A party moving through its own contract (a wallet or a proxy whose function has the signature of
    a game function, forwarding other arguments) sends that contract's calldata: the report must not
    show it as the move's arguments. Before, any transaction's input was decoded with the game's ABI."""
    from protocol import jobview

    proto, _, r = cheating_job
    real = proto.chain.w3.eth.get_transaction
    proxy = "0x" + "ab" * 20

    def through_proxy(tx):  # as if each move had been forwarded by a look-alike contract at `proxy`
        return {**dict(real(tx)), "to": proxy}

    monkeypatch.setattr(proto.chain.w3.eth, "get_transaction", through_proxy)
    (g,) = jobview.read_job(proto, r.job).games
    assert all(m.args == {} for m in g.moves)
    assert g.moves[-1].function == "GameResolved" and "oneStep" not in {m.function for m in g.moves}
