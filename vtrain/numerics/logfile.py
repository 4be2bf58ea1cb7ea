"""On-disk format of one step's rounding log (only the bytes on disk: the committed log root is
computed from the entries, ``vtrain.commit``, whatever the file's version).

Certified logs are sparse: for each op with entries, its id, count, delta-coded indices, codes and
the FP32 values of explicit entries. Paper logs are dense: five trits per byte for every element of
every op the paper's hooks log (``vtrain.numerics.paper.hooked_ops``), in op order; ``vtrain
export-paper-log`` writes them in the paper's own layout (raw, with ``_metadata``). A header
carries the magic, version, mode, step and the graph's op count, so a log is never applied to the
wrong step.

Version 2 (written): header ``VTLOG``, version, a flags byte (mode in bits 0-1, bit 6 codes one
byte each instead of 2 bits, bit 7 payload zlib-compressed), step and op count as LEB128 varints;
certified payload: the op count, per op its id gap (``id - previous id - 1``; the first op its id)
and entry count, every op's index deltas (mod 2^32), all varints; then every code (2 bits, four to
a byte, low bits first, zero padding), then the explicit values (FP32 bits). The payload is
compressed only when zlib makes it shorter. An empty log is 10 bytes (step below 128, fewer than 128 ops;
the varints grow by a byte per 7 bits). Version 1 (still read):
a fixed 19-byte header (``<5sBBQI``), a zlib payload of uint32 op ids, counts and deltas, one byte
per code.

Reading is two stages, because a counterparty serves these bytes:

* :func:`frame_step_log` checks only the framing (header, compression, lengths, op table) and
  returns the entries exactly as written (:class:`FramedLog`): enough to hash them against a
  commitment, even when they break the rules below. Errors: :class:`~vtrain.errors.LogFramingError`.
* :func:`check_step_log` checks the entries (strictly increasing indices below the op's element
  count, known codes, finite explicit values) and returns the :class:`StepLog` a replay uses.
  Errors: :class:`~vtrain.errors.LogEntryError`, naming the op.

:func:`decode_step_log` is both. Nothing here raises anything but :class:`~vtrain.errors.CorruptLog`
subclasses on any bytes (``tests/test_served.py`` fuzzes it).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from vtrain.errors import (
    LogCodeError,
    LogCompressionError,
    LogFramingError,
    LogHeaderError,
    LogIndexOrderError,
    LogIndexRangeError,
    LogOpTableError,
    LogTrailingBytes,
    LogTruncated,
    LogValueError,
)
from vtrain.graph.executor import StepLog
from vtrain.graph.step_graph import Graph
from vtrain.numerics.paper import hooked_ops
from vtrain.numerics.rounding import Code, DenseLog, Mode, OpLog, pack_trits, unpack_trits

MAGIC = b"VTLOG"
VERSION = 2
VERSION_1 = 1
_MODES = {Mode.CERTIFIED: 0, Mode.PAPER: 1, Mode.ROUND_NOLOG: 2, Mode.FP32: 3}
_HEADER = struct.Struct("<5sBBQI")  # version 1: magic, version, mode, step, n_ops
_ENTRY_BYTES = 4 + 1 + 4  # version 1: delta, code, explicit value (at most)
_ENTRY_BYTES_V2 = 5 + 1 + 4  # version 2: delta varint, code, explicit value (at most)
_CODES = (int(Code.DOWN), int(Code.UP), int(Code.EXPLICIT))
_FLAG_WIDE_CODES = 0x40
_FLAG_ZLIB = 0x80
_MODE_BITS = 0x03


class LogVarintError(LogFramingError):
    """A variable-length number in a log is overlong or out of its field's range."""


def _uvarints(values: np.ndarray) -> bytes:
    """LEB128 of non-negative integers below 2^64 (7 bits a byte, low first, high bit: more)."""
    v = np.asarray(values, np.uint64).reshape(-1)
    if not len(v):
        return b""
    nbytes = np.ones(len(v), np.int64)
    for k in range(1, 10):
        nbytes += (v >= np.uint64(1) << np.uint64(7 * k)).astype(np.int64)
    ends = np.cumsum(nbytes)
    owner = np.repeat(np.arange(len(v)), nbytes)
    pos = np.arange(int(ends[-1])) - np.repeat(ends - nbytes, nbytes)
    out = ((v[owner] >> (np.uint64(7) * pos.astype(np.uint64))) & np.uint64(0x7F)).astype(np.uint8)
    out[pos < nbytes[owner] - 1] |= 0x80
    return out.tobytes()


