"""Dishonest trainers for demos and tests. Each cheats once, at one step, in one way; the honest
auditor must catch every one of them and win the game."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from vtrain.errors import GraphError
from vtrain.graph.executor import StepLog, StepResult
from vtrain.graph.step_graph import Graph, OpKind, OpNode, bits_f32
from vtrain.numerics.rounding import Code, OpLog
from vtrain.training.loop import Cheat
from vtrain.training.spec import TrainSpec, build_job


@dataclass
class TamperWeight(Cheat):
    """Adds ``delta`` to one element of one state slot after step ``step``."""

    step: int
    slot: int = 0
    index: int = 0
    delta: float = 1e-3

    def after_step(self, step: int, result: StepResult) -> None:
        if step == self.step:  # a new tensor: the trace keeps the honest values it computed
            t = result.state[self.slot].clone()
            t.view(-1)[self.index] += self.delta
            result.state[self.slot] = t


@dataclass
class PoisonSample(Cheat):
    """Trains step ``step`` on a batch with one value changed (poisoned data)."""

    step: int
    row: int = 0
    col: int = 0
    delta: float = 0.5

    def data(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        if step != self.step:
            return batch
        b = batch.clone()
        b[self.row, self.col] += self.delta
        return b


@dataclass
class SkipStep(Cheat):
    """Does not train step ``step``: every state slot keeps its previous value."""

    step: int
    _inputs: dict[int, torch.Tensor] = field(default_factory=dict)

    def op_hook(self, step: int):
        if step != self.step:
            return None

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if op.kind == OpKind.INPUT:
                self._inputs[op.attrs[0]] = out
            if op.kind == OpKind.OUTPUT:
                return self._inputs[op.attrs[0]]
            return out

        return hook


@dataclass
class WrongLearningRate(Cheat):
    """Scales every update by ``factor`` at step ``step`` (a different learning rate than agreed)."""

    step: int
    lr: float
    factor: float = 2.0

    def op_hook(self, step: int):
        if step != self.step:
            return None
        lr_bits = int(np.array(self.lr, np.float32).view(np.uint32))

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if op.kind == OpKind.MUL_S and op.attrs[0] == lr_bits:
                return (ins[0].double() * (bits_f32(lr_bits) * self.factor)).to(torch.float32) + 0.0
            return out

        return hook


class _LogCheat(Cheat):
    """Edits one element of the first matmul without log entries at the cheating step, and writes
    the log entry that is meant to 'explain' the edit (subclasses say how)."""

    step: int
    element: int

    def edit(self, flat: torch.Tensor, log: StepLog, op: int) -> None:
        raise NotImplementedError

    def op_hook(self, step: int):
        if step != self.step:
            return None
        done: list[int] = []

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if done or op.kind != OpKind.MATMUL or len(log.sparse.get(op.id) or ()):
                return out
            done.append(op.id)
            flat = out.reshape(-1).clone()
            self.edit(flat, log, op.id)
            return flat.reshape(out.shape)

        return hook


@dataclass
class AbuseLog(_LogCheat):
    """Forces one rounding direction far from any midpoint: moves the element up by one ulp and
    logs an 'up' entry for it."""

    step: int
    element: int = 0

    def edit(self, flat: torch.Tensor, log: StepLog, op: int) -> None:
        flat[self.element] = torch.nextafter(flat[self.element], torch.tensor(np.inf, dtype=torch.float32))
        log.sparse[op] = OpLog(np.array([self.element]), np.array([Code.UP], np.uint8), np.zeros(1, np.float32))


@dataclass
class ForgeExplicit(_LogCheat):
    """Writes an explicit log entry with a value far outside the certified window."""

    step: int
    element: int = 0
    delta: float = 0.25

    def edit(self, flat: torch.Tensor, log: StepLog, op: int) -> None:
        flat[self.element] += self.delta
        value = flat[self.element : self.element + 1].numpy().copy()
        log.sparse[op] = OpLog(np.array([self.element]), np.array([Code.EXPLICIT], np.uint8), value)


class _EntryCheat(Cheat):
    """Changes one entry of the honest log at the cheating step, and the output element it settles,
    to the other FP32 value the contract's former rule (docs/numerics.md, "The contract's rule") also
    upheld: a choice of bits that never lost a dispute before every claim had to be ``RN32(e)``.
    Where the honest log has no such entry (an exact-grid tie is logged by nobody), it adds one at
    the first unlogged element where the old rule upheld another claim (:meth:`unlogged`).
    ``hit`` records ``(op, element, honest bits, cheating bits)``."""

    step: int
    codes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self.hit: tuple[int, int, int, int] | None = None

    def other(self, op: OpNode, ins: list[torch.Tensor], index: int, code: int, bits: int) -> tuple[int, int]:
        """``(code, bits)`` of the cheating entry and output."""
        raise NotImplementedError

    def admits(self, enc, honest: int) -> tuple[int, int] | None:
        """``(code, bits)`` of a cheating claim the old rule upheld at an unlogged element whose exact
        value has enclosure ``enc`` and honest output ``honest``; None if there is none."""
        raise NotImplementedError

    def unlogged(self, op: OpNode, ins: list[torch.Tensor], flat: torch.Tensor,
                 entries: OpLog) -> tuple[int, int, int] | None:
        """``(element, code, bits)`` of the first unlogged element of a bounded op (MATMUL, SUM,
        MEAN) where the old rule upheld a claim other than ``RN32(e)``: candidates are the elements
        within ``8d`` of a midpoint (FP64 ``v`` and bound ``d`` as the trainer computes them), each
        confirmed on its exact enclosure."""
        from vtrain.graph.executor import _compute_fp64
        from vtrain.numerics import exact
        from vtrain.numerics.rounding import midpoint_candidates

        if op.kind not in (OpKind.MATMUL, OpKind.SUM, OpKind.MEAN):
            return None
        v, d = _compute_fp64(op, [t.detach() for t in ins])
        if d is None:
            return None
        v, d = v.reshape(-1), torch.broadcast_to(d, v.shape).reshape(-1)
        near = midpoint_candidates(v, v.float(), 8 * d)
        if near is None:
            return None
        logged = set(entries.index.tolist())
        desc = exact.OpDesc(int(op.kind), tuple(op.inputs), tuple(op.shape),
                            tuple(tuple(t.shape) for t in ins), tuple(op.attrs))
        arrays = [t.detach().cpu().numpy() for t in ins]
        for i in near.reshape(-1).tolist()[:200]:
            if i in logged:
                continue
            enc = exact.enclosure(desc, arrays, int(i))
            if enc is None:
                continue
            found = self.admits(enc, int(np.float32(flat[i].item()).view(np.uint32)))
            if found is not None:
                return int(i), *found
        return None

    def op_hook(self, step: int):
        if step != self.step:
            return None

        done: list[int] = []  # per run of the step: the trainer reruns it to answer a dispute

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if done:
                return out
            entries = log.sparse.get(op.id) or OpLog.empty()
            ks = np.flatnonzero(np.isin(entries.code, self.codes))
            flat = out.reshape(-1).clone()
            if len(ks):  # an entry of the honest log to turn
                k, i = int(ks[0]), int(entries.index[ks[0]])
                honest = int(np.float32(flat[i].item()).view(np.uint32))
                code, bits = self.other(op, ins, i, int(entries.code[k]), honest)
            else:  # no such entry (the exact-grid rule logs none at grid ties): find an element
                found = self.unlogged(op, ins, flat, entries)
                if found is None:
                    return out
                i, code, bits = found
                honest = int(np.float32(flat[i].item()).view(np.uint32))
            flat[i] = torch.from_numpy(np.array([bits], np.uint32).view(np.float32))[0]
            value = np.array([bits], np.uint32).view(np.float32)[0] if code == Code.EXPLICIT else np.float32(0)
            keep = entries.index != i
            index = np.append(entries.index[keep], np.int64(i))
            order = np.argsort(index, kind="stable")
            log.sparse[op.id] = OpLog(index[order], np.append(entries.code[keep], np.uint8(code))[order],
                                      np.append(entries.value[keep], np.float32(value))[order])
            self.hit = (op.id, i, honest, bits)
            done.append(op.id)
            return flat.reshape(out.shape)

        return hook

    def after_step(self, step: int, result: StepResult) -> None:
        if step == self.step and self.hit is None:  # set by the step's first run
            raise GraphError(f"{type(self).__name__}: step {step}'s log has no entry with code in {self.codes}")


@dataclass
class WrongSide(_EntryCheat):
    """At the first near-tie the honest log settles by a side (a down/up entry), logs and outputs the
    other side: the neighbour across the same midpoint, so the entry's midpoint checks still hold."""

    step: int
    codes: tuple[int, ...] = (int(Code.DOWN), int(Code.UP))

    def other(self, op: OpNode, ins: list[torch.Tensor], index: int, code: int, bits: int) -> tuple[int, int]:
        from vtrain.numerics.exact import neighbour

        up = code == Code.DOWN  # a down entry outputs the lower value of the pair: move up
        return int(Code.UP if up else Code.DOWN), neighbour(bits, up)

    def admits(self, enc, honest: int) -> tuple[int, int] | None:
        from vtrain.numerics import exact

        lo, hi, dc = enc.bounds
        for up in (True, False):  # the neighbour across the midpoint above / below the honest value
            m, s = exact.midpoint(honest, up)
            if 16 * dc <= s and lo - 4 * dc <= m <= hi + 4 * dc:
                return int(Code.UP if up else Code.DOWN), exact.neighbour(honest, up)
        return None


