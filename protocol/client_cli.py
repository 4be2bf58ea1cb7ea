"""The client's view of a job: ``vtrain client status``, ``watch``, ``cancel-job``, and ``vtrain report``.

All of it is read from the chain's events and transactions (:mod:`protocol.jobview`); nothing is
taken from the trainer. ``watch`` prints each new move as it lands and stops when the job is over.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from protocol.agents_cli import Out, clean_errors, client_refund, connect, key_option, rpc_options

#: Job statuses after which nothing more can happen to a job (but withdrawals).
DONE = ("Cancelled", "Finalized", "Fraudulent")


def _job_option(f):
    return click.option("--job", "job_id", type=click.IntRange(min=1), required=True, help="The job id.")(f)


@click.command("status")
@rpc_options
@_job_option
@click.option("--json", "as_json", is_flag=True, help="Print the whole record as one JSON object.")
@clean_errors
def status_cmd(rpc: str, deployment_path: Path, rpc_retries: int, rpc_deadline: float, job_id: int,
               as_json: bool) -> None:
    """Show JOB: status, terms, intervals and their windows, games with their moves and gas, credits."""
    from protocol.jobview import describe, describe_move, read_job

    _, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    j = read_job(proto, job_id)
    if as_json:
        click.echo(json.dumps(j.to_json(), sort_keys=True))
        return
    for line in describe(j):
        click.echo(line)
    for g in j.games:
        click.echo(f"game {g.game}:")
        for m in g.moves:
            click.echo(f"  {describe_move(m)}")


@click.command("watch")
@rpc_options
@_job_option
@click.option("--poll", type=click.FloatRange(0.05, 600), default=2.0, show_default=True,
              help="Seconds between looks at the chain.")
@click.option("--timeout", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Stop after this many seconds (0: when the job is over); exit status 3 on timeout.")
@clean_errors
def watch_cmd(rpc: str, deployment_path: Path, rpc_retries: int, rpc_deadline: float, job_id: int, poll: float,
              timeout: float) -> None:
    """Follow JOB: print each interval, game and move as it lands; stop when the job is over
    (Cancelled, Finalized, or Fraudulent with no open game)."""
    from protocol.jobview import describe_move, read_job

    _, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    seen: set[tuple[str, str]] = set()
    t0 = time.monotonic()
    status = ""
    while True:
        j = read_job(proto, job_id)
        if j.status != status:
            status = j.status
            click.echo(f"job {job_id}: {status}")
        for e in j.timeline:
            key = (e.tx, e.name)
            if key not in seen and e.name not in ("BondLocked", "GameSettled"):
                seen.add(key)
                shown = {k: v for k, v in e.args.items() if k not in ("job", "params")}
                click.echo(f"  {e.name} {json.dumps(shown, sort_keys=True)}")
        for g in j.games:
            for m in g.moves:
                if (m.tx, f"game{g.game}") not in seen:
                    seen.add((m.tx, f"game{g.game}"))
                    click.echo(f"  game {g.game}: {describe_move(m)}")
        if j.status in DONE and all(g.status != "InProgress" for g in j.games):
            return
        if timeout and time.monotonic() - t0 > timeout:
            raise SystemExit(3)
        time.sleep(poll)


@click.command("cancel-job")
@rpc_options
@key_option
@_job_option
@click.option("--account-index", type=int, default=1, show_default=True, help="The client's unlocked account.")
@clean_errors
def cancel_job_cmd(rpc: str, deployment_path: Path, rpc_retries: int, rpc_deadline: float, key_file: Path | None,
                   job_id: int, account_index: int) -> None:
    """Cancel JOB, which its trainer did not accept by its accept deadline (createdAt +
    acceptPeriod; before it the offer is firm and this says until when): the payment is credited
    back and withdrawn. Prints {"job": ID, "refund": WEI, "withdrawn": WEI}."""
    me, refund, withdrawn = client_refund(
        rpc, deployment_path, rpc_retries, rpc_deadline, key_file, account_index, job_id,
        "cancelJob", "JobCancelled", "cancelled",
    )
    Out.make("client", job_id, False).say(f"cancelled job {job_id}: {refund / 1e18:g} ETH refunded and withdrawn")
    Out._line({"job": job_id, "client": me, "refund": refund, "withdrawn": withdrawn})


@click.command("report")
@rpc_options
@_job_option
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="HTML file to write. [default: job-<JOB>.html]")
@clean_errors
def report_cmd(rpc: str, deployment_path: Path, rpc_retries: int, rpc_deadline: float, job_id: int,
               out: Path | None) -> None:
    """Write one static HTML page for JOB: its timeline and each game's bisection path (level, range,
    who moved, gas) down to the ruled element, with the element's inputs and its log entry."""
    from protocol.report import render_report
    from vtrain.training.rundir import atomic_write

    _, proto = connect(rpc, deployment_path, rpc_retries, rpc_deadline)
    out = out or Path(f"job-{job_id}.html")
    html = render_report(proto, job_id)
    atomic_write(out, html.encode("utf-8"))
    click.echo(str(out))


CLIENT_COMMANDS: tuple[Any, ...] = (status_cmd, watch_cmd, cancel_job_cmd)
"""Added to the ``vtrain client`` group (protocol/cli.py)."""
