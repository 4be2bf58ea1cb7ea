"""Commitments of a job's graph and on-demand op-level traces of one step.

A trace is regenerated, never stored: replay from the interval checkpoint with the logs up to
step ``s`` and keep every op output of step ``s``. Its root is the tree over the ops' output
tensor roots, in op order; INPUT and OUTPUT records bind it to ``stateRoot_{s-1}`` and
``stateRoot_s`` (see docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from vtrain.commit.merkle import MerkleTree
from vtrain.commit.roots import (
    EMPTY_OP_LOG_ROOT,
    HIGH_KEY,
    LogEntry,
    encode_op_descriptor,
    graph_tree,
    log_leaf,
    op_log_root_arrays,
    op_log_root_unchecked,
    roots_tree,
    step_log_root,
    tensor_root,
    tensor_roots,
    tensor_tree,
)
from vtrain.graph.executor import StepLog, StepResult
from vtrain.graph.step_graph import Graph, OpKind
from vtrain.numerics.logfile import FramedLog


def op_descriptors(graph: Graph) -> list[bytes]:
    """The committed descriptor of every op; a CONST's attrs[0] is its tensor root."""
    out = []
    for op in graph.ops:
        attrs = list(op.attrs)
        if op.kind == OpKind.CONST:
            attrs = [int.from_bytes(tensor_root(graph.consts[op.id]), "big")]
        out.append(
            encode_op_descriptor(
                int(op.kind), list(op.inputs), list(op.shape), [list(s) for s in graph.in_shapes(op)], attrs
            )
        )
    return out


@dataclass
class GraphCommitment:
    """The graph root and the tree behind it (descriptor proofs for the game)."""

    descriptors: list[bytes]
    tree: MerkleTree

    @staticmethod
    def of(graph: Graph) -> GraphCommitment:
        d = op_descriptors(graph)
        return GraphCommitment(d, graph_tree(d))

    @property
    def root(self) -> bytes:
        return self.tree.root


def op_log_entries(log: StepLog, op: int) -> list[LogEntry]:
    e = log.sparse.get(op)
    if e is None:
        return []
    bits = e.value.view(np.uint32)
    return [
        LogEntry(int(i), int(c), int(b) if c == 3 else 0)
        for i, c, b in zip(e.index.tolist(), e.code.tolist(), bits.tolist(), strict=False)
    ]


def op_log_roots(log: StepLog, graph: Graph) -> list[bytes]:
    roots = []
    for op in graph.ops:
        e = log.sparse.get(op.id)
        if e is None or len(e) == 0:
            roots.append(EMPTY_OP_LOG_ROOT)
        else:
            bits = e.value.view(np.uint32).copy()
            bits[e.code != 3] = 0
            roots.append(op_log_root_arrays(e.index, e.code, bits))
    return roots


def framed_op_log_roots(framed: FramedLog, graph: Graph) -> list[bytes]:
    """Each op's log root of a log's entries exactly as written (:func:`op_log_root_unchecked`)."""
    roots: list[bytes] = []
    for op in graph.ops:
        e = framed.sparse.get(op.id)
        roots.append(EMPTY_OP_LOG_ROOT if e is None or len(e.index) == 0
                     else op_log_root_unchecked(e.index, e.code, e.value_bits))
    return roots


def framed_log_root(framed: FramedLog, graph: Graph) -> bytes:
    """``logRoot_s`` of a log's entries exactly as written: what the bytes commit to, checked or
    not. Equal to :func:`op_log_roots`' tree for a valid log."""
    return step_log_root(framed_op_log_roots(framed, graph))


def framed_op_log_leaves(framed: FramedLog, op: int) -> list[bytes]:
    """Op ``op``'s log leaves exactly as written, between the sentinels (keys ``index + 1`` mod 2^32)."""
    e = framed.sparse.get(op)
    body = [] if e is None else [
        log_leaf((int(i) + 1) & 0xFFFFFFFF, int(c) & 0xFF, int(v) & 0xFFFFFFFF)
        for i, c, v in zip(e.index.tolist(), e.code.tolist(), e.value_bits.tolist(), strict=True)
    ]
    return [log_leaf(0, 0, 0), *body, log_leaf(HIGH_KEY, 0, 0)]


class TraceRoots:
    """The trees a game reads of one step: over its op-output roots (``tree``, ``root``) and its op
    log roots (``log_tree``); a subclass gives ``op_roots`` and ``log_roots``."""

    op_roots: list[bytes]
    log_roots: list[bytes]

    @cached_property
    def tree(self) -> MerkleTree:
        return roots_tree(self.op_roots, "trace")

    @property
    def root(self) -> bytes:
        return self.tree.root

    @cached_property
    def log_tree(self) -> MerkleTree:
        return roots_tree(self.log_roots, "step log")


@dataclass
class StepTrace(TraceRoots):
    """Every op output of one step with its commitments (output roots, trace tree, log tree)."""

    step: int
    graph: Graph
    outputs: list[np.ndarray]
    log: StepLog
    _tensor_trees: dict[int, MerkleTree] = field(default_factory=dict)

    @staticmethod
    def of(step: int, graph: Graph, result: StepResult) -> StepTrace:
        if result.trace is None:
            raise ValueError("the step was run without keep_trace")
        outs = [t.detach().reshape(-1).numpy().astype(np.float32, copy=False) for t in result.trace]
        return StepTrace(step, graph, outs, result.log)

    @cached_property
    def op_roots(self) -> list[bytes]:
        return list[bytes](tensor_roots(self.outputs, "op outputs"))  # one threaded call (C builder)

    @cached_property
    def log_roots(self) -> list[bytes]:
        return op_log_roots(self.log, self.graph)

    def tensor_tree(self, op: int) -> MerkleTree:
        if op not in self._tensor_trees:
            self._tensor_trees[op] = tensor_tree(self.outputs[op])
        return self._tensor_trees[op]

    def inputs_of(self, op: int) -> list[np.ndarray]:
        node = self.graph.ops[op]
        return [self.outputs[i].reshape(self.graph.ops[i].shape) for i in node.inputs]

    def output(self, op: int) -> np.ndarray:
        return self.outputs[op].reshape(self.graph.ops[op].shape)


def first_difference(a: StepTrace, b: StepTrace) -> int | None:
    """The first op whose output differs between two traces of the same step (None if none)."""
    for j, (x, y) in enumerate(zip(a.op_roots, b.op_roots, strict=False)):
        if x != y:
            return j
    return None


def as_state(arrays: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) for a in arrays]
