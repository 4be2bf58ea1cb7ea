"""Launch a data-parallel run on one host: N worker processes, gloo on loopback, a free port.

Each rank is its own ``python -m vtrain.distributed.worker`` process with the ``env://``
rendezvous variables torchrun would set (``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``), so a rank may also get its own environment (``rank_env``: e.g. another
``ATEN_CPU_CAPABILITY``, which torch reads at import). Several hosts: run the same worker under
``torchrun`` (docs/architecture.md, "Data-parallel training").

If a rank fails, the others stop at their next collective (the peer is gone, or the collective
timeout passes); the launcher then ends any rank still running and raises
:class:`~vtrain.errors.VtrainError` naming the ranks and their last error line, or
:class:`~vtrain.errors.NonFiniteValue` (with the op and element the rank named) when a rank's step
had no finite value: the run diverged, as one process would have said. The leader writes
checkpoints as it goes, so the folder resumes (``resume=True``) from the last one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import torch

import vtrain
from vtrain.commit.roots import state_root
from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.training.loop import StepOutcome, component_roots
from vtrain.training.rundir import RunDir
from vtrain.training.spec import Job

log = logging.getLogger(__name__)

#: How long the other ranks get to notice a failed rank and exit before the launcher ends them.
GRACE_S = 30.0
#: A rank's error line for a step with no finite value (then a JSON record: op, index, message).
NONFINITE_MARK = "vtrain-nonfinite: "


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def launch(
    run: Path,
    nproc: int,
    resume: bool = False,
    rank_env: Sequence[Mapping[str, str]] | None = None,
    timeout_s: float | None = None,
    span: tuple[int, int] | None = None,
    device: str = "cpu",
) -> dict:
    """Run the spec in ``run/spec.json`` on ``nproc`` local ranks; returns the leader's summary.
    ``span``: only those steps, from the folder's checkpoint before them (see the worker).
    ``device``: ``cpu`` (gloo) or ``cuda`` (NCCL, rank r on GPU r)."""
    if nproc < 1:
        raise VtrainError(f"--nproc: expected at least 1, got {nproc}")
    if rank_env is not None and len(rank_env) != nproc:
        raise VtrainError(f"rank_env: expected {nproc} environments, got {len(rank_env)}")
    root = str(Path(vtrain.__file__).resolve().parent.parent)
    port = free_port()
    threads = max(1, (os.cpu_count() or 1) // nproc)
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="vtrain-dist-") as tmp:
        outs, errs = [], []
        for r in range(nproc):
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", str(threads))
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            path = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(nproc),
                       LOCAL_RANK=str(r), PYTHONPATH=path)
            if timeout_s is not None:
                env["VTRAIN_DIST_TIMEOUT"] = str(timeout_s)
            if rank_env is not None:
                env.update(rank_env[r])
            outs.append(open(Path(tmp) / f"rank{r}.out", "w+b"))  # noqa: SIM115 (closed below)
            errs.append(open(Path(tmp) / f"rank{r}.err", "w+b"))  # noqa: SIM115
            cmd = [sys.executable, "-m", "vtrain.distributed.worker", str(run)]
            if resume:
                cmd.append("--resume")
            if span is not None:
                cmd += ["--span", str(span[0]), str(span[1])]
            cmd += ["--device", str(device)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=outs[r], stderr=errs[r], cwd=root))
        try:
            codes = _wait(procs)
        finally:
            for p in procs:  # only our own children, by handle
                if p.poll() is None:
                    p.kill()
                    p.wait()
        texts = []
        for f in errs + outs:
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="replace"))
            f.close()
    err_text, out_text = texts[:nproc], texts[nproc:]
    failed = [r for r, c in enumerate(codes) if c != 0]
    if failed:
        diverged = _nonfinite(err_text[r] for r in failed)
        if diverged is not None:
            raise diverged
        parts = []
        for r in failed:
            lines = [ln for ln in err_text[r].splitlines() if ln.strip()]
            said = next((ln for ln in reversed(lines) if ln.startswith(f"rank {r}:")), lines[-1] if lines else "")
            parts.append(f"rank {r} ({_exit_text(codes[r])}){': ' + said if said else ''}")
        raise VtrainError(f"data-parallel run over {nproc} ranks failed: " + "; ".join(parts)
                          + f". The run folder {run} resumes from its last checkpoint.")
    lines = [ln for ln in out_text[0].splitlines() if ln.startswith("{")]
    if not lines:
        raise VtrainError(f"rank 0 printed no summary; its error output: {err_text[0][-500:]}")
    return json.loads(lines[-1])


def _nonfinite(texts: Iterator[str]) -> NonFiniteValue | None:
    """The first failed rank's report of a step with no finite value (``NONFINITE_MARK``), if any:
    the other ranks then fail only because that one stopped."""
    for text in texts:
        for line in text.splitlines():
            if not line.startswith(NONFINITE_MARK):
                continue
            try:
                r = json.loads(line[len(NONFINITE_MARK):])
                op, index = r.get("op"), r.get("index")
                return NonFiniteValue(str(r["message"]), op=op if isinstance(op, int) else None,
                                      index=index if isinstance(index, int) else None)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return None


def _wait(procs: list[subprocess.Popen]) -> list[int]:
    """Wait for every rank; once one has failed, give the rest ``GRACE_S`` to notice, then end them."""
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return [int(c) for c in codes]  # type: ignore[arg-type]
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            return [int(p.wait()) for p in procs]
        time.sleep(0.05)


def train_span(
    job: Job, state: list[torch.Tensor], first: int, last: int, nproc: int, device: str = "cpu"
) -> Iterator[StepOutcome]:
    """Steps ``first..last`` from ``state`` on ``nproc`` local ranks (``device``: as :func:`launch`): the
    same outcomes as ``vtrain.training.loop.train_steps`` in one process (``result`` is None: no trace)."""
    with tempfile.TemporaryDirectory(prefix="vtrain-span-") as tmp:
        run = RunDir(Path(tmp))
        run.write_spec(job.spec)
        run.write_checkpoint(first - 1, job.graph, state)
        diverged: NonFiniteValue | None = None
        try:
            launch(run.path, nproc, span=(first, last), device=device)
        except NonFiniteValue as e:  # the steps before it are outcomes, as in one process
            diverged = e
        roots = run.read_roots() if (run.path / "roots.jsonl").exists() else {}
        for s in range(first, last + 1):
            if diverged is not None and s not in roots:
                raise diverged
            st = run.read_checkpoint(s, job.graph)
            comp = component_roots(st)
            rec = roots[s]
            if state_root(comp).hex() != rec["state_root"]:
                raise VtrainError(f"step {s}: the leader's checkpoint does not hash to its recorded state root")
            lg = run.read_log(s, job.graph)
            yield StepOutcome(s, float(rec["loss"]), st, comp, state_root(comp), lg, bytes.fromhex(rec["log_root"]),
                              None)  # type: ignore[arg-type]
