"""``vtrain train``, ``replay``, ``sample``, ``export``, ``inspect`` and ``export-paper-log``:
chain-free commands over a local run folder.

Only click is imported at module level; torch and the rest load inside the commands, so
``vtrain --help`` stays quick.

Exit status of every command here: 0 done (replay: every step matched), 1 bad input (a malformed
spec, dataset or run folder, data changed since training, conflicting options), 2 usage error
(unknown or malformed option), 3 the replay diverged, 4 unavailable (a file the command needs is
missing), 130 interrupted (Ctrl-C; ``vtrain train --resume RUN`` continues).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

# Idle OpenMP threads sleep instead of spinning (read once, when torch loads libgomp: torch is
# imported lazily, after this). Numerically neutral; without it two threads on a busy machine
# trained 25x slower than one (docs/numerics.md, "Devices and threads"). An explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

log = logging.getLogger(__name__)

EXIT_BAD_INPUT = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = (
    "Exit status: 0 done, 1 bad input (malformed spec/data/run folder, data changed, conflicting "
    "options), 2 usage error, 3 replay diverged, 4 unavailable (a needed file is missing), "
    "130 interrupted."
)

MODE_NAMES = ("certified", "paper", "round-nolog", "fp32")
"""``vtrain.numerics.rounding.Mode`` values (kept here so importing the CLI does not load torch;
a test checks they agree)."""

#: Options that set a spec field (refused together with --spec or --resume), and the model they belong to.
SPEC_OPTIONS = ("model", "optimizer", "steps", "interval", "batch_size", "seed", "mode", "lr", "text",
                "layers", "width", "heads", "context", "hidden", "model_arg", "checkpoint")
GPT_ONLY = ("text", "layers", "width", "heads", "context")
MLP_ONLY = ("hidden",)


class Failure(click.ClickException):
    """A clean one-line error with its exit status."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _failure(e: BaseException) -> Failure:
    """The exit status and message of an error raised by the library or the file system."""
    from vtrain.errors import MissingArtifact, VtrainError

    if isinstance(e, MissingArtifact):
        return Failure(str(e), EXIT_UNAVAILABLE)
    if isinstance(e, VtrainError):
        return Failure(str(e), EXIT_BAD_INPUT)
    if isinstance(e, FileNotFoundError):
        return Failure(_os_error(e), EXIT_UNAVAILABLE)
    if isinstance(e, OSError):
        return Failure(_os_error(e), EXIT_BAD_INPUT)
    raise e


def _os_error(e: OSError) -> str:
    """One line for a file-system error: what failed and on which file."""
    return f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)


def _guarded(fn):
    """Map VtrainError / OSError raised inside a command to :class:`Failure` (no traceback)."""
    import functools

    @functools.wraps(fn)
    def inner(*a, **k):
        from vtrain.errors import VtrainError

        try:
            return fn(*a, **k)
        except (VtrainError, OSError) as e:
            raise _failure(e) from None

    return inner


# -- model code from a run folder -------------------------------------------------------------------


def trust_option(f):
    """``--trust-model-code``: run a run folder's file model that this user did not train."""
    return click.option(
        "--trust-model-code", "trust_model_code", is_flag=True,
        help="Run the run folder's model source (FILE.py:FACTORY runs) even if you did not train or approve "
        "it before: it is Python executed with your permissions. Read RUN/model/ first.",
    )(f)


def _check_model_code(run: Any, spec: Any, approved: bool) -> None:
    """Building a file model's job executes its source: a source this user did not train (or approve
    before, :mod:`vtrain.training.trust`) runs only with ``--trust-model-code``, said on stderr."""
    from vtrain.frontend.job import is_file_model
    from vtrain.training.trust import is_trusted, trust

    if not is_file_model(spec.model) or is_trusted(spec.model_sha256):
        return
    source = spec.model.rpartition(":")[0]
    sha = spec.model_sha256 or "not pinned"
    if not approved:
        raise Failure(f"{source}: the model code of run folder {run.path} (sha256 {sha}) was not trained or "
                      "approved here, and using the run executes it with your permissions; read it, then "
                      "pass --trust-model-code")
    click.echo(f"running the model code of {source} (sha256 {sha}), approved by --trust-model-code", err=True)
    trust(spec.model_sha256, source)


