"""The numerics policy: FP64 compute, FP32 rounding, certified error bounds and the rounding log.

Everything a training step computes goes through :func:`round_output` (trainer) or
:func:`apply_log` (auditor). The rule is documented in ``docs/numerics.md``; the contract applies
the same rule to one element (``contracts/Adjudicator.sol``, ``vtrain/numerics/exact.py``).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch

from vtrain.errors import NonFiniteValue, VtrainError
from vtrain.numerics import native_filter as NF
from vtrain.numerics import native_replay

log = logging.getLogger(__name__)

U = 2.0**-53
"""Unit roundoff of IEEE binary64."""

TRAINER_BOUND_SLACK = 1.01
"""The trainer evaluates ``sum|t_k|`` in FP32 and scales it by this factor (see docs/numerics.md)."""

_CMP_SLACK = 1.0 + 2.0**-40
"""Slack on FP64 comparisons so every decision stays on the safe side of the proof."""

REPLAY_SCALE = 2.0 * _CMP_SLACK
"""The checked replay's filter reach is ``d * REPLAY_SCALE``: the bits of the near-tie test's
``2 d (1 + 2^-40)`` (the doubling is exact)."""


class Mode(str, enum.Enum):
    """How a run rounds and logs. ``certified`` is the default and the only replayable-by-proof mode."""

    CERTIFIED = "certified"
    PAPER = "paper"
    ROUND_NOLOG = "round-nolog"
    FP32 = "fp32"


class Code(enum.IntEnum):
    """Rounding-log entry codes (the same numbers are committed in log leaves)."""

    NONE = 0
    DOWN = 1
    UP = 2
    EXPLICIT = 3


def gamma(n: int) -> float:
    """``g(n) = n*u / (1 - n*u)``, the classic bound on the relative error of an n-term sum."""
    nu = n * U
    if nu >= 0.5:
        raise VtrainError(f"reduction too long for the certified bound: expected n < 2^52, got {n}")
    return nu / (1.0 - nu)


@dataclass
class OpLog:
    """Sparse rounding-log entries of one op: flat indices, codes and FP32 values (explicit only)."""

    index: np.ndarray  # int64, sorted
    code: np.ndarray  # uint8
    value: np.ndarray  # float32 (0 unless code == EXPLICIT)

    def __post_init__(self) -> None:
        if not (len(self.index) == len(self.code) == len(self.value)):
            raise VtrainError(
                f"rounding log arrays differ in length: {len(self.index)}, {len(self.code)}, {len(self.value)}"
            )

    def __len__(self) -> int:
        return len(self.index)

    @staticmethod
    def empty() -> OpLog:
        return OpLog(np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros(0, np.float32))


def _read_only_empty() -> OpLog:
    log = OpLog.empty()
    for a in (log.index, log.code, log.value):
        a.flags.writeable = False
    return log


NO_ENTRIES = _read_only_empty()
"""The log of an op without entries, shared (its arrays read-only: nothing appends to a log in place),
returned by the hot paths instead of a fresh ``OpLog.empty()`` (three arrays per op)."""


@dataclass
class DenseLog:
    """The paper's log of one op: one trit per element, the paper's code (0 down, 1 none, 2 up);
    see ``vtrain.numerics.paper``."""

    trits: np.ndarray  # uint8, one per element


@dataclass
class RoundingStats:
    """Counters for benchmarks: how many values were rounded and how many needed a log entry."""

    values: int = 0
    logged: int = 0
    explicit: int = 0
    ambiguous_resolved: int = 0
    per_op: dict[int, int] = field(default_factory=dict)


def _neighbours(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inf = torch.full_like(r, float("inf"))
    return torch.nextafter(r, -inf), torch.nextafter(r, inf)


def _check_finite_slow(x: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).nonzero()[0][0]) if x.dim() == 1 else -1
        raise NonFiniteValue(f"{what}: expected finite values, got NaN/Inf (first flat index {bad})")


def finite_probe(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 0-dim tensors, both finite exactly when every element of ``x`` is: its minimum and maximum
    (``aminmax`` propagates NaN; an infinity is an extreme). One vectorised pass with no conversion,
    about 7x faster than an FP64-accumulated sum of FP32 values, and never overflows."""
    return torch.aminmax(x.reshape(-1))


def all_finite(x: torch.Tensor) -> bool:
    """Whether every element of a tensor is finite, in one reduction (:func:`finite_probe`)."""
    if x.numel() == 0:
        return True
    lo, hi = finite_probe(x)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))


def _check_finite(x: torch.Tensor, what: str) -> None:
    if not all_finite(x):
        _check_finite_slow(x, what)
        raise NonFiniteValue(f"{what}: expected finite values, got NaN/Inf")  # pragma: no cover


def canonical(x: torch.Tensor) -> torch.Tensor:
    """Map -0.0 to +0.0 (adding +0.0 does exactly that under round-to-nearest)."""
    return x + 0.0


_SMALL = 4096
"""Up to this many elements (on the CPU) the rule runs in numpy on every element: cheaper than
torch's fixed cost per call for the fast filter."""

_MAGNITUDE = 0x7FFFFFFF
_EXPONENT = 0x7F800000


def min_half_spacing(rf: torch.Tensor) -> torch.Tensor:
    """FP64 ``h`` per FP32 element ``r``: half the smaller of the two gaps to ``r``'s FP32 neighbours.

    From the bits: the exponent of the FP32 number just below ``|r|`` (``|r|`` itself at zero)
    gives ``2^E``; ``h = 2^E * 2^-24``, at least ``2^-150`` (subnormal spacing ``2^-149``). At a
    power of two this is the gap toward zero (half the other); everywhere ``h`` is exact.
    """
    a = rf.view(torch.int32).bitwise_and(_MAGNITUDE).sub_(1).clamp_min_(0).bitwise_and_(_EXPONENT)
    return a.view(torch.float32).double().mul_(2.0**-24).clamp_min_(2.0**-150)