@dataclass
class ShiftExplicit(_EntryCheat):
    """Stores and outputs, at the first explicit entry of the honest log, a neighbour of ``RN32(e)`` inside
    the former explicit window ``[RN32(lo - 4dc), RN32(hi + 4dc)]`` (the side that window reaches)."""

    step: int
    codes: tuple[int, ...] = (int(Code.EXPLICIT),)

    @staticmethod
    def of(spec: TrainSpec, step: int) -> ShiftExplicit:
        """The cheat on a model whose log has explicit entries: the GPT's (cancelling sums of the
        softmax and cross-entropy backward passes); the MLP's log has none."""
        if spec.model != "gpt":
            raise GraphError(f"shift-explicit: model {spec.model!r} logs no explicit entries (use --model gpt)")
        return ShiftExplicit(step)

    def other(self, op: OpNode, ins: list[torch.Tensor], index: int, code: int, bits: int) -> tuple[int, int]:
        from vtrain.numerics import exact

        desc = exact.OpDesc(int(op.kind), tuple(op.inputs), tuple(op.shape),
                            tuple(tuple(t.shape) for t in ins), tuple(op.attrs))
        enc = exact.enclosure(desc, [t.detach().cpu().numpy() for t in ins], index)
        if enc is None:
            raise GraphError(f"shift-explicit: op {op.id} element {index} has no enclosure")
        _, hi, dc = enc.bounds
        up = exact.to_ordered(exact.rn32(hi + 4 * dc, True)) > exact.to_ordered(bits)
        return int(Code.EXPLICIT), exact.neighbour(bits, up)

    def admits(self, enc, honest: int) -> tuple[int, int] | None:
        from vtrain.numerics import exact

        lo, hi, dc = enc.bounds
        c = exact.to_ordered(honest)
        if exact.to_ordered(exact.rn32(hi + 4 * dc, True)) > c:
            return int(Code.EXPLICIT), exact.neighbour(honest, True)
        if exact.to_ordered(exact.rn32(lo - 4 * dc, True)) < c:
            return int(Code.EXPLICIT), exact.neighbour(honest, False)
        return None