def _read_uvarints(body: bytes, pos: int, count: int, bits: int, where: str, what: str) -> tuple[np.ndarray, int]:
    """``count`` LEB128 numbers from ``body[pos:]``, each below ``2^bits`` and minimally encoded;
    returns them (uint64) and the position after the last."""
    if count == 0:
        return np.zeros(0, np.uint64), pos
    if count > len(body) - pos:
        raise LogTruncated(f"{where}: {what}: expected at least {count} bytes at offset {pos}, got {len(body) - pos}")
    max_len = (bits + 6) // 7
    buf = np.frombuffer(body, np.uint8, len(body) - pos, pos)[: count * max_len]
    stops = np.flatnonzero(buf < 0x80)
    if len(stops) < count:
        raise LogTruncated(f"{where}: {what}: expected {count} numbers at offset {pos}, got {len(stops)}")
    stops = stops[:count]
    starts = np.concatenate([[0], stops[:-1] + 1])
    lengths = stops - starts + 1
    if int(lengths.max()) > max_len:
        k = int(np.argmax(lengths > max_len))
        raise LogVarintError(f"{where}: {what}: expected numbers below 2^{bits}, got a {int(lengths[k])}-byte one")
    if bits >= 64 and bool(((lengths == 10) & (buf[stops] > 1)).any()):
        raise LogVarintError(f"{where}: {what}: expected numbers below 2^64, got a larger one")
    if bool(((buf[stops] == 0) & (lengths > 1)).any()):
        raise LogVarintError(f"{where}: {what}: expected minimal varints, got one with a zero last byte")
    n = int(stops[-1]) + 1
    owner = np.repeat(np.arange(count), lengths)
    shift = (np.arange(n) - np.repeat(starts, lengths)).astype(np.uint64) * np.uint64(7)
    parts = (buf[:n] & 0x7F).astype(np.uint64) << shift
    vals = np.zeros(count, np.uint64)
    np.add.at(vals, owner, parts)  # disjoint bit fields: the sum is the bitwise or
    if bits < 64 and bool((vals >> np.uint64(bits)).any()):
        raise LogVarintError(f"{where}: {what}: expected numbers below 2^{bits}, got {int(vals.max())}")
    return vals, pos + n


