"""The client's commands on a real node: a job whose trainer stops posting is reclaimed (payment
plus the trainer's stake, withdrawn), and not a second earlier than its posting deadline."""

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
    assert out["reclaimed"] == 3 * 10**18 and out["withdrawn"] == 3 * 10**18, out
    gained = anvil_w3.eth.get_balance(client) - before
    assert 3 * 10**18 - 10**16 < gained <= 3 * 10**18  # payment + stake, less gas
    assert int(chain.call(proto.registry.functions.owed(client))) == 0

    again = last_json(run("client", "withdraw", *common, "--account-index", "6"))
    assert again == {"account": client, "withdrawn": 0}
    twice = run("client", "reclaim-job", *common, "--job", str(job), "--account-index", "6")
    assert twice.exit_code == 1 and f"job {job} cannot be reclaimed" in twice.output, twice.output


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
    job = last_json(run("client", "create-job", *common, "--spec", str(spec), "--account-index", "6",
                        "--trainer-index", "7", "--payment", "1eth"))["job"]

    st = run("client", "status", *common, "--job", str(job))
    assert st.exit_code == 0 and f"job {job}: Open" in st.output and "payment 1 ETH" in st.output, st.output
    as_json = last_json(run("client", "status", *common, "--job", str(job), "--json"))
    assert as_json["status"] == "Open" and as_json["games"] == [] and as_json["payment"] == 10**18

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
