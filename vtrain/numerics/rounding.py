"""The numerics policy: FP64 compute, FP32 rounding, certified error bounds and the rounding log.

Everything a training step computes goes through :func:`round_output` (trainer) or
:func:`apply_log` (auditor). The rule is documented in ``docs/numerics.md``; the contract applies
the same rule to one element (``contracts/Adjudicator.sol``, ``vtrain/numerics/exact.py``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from vtrain.errors import NonFiniteValue, VtrainError

log = logging.getLogger(__name__)

U = 2.0**-53
"""Unit roundoff of IEEE binary64."""

TRAINER_BOUND_SLACK = 1.01
"""The trainer evaluates ``sum|t_k|`` in FP32 and scales it by this factor (see docs/numerics.md)."""

_CMP_SLACK = 1.0 + 2.0**-40
"""Slack on FP64 comparisons so every decision stays on the safe side of the proof."""


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


def _check_finite(x: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).nonzero()[0][0]) if x.dim() == 1 else -1
        raise NonFiniteValue(f"{what}: expected finite values, got NaN/Inf (first flat index {bad})")


def canonical(x: torch.Tensor) -> torch.Tensor:
    """Map -0.0 to +0.0 (adding +0.0 does exactly that under round-to-nearest)."""
    return x + 0.0


def round_output(
    v: torch.Tensor, d: torch.Tensor | None, what: str, directed_ok: torch.Tensor | None = None
) -> tuple[torch.Tensor, OpLog]:
    """Trainer side: round FP64 ``v`` (bound ``d``, ``None`` for exact ops) to FP32 and log per the rule.

    Returns the FP32 output (always ``RN32(v)``, zero canonicalised) and the sparse entries.
    ``directed_ok`` (optional mask) marks elements whose bound is tight enough for a down/up entry;
    the others get an explicit entry when a midpoint is in reach (always accepted on-chain).
    """
    r = v.to(torch.float32)
    _check_finite(r.reshape(-1), what)
    if d is None:
        return canonical(r), OpLog.empty()
    vf, df, rf = v.reshape(-1), d.reshape(-1), r.reshape(-1)
    lo_n, hi_n = _neighbours(rf)
    r64 = rf.double()
    m_hi = (r64 + hi_n.double()) * 0.5
    m_lo = (r64 + lo_n.double()) * 0.5
    reach = 2.0 * df * _CMP_SLACK
    near_hi = (m_hi - vf) <= reach
    near_lo = (vf - m_lo) <= reach
    flagged = (near_hi | near_lo).nonzero().reshape(-1)
    if flagged.numel() == 0:
        return canonical(r), OpLog.empty()
    nh, nl = near_hi[flagged], near_lo[flagged]
    spacing = torch.where(nh, hi_n[flagged].double() - r64[flagged], r64[flagged] - lo_n[flagged].double())
    single = nh ^ nl
    directed = single & (16.0 * df[flagged] * _CMP_SLACK <= spacing)
    if directed_ok is not None:
        directed = directed & directed_ok.reshape(-1)[flagged]
    code = torch.where(
        directed,
        torch.where(nh, torch.tensor(int(Code.DOWN)), torch.tensor(int(Code.UP))),
        torch.tensor(int(Code.EXPLICIT)),
    ).to(torch.uint8)
    value = torch.where(code == int(Code.EXPLICIT), canonical(rf[flagged]), torch.zeros((), dtype=torch.float32))
    return canonical(r), OpLog(flagged.numpy().astype(np.int64), code.numpy(), value.numpy().astype(np.float32))


AmbiguityResolver = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""``resolver(indices, proposed, codes)``: for flat element indices of the current op, the values
the replay proposes (FP32) and the trainer's codes there (0 = no entry), return the values the
contract would uphold: the auditor's fallback to exact arithmetic (``vtrain.numerics.exact``)."""


@dataclass
class LogViolation:
    """An element the replayer could not settle by the rule alone (possible log abuse or near-tie)."""

    index: int
    code: int
    detail: str


