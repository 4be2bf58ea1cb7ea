"""The rounding log's on-disk format (vtrain/numerics/logfile.py): version 2 is written, version 1
still read; both frame the same entries (so the committed log root, computed from the entries, does
not depend on the version), and any bytes decode or raise a CorruptLog subclass."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtrain.commit.trace import framed_log_root
from vtrain.errors import CorruptLog, LogHeaderError, LogTrailingBytes, LogTruncated
from vtrain.graph.executor import StepLog
from vtrain.numerics import logfile as L
from vtrain.numerics.rounding import DenseLog, Mode, OpLog
from vtrain.training.loop import step_log_root_of
from vtrain.training.spec import TrainSpec, build_job

GRAPH = build_job(TrainSpec(model="mlp", batch_size=4)).graph
OPS = [op.id for op in GRAPH.ops if op.numel]


@st.composite
def step_logs(draw, valid: bool = True) -> StepLog:
    """Certified logs; with ``valid=False`` also codes outside 1..3 and unsorted indices (a log the
    entry checks refuse must still be written and framed as given)."""
    sparse = {}
    for o in draw(st.lists(st.sampled_from(OPS), max_size=5, unique=True)):
        numel = GRAPH.ops[o].numel
        idx = sorted(draw(st.sets(st.integers(0, numel - 1), max_size=min(numel, 40))))
        if not valid and len(idx) > 1 and draw(st.booleans()):
            idx[0], idx[1] = idx[1], idx[0]
        code_set = [1, 2, 3] if valid else [0, 1, 2, 3, 4, 7, 255]
        codes = draw(st.lists(st.sampled_from(code_set), min_size=len(idx), max_size=len(idx)))
        vals = draw(st.lists(st.floats(width=32, allow_nan=not valid, allow_infinity=not valid),
                             min_size=len(idx), max_size=len(idx)))
        sparse[o] = OpLog(np.asarray(idx, np.int64), np.asarray(codes, np.uint8),
                          np.asarray([v if c == 3 else 0.0 for v, c in zip(vals, codes, strict=True)], np.float32))
    return StepLog(Mode.CERTIFIED, sparse)


def _same_entries(a: L.FramedLog, b: L.FramedLog) -> None:
    assert sorted(a.sparse) == sorted(b.sparse)
    for o in a.sparse:
        x, y = a.sparse[o], b.sparse[o]
        assert np.array_equal(x.index, y.index) and np.array_equal(x.code, y.code)
        assert np.array_equal(x.value_bits, y.value_bits)


@settings(max_examples=120, deadline=None)
@given(lg=step_logs(valid=False), step=st.integers(0, 2**40))
def test_both_versions_frame_the_entries_as_written(lg: StepLog, step: int) -> None:
    v2, v1 = L.encode_step_log(lg, step, GRAPH), L.encode_step_log_v1(lg, step, GRAPH)
    assert v2[5] == L.VERSION == 2 and v1[5] == L.VERSION_1 == 1
    a, b = L.frame_step_log(v2, step, GRAPH), L.frame_step_log(v1, step, GRAPH)
    _same_entries(a, b)
    for o, e in lg.sparse.items():
        assert np.array_equal(a.sparse[o].index.astype(np.int64), e.index)
        assert np.array_equal(a.sparse[o].code, e.code)
    assert framed_log_root(a, GRAPH) == framed_log_root(b, GRAPH)  # the committed root: from entries


@settings(max_examples=60, deadline=None)
@given(lg=step_logs(), step=st.integers(1, 10_000))
def test_a_valid_log_round_trips_in_both_versions_with_the_same_root(lg: StepLog, step: int) -> None:
    root = step_log_root_of(lg, GRAPH)
    for enc in (L.encode_step_log, L.encode_step_log_v1):
        back = L.decode_step_log(enc(lg, step, GRAPH), step, GRAPH)
        assert step_log_root_of(back, GRAPH) == root


def test_sizes_an_empty_log_and_the_paper_layout() -> None:
    empty = StepLog(Mode.CERTIFIED, {})
    assert len(L.encode_step_log(empty, 5, GRAPH)) == 10  # magic 5, version, flags, step, op count, 0 ops
    assert len(L.encode_step_log(empty, 500, GRAPH)) == 11
    assert len(L.encode_step_log_v1(empty, 5, GRAPH)) > 19
    from vtrain.numerics.paper import hooked_ops

    dense = {o: DenseLog(np.ones(GRAPH.ops[o].numel, np.uint8)) for o in hooked_ops(GRAPH)}
    paper = StepLog(Mode.PAPER, dense=dense)
    for enc in (L.encode_step_log, L.encode_step_log_v1):
        back = L.decode_step_log(enc(paper, 3, GRAPH), 3, GRAPH, Mode.PAPER)
        assert all(np.array_equal(back.dense[o].trits, dense[o].trits) for o in dense)


def test_codes_are_two_bits_unless_one_is_above_three() -> None:
    o = OPS[0]
    few = StepLog(Mode.CERTIFIED, {o: OpLog(np.arange(3), np.array([1, 2, 1], np.uint8), np.zeros(3, np.float32))})
    data = L.encode_step_log(few, 1, GRAPH)
    assert data[6] & 0x40 == 0
    odd = StepLog(Mode.CERTIFIED, {o: OpLog(np.arange(3), np.array([1, 9, 1], np.uint8), np.zeros(3, np.float32))})
    data = L.encode_step_log(odd, 1, GRAPH)
    assert data[6] & 0x40 and L.frame_step_log(data, 1, GRAPH).sparse[o].code.tolist() == [1, 9, 1]


def test_framing_errors_of_version_2() -> None:
    o = OPS[0]
    lg = StepLog(Mode.CERTIFIED, {o: OpLog(np.arange(5), np.array([1, 2, 1, 2, 1], np.uint8), np.zeros(5, np.float32))})
    good = L.encode_step_log(lg, 4, GRAPH)
    assert good[6] & 0x80 == 0  # short: stored without zlib
    with pytest.raises(LogHeaderError, match="version 1 or 2, got magic b'VTLOG' version 3"):
        L.frame_step_log(good[:5] + b"\x03" + good[6:], 4, GRAPH)
    with pytest.raises(LogHeaderError, match="flag bits"):
        L.frame_step_log(good[:6] + bytes([good[6] | 0x10]) + good[7:], 4, GRAPH)
    with pytest.raises(LogHeaderError, match="expected step 4, got a log of step 5"):
        L.frame_step_log(good[:7] + b"\x05" + good[8:], 4, GRAPH)
    with pytest.raises(L.LogVarintError, match="minimal"):
        L.frame_step_log(good[:7] + b"\x84\x00" + good[8:], 4, GRAPH)  # step 4 as an overlong varint
    with pytest.raises(LogTrailingBytes, match="padding"):  # codes 1,2,1,2,1: one code byte with padding bits
        bad = bytearray(good)
        bad[-1] |= 0xC0
        L.frame_step_log(bytes(bad), 4, GRAPH)
    with pytest.raises(LogTrailingBytes):
        L.frame_step_log(good + b"\x00", 4, GRAPH)
    with pytest.raises(LogTruncated):
        L.frame_step_log(good[:-1], 4, GRAPH)
    zipped = good[:6] + bytes([good[6] | 0x80]) + good[7:9] + zlib.compress(good[9:])
    L.frame_step_log(zipped, 4, GRAPH)  # the same payload behind zlib reads the same
    with pytest.raises(LogTrailingBytes, match="at most"):  # a zip bomb stops at the payload bound
        L.frame_step_log(good[:6] + bytes([good[6] | 0x80]) + good[7:9] + zlib.compress(b"\0" * 2**22), 4, GRAPH)


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    b = bytearray(data)
    for kind, pos, val in edits:
        if not b:
            break
        p = pos % len(b)
        if kind == 0:
            b[p] ^= val or 1
        elif kind == 1:
            del b[p]
        elif kind == 2:
            b.insert(p, val)
        else:
            del b[p:]
    return bytes(b)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lg=step_logs(), v1=st.booleans(),
       edits=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1,
                      max_size=6))
def test_fuzz_any_bytes_decode_or_raise_only_corrupt_log(lg: StepLog, v1: bool, edits) -> None:
    data = _mutate((L.encode_step_log_v1 if v1 else L.encode_step_log)(lg, 9, GRAPH), edits)
    try:
        back = L.decode_step_log(data, 9, GRAPH)
    except CorruptLog:
        return
    assert isinstance(back, StepLog)
    framed_log_root(L.frame_step_log(data, 9, GRAPH), GRAPH)
