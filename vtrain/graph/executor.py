"""Runs one step of a :class:`~vtrain.graph.step_graph.Graph` under a numerics mode.

Trainer: computes each op in FP64, rounds to FP32 and writes the rounding log.
Auditor: computes each op on its own hardware and applies the trainer's log, which reproduces the
trainer's FP32 outputs bit for bit (``docs/numerics.md``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from vtrain.errors import CorruptLog, GraphError, NonFiniteValue, VtrainError
from vtrain.graph.buffers import BufferPool
from vtrain.graph.generated import generated_output
from vtrain.graph.step_graph import (
    GENERATED_KINDS,
    LOGGING_KINDS,
    ROUNDING_KINDS,
    Graph,
    OpKind,
    OpNode,
    bits_f32,
)
from vtrain.numerics import fp32_native, native, native_filter, native_gemm, native_replay
from vtrain.numerics.canonical import (
    SUBNORMAL_F32,
    MatmulPlan,
    ReplayMatmul,
    grid_elements,
    matmul_plan,
    norm_bound_factor,
    replay_matmul_norm,
    replay_sum_values,
    round_canonical,
    round_canonical_matmul,
    round_canonical_sum,
    sum_bound_factor,
    tight_bound_at,
)
from vtrain.numerics.paper import apply_paper, hooked_ops, round_paper
from vtrain.numerics.rounding import (
    NO_ENTRIES,
    TRAINER_BOUND_SLACK,
    DenseLog,
    LogViolation,
    Mode,
    OpLog,
    RoundingStats,
    U,
    _check_finite,
    all_finite,
    apply_log,
    canonical,
    finite_probe,
    gamma,
    round_output,
    upholds_rn32_entries,
)
from vtrain.numerics.scratch import Scratch

log = logging.getLogger(__name__)


@dataclass
class StepLog:
    """The rounding log of one step: sparse entries per op (certified) or dense trits (paper)."""

    mode: Mode
    sparse: dict[int, OpLog] = field(default_factory=dict)
    dense: dict[int, DenseLog] = field(default_factory=dict)

    def entries(self, op: int) -> OpLog:
        return self.sparse.get(op) or NO_ENTRIES  # (read-only, shared)

    @property
    def n_entries(self) -> int:
        return sum(len(v) for v in self.sparse.values())


@dataclass
class StepResult:
    """What one executed step produced."""

    state: list[torch.Tensor]
    loss: float
    log: StepLog
    stats: RoundingStats
    trace: list[torch.Tensor] | None = None
    violations: list[tuple[int, LogViolation]] = field(default_factory=list)


class StepExecutor:
    """Executes a graph step by step; one instance per (graph, mode, device).

    ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a :class:`torch.device`; default CPU) is where
    the FP64 compute runs. The rounding rule and the log do not depend on it (docs/numerics.md,
    "Devices"): a log written on one device replays on another. ``run`` takes and returns the
    state, trace and log on the CPU.
    """

    def __init__(
        self,
        graph: Graph,
        mode: Mode | str = Mode.CERTIFIED,
        device: str | torch.device | None = None,
        *,
        seed: bytes | None = None,
        canonical_log: bool = True,
        collective=None,
    ) -> None:
        """``canonical_log`` (certified trainer): decide every near-tie on the exact value, so the output
        and the log do not depend on this machine's FP64 results (:mod:`vtrain.numerics.canonical`);
        False keeps the per-``v`` rule of :func:`round_output` (benchmarks compare the two).

        ``collective`` (data-parallel trainer, :class:`vtrain.distributed.collective.Collective`): the
        graph is one rank's shard; ``collective.inputs(op, ins)`` cuts replicated inputs to the shard and
        the ops in ``collective.reductions`` are combined across ranks by ``collective.reduce(op, ins)``.

        ``seed``: the job's 32-byte data seed (DROPOUT_MASK hashes it)."""
        self.graph = graph
        self.mode = Mode(mode)
        self.seed = seed
        self._step: int | None = None
        self.canonical_log = canonical_log
        if collective is not None and (self.mode != Mode.CERTIFIED or not canonical_log):
            raise VtrainError(f"data-parallel training needs the certified mode's canonical log, got {self.mode.value}")
        self.collective = collective
        if self.mode == Mode.FP32:
            raise VtrainError("fp32 is plain torch training: use vtrain.torch_ref.executor_for(job, 'fp32')")
        self.device = resolve_device(device)
        if self.device.type == "cpu":
            pin_malloc_thresholds()
        # large buffers (FP64 operands and products, outputs, the optimizer's new state) recycled
        # across ops and steps instead of fresh pages each time (VTRAIN_BUFFER_POOL=0: torch.empty)
        self.buffers = BufferPool(enabled=self.device.type == "cpu" and os.environ.get("VTRAIN_BUFFER_POOL") != "0")
        self._big = self.buffers.min_bytes if self.buffers.enabled else math.inf  # (smaller: no pool, no overhead)
        self._scratch = Scratch()  # the MATMUL and SUM kernels' index buffer, reused call after call
        # a small MATMUL's FP64 products in one native call into reused buffers (valid until the next)
        self._gemm = native_gemm.Products()
        self._last_use = self._compute_last_use()
        self._fp32_exact = FP32_EXACT_CPU_KINDS if self.device.type == "cpu" else FP32_EXACT_KINDS
        self._hooked = set(hooked_ops(graph)) if self.mode == Mode.PAPER else set()
        self._consts = {i: torch.from_numpy(np.ascontiguousarray(c)).to(self.device) for i, c in graph.consts.items()}
        self._scalars = {
            op.id: torch.tensor(bits_f32(op.attrs[0]), dtype=torch.float32, device=self.device)
            for op in graph.ops
            if op.kind in _SCALAR_KINDS
        }
        self._plan = self._make_plan()
        self._what = [f"{op.kind.name} op {op.id}" for op in graph.ops]  # (how errors name an op)

    def _make_plan(self) -> list[_PlanStep]:
        """Per op, once (:class:`_PlanStep`), so that the step loop does little per op. Classes:
        ``_PLAN_MOVE`` (exact data movement; a PERMUTE's :class:`fp32_native.PermutePlan` where the
        tiled transpose applies), ``_PLAN_INPUT`` (a state slot, inline in the step loop),
        ``_PLAN_MATMUL`` / ``_PLAN_SUM`` (MATMUL; SUM, MEAN: the canonical certified trainer's, straight
        to :meth:`_rounded_sum` in a step without ``log_in``), ``_PLAN_RESHAPE`` (RESHAPE/OUTPUT: a view, handled
        inline by the step loop), ``_PLAN_SAME`` (a RESHAPE/OUTPUT to its input's own shape: the input
        passed on as it is, inline), ``_PLAN_SLICE`` (the :func:`_move` of a SLICE, inline, from
        ``args``), ``_PLAN_BROADCAST`` (an EXPAND read only by native FP32 kernels: a broadcast view
        where the loop allows, else a copy), ``_PLAN_CONCAT`` / ``_PLAN_PARTS`` (a CONCAT; one read
        only by CONCATs),
        ``_PLAN_EXACT`` (a single FP32 operation, :func:`compute_exact_fp32`; native operands
        ``(code, scalar first, scalar)`` when the C kernel applies), ``_PLAN_SQRT`` (SQRT in one
        native pass, the FP64 path's bits: :func:`fp32_native.sqrt`), ``_PLAN_OP`` (the rest,
        :meth:`_run_op`). ``recycle``: the freed inputs whose buffers later native ops may reuse."""
        g, last = self.graph, self._last_use
        exact_modes = self.mode in (Mode.CERTIFIED, Mode.ROUND_NOLOG)
        native = self.device.type == "cpu" and fp32_native.available()
        reductions = self.collective.reductions if self.collective is not None else set()
        # the canonical trainer's MATMUL/SUM/MEAN (a step without log_in): :meth:`_rounded_sum`
        trainer_canonical = self.mode == Mode.CERTIFIED and self.canonical_log and self.collective is None
        broadcast_readers = set(_NATIVE_FP32) & self._fp32_exact  # kernels that read any strides
        consumers: list[set[OpKind]] = [set() for _ in g.ops]
        for op in g.ops:
            for i in op.inputs:
                consumers[i].add(op.kind)
        plan = []
        for op in g.ops:
            k = op.kind
            nat = None
            args: tuple = ()
            if k == OpKind.INPUT and self.collective is None:
                cls = _PLAN_INPUT
            elif op.id in reductions or k in _SOURCE_KINDS:
                cls = _PLAN_OP
            elif k in _ROUNDED_SUMS and trainer_canonical:
                cls = _PLAN_MATMUL if k == OpKind.MATMUL else _PLAN_SUM
                if k == OpKind.MATMUL and self.device.type == "cpu":  # (the native epilogue's sizes, once)
                    args = (matmul_plan([g.ops[i].shape for i in op.inputs]),)
            elif k == OpKind.CONCAT and consumers[op.id] == {OpKind.CONCAT} and op.id != g.loss_op:
                cls = _PLAN_PARTS
            elif k == OpKind.CONCAT:
                cls = _PLAN_CONCAT
            elif k in (OpKind.RESHAPE, OpKind.OUTPUT):
                # to the input's own shape: the input passed on as it is (a reshape to it is a view of it)
                cls = _PLAN_SAME if tuple(g.ops[op.inputs[0]].shape) == tuple(op.shape) else _PLAN_RESHAPE
            elif k == OpKind.SLICE:
                axis, start = op.attrs
                cls, args = _PLAN_SLICE, (axis, start, op.shape[axis])
            elif k == OpKind.EXPAND and native and exact_modes and consumers[op.id] <= broadcast_readers:
                cls = _PLAN_BROADCAST  # read in place by the native kernels (stride 0): no copy
            elif k not in ROUNDING_KINDS:
                cls = _PLAN_MOVE
                if k == OpKind.PERMUTE and native:  # the tiled transpose's sizes, once
                    nat = fp32_native.permute_plan(g.ops[op.inputs[0]].shape, tuple(op.attrs))
            elif k == OpKind.SQRT and exact_modes and native:
                cls, nat = _PLAN_SQRT, ()
            elif k in self._fp32_exact and exact_modes:
                cls = _PLAN_EXACT
                if native:
                    code, scalar_first = _NATIVE_FP32[k]
                    nat = (code, scalar_first, self._scalars.get(op.id))
            else:
                cls = _PLAN_OP
            frees = tuple(sorted({i for i in op.inputs if last[i] == op.id and i != g.loss_op}))
            slot = op.attrs[0] if k == OpKind.OUTPUT else -1
            plan.append([op, cls, tuple(op.inputs), frees, slot, nat, (), args])
        # Large native outputs read only by ops that never alias an input into their output are
        # recycled at their last use (fresh buffers of many MB cost a page fault per 4 KiB).
        recyclable = {
            entry[0].id
            for entry in plan
            if entry[1] in (_PLAN_EXACT, _PLAN_SQRT) and entry[5] is not None
            and math.prod(entry[0].shape) >= _RECYCLE_MIN
            and entry[0].id != g.loss_op and consumers[entry[0].id] and consumers[entry[0].id] <= _NON_ALIASING
        }
        groups = self._fused_groups(plan, reductions)
        # ops on the direct FP32 path (fused or broadcast-read): a replay whose log has an entry on one
        # takes that op's FP64 path (and flags it), so it runs them one by one, without views
        self._native_ids = frozenset(entry[0].id for entry in plan if entry[1] in (_PLAN_EXACT, _PLAN_SQRT))
        # the fused loop runs a group at its last member: every input of a member lives until then
        at = {m: grp.members[-1] for grp in groups for m in grp.members}
        last_f = list(range(g.n_ops))
        for op in g.ops:
            p = at.get(op.id, op.id)
            for i in op.inputs:
                last_f[i] = max(last_f[i], p)
        runs_at = {grp.members[-1]: grp for grp in groups}
        steps = []
        for entry in plan:
            op = entry[0]
            grp = runs_at.get(op.id)
            if op.id in at and grp is None:
                ffrees: tuple[int, ...] = ()
                group: _FusedGroup | None = _FUSED_MEMBER
            elif grp is not None:
                inner = set(grp.members)
                ffrees = tuple(sorted({
                    i for m in grp.members for i in g.ops[m].inputs
                    if i not in inner and last_f[i] == op.id and i != g.loss_op
                }))
                group = grp
            else:
                ffrees = tuple(sorted({i for i in op.inputs if last_f[i] == op.id and i != g.loss_op}))
                group = None
            steps.append(_PlanStep(
                *entry[:6], tuple(i for i in entry[3] if i in recyclable),
                group, ffrees, tuple(i for i in ffrees if i in recyclable), entry[7],
            ))
        split = self._slice_splits()
        return [st._replace(args=split[st.op.id]) if st.op.id in split else st for st in steps]

    def _slice_splits(self) -> dict[int, tuple]:
        """SLICE op -> ``(axis, start, length, key, piece, bounds, last)`` where two or more SLICEs read one
        value along one axis without overlapping (the flat optimizer's state, cut into its slots): the
        step loop cuts that value once (``tensor_split`` at ``bounds``: the same views as each SLICE's
        ``narrow``), each SLICE takes its ``piece``; ``last``: the last of them in graph order (drops them)."""
        g = self.graph
        by: dict[tuple[int, int], list[OpNode]] = {}
        for op in g.ops:
            if op.kind == OpKind.SLICE:
                by.setdefault((op.inputs[0], op.attrs[0]), []).append(op)
        out: dict[int, tuple] = {}
        for (i, axis), ops in by.items():
            if len(ops) < 2:
                continue
            spans = sorted((op.attrs[1], op.attrs[1] + op.shape[axis]) for op in ops)
            if any(end > nxt for (_, end), (nxt, _) in zip(spans, spans[1:])):
                continue  # (overlapping slices: each its own narrow)
            size = g.ops[i].shape[axis]
            bounds = sorted({x for span in spans for x in span} - {0, size})
            full = [0, *bounds, size]
            for op in ops:
                start = op.attrs[1]
                out[op.id] = (axis, start, op.shape[axis], i, full.index(start), tuple(bounds), op is ops[-1])
        return out

    def _fused_groups(self, plan: list[list], reductions) -> list[_FusedGroup]:
        """Chains of native FP32-exact ops (and SQRT) of one shape, run in one native pass by the fused
        step loop (:class:`fp32_native.Chain`: each op's bits, the inner values never written out).
        An operand is a value of the same shape or a single element; a group's values read by other
        ops are read only after its last member (it runs there), else the group is not fused."""
        g = self.graph
        cls_of = {entry[0].id: entry[1] for entry in plan}
        nat_of = {entry[0].id: entry[5] for entry in plan}
        users: list[list[int]] = [[] for _ in g.ops]
        for op in g.ops:
            for i in op.inputs:
                users[i].append(op.id)

        def fusable(op: OpNode) -> bool:
            cls = cls_of[op.id]
            if op.id in reductions or not (cls == _PLAN_SQRT or (cls == _PLAN_EXACT and nat_of[op.id] is not None)):
                return False
            if math.prod(op.shape) < 2:
                return False
            return all(fp32_native.broadcast_kind(self._source_shape(i, cls_of), op.shape) for i in op.inputs)

        # Greedy in graph order: an op joins the groups of its same-shape fusable operands when no value
        # of the merged group is read by an op outside it before this op (where the group would run).
        group_of: dict[int, int] = {}  # member -> group key
        members: dict[int, list[int]] = {}
        for op in g.ops:
            if not fusable(op):
                continue
            m = op.id
            keys = sorted({group_of[j] for j in op.inputs if j in group_of and g.ops[j].shape == op.shape})
            merged = sorted({x for key in keys for x in members[key]} | {m})
            inside = set(merged)
            if keys and any(u not in inside and u < m for x in merged for u in users[x]):
                keys, merged = [], [m]  # m starts a group of its own (its operands are read as outputs)
            for key in keys:
                del members[key]
            members[m] = merged
            for x in merged:
                group_of[x] = m
        return [self._fused_group(ms, users, cls_of) for ms in members.values() if len(ms) >= 2]

    def _source_shape(self, i: int, cls_of: dict[int, int]) -> tuple[int, ...]:
        """The shape of the tensor behind value ``i`` in the fused loop (an EXPAND there is a view)."""
        op = self.graph.ops[i]
        return self.graph.ops[op.inputs[0]].shape if cls_of[i] == _PLAN_BROADCAST else op.shape

    def _fused_group(self, ms: list[int], users: list[list[int]], cls_of: dict[int, int]) -> _FusedGroup:
        g = self.graph
        inner = set(ms)
        ext: list[int] = []
        consts: list[torch.Tensor] = []
        reg: dict[int, int] = {}  # member id -> step register (numbered after every input)
        operands: list[tuple[int, tuple]] = []
        for m in ms:
            op = g.ops[m]
            nat = self._plan_native(op)
            if op.kind == OpKind.SQRT:
                code, srcs = fp32_native.SQRT, (("v", op.inputs[0]),)
            else:
                code, scalar_first, c = nat
                if c is None:
                    srcs = (("v", op.inputs[0]), ("v", op.inputs[1]))
                else:
                    srcs = (("c", op.id), ("v", op.inputs[0])) if scalar_first else (("v", op.inputs[0]), ("c", op.id))
            for what, i in srcs:
                if what == "v" and i not in inner and i not in ext:
                    ext.append(i)
            operands.append((code, srcs))
        shape = g.ops[ms[0]].shape
        kinds = []
        for i in ext:
            src = self._source_shape(i, cls_of)
            kind, param = fp32_native.broadcast_kind(src, shape)  # type: ignore[misc]
            kinds.append((src, kind, param))
        const_reg: dict[int, int] = {}
        for m in ms:
            if m in self._scalars and g.ops[m].kind != OpKind.SQRT and self._plan_native(g.ops[m])[2] is not None:
                const_reg[m] = len(ext) + len(consts)
                consts.append(self._scalars[m].reshape(()))
                kinds.append(((), fp32_native.SCALAR, 1))
        n_inputs = len(ext) + len(consts)
        for k, m in enumerate(ms):
            reg[m] = n_inputs + k
        steps = []
        for code, srcs in operands:
            regs = [reg[i] if what == "v" and i in inner else ext.index(i) if what == "v" else const_reg[i]
                    for what, i in srcs]
            steps.append((code, regs[0], regs[1] if len(regs) > 1 else 0))
        outs = [m for m in ms if m == g.loss_op or any(u not in inner for u in users[m])]
        chain = fp32_native.Chain(shape, kinds, steps, [reg[m] for m in outs], consts=tuple(consts))
        return _FusedGroup(tuple(ms), tuple(ext), tuple(consts), tuple(outs), chain, shape, chain.numel * len(ms))

    def _plan_native(self, op: OpNode) -> tuple | None:
        if op.kind == OpKind.SQRT:
            return ()
        code, scalar_first = _NATIVE_FP32[op.kind]
        return (code, scalar_first, self._scalars.get(op.id))

    def _compute_last_use(self) -> list[int]:
        last = list(range(self.graph.n_ops))
        for op in self.graph.ops:
            for i in op.inputs:
                last[i] = max(last[i], op.id)
        return last

    def run(
        self,
        state: list[torch.Tensor],
        data: torch.Tensor,
        log_in: StepLog | None = None,
        keep_trace: bool = False,
        resolver_factory=None,
        check: bool = False,
        step: int | None = None,
        op_hook=None,
    ) -> StepResult:
        """Run one step. With ``log_in`` it replays (auditor); without, it trains and logs (trainer).

        ``check`` makes the replay report every log entry it finds inconsistent (possible abuse)
        and every unlogged near-tie; ``resolver_factory(op, inputs)`` may settle those exactly.
        ``op_hook(op, inputs, out, log)`` (trainer only) may edit an op's output and the step's log: it is
        how tests and demos play a cheating trainer, never used by the honest path.

        NaN/Inf: every op output is checked. On the plain paths (no hook, no check, no resolver)
        the checks are folded into one per step (each op's min and max, ``finite_probe``); if one is
        not finite (or anything else fails), the step is run again op by op with eager checks, so the
        error names the first bad op exactly as before.
        """
        g = self.graph
        if len(state) != len(g.slots):
            raise VtrainError(f"state: expected {len(g.slots)} tensors, got {len(state)}")
        f32 = torch.float32
        for i, (t, s) in enumerate(zip(state, g.slots, strict=False)):
            if t.shape != s.shape or t.dtype is not f32:  # (torch.Size is a tuple)
                raise VtrainError(
                    f"state slot {i} ({s.name}): expected float32{s.shape}, got {t.dtype}{tuple(t.shape)}"
                )
        if tuple(data.shape) != g.data_shape:
            raise VtrainError(f"data: expected shape {g.data_shape}, got {tuple(data.shape)}")
        replay = log_in is not None
        if replay and log_in.mode != self.mode:
            raise VtrainError(f"log mode: expected {self.mode.value}, got {log_in.mode.value}")
        deferred = op_hook is None and not check and resolver_factory is None
        if deferred:
            try:
                res = self._run(state, data, log_in, keep_trace, None, False, step, None, deferred=True)
            except VtrainError:
                res = None
            if res is not None:
                return res
        return self._run(state, data, log_in, keep_trace, resolver_factory, check, step, op_hook, deferred=False)

    def _run(
        self, state, data, log_in, keep_trace, resolver_factory, check, step, op_hook, deferred
    ) -> StepResult | None:
        g = self.graph
        dev = self.device
        native.set_threads(torch.get_num_threads())  # the native kernels use torch's threads (never at once)
        if dev.type == "cpu":  # (Tensor.to returns a CPU tensor itself: the same, without its ~1 us per slot)
            state = [t if t.is_cpu else t.to(dev) for t in state]
        else:
            state = [t.to(dev) for t in state]
        data = data.to(dev)
        out_log = StepLog(self.mode)
        stats = RoundingStats()
        vals: list[torch.Tensor | None] = [None] * g.n_ops
        trace: list[torch.Tensor] | None = [] if keep_trace else None
        violations: list[tuple[int, LogViolation]] = []
        new_state: list[torch.Tensor | None] = [None] * len(g.slots)
        where = f"step {step}" if step is not None else "step"
        sums: list[torch.Tensor] | None = [] if deferred else None
        self._step = step  # read by STEP and DROPOUT_MASK ops
        collective = self.collective
        # ops whose replay applies log entries: never on the direct FP32 path
        logged = {i for i, e in log_in.sparse.items() if len(e)} if log_in is not None else ()
        # A CONCAT feeding only CONCATs passes its parts on (a list) instead of copying them twice.
        parts = trace is None and op_hook is None and collective is None
        pool: dict[int, list[torch.Tensor]] | None = (  # recycled buffers by element count
            {} if parts and resolver_factory is None and not check else None
        )
        # An EXPAND read only by native FP32 kernels is passed on as a broadcast view, except where a
        # caller sees the values (trace, hook) or a replay takes one of its consumers' FP64 path (an
        # entry on a direct-FP32 op: only a tampered log has one).
        direct = log_in is None or not any(i in self._native_ids for i in logged)
        views = trace is None and op_hook is None and collective is None and direct
        # The fused loop (steps and replays, plain and checked): chains of FP32-exact ops run as one
        # native pass each (:meth:`_fused_groups`); a NaN/Inf there makes a deferred run's caller rerun
        # eagerly, and an eager run reruns that group op by op, which names the op.
        fused = views
        permute_planned = fp32_native.permute_planned
        pooled, big = self.buffers.empty, self._big  # (large PERMUTE outputs from the buffer pool)
        cuts: dict[int, tuple[torch.Tensor, ...]] = {}  # a value cut by its SLICEs: the pieces
        for op, cls, inputs, frees, slot, nat, recycle, group, ffrees, frecycle, args in self._plan:
            if fused and group is not None:
                if group is _FUSED_MEMBER:
                    continue
                self._run_group(group, vals, stats, sums, pool, where)
                frees, recycle = ffrees, frecycle
                for i in frees:
                    t, vals[i] = vals[i], None
                    if pool is not None and i in recycle and sys.getrefcount(t) == 2:
                        pool.setdefault(t.numel(), []).append(t)
                t = None
                continue
            if fused:
                frees, recycle = ffrees, frecycle
            if cls == _PLAN_INPUT and op_hook is None and trace is None:
                vals[op.id] = state[op.attrs[0]]
                continue
            if cls in _INLINE_MOVES and collective is None:  # (inputs never recycled; nothing to catch)
                a = vals[inputs[0]]
                if cls == _PLAN_SAME and op_hook is None:  # (a hook's output may have any shape)
                    out = a
                elif cls == _PLAN_RESHAPE or cls == _PLAN_SAME:
                    out = a.reshape(op.shape)
                elif cls == _PLAN_SLICE:  # (_move's SLICE)
                    if len(args) == 3 or op_hook is not None:
                        out = a.narrow(*args[:3])
                    else:  # (one of the SLICEs that cut one value: :meth:`_slice_splits`)
                        axis, _, _, key, piece, bounds, last = args
                        pieces = cuts.pop(key, None) if last else cuts.get(key)
                        if pieces is None:
                            pieces = a.tensor_split(bounds, dim=axis)
                            if not last:
                                cuts[key] = pieces
                        out = pieces[piece]
                    if not out.is_contiguous():
                        out = out.contiguous()
                else:
                    out = None if nat is None else permute_planned(a, nat, pooled if a.numel() * 4 >= big else None)
                    if out is None:
                        out = _move(op, [vals[i] for i in inputs])
                if op_hook is not None:
                    out = op_hook(op, [vals[i] for i in inputs], out, out_log)
                vals[op.id] = out
                if trace is not None:
                    trace.append(out)
                else:
                    for i in frees:
                        vals[i] = None
                if slot >= 0:
                    new_state[slot] = out
                continue
            ins = [vals[i] for i in inputs]
            if collective is not None:
                ins = collective.inputs(op, ins)
            try:
                if cls == _PLAN_BROADCAST and views:
                    out = ins[0].expand(op.shape)
                elif cls in _INLINE_MOVES or cls == _PLAN_BROADCAST:  # (a collective's: its inputs cut)
                    out = _move(op, ins)
                elif cls == _PLAN_CONCAT or (cls == _PLAN_PARTS and not parts):
                    out = concat_flat(_flat_parts(ins), self.buffers.empty)
                elif cls == _PLAN_PARTS:
                    out = _flat_parts(ins)
                elif cls == _PLAN_MATMUL and log_in is None:
                    out = self._rounded_matmul(op, ins, out_log, stats, *args)
                elif cls == _PLAN_SUM and log_in is None:
                    out = self._rounded_sum(op, ins, out_log, stats, sums)
                elif cls == _PLAN_EXACT and op.id not in logged:
                    out = self._exact_fp32(op, ins, nat, stats, sums, pool)
                else:
                    out = self._sqrt_fp32(op, ins, stats, pool) if cls == _PLAN_SQRT and op.id not in logged else None
                    if out is None:
                        out = self._run_op(
                            op, ins, state, data, log_in, out_log, stats, resolver_factory, check, violations, sums
                        )
            except NonFiniteValue as e:
                raise NonFiniteValue(f"{where}, op {op.id} ({op.kind.name} {op.name}): {e}", op=op.id) from None
            except CorruptLog as e:
                raise CorruptLog(f"{where}, op {op.id} ({op.kind.name}): {e}") from None
            if op_hook is not None:
                out = op_hook(op, ins, out, out_log)
            vals[op.id] = out
            if trace is not None:
                trace.append(out)
            else:
                ins = None
                for i in frees:
                    t, vals[i] = vals[i], None
                    # only a buffer nothing else holds (the local name and getrefcount's argument)
                    if pool is not None and i in recycle and sys.getrefcount(t) == 2:
                        pool.setdefault(t.numel(), []).append(t)
                t = None
            if slot >= 0:
                new_state[slot] = out
        self.buffers.retire()  # (the buffers this step did not take again)
        if sums is not None and sums and not bool(torch.isfinite(torch.stack(sums)).all()):
            return None  # a NaN/Inf somewhere: the eager rerun names the op
        loss_t = vals[g.loss_op] if vals[g.loss_op] is not None else trace[g.loss_op]  # type: ignore[index]
        if any(s is None for s in new_state):
            raise GraphError("graph does not write every state slot")
        if dev.type != "cpu":
            new_state = [t.cpu() for t in new_state]  # type: ignore[union-attr]
            if trace is not None:
                trace = [t.cpu() for t in trace]
        return StepResult(new_state, float(loss_t.reshape(-1)[0]), out_log, stats, trace, violations)  # type: ignore[arg-type]

    # -- one op -----------------------------------------------------------------------------------
    def _run_group(
        self, group: _FusedGroup, vals: list, stats: RoundingStats, sums: list | None, pool, where: str = "step"
    ) -> None:
        """A fused group (:meth:`_fused_groups`): its outputs into ``vals``; where the chain kernel
        does not take an input (not contiguous), or finds a NaN/Inf in an eager run (``sums`` None),
        its members one by one (the same bits; their NaN/Inf probes into the step's ``sums``, or the
        first one raises naming its op as the unfused loop does)."""
        ins = [vals[i] for i in group.inputs]
        got = group.chain(ins, self._empty_for(group.chain.numel, 4))  # (the scalars are bound to the chain)
        if got is not None:
            outs, finite = got
            if finite:
                stats.values += group.values
                for i, t in zip(group.outputs, outs):
                    vals[i] = t
                return
            if sums is not None:  # the caller's eager rerun names the op
                what = f"fused ops {group.members[0]}..{group.members[-1]}"
                raise NonFiniteValue(f"{what}: expected finite values, got NaN/Inf")
        local = dict(zip(group.inputs, ins, strict=True))
        for m in group.members:
            op = self.graph.ops[m]
            mins = [local[i] for i in op.inputs]
            try:
                out = self._sqrt_fp32(op, mins, stats, pool) if op.kind == OpKind.SQRT else None
                if out is None and op.kind == OpKind.SQRT:
                    out = self._run_op(op, mins, None, None, None, StepLog(self.mode), stats, None, False, [], sums)
                elif out is None:
                    out = self._exact_fp32(op, mins, self._plan_native(op), stats, sums, pool)
            except NonFiniteValue as e:
                raise NonFiniteValue(f"{where}, op {op.id} ({op.kind.name} {op.name}): {e}", op=op.id) from None
            local[m] = out
        for i in group.outputs:
            vals[i] = local[i]

    def _exact_fp32(self, op, ins, nat, stats, sums, pool=None) -> torch.Tensor:
        """A single FP32 add/sub/mul/div (FP32-exact: its FP32 result is RN32 of the exact value) with
        canonical zeros; NaN/Inf raises :class:`NonFiniteValue` (eager) or is probed (``sums``).
        ``pool``: dead buffers by element count, the native kernel may write into one."""
        if nat is not None:
            code, scalar_first, c = nat
            a, b = (ins[0], ins[1]) if c is None else ((c, ins[0]) if scalar_first else (ins[0], c))
            free = pool.get(math.prod(op.shape)) if pool else None
            got = fp32_native.binary(code, a, b, op.shape, out=free.pop() if free else None)
            if got is not None:
                out, finite = got
                stats.values += out.numel()
                if not finite:  # the deferred run's caller reruns eagerly, which raises the same
                    raise NonFiniteValue(f"{op.kind.name} op {op.id}: expected finite values, got NaN/Inf")
                return out
        out = compute_exact_fp32(op, ins, self._scalars.get(op.id))
        stats.values += out.numel()
        if sums is None:
            if not all_finite(out):
                raise NonFiniteValue(f"{op.kind.name} op {op.id}: expected finite values, got NaN/Inf")
        else:
            sums.extend(finite_probe(out))
        return out.add_(0.0)  # canonical zero, in place on the fresh output

    def _sqrt_fp32(self, op, ins, stats, pool=None) -> torch.Tensor | None:
        """SQRT in one native pass with the FP64 path's bits (:func:`fp32_native.sqrt`); None when the
        kernel does not apply (the caller takes the FP64 path)."""
        free = pool.get(math.prod(op.shape)) if pool else None
        got = fp32_native.sqrt(ins[0], out=free.pop() if free else None)
        if got is None:
            return None
        out, finite = got
        stats.values += out.numel()
        if not finite:  # the FP64 path's error, naming the first bad element
            _check_finite(out.reshape(-1), f"{op.kind.name} op {op.id}")
        return out

    @staticmethod
    def _log_entries(op: OpNode, entries: OpLog, out_log: StepLog, stats: RoundingStats) -> None:
        if len(entries):
            out_log.sparse[op.id] = entries
            stats.logged += len(entries)
            stats.explicit += _explicit_count(entries)
            stats.per_op[op.id] = len(entries)

    def _run_op(
        self, op, ins, state, data, log_in, out_log, stats, resolver_factory, check, violations, sums=None
    ) -> torch.Tensor:
        """One op; with ``sums`` (a list) the NaN/Inf check is deferred: its min and max are appended."""
        k = op.kind
        if k == OpKind.INPUT:
            return state[op.attrs[0]]
        if k == OpKind.DATA:
            return canonical(data.to(torch.float32))
        if k == OpKind.CONST:
            return self._consts[op.id]
        if k in GENERATED_KINDS:
            return generated_output(op, self.seed, self._step).to(self.device)
        if self.collective is not None and op.id in self.collective.reductions and log_in is None:
            out, entries, slow = self.collective.reduce(op, ins)
            stats.values += out.numel()
            stats.ambiguous_resolved += slow
            if len(entries):
                out_log.sparse[op.id] = entries
                stats.logged += len(entries)
                stats.explicit += _explicit_count(entries)
                stats.per_op[op.id] = len(entries)
            return out
        if k not in ROUNDING_KINDS:
            return _move(op, ins)
        eager = sums is None
        if k in self._fp32_exact and self.mode in (Mode.CERTIFIED, Mode.ROUND_NOLOG):
            if log_in is None or not len(log_in.entries(op.id)):
                out = compute_exact_fp32(op, ins, self._scalars.get(op.id))
                stats.values += out.numel()
                if eager:
                    if not all_finite(out):
                        raise NonFiniteValue(f"{op.kind.name} op {op.id}: expected finite values, got NaN/Inf")
                else:
                    sums.extend(finite_probe(out))
                return out.add_(0.0)  # canonical zero, in place on the fresh output
        plain_replay = log_in is not None and not check and resolver_factory is None
        if self.mode in (Mode.ROUND_NOLOG, Mode.PAPER) or plain_replay:
            bound_kind = "none"  # the bound is never read (a replay reads it only to check entries)
        elif log_in is None and self.canonical_log:
            bound_kind = "norm"  # only selects candidates for exact decisions (round_canonical)
        elif log_in is not None and k == OpKind.MATMUL:
            bound_kind = "norm"  # checked replay: filters; apply_log's tight bound of the exact terms decides
        else:
            bound_kind = "tight"
        what = f"{op.kind.name} op {op.id}"
        if bound_kind == "norm" and log_in is None and k in (OpKind.SUM, OpKind.MEAN) and self.mode == Mode.CERTIFIED:
            got = round_canonical_sum(self.graph, op, ins, what, self._scratch)  # (one native call)
            if got is not None:
                out, entries, slow = got
                stats.values += out.numel()
                stats.ambiguous_resolved += slow
                self._log_entries(op, entries, out_log, stats)
                return out
        if bound_kind == "norm" and log_in is None and k == OpKind.MATMUL and self.mode == Mode.CERTIFIED:
            out, entries, slow = self._canonical_matmul(op, ins, what)
            stats.values += out.numel()
            stats.ambiguous_resolved += slow
            self._log_entries(op, entries, out_log, stats)
            return out
        if bound_kind == "norm" and log_in is not None and self.mode == Mode.CERTIFIED:
            # checked replay of a MATMUL: norm bound, filter and min(d_norm, d') at the points in one native call
            got_mm = self._replay_matmul(op, ins, log_in, self._replay_mode(resolver_factory, check))
            if got_mm is not None:
                v, (d_mm, filtered, near, settled) = got_mm
                stats.values += v.numel()
                if settled:
                    return self._replay_clean(filtered[0])
                kind = "points" if isinstance(d_mm, native_filter.PointBound) else "norm"
                return self._replay_op(op, ins, v, d_mm, log_in, resolver_factory, check, violations, sums, kind,
                                       filtered=filtered, near=near)
        checked_sum = bound_kind == "tight" and log_in is not None and k in (OpKind.SUM, OpKind.MEAN)
        if checked_sum and self.mode == Mode.CERTIFIED:
            # checked replay: v, d and the filter in one native pass (the trainer's sums)
            got_sum = replay_sum_values(op, ins, log_in.sparse.get(op.id), self._replay_mode(resolver_factory, check))
            if got_sum is not None:
                stats.values += got_sum.v.numel()
                if got_sum.settled:
                    return self._replay_clean(got_sum.filtered[0])
                return self._replay_op(op, ins, got_sum.v, got_sum.d, log_in, resolver_factory, check, violations,
                                       sums, bound_kind, filtered=got_sum.filtered, exact=got_sum.exact,
                                       near=got_sum.near)
        # a MATMUL whose bound is never read (a plain replay, round-nolog, paper): its FP64 products in one
        # native call where small (read below within this op: the buffers are the next MATMUL's)
        v = self._gemm(ins[0], ins[1]) if k == OpKind.MATMUL and bound_kind == "none" and ins[0].is_cpu else None
        if v is not None:
            d = None
            if len(ins) == 3:
                v.add_(ins[2].double())  # (_compute_fp64's bias add)
        else:  # every consumer below takes a lazy bound; EXP/LOG/TANH/ERF in place in a pooled FP64 copy
            v, d = _compute_fp64(op, ins, bound_kind, lazy=True,
                                 widen=self._widen if ins[0].is_cpu and ins[0].numel() * 8 >= self._big else None)
        stats.values += v.numel()
        if self.mode == Mode.ROUND_NOLOG or (self.mode == Mode.PAPER and op.id not in self._hooked):
            # the paper does not log weight gradients or the optimizer
            out, _ = round_output(v, None, what, check_finite=True if eager else sums)
            return out
        if self.mode == Mode.PAPER:
            if log_in is None:
                out, dense = round_paper(v)
                out_log.dense[op.id] = dense
                stats.logged += int((dense.trits != 1).sum())
                return out
            dense_in = log_in.dense.get(op.id)
            if dense_in is None:
                raise CorruptLog(f"paper log has no decisions for op {op.id}")
            return apply_paper(v, dense_in)
        # certified
        bound = d if k in LOGGING_KINDS else None
        if log_in is None:
            if bound is not None and self.canonical_log:
                out, entries, slow = round_canonical(self.graph, op, ins, v, bound, what)
                stats.ambiguous_resolved += slow
            else:
                floor = tight_floor(op) if bound is not None else None
                out, entries = round_output(v, bound, what, directed_floor=floor, check_finite=True if eager else sums)
            self._log_entries(op, entries, out_log, stats)
            return out
        return self._replay_op(op, ins, v, bound, log_in, resolver_factory, check, violations, sums, bound_kind)

    def _rounded_sum(self, op: OpNode, ins: list[torch.Tensor], out_log: StepLog, stats: RoundingStats,
                     sums: list | None) -> torch.Tensor:
        """The canonical certified trainer's MATMUL, SUM or MEAN (the plan's ``_PLAN_MATMUL`` and
        ``_PLAN_SUM`` in a step without ``log_in``): :meth:`_run_op`'s branch for it, without the
        dispatch that leads there."""
        what = self._what[op.id]
        if op.kind == OpKind.MATMUL:
            out, entries, slow = self._canonical_matmul(op, ins, what)
        else:
            got = round_canonical_sum(self.graph, op, ins, what, self._scratch)  # (one native call)
            if got is None:
                return self._run_op(op, ins, None, None, None, out_log, stats, None, False, [], sums)
            out, entries, slow = got
        return self._counted(op, out, entries, slow, out_log, stats)

    def _counted(self, op: OpNode, out: torch.Tensor, entries: OpLog, slow: int, out_log: StepLog,
                 stats: RoundingStats) -> torch.Tensor:
        """``out``, its values, near-ties resolved and log ``entries`` counted into ``stats`` and ``out_log``."""
        stats.values += out.numel()
        stats.ambiguous_resolved += slow
        if len(entries):
            self._log_entries(op, entries, out_log, stats)
        return out

    def _rounded_matmul(
        self, op: OpNode, ins: list[torch.Tensor], out_log: StepLog, stats: RoundingStats,
        plan: MatmulPlan | None = None,
    ) -> torch.Tensor:
        """:meth:`_rounded_sum` of a MATMUL (the plan's ``_PLAN_MATMUL`` in a step without ``log_in``;
        ``plan``: :func:`matmul_plan` of its operands' shapes, where the plan has one)."""
        out, entries, slow = self._canonical_matmul(op, ins, self._what[op.id], plan)
        return self._counted(op, out, entries, slow, out_log, stats)

    def _canonical_matmul(
        self, op: OpNode, ins: list[torch.Tensor], what: str, plan: MatmulPlan | None = None
    ) -> tuple[torch.Tensor, OpLog, int]:
        """The canonical trainer's MATMUL under the norm bound: the FP64 products, then the bias add,
        norms, filter and decisions in one native call (:func:`round_canonical_matmul`) where it takes
        the tensors, else :func:`_norm_bound` and :func:`round_canonical` (the same bits)."""
        v = self._products(ins)
        got = round_canonical_matmul(self.graph, op, ins, v, what, plan, self._empty_for(v.numel(), 4), self._scratch)
        if got is None:
            x = [t.double() for t in ins]
            got = round_canonical(self.graph, op, ins, v, _norm_bound(x, v, True, ins), what)
        return got

    def _widen(self, t: torch.Tensor) -> torch.Tensor:
        """``t.double()`` (the same values), into a pooled buffer where it is large (on the CPU)."""
        if t.numel() * 8 < self._big or not t.is_cpu:
            return t.double()
        return self.buffers.empty(t.shape, torch.float64).copy_(t)

    def _products(self, ins: list[torch.Tensor]) -> torch.Tensor:
        """A MATMUL's FP64 products ``A.double() @ B.double().transpose(-1, -2)`` of its FP32 operands
        ``ins[:2]`` (``[..., M, K]``, ``[..., N, K]``): from one native call into reused buffers where
        :class:`native_gemm.Products` takes them (small, on the CPU: valid until the next MATMUL), else
        torch's, its FP64 copies and output from the buffer pool where they are large."""
        v = self._gemm(ins[0], ins[1]) if ins[0].is_cpu else None
        if v is not None:
            return v
        a, b = self._widen(ins[0]), self._widen(ins[1])
        if (a.numel() // a.shape[-1]) * b.shape[-2] * 8 < self._big or not a.is_cpu:  # (at least the output's size)
            return torch.matmul(a, b.transpose(-1, -2))
        shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-2])
        return torch.matmul(a, b.transpose(-1, -2), out=self.buffers.empty(shape, torch.float64))

    def _empty_for(self, numel: int, itemsize: int) -> fp32_native.Empty | None:
        """The pool's ``empty`` for an output of ``numel`` items, None (plain ``torch.empty``) if small."""
        return self.buffers.empty if numel * itemsize >= self._big else None

    def _replay_matmul(
        self, op: OpNode, ins: list[torch.Tensor], log_in: StepLog, mode: int
    ) -> tuple[torch.Tensor, ReplayMatmul] | None:
        """The checked replay's MATMUL under the norm bound: the FP64 products, then the bias add, norms,
        filter, the bound at the candidates and entries and, as ``mode`` allows (:meth:`_replay_mode`),
        the settlement of the op with its entries in one native call
        (:func:`vtrain.numerics.canonical.replay_matmul_norm`); None where the kernel does not take the tensors (the
        caller's :func:`_compute_fp64` path, the same bits).

        *Why every MATMUL (no FP32* ``|A| @ |B|`` *GEMM any more).* The checks read
        ``d = min(d_norm, d')`` at the candidates of ``d_norm`` and at the entries, where before MATMULs
        below ``2^24`` multiply-adds read the FP32 ``d32 = 1.01 g(n) (fl32(|A| @ |B|) + n 2^-149)``.
        ``d_norm >= g(n) S`` (Cauchy-Schwarz, the norms' rounding covered) and ``d' >= g(n) S`` (``fl(S)``
        an FP64 sum of the exact ``|t_k|``, within ``g(n)`` relative), and ``Dc <= 1.5 d`` for each
        (docs/numerics.md), so ``d`` is a valid bound like ``d32``: every guarantee of the checks holds
        for it. Accept/reject is unchanged: (1) the replay's output does not depend on ``d`` at all
        where no resolver runs (``RN32(v')``, entries applied by their codes; ``d`` only selects flags);
        (2) with the auditor's resolver every applied entry is checked against ``RN32(e)`` whether
        flagged or not, every flagged element gets the contract's value, and an unflagged unlogged element
        has no midpoint within ``2d`` of ``v'`` while ``|v' - e| <= d``, so ``RN32(v') = RN32(e)``: the
        replayed state is a function of the exact values alone, the same under ``d32`` and ``d``, so an
        honest log replays to the same state (never rejected) and a wrong output is found as before
        (never accepted). Only which honest near-ties are *reported* can move, inside the sliver between
        ``2 d32`` and ``2 d`` (``d'`` and ``d32`` differ by the FP32 rounding of ``S``; ``d <= d'``);
        the resolver upholds those. ``tests/test_replay_bound.py``: honest replays flag nothing, a
        doctored entry where the norm bound is loose is flagged and overruled, the kernel's bits are the
        lazy path's."""
        v = self._products(ins)
        got = replay_matmul_norm(ins, v, log_in.entries(op.id), mode)
        if got is None:
            return None
        return v, got

    @staticmethod
    def _replay_mode(resolver_factory, check: bool) -> int:
        """How far a checked replay's native pass may settle a MATMUL/SUM/MEAN by itself, returning its
        output without :meth:`_replay_op` (``native_replay``'s modes): where ``_replay_op`` would return
        that output unchanged, with no violation, no overruled element and every resolver call upholding.

        - ``CANDIDATES`` (any resolver): an op without entries whose pass found every ``RN32(v)`` finite
          and no suspect candidate (none near a midpoint at ``2 min(d, d')``, the test
          ``rounding._apply_log_checked`` reads, unless the exact-grid rule clears it): the resolver,
          called only with a suspect or an entry, is not;
        - ``ENTRIES`` (checks, no resolver): also an op with entries, each well formed (in range, sorted,
          unique, codes 1-3), not far or wild, with a finite value, and no unlogged suspect: no violation;
        - ``VERDICTS`` (a resolver factory that ``rounding.upholds_rn32_entries``, as the auditor's): as
          ``ENTRIES``, and each applied value ``RN32(e)`` by the double-double verdict (not -0): the
          resolver, whose every call there would have no flagged key, upholds each unchanged.

        Anything else takes :meth:`_replay_op` (the full path, unchanged): its violations, resolver calls
        and overruled elements as before. Tests compare the two (``tests/test_replay_settled.py``)."""
        if resolver_factory is None:
            return native_replay.ENTRIES if check else native_replay.CANDIDATES
        return native_replay.VERDICTS if upholds_rn32_entries(resolver_factory) else native_replay.CANDIDATES

    @staticmethod
    def _replay_clean(r: torch.Tensor) -> torch.Tensor:
        """A checked replay's MATMUL/SUM/MEAN that its native pass settled (:meth:`_replay_mode`):
        :meth:`_replay_op` would return ``r`` as it is, so it is returned here without building the
        resolver, the bound readers and the checks (most ops of an honest step). A pass settles an op
        only where every value of ``r`` is finite (``csrc/numerics/replay.c``): no NaN/Inf probe."""
        return r

    def _replay_op(
        self, op, ins, v, bound, log_in, resolver_factory, check, violations, sums, bound_kind, filtered=None,
        exact=None, near=None,
    ) -> torch.Tensor:
        """The certified replay of one rounding op from its FP64 ``v`` and bound (None: exact op);
        ``filtered``: the native filter's pass where the caller made it (``rounding.apply_log``), with
        ``near``, its candidates' near-tie flags where it made them; ``exact``: :func:`grid_elements`
        of the op where the caller has it (read at candidates)."""
        k = op.kind
        what = f"{op.kind.name} op {op.id}"
        eager = sums is None
        entries = log_in.entries(op.id)
        if resolver_factory is None and not check and not len(entries) and native_filter.usable(v):
            r, finite = native_filter.round_fp32(v)  # a plain replay's op without entries: apply_log's RN32(v)
            if finite:  # (else apply_log again: it names the op, or a deferred run's probe catches it)
                return r
        viol: list[LogViolation] | None = [] if check else None
        resolver = None
        if resolver_factory is not None:
            resolver = resolver_factory(op, [t.cpu() for t in ins] if self.device.type != "cpu" else ins)
        given, exact, tight = exact, None, None
        if (resolver is not None or viol is not None) and k in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
            exact = given or partial(grid_elements, op, ins)  # exact-grid sums: no entry, and none is due
            if bound_kind == "points":  # computed at the candidates and entries with the bound (the same bits)
                exact = bound.grid_at
            if bound_kind == "norm":  # d filters; the checks read min(d, d') at candidates and entries
                tight = partial(tight_bound_at, op, ins)
        out = apply_log(v, bound, entries, what, resolver, viol, check_finite=eager, exact=exact, tight=tight,
                        filtered=filtered, near=near)
        if not eager:
            sums.extend(finite_probe(out))
        if viol:
            violations.extend((op.id, x) for x in viol)
        return out


