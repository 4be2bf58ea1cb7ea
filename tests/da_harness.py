"""Data-availability test harness: a synthetic run's op logs as raw leaves (so malformed logs can
be committed: vtrain.commit refuses to build them), and the answers a trainer sends, built with
:mod:`protocol.availability` from the run's records."""

from __future__ import annotations

from dataclasses import dataclass, replace

import game_harness as H
from web3.logs import DISCARD

from protocol import availability as A
from protocol.store import StepRecord
from vtrain.commit import roots as C
from vtrain.commit.merkle import MerkleTree, merkle_root


def leaf(key: int, code: int = 0, value: int = 0) -> bytes:
    """A raw 9-byte log leaf (no validation beyond field widths)."""
    return key.to_bytes(4, "big") + bytes([code]) + value.to_bytes(4, "big")


LOW = leaf(0)
HIGH = leaf(0xFFFFFFFF)


def entries_leaves(entries: list[tuple[int, int, int]]) -> list[bytes]:
    """[LOW, (index + 1, code, value) in the given order, HIGH]: raw, unsorted if so given."""
    return [LOW, *(leaf(i + 1, c, v) for i, c, v in entries), HIGH]


@dataclass
class LogRun:
    """A synthetic run plus every op log's leaves."""

    run: H.Run
    leaves: dict[tuple[int, int], list[bytes]]

    def records(self, i: int) -> list[StepRecord]:
        return [
            StepRecord(s, self.run.steps[s].state_root, self.run.steps[s].log_root, tuple(self.run.steps[s].comp_roots))
            for s in self.run.cfg.interval_steps(i)
        ]

    def op_roots(self, s: int) -> list[bytes]:
        return self.run.steps[s].op_log_roots

    def log(self, s: int, op: int) -> list[bytes]:
        return self.leaves[(s, op)]


def with_logs(run: H.Run, overrides: dict[tuple[int, int], list[bytes]] | None = None) -> LogRun:
    """``run`` with its synthetic logs, op logs ``(s, op)`` replaced by raw ``overrides`` (the
    step leaves and interval trees recommitted to them)."""
    leaves: dict[tuple[int, int], list[bytes]] = {}
    for s in run.steps:
        for j, op in enumerate(run.graph.ops):
            leaves[(s, j)] = C.op_log_leaves(H.synth_log(s, j, op.numel) if op.name == "update0" else [])
    steps = dict(run.steps)
    for (s, j), raw in (overrides or {}).items():
        leaves[(s, j)] = list(raw)
        rec = steps[s]
        roots = list(rec.op_log_roots)
        roots[j] = merkle_root(raw)
        log_tree = C.roots_tree(roots)
        steps[s] = replace(rec, op_log_roots=roots, log_tree=log_tree,
                           leaf=C.step_leaf(s, rec.state_root, log_tree.root))
    trees = [MerkleTree.from_leaves([steps[s].leaf for s in run.cfg.interval_steps(i)])
             for i in range(run.cfg.n_intervals)]
    return LogRun(replace(run, steps=steps, interval_trees=trees), leaves)


def bond(dep: H.Deployment, job: int) -> int:
    return dep.job(job)["params"]["challengerBond"]


def step_fee(dep: H.Deployment, job: int, first_op: int = 0) -> int:
    return int(dep.da.functions.stepDemandFee(job, first_op).call())


def log_fee(dep: H.Deployment, lo: int = 0, hi: int = A.MAX_TO_INDEX, start: int = A.NO_POSITION) -> int:
    return int(dep.da.functions.logDemandFee(lo, hi, start).call())


def demand_step(dep: H.Deployment, job: int, i: int, s: int, first_op: int = 0, who: str | None = None) -> int:
    r = dep.tx(dep.da.functions.demandStep(job, i, s, first_op), who or dep.challenger,
               value=bond(dep, job) + step_fee(dep, job, first_op))
    (ev,) = dep.da.events.DemandCreated().process_receipt(r, errors=DISCARD)
    return int(ev.args.id)


def demand_log(
    dep: H.Deployment, job: int, i: int, s: int, op: int, lo: int = 0, hi: int = A.MAX_TO_INDEX,
    start: int = A.NO_POSITION, who: str | None = None,
) -> int:
    r = dep.tx(dep.da.functions.demandLog(job, i, s, op, lo, hi, start), who or dep.challenger,
               value=bond(dep, job) + log_fee(dep, lo, hi, start))
    (ev,) = dep.da.events.DemandCreated().process_receipt(r, errors=DISCARD)
    return int(ev.args.id)


def step_args(lr: LogRun, i: int, s: int, first_op: int = 0) -> tuple:
    return A.step_answer(lr.records(i), s, lr.op_roots(s), first_op)


def run_args(lr: LogRun, i: int, s: int, op: int, first: int, end: int) -> tuple:
    return A.log_run(lr.records(i), s, lr.op_roots(s), op, lr.log(s, op), first, end)


def answer_run_for(lr: LogRun, i: int, s: int, op: int, lo: int, hi: int, start: int = A.NO_POSITION) -> tuple:
    """The honest trainer's answer to a Log demand: the run ``answer_range`` picks on its leaves."""
    first, end = A.answer_range(A.log_keys(lr.log(s, op)), lo, hi, start)
    return run_args(lr, i, s, op, first, end)


def demand(dep: H.Deployment, gid: int) -> dict:
    v = dep.call(dep.da.functions.getDemand(gid))
    names = ["job", "interval", "step", "kind", "status", "demander", "op", "fromIndex", "trainer", "toIndex",
             "startPosition", "clock", "fee"]
    return dict(zip(names, v, strict=True))
