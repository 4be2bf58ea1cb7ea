"""Ops without inputs whose output follows from the job's data seed and the step number.

``STEP`` (the 1-based step as one FP32 value, for committed LR schedules) and ``DROPOUT_MASK``
(a keep-mask scaled by ``1/(1-p)``). Semantics: ``docs/protocol.md`` (op table, codes 60 and 61).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from vtrain.errors import GraphError
from vtrain.graph.step_graph import OpKind, OpNode, bits_f32

MAX_STEP = 2**24
"""STEP is exact only for steps below 2^24 (the registry rejects longer jobs with such graphs)."""


def dropout_uniforms(seed: bytes, step: int, salt: int, n: int) -> np.ndarray:
    """``u(i)`` for ``i < n``: the first 4 bytes (big-endian) of
    ``sha256(seed32 || uint64be(step) || uint32be(salt) || uint64be(i))``, as uint32."""
    if len(seed) != 32:
        raise GraphError(f"dropout: expected a 32-byte data seed, got {len(seed)} bytes")
    prefix = hashlib.sha256(seed + step.to_bytes(8, "big") + salt.to_bytes(4, "big"))
    out = np.empty(n, dtype=np.uint32)
    for i in range(n):
        h = prefix.copy()
        h.update(i.to_bytes(8, "big"))
        out[i] = int.from_bytes(h.digest()[:4], "big")
    return out


def dropout_mask(seed: bytes, step: int, op: OpNode) -> torch.Tensor:
    """The DROPOUT_MASK op's output: ``FP32(scaleBits)`` where ``u(i) >= threshold``, else +0.0."""
    threshold, scale_bits, salt = op.attrs
    u = dropout_uniforms(seed, step, salt, math.prod(op.shape))
    scale = np.float32(bits_f32(scale_bits))
    vals = np.where(u >= np.uint32(threshold), scale, np.float32(0.0)).astype(np.float32)
    return torch.from_numpy(vals.reshape(op.shape))


def generated_output(op: OpNode, seed: bytes | None, step: int | None) -> torch.Tensor:
    """Output of a STEP or DROPOUT_MASK op at ``step`` of the job with data seed ``seed``."""
    if step is None:
        raise GraphError(f"{op.kind.name} op {op.id}: the step number is needed (pass step=)")
    if not 1 <= step < MAX_STEP:
        raise GraphError(f"{op.kind.name} op {op.id}: expected a step in [1, 2^24), got {step}")
    if op.kind == OpKind.STEP:
        return torch.tensor([float(step)], dtype=torch.float32)
    if op.kind == OpKind.DROPOUT_MASK:
        if seed is None:
            raise GraphError(f"DROPOUT_MASK op {op.id}: the job's data seed is needed (StepExecutor(seed=))")
        return dropout_mask(seed, step, op)
    raise GraphError(f"{op.kind.name} is not a generated op")
