"""End to end on a real JSON-RPC node (anvil) with the trainer and the auditor as separate OS
processes (`python -m protocol.agents_cli trainer|auditor`), orchestrated by `protocol.multiproc`:
the auditor reads the trainer's artifacts only over HTTP, and the orchestrator moves the node's
clock only when both agents report they are waiting.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import nodes
from protocol.agents_cli import CHEAT_NAMES, auditor_cmd, caching_reader, client, trainer_cmd
from protocol.cheats import CHEATS
from protocol.multiproc import ProcessDemo
from vtrain.training.spec import TrainSpec


class Narration(list):
    def __call__(self, line: str) -> None:
        self.append(line)
        print(line)


@pytest.fixture(scope="module")
def anvil_url():
    with nodes.start_anvil() as node:
        yield node.url


@pytest.fixture(scope="module")
def demo(anvil_url: str, tmp_path_factory: pytest.TempPathFactory) -> ProcessDemo:
    return ProcessDemo.setup(anvil_url, tmp_path_factory.mktemp("multiproc"), Narration())


def _cross_check(sc, gid: int) -> None:
    """The agents' own move/gas accounting (final JSON lines) agrees with the chain's."""
    assert sc.agent_cost(gid) == sc.game_cost(gid)


@pytest.mark.node
def test_cheating_trainer_loses_to_auditor_process(demo: ProcessDemo) -> None:
    say = Narration()
    sc = demo.scenario("cheating trainer", "poison-sample", False, say, timeout=150)
    res = sc.run()
    assert (res.verdict, res.ruling, res.final_status) == ("challenger won", "adjudicated", "fraudulent")
    (gid,) = sc.games()
    assert res.moves > 10 and res.gas > 0
    _cross_check(sc, gid)
    trainer, auditor = sc.current("trainer").result, sc.current("auditor").result
    assert trainer["ok"] and trainer["status"] == "fraudulent" and trainer["posted"] == 2
    terms = sc.terms
    # its bond back + the bounty (half the stake; the rest is burned)
    assert auditor["ok"] and auditor["withdrawn"] == terms.challenger_bond + terms.trainer_stake // 2
    assert auditor["games"][str(gid)]["outcome"] == "challenger won"
    # the auditor only ever had the trainer's URL, never its folder
    store = str(demo.work / f"store-{sc.job}")
    assert any(store in a for a in sc.current("trainer").argv)
    assert not any(store in a for a in sc.current("auditor").argv)
    assert sc.advances == []  # nobody timed out: the node's clock was never moved
    assert "auditor +1.00" in res.bonds and "trainer -2.00" in res.bonds


@pytest.mark.node
@pytest.mark.slow
@pytest.mark.parametrize("role", ["auditor", "trainer"])
def test_agent_killed_mid_game_and_restarted(demo: ProcessDemo, role: str) -> None:
    """Kill one agent (SIGKILL) in the middle of the bisection, start it again with the same
    arguments: it reads everything back (chain, store; the auditor replays from the initial state)
    and the game ends as it would have, in time (no chess clock runs out)."""
    say = Narration()
    sc = demo.scenario(f"{role} restart", "abuse-log", False, say, timeout=240)
    sc.create_job()
    try:
        sc.start("trainer")
        sc.start("auditor")
        sc.wait_until(lambda: bool(sc.games()) and sc.game_cost(sc.games()[0])[0] >= 6, timeout=150)
        (gid,) = sc.games()
        first = sc.current(role)
        sc.kill(role)
        assert sc.view(gid).status == 1  # still in progress, mid-descent
        moves_at_kill = sc.game_cost(gid)[0]
        assert first.result is None  # killed: no final line
        sc.start(role)
        res = sc.finish()
    finally:
        sc.close()
    assert (res.verdict, res.ruling, res.final_status) == ("challenger won", "adjudicated", "fraudulent")
    assert res.moves > moves_at_kill
    assert sc.advances == []  # the restarted agent moved in time: no chess clock ran out
    second = sc.current(role)
    assert second is not first and second.result["ok"]
    assert list(second.result["games"]) in ([str(gid)], [])  # resumed its game, opened no other
    if role == "auditor":
        assert list(second.result["games"]) == [str(gid)]
    assert any("restarted" in line for line in say)


@pytest.mark.node
@pytest.mark.slow
def test_trainer_gone_for_good_loses_on_time(demo: ProcessDemo) -> None:
    """A trainer that stops answering mid-game: once the auditor waits too, the orchestrator moves
    the node's clock past the trainer's deadline and the auditor claims the timeout."""
    say = Narration()
    sc = demo.scenario("trainer gone", "poison-sample", False, say, timeout=180)
    sc.create_job()
    try:
        sc.start("trainer")
        sc.start("auditor")
        sc.wait_until(lambda: bool(sc.games()) and sc.game_cost(sc.games()[0])[0] >= 4, timeout=150)
        sc.kill("trainer", abandon=True)
        res = sc.finish()
    finally:
        sc.close()
    assert (res.verdict, res.ruling, res.final_status) == ("challenger won", "timeout", "fraudulent")
    assert [why for why, _ in sc.advances] == ["the trainer's chess clock runs out"]
    assert sc.current("auditor").result["withdrawn"] == sc.terms.challenger_bond + sc.terms.trainer_stake // 2


@pytest.mark.node
@pytest.mark.slow
def test_cheater_that_cannot_open_loses_on_time(demo: ProcessDemo) -> None:
    """tamper-weight: the trainer's opening reverts (InvalidProof). It must not resend it on every
    pass (each retry is a mined, failed transaction, so it would never look idle and its clock
    would never run out): it sends it once, waits, and loses on time."""
    sc = demo.scenario("cheater stuck", "tamper-weight", False, Narration(), timeout=180)
    res = sc.run()
    assert (res.verdict, res.ruling, res.final_status) == ("challenger won", "timeout", "fraudulent")
    assert [why for why, _ in sc.advances] == ["the trainer's chess clock runs out"]
    assert sc.current("trainer").log_path.read_text().count("not sending it again") == 1


@pytest.mark.node
def test_agent_commands_report_clear_errors(demo: ProcessDemo, tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--rpc", demo.rpc, "--deployment", str(demo.deployment_path), "--spec", str(demo.spec_path)]

    # the client creates a job from the command line
    r = runner.invoke(client, ["create-job", *base, "--challenge-window", "600", "--clock", "300", "--payment", "1eth"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    job = out["job"]
    assert out["payment"] == 10**18 and out["challenge_window"] == 600

    trainer = ["--store", str(tmp_path / "store"), "--timeout", "5"]
    # a job id that does not exist
    r = runner.invoke(trainer_cmd, [*base, "--job", "999", *trainer])
    assert r.exit_code == 1 and "job 999 does not exist" in r.output
    # not the job's trainer
    r = runner.invoke(trainer_cmd, [*base, "--job", str(job), "--account-index", "5", *trainer])
    assert r.exit_code == 1 and "is not the trainer of job" in r.output
    # a spec that does not match the job
    other = tmp_path / "other.json"
    other.write_text(TrainSpec(model="mlp", batch_size=16, steps=12, interval=4).to_json())
    args = ["--rpc", demo.rpc, "--deployment", str(demo.deployment_path), "--spec", str(other)]
    r = runner.invoke(auditor_cmd, [*args, "--job", str(job), "--store-url", "http://127.0.0.1:9"])
    assert r.exit_code == 1 and "does not match the spec" in r.output and "specHash" in r.output
    # a deployment whose addresses hold no contract, or other contracts
    d = json.loads(demo.deployment_path.read_text())
    for patch, msg in (({"registry": "0x" + "11" * 20}, "no contract at"),
                       ({"registry": d["game"], "game": d["registry"]}, "is not the JobRegistry this vtrain builds"),
                       ({"chain_id": 1}, "chain id")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**d, **patch}))
        r = runner.invoke(trainer_cmd, ["--rpc", demo.rpc, "--deployment", str(bad), "--spec", str(demo.spec_path),
                                        "--job", str(job), *trainer])
        assert r.exit_code == 1 and msg in r.output, (patch, r.output)


def test_dead_rpc_endpoint_is_a_clear_error(tmp_path: Path) -> None:
    spec, dep, url = nodes.dead_endpoint_files(tmp_path)
    runner = CliRunner()
    r = runner.invoke(trainer_cmd, ["--rpc", url, "--rpc-retries", "0", "--deployment", str(dep), "--spec", str(spec),
                                    "--job", "1", "--store", str(tmp_path / "s")])
    assert r.exit_code == 1 and f"cannot use the JSON-RPC node at {url}" in r.output and "unreachable" in r.output
    r = runner.invoke(auditor_cmd, ["--rpc", "localhost:8545", "--deployment", str(dep), "--spec", str(spec),
                                    "--job", "1", "--store-url", "http://127.0.0.1:1"])
    assert r.exit_code == 1 and "expected an http(s):// URL" in r.output
    spec.write_text("{not json")
    r = runner.invoke(auditor_cmd, ["--rpc", url, "--deployment", str(dep), "--spec", str(spec),
                                    "--job", "1", "--store-url", "http://127.0.0.1:1"])
    assert r.exit_code == 1 and "spec file" in r.output


def test_auditor_keeps_what_it_read_when_the_store_goes_away(tmp_path: Path) -> None:
    from protocol.store import ArtifactStore, ArtifactUnavailable, HttpArtifactReader, serve_store

    store = ArtifactStore(tmp_path / "store")
    store.put_log(7, 3, b"rounding log of step 3")
    server, url = serve_store(tmp_path / "store")
    reader = caching_reader(HttpArtifactReader(url, retries=0, timeout=2))
    try:
        assert reader.get_log(7, 3) == b"rounding log of step 3"
    finally:
        server.shutdown()
        server.server_close()
    assert reader.get_log(7, 3) == b"rounding log of step 3"  # from memory, verified again
    with pytest.raises(ArtifactUnavailable):
        reader.get_log(7, 4)


def test_cheat_names_match_the_cheats() -> None:
    assert sorted(CHEAT_NAMES) == sorted(CHEATS)