def midpoint_candidates(v: torch.Tensor, rf: torch.Tensor, reach: torch.Tensor) -> torch.Tensor | None:
    """Flat indices that may have an FP32 midpoint within ``reach`` of ``v`` (``None``: none does).

    The fast filter of :func:`round_output` and :func:`apply_log`. With ``t = v - RN32(v)`` (exact
    in FP64) and ``h`` = :func:`min_half_spacing`, both midpoints around ``v`` are at least
    ``h - |t|`` from it, and ``fl(h - |t|)`` is the FP64 rounding of exactly the quantity the
    reference computes as ``m - v`` for the nearer midpoint (or a smaller one at a power of two),
    so every element the reference flags (``fl(m - v) <= reach``) is a candidate here (proof:
    docs/numerics.md, "Fast path"). Non-finite ``v`` (or an FP32 overflow) always makes a candidate set.
    """
    if v.device.type == "cpu" and v.numel() <= _SMALL:  # torch's fixed cost per call dominates
        found = midpoint_candidates_np(v.reshape(-1).numpy(), rf.reshape(-1).numpy(),
                                       torch.broadcast_to(reach, v.shape).reshape(-1).numpy())
        return torch.from_numpy(found) if len(found) else None
    gap = min_half_spacing(rf).sub_(torch.sub(v, rf).abs_())  # FP64 - FP32 computes in FP64 (exact widening)
    margin = gap.sub_(reach)  # fl(gap - reach) <= 0 exactly when gap <= reach (no overflow here)
    lo = margin.min()
    if bool(lo > 0):
        return None
    if margin.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(~(margin > 0).numpy()))
    return (~(margin > 0)).nonzero().reshape(-1)


