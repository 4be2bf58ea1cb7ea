"""Errors of the torch front end: each names the ATen op and where in the user's model it came from."""

from __future__ import annotations

import os

import torch

from vtrain.errors import VtrainError


class FrontendError(VtrainError):
    """Raised when a user's model, loss, optimizer settings or data cannot be turned into a step graph."""


class UnsupportedOp(FrontendError):
    """An ATen op (or an argument of one) that has no exact lowering to primitive ops."""


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_CAPTURE = os.path.join("vtrain", "frontend", "capture.py")


def _frames(trace: str) -> list[tuple[str, str]]:
    """``(where, code)`` of each frame of an FX ``stack_trace``, outermost first."""
    out: list[tuple[str, str]] = []
    lines = trace.splitlines()
    for k, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith("File "):
            nxt = lines[k + 1].strip() if k + 1 < len(lines) else ""
            out.append((s.removeprefix("File "), "" if nxt.startswith("File ") else nxt))
    return out


def _file_of(where: str) -> str:
    return where.split('"')[1] if where.count('"') >= 2 else where


def node_origin(node, loss_name: str = "") -> str:
    """``module path (Type) at file:line: code`` of an FX node, from its export metadata (or '' if none).

    The line is the innermost one of the user's code (not torch's, not the front end's wrapper); when
    torch's own code called the op from there, its line follows (``in torch: ...``); an op of the loss
    function (torch's traces keep module ``forward`` frames only) is placed in ``loss_name``."""
    where = []
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, typ = list(stack.values())[-1]
        path = path.removeprefix("L['self'].").removeprefix("module.").removeprefix("module")
        tname = typ.__name__ if isinstance(typ, type) else str(typ).rsplit(".", 1)[-1].strip("'>")
        if tname != "_WithLoss":
            where.append(f"module {path or '<root>'} ({tname})")
    frames = _frames(node.meta.get("stack_trace") or "")
    user = [f for f in frames if not _file_of(f[0]).startswith(_TORCH_DIR) and not _file_of(f[0]).endswith(_CAPTURE)]
    in_loss = any(_file_of(f[0]).endswith(_CAPTURE) and "loss_fn" in f[1] for f in frames)
    if user or in_loss:
        if user:
            loc, code = user[-1]
            text = loc + (f": {code}" if code else "")
        else:
            text = f"the loss function {loss_name or '(TorchTask.loss)'}"
        if frames[-1] != (user[-1] if user else None) and _file_of(frames[-1][0]).startswith(_TORCH_DIR):
            inner_loc, inner_code = frames[-1]  # torch's code between the user's line and the op
            text += f" (in torch: {inner_code or inner_loc})"
        where.append(text)
    elif frames:
        loc, code = frames[-1]
        where.append(loc + (f": {code}" if code else ""))
    return " at ".join(where)


def describe_function(fn) -> str:
    """``name (file, line N)`` of a Python function, ``module.name`` of a library one (for errors)."""
    import inspect

    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    mod = getattr(fn, "__module__", "") or ""
    try:
        where = f"{inspect.getsourcefile(fn)}, line {inspect.getsourcelines(fn)[1]}"
    except (TypeError, OSError):
        return f"{mod}.{name}" if mod else name
    if mod.startswith("torch"):
        return f"{mod}.{name}"
    return f"{name} ({where})"