# -- train ------------------------------------------------------------------------------------------


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
) -> Any:
    from vtrain.models.nn import GPTConfig, MLPConfig
    from vtrain.models.optim import AdamWConfig, SGDConfig
    from vtrain.training.spec import TrainSpec

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


def _refuse_conflicts(ctx: click.Context, spec_path: Path | None, resume: Path | None, out: Path | None) -> None:
    """Options that would be ignored are refused (exit 2), naming both sides."""
    given = [n for n in SPEC_OPTIONS if _given(ctx, n)]
    if resume is not None and out is not None:
        raise click.UsageError("--resume RUN continues RUN in place: give --resume or --out, not both")
    if resume is None and out is None:
        raise click.UsageError("expected --out RUN (a new run) or --resume RUN (continue one)")
    for source, name in ((resume, "--resume"), (spec_path, "--spec")):
        if source is not None and given:
            what = "the run's spec.json" if name == "--resume" else str(spec_path)
            raise click.UsageError(f"{', '.join(_flag(n) for n in given)}: conflicts with {name} "
                                   f"({what} sets it); drop one")
    if resume is not None and spec_path is not None:
        raise click.UsageError("--spec conflicts with --resume (the run's spec.json is the spec)")
    model = ctx.params.get("model")
    wrong = MLP_ONLY if model == "gpt" else GPT_ONLY
    bad = [n for n in wrong if _given(ctx, n)]
    if spec_path is None and resume is None and bad:
        raise click.UsageError(f"{', '.join(_flag(n) for n in bad)}: not an option of --model {model}")


def _comparable(spec: Any) -> dict:
    """The settings that decide a run, wherever its files lie (a pinned copy or the user's file)."""
    d = spec.to_dict()
    d.pop("text_path")
    for k in ("model_sha256", "checkpoint_sha256"):
        d.pop(k, None)
    if ":" in d["model"]:
        path, _, factory = d["model"].rpartition(":")
        d["model"] = f"{Path(path).name}:{factory}"
    if d.get("checkpoint"):
        d["checkpoint"] = Path(d["checkpoint"]).name
    return d


