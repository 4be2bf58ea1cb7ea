"""The client's commands on a real node: a job whose trainer stops posting is reclaimed (payment
plus the bounty, half the trainer's stake; the rest is burned), and not a second earlier than its
posting deadline. create-job refuses terms below the registry's floors and specs the chain cannot
rule on; the trainer and the auditor refuse terms they cannot answer within."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from protocol.cli import main
from vtrain.training.spec import TrainSpec

pytestmark = pytest.mark.node


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def last_json(r: Result) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_client_reclaims_a_job_whose_trainer_stops_posting(tmp_path: Path, anvil_w3) -> None:
    from protocol.agents_cli import save_deployment
    from protocol.chain import Chain
    from protocol.deploy import deploy

    url = anvil_w3.provider.endpoint_uri
    chain = Chain.connect(url)
    accts = chain.accounts()
    proto = deploy(chain, accts[0])
    dep = tmp_path / "dep.json"
    save_deployment(proto, dep)
    spec = tmp_path / "spec.json"
    spec.write_text(TrainSpec(steps=8, interval=4).to_json())
    common = ["--rpc", url, "--deployment", str(dep)]

    created = last_json(
        run("client", "create-job", *common, "--spec", str(spec), "--posting-period", "600", "--account-index", "6",
            "--trainer-index", "7", "--payment", "1eth", "--trainer-stake", "2eth")
    )
    job, client, trainer = created["job"], created["client"], created["trainer"]
    assert created["posting_period"] == 600
    chain.send(proto.registry.functions.acceptJob(job), trainer, value=2 * 10**18, what="acceptJob")

    # Not overdue yet: a clean error naming the job, nothing credited.
    early = run("client", "reclaim-job", *common, "--job", str(job), "--account-index", "6")
    assert early.exit_code == 1 and "Traceback" not in early.output, early.output
    assert f"job {job} cannot be reclaimed" in early.output and "PostingNotOverdue" in early.output, early.output
    assert int(chain.call(proto.registry.functions.owed(client))) == 0

    chain.advance_time(601)  # interval 0 was due 600 s after acceptance
    before = anvil_w3.eth.get_balance(client)
    out = last_json(run("client", "reclaim-job", *common, "--job", str(job), "--account-index", "6"))
    assert out["reclaimed"] == 2 * 10**18 and out["withdrawn"] == 2 * 10**18, out  # payment + bounty
    gained = anvil_w3.eth.get_balance(client) - before
    assert 2 * 10**18 - 10**16 < gained <= 2 * 10**18  # payment + half the stake, less gas
    assert int(chain.call(proto.registry.functions.owed(client))) == 0

    again = last_json(run("client", "withdraw", *common, "--account-index", "6"))
    assert again == {"account": client, "withdrawn": 0}
    twice = run("client", "reclaim-job", *common, "--job", str(job), "--account-index", "6")
    assert twice.exit_code == 1 and f"job {job} cannot be reclaimed" in twice.output, twice.output


@pytest.fixture
def node(tmp_path: Path, anvil_w3):
    """The protocol deployed (development floors) on the session's anvil; common CLI arguments."""
    from protocol.agents_cli import save_deployment
    from protocol.chain import Chain
    from protocol.deploy import deploy

    url = anvil_w3.provider.endpoint_uri
    chain = Chain.connect(url)
    proto = deploy(chain, chain.accounts()[0])
    dep = tmp_path / "dep.json"
    save_deployment(proto, dep)
    return chain, proto, ["--rpc", url, "--deployment", str(dep)]


def _spec(tmp_path: Path, **kw) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(TrainSpec(steps=8, interval=4, **kw).to_json())
    return spec


def test_create_job_refuses_a_spec_the_chain_cannot_rule_on_and_sends_nothing(tmp_path: Path, node) -> None:
    chain, proto, common = node
    before = int(chain.call(proto.registry.functions.jobCount()))
    r = run("client", "create-job", *common, "--spec", str(_spec(tmp_path, batch_size=70_000)))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "the chain cannot rule on this job: op " in r.output and "65,536" in r.output, r.output
    assert "nothing was sent" in r.output
    assert int(chain.call(proto.registry.functions.jobCount())) == before


def test_create_job_refuses_a_term_below_the_registrys_floor(tmp_path: Path, node) -> None:
    chain, proto, common = node
    before = int(chain.call(proto.registry.functions.jobCount()))
    r = run("client", "create-job", *common, "--spec", str(_spec(tmp_path)), "--clock", "1")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "--clock 1 is below the floor of the registry" in r.output and "(60)" in r.output, r.output
    assert int(chain.call(proto.registry.functions.jobCount())) == before
    r = run("client", "create-job", *common, "--spec", str(_spec(tmp_path)), "--accept-period", "86400000")
    assert r.exit_code == 1 and "--accept-period 86400000 is not in 1..31536000 (365 days" in r.output, r.output
    assert int(chain.call(proto.registry.functions.jobCount())) == before