def _explicit_count(entries: OpLog) -> int:
    """How many of ``entries`` are explicit (code 3); one C-level count over the uint8 codes (a numpy
    comparison and sum cost ten times more on the handful of entries an op has)."""
    code = entries.code
    return code.tobytes().count(3) if code.dtype == np.uint8 else int((code == 3).sum())


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The torch device to compute on; a clear error when CUDA is asked for and not there."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise VtrainError(f"device: expected cpu or cuda[:N], got {device!r} ({e})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise VtrainError(
                f"device {device}: CUDA is not available here (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda or 'none'}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise VtrainError(f"device {device}: expected an index below {torch.cuda.device_count()}")
        # The trainer's sum|t| is an FP32 GEMM; TF32 would only loosen it, but keep it plain FP32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif dev.type != "cpu":
        raise VtrainError(f"device: expected cpu or cuda[:N], got {device!r}")
    return dev


_MALLOC_PINNED = False
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MALLOC_MMAP_THRESHOLD = 32 << 20
"""glibc's ceiling for its dynamic mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``)."""


def pin_malloc_thresholds() -> bool:
    """Pin glibc malloc's dynamic thresholds at the values they grow to by themselves (mmap above 32
    MiB, trim the heap top above 64 MiB), once per process; True where this process runs glibc and
    they are set (``VTRAIN_MALLOC_PIN=0``: leave them alone).

    A certified CPU step makes and frees many tensors of a few hundred KiB (FP64 copies, products,
    outputs). Until glibc has freed one mmapped chunk of 32 MiB its trim threshold stays at twice the
    largest freed so far, so the heap top is handed back to the kernel and taken again within every
    step: on the small GPT about 500 page faults per step, each page cleared by the kernel (about 6%
    of the step's CPU time; plain FP32 training has none). Pinned, freed memory stays in the heap (at
    most 64 MiB of free heap top is kept), as it does once the process has freed one 32 MiB tensor (a
    large model does so in its first step); the peak RSS may grow by that much (a 4-layer GPT of
    width 256, context 128: 715 -> 749 MiB). No value depends on it."""
    global _MALLOC_PINNED
    if _MALLOC_PINNED or os.environ.get("VTRAIN_MALLOC_PIN", "1") == "0" or not sys.platform.startswith("linux"):
        return _MALLOC_PINNED
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # (setting one disables glibc's dynamic adjustment of both: set both)
    ok = mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, 2 * MALLOC_MMAP_THRESHOLD) == 1 and ok
    _MALLOC_PINNED = ok
    log.debug("glibc malloc thresholds pinned: %s", ok)
    return ok


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads counted once); at least 1."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for c in cpus:
        try:
            base = f"/sys/devices/system/cpu/cpu{c}/topology/"
            with open(base + "physical_package_id") as f1, open(base + "core_id") as f2:
                cores.add((f1.read().strip(), f2.read().strip()))
        except OSError:
            cores.add(("?", str(c)))
    return max(1, len(cores))