def _spec_difference(a: Any, b: Any) -> str | None:
    da, db = _comparable(a), _comparable(b)

    def flat(d: dict, pre: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{pre}{k}.") if isinstance(v, dict) else {f"{pre}{k}": v})
        return out

    fa, fb = flat(da), flat(db)
    for k in sorted(set(fa) | set(fb)):
        if fa.get(k) != fb.get(k):
            return f"{k}: {fa.get(k)!r} in the run, {fb.get(k)!r} now"
    return None


def _text_sha(path: str | None) -> str | None:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def _resume_point(run: Any, job: Any) -> tuple[int, list]:
    """The last checkpoint whose state root matches the recorded one (:func:`vtrain.training.resume.resume_point`)."""
    from vtrain.training.resume import resume_point

    return resume_point(run, job)


THREADS_PER_CPU = 16
MIN_THREAD_CAP = 64
"""``--threads`` above ``max(MIN_THREAD_CAP, THREADS_PER_CPU * CPUs)`` is refused: only slower, and at
some thousands the BLAS fails to start its threads and the process crashes (a segmentation fault)."""


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _apply_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> int:
    """Set this process's compute threads as soon as the option is parsed (before any step)."""
    from vtrain.errors import VtrainError
    from vtrain.graph.executor import set_threads

    source = "--threads"
    if value is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        value = int(os.environ["OMP_NUM_THREADS"]) or None
        source = "$OMP_NUM_THREADS"
    cpus = _usable_cpus()
    most = max(MIN_THREAD_CAP, THREADS_PER_CPU * cpus)
    if value is not None and value > most:  # thousands of threads: the BLAS cannot start them and the process dies
        raise click.BadParameter(f"{value} threads for the {cpus} CPUs this process may use (at most {most}); "
                                 "give the cores you may use", param_hint=source)
    try:
        return set_threads(value)
    except VtrainError as e:
        raise click.BadParameter(str(e), param_hint="--threads") from None


def threads_option(f):
    """``--threads N``: torch intra-op threads (inter-op: 1). Default: $OMP_NUM_THREADS, else the
    physical cores this process may use. Never changes a bit of a certified run, only its speed."""
    return click.option(
        "--threads",
        type=click.IntRange(min=1),
        default=None,
        callback=_apply_threads,
        help="Compute threads (default: $OMP_NUM_THREADS, else physical cores). On a shared machine "
        "give the cores you may use; more threads than free cores slow every step.",
    )(f)


def _check_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from vtrain.errors import VtrainError
    from vtrain.graph.executor import resolve_device

    try:
        return str(resolve_device(value))
    except VtrainError as e:
        raise click.BadParameter(str(e), param_hint="--device") from None


def device_option(f):
    """``--device cpu|cuda[:N]``: where the FP64 compute runs; logs and roots are device independent."""
    return click.option(
        "--device",
        default="cpu",
        show_default=True,
        callback=_check_device,
        help="cpu or cuda[:N]: where the step computes (FP64 on either; a log from one replays on the other).",
    )(f)

def _model_option(value: str) -> str:
    """``--model``: 'mlp', 'gpt' or FILE.py:FACTORY (the file's existence is checked when the job is built)."""
    if value in ("mlp", "gpt"):
        return value
    from vtrain.errors import VtrainError
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



@click.command("train", epilog=EXIT_CODES_HELP)
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Run folder to create (a partial run of the same spec there is continued).")
@click.option("--resume", "resume", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Continue the interrupted run in this folder, with its own spec.")
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
@click.option("--mode", type=click.Choice(MODE_NAMES), default="certified", show_default=True)
@click.option("--lr", type=float, default=None, help="Learning rate (default: the optimizer's).")
@click.option(
    "--text",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="gpt: train on this text file (copied into the run folder).",
)
@click.option("--layers", type=click.IntRange(min=1), default=1, show_default=True, help="gpt only.")
@click.option("--width", type=click.IntRange(min=1), default=32, show_default=True, help="gpt only.")
@click.option("--heads", type=click.IntRange(min=1), default=2, show_default=True, help="gpt only.")
@click.option("--context", type=click.IntRange(min=1), default=16, show_default=True, help="gpt only.")
@click.option("--hidden", default="32", show_default=True, help="mlp only: hidden sizes, comma-separated.")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Read the whole spec from a file (JSON, or TOML if named *.toml); the spec options above "
    "are then refused.",
)
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Data-parallel ranks on this host (torch.distributed, gloo); same roots and logs as one process. "
    "Several hosts: torchrun (docs/architecture.md).",
)
@click.option(
    "--pin-only",
    is_flag=True,
    help="Write the run folder (spec, data, pinned model source and initial weights, step-0 checkpoint) and "
    "stop before the first step: `vtrain client create-job --spec RUN/spec.json` takes it, and "
    "`vtrain train --resume RUN` trains it.",
)
@device_option
@threads_option
@trust_option
@click.pass_context
def train_cmd(
    ctx: click.Context,
    out: Path | None,
    resume: Path | None,
    spec_path: Path | None,
    nproc: int,
    pin_only: bool,
    device: str,
    threads: int,
    trust_model_code: bool,
    **opts,
) -> None:
    """Train with controlled numerics and write spec, data, roots, logs and checkpoints to the run folder.

    The run folder is self-contained (a copy of the text file, the vocabulary, sha256 of the
    data). Interrupted (Ctrl-C, a crash): `vtrain train --resume RUN` continues from the last
    checkpoint that matches its recorded state root, and ends with the same roots as an
    uninterrupted run. Progress goes to stderr (a bar on a terminal, a line every 10 steps or 5 s
    otherwise); stdout gets one JSON line at the end.
    """
    _refuse_conflicts(ctx, spec_path, resume, out)
    if pin_only and resume is not None:
        raise click.UsageError("--pin-only writes a new run folder (--out): a run to --resume is already pinned")
    _train(out, resume, spec_path, opts, nproc, device, threads, trust_model_code, pin_only)