ATTENTION_TARGETS = ("scores", "values", "softmax")
"""The attention ops :class:`TamperAttention` can hit: ``scores`` = ``q @ k^T`` (a MATMUL, before
the 1/sqrt(hs) scale and the mask), ``values`` = ``softmax(scores) @ v`` (a MATMUL), ``softmax`` =
the softmax's EXP (``exp(scores - max)``, a transcendental op ruled by contracts/Transcendental.sol)."""


def attention_matmuls(graph: Graph) -> list[tuple[int, int]]:
    """Per transformer layer, the op ids of its two attention MATMULs ``(scores, values)``.

    The forward pass (ops before the loss) holds exactly two rank-4 ``[B, H, T, *]`` MATMULs per
    layer, in this order: ``q @ k^T``, whose output is scaled by ``1/sqrt(hs)`` (MUL_S), then
    ``att @ v``, whose first input is the softmax's output (a DIV). Both are checked, so a change
    of the model that breaks this reading fails loudly here rather than tampering another op."""
    fwd = [o for o in graph.ops[: graph.loss_op] if o.kind == OpKind.MATMUL and len(o.shape) == 4]
    if len(fwd) % 2:
        raise GraphError(f"attention: expected two rank-4 MATMULs per layer, found {len(fwd)}")
    users: dict[int, set[OpKind]] = {}
    for o in graph.ops:
        for i in o.inputs:
            users.setdefault(i, set()).add(o.kind)
    layers = []
    for scores, values in zip(fwd[0::2], fwd[1::2], strict=True):
        if OpKind.MUL_S not in users.get(scores.id, set()) or graph.ops[values.inputs[0]].kind != OpKind.DIV:
            raise GraphError(f"attention: ops {scores.id}, {values.id} are not q@k^T and softmax@v")
        layers.append((scores.id, values.id))
    return layers