def set_threads(n: int | None) -> int:
    """Use ``n`` compute threads in this process (default: :func:`physical_cores`); returns ``n``.

    Sets torch's intra-op pool to ``n`` (torch passes it on to OpenMP and MKL, so the BLAS
    uses the same ``n`` threads, not its own pool on top) and its inter-op pool to 1 (the executor
    runs one op at a time). Thread counts never change a bit of a certified or paper run
    (reduction order is covered by the bound); they only change speed. On a shared machine pass
    the cores you may use: more threads than free cores make every parallel kernel wait for the
    slowest thread (the OpenMP variables ``OMP_NUM_THREADS``/``OMP_WAIT_POLICY=PASSIVE`` for child
    processes are the caller's business).
    """
    if n is None:
        n = physical_cores()
    if n < 1:
        raise VtrainError(f"threads: expected a positive count, got {n}")
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already started: keep what is there
        pass
    return n


_SCALAR_KINDS = frozenset({OpKind.ADD_S, OpKind.MUL_S, OpKind.RSUB_S, OpKind.DIV_S})
_SOURCE_KINDS = frozenset({OpKind.INPUT, OpKind.DATA, OpKind.CONST}) | GENERATED_KINDS
_ROUNDED_SUMS = frozenset({OpKind.MATMUL, OpKind.SUM, OpKind.MEAN})