@_guarded
def _train(
    out: Path | None,
    resume: Path | None,
    spec_path: Path | None,
    opts: dict,
    nproc: int = 1,
    device: str = "cpu",
    threads: int | None = None,
    trust_model_code: bool = False,
    pin_only: bool = False,
) -> None:
    from vtrain.errors import VtrainError
    from vtrain.frontend.job import draws_initial_weights
    from vtrain.training.rundir import RunDir, read_spec_file
    from vtrain.training.spec import build_job, check_batch_fits
    from vtrain.training.trust import trust

    if resume is not None:
        run = RunDir(resume)
        if not resume.exists():
            raise Failure(f"--resume {resume}: no such run folder", EXIT_UNAVAILABLE)
        spec = run.read_spec()
        _check_model_code(run, spec, trust_model_code)
        fresh = False
    else:
        assert out is not None
        spec = read_spec_file(spec_path) if spec_path else spec_from_options(**opts)
        run = RunDir(out)
        if out.exists() and not out.is_dir():
            raise Failure(f"--out {out}: exists and is not a folder")
        fresh = not (out / "spec.json").exists() and not (out / "roots.jsonl").exists()
        if not fresh:
            old = run.read_spec()
            if draws_initial_weights(spec) and old.checkpoint is not None and run.drawn_initial_weights():
                import dataclasses  # the run pinned what its factory drew (pin_initial_weights): the same spec

                old = dataclasses.replace(old, checkpoint=None, checkpoint_sha256=None)
            diff = _spec_difference(old, spec)
            if diff is None and _text_sha(old.text_path) != _text_sha(spec.text_path):
                diff = "the text file's contents differ"
            if diff is not None:
                raise Failure(f"--out {out} already holds a run of another spec ({diff}); choose another --out")
            spec = run.read_spec()
            _check_model_code(run, spec, trust_model_code)
    if nproc > 1:  # before anything is pinned: a refused spec leaves no model/ behind to block a retry
        from vtrain.distributed.worker import check_spec

        check_spec(spec, nproc)
    stored = given = spec
    made_folder = False
    if fresh:  # a file model is built from its pinned copy in the run folder, not the user's file
        if clash := run.foreign_entries():
            raise Failure(f"--out {run.path} holds no run but has {', '.join(clash)} of its own, which a new "
                          "run would write over; choose a new or empty folder")
        made_folder = not run.path.exists()
        try:
            stored = run.pin_model(spec)
        except BaseException:
            run.remove_unstarted(spec, made_folder)
            raise
        spec = run.resolve_model(stored)
        if stored.pinned:  # the user named this source: theirs to run again from the run folder
            trust(stored.model_sha256, spec.model.rpartition(":")[0])
    try:
        job = build_job(spec)
        if fresh:
            check_batch_fits(spec, job.dataset.n)
    except BaseException as e:  # a refused model leaves no half-made run folder behind (a retry starts fresh)
        if not fresh:
            raise
        run.remove_unstarted(stored, made_folder)
        if not stored.pinned or not isinstance(e, VtrainError):
            raise
        # the error names the user's file, which they edit, not the (removed) copy it was built from
        failure = _failure(e)
        failure.message = failure.message.replace(spec.model.rpartition(":")[0], given.model.rpartition(":")[0])
        raise failure from None
    drawn = fresh and draws_initial_weights(stored)
    if drawn:  # pin the weights the factory drew: torch's random init is not the same bits on every CPU
        try:
            stored = run.pin_initial_weights(stored, job.torch.task.module)
        except BaseException:
            run.remove_unstarted(stored, made_folder)
            raise
        spec = job.spec = run.resolve_model(stored)
    if not fresh:
        run.verify_dataset(job.dataset)
        roots = run.read_roots() if (run.path / "roots.jsonl").exists() else {}
        if len(roots) >= spec.steps and all(s in roots for s in range(1, spec.steps + 1)):
            raise Failure(f"{run.path} already holds a complete run of {spec.steps} steps; "
                          + ("nothing to resume" if resume is not None else "choose another --out"))
    if pin_only:
        if not fresh:
            raise Failure(f"--pin-only: {run.path} already holds this run (pinned); `vtrain train --resume "
                          f"{run.path}` trains it")
        _pin_run(run, job, stored, drawn)
        click.echo(json.dumps({"run": str(run.path), "spec": str(run.path / "spec.json"), "steps": 0,
                               "pinned": True, "initial_state_root": _initial_root(job)}))
        return
    if nproc > 1:
        from vtrain.distributed.launch import launch

        if fresh:
            run.write_spec(run.pin_inputs(stored, job.dataset, drawn))
        click.echo(json.dumps(launch(run.path, nproc, resume=not fresh, device=device)))
        return
    if fresh:
        from vtrain.graph.executor import state_tensors

        _pin_run(run, job, stored, drawn)
        state = state_tensors(job.initial_state)
        start = 0
    else:
        start, state = _resume_point(run, job)
        click.echo(f"resuming {run.path} after step {start} of {spec.steps}", err=True)
    _train_loop(run, job, state, start, device, threads)


