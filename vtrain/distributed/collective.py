"""The executor's collective hook: batch reductions as FP64 partial sums, an FP64 all-reduce and one
canonical rounding on every rank; the gathering of sharded ops' log entries; the per-step agreement check.

Candidates (elements near a rounding midpoint, ``canonical.candidates``) are decided on the exact
value. A rank holds only its shard's terms, so the ranks all-gather the candidates' term rows
(the union of every rank's candidates, agreed by a MAX all-reduce of the candidate masks) and
each decides them with ``canonical.decide_rows`` (double-double, fsum, exact rationals): a
function of the exact terms alone, the same on every rank and in a single process
(docs/numerics.md, "Data-parallel reductions").
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.graph.executor import StepLog
from vtrain.graph.step_graph import OpKind, OpNode
from vtrain.numerics.canonical import _terms, candidates, decide_rows
from vtrain.numerics.rounding import TRAINER_BOUND_SLACK, Code, OpLog, U, _check_finite, canonical, gamma

from .sharding import Shard, ShardingPlan, shards

log = logging.getLogger(__name__)

_SUBNORMAL = 2.0**-149


class RanksDisagree(VtrainError):
    """Two ranks computed different state or log bits for the same step."""


class Combiner:
    """How the ranks exchange values: ``torch.distributed`` (:class:`DistCombiner`, the trainer's) or,
    in tests, an in-process stand-in that adds the partials in an adversarial order."""

    rank: int
    world: int

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        raise NotImplementedError

    def all_gather_object(self, obj: Any) -> list[Any]:
        raise NotImplementedError


def collective_device() -> torch.device:
    """Where the default process group's tensors must live: the current GPU for NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class DistCombiner(Combiner):
    """The default process group (gloo on CPU, NCCL on GPU); values come back on the CPU."""

    def __init__(self) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = collective_device()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous().to(self.device, copy=True)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu()

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous().to(self.device, copy=True)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.cpu()

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        t = t.contiguous().to(self.device)
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return [o.cpu() for o in out]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


@dataclass
class Collective:
    """The hook :class:`~vtrain.graph.executor.StepExecutor` calls for the ops of one rank's shard."""

    plan: ShardingPlan
    shard: Shard
    combiner: Combiner

    @property
    def reductions(self) -> set[int]:
        return self.plan.reductions

    def inputs(self, op: OpNode, ins: list[torch.Tensor]) -> list[torch.Tensor]:
        """Cut the replicated inputs that meet a sharded one at full batch size to this shard, and
        all-gather the sharded ones the plan needs whole (``ShardingPlan.gather_inputs``)."""
        cuts = self.plan.slice_inputs.get(op.id)
        whole = self.plan.gather_inputs.get(op.id)
        if not cuts and not whole:
            return ins
        ins = list(ins)
        for pos, p in cuts or ():
            ins[pos] = ins[pos].narrow(p.axis, self.shard.start * p.block, self.shard.size * p.block).contiguous()
        for pos, p in whole or ():
            ins[pos] = self._gather_batch(ins[pos], p)
        return ins

    def _gather_batch(self, t: torch.Tensor, p) -> torch.Tensor:
        """Every rank's shard of ``t`` along its batch axis, in rank (= sample) order: the whole tensor,
        the same bits on every rank (a copy). Shards differ in size by one sample at most: each is
        padded to the largest for the all-gather and cut back."""
        sizes = [s.size * p.block for s in shards(self.shard.batch, self.shard.world)]
        shape = list(t.shape)
        shape[p.axis] = max(sizes)
        buf = torch.zeros(shape, dtype=t.dtype)
        buf.narrow(p.axis, 0, t.shape[p.axis]).copy_(t.cpu())
        parts = self.combiner.all_gather(buf)
        whole = torch.cat([q.narrow(p.axis, 0, w) for q, w in zip(parts, sizes, strict=True)], dim=p.axis)
        return whole.contiguous().to(t.device)

    # -- a batch reduction -------------------------------------------------------------------------
    def reduce(self, op: OpNode, ins: list[torch.Tensor]) -> tuple[torch.Tensor, OpLog, int]:
        """The op's FP32 output (same bits on every rank) and its canonical log entries (computed on
        the CPU; the output goes back to the inputs' device)."""
        dev = ins[0].device
        if dev.type != "cpu":
            out, entries, slow = self.reduce(op, [t.cpu() for t in ins])
            return out.to(dev), entries, slow
        if op.kind == OpKind.MAX:  # exact: the max of the ranks' maxima
            return self.combiner.all_reduce_max(ins[0].amax(dim=-1, keepdim=True)), OpLog.empty(), 0
        g = self.plan.graph
        lead = self.shard.rank == 0  # a MATMUL bias is one term of the sum: rank 0 adds it
        if op.kind == OpKind.MATMUL:
            a, b = ins[0], ins[1]
            v = torch.matmul(a.double(), b.double().transpose(-1, -2))
            s = torch.matmul(a.abs(), b.abs().transpose(-1, -2)).double()
            n = g.in_shapes(op)[0][-1]
            if len(ins) == 3:
                n += 1
                if lead:
                    v = v + ins[2].double()
                    s = s + ins[2].abs().double()
        elif op.kind in (OpKind.SUM, OpKind.MEAN):
            v = ins[0].double().sum(dim=-1, keepdim=True)
            s = ins[0].abs().sum(dim=-1, keepdim=True).double()
            n = g.in_shapes(op)[0][-1]
        else:
            raise VtrainError(f"op {op.id}: {op.kind.name} is not a batch reduction")
        both = self.combiner.all_reduce_sum(torch.stack([v, s]))  # one FP64 all-reduce
        v, s = both[0], both[1]
        if op.kind == OpKind.MEAN:
            v = v / n
            d = (TRAINER_BOUND_SLACK * (gamma(n) + 2 * U) / n) * s
        elif op.kind == OpKind.SUM:
            d = (TRAINER_BOUND_SLACK * gamma(n)) * s
        else:
            d = (TRAINER_BOUND_SLACK * gamma(n)) * (s + n * _SUBNORMAL)
        return self._round(op, ins if lead else ins[:2], v, d)

    def _round(self, op: OpNode, ins: list[torch.Tensor], v: torch.Tensor, d: torch.Tensor):
        what = f"{op.kind.name} op {op.id}"
        r = v.to(torch.float32)
        bad = ~torch.isfinite(r)
        if bool(bad.any()) and (bool(torch.isnan(r[bad]).any()) or not bool(torch.isfinite(v[bad]).all())):
            _check_finite(r.reshape(-1), what)
        # an FP32 overflow of a finite v (next to 2^128 - 2^103) is a candidate, decided on e below
        # (canonical._overflows_to_decide): RN32(e) or NonFiniteValue, the same on every rank
        out = canonical(r).reshape(-1).clone()
        mask = torch.zeros(out.numel(), dtype=torch.int32)
        mask[candidates(v, d)] = 1
        cand = self.combiner.all_reduce_max(mask).nonzero().reshape(-1)  # every rank's candidates
        if cand.numel() == 0:
            return out.reshape(r.shape), OpLog.empty(), 0
        rows, _ = _terms(op, ins, cand)  # this shard's exact terms of each candidate [C, n_r]
        rows = self._gather_rows(rows)
        try:
            bits, codes, slow = decide_rows(op.kind, rows)
        except NonFiniteValue as e:
            raise NonFiniteValue(f"{what}: expected finite values, got NaN/Inf ({e})") from None
        vals = torch.from_numpy(bits.numpy().astype(np.uint32).view(np.float32).copy())
        out[cand] = canonical(vals)
        _check_finite(out, what)  # every overflow was a candidate, now RN32(e)
        keep = codes != int(Code.NONE)
        idx = cand[keep]
        code = codes[keep].to(torch.uint8)
        value = torch.where(code == int(Code.EXPLICIT), out[idx], torch.zeros((), dtype=torch.float32))
        entries = OpLog(idx.numpy().astype(np.int64), code.numpy(), value.numpy().astype(np.float32))
        return out.reshape(r.shape), entries, slow

    def _gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """All ranks' term rows side by side (rank order: the global order of the terms)."""
        width = torch.tensor([rows.shape[1]], dtype=torch.int64)
        widths = [int(w) for w in self.combiner.all_gather(width)]
        pad = torch.zeros(rows.shape[0], max(widths), dtype=torch.float64)
        pad[:, : rows.shape[1]] = rows
        parts = self.combiner.all_gather(pad)
        return torch.cat([p[:, :w] for p, w in zip(parts, widths, strict=True)], dim=1)

    # -- the step's log ------------------------------------------------------------------------------
    def global_log(self, step_log: StepLog) -> StepLog:
        """The whole batch's log: the sharded ops' entries of every rank at their global indices,
        merged in index order; replicated ops' entries are the same on every rank (kept as they are)."""
        mine: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for op_id, entries in step_log.sparse.items():
            p = self.plan.placement[op_id]
            if p is None or not len(entries):
                continue
            shape = self.plan.graph.ops[op_id].shape
            local = self.plan.local_shape(shape, p, self.shard)
            multi = list(np.unravel_index(entries.index, local))
            multi[p.axis] = multi[p.axis] + self.shard.start * p.block
            mine[op_id] = (np.ravel_multi_index(tuple(multi), shape).astype(np.int64), entries.code, entries.value)
        everyone = self.combiner.all_gather_object(mine)
        out = StepLog(step_log.mode)
        for op_id, entries in step_log.sparse.items():
            if self.plan.placement[op_id] is None:
                out.sparse[op_id] = entries
        merged: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        for part in everyone:
            for op_id, t in (part or {}).items():
                merged.setdefault(op_id, []).append(t)
        for op_id, parts in merged.items():
            idx = np.concatenate([p[0] for p in parts])
            order = np.argsort(idx, kind="stable")
            out.sparse[op_id] = OpLog(
                idx[order], np.concatenate([p[1] for p in parts])[order], np.concatenate([p[2] for p in parts])[order]
            )
        out.sparse = dict(sorted(out.sparse.items()))
        return out


def agree(step: int, state_root: bytes, log_bytes: bytes, combiner: Combiner) -> None:
    """Every rank's sha256 of (state root, log bytes) must equal rank 0's; else :class:`RanksDisagree`
    naming the step and the ranks that differ (raised on every rank, so all of them stop)."""
    h = hashlib.sha256(state_root + log_bytes).digest()
    out = combiner.all_gather(torch.frombuffer(bytearray(h), dtype=torch.uint8))
    ref = bytes(out[0].tolist())
    bad = [r for r, t in enumerate(out) if bytes(t.tolist()) != ref]
    if bad:
        raise RanksDisagree(
            f"step {step}: ranks {bad} disagree with rank 0 on the state root and rounding log "
            f"(rank 0 sha256 {ref.hex()[:16]}...); training stopped"
        )