@dataclass(frozen=True)
class _FusedGroup:
    """A chain of FP32-exact ops run in one native pass by the fused step loop
    (:meth:`StepExecutor._fused_groups`): ``members`` in graph order, ``inputs`` the values it reads
    (then ``consts``, the ops' scalars), ``outputs`` the members read by other ops (or the loss)."""

    members: tuple[int, ...]
    inputs: tuple[int, ...]
    consts: tuple[torch.Tensor, ...]
    outputs: tuple[int, ...]
    chain: fp32_native.Chain
    shape: tuple[int, ...]
    values: int = 0
    """The values the group rounds (each member's elements), for the step's stats."""


_FUSED_MEMBER = _FusedGroup((), (), (), (), None, ())  # type: ignore[arg-type]
"""The plan's mark of a fused group's member other than its last (where the group runs)."""


class _PlanStep(NamedTuple):
    """What the step loop needs of one op (:meth:`StepExecutor._make_plan`). ``group``, ``ffrees``
    and ``frecycle``: the fused loop's (its group, or :data:`_FUSED_MEMBER`; its frees and recycles);
    ``args``: the op's arguments worked out once (a SLICE's ``(axis, start, length)``, with
    :meth:`StepExecutor._slice_splits`' where it is one of several cutting a value; a MATMUL's
    ``(canonical.matmul_plan,)`` on the CPU)."""

    op: OpNode
    cls: int
    inputs: tuple[int, ...]
    frees: tuple[int, ...]
    slot: int
    native: tuple | None
    recycle: tuple[int, ...]
    group: _FusedGroup | None = None
    ffrees: tuple[int, ...] = ()
    frecycle: tuple[int, ...] = ()
    args: tuple = ()


