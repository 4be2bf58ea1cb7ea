"""One rank of a data-parallel run: ``python -m vtrain.distributed.worker RUN [--resume]``.

The rendezvous is torch.distributed's ``env://``: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE`` (what ``torchrun`` sets, and what :mod:`vtrain.distributed.launch` sets for one
host). Backend: gloo on the CPU, NCCL with ``--device cuda`` (rank r on GPU ``LOCAL_RANK``).
Rank 0 is the leader: it alone reads and writes the run folder (spec, roots, logs, checkpoints)
and sends the spec and a resumed state to the others, so on several hosts only the leader's host
needs the folder. Every step, every rank checks that all ranks hold
the same state root and log bytes (:func:`vtrain.distributed.collective.agree`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.graph.executor import StepExecutor, state_tensors
from vtrain.numerics.logfile import encode_step_log
from vtrain.numerics.rounding import Mode
from vtrain.training.loop import StepOutcome, _outcome, batch_for, initial_commitment
from vtrain.training.resume import resume_point
from vtrain.training.rundir import RunDir
from vtrain.training.spec import Job, TrainSpec, build_job

from .collective import Collective, Combiner, DistCombiner, agree, collective_device
from .launch import NONFINITE_MARK
from .sharding import analyse, shards

log = logging.getLogger(__name__)

#: Collective timeout (seconds) unless ``VTRAIN_DIST_TIMEOUT`` says otherwise: a dead peer ends the
#: run with an error instead of a hang.
DEFAULT_TIMEOUT_S = 60.0
#: Fault injection for tests: ``"<rank>:<step>"`` makes that rank SIGKILL itself inside that step
#: (after the step's first batch reduction), as a crashed host would.
FAULT_ENV = "VTRAIN_DIST_KILL_AT"


def check_spec(spec: TrainSpec, world: int) -> None:
    """What a data-parallel run needs of a spec (errors name the setting)."""
    if spec.mode != Mode.CERTIFIED.value:
        raise VtrainError(f"data-parallel training: expected mode 'certified', got {spec.mode!r} "
                          "(only the canonical log is independent of the summation order)")
    if spec.batch_size < world:
        raise VtrainError(f"data-parallel training: batch_size {spec.batch_size} is smaller than the "
                          f"{world} ranks (every rank needs one sample at least)")


class _KillAt(Combiner):
    """The fault of :data:`FAULT_ENV`: the rank dies in the middle of a step's collectives."""

    def __init__(self, inner: Combiner, step: int) -> None:
        self.inner, self.step, self.current = inner, step, 0
        self.rank, self.world = inner.rank, inner.world

    def all_reduce_sum(self, t):
        if self.current == self.step:
            log.error("fault injection: killing rank %d in step %d", self.rank, self.step)
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner.all_reduce_sum(t)

    def all_reduce_max(self, t):
        return self.inner.all_reduce_max(t)

    def all_gather(self, t):
        return self.inner.all_gather(t)

    def all_gather_object(self, obj):
        return self.inner.all_gather_object(obj)


def distributed_train_steps(
    job: Job, state: list[torch.Tensor], first: int, last: int, combiner: Combiner | None = None,
    device: str | None = None,
) -> Iterator[StepOutcome]:
    """Steps ``first..last`` of ``job`` on this rank's shard of every batch; each outcome carries the
    whole batch's log and the state every rank agreed on (same as ``loop.train_steps`` in one process).
    ``combiner``: how ranks exchange values (default: the torch.distributed process group);
    ``device``: where this rank computes (the log and roots do not depend on it)."""
    combiner = combiner or DistCombiner()
    rank, world = combiner.rank, combiner.world
    check_spec(job.spec, world)
    plan = analyse(job.graph)
    shard = shards(job.spec.batch_size, world)[rank]
    kill = os.environ.get(FAULT_ENV, "")
    fault = None
    if kill and int(kill.split(":")[0]) == rank:
        fault = _KillAt(combiner, int(kill.split(":")[1]))
        combiner = fault
    coll = Collective(plan, shard, combiner)
    ex = StepExecutor(plan.local_graph(shard), Mode.CERTIFIED, device, seed=job.spec.data_seed, collective=coll)
    for s in range(first, last + 1):
        if fault is not None:
            fault.current = s
        data = batch_for(job, s)[shard.start : shard.start + shard.size]
        res = ex.run(state, data, step=s)
        res.log = coll.global_log(res.log)
        out = _outcome(s, res, job.graph)
        agree(s, out.state_root, encode_step_log(res.log, s, job.graph), combiner)
        yield out
        state = out.state


def _broadcast_state(state: list[torch.Tensor] | None, job: Job) -> list[torch.Tensor]:
    if dist.get_rank() != 0:
        state = [torch.empty(s.shape, dtype=torch.float32) for s in job.graph.slots]
    assert state is not None
    dev = collective_device()
    out = []
    for t in state:
        t = t.to(dev)
        dist.broadcast(t, src=0)
        out.append(t.cpu())
    return state_tensors([t.numpy() for t in out])


