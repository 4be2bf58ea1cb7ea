"""Custom errors of the contracts, said in words.

A revert arrives as a selector and ABI-encoded arguments (``Chain._decode_revert`` decodes them).
:func:`explain` turns ``WrongJobStatus(1, 1, 2)`` into "job 1 is Open; reclaimJob needs Active":
common errors have a sentence of their own; any other error is shown with its parameter names from
the ABI, enum values by name. Enum member names mirror ``contracts/lib/GameTypes.sol``
(``tests/test_reverts.py`` checks them against the compiler's AST).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import Any

#: Member names of the contracts' enums, in declaration order (``contracts/lib/GameTypes.sol``).
ENUMS: dict[str, tuple[str, ...]] = {
    "JobStatus": ("None", "Open", "Active", "Cancelled", "Finalized", "Fraudulent"),
    "Phase": (
        "None", "Steps", "TraceCommit", "Trace", "Element", "Pick", "OneStep", "Done",
        "Partials", "ChunkCheck", "PartialsRule",
    ),
    "Party": ("None", "Trainer", "Challenger"),
    "GameStatus": ("None", "InProgress", "TrainerWon", "ChallengerWon", "Closed"),
    "Ruling": ("None", "Timeout", "Bind", "Adjudicated", "JobFraudulent"),
}

#: The move each game phase expects (for WrongPhase).
_PHASE_MOVE = {
    "Steps": "a bisection move (reveal/choose) or openStep",
    "TraceCommit": "commitTrace",
    "Trace": "a bisection move (reveal/choose) or openOp",
    "Element": "a bisection move (reveal/choose) or openChunk",
    "Pick": "pickElement",
    "OneStep": "oneStep (or postPartials for a long reduction)",
    "Done": "nothing: the game is over",
    "Partials": "disputeChunk or acceptPartials",
    "ChunkCheck": "settlePartials",
    "PartialsRule": "settlePartials",
}


def enum_name(enum: str, value: int) -> str:
    """The member name of ``value`` in contract enum ``enum`` (``"JobStatus"``), or ``"#<value>"``."""
    members = ENUMS.get(enum, ())
    return members[value] if 0 <= value < len(members) else f"#{value}"


def _when(t: int) -> str:
    return _dt.datetime.fromtimestamp(int(t), _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: int) -> str:
    s = abs(int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


def _eth(wei: int) -> str:
    return f"{wei} wei" if wei < 10**12 else f"{wei / 10**18:g} ETH"


_Sentence = Callable[[str, dict[str, Any]], str]

_SENTENCES: dict[str, _Sentence] = {
    "UnknownJob": lambda call, a: f"job {a['job']} does not exist",
    "WrongJobStatus": lambda call, a: (
        f"job {a['job']} is {enum_name('JobStatus', a['status'])}; {call} needs {enum_name('JobStatus', a['expected'])}"
    ),
    "InvalidJobParam": lambda call, a: f"job parameter {a['field']} = {a['value']} is out of range",
    "Unauthorized": lambda call, a: f"{call} may be called only by {a['expected']}, not {a['caller']}",
    "WrongValue": lambda call, a: f"{call} needs exactly {_eth(a['expected'])} sent, got {_eth(a['sent'])}",
    "WrongInterval": lambda call, a: (
        f"interval {a['index']} cannot be posted: the next one is {a['expected']} of {a['nIntervals']}"
    ),
    "ZeroRoot": lambda call, a: "a zero root cannot be posted",
    "IntervalNotPosted": lambda call, a: (
        f"interval {a['index']} of job {a['job']} is not posted yet ({a['posted']} posted)"
    ),
    "WindowClosed": lambda call, a: (
        f"the challenge window of job {a['job']} interval {a['index']} closed at {_when(a['windowEnd'])}, "
        f"{_span(a['now_'] - a['windowEnd'])} ago"
    ),
    "IntervalsMissing": lambda call, a: (
        f"job {a['job']} has {a['posted']} of {a['nIntervals']} intervals posted; {call} needs all of them"
    ),
    "WindowStillOpen": lambda call, a: (
        f"job {a['job']}'s last challenge window is open until {_when(a['windowEnd'])} "
        f"({_span(a['windowEnd'] - a['now_'])} from now)"
    ),
    "GamesOpen": lambda call, a: f"job {a['job']} has {a['openGames']} open game(s); {call} waits for them to end",
    "NothingOwed": lambda call, a: f"the registry owes {a['account']} nothing",
    "PostingNotOverdue": lambda call, a: (
        f"interval {a['index']} of job {a['job']} is not overdue: it may be posted until {_when(a['deadline'])} "
        f"({_span(a['deadline'] - a['now_'])} from now)"
        if a["deadline"] >= a["now_"]
        else f"every interval of job {a['job']} is posted; there is nothing to reclaim"
    ),
    "CancelTooEarly": lambda call, a: (
        f"job {a['job']}'s offer is firm until {_when(a['acceptDeadline'])} ({_span(a['acceptDeadline'] - a['now_'])} "
        "from now): its trainer may accept it until then; it can be cancelled from the second after"
    ),
    "AcceptDeadlinePassed": lambda call, a: (
        f"job {a['job']} could be accepted until {_when(a['acceptDeadline'])} "
        f"({_span(a['now_'] - a['acceptDeadline'])} ago); its client may now cancel it"
    ),
    "UnknownGame": lambda call, a: f"game {a['game']} does not exist",
    "GameOver": lambda call, a: f"game {a['game']} is over ({enum_name('GameStatus', a['status'])})",
    "WrongPhase": lambda call, a: (
        f"game {a['game']} is in phase {enum_name('Phase', a['phase'])}, which expects "
        f"{_PHASE_MOVE.get(enum_name('Phase', a['phase']), 'another move')}, not {call}"
    ),
    "NotYourTurn": lambda call, a: f"it is the {enum_name('Party', a['toMove']).lower()}'s move, not {a['caller']}'s",
    "ClockNotExpired": lambda call, a: (
        f"the {enum_name('Party', a['toMove']).lower()}'s clock runs until {_when(a['deadline'])} "
        f"({_span(a['deadline'] - a['now_'])} from now)"
    ),
    "JobNotFraudulent": lambda call, a: (
        f"job {a['job']} is {enum_name('JobStatus', a['status'])}; only games of a Fraudulent job can be closed"
    ),
}


def _show(value: Any, internal_type: str) -> str:
    if internal_type.startswith("enum "):
        return enum_name(internal_type.split(".")[-1][5:].strip(), int(value))
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    return str(value)


def explain(call: str, error: str, args: Sequence[Any], inputs: Sequence[dict[str, Any]] = ()) -> str:
    """Words for custom error ``error(args)`` raised by ``call``; ``inputs`` is the error's ABI
    ``inputs`` (names and internal types), used for errors without a sentence of their own."""
    names = [i.get("name") or f"arg{k}" for k, i in enumerate(inputs)]
    if len(names) == len(args) and error in _SENTENCES:
        try:
            return _SENTENCES[error](call, dict(zip(names, args)))
        except (KeyError, TypeError, ValueError, OverflowError):
            pass  # an ABI other than ours: fall through to the generic form
    if not inputs or len(inputs) != len(args):
        return f"{error}({', '.join(_show(a, '') for a in args)})"
    shown = ", ".join(f"{n}={_show(a, i.get('internalType', ''))}" for n, a, i in zip(names, args, inputs))
    return f"{error}: {shown}"