def _pin_run(run: Any, job: Any, stored: Any, drawn: bool) -> None:
    """A new run folder's spec, inputs, empty roots and step-0 checkpoint: everything before step 1."""
    from vtrain.graph.executor import state_tensors
    from vtrain.training.rundir import reset_roots

    run.write_spec(run.pin_inputs(stored, job.dataset, drawn))
    reset_roots(run)
    run.write_checkpoint(0, job.graph, state_tensors(job.initial_state))


def _initial_root(job: Any) -> str:
    from vtrain.training.loop import initial_commitment

    return initial_commitment(job)[1].hex()


def _train_loop(run: Any, job: Any, state: list, start: int, device: str = "cpu", threads: int | None = None) -> None:
    from vtrain.numerics.rounding import Mode
    from vtrain.progress import StepProgress
    from vtrain.training.loop import initial_commitment, train_steps

    spec = job.spec
    _, root0 = initial_commitment(job)
    t0 = time.perf_counter()
    log_bytes = 0
    last = None
    done = start
    try:
        with StepProgress(f"train {spec.model} ({spec.mode})", spec.steps, done=start) as prog:
            for o in train_steps(job, state, start + 1, spec.steps, device=device):
                if spec.mode in (Mode.CERTIFIED.value, Mode.PAPER.value):
                    log_bytes += run.write_log(o.step, o.log, job.graph)
                if o.step % spec.interval == 0 or o.step == spec.steps:
                    run.write_checkpoint(o.step, job.graph, o.state)
                run.append_roots(o.step, o.loss, o.state_root, o.log_root)
                done = o.step
                prog.update(o.step, loss=o.loss)
                last = o
    except KeyboardInterrupt:
        raise Failure(f"interrupted after step {done} of {spec.steps}; continue with: "
                      f"vtrain train --resume {run.path}", EXIT_INTERRUPTED) from None
    assert last is not None
    summary = {
        "run": str(run.path),
        "steps": spec.steps,
        "resumed_after": start,
        "ops_per_step": job.graph.n_ops,
        "seconds": round(time.perf_counter() - t0, 3),
        "initial_state_root": root0.hex(),
        "final_state_root": last.state_root.hex(),
        "final_loss": last.loss,
        "log_bytes": log_bytes,
        "device": device,
        "threads": threads,
    }
    click.echo(json.dumps(summary))


