"""The replay's application of log entries: the CPU (numpy) path against the torch path, bit for bit,
on adversarial values (rounding.apply_log uses numpy on the CPU and torch elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.numerics.rounding import OpLog, _apply_entries_np, _apply_entries_torch


def _case(seed: int, n: int = 4000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, OpLog]:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal(n).astype(np.float32) * np.float32(2.0) ** rng.integers(-140, 120, n).astype(np.float32)
    r[:8] = [0.0, -0.0, np.float32(2.0**-149), np.float32(3.4028235e38), 1.0, 2.0, np.float32(2.0**-126), -1.0]
    r64 = r.astype(np.float64)
    ulp = np.abs(np.nextafter(r, np.float32(np.inf)).astype(np.float64) - r64)
    ulp[~np.isfinite(ulp)] = 2.0**104
    # v: RN32(v) == r, anywhere in r's rounding interval, midpoints and a hair inside included
    frac = rng.choice([-0.5, 0.5, -0.5 + 2.0**-30, 0.5 - 2.0**-30, 0.0, 0.25, -0.49], n)
    v = r64 + frac * ulp
    v[1] = -0.0
    d = np.abs(v) * rng.choice([0.0, 2.0**-40, 2.0**-25, 2.0**-20], n) + rng.choice([0.0, 2.0**-160], n)
    k = rng.choice(n, n // 3, replace=False)
    k.sort()
    code = rng.integers(1, 4, len(k)).astype(np.uint8)
    stated = np.nextafter(r[k], np.float32(np.inf)) if seed % 2 else r[k]
    value = np.where(code == 3, stated, np.float32(0)).astype(np.float32)
    return torch.from_numpy(v), torch.from_numpy(d), torch.from_numpy(r.copy()), OpLog(k.astype(np.int64), code, value)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("checking", [False, True])
@pytest.mark.parametrize("exact_op", [False, True])
def test_numpy_entries_are_the_torch_entries(seed: int, checking: bool, exact_op: bool) -> None:
    v, d, r, entries = _case(seed)
    dd = None if exact_op else d
    a_np, bad_np = _apply_entries_np(v.numpy(), r.numpy(), dd, entries, checking, exact_op)
    a_t, bad_t = _apply_entries_torch(v, r, dd, entries, checking, exact_op)
    assert np.array_equal(a_np.view(np.uint32), a_t.numpy().view(np.uint32))
    assert np.array_equal(bad_np, bad_t)
    if checking:
        assert len(bad_np) > 0  # the cases reach the far/wild checks


def test_the_checks_flag_an_entry_exactly_past_its_honest_reach() -> None:
    """Explicit ``c``: flagged only when ``v'`` is farther than ``d`` from every real rounding to ``c`` (an
    honest ``c = RN32(e)`` has ``|v' - e| <= d``); directed: farther than ``4 d`` from its midpoint
    (``2 Dc + d <= 4 d``). Far below the old ``6 d`` for an explicit value where spacing dwarfs ``d``."""
    c = np.float32(1.0)
    m_hi = (1.0 + float(np.nextafter(c, np.float32(2)))) * 0.5  # 1 + 2^-24
    d = 2.0**-40
    v = np.array([m_hi + d, m_hi + 2 * d, 1.0 - 2.0**-25 - d, 1.0 - 2.0**-25 - 2 * d,  # explicit 1.0
                  m_hi - 4 * d, m_hi - 4.5 * d, m_hi + 4 * d, m_hi + 4.5 * d])  # DOWN: the midpoint above 1.0
    r = v.astype(np.float32)
    code = np.array([3, 3, 3, 3, 1, 1, 1, 1], np.uint8)
    entries = OpLog(np.arange(8, dtype=np.int64), code, np.where(code == 3, c, np.float32(0)).astype(np.float32))
    dd = torch.full((8,), d, dtype=torch.float64)
    for bad in (_apply_entries_np(v, r, dd, entries, True, False)[1],
                _apply_entries_torch(torch.from_numpy(v), torch.from_numpy(r), dd, entries, True, False)[1]):
        assert bad.tolist() == [1, 3, 5, 7]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("with_tight", [False, True])
def test_the_native_checked_replay_is_the_fallback_paths(monkeypatch, seed: int, with_tight: bool) -> None:
    """``apply_log`` checking on the native filter (``d`` and ``tight`` read once at candidates and
    entries together) and on the fallback path: the same output bits, violations and resolver calls, on
    logs with wrong codes, wrong explicit values, entries far from a tie and unlogged near-ties, with and
    without a tighter bound and exact-grid elements."""
    from vtrain.numerics import native
    from vtrain.numerics import rounding as R

    if not native.available():
        pytest.skip("native numerics kernels not built (make native)")
    v, d, _, entries = _case(seed)
    v[~torch.isfinite(v.float())] = 1.0  # the values round to finite FP32 numbers (checked replay: eager check)
    v[v == 0] = 0.0  # the fallback hands the resolver an entry's value at v = -0 with its sign (native: +0)
    tight_calls: list[int] = []

    def tight(index: np.ndarray) -> np.ndarray:  # another valid bound: half of d at every third element
        tight_calls.append(len(index))
        dn = d.numpy()[index]
        return np.where(index % 3 == 0, dn * 0.5, dn * 2.0)

    def exact(index: np.ndarray) -> np.ndarray:
        return index % 5 == 0

    got = []
    for on in (True, False):
        if not on:
            monkeypatch.setattr(R.NF, "usable", lambda t: False)
        calls: list = []

        def resolver(keys, proposed, codes, flagged, calls=calls):
            calls.append((keys.copy(), proposed.view(np.uint32).copy(), codes.copy(), flagged.copy()))
            out = proposed.copy()
            out[::7] = np.float32(-0.0)  # resolved values are written, zeros made canonical
            return out

        viol: list = []
        out = R.apply_log(v, d, entries, "t", resolver, viol, exact=exact, tight=tight if with_tight else None)
        plain: list = []
        out2 = R.apply_log(v, d, OpLog.empty(), "t", violations=plain, tight=tight if with_tight else None)
        got.append((out.numpy().view(np.uint32).copy(), [(x.index, x.code, x.detail) for x in viol], calls,
                    out2.numpy().view(np.uint32).copy(), [(x.index, x.code, x.detail) for x in plain]))
    (o1, v1, c1, p1, q1), (o2, v2, c2, p2, q2) = got
    assert np.array_equal(o1, o2) and np.array_equal(p1, p2)
    assert v1 == v2 and q1 == q2
    kinds = {x[2] for x in v1}
    assert kinds == {"entry far from the replayed value", "unlogged element near a midpoint"}
    assert len(c1) == len(c2) == 1
    for a, b in zip(c1[0], c2[0], strict=True):
        assert np.array_equal(a, b)
    assert not with_tight or tight_calls


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("checking", [False, True])
@pytest.mark.parametrize("exact_op", [False, True])
def test_the_c_entries_are_the_numpy_entries(seed: int, checking: bool, exact_op: bool) -> None:
    """``vt_replay_apply_entries`` (``native_replay.apply_entries``) gives ``_apply_entries_np``'s values
    and far/wild positions bit for bit on the adversarial cases (midpoints, a hair inside, zeros of both
    signs, subnormals, the top of the range, explicit values one step off)."""
    from vtrain.numerics import native, native_replay
    from vtrain.numerics.rounding import FAR_REACH, _entry_bounds

    if not native.available():
        pytest.skip("native numerics kernels not built (make native)")
    v, d, r, entries = _case(seed)
    dd = None if exact_op else d
    want_a, want_bad = _apply_entries_np(v.numpy(), r.numpy(), dd, entries, checking, exact_op)
    di = _entry_bounds(dd, entries, len(entries)) if checking else None
    got = native_replay.apply_entries(v.numpy(), r.numpy(), entries.index, entries.code, entries.value, di,
                                      FAR_REACH, exact_op)
    assert got is not None
    assert np.array_equal(got[0].view(np.uint32), want_a.view(np.uint32))
    assert np.array_equal(got[1], want_bad)
    if checking:
        assert len(want_bad) > 0
    with pytest.raises(IndexError, match="entry indices"):  # the kernel never reads outside v
        native_replay.apply_entries(v.numpy(), r.numpy(), entries.index + len(v), entries.code, entries.value, di,
                                    FAR_REACH, exact_op)


def test_the_c_entries_read_flt_maxs_virtual_neighbour_as_numpy_does() -> None:
    """Next to +-FLT_MAX the neighbour is the contract's virtual +-2^128 (the midpoint +-(2^128 - 2^103)):
    the C kernel takes the same side and flags the same entries as ``_apply_entries_np`` there."""
    from vtrain.numerics import native, native_replay
    from vtrain.numerics.rounding import FAR_REACH, _entry_bounds

    if not native.available():
        pytest.skip("native numerics kernels not built (make native)")
    top = float(np.finfo(np.float32).max)
    mid = 2.0**128 - 2.0**103
    r = np.array([top, -top, top, -top, top, -top], dtype=np.float32)
    v = np.array([mid, -mid, mid - 2.0**80, -mid + 2.0**80, top, -top], dtype=np.float64)
    d = np.full(6, 2.0**78)
    entries = OpLog(np.arange(6, dtype=np.int64), np.array([1, 2, 1, 2, 1, 2], dtype=np.uint8), np.zeros(6, np.float32))
    for checking in (False, True):
        want_a, want_bad = _apply_entries_np(v, r, torch.from_numpy(d), entries, checking, False)
        di = _entry_bounds(torch.from_numpy(d), entries, 6) if checking else None
        got = native_replay.apply_entries(v, r, entries.index, entries.code, entries.value, di, FAR_REACH, False)
        assert got is not None
        assert np.array_equal(got[0].view(np.uint32), want_a.view(np.uint32))
        assert np.array_equal(got[1], want_bad)
