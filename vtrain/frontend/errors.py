"""Errors of the torch front end: each names the ATen op and where in the user's model it came from."""

from __future__ import annotations

from vtrain.errors import VtrainError


class FrontendError(VtrainError):
    """Raised when a user's model, loss, optimizer settings or data cannot be turned into a step graph."""


class UnsupportedOp(FrontendError):
    """An ATen op (or an argument of one) that has no exact lowering to primitive ops."""


def node_origin(node) -> str:
    """``module path (Type) at file:line`` of an FX node, from its export metadata (or '' if none)."""
    where = []
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, typ = list(stack.values())[-1]
        path = path.removeprefix("L['self'].").removeprefix("module.").removeprefix("module")
        tname = typ.__name__ if isinstance(typ, type) else str(typ).rsplit(".", 1)[-1].strip("'>")
        where.append(f"module {path or '<root>'} ({tname})")
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    if lines:
        last = lines[-1]  # the innermost frame: the line of user code that called the op
        code = ""
        tl = trace.rstrip().splitlines()
        if tl and not tl[-1].strip().startswith("File "):
            code = f": {tl[-1].strip()}"
        where.append(last.replace("File ", "", 1) + code)
    return " at ".join(where)
