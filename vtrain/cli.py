"""``vtrain train`` and ``vtrain replay``: chain-free commands over a local run folder."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from vtrain.errors import VtrainError
from vtrain.graph.executor import state_tensors
from vtrain.models.nn import GPTConfig, MLPConfig
from vtrain.models.optim import AdamWConfig, SGDConfig
from vtrain.numerics.rounding import Mode
from vtrain.training.loop import initial_commitment, replay_steps, train_steps
from vtrain.training.rundir import RunDir, reset_roots
from vtrain.training.spec import TrainSpec, build_job

console = Console(stderr=True)
log = logging.getLogger(__name__)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )


def spec_from_options(
    model: str,
    optimizer: str,
    steps: int,
    interval: int,
    batch_size: int,
    seed: int,
    mode: str,
    lr: float | None,
    text: Path | None,
    layers: int,
    width: int,
    heads: int,
    context: int,
    hidden: str,
    model_arg: tuple[str, ...] = (),
    checkpoint: str | None = None,
) -> TrainSpec:
    opt: SGDConfig | AdamWConfig
    if optimizer == "sgd":
        opt = SGDConfig(lr=lr) if lr is not None else SGDConfig()
    else:
        opt = AdamWConfig(lr=lr) if lr is not None else AdamWConfig()
    vocab = 32
    if text is not None:
        try:
            vocab = max(vocab, len(set(Path(text).read_text(encoding="utf-8"))))
        except UnicodeDecodeError as e:
            raise click.BadParameter(f"{text}: not UTF-8 text ({e.reason} at byte {e.start})",
                                     param_hint="--text") from None
        except OSError as e:
            raise click.BadParameter(f"cannot read {text}: {e.strerror or e}", param_hint="--text") from None
    try:
        hid = tuple(int(h) for h in hidden.split(",") if h)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {hidden!r}", param_hint="--hidden") from None
    return TrainSpec(
        model=model,
        optimizer=opt,
        steps=steps,
        interval=interval,
        batch_size=batch_size,
        seed=seed,
        mode=mode,
        text_path=str(text) if text else None,
        model_args=_model_args(model_arg),
        checkpoint=checkpoint,
        mlp=MLPConfig(hidden=hid),
        gpt=GPTConfig(vocab=vocab, context=context, n_layer=layers, n_head=heads, d_model=width),
    )


def _model_option(value: str) -> str:
    """``--model``: 'mlp', 'gpt' or FILE.py:FACTORY (the file's existence is checked when the job is built)."""
    if value in ("mlp", "gpt"):
        return value
    from vtrain.frontend.job import parse_model_ref

    try:
        parse_model_ref(value)
    except VtrainError as e:
        raise click.BadParameter(f"{value!r}: {str(e).removeprefix('spec: model: ')}", param_hint="--model") from None
    return value


def _model_args(pairs: tuple[str, ...]) -> dict:
    """``KEY=VALUE`` options as factory keyword arguments (VALUE as JSON when it parses, else a string)."""
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"expected KEY=VALUE, got {p!r}", param_hint="--model-arg")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@click.command("train")
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Run folder to create.")
@click.option("--model", default="mlp", show_default=True, callback=lambda c, p, v: _model_option(v),
              help="'mlp', 'gpt', or a torch model: FILE.py:FACTORY (returning a vtrain.frontend.TorchTask).")
@click.option("--model-arg", "model_arg", multiple=True, metavar="KEY=VALUE",
              help="FILE.py:FACTORY: a keyword argument of the factory (VALUE parsed as JSON, else a string).")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False), default=None,
              help="FILE.py:FACTORY: start from these weights (safetensors or a state_dict .pt).")