def test_trainer_and_auditor_refuse_terms_they_cannot_answer_within(tmp_path: Path, node) -> None:
    """A 120 s clock and a 900 s window pass the registry's floors, but this trainer needs 15 s a
    move (2 x ~20 moves x 15 s) and this auditor 600 s to replay (2 x 600 s): both decline, say why,
    send nothing and exit 4. With what they need set lower (--move-seconds), the trainer accepts."""
    chain, proto, common = node
    spec = _spec(tmp_path)
    created = last_json(run("client", "create-job", *common, "--spec", str(spec), "--clock", "120",
                            "--challenge-window", "900"))
    job = str(created["job"])
    r = run("trainer", *common, "--job", job, "--spec", str(spec), "--store", str(tmp_path / "store"))
    assert r.exit_code == 4 and "Traceback" not in r.output, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ok"] is False and res["status"] == "refused"
    assert any(x.startswith("clock 120 s is shorter than this trainer needs") for x in res["refused"]), res
    a = run("auditor", *common, "--job", job, "--spec", str(spec), "--store-url", "http://127.0.0.1:9/")
    assert a.exit_code == 4 and "Traceback" not in a.output, a.output
    refused = json.loads(a.stdout.strip().splitlines()[-1])["refused"]
    assert any("challenge window 900 s is shorter than this auditor needs" in x for x in refused), refused
    assert int(chain.call(proto.registry.functions.jobStatus(int(job)))) == 1  # still open: nothing sent
    ok = run("trainer", *common, "--job", job, "--spec", str(spec), "--store", str(tmp_path / "store"),
             "--move-seconds", "1", "--timeout", "5")
    # took the job (pre-training its 8 steps first), then gave up at --timeout (1 s was too short for the
    # pre-training on a loaded machine: the agent timed out before it accepted)
    assert ok.exit_code == 3, ok.output
    assert int(chain.call(proto.registry.functions.jobStatus(int(job)))) == 2


def test_vtrain_deploy_uses_the_production_floors_unless_told_dev_floors(tmp_path: Path, anvil_w3) -> None:
    from protocol.chain import Chain, Deployment
    from protocol.deploy import DEV_FLOORS, PRODUCTION_FLOORS, Floors, Protocol

    url = anvil_w3.provider.endpoint_uri
    chain = Chain.connect(url)
    for flag, want in (([], PRODUCTION_FLOORS), (["--dev-floors"], DEV_FLOORS)):
        out = tmp_path / f"dep{len(flag)}.json"
        r = run("deploy", "--rpc", url, "--out", str(out), *flag)
        assert r.exit_code == 0, r.output
        proto = Protocol.attach(chain, Deployment.load(out))
        assert Floors.of(proto.registry, chain.call) == want
    # create-job's default terms (1 h window) are below the production floor: refused, named, unsent
    r = run("client", "create-job", "--rpc", url, "--deployment", str(tmp_path / "dep0.json"),
            "--spec", str(_spec(tmp_path)))
    assert r.exit_code == 1 and "--challenge-window 3600 is below the floor" in r.output, r.output
    assert "(86400)" in r.output and "nothing was sent" in r.output


def test_client_status_cancel_and_watch_of_a_job_never_accepted(tmp_path: Path, anvil_w3) -> None:
    """A job nobody accepted: status shows it Open with its terms, cancel-job gives the payment back,
    watch returns at once (the job is over), and a reclaim says in words why it cannot."""
    from protocol.agents_cli import save_deployment
    from protocol.chain import Chain
    from protocol.deploy import deploy

    url = anvil_w3.provider.endpoint_uri
    chain = Chain.connect(url)
    proto = deploy(chain, chain.accounts()[0])
    dep = tmp_path / "dep.json"
    save_deployment(proto, dep)
    spec = tmp_path / "spec.json"
    spec.write_text(TrainSpec(steps=8, interval=4).to_json())
    common = ["--rpc", url, "--deployment", str(dep)]
    created = last_json(run("client", "create-job", *common, "--spec", str(spec), "--account-index", "6",
                            "--trainer-index", "7", "--payment", "1eth", "--accept-period", "60"))
    job = created["job"]
    assert created["accept_period"] == 60 and created["accept_deadline"] == chain.now() + 60, created

    st = run("client", "status", *common, "--job", str(job))
    assert st.exit_code == 0 and f"job {job}: Open" in st.output and "payment 1 ETH" in st.output, st.output
    as_json = last_json(run("client", "status", *common, "--job", str(job), "--json"))
    assert as_json["status"] == "Open" and as_json["games"] == [] and as_json["payment"] == 10**18

    # the offer is firm for its accept period: a cancel before its end says until when, sends nothing
    early = run("client", "cancel-job", *common, "--job", str(job), "--account-index", "6")
    assert early.exit_code == 1 and f"job {job} cannot be cancelled: " in early.output, early.output
    assert f"job {job}'s offer is firm until" in early.output and " s from now)" in early.output, early.output
    assert "CancelTooEarly" in early.output and "Traceback" not in early.output, early.output
    chain.advance_time(61)
    cancelled = last_json(run("client", "cancel-job", *common, "--job", str(job), "--account-index", "6"))
    assert cancelled["refund"] == 10**18 and cancelled["withdrawn"] == 10**18, cancelled
    assert last_json(run("client", "status", *common, "--job", str(job), "--json"))["status"] == "Cancelled"

    w = run("client", "watch", *common, "--job", str(job), "--poll", "0.1", "--timeout", "30")
    assert w.exit_code == 0 and "JobCreated" in w.output and "JobCancelled" in w.output, w.output

    again = run("client", "reclaim-job", *common, "--job", str(job), "--account-index", "6")
    assert again.exit_code == 1 and f"job {job} is Cancelled; reclaimJob needs Active" in again.output, again.output
    twice = run("client", "cancel-job", *common, "--job", str(job), "--account-index", "6")
    assert twice.exit_code == 1 and f"job {job} is Cancelled; cancelJob needs Open" in twice.output, twice.output
    missing = run("client", "status", *common, "--job", "99")
    assert missing.exit_code == 1 and "job 99 does not exist" in missing.output and "Traceback" not in missing.output