_RECYCLE_MIN = 1 << 20
"""Elements (4 MiB) from which a dead native output's buffer is reused within the step."""
_NON_ALIASING = ROUNDING_KINDS
"""Consumers that never keep an input or a view of it (every rounding op writes a fresh tensor)."""
(_PLAN_OP, _PLAN_MOVE, _PLAN_EXACT, _PLAN_CONCAT, _PLAN_PARTS, _PLAN_SQRT, _PLAN_RESHAPE, _PLAN_BROADCAST,
 _PLAN_INPUT, _PLAN_MATMUL, _PLAN_SUM, _PLAN_SLICE, _PLAN_SAME) = range(13)
_INLINE_MOVES = frozenset({_PLAN_SAME, _PLAN_RESHAPE, _PLAN_SLICE, _PLAN_MOVE})
"""Plan classes run inline by the step loop (exact: no log, no NaN/Inf check, nothing recycled)."""


def _flat_parts(ins: list) -> list[torch.Tensor]:
    """A CONCAT's inputs as the pieces of its output, in order (an input may be the parts list of an
    inner CONCAT): tensors of any shape, each standing for its elements in order (:func:`concat_flat`)."""
    out: list[torch.Tensor] = []
    for t in ins:
        if isinstance(t, list):
            out.extend(t)
        else:
            out.append(t)
    return out