def encode_step_log(log: StepLog, step: int, graph: Graph) -> bytes:
    """Serialize one step's log (version 2). Entries are written as given (deltas mod 2^32, codes as
    bytes when one is above 3), so a test can also write a log that breaks the rules
    :func:`check_step_log` enforces."""
    if log.mode == Mode.PAPER:
        body = b"".join(pack_trits(log.dense[o].trits) for o in hooked_ops(graph))
        return _v2(log.mode, step, graph, body, 0)
    ops = sorted(log.sparse)
    codes = np.concatenate([log.sparse[o].code.astype(np.uint8) for o in ops]) if ops else np.zeros(0, np.uint8)
    wide = bool(len(codes)) and int(codes.max()) > 3
    gaps = np.diff(np.asarray(ops, np.int64), prepend=-1) - 1
    table = np.stack([gaps, [len(log.sparse[o]) for o in ops]], axis=1) if ops else np.zeros((0, 2), np.int64)
    parts = [_uvarints(np.array([len(ops)])), _uvarints(table.reshape(-1))]
    for o in ops:
        deltas = np.diff(np.asarray(log.sparse[o].index, np.int64), prepend=0)
        parts.append(_uvarints(np.bitwise_and(deltas, 0xFFFFFFFF)))
    if wide:
        parts.append(codes.tobytes())
    else:
        quads = np.zeros(4 * ((len(codes) + 3) // 4), np.uint8)
        quads[: len(codes)] = codes
        q = quads.reshape(-1, 4)
        parts.append((q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)).astype(np.uint8).tobytes())
    for o in ops:
        e = log.sparse[o]
        parts.append(e.value[e.code == 3].astype(np.float32).tobytes())
    return _v2(log.mode, step, graph, b"".join(parts), _FLAG_WIDE_CODES if wide else 0)


def _v2(mode: Mode, step: int, graph: Graph, body: bytes, flags: int) -> bytes:
    packed = zlib.compress(body, 9)
    if len(packed) < len(body):
        body, flags = packed, flags | _FLAG_ZLIB
    head = MAGIC + bytes([VERSION, _MODES[mode] | flags]) + _uvarints(np.array([step, graph.n_ops], np.uint64))
    return head + body


def encode_step_log_v1(log: StepLog, step: int, graph: Graph) -> bytes:
    """Version 1 of :func:`encode_step_log` (the format before version 2; still read)."""
    head = _HEADER.pack(MAGIC, VERSION_1, _MODES[log.mode], step, graph.n_ops)
    if log.mode == Mode.PAPER:
        body = b"".join(pack_trits(log.dense[o].trits) for o in hooked_ops(graph))
        return head + zlib.compress(body, 6)
    ops = sorted(log.sparse)
    counts = np.array([len(log.sparse[o]) for o in ops], np.uint32)
    parts = [struct.pack("<I", len(ops)), np.array(ops, np.uint32).tobytes(), counts.tobytes()]
    for o in ops:
        e = log.sparse[o]
        deltas = np.diff(np.asarray(e.index, np.int64), prepend=0)  # mod 2^32 below: unsorted stays as given
        parts.append(np.bitwise_and(deltas, 0xFFFFFFFF).astype(np.uint32).tobytes())
    for o in ops:
        parts.append(log.sparse[o].code.astype(np.uint8).tobytes())
    for o in ops:
        e = log.sparse[o]
        parts.append(e.value[e.code == 3].astype(np.float32).tobytes())
    return head + zlib.compress(b"".join(parts), 9)


@dataclass(frozen=True)
class FramedEntries:
    """One op's entries as written: indices (uint32), codes (uint8) and the committed value bits
    (uint32: the explicit value for code 3, else 0)."""

    index: np.ndarray
    code: np.ndarray
    value_bits: np.ndarray


@dataclass(frozen=True)
class FramedLog:
    """A log whose framing is sound; its entries are unchecked (see :func:`check_step_log`)."""

    step: int
    mode: Mode
    sparse: dict[int, FramedEntries] = field(default_factory=dict)
    dense: dict[int, bytes] = field(default_factory=dict)  # paper: packed trits per rounding op


def _payload_bound(mode: Mode, graph: Graph) -> int:
    """Most bytes a well-formed version 1 payload of ``graph`` can have (a zip bomb stops here)."""
    if mode == Mode.PAPER:
        return sum((graph.ops[o].numel + 4) // 5 for o in hooked_ops(graph))
    return 4 + 8 * graph.n_ops + _ENTRY_BYTES * sum(op.numel for op in graph.ops)


def _take(body: bytes, pos: int, n: int, where: str, what: str) -> bytes:
    if n > len(body) - pos:
        raise LogTruncated(f"{where}: {what}: expected {n} bytes at offset {pos}, got {max(len(body) - pos, 0)}")
    return body[pos : pos + n]


def frame_step_log(data: bytes, step: int, graph: Graph, mode: Mode | None = None) -> FramedLog:
    """The entries of a log written by :func:`encode_step_log` (version 2) or its version 1, framing
    checked (header: magic, version, ``mode`` when given, ``step``, the graph's op count; zlib;
    every length; the op table), entries not. Raises a :class:`~vtrain.errors.LogFramingError`
    subclass."""
    where = f"rounding log of step {step}"
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LogHeaderError(f"{where}: expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < len(MAGIC) + 1:
        raise LogTruncated(f"{where}: header: expected at least {len(MAGIC) + 1} bytes, got {len(data)}")
    magic, version = data[: len(MAGIC)], data[len(MAGIC)]
    if magic != MAGIC or version not in (VERSION_1, VERSION):
        raise LogHeaderError(
            f"{where}: expected magic {MAGIC!r} version {VERSION_1} or {VERSION}, got magic {magic!r} version {version}"
        )
    if version == VERSION_1:
        return _frame_v1(data, step, graph, mode, where)
    return _frame_v2(data, step, graph, mode, where)


def _check_header(where: str, step: int, graph: Graph, mode: Mode | None, got_step: int, n_ops: int,
                  mode_code: int) -> Mode:
    if got_step != step:
        raise LogHeaderError(f"{where}: expected step {step}, got a log of step {got_step}")
    if n_ops != graph.n_ops:
        raise LogHeaderError(f"{where}: expected a graph of {graph.n_ops} ops, got {n_ops}")
    modes = {v: k for k, v in _MODES.items()}
    if mode_code not in modes:
        raise LogHeaderError(f"{where}: expected a mode code in {sorted(modes)}, got {mode_code}")
    got_mode = modes[mode_code]
    if mode is not None and got_mode != Mode(mode):
        raise LogHeaderError(f"{where}: expected mode {Mode(mode).value}, got {got_mode.value}")
    return got_mode


def _inflate(packed: bytes, bound: int, where: str) -> bytes:
    """A zlib stream of at most ``bound`` bytes (a zip bomb stops there), nothing after it."""
    z = zlib.decompressobj()
    try:
        body = z.decompress(packed, bound + 1)
    except zlib.error as e:
        raise LogCompressionError(f"{where}: expected a zlib stream, got damaged data ({e})") from None
    if len(body) > bound:
        raise LogTrailingBytes(f"{where}: expected a payload of at most {bound} bytes, got more")
    if not z.eof:
        raise LogTruncated(f"{where}: expected a complete zlib stream, got one cut short")
    if z.unused_data:
        raise LogTrailingBytes(f"{where}: expected nothing after the zlib stream, got {len(z.unused_data)} bytes")
    return body


def _frame_v2(data: bytes, step: int, graph: Graph, mode: Mode | None, where: str) -> FramedLog:
    if len(data) < len(MAGIC) + 2:
        raise LogTruncated(f"{where}: header: expected a flags byte, got none")
    flags = data[len(MAGIC) + 1]
    if flags & ~(_MODE_BITS | _FLAG_WIDE_CODES | _FLAG_ZLIB):
        raise LogHeaderError(f"{where}: expected flag bits 0-1, 6 and 7 only, got flags {flags:#04x}")
    (got_step, n_ops), pos = _read_uvarints(data, len(MAGIC) + 2, 2, 64, where, "header step and op count")
    got_mode = _check_header(where, step, graph, mode, int(got_step), int(n_ops), flags & _MODE_BITS)
    wide = bool(flags & _FLAG_WIDE_CODES)
    if got_mode == Mode.PAPER:
        if wide:
            raise LogHeaderError(f"{where}: expected no code-width flag on a paper log, got flags {flags:#04x}")
        bound = _payload_bound(Mode.PAPER, graph)
    else:
        bound = 5 + 10 * graph.n_ops + _ENTRY_BYTES_V2 * sum(op.numel for op in graph.ops)
    body = data[pos:]
    if flags & _FLAG_ZLIB:
        body = _inflate(body, bound, where)
    elif len(body) > bound:
        raise LogTrailingBytes(f"{where}: expected a payload of at most {bound} bytes, got {len(body)}")
    if got_mode == Mode.PAPER:
        return _frame_paper(body, step, graph, where)
    return _frame_sparse_v2(body, step, got_mode, graph, where, wide)


def _frame_sparse_v2(body: bytes, step: int, mode: Mode, graph: Graph, where: str, wide: bool) -> FramedLog:
    (n,), pos = _read_uvarints(body, 0, 1, 32, where, "op count")
    n = int(n)
    if n > graph.n_ops:
        raise LogOpTableError(f"{where}: expected at most {graph.n_ops} ops with entries, got {n}")
    table, pos = _read_uvarints(body, pos, 2 * n, 32, where, "op table")
    table = table.astype(np.int64)
    ops = np.cumsum(table[0::2] + 1) - 1  # strictly increasing by construction
    counts = table[1::2]
    if n and int(ops[-1]) >= graph.n_ops:
        k = int(np.argmax(ops >= graph.n_ops))
        raise LogOpTableError(f"{where}: expected op ids below {graph.n_ops}, got {int(ops[k])}")
    total = int(counts.sum())
    code_bytes = total if wide else (total + 3) // 4
    if total + code_bytes > len(body) - pos:  # a delta and a code each, checked before any allocation
        raise LogTruncated(f"{where}: expected at least {total + code_bytes} bytes of entries, got {len(body) - pos}")
    index = []
    for o, c in zip(ops.tolist(), counts.tolist(), strict=True):
        deltas, pos = _read_uvarints(body, pos, c, 32, where, f"op {o} indices")
        index.append((np.cumsum(deltas) & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    raw = np.frombuffer(_take(body, pos, code_bytes, where, "entry codes"), np.uint8)
    pos += code_bytes
    if wide:
        codes = raw.copy()
    else:
        codes = ((raw[:, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(-1)
        if bool(codes[total:].any()):
            raise LogTrailingBytes(f"{where}: expected zero padding after the last entry code, got bits set")
        codes = codes[:total].astype(np.uint8)
    per_op = np.split(codes, np.cumsum(counts)[:-1]) if n else []
    return FramedLog(step, mode, sparse=_with_explicit_values(body, pos, ops, index, per_op, where))


def _frame_v1(data: bytes, step: int, graph: Graph, mode: Mode | None, where: str) -> FramedLog:
    if len(data) < _HEADER.size:
        raise LogTruncated(f"{where}: header: expected {_HEADER.size} bytes, got {len(data)}")
    _, _, mode_code, got_step, n_ops = _HEADER.unpack_from(data)
    got_mode = _check_header(where, step, graph, mode, got_step, n_ops, mode_code)
    body = _inflate(data[_HEADER.size :], _payload_bound(got_mode, graph), where)
    if got_mode == Mode.PAPER:
        return _frame_paper(body, step, graph, where)
    return _frame_sparse(body, step, got_mode, graph, where)


def _frame_paper(body: bytes, step: int, graph: Graph, where: str) -> FramedLog:
    dense, pos = {}, 0
    for o in hooked_ops(graph):
        nb = (graph.ops[o].numel + 4) // 5
        dense[o] = _take(body, pos, nb, where, f"op {o} decisions")
        pos += nb
    if pos != len(body):
        raise LogTrailingBytes(f"{where}: expected {pos} payload bytes, got {len(body)}")
    return FramedLog(step, Mode.PAPER, dense=dense)


def _frame_sparse(body: bytes, step: int, mode: Mode, graph: Graph, where: str) -> FramedLog:
    (n,) = struct.unpack("<I", _take(body, 0, 4, where, "op count"))
    if n > graph.n_ops:
        raise LogOpTableError(f"{where}: expected at most {graph.n_ops} ops with entries, got {n}")
    pos = 4
    ops = np.frombuffer(_take(body, pos, 4 * n, where, "op ids"), np.uint32).astype(np.int64)
    pos += 4 * n
    counts = np.frombuffer(_take(body, pos, 4 * n, where, "entry counts"), np.uint32).astype(np.int64)
    pos += 4 * n
    for k, o in enumerate(ops.tolist()):
        if o >= graph.n_ops:
            raise LogOpTableError(f"{where}: expected op ids below {graph.n_ops}, got {o}")
        if k and o <= ops[k - 1]:
            raise LogOpTableError(f"{where}: expected strictly increasing op ids, got {int(ops[k - 1])} then {o}")
    total = int(counts.sum())
    if 5 * total > len(body) - pos:  # a delta and a code each, checked before any allocation
        raise LogTruncated(f"{where}: expected at least {5 * total} bytes of entries, got {len(body) - pos}")
    index = []
    for o, c in zip(ops.tolist(), counts.tolist(), strict=True):
        deltas = np.frombuffer(_take(body, pos, 4 * c, where, f"op {o} indices"), np.uint32)
        index.append((np.cumsum(deltas.astype(np.uint64)) & 0xFFFFFFFF).astype(np.uint32))
        pos += 4 * c
    codes = []
    for o, c in zip(ops.tolist(), counts.tolist(), strict=True):
        codes.append(np.frombuffer(_take(body, pos, c, where, f"op {o} codes"), np.uint8).copy())
        pos += c
    return FramedLog(step, mode, sparse=_with_explicit_values(body, pos, ops, index, codes, where))


def _with_explicit_values(body: bytes, pos: int, ops: np.ndarray, index: list[np.ndarray],
                          codes: list[np.ndarray], where: str) -> dict[int, FramedEntries]:
    """The entries of each op, reading the FP32 bits of its explicit entries from ``body`` at
    ``pos`` (both formats end so); the payload must end exactly there."""
    sparse = {}
    for o, idx, cd in zip(ops.tolist(), index, codes, strict=True):
        cd = np.array(cd, dtype=np.uint8)
        explicit = cd == int(Code.EXPLICIT)
        ne = int(explicit.sum())
        bits = np.zeros(len(cd), np.uint32)
        bits[explicit] = np.frombuffer(_take(body, pos, 4 * ne, where, f"op {o} explicit values"), np.uint32)
        pos += 4 * ne
        sparse[int(o)] = FramedEntries(idx, cd, bits)
    if pos != len(body):
        raise LogTrailingBytes(f"{where}: expected {pos} payload bytes, got {len(body)}")
    return sparse


def check_step_log(framed: FramedLog, graph: Graph) -> StepLog:
    """The replayable log of ``framed``; raises a :class:`~vtrain.errors.LogEntryError` subclass
    (naming the op) for unsorted or repeated indices, an index past the op's element count, a code
    other than 1, 2, 3, or an explicit value that is NaN or infinite."""
    where = f"rounding log of step {framed.step}"
    out = StepLog(framed.mode)
    if framed.mode == Mode.PAPER:
        for o, packed in framed.dense.items():
            p = np.frombuffer(packed, np.uint8)
            if len(p) and int(p.max()) >= 243:
                k = int(np.argmax(p >= 243))
                raise LogCodeError(f"{where}, op {o}: expected packed trits below 243, got {int(p[k])} at byte {k}", o)
            out.dense[o] = DenseLog(unpack_trits(packed, graph.ops[o].numel))
        return out
    for o, e in framed.sparse.items():
        idx = e.index.astype(np.int64)
        if len(idx) > 1:
            step_ = np.diff(idx)
            if bool((step_ <= 0).any()):
                k = int(np.argmax(step_ <= 0))
                a, b = int(idx[k]), int(idx[k + 1])
                what = f"index {a} twice" if a == b else f"index {a} then {b}"
                raise LogIndexOrderError(
                    f"{where}, op {o}: expected strictly increasing entry indices, got {what} (entries {k}, {k + 1})", o
                )
        numel = graph.ops[o].numel
        if len(idx) and int(idx[-1]) >= numel:
            raise LogIndexRangeError(
                f"{where}, op {o}: expected entry indices below the op's {numel} elements, got {int(idx[-1])}", o
            )
        bad = ~np.isin(e.code, _CODES)
        if bool(bad.any()):
            k = int(np.argmax(bad))
            raise LogCodeError(
                f"{where}, op {o}: expected codes 1 (down), 2 (up) or 3 (explicit), got {int(e.code[k])} "
                f"at index {int(idx[k])}",
                o,
            )
        values = e.value_bits.view(np.float32)
        explicit = e.code == int(Code.EXPLICIT)
        nonfinite = explicit & ~np.isfinite(values)
        if bool(nonfinite.any()):
            k = int(np.argmax(nonfinite))
            raise LogValueError(
                f"{where}, op {o}: expected a finite explicit value, got {values[k]} "
                f"(bits {int(e.value_bits[k]):#010x}) at index {int(idx[k])}",
                o,
            )
        out.sparse[o] = OpLog(idx, e.code.copy(), np.where(explicit, values, np.float32(0)).astype(np.float32))
    return out


def decode_step_log(data: bytes, step: int, graph: Graph, mode: Mode | None = None) -> StepLog:
    """Parse a log written by :func:`encode_step_log` (framing, then entries); any damage raises a
    :class:`~vtrain.errors.CorruptLog` subclass naming the step (and the op, for an entry)."""
    return check_step_log(frame_step_log(data, step, graph, mode), graph)