def run_rank(run_path: Path, resume: bool = False, span: tuple[int, int] | None = None,
             device: str = "cpu") -> dict | None:
    """Train the run folder's spec as this rank; the leader writes the folder and returns the summary.

    ``span = (first, last)``: train only steps ``first..last`` from the folder's checkpoint of step
    ``first - 1`` and write a checkpoint after every step (how an agent trains one interval)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    run = RunDir(run_path)
    box: list = [None]
    if rank == 0:
        try:
            box = [(run.read_spec().to_json(), None)]
        except (VtrainError, OSError) as e:
            box = [(None, str(e))]
    dist.broadcast_object_list(box, src=0)  # a leader that cannot start stops every rank at once
    text, problem = box[0]
    if problem is not None:
        raise VtrainError(f"leader (rank 0): {problem}")
    spec = TrainSpec.from_json(text)
    check_spec(spec, world)
    job = build_job(spec)
    state: list[torch.Tensor] | None = None
    first = 1
    problem = None
    if rank == 0:
        try:
            if span is not None:
                first = span[0]
                state = run.read_checkpoint(first - 1, job.graph)
            elif resume:
                run.verify_dataset(job.dataset)
                start, state = resume_point(run, job)
                log.info("resuming after step %d of %d on %d ranks", start, spec.steps, world)
                first = start + 1
            elif (run.path / "roots.jsonl").exists():
                raise VtrainError(f"{run.path} already holds a run; resume it or choose another folder")
            else:
                state = state_tensors(job.initial_state)
                run.write_checkpoint(0, job.graph, state)
        except (VtrainError, OSError) as e:
            problem = str(e)
    box = [(first, problem)]
    dist.broadcast_object_list(box, src=0)  # the leader's problem stops every rank, not just the leader
    first, problem = box[0]
    if problem is not None:
        raise VtrainError(f"leader (rank 0): {problem}")
    state = _broadcast_state(state, job)
    _, root0 = initial_commitment(job)
    t0 = time.perf_counter()
    log_bytes = 0
    last = None
    caps: list = [None] * world
    dist.all_gather_object(caps, torch.backends.cpu.get_cpu_capability())
    last_step = span[1] if span is not None else spec.steps
    for o in distributed_train_steps(job, state, first, last_step, device=device):
        if rank == 0:
            log_bytes += run.write_log(o.step, o.log, job.graph)
            run.append_roots(o.step, o.loss, o.state_root, o.log_root)
            if span is not None or o.step % spec.interval == 0 or o.step == spec.steps:
                run.write_checkpoint(o.step, job.graph, o.state)
        last = o
    if rank != 0:
        return None
    final = last.state_root.hex() if last is not None else None
    return {
        "run": str(run_path),
        "steps": spec.steps,
        "first_step": first,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": device,
        "cpu_capability": caps,
        "ops_per_step": job.graph.n_ops,
        "seconds": round(time.perf_counter() - t0, 3),
        "initial_state_root": root0.hex(),
        "final_state_root": final,
        "final_loss": last.loss if last is not None else None,
        "log_bytes": log_bytes,
    }


def backend_for(device: str) -> str:
    """torch.distributed's backend for ``device``: NCCL for CUDA, gloo for the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rank_device(device: str) -> str:
    """This rank's device: on CUDA, GPU ``LOCAL_RANK`` (modulo the GPUs present), as torchrun lays out ranks."""
    if torch.device(device).type != "cuda":
        return "cpu"
    if not torch.cuda.is_available():
        raise VtrainError(f"device {device}: CUDA is not available here (torch {torch.__version__}); use --device cpu")
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"


def init_process_group(timeout_s: float | None = None, device: str = "cpu") -> None:
    """``env://`` rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) with a collective timeout;
    gloo on the CPU, NCCL (each rank on its own GPU, ``LOCAL_RANK``) with ``device`` cuda."""
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        raise VtrainError(f"rendezvous: expected the environment variables {', '.join(missing)} (set by "
                          "`vtrain train --nproc N` or torchrun)")
    t = timeout_s if timeout_s is not None else float(os.environ.get("VTRAIN_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(torch.device(rank_device(device)))
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=t))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vtrain.distributed.worker", description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="run folder holding spec.json (read by rank 0)")
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    ap.add_argument("--span", nargs=2, type=int, metavar=("FIRST", "LAST"), default=None,
                    help="train steps FIRST..LAST from the checkpoint of step FIRST-1; checkpoint every step")
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL; rank r on GPU LOCAL_RANK)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"rank {os.environ.get('RANK', '?')}: %(message)s")
    rank = os.environ.get("RANK", "?")
    try:
        device = rank_device(args.device)
        init_process_group(device=device)
        summary = run_rank(args.run, args.resume, tuple(args.span) if args.span else None, device)
        if summary is not None:
            print(json.dumps(summary), flush=True)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except (VtrainError, OSError, RuntimeError, ValueError) as e:  # gloo reports a lost peer as RuntimeError
        msg = " ".join(str(e).split())
        if isinstance(e, NonFiniteValue):  # typed for the launcher: a divergence, not a failed rank
            record = {"error": "NonFiniteValue", "op": e.op, "index": e.index, "message": msg[:2000]}
            print(NONFINITE_MARK + json.dumps(record), file=sys.stderr, flush=True)
        print(f"rank {rank}: {type(e).__name__}: {msg[:2000]}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    code = main()
    if code:
        # The error is reported; skip interpreter teardown, where gloo's process-group destructor may
        # abort (SIGABRT) on a peer that already exited, turning a clean exit status into a signal.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