# -- replay -----------------------------------------------------------------------------------------


@click.command("replay", epilog=EXIT_CODES_HELP)
@click.option("--run", "run_path", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--from-step", type=click.IntRange(min=0), default=0, show_default=True, help="Start at this checkpoint.")
@click.option("--to-step", type=click.IntRange(min=1), default=None, help="Last step to replay (default: all).")
@click.option("--mode", type=click.Choice(MODE_NAMES), default=None, help="Override the run's mode.")
@device_option
@threads_option
@trust_option
def replay_cmd(
    run_path: Path, from_step: int, to_step: int | None, mode: str | None, device: str, threads: int,
    trust_model_code: bool,
) -> None:
    """Replay a run with its rounding logs and compare every step's state root (exit 3 on divergence).

    Works from any directory: the run folder holds its data; data changed since training is
    reported with the file and both sha256 before any step runs. A file model's source is run from
    the folder: one you did not train needs --trust-model-code.
    """
    _replay(run_path, from_step, to_step, mode, device, threads, trust_model_code)


@_guarded
def _replay(
    run_path: Path, from_step: int, to_step: int | None, mode: str | None, device: str = "cpu",
    threads: int | None = None, trust_model_code: bool = False,
) -> None:
    from vtrain.progress import StepProgress
    from vtrain.training.loop import replay_steps
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import build_job

    run = RunDir(run_path)
    spec = run.read_spec()
    roots = run.read_roots()
    if not roots:
        raise Failure(f"{run.path / 'roots.jsonl'} records no steps: nothing to replay")
    last = to_step or max(roots)
    if last <= from_step:
        raise Failure(f"--to-step {last} is not after --from-step {from_step}")
    if last > max(roots):
        raise Failure(f"--to-step {last}: the run records steps up to {max(roots)} only")
    _check_model_code(run, spec, trust_model_code)
    job = build_job(spec)
    run.verify_dataset(job.dataset)
    from vtrain.errors import CorruptArtifact
    from vtrain.frontend.job import draws_initial_weights
    from vtrain.outputs.export import verified_state

    try:  # a changed checkpoint is named, not a divergence at once
        _, state = verified_state(run, job, from_step)
    except CorruptArtifact as e:
        if from_step > 0 or not draws_initial_weights(spec):
            raise
        # a run folder from before initial weights were pinned: its factory's draw here is not the
        # run's (torch's random init differs between CPUs); its own step-0 checkpoint is the start
        log.warning("%s; replaying from the run's own step-0 checkpoint", e)
        state = run.read_checkpoint(0, job.graph)
    same_mode = (mode or spec.mode) == spec.mode  # another mode's replay recomputes other values
    logged = same_mode and spec.mode in ("certified", "paper")
    checkpoints = set(run.checkpoint_steps())
    first_bad = None
    matched = 0
    damaged: list[str] = []
    t0 = time.perf_counter()
    with StepProgress("replay", last, done=from_step) as prog:
        logs = lambda s: run.read_log(s, job.graph)  # noqa: E731
        for o in replay_steps(job, state, from_step + 1, last, logs, mode=mode, device=device):
            want = roots.get(o.step)
            if want is None:
                raise Failure(f"roots.jsonl has no record of step {o.step}")
            if o.state_root.hex() == want["state_root"]:
                matched += 1
                if first_bad is None:  # the run's other records of this step, checked against the replay
                    damaged += _damaged_records(run, job, o, want, same_mode, logged, o.step in checkpoints)
            elif first_bad is None:
                first_bad = o.step
            prog.update(o.step)
    verdict = {"run": str(run_path), "steps": last - from_step, "matched": matched, "first_divergent_step": first_bad,
               "seconds": round(time.perf_counter() - t0, 3), "device": device, "threads": threads}
    if damaged:
        verdict["damaged"] = damaged
    click.echo(json.dumps(verdict))
    if first_bad is not None:
        sys.exit(EXIT_DIVERGED)
    if damaged:
        more = f" (and {len(damaged) - 1} more, listed in the verdict)" if len(damaged) > 1 else ""
        raise Failure(f"every state root matched, but the run folder was changed: {damaged[0]}{more}")


def _damaged_records(run: Any, job: Any, o: Any, want: dict, same_mode: bool, logged: bool,
                     has_checkpoint: bool) -> list[str]:
    """What of step ``o.step``'s records differs from its (matching) replay: the loss (a replay in the run's
    mode) and the log root (one that reads the step's log) of roots.jsonl, and the step's checkpoint."""
    from vtrain.commit.roots import state_root
    from vtrain.errors import VtrainError
    from vtrain.training.loop import component_roots

    out = []
    rec = run.path / "roots.jsonl"
    if same_mode and want.get("loss") != o.loss:
        out.append(f"{rec}: step {o.step} records loss {want.get('loss')!r}, the replay's is {o.loss!r}")
    if logged and want.get("log_root") != o.log_root.hex():
        out.append(f"{rec}: step {o.step} records log root {want.get('log_root')}, its log "
                   f"{run.log_path(o.step)} has {o.log_root.hex()}")
    if has_checkpoint:
        try:
            got = state_root(component_roots(run.read_checkpoint(o.step, job.graph))).hex()
        except VtrainError as e:
            out.append(str(e))
        else:
            if got != o.state_root.hex():
                out.append(f"checkpoint {run.ckpt_path(o.step)}: state root {got}, the replay's (and the recorded) "
                           f"{o.state_root.hex()}")
    return out


# -- using what was trained -------------------------------------------------------------------------


def _open_run(run_path: Path, trust_model_code: bool = False) -> tuple[Any, Any]:
    from vtrain.training.rundir import RunDir
    from vtrain.training.spec import build_job

    run = RunDir(run_path)
    spec = run.read_spec()
    _check_model_code(run, spec, trust_model_code)
    job = build_job(spec)
    run.verify_dataset(job.dataset)
    return run, job


_RUN_ARG = click.argument("run_path", metavar="RUN", type=click.Path(exists=True, file_okay=False, path_type=Path))
_STEP_OPT = click.option("--step", type=click.IntRange(min=0), default=None,
                         help="Checkpoint to use (default: the latest); checked against its recorded root.")


@click.command("sample", epilog=EXIT_CODES_HELP)
@_RUN_ARG
@_STEP_OPT
@click.option("--prompt", default="", help="Text to continue (characters of the run's vocabulary).")
@click.option("--tokens", type=click.IntRange(min=1, max=100_000), default=200, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0: greedy; above 0: sample from softmax(logits / T).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Sampling seed.")
@trust_option
def sample_cmd(run_path: Path, step: int | None, prompt: str, tokens: int, temperature: float, seed: int,
               trust_model_code: bool) -> None:
    """Generate text from a trained language model (a gpt run): greedy, or sampled with a seed."""
    _sample(run_path, step, prompt, tokens, temperature, seed, trust_model_code)


@_guarded
def _sample(run_path: Path, step: int | None, prompt: str, tokens: int, temperature: float, seed: int,
            trust_model_code: bool = False) -> None:
    import torch

    from vtrain.outputs.export import verified_state, weights
    from vtrain.outputs.sample import generate
    from vtrain.outputs.torch_models import GPT

    run, job = _open_run(run_path, trust_model_code)
    if job.spec.model != "gpt":
        raise Failure(f"{run_path}: sample needs a language model (a gpt run), this is a {job.spec.model} run")
    vocab = run.read_vocab(job.dataset)
    _, state = verified_state(run, job, step)
    model = GPT(job.spec.gpt)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights(job, state).items()}, strict=True)
    click.echo(generate(model, vocab, prompt, tokens, temperature, seed))