@dataclass
class TamperAttention(Cheat):
    """Adds ``delta`` to one element of one attention op's output at step ``step`` (the trace keeps
    the tampered value, so the dispute lands on that op and element: a MATMUL, or the softmax's EXP).
    ``op`` is the graph id of the op; :meth:`of` finds it in a GPT spec.

    The default element of the scores, ``[0, 0, 1, 0]`` (batch 0, head 0, query 1, key 0), is
    below the causal mask's diagonal and in a row with two unmasked keys, so the edit moves the
    softmax and hence the new state: row 0 alone would not (its softmax is exactly 1 whatever the
    score), nor would a masked element (``score + -1e9`` rounds to -1e9 either way)."""

    step: int
    op: int
    element: int
    delta: float = 0.5

    @staticmethod
    def of(spec: TrainSpec, step: int, target: str = "scores", layer: int = 0, element: int | None = None,
           delta: float = 0.5) -> TamperAttention:
        """The cheat on ``target`` (one of :data:`ATTENTION_TARGETS`) of transformer ``layer``."""
        if spec.model != "gpt":
            raise GraphError(f"tamper-attention: model {spec.model!r} has no attention (use --model gpt)")
        if target not in ATTENTION_TARGETS:
            raise GraphError(f"tamper-attention: target {target!r} is not one of {ATTENTION_TARGETS}")
        graph = build_job(spec).graph
        layers = attention_matmuls(graph)
        if not 0 <= layer < len(layers):
            raise GraphError(f"tamper-attention: layer {layer} not in [0, {len(layers)})")
        scores, values = layers[layer]
        if target == "softmax":  # values' first input is the softmax's DIV(exp, sum(exp))
            op = graph.ops[graph.ops[values].inputs[0]].inputs[0]
            if graph.ops[op].kind != OpKind.EXP:
                raise GraphError(f"attention: op {op} feeding the softmax of layer {layer} is not an EXP")
        else:
            op = scores if target == "scores" else values
        shape = graph.ops[op].shape
        if element is None:  # scores and softmax: query 1, key 0 (see above); values: element 0
            element = 0 if target == "values" else shape[-1]
        if not 0 <= element < graph.ops[op].numel:
            raise GraphError(f"tamper-attention: element {element} outside op {op} of shape {shape}")
        return TamperAttention(step, op, element, delta)

    def op_hook(self, step: int):
        if step != self.step:
            return None

        def hook(op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
            if op.id != self.op:
                return out
            flat = out.reshape(-1).clone()
            flat[self.element] += self.delta
            return flat.reshape(out.shape)

        return hook


@dataclass
class SaturateOverflow(Cheat):
    """Trains on past a divergence: from step ``step`` on, an op whose value overflows FP32 (or has
    none: 0/0, log 0) posts ``+-FLT_MAX`` there (0 for NaN) instead of stopping, as a trainer
    clamping its outputs would; every other element keeps the FP64 value cast to FP32 (RN32 of the
    exact value for the single IEEE ops). The honest trainer stops with NonFiniteValue at the first
    such op, so every posted step from there is a fraud the auditor must win.

    Each overflowing op ``j`` is found by running the step (the op after the last hooked output);
    on the rerun the hook after op ``j - 1`` sets ``j``'s inputs to harmless values in place (so
    the executor computes ``j`` without stopping), and the hook after ``j`` restores them and
    replaces ``j``'s output by the clamped FP64 value of the honest inputs."""

    step: int
    max_ops: int = 4096

    def run(self, ex, state, data, step, keep_trace):
        if step < self.step:
            return super().run(ex, state, data, step, keep_trace)
        from vtrain.errors import NonFiniteValue

        known: set[int] = set()
        for _ in range(self.max_ops):
            hook = _Saturating(ex.graph, known)
            try:
                return ex.run(state, data, step=step, op_hook=hook, keep_trace=keep_trace)
            except NonFiniteValue:
                j = len(hook.seen)
                if j in known:
                    raise
                known.add(j)
            finally:
                hook.restore()
        raise NonFiniteValue(f"step {step}: more than {self.max_ops} ops overflow")


class _Saturating:
    """The op hook of one :class:`SaturateOverflow` run (see there); :meth:`restore` puts back any
    input still holding harmless values (the step stopped before the op that reads them)."""

    def __init__(self, graph: Graph, known: set[int]) -> None:
        self.graph, self.known = graph, known
        self.seen: list[int] = []
        self.held: dict[int, torch.Tensor] = {}  # op id -> its output tensor (what later ops read)
        self.honest: dict[int, torch.Tensor] = {}  # op id -> its true output, while harmless values stand in

    def restore(self) -> None:
        for i, vals in self.honest.items():
            self.held[i].copy_(vals)
        self.honest.clear()

    def __call__(self, op: OpNode, ins, out: torch.Tensor, log: StepLog) -> torch.Tensor:
        from vtrain.graph.executor import _compute_fp64

        self.seen.append(op.id)
        if op.id in self.known:
            self.restore()  # ins are the held tensors: the op's honest inputs again
            fmax = float(np.finfo(np.float32).max)
            v = _compute_fp64(op, list(ins), "none")[0]
            v = torch.nan_to_num(v, nan=0.0, posinf=fmax, neginf=-fmax).clamp(-fmax, fmax)
            out = v.to(torch.float32).add_(0.0).reshape(op.shape)
            log.sparse.pop(op.id, None)  # entries made from the harmless inputs
        self.held[op.id] = out
        nxt = op.id + 1
        if nxt in self.known:
            fill = 1.0 if self.graph.ops[nxt].kind in (OpKind.DIV, OpKind.DIV_S, OpKind.LOG) else 0.0
            for i in dict.fromkeys(self.graph.ops[nxt].inputs):
                self.honest[i] = self.held[i].clone()
                self.held[i].fill_(fill)
        return out


CHEATS = {
    "tamper-weight": lambda spec, s: TamperWeight(s),
    "poison-sample": lambda spec, s: PoisonSample(s),
    "skip-step": lambda spec, s: SkipStep(s),
    "wrong-lr": lambda spec, s: WrongLearningRate(s, spec.optimizer.lr),
    "abuse-log": lambda spec, s: AbuseLog(s),
    "forge-explicit": lambda spec, s: ForgeExplicit(s),
    "wrong-side": lambda spec, s: WrongSide(s),
    "shift-explicit": lambda spec, s: ShiftExplicit.of(spec, s),
    "tamper-attention": lambda spec, s: TamperAttention.of(spec, s),
    "tamper-softmax": lambda spec, s: TamperAttention.of(spec, s, target="softmax"),
}
"""Cheating modes by name (``vtrain demo --cheat NAME``)."""
