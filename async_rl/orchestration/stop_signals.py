"""Ctrl-C and SIGTERM stop a run the way its time limit does: the epoch in progress ends, a checkpoint is
written, the actors shut down and the report is made; ``--resume`` continues from there. A second Ctrl-C
aborts at once (``KeyboardInterrupt``). A batch scheduler (SLURM, Kubernetes) sends SIGTERM before it kills.

Installed after the metrics logger starts: SwanLab's own SIGINT handler would otherwise finish its run and
swallow the interrupt, and the next epoch's log would fail on the finished run.
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Callable, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While entered (main thread only), SIGINT and SIGTERM set ``signum`` instead of ending the process."""

    def __init__(self, announce: Callable[[str], None]) -> None:
        self.announce = announce
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: no checkpoint, shut down now
        if self.signum is None:
            self.signum = signum
            self.announce(f"{signal.Signals(signum).name}: stopping after this epoch (checkpoint, then shut-down; "
                          "Ctrl-C again to abort without them)")

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