@click.command("export", epilog=EXIT_CODES_HELP)
@_RUN_ARG
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder to write.")
@_STEP_OPT
@trust_option
def export_cmd(run_path: Path, out: Path, step: int | None, trust_model_code: bool) -> None:
    """Write the weights only (no optimizer state) as OUT/model.safetensors, named like the model's
    torch state_dict (vtrain.outputs.torch_models), with config.json and vocab.json."""
    _export(run_path, out, step, trust_model_code)


@_guarded
def _export(run_path: Path, out: Path, step: int | None, trust_model_code: bool = False) -> None:
    from vtrain.outputs.export import export_run

    run, job = _open_run(run_path, trust_model_code)
    if foreign := [n for n in ("model.safetensors", "config.json") if not _our_export(out / n)]:
        raise Failure(f"--out {out} holds {' and '.join(foreign)} that no vtrain export wrote (a model's own "
                      "files?); export would write over them: choose another folder")
    click.echo(json.dumps(export_run(run, job, out, step)))


def _our_export(p: Path) -> bool:
    """True when ``p`` is absent or one of vtrain's own export files (its ``step`` field): re-exporting into
    the same folder replaces them, anything else there is the user's."""
    if not os.path.lexists(p):
        return True
    try:
        with open(p, "rb") as f:
            if p.suffix == ".safetensors":
                n = int.from_bytes(f.read(8), "little")
                head = json.loads(f.read(min(n, 1 << 20)).decode("utf-8"))
                return "step" in (head.get("__metadata__") or {})
            return "step" in json.loads(f.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError, AttributeError, TypeError):
        return False