def midpoint_candidates_np(vf: np.ndarray, rf: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """:func:`midpoint_candidates` on flat CPU arrays, the same IEEE operations in numpy:
    ``fl(fl(h - |v - r|) - reach) <= 0`` (NaN included); sorted int64 indices, possibly empty."""
    a = np.maximum((rf.view(np.int32) & 0x7FFFFFFF) - 1, 0) & 0x7F800000
    h = np.maximum(a.view(np.float32).astype(np.float64) * 2.0**-24, 2.0**-150)
    with np.errstate(invalid="ignore", over="ignore"):
        margin = (h - np.abs(vf - rf.astype(np.float64))) - reach
    return np.flatnonzero(~(margin > 0)).astype(np.int64)


def _entries_at(
    vf: torch.Tensor, df: torch.Tensor, rf: torch.Tensor, directed_ok: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference rule on a set of elements: (positions flagged, codes, values)."""
    lo_n, hi_n = _neighbours(rf)
    r64 = rf.double()
    m_hi = (r64 + hi_n.double()) * 0.5
    m_lo = (r64 + lo_n.double()) * 0.5
    reach = 2.0 * df * _CMP_SLACK
    near_hi = (m_hi - vf) <= reach
    near_lo = (vf - m_lo) <= reach
    flagged = (near_hi | near_lo).nonzero().reshape(-1)
    if flagged.numel() == 0:
        empty = torch.zeros(0, dtype=torch.uint8, device=vf.device)
        return flagged, empty, torch.zeros(0, dtype=torch.float32, device=vf.device)
    nh, nl = near_hi[flagged], near_lo[flagged]
    spacing = torch.where(nh, hi_n[flagged].double() - r64[flagged], r64[flagged] - lo_n[flagged].double())
    single = nh ^ nl
    directed = single & (16.0 * df[flagged] * _CMP_SLACK <= spacing)
    if directed_ok is not None:
        directed = directed & directed_ok[flagged]
    dev = vf.device
    code = torch.where(
        directed,
        torch.where(nh, torch.tensor(int(Code.DOWN), device=dev), torch.tensor(int(Code.UP), device=dev)),
        torch.tensor(int(Code.EXPLICIT), device=dev),
    ).to(torch.uint8)
    zero = torch.zeros((), dtype=torch.float32, device=dev)
    value = torch.where(code == int(Code.EXPLICIT), canonical(rf[flagged]), zero)
    return flagged, code, value


def _entries_at_np(
    vf: np.ndarray, df: np.ndarray, rf: np.ndarray, directed_ok: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_entries_at` in numpy, for the few candidates of the fast path (no per-call torch overhead).

    The same IEEE binary64 operations in the same order (sums of neighbours, halving, differences,
    products with the slack), so the same bits; tested against the torch reference."""
    r64 = rf.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        hi_n = np.nextafter(rf, np.float32(np.inf))
        lo_n = np.nextafter(rf, np.float32(-np.inf))
        m_hi = (r64 + hi_n.astype(np.float64)) * 0.5
        m_lo = (r64 + lo_n.astype(np.float64)) * 0.5
        reach = 2.0 * df * _CMP_SLACK
        near_hi = (m_hi - vf) <= reach
        near_lo = (vf - m_lo) <= reach
    flagged = np.flatnonzero(near_hi | near_lo)
    if not len(flagged):
        return flagged, np.zeros(0, np.uint8), np.zeros(0, np.float32)
    nh, nl = near_hi[flagged], near_lo[flagged]
    rfl = r64[flagged]
    spacing = np.where(nh, hi_n[flagged].astype(np.float64) - rfl, rfl - lo_n[flagged].astype(np.float64))
    directed = (nh ^ nl) & (16.0 * df[flagged] * _CMP_SLACK <= spacing)
    if directed_ok is not None:
        directed = directed & directed_ok[flagged]
    code = np.where(directed, np.where(nh, np.uint8(Code.DOWN), np.uint8(Code.UP)), np.uint8(Code.EXPLICIT))
    code = code.astype(np.uint8)
    value = np.where(code == int(Code.EXPLICIT), rf[flagged] + np.float32(0.0), np.float32(0.0)).astype(np.float32)
    return flagged, code, value


def _op_log(index: torch.Tensor, code: torch.Tensor, value: torch.Tensor) -> OpLog:
    return OpLog(
        index.cpu().numpy().astype(np.int64), code.cpu().numpy(), value.cpu().numpy().astype(np.float32)
    )


def round_output(
    v: torch.Tensor,
    d: NF.Bound | None,
    what: str,
    directed_ok: torch.Tensor | None = None,
    directed_floor: float | None = None,
    check_finite: bool | list[torch.Tensor] = True,
) -> tuple[torch.Tensor, OpLog]:
    """Trainer side: round FP64 ``v`` (bound ``d``, ``None`` for exact ops) to FP32 and log per the rule.

    Returns the FP32 output (always ``RN32(v)``, zero canonicalised) and the sparse entries.
    ``directed_ok`` (optional mask) marks elements whose bound is tight enough for a down/up entry;
    ``directed_floor`` says the same lazily (``d > directed_floor``, evaluated on flagged elements
    only); the others get an explicit entry when a midpoint is in reach (always accepted on-chain).
    ``check_finite``: ``True`` checks for NaN/Inf now; ``False`` leaves it to the caller; a list
    gets an FP64 sum of the output to check later (the executor: once per step), nothing when the
    filter already proved every element finite.

    Bit for bit the same output and entries as :func:`round_output_reference` (tested): a cheap
    exact filter (:func:`midpoint_candidates`) finds the few elements with a midpoint in reach and
    the reference rule runs on those only (one fused pass of the native filter where it takes
    ``v``; ``d`` may then be lazy, ``native_filter.Bound``).
    """
    if NF.usable(v):
        return _round_output_native(v, d, what, directed_ok, directed_floor, check_finite)
    d = None if d is None else NF.dense(d)
    r = v.to(torch.float32, copy=True).add_(0.0)  # canonical zero in place: the rule reads -0 as +0
    later = check_finite if isinstance(check_finite, list) else None
    now = check_finite is True
    if d is None:
        if now:
            _check_finite(r.reshape(-1), what)
        out = r
        if later is not None:
            later.extend(finite_probe(out))
        return out, OpLog.empty()
    vf, df, rf = v.reshape(-1), d.reshape(-1), r.reshape(-1)
    if vf.device.type == "cpu" and vf.numel() <= _SMALL:  # torch's per-call cost dominates: numpy rule
        rn = rf.numpy()
        if (now or later is not None) and not np.isfinite(rn).all():
            if now:
                _check_finite_slow(rf, what)
            later.append(torch.tensor(float("nan"), dtype=torch.float64))  # type: ignore[union-attr]
        okn = None if directed_ok is None else directed_ok.reshape(-1).numpy()
        dn = df.numpy()
        if directed_floor is not None:
            okn = dn > directed_floor if okn is None else okn & (dn > directed_floor)
        sub, code, value = _entries_at_np(vf.numpy(), dn, rn, okn)
        if not len(sub):
            return r, OpLog.empty()
        return r, OpLog(sub.astype(np.int64), code, value)
    reach = df * (2.0 * _CMP_SLACK)  # the same bits as the rule's 2.0 * df * _CMP_SLACK (exact doubling)
    cand = midpoint_candidates(vf, rf, reach)
    if cand is None:  # also proves every element finite (a NaN/Inf margin is never > 0)
        return r, OpLog.empty()
    if now:
        _check_finite(rf, what)
    elif later is not None:
        later.extend(finite_probe(rf))
    cand = cand.to(vf.device)
    ok = None
    if directed_ok is not None:
        ok = directed_ok.reshape(-1)[cand]
    c = cand.cpu().numpy()
    if vf.device.type == "cpu":
        vc, dc, rc = vf.numpy()[c], df.numpy()[c], rf.numpy()[c]
    else:
        vc, dc, rc = vf[cand].cpu().numpy(), df[cand].cpu().numpy(), rf[cand].cpu().numpy()
    okc = None if ok is None else ok.cpu().numpy()
    if directed_floor is not None:
        okc = dc > directed_floor if okc is None else okc & (dc > directed_floor)
    sub, code, value = _entries_at_np(vc, dc, rc, okc)
    if not len(sub):
        return r, OpLog.empty()
    return r, OpLog(c[sub].astype(np.int64), code, value)


def _round_output_native(
    v: torch.Tensor,
    d: NF.Bound | None,
    what: str,
    directed_ok: torch.Tensor | None,
    directed_floor: float | None,
    check_finite: bool | list[torch.Tensor],
) -> tuple[torch.Tensor, OpLog]:
    """:func:`round_output` with the native filter: rounding, canonical zeros, candidates and the
    finiteness flag in one pass; the rule (:func:`_entries_at_np`) on the candidates only."""
    later = check_finite if isinstance(check_finite, list) else None
    if d is None:
        r, finite = NF.round_fp32(v)
        cand = None
    else:
        r, cand, finite = NF.round_filter(v, d, 2.0 * _CMP_SLACK)  # reach: the rule's 2 d (1 + 2^-40)
        if not len(cand):  # also proves every element finite (a NaN/Inf margin is never > 0)
            return r, OpLog.empty()
    if not finite:
        if check_finite is True:
            _check_finite(r.reshape(-1), what)
        if later is not None:
            later.append(torch.tensor(float("nan")))
    if cand is None:
        return r, OpLog.empty()
    dc = NF.bound_at(d, cand)  # type: ignore[arg-type]
    okc = None if directed_ok is None else directed_ok.reshape(-1).numpy()[cand]
    if directed_floor is not None:
        okc = dc > directed_floor if okc is None else okc & (dc > directed_floor)
    sub, code, value = _entries_at_np(v.reshape(-1).numpy()[cand], dc, r.reshape(-1).numpy()[cand], okc)
    if not len(sub):
        return r, OpLog.empty()
    return r, OpLog(cand[sub].astype(np.int64), code, value)


def round_output_reference(
    v: torch.Tensor, d: torch.Tensor | None, what: str, directed_ok: torch.Tensor | None = None
) -> tuple[torch.Tensor, OpLog]:
    """The rule evaluated on every element (the specification :func:`round_output` must equal)."""
    r = v.to(torch.float32)
    _check_finite_slow(r.reshape(-1), what)
    if d is None:
        return canonical(r), OpLog.empty()
    vf, df, rf = v.reshape(-1), d.reshape(-1), r.reshape(-1)
    ok = None if directed_ok is None else directed_ok.reshape(-1)
    flagged, code, value = _entries_at(vf, df, rf, ok)
    if flagged.numel() == 0:
        return canonical(r), OpLog.empty()
    return canonical(r), _op_log(flagged, code, value)


_F = TypeVar("_F", bound=Callable[..., object])

AmbiguityResolver = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""``resolver(indices, proposed, codes, flagged)``: for flat element indices of the current op, the
values the replay proposes (FP32), the trainer's codes there (0 = no entry) and which of them the
replay's own checks flagged, return the values the contract would uphold: the auditor's fallback to
exact arithmetic (``vtrain.numerics.exact``). Every applied entry is passed, flagged or not: the
contract demands ``RN32(e)`` of every claim, so an unflagged entry must still give that value."""

UPHOLDS_RN32_ENTRIES = "upholds_rn32_entries"
"""The attribute by which a resolver factory (``factory(op, inputs) -> AmbiguityResolver``, the
executor's ``resolver_factory``) declares (True) that every resolver it makes, called with no flagged
key and with each proposed value an applied entry's value that is ``RN32(e)`` of its element by the
double-double comparison of ``canonical.is_exact_rounding`` (verdict YES, not ``-0``), returns the
proposed values unchanged and does nothing else. A checked replay may then settle such an op natively
without making or calling the resolver (``native_replay.VERDICTS``); a factory without it (a test's
counting resolver, any custom one) gets every call."""


def upholds_rn32_entries(factory: object) -> bool:
    """Whether ``factory`` declares :data:`UPHOLDS_RN32_ENTRIES`."""
    return getattr(factory, UPHOLDS_RN32_ENTRIES, False) is True


def declare_upholds_rn32_entries(factory: _F) -> _F:
    """Mark a resolver factory as upholding RN32 entries (:data:`UPHOLDS_RN32_ENTRIES`); returns it."""
    setattr(factory, UPHOLDS_RN32_ENTRIES, True)
    return factory


@dataclass
class LogViolation:
    """An element the replayer could not settle by the rule alone (possible log abuse or near-tie)."""

    index: int
    code: int
    detail: str


def apply_log(
    v: torch.Tensor,
    d: NF.Bound | None,
    entries: OpLog,
    what: str,
    resolver: AmbiguityResolver | None = None,
    violations: list[LogViolation] | None = None,
    check_finite: bool = True,
    exact: Callable[[np.ndarray], np.ndarray] | None = None,
    tight: Callable[[np.ndarray], np.ndarray] | None = None,
    filtered: tuple[torch.Tensor, np.ndarray, bool] | None = None,
    near: np.ndarray | None = None,
) -> torch.Tensor:
    """Auditor side: round its own FP64 ``v`` with the trainer's entries; bit-identical to an honest trainer.

    With ``violations`` (a list to fill) or ``resolver``, it also looks for elements the rule alone
    cannot settle: an entry far from the replayed value (log abuse), an entry on an exact op, or an
    unlogged element within ``2d`` of a midpoint. Those are reported and, given a resolver, replaced
    by the value exact arithmetic upholds; a resolver also gets every other applied entry, to check
    its value against ``RN32(e)`` (a wrong side or explicit value the FP64 checks cannot see).
    ``exact(indices)`` (optional) marks elements whose every honest FP64 value is exact
    (``canonical.grid_elements``: exact-grid sums carry no entry even at an exact midpoint, and
    ``RN32(v)`` is right there): an unlogged near-tie among them is no suspect.
    ``tight(indices)`` (optional) gives another valid bound at flat indices (``canonical.tight_bound_at``:
    a MATMUL's bound from its exact terms); the checks then use ``min(d, tight)`` elementwise: ``d``
    (cheap, e.g. the norm bound) filters, ``tight`` is read at the candidates and entries only.
    ``check_finite=False`` leaves the NaN/Inf check to the caller. Works on any device (the entries
    are moved to ``v``'s). ``d`` may be lazy (``native_filter.Bound``); where the native filter takes
    ``v``, rounding, canonical zeros, the finiteness check and (checking) the near-tie filter are
    one pass; ``filtered`` (checking there) is that pass's ``(r, candidates, finite)`` at reach
    ``d * REPLAY_SCALE`` where the caller has it already (SUM/MEAN: with ``v`` and ``d``); ``near``
    (with ``filtered``): per candidate, :func:`_near_midpoint_np` at ``2 min(d, tight) _CMP_SLACK``,
    where that pass computed it (``native_replay``: the same operations, so the same flags).
    """
    exact_op = d is None
    checking = violations is not None or resolver is not None
    native = NF.usable(v)
    if native and checking and not exact_op:
        return _apply_log_checked(v, d, entries, what, resolver, violations, check_finite, exact, tight,  # type: ignore[arg-type]
                                  filtered, near if filtered is not None else None)
    if native:  # r already canonical: only the positions written below are canonicalised
        r, finite = NF.round_fp32(v)
        overflow = _replay_overflows(v, r, entries, resolver is not None, what) if check_finite and not finite else None
    else:
        d = NF.dense(d) if checking and d is not None else d  # a lazy d is read at entries only otherwise
        r = v.to(torch.float32)
        overflow = None
        if check_finite and not all_finite(r):
            overflow = _replay_overflows(v, r, entries, resolver is not None, what)
    dev = v.device
    suspect: dict[int, tuple[int, str]] = {}
    vf = v.reshape(-1)
    if overflow is not None:  # the entries and the resolver read FLT_MAX there (its virtual neighbour 2^128)
        ot = torch.from_numpy(overflow).to(dev)
        r.reshape(-1)[ot] = torch.copysign(torch.tensor(_FLT_MAX, dtype=torch.float32, device=dev), vf[ot].float())
        for k in overflow[~np.isin(overflow, entries.index)].tolist():
            suspect[int(k)] = (0, "replayed value overflows FP32")
    if not len(entries) and not checking:
        return r if native else canonical(r)
    near = None
    if checking and not exact_op:  # before the entries are applied: the filter reads RN32(v)
        near = unlogged_near_ties(vf, d.reshape(-1), r.reshape(-1), entries, tight)  # type: ignore[union-attr]
    out = r.reshape(-1) if native else r.reshape(-1).clone()
    if len(entries):
        _check_entries(entries, out.numel(), what)
        if dev.type == "cpu":  # few entries: numpy, no torch cost per call (the same IEEE operations)
            applied, bad = _apply_entries_cpu(vf.numpy(), out.numpy(), d, entries, checking, exact_op, tight)
            out.numpy()[entries.index] = applied + np.float32(0.0) if native else applied
        else:
            applied, bad = _apply_entries_torch(vf, out, d, entries, checking, exact_op, tight)
            out[torch.from_numpy(entries.index).to(dev)] = canonical(applied) if native else applied
            applied = applied.cpu().numpy()
        for k in bad.tolist():
            suspect[int(entries.index[k])] = (int(entries.code[k]), "entry far from the replayed value")
    if near is not None:
        if exact is not None and len(near):
            near = near[~np.asarray(exact(near), dtype=bool)]
        for k in near.tolist():
            suspect[int(k)] = (0, "unlogged element near a midpoint")
    flagged_keys = np.array(sorted(suspect), dtype=np.int64)
    if violations is not None:
        violations.extend(LogViolation(int(k), suspect[int(k)][0], suspect[int(k)][1]) for k in flagged_keys)
    if resolver is not None and (suspect or len(entries)):
        # every applied entry goes to the resolver too: its value must be RN32(e) (the contract's rule)
        keys = np.union1d(flagged_keys, entries.index.astype(np.int64)) if len(entries) else flagged_keys
        codes_np = np.zeros(len(keys), dtype=np.uint8)
        if len(entries):
            codes_np[np.searchsorted(keys, entries.index)] = entries.code
        flagged = np.isin(keys, flagged_keys)
        kt = torch.from_numpy(keys).to(dev)
        if native:  # the values the plain path proposes: RN32(v) and the applied entries, zeros as they are
            proposed = vf[kt].to(torch.float32).numpy()
            if len(entries):
                proposed[np.searchsorted(keys, entries.index)] = applied
        else:
            proposed = out[kt].cpu().numpy().copy()
        res = torch.from_numpy(resolver(keys, proposed, codes_np, flagged).astype(np.float32)).to(dev)
        out[kt] = canonical(res) if native else res
    if overflow is not None:  # the entries (or the resolver) settled the FP32 overflows of v, or this raises
        _check_finite(out, what)
    return out.reshape(r.shape) if native else canonical(out.reshape(r.shape))


def _check_entries(entries: OpLog, n: int, what: str) -> None:
    """A replay's entries for an op of ``n`` elements: every index inside it, every code 1-3, else
    :class:`VtrainError` naming the op (read before any entry is applied)."""
    if int(entries.index.max()) >= n or int(entries.index.min()) < 0:
        raise VtrainError(f"{what}: log index out of range for {n} elements")
    if bool(((entries.code < 1) | (entries.code > 3)).any()):
        raise VtrainError(f"{what}: invalid rounding-log code")


def _replay_overflows(
    v: torch.Tensor, r: torch.Tensor, entries: OpLog, resolving: bool, what: str
) -> np.ndarray | None:
    """:func:`apply_log`'s finiteness check where ``r = RN32(v)`` is not finite: the flat positions
    (sorted) where every such element is an FP32 overflow of a finite ``v`` that an entry (or, with
    ``resolving``, the exact resolver) settles, else raise :class:`NonFiniteValue`. Near the RN32
    boundary ``2^128 - 2^103`` an honest ``v'`` may round to infinity while ``RN32(e)`` is FLT_MAX:
    the trainer then logs the near-tie (``down`` at +FLT_MAX, ``up`` at -FLT_MAX) or an explicit
    value, which applied to FLT_MAX give that value; an unlogged one is a suspect the resolver rules
    on. The caller checks the final output again (an ``up`` at +FLT_MAX claims infinity)."""
    rf, vf = r.reshape(-1), v.reshape(-1)
    bad = (~torch.isfinite(rf)).nonzero().reshape(-1)
    if not bad.numel():
        return None
    if bool(torch.isnan(rf[bad]).any()) or not bool(torch.isfinite(vf[bad]).all()):
        _check_finite(rf, what)
    pos = bad.cpu().numpy().astype(np.int64)
    if not resolving and not bool(np.isin(pos, entries.index).all()):
        _check_finite(rf, what)
    return pos


_FLT_MAX = float(np.finfo(np.float32).max)
_TWO128 = 2.0**128
"""The virtual FP32 neighbour beyond FLT_MAX (the contract's, ``exact.midpoint``): the midpoints
next to +-FLT_MAX are +-(2^128 - 2^103), where RN32 overflows."""


def _apply_log_checked(
    v: torch.Tensor,
    d: NF.Bound,
    entries: OpLog,
    what: str,
    resolver: AmbiguityResolver | None,
    violations: list[LogViolation] | None,
    check_finite: bool,
    exact: Callable[[np.ndarray], np.ndarray] | None,
    tight: Callable[[np.ndarray], np.ndarray] | None,
    filtered: tuple[torch.Tensor, np.ndarray, bool] | None = None,
    near_flags: np.ndarray | None = None,
) -> torch.Tensor:
    """:func:`apply_log` checking a logging op's ``v`` where the native filter takes it: the same
    outputs, violations and resolver calls, with ``d`` (and ``tight``) read once, at the candidates
    and the entries together, and numpy on those few points only (no per-element array beyond the
    filter's pass, or none: ``filtered``). ``near_flags``: the near-tie test of each of ``filtered``'s
    candidates, made by that pass (then ``d`` is read at the entries only)."""
    r, cand, finite = NF.round_filter(v, d, REPLAY_SCALE) if filtered is None else filtered
    overflow = _replay_overflows(v, r, entries, resolver is not None, what) if check_finite and not finite else None
    n_e = len(entries)
    if not len(cand) and not n_e and overflow is None:
        return r  # no entry, no element within 2d of a midpoint: nothing to check or resolve
    out = r.reshape(-1)
    vn, rn = v.reshape(-1).numpy(), out.numpy()
    suspect: dict[int, tuple[int, str]] = {}
    if overflow is not None:  # the entries and the resolver read FLT_MAX there (its virtual neighbour 2^128)
        rn[overflow] = np.copysign(np.float32(_FLT_MAX), vn[overflow]).astype(np.float32)
        for k in overflow[~np.isin(overflow, entries.index)].tolist():
            suspect[int(k)] = (0, "replayed value overflows FP32")
    if n_e:
        _check_entries(entries, out.numel(), what)
        if len(cand):  # an entry is never an unlogged near-tie (both sorted: a binary search each)
            keep = ~_in_sorted(cand, entries.index)
            cand = cand[keep]
            near_flags = near_flags[keep] if near_flags is not None else None
    n_c = len(cand)
    if near_flags is not None:  # the pass tested the candidates: d is read at the entries only
        d_e = _bound_at(d, entries.index, tight) if n_e else None
        near = cand[near_flags]
    else:
        # d (and the tight bound: elementwise, so one call on both sets gives each its bits) at the points
        at = cand if not n_e else entries.index if not n_c else np.concatenate([cand, entries.index])
        d_at = _bound_at(d, at, tight)
        d_e = d_at[n_c:]
        near = cand[_near_midpoint_np(vn[cand], rn[cand], 2.0 * d_at[:n_c] * _CMP_SLACK)] if n_c else cand
    applied = None
    if n_e:  # after the near-tie test: it reads RN32(v)
        applied, bad = _apply_entries_cpu(vn, rn, d, entries, True, False, di=d_e)
        rn[entries.index] = applied + np.float32(0.0)
        for k in bad.tolist():
            suspect[int(entries.index[k])] = (int(entries.code[k]), "entry far from the replayed value")
    if exact is not None and len(near):
        near = near[~np.asarray(exact(near), dtype=bool)]
    for k in near.tolist():
        suspect[int(k)] = (0, "unlogged element near a midpoint")
    flagged_keys = np.array(sorted(suspect), dtype=np.int64)
    if violations is not None:
        violations.extend(LogViolation(int(k), suspect[int(k)][0], suspect[int(k)][1]) for k in flagged_keys)
    if resolver is not None and (suspect or n_e):
        # every applied entry goes to the resolver too: its value must be RN32(e) (the contract's rule)
        if not n_e:
            keys = flagged_keys
        elif not suspect and (n_e == 1 or bool((entries.index[1:] > entries.index[:-1]).all())):
            keys = entries.index.astype(np.int64)  # np.union1d's result: sorted, unique already
        else:
            keys = np.union1d(flagged_keys, entries.index.astype(np.int64))
        codes_np = np.zeros(len(keys), dtype=np.uint8)
        with np.errstate(over="ignore"):
            proposed = vn[keys].astype(np.float32)  # RN32(v), zeros as they are (torch's .to's bits)
        if n_e:
            pos = np.searchsorted(keys, entries.index)
            codes_np[pos] = entries.code
            proposed[pos] = applied
        flagged = _in_sorted(keys, flagged_keys)
        res = resolver(keys, proposed, codes_np, flagged).astype(np.float32)
        rn[keys] = res + np.float32(0.0)
    if overflow is not None:  # the entries (or the resolver) settled the FP32 overflows of v, or this raises
        _check_finite(out, what)
    return r


FAR_REACH = 4.0
"""A directed entry is suspect when the replayed ``v'`` is farther than ``FAR_REACH * d`` from the
midpoint it names: an honest canonical one is within ``2 Dc + d <= 4 d`` (docs/numerics.md)."""


def _bound_at(d: NF.Bound, index: np.ndarray, tight: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    """``d`` at flat indices (FP64), ``min(d, tight)`` with a tighter bound."""
    if isinstance(d, torch.Tensor) and d.device.type == "cpu":
        got = d.detach().reshape(-1).numpy()[index]  # a gather: torch's indexing's values, without its cost per call
    elif isinstance(d, torch.Tensor):
        got = d.reshape(-1)[torch.from_numpy(index).to(d.device)].cpu().numpy()
    else:
        got = np.asarray(NF.bound_at(d, index), dtype=np.float64)
    return got if tight is None or not len(index) else np.minimum(got, tight(index))


def _entry_bounds(
    d: NF.Bound | None, entries: OpLog, n: int, tight: Callable[[np.ndarray], np.ndarray] | None = None
) -> np.ndarray:
    if d is None:
        return np.zeros(n, dtype=np.float64)
    return _bound_at(d, entries.index, tight)


def _apply_entries_cpu(
    vf: np.ndarray, rf: np.ndarray, d: NF.Bound | None, entries: OpLog, checking: bool, exact_op: bool,
    tight: Callable[[np.ndarray], np.ndarray] | None = None, di: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_apply_entries_np` in C where the kernel is loaded (``native_replay.apply_entries``, the
    same bits: tested), numpy otherwise."""
    if checking and di is None:
        di = _entry_bounds(d, entries, len(entries), tight)
    got = native_replay.apply_entries(vf, rf, entries.index, entries.code, entries.value,
                                      di if checking else None, FAR_REACH, exact_op)
    if got is not None:
        return got
    return _apply_entries_np(vf, rf, d, entries, checking, exact_op, tight, di=di)


def _apply_entries_np(
    vf: np.ndarray, rf: np.ndarray, d: NF.Bound | None, entries: OpLog, checking: bool, exact_op: bool,
    tight: Callable[[np.ndarray], np.ndarray] | None = None, di: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The values the entries give (FP32, zeros as computed) and, when ``checking``, the positions of
    entries far from the replayed value: :func:`_apply_entries_torch` in numpy on the CPU (the same
    IEEE operations, so the same bits; tested against it). ``di``: the bound at the entries when the
    caller has read it already (``min(d, tight)``)."""
    idx = entries.index
    vi, ri = vf[idx], rf[idx]
    with np.errstate(over="ignore", invalid="ignore"):
        hi_n, lo_n = np.nextafter(ri, np.float32(np.inf)), np.nextafter(ri, np.float32(-np.inf))
        r64 = ri.astype(np.float64)
        m_hi = (r64 + np.minimum(hi_n.astype(np.float64), _TWO128)) * 0.5  # next to FLT_MAX: 2^128 - 2^103
        m_lo = (r64 + np.maximum(lo_n.astype(np.float64), -_TWO128)) * 0.5
        take_hi = (m_hi - vi) <= (vi - m_lo)
        directed = np.where(entries.code == int(Code.DOWN), np.where(take_hi, ri, lo_n), np.where(take_hi, hi_n, ri))
        is_explicit = entries.code == int(Code.EXPLICIT)
        applied = np.where(is_explicit, entries.value.astype(np.float32), directed).astype(np.float32)
        if not checking:
            return applied, np.zeros(0, dtype=np.int64)
        di = _entry_bounds(d, entries, len(idx), tight) if di is None else di
        m = np.where(take_hi, m_hi, m_lo)
        far = ~is_explicit & ((np.abs(vi - m) > FAR_REACH * di) | exact_op)
        c = entries.value.astype(np.float32)  # wild: v' farther than d from every real rounding to c
        c64 = c.astype(np.float64)
        c_hi = (c64 + np.nextafter(c, np.float32(np.inf)).astype(np.float64)) * 0.5
        c_lo = (c64 + np.nextafter(c, np.float32(-np.inf)).astype(np.float64)) * 0.5
        wild = is_explicit & (((vi - c_hi) > di) | ((c_lo - vi) > di))
    return applied, np.flatnonzero(far | wild)


def _apply_entries_torch(
    vf: torch.Tensor, out: torch.Tensor, d: NF.Bound | None, entries: OpLog, checking: bool, exact_op: bool,
    tight: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`_apply_entries_np` on any device, in torch (the values stay on ``vf``'s device)."""
    dev = vf.device
    idx = torch.from_numpy(entries.index).to(dev)
    codes = torch.from_numpy(entries.code.astype(np.int64)).to(dev)
    vi, ri = vf[idx], out[idx]
    lo_n, hi_n = _neighbours(ri)
    r64 = ri.double()
    m_hi = (r64 + hi_n.double().clamp_max(_TWO128)) * 0.5  # next to FLT_MAX: 2^128 - 2^103
    m_lo = (r64 + lo_n.double().clamp_min(-_TWO128)) * 0.5
    take_hi = (m_hi - vi) <= (vi - m_lo)
    below = torch.where(take_hi, ri, lo_n)  # FP32 neighbours of the chosen midpoint
    above = torch.where(take_hi, hi_n, ri)
    directed = torch.where(codes == int(Code.DOWN), below, above)
    explicit = torch.from_numpy(entries.value).to(dev)
    applied = torch.where(codes == int(Code.EXPLICIT), explicit, directed)
    if not checking:
        return applied, np.zeros(0, dtype=np.int64)
    di = torch.from_numpy(_entry_bounds(d, entries, len(entries), tight)).to(dev)
    m = torch.where(take_hi, m_hi, m_lo)
    far = (codes != int(Code.EXPLICIT)) & ((vi - m).abs() > FAR_REACH * di)
    c_lo, c_hi = _neighbours(explicit)
    c64 = explicit.double()
    wild = (codes == int(Code.EXPLICIT)) & (
        ((vi - (c64 + c_hi.double()) * 0.5) > di) | (((c64 + c_lo.double()) * 0.5 - vi) > di))
    if exact_op:
        far = far | (codes != int(Code.EXPLICIT))
    return applied, (far | wild).nonzero().reshape(-1).cpu().numpy()


def unlogged_near_ties(
    vf: torch.Tensor, df: torch.Tensor, rf: torch.Tensor, entries: OpLog,
    tight: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Flat indices without an entry whose ``v`` has a midpoint within ``2d`` (sorted, int64); with
    ``tight`` (another valid bound at flat indices), ``d = min(df, tight)``.

    The fast filter (:func:`midpoint_candidates`, on ``df``: a superset) first, the reference test on
    its candidates only; the same set as :func:`unlogged_near_ties_reference` on the dense
    ``min(df, tight)`` (tested)."""
    reach = 2.0 * df * _CMP_SLACK
    cand = midpoint_candidates(vf, rf, reach)
    if cand is None:
        return np.zeros(0, np.int64)
    cand = cand.to(vf.device)
    reach_c = reach[cand]
    if tight is not None:
        dc = torch.from_numpy(_bound_at(df, cand.cpu().numpy(), tight)).to(vf.device)
        reach_c = 2.0 * dc * _CMP_SLACK
    near = _near_midpoint(vf[cand], rf[cand], reach_c)
    hits = cand[near].cpu().numpy().astype(np.int64)
    return hits[~np.isin(hits, entries.index)] if len(entries) else hits


def _in_sorted(x: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``np.isin(x, keys)`` for sorted ``keys``, by binary search (no sort of ``x``, which may be large)."""
    if not len(keys):
        return np.zeros(len(x), dtype=bool)
    pos = np.minimum(np.searchsorted(keys, x), len(keys) - 1)
    return keys[pos] == x


def _near_midpoint_np(vf: np.ndarray, rf: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """:func:`_near_midpoint` in numpy (the same IEEE operations; no torch cost per call on few elements)."""
    inf = np.float32(np.inf)
    r64 = rf.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = (r64 + np.minimum(np.nextafter(rf, inf).astype(np.float64), _TWO128)) * 0.5 - vf <= reach
        lo = vf - (r64 + np.maximum(np.nextafter(rf, -inf).astype(np.float64), -_TWO128)) * 0.5 <= reach
    return hi | lo


def _near_midpoint(vf: torch.Tensor, rf: torch.Tensor, reach: torch.Tensor) -> torch.Tensor:
    lo_n, hi_n = _neighbours(rf)
    r64 = rf.double()
    m_hi = (r64 + hi_n.double().clamp_max(_TWO128)) * 0.5  # next to FLT_MAX: 2^128 - 2^103
    m_lo = (r64 + lo_n.double().clamp_min(-_TWO128)) * 0.5
    return ((m_hi - vf) <= reach) | ((vf - m_lo) <= reach)


def unlogged_near_ties_reference(
    vf: torch.Tensor, df: torch.Tensor, rf: torch.Tensor, entries: OpLog
) -> np.ndarray:
    """:func:`unlogged_near_ties` on every element (the specification)."""
    amb = _near_midpoint(vf, rf, 2.0 * df * _CMP_SLACK)
    if len(entries):
        amb[torch.from_numpy(entries.index).to(vf.device)] = False
    return amb.nonzero().reshape(-1).cpu().numpy().astype(np.int64)


# --- the paper's baseline (vtrain.numerics.paper): its trits packed five to a byte ----------------


def pack_trits(trits: np.ndarray) -> bytes:
    """Pack trits five to a byte (3^5 = 243 <= 256), first trit in the lowest digit, zero-padded to
    a multiple of 5: the paper's ``Tensor012Logger.put_tensor``."""
    n = len(trits)
    pad = (-n) % 5
    t = np.concatenate([trits.astype(np.uint16), np.zeros(pad, np.uint16)]).reshape(-1, 5)
    packed = t[:, 0] + 3 * t[:, 1] + 9 * t[:, 2] + 27 * t[:, 3] + 81 * t[:, 4]
    return packed.astype(np.uint8).tobytes()


def unpack_trits(data: bytes, n: int) -> np.ndarray:
    """Inverse of :func:`pack_trits`."""
    p = np.frombuffer(data, np.uint8).astype(np.uint16)
    if len(p) * 5 < n:
        raise VtrainError(f"paper log truncated: expected {(n + 4) // 5} bytes, got {len(p)}")
    out = np.stack([(p // 3**k) % 3 for k in range(5)], axis=1).reshape(-1)[:n]
    return out.astype(np.uint8)
