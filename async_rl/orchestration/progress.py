"""Progress that works everywhere: a live bar on a terminal, and one compact status line every
``interval_s`` seconds when the output goes to a file, a pipe or CI (a live bar would print nothing
until the end there)."""
from __future__ import annotations

import time
from typing import Any, Optional

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressDisplay:
    def __init__(self, console: Console, total_epochs: Optional[int], done_epochs: int, deadline: float,
                 interval_s: float) -> None:
        self.console, self.total, self.deadline, self.interval_s = console, total_epochs, deadline, interval_s
        self.started, self.start_epoch, self._last_line = time.monotonic(), done_epochs, 0.0
        self._bar: Optional[Progress] = None
        if console.is_terminal:
            self._bar = Progress(TextColumn("[bold]epochs"), BarColumn(), TextColumn("{task.fields[line]}"),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=console)
            self._task = self._bar.add_task("epochs", total=total_epochs, completed=done_epochs, line="")

    def __enter__(self) -> "ProgressDisplay":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, epoch: int, status: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=epoch, line=status)
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            self.console.print(self.line(epoch, status), markup=False, soft_wrap=True)

    def line(self, epoch: int, status: str) -> str:
        """``epoch 12/100  3.1 min  ETA 4.2 min  <status>`` (ETA by the epoch or the time limit, whichever is first)."""
        elapsed = time.monotonic() - self.started
        done = epoch - self.start_epoch
        etas = [self.deadline - time.monotonic()] if self.deadline != float("inf") else []
        if self.total and done > 0:
            etas.append(elapsed / done * (self.total - epoch))
        eta = f"  ETA {max(min(etas), 0) / 60:.1f} min" if etas else ""
        of = f"/{self.total}" if self.total else ""
        return f"epoch {epoch}{of}  {elapsed / 60:.1f} min{eta}  {status}"