def concat_flat(parts: list[torch.Tensor], empty: fp32_native.Empty | None = None) -> torch.Tensor:
    """``torch.cat`` of the flattened ``parts`` (each stands for its elements in order), or, where they
    lie back to back in one buffer, that range of the buffer as a view (the same values, no copy). The
    flat optimizer's state comes back from a step as SLICE views of its update's flat outputs, so the
    next step's CONCATs of parameters and state find their parts in order: three copies of the whole
    state a step saved (a CONCAT's output is never recycled or written in place by the step loop, so
    the alias is only read). Back to back: each part contiguous, of the first's dtype, starting where
    the one before ends, the first and the last in one storage (so is every byte between them).
    ``empty(shape, dtype)`` makes the output of a copy (a buffer pool's) where the parts are CPU
    tensors of one dtype."""
    full = [t for t in parts if t.numel()]  # (an empty part has no address)
    if len(full) > 1:
        first, last = full[0], full[-1]
        at, size, dtype = first.data_ptr(), first.element_size(), first.dtype
        for t in full:
            if t.data_ptr() != at or t.dtype != dtype or not t.is_contiguous():
                return _cat(parts, empty)
            at += t.numel() * size
        if last.device != first.device or last.untyped_storage().data_ptr() != first.untyped_storage().data_ptr():
            return _cat(parts, empty)
        return first.as_strided(((at - first.data_ptr()) // size,), (1,))
    return _cat(parts, empty)


def _cat(parts: list[torch.Tensor], empty: fp32_native.Empty | None) -> torch.Tensor:
    """``torch.cat`` of the flattened ``parts``, into ``empty``'s buffer where they are CPU tensors of one dtype."""
    flat = [t.reshape(-1) for t in parts]
    if empty is not None and flat and all(t.is_cpu and t.dtype == flat[0].dtype for t in flat):
        return torch.cat(flat, out=empty((sum(t.numel() for t in flat),), flat[0].dtype))
    return torch.cat(flat)



# kind -> (vt_fp32_binary code, whether the scalar is the first operand)
_NATIVE_FP32 = {
    OpKind.ADD: (fp32_native.ADD, False),
    OpKind.SUB: (fp32_native.SUB, False),
    OpKind.MUL: (fp32_native.MUL, False),
    OpKind.DIV: (fp32_native.DIV, False),
    OpKind.ADD_S: (fp32_native.ADD, False),
    OpKind.MUL_S: (fp32_native.MUL, False),
    OpKind.DIV_S: (fp32_native.DIV, False),
    OpKind.RSUB_S: (fp32_native.SUB, True),
}


FP32_EXACT_KINDS = frozenset({OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.ADD_S, OpKind.MUL_S, OpKind.RSUB_S})
"""Single IEEE ops that FP32 hardware already rounds correctly: one FP32 operation gives exactly
RN32(exact), the same bits as FP64-then-round, on every IEEE machine (no FMA contraction of one
operation; denormals are not flushed in torch by default)."""

FP32_EXACT_CPU_KINDS = FP32_EXACT_KINDS | {OpKind.DIV, OpKind.DIV_S}
"""On the CPU also DIV and DIV_S: torch's FP32 CPU division is the IEEE (correctly rounded) vector
division, and FP64-then-round gives the same bits because 53 >= 2*24 + 2 (double rounding is
innocuous for division, Figueroa 1995); tests/test_numerics.py checks both on hard cases. Not on
CUDA, where torch may divide by a scalar as a multiplication by its reciprocal. SQRT stays on the
FP64 path everywhere: torch's FP32 CPU sqrt goes through MKL VML, which is not correctly rounded
(124 of 20,000 random values differ from RN32(sqrt))."""


def compute_exact_fp32(op: OpNode, ins: list[torch.Tensor], scalar: torch.Tensor | None = None) -> torch.Tensor:
    """RN32 of a single add/sub/mul/div (or scalar form) computed directly in FP32.

    ``scalar``: the op's FP32 constant as a 0-dim tensor on the inputs' device (cached by the
    executor); built from ``op.attrs`` when not given."""
    k = op.kind
    if k == OpKind.ADD:
        return torch.add(ins[0], ins[1])
    if k == OpKind.SUB:
        return torch.sub(ins[0], ins[1])
    if k == OpKind.MUL:
        return torch.mul(ins[0], ins[1])
    if k == OpKind.DIV:
        return torch.div(ins[0], ins[1])
    c = scalar if scalar is not None else torch.tensor(bits_f32(op.attrs[0]), dtype=torch.float32, device=ins[0].device)
    if k == OpKind.DIV_S:
        return torch.div(ins[0], c)
    if k == OpKind.ADD_S:
        return torch.add(ins[0], c)
    if k == OpKind.MUL_S:
        return torch.mul(ins[0], c)
    if k == OpKind.RSUB_S:
        return torch.sub(c, ins[0])
    raise GraphError(f"{k.name} has no direct FP32 form")


def _move(op: OpNode, ins: list[torch.Tensor]) -> torch.Tensor:
    """Exact ops: data movement, max, relu, one-hot, gather (FP32 in, FP32 out, no rounding)."""
    k = op.kind
    a = ins[0]
    if k in (OpKind.OUTPUT, OpKind.RESHAPE):
        return a.reshape(op.shape)
    if k == OpKind.PERMUTE:
        out = fp32_native.permute(a, op.attrs)  # a tiled transpose where it is one (torch's is slower)
        if out is not None:
            return out
        return a.permute(*op.attrs).contiguous()
    if k == OpKind.SLICE:
        axis, start = op.attrs
        return a.narrow(axis, start, op.shape[axis]).contiguous()
    if k == OpKind.PAD:
        axis, start = op.attrs
        out = torch.zeros(op.shape, dtype=a.dtype, device=a.device)
        out.narrow(axis, start, a.shape[axis]).copy_(a)
        return out
    if k == OpKind.EXPAND:
        return a.expand(op.shape).contiguous()
    if k == OpKind.CONCAT:
        return torch.cat([t.reshape(-1) for t in ins])
    if k == OpKind.MAX:
        return a.amax(dim=-1, keepdim=True)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    if k == OpKind.RELU:
        return torch.where(a > 0, a, zero)
    if k == OpKind.RELU_GRAD:
        return torch.where(a > 0, ins[1], torch.zeros((), dtype=ins[1].dtype, device=a.device))
    if k == OpKind.ONE_HOT:
        classes = torch.arange(op.attrs[0], dtype=a.dtype, device=a.device)
        return (a.unsqueeze(-1) == classes).to(a.dtype)
    if k == OpKind.GATHER:
        x, idx = ins
        n = x.shape[-1]
        valid = (idx >= 0) & (idx < n) & (idx == torch.floor(idx))
        safe = torch.where(valid, idx, torch.zeros((), dtype=idx.dtype, device=idx.device)).to(torch.int64)
        got = x.gather(-1, safe)
        return torch.where(valid, got, torch.zeros((), dtype=x.dtype, device=x.device))
    if k == OpKind.TAKE:
        x, idx = ins
        axis = op.attrs[0]
        n = x.shape[axis]
        valid = (idx >= 0) & (idx < n) & (idx == torch.floor(idx))
        safe = torch.where(valid, idx, torch.zeros((), dtype=idx.dtype, device=idx.device)).to(torch.int64)
        got = x.index_select(axis, safe.reshape(-1)).reshape(op.shape)
        keep = valid.reshape((1,) * axis + tuple(idx.shape) + (1,) * (x.dim() - axis - 1))
        return torch.where(keep, got, torch.zeros((), dtype=x.dtype, device=x.device))
    if k == OpKind.SELECT:
        cond, x, y = ins
        return torch.where(cond != 0, x, y).expand(op.shape).contiguous()
    if k == OpKind.MAX_GRAD:
        x, gr = ins
        hit = x == x.amax(dim=-1, keepdim=True)
        first = hit & (torch.cumsum(hit.to(torch.int32), dim=-1) == 1)
        return torch.where(first, gr, torch.zeros((), dtype=gr.dtype, device=gr.device))
    raise GraphError(f"{k.name} is not a data-movement op")


_TIGHT_FLOOR = 2.0**-100


def tight_floor(op: OpNode) -> float | None:
    """Elements with ``d`` above this are tight (:func:`bound_is_tight`); None: all of them."""
    if op.kind != OpKind.MATMUL:
        return None
    return _TIGHT_FLOOR * gamma(2)


def bound_is_tight(op: OpNode, d: torch.Tensor) -> torch.Tensor | None:
    """Elements whose trainer bound stays within 1.25x of the contract's (None: all of them)."""
    floor = tight_floor(op)
    return None if floor is None else d > floor


def _scalar(op: OpNode) -> float:
    return bits_f32(op.attrs[0])


def _compute_fp64(
    op: OpNode, ins: list[torch.Tensor], bound: str = "tight", lazy: bool = False,
    widen: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, native_filter.Bound | None]:
    """The FP64 value ``v`` of a rounding op and its certified bound ``d`` (None when exact).

    For MATMUL the FP32 evaluation of ``|A|@|B|`` may underflow; ``n * 2^-149`` covers that, and
    where it is not negligible the bound is no longer within 1.25x of the contract's, so those
    elements are marked by :func:`bound_is_tight` and never get a directed (down/up) entry.

    ``bound``: ``"tight"`` (the above: within 1.25x of the contract's, what a directed entry and the
    auditor's replay need), ``"norm"`` (MATMUL only: ``sum_k |a_k b_k| <= |a|_2 |b|_2``, Cauchy-Schwarz,
    from FP64 row norms: O(MK + NK + MN) instead of a second GEMM; a valid upper bound, only looser, for
    the canonical trainer, where ``d`` only selects the candidates it decides exactly) or ``"none"``
    (MATMUL, SUM, MEAN: ``d`` is not computed, for modes that never read it).

    ``lazy``: where the native filter takes ``v`` (``native_filter.usable``), the bounds of EXP/LOG/TANH/ERF,
    MATMUL, SUM and MEAN come back unmaterialized (``native_filter.RelativeBound``/``NormBound``/``TightBound``,
    the same bits wherever they are read); the consumers of ``d`` then must accept one.

    ``widen`` (the executor's pooled ``t.double()``): EXP/LOG/TANH/ERF take their input's FP64 copy
    from it and evaluate in place there (the same values: torch's in-place and out-of-place unary
    kernels are one kernel).
    """
    k = op.kind
    if k in _UNARY64:
        if widen is not None:
            x0 = widen(ins[0])
            v = exp64(x0, inplace=True) if k == OpKind.EXP else _UNARY64[k](x0)
        else:
            v = {OpKind.EXP: exp64, OpKind.LOG: torch.log, OpKind.TANH: torch.tanh, OpKind.ERF: torch.erf}[k](
                ins[0].double())
        c = (8.0 if k == OpKind.ERF else 4.0) * U  # libm allowance (docs/numerics.md): erf 8u, the others 4u
        if lazy and native_filter.usable(v):
            return v, native_filter.RelativeBound(v, c)
        return v, c * v.abs()
    x = [t.double() for t in ins]
    if k == OpKind.ADD:
        return x[0] + x[1], None
    if k == OpKind.SUB:
        return x[0] - x[1], None
    if k == OpKind.MUL:
        return x[0] * x[1], None
    if k == OpKind.DIV:
        return x[0] / x[1], None
    if k == OpKind.ADD_S:
        return x[0] + _scalar(op), None
    if k == OpKind.MUL_S:
        return x[0] * _scalar(op), None
    if k == OpKind.DIV_S:
        return x[0] / _scalar(op), None
    if k == OpKind.RSUB_S:
        return _scalar(op) - x[0], None
    if k == OpKind.SQRT:
        return torch.sqrt(x[0]), None
    if k == OpKind.MATMUL:
        v = torch.matmul(x[0], x[1].transpose(-1, -2))
        if bound == "none":
            return (v.add_(x[2]) if len(ins) == 3 else v), None
        if bound == "norm":
            return v, _norm_bound(x, v, lazy, ins)
        s = torch.matmul(ins[0].abs(), ins[1].abs().transpose(-1, -2))
        n = ins[0].shape[-1]
        if len(ins) == 3:  # in place on the fresh products (large fresh buffers cost page faults)
            v.add_(x[2])
            s.add_(ins[2].abs())
            n += 1
        if lazy and native_filter.usable(v):
            return v, native_filter.TightBound(s, n * SUBNORMAL_F32, TRAINER_BOUND_SLACK * gamma(n))
        return v, s.double().add_(n * SUBNORMAL_F32).mul_(TRAINER_BOUND_SLACK * gamma(n))
    if k in (OpKind.SUM, OpKind.MEAN):
        n = ins[0].shape[-1]
        v = x[0].sum(dim=-1, keepdim=True)
        if bound == "none":
            return (v if k == OpKind.SUM else v / n), None
        s = ins[0].abs().sum(dim=-1, keepdim=True)
        c = sum_bound_factor(k, n)
        v = v if k == OpKind.SUM else v / n
        if lazy and native_filter.usable(v):  # (fl64(s) + 0) * c: the same bits as c * fl64(s) (s >= 0)
            return v, native_filter.TightBound(s, 0.0, c)
        return v, c * s.double()
    raise GraphError(f"{k.name} is not a rounding op")


_EXP_ZERO = -746.0
"""At and below this ``exp`` is ``+0.0`` (the exact value is below ``2^-1076``, a quarter of the
smallest subnormal; RN32 of it is ``+0`` whatever the FP64 library returns there, and torch's
FP64 ``exp`` returns ``+0.0``: tested)."""


def exp64(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``torch.exp`` of an FP64 tensor, bit for bit, without its slow path on far-negative inputs (a
    causal mask's -1e9 makes torch's vectorised exp ~20x slower): those elements are ``+0.0``.
    ``inplace``: into ``x`` itself (a copy the caller owns)."""
    if x.requires_grad or x.numel() == 0 or float(x.amin()) > _EXP_ZERO:  # (a NaN minimum takes the masked path)
        return x.exp_() if inplace else torch.exp(x)  # (autograd: tests differentiate the FP64 graph through this)
    far = x <= _EXP_ZERO  # NaN compares False: it stays NaN
    if inplace:
        return x.masked_fill_(far, 0.0).exp_().masked_fill_(far, 0.0)
    return torch.exp(torch.where(far, 0.0, x)).masked_fill_(far, 0.0)


_UNARY64 = {OpKind.EXP: exp64, OpKind.LOG: torch.Tensor.log_, OpKind.TANH: torch.Tensor.tanh_,
            OpKind.ERF: torch.Tensor.erf_}
"""The transcendental kinds :func:`_compute_fp64` evaluates in place in a pooled FP64 copy."""


def _norm_bound(
    x: list[torch.Tensor], v: torch.Tensor, lazy: bool = False, ins: list[torch.Tensor] | None = None
) -> native_filter.Bound:
    """The trainer bound of an FP64 MATMUL (``v``, with the bias added here) from the smallest of the
    Cauchy-Schwarz bound ``|a_i|_2 |b_j|_2`` and Hoelder's ``|a_i|_1 |b_j|_inf`` and ``|a_i|_inf |b_j|_1``
    (each ``>= sum_k |t_k|``; ``+ |bias_j|``) of FP64 row norms of the FP32 inputs ``x``: squares of
    FP32 values are exact in FP64 and cannot underflow or overflow, a maximum is exact, the norms'
    sums, square root, product and bias add carry a relative error below ``(n + 4) 2^-53``, covered by
    the factor ``1 + (n + 4) 2^-52``. At least the tight bound of :func:`_compute_fp64`, elementwise.
    ``lazy`` (where the native filter takes ``v``): the same bound unmaterialized (``NormBound``).
    ``ins``: the FP32 inputs, where the norms are read from (the same bits, half the bytes)."""
    n = x[0].shape[-1]
    if lazy and native_filter.usable(v):
        if len(x) == 3:
            v.add_(x[2])
        m = n + (len(x) == 3)
        return native_filter.norm_bound(x, v, norm_bound_factor(m), m * SUBNORMAL_F32, ins)
    src = ins if ins is not None else x
    na = native_filter.row_norms(src[0])  # [..., M, 1]
    nb = native_filter.row_norms(src[1])  # [..., N, 1]
    a1, ai = native_filter.row_norms1inf(src[0])
    b1, bi = native_filter.row_norms1inf(src[1])
    s = native_filter.norm_products(na * nb.transpose(-1, -2), a1 * bi.transpose(-1, -2), ai * b1.transpose(-1, -2))
    if len(x) == 3:
        v.add_(x[2])
        s.add_(x[2].abs())
        n += 1
    return s.add_(n * SUBNORMAL_F32).mul_(norm_bound_factor(n))


def state_tensors(arrays: list[np.ndarray]) -> list[torch.Tensor]:
    """Float32 torch views of numpy state arrays (copying, canonical zeros)."""
    return [canonical(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).clone()) for a in arrays]
