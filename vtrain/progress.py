"""Progress of a long command: a rich bar on a terminal, plain lines on stderr otherwise.

When stderr is not a terminal (a pipe, a log file, CI), a line such as
``train: step 40/200 loss 2.3456 (0.81 s/step, about 2m10s left)`` is written every ``every``
steps or every ``seconds`` seconds, whichever comes first, and once at the end.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO


def _eta(s: float) -> str:
    s = max(0, int(round(s)))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class StepProgress:
    """``with StepProgress("train", total) as p: p.update(step, loss=...)``."""

    def __init__(self, what: str, total: int, done: int = 0, every: int = 10, seconds: float = 5.0,
                 stream: TextIO | None = None, terminal: bool | None = None) -> None:
        self.what, self.total, self.done = what, total, done
        self.every, self.seconds = max(1, every), seconds
        self.stream = stream or sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self._start_done = done
        self._t0 = self._last = time.monotonic()
        self._last_step = done
        self._bar = None
        self._task = None
        self._note = ""

    def __enter__(self) -> StepProgress:
        if self.terminal:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), console=Console(file=self.stream), transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.what, total=self.total, completed=self.done)
        return self

    def update(self, step: int, loss: float | None = None) -> None:
        """Step ``step`` (counted from the command's start, 1..total) is done."""
        self.done = step
        note = f" loss {loss:.4f}" if loss is not None else ""
        self._note = note
        if self._bar is not None:
            self._bar.update(self._task, completed=step, description=f"{self.what}{note}")
            return
        now = time.monotonic()
        if step - self._last_step >= self.every or now - self._last >= self.seconds or step == self.total:
            self._line(now)

    def _line(self, now: float) -> None:
        ran = self.done - self._start_done
        rate = (now - self._t0) / ran if ran else 0.0
        left = f", about {_eta(rate * (self.total - self.done))} left" if ran and self.done < self.total else ""
        speed = f" ({rate:.2f} s/step{left})" if ran else ""
        print(f"{self.what}: step {self.done}/{self.total}{self._note}{speed}", file=self.stream, flush=True)
        self._last, self._last_step = now, self.done

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(et, e, tb)
        elif self._last_step != self.done:
            self._line(time.monotonic())