@click.command("inspect", epilog=EXIT_CODES_HELP)
@_RUN_ARG
@click.option("--plots", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for loss.png and logged_fraction.png (default: RUN/plots).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole summary as JSON instead.")
@trust_option
def inspect_cmd(run_path: Path, plots: Path | None, as_json: bool, trust_model_code: bool) -> None:
    """Show a run: loss per step, rounding-log entries per op and per code; draw the plots."""
    _inspect(run_path, plots, as_json, trust_model_code)


@_guarded
def _inspect(run_path: Path, plots: Path | None, as_json: bool, trust_model_code: bool = False) -> None:
    from vtrain.outputs.inspect import plot, summarize, text_report

    run, job = _open_run(run_path, trust_model_code)
    summary = summarize(run, job)
    paths = plot(summary, plots or run.member("plots", "plots folder"))  # never a link out of a foreign folder
    summary["plots"] = [str(p) for p in paths]
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(text_report(summary))
        click.echo("plots: " + ", ".join(summary["plots"]))


@click.command("export-paper-log", epilog=EXIT_CODES_HELP)
@_RUN_ARG
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="Folder to write.")
@trust_option
def export_paper_log_cmd(run_path: Path, out: Path, trust_model_code: bool) -> None:
    """Write a paper-mode run's logs in the seed paper's own layout: per step, raw 5-trit bytes
    (forward_hooks_log_b_<step>_e_0, backward_hooks_log_b_<step>_e_0) and their _metadata sidecars."""
    _export_paper_log(run_path, out, trust_model_code)


@_guarded
def _export_paper_log(run_path: Path, out: Path, trust_model_code: bool = False) -> None:
    from vtrain.outputs.paper_log import export_paper_logs

    run, job = _open_run(run_path, trust_model_code)
    if job.spec.mode != "paper":
        raise Failure(f"{run_path}: a {job.spec.mode} run has no paper log (train with --mode paper)")
    click.echo(json.dumps(export_paper_logs(run, job, out)))


COMMANDS = [train_cmd, replay_cmd, sample_cmd, export_cmd, inspect_cmd, export_paper_log_cmd]