@click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default="sgd", show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True)
@click.option(
    "--interval", type=click.IntRange(min=1), default=4, show_default=True, help="Steps per committed interval (K)."
)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--mode", type=click.Choice([m.value for m in Mode]), default="certified", show_default=True)
@click.option("--lr", type=float, default=None, help="Learning rate (default: the optimizer's).")
@click.option(
    "--text",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="gpt: train on this text file.",
)
@click.option("--layers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--width", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--heads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--context", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--hidden", default="32", show_default=True, help="mlp: hidden sizes, comma-separated.")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the whole spec from a file (JSON, or TOML if named *.toml) instead of the options.",
)
def train_cmd(out: Path, spec_path: Path | None, **opts) -> None:
    """Train with controlled numerics and write spec, roots, logs and checkpoints to OUT."""
    try:
        spec = TrainSpec.from_file(spec_path) if spec_path else spec_from_options(**opts)
        run = RunDir(out)
        if out.exists() and not out.is_dir():
            raise click.ClickException(f"--out {out}: exists and is not a folder")
        if (out / "roots.jsonl").exists():
            raise click.ClickException(f"{out} already holds a run; choose another --out")
        job = build_job(spec)
        run.write_spec(spec)
        reset_roots(run)
        state = state_tensors(job.initial_state)
        run.write_checkpoint(0, job.graph, state)
        _, root0 = initial_commitment(job)
        t0 = time.perf_counter()
        log_bytes = 0
        with _progress() as prog:
            task = prog.add_task(f"training {spec.model} ({spec.mode})", total=spec.steps)
            for o in train_steps(job, state, 1, spec.steps):
                if spec.mode in (Mode.CERTIFIED.value, Mode.PAPER.value):
                    log_bytes += run.write_log(o.step, o.log, job.graph)
                run.append_roots(o.step, o.loss, o.state_root, o.log_root)
                if o.step % spec.interval == 0 or o.step == spec.steps:
                    run.write_checkpoint(o.step, job.graph, o.state)
                prog.update(task, advance=1, description=f"training {spec.model} ({spec.mode}) loss {o.loss:.4f}")
                last = o
        dt = time.perf_counter() - t0
        summary = {
            "run": str(out),
            "steps": spec.steps,
            "ops_per_step": job.graph.n_ops,
            "seconds": round(dt, 3),
            "initial_state_root": root0.hex(),
            "final_state_root": last.state_root.hex(),
            "final_loss": last.loss,
            "log_bytes": log_bytes,
        }
        click.echo(json.dumps(summary))
    except VtrainError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(_os_error(e)) from None


@click.command("replay")
@click.option("--run", "run_path", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--from-step", type=click.IntRange(min=0), default=0, show_default=True, help="Start at this checkpoint.")
@click.option("--to-step", type=click.IntRange(min=1), default=None, help="Last step to replay (default: all).")
@click.option("--mode", type=click.Choice([m.value for m in Mode]), default=None, help="Override the run's mode.")
def replay_cmd(run_path: Path, from_step: int, to_step: int | None, mode: str | None) -> None:
    """Replay a run with its rounding logs and compare every step's state root. Exit 1 on divergence."""
    try:
        run = RunDir(run_path)
        spec = run.read_spec()
        job = build_job(spec)
        roots = run.read_roots()
        if not roots:
            raise click.ClickException(f"{run.path / 'roots.jsonl'} records no steps: nothing to replay")
        last = to_step or max(roots)
        if last <= from_step:
            raise click.ClickException(f"--to-step {last} is not after --from-step {from_step}")
        if last > max(roots):
            raise click.ClickException(f"--to-step {last}: the run records steps up to {max(roots)} only")
        state = run.read_checkpoint(from_step, job.graph)
        first_bad = None
        matched = 0
        with _progress() as prog:
            task = prog.add_task("replaying", total=last - from_step)
            for o in replay_steps(job, state, from_step + 1, last, lambda s: run.read_log(s, job.graph), mode=mode):
                want = roots.get(o.step)
                if want is None:
                    raise click.ClickException(f"roots.jsonl has no record of step {o.step}")
                if o.state_root.hex() == want["state_root"]:
                    matched += 1
                elif first_bad is None:
                    first_bad = o.step
                prog.update(task, advance=1)
        verdict = {
            "run": str(run_path),
            "steps": last - from_step,
            "matched": matched,
            "first_divergent_step": first_bad,
        }
        click.echo(json.dumps(verdict))
        if first_bad is not None:
            sys.exit(1)
    except VtrainError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:
        raise click.ClickException(_os_error(e)) from None


def _os_error(e: OSError) -> str:
    """One line for a file-system error: what failed and on which file."""
    return f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)


COMMANDS = [train_cmd, replay_cmd]