def apply_log(
    v: torch.Tensor,
    d: torch.Tensor | None,
    entries: OpLog,
    what: str,
    resolver: AmbiguityResolver | None = None,
    violations: list[LogViolation] | None = None,
) -> torch.Tensor:
    """Auditor side: round its own FP64 ``v`` with the trainer's entries; bit-identical to an honest trainer.

    With ``violations`` (a list to fill) or ``resolver``, it also looks for elements the rule alone
    cannot settle: an entry far from the replayed value (log abuse), an entry on an exact op, or an
    unlogged element within ``2d`` of a midpoint. Those are reported and, given a resolver, replaced
    by the value exact arithmetic upholds.
    """
    r = v.to(torch.float32)
    _check_finite(r.reshape(-1), what)
    out = r.reshape(-1).clone()
    suspect: dict[int, tuple[int, str]] = {}
    exact_op = d is None
    vf = v.reshape(-1)
    df = torch.zeros_like(vf) if d is None else d.reshape(-1)
    if len(entries):
        idx = torch.from_numpy(entries.index)
        if int(idx.max()) >= out.numel() or int(idx.min()) < 0:
            raise VtrainError(f"{what}: log index out of range for {out.numel()} elements")
        codes = torch.from_numpy(entries.code.astype(np.int64))
        if bool(((codes < 1) | (codes > 3)).any()):
            raise VtrainError(f"{what}: invalid rounding-log code")
        vi, di, ri = vf[idx], df[idx], out[idx]
        lo_n, hi_n = _neighbours(ri)
        r64 = ri.double()
        m_hi = (r64 + hi_n.double()) * 0.5
        m_lo = (r64 + lo_n.double()) * 0.5
        take_hi = (m_hi - vi) <= (vi - m_lo)
        m = torch.where(take_hi, m_hi, m_lo)
        below = torch.where(take_hi, ri, lo_n)  # FP32 neighbours of the chosen midpoint
        above = torch.where(take_hi, hi_n, ri)
        directed = torch.where(codes == int(Code.DOWN), below, above)
        explicit = torch.from_numpy(entries.value)
        out[idx] = torch.where(codes == int(Code.EXPLICIT), explicit, directed)
        if violations is not None or resolver is not None:
            far = (codes != int(Code.EXPLICIT)) & ((vi - m).abs() > 3.0 * di)
            wild = (codes == int(Code.EXPLICIT)) & ((explicit.double() - vi).abs() > 6.0 * di)
            if exact_op:
                far = far | (codes != int(Code.EXPLICIT))
            for k in (far | wild).nonzero().reshape(-1).tolist():
                suspect[int(entries.index[k])] = (int(entries.code[k]), "entry far from the replayed value")
    if (violations is not None or resolver is not None) and not exact_op:
        rf = r.reshape(-1)
        lo_n, hi_n = _neighbours(rf)
        r64 = rf.double()
        reach = 2.0 * df * _CMP_SLACK
        amb = (((r64 + hi_n.double()) * 0.5 - vf) <= reach) | ((vf - (r64 + lo_n.double()) * 0.5) <= reach)
        if len(entries):
            amb[torch.from_numpy(entries.index)] = False
        for k in amb.nonzero().reshape(-1).tolist():
            suspect[int(k)] = (0, "unlogged element near a midpoint")
    if suspect:
        keys = np.array(sorted(suspect), dtype=np.int64)
        if violations is not None:
            violations.extend(LogViolation(int(k), suspect[int(k)][0], suspect[int(k)][1]) for k in keys)
        if resolver is not None:
            codes_np = np.array([suspect[int(k)][0] for k in keys], dtype=np.uint8)
            proposed = out[torch.from_numpy(keys)].numpy().copy()
            out[torch.from_numpy(keys)] = torch.from_numpy(resolver(keys, proposed, codes_np).astype(np.float32))
    return canonical(out.reshape(r.shape))


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
