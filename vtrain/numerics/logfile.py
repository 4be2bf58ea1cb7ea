"""On-disk format of one step's rounding log.

Certified logs are sparse: for each op with entries, its id, count, delta-coded indices, codes and
the FP32 values of explicit entries; the whole payload is zlib-compressed. Paper logs are dense:
five trits per byte for every element of every op the paper's hooks log
(``vtrain.numerics.paper.hooked_ops``), in op order; ``vtrain export-paper-log`` writes them in
the paper's own layout (raw, with ``_metadata``). A header carries the
magic, version, mode, step and the graph's op count, so a log is never applied to the wrong step.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from vtrain.errors import CorruptLog
from vtrain.graph.executor import StepLog
from vtrain.graph.step_graph import Graph
from vtrain.numerics.paper import hooked_ops
from vtrain.numerics.rounding import DenseLog, Mode, OpLog, pack_trits, unpack_trits

MAGIC = b"VTLOG"
VERSION = 1
_MODES = {Mode.CERTIFIED: 0, Mode.PAPER: 1, Mode.ROUND_NOLOG: 2, Mode.FP32: 3}
_HEADER = struct.Struct("<5sBBQI")  # magic, version, mode, step, n_ops


def encode_step_log(log: StepLog, step: int, graph: Graph) -> bytes:
    """Serialize one step's log (compressed)."""
    head = _HEADER.pack(MAGIC, VERSION, _MODES[log.mode], step, graph.n_ops)
    if log.mode == Mode.PAPER:
        body = b"".join(pack_trits(log.dense[o].trits) for o in hooked_ops(graph))
        return head + zlib.compress(body, 6)
    ops = sorted(log.sparse)
    counts = np.array([len(log.sparse[o]) for o in ops], np.uint32)
    parts = [struct.pack("<I", len(ops)), np.array(ops, np.uint32).tobytes(), counts.tobytes()]
    for o in ops:
        e = log.sparse[o]
        parts.append(np.diff(e.index, prepend=0).astype(np.uint32).tobytes())
    for o in ops:
        parts.append(log.sparse[o].code.astype(np.uint8).tobytes())
    for o in ops:
        e = log.sparse[o]
        parts.append(e.value[e.code == 3].astype(np.float32).tobytes())
    return head + zlib.compress(b"".join(parts), 9)


def decode_step_log(data: bytes, step: int, graph: Graph) -> StepLog:
    """Parse a log written by :func:`encode_step_log`; any damage raises :class:`CorruptLog`."""
    where = f"rounding log of step {step}"
    if len(data) < _HEADER.size:
        raise CorruptLog(f"{where}: truncated header ({len(data)} bytes)")
    magic, version, mode_code, got_step, n_ops = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptLog(f"{where}: not a vtrain log (magic {magic!r}, version {version})")
    if got_step != step:
        raise CorruptLog(f"{where}: expected step {step}, got a log of step {got_step}")
    if n_ops != graph.n_ops:
        raise CorruptLog(f"{where}: expected a graph of {graph.n_ops} ops, got {n_ops}")
    modes = {v: k for k, v in _MODES.items()}
    if mode_code not in modes:
        raise CorruptLog(f"{where}: unknown mode code {mode_code}")
    mode = modes[mode_code]
    try:
        body = zlib.decompress(data[_HEADER.size :])
    except zlib.error as e:
        raise CorruptLog(f"{where}: compressed payload damaged or truncated ({e})") from None
    out = StepLog(mode)
    if mode == Mode.PAPER:
        pos = 0
        for o in hooked_ops(graph):
            op = graph.ops[o]
            nb = (op.numel + 4) // 5
            if pos + nb > len(body):
                raise CorruptLog(f"{where}: truncated at op {op.id}")
            out.dense[op.id] = DenseLog(unpack_trits(body[pos : pos + nb], op.numel))
            pos += nb
        if pos != len(body):
            raise CorruptLog(f"{where}: {len(body) - pos} trailing bytes")
        return out
    try:
        (n,) = struct.unpack_from("<I", body, 0)
        pos = 4
        ops = np.frombuffer(body, np.uint32, n, pos).astype(np.int64)
        pos += 4 * n
        counts = np.frombuffer(body, np.uint32, n, pos).astype(np.int64)
        pos += 4 * n
        idx = []
        for o, c in zip(ops, counts):
            if o >= graph.n_ops:
                raise CorruptLog(f"{where}: op id {o} out of range")
            idx.append(np.cumsum(np.frombuffer(body, np.uint32, c, pos).astype(np.int64)))
            pos += 4 * int(c)
        codes = []
        for c in counts:
            codes.append(np.frombuffer(body, np.uint8, c, pos).copy())
            pos += int(c)
        for o, i, cd in zip(ops, idx, codes):
            if len(cd) and (cd.min() < 1 or cd.max() > 3):
                raise CorruptLog(f"{where}, op {o}: invalid entry code")
            if len(i) and i[-1] >= graph.ops[o].numel:
                raise CorruptLog(f"{where}, op {o}: entry index {i[-1]} out of range")
            ne = int((cd == 3).sum())
            vals = np.zeros(len(cd), np.float32)
            vals[cd == 3] = np.frombuffer(body, np.float32, ne, pos)
            pos += 4 * ne
            out.sparse[int(o)] = OpLog(i, cd, vals)
    except (ValueError, struct.error) as e:
        raise CorruptLog(f"{where}: truncated payload ({e})") from None
    if pos != len(body):
        raise CorruptLog(f"{where}: {len(body) - pos} trailing bytes")
    return out
