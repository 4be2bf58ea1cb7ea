"""Where an interrupted run continues: the last checkpoint whose state root matches its record.

Shared by ``vtrain train --resume`` in one process and the leader of a data-parallel run
(:mod:`vtrain.distributed.worker`): the world size does not change the bits, so a run may be
resumed with any ``--nproc``.
"""

from __future__ import annotations

import logging

import torch

from vtrain.commit.roots import state_root
from vtrain.errors import CorruptArtifact
from vtrain.graph.executor import state_tensors
from vtrain.training.loop import component_roots, initial_commitment
from vtrain.training.rundir import RunDir
from vtrain.training.spec import Job

log = logging.getLogger(__name__)


def resume_point(run: RunDir, job: Job) -> tuple[int, list[torch.Tensor]]:
    """The last checkpoint whose state root matches the recorded one; later records are dropped."""
    roots = run.read_roots() if (run.path / "roots.jsonl").exists() else {}
    done = 0
    while done + 1 in roots:
        done += 1
    for c in sorted((s for s in run.checkpoint_steps() if 0 < s <= done), reverse=True):
        try:
            state = run.read_checkpoint(c, job.graph)
        except CorruptArtifact as e:
            log.warning("not resuming from checkpoint %d: %s", c, e)
            continue
        if state_root(component_roots(state)).hex() == roots[c]["state_root"]:
            run.truncate_after(c)
            return c, state
        log.warning("not resuming from checkpoint %d: its state root differs from roots.jsonl", c)
    state = state_tensors(job.initial_state)  # step 0 is derived from the spec: always verifiable
    run.truncate_after(0)
    root0 = initial_commitment(job)[1]
    try:
        ok = state_root(component_roots(run.read_checkpoint(0, job.graph))) == root0
    except (CorruptArtifact, OSError, Exception):
        ok = False
    if not ok:
        run.write_checkpoint(0, job.graph, state)
    return 0, state
