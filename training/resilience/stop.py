"""The stop flag: a stop asked of the run (SageMaker's SIGTERM through the stop file, a Spot reclaim, Ctrl-C), read
once per step by the loop."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from training.environment import stop_file_path


class StopFlag:
    """A stop: SageMaker's (its SIGTERM, turned into the stop file by the container entry), a Spot reclaim,
    `trainctl local`'s (the same file), or a signal sent to this process (SIGTERM, Ctrl-C's SIGINT).

    SageMaker sends SIGKILL 120 s after SIGTERM, so nothing here does work: the loop reads `raised` once
    per step, the ranks agree at that step boundary (one tiny all-reduce), write a checkpoint if it fits in
    the time left, and exit 0. torchrun is never signalled, so its own grace (a fixed 30 s before torch
    2.12) cannot cut a long save. `raised_at` is when the stop came (wall clock: the file's modification
    time, or the signal's arrival): the checkpoint manager measures the time left against it.
    """

    def __init__(self, stop_file: Path | None = None) -> None:
        self.signum: int | None = None
        self.raised_at: float | None = None
        self.stop_file = stop_file
        self._previous = {}

    @classmethod
    def for_environment(cls, env=None) -> StopFlag:
        return cls(stop_file_path(os.environ if env is None else env))

    def install(self) -> StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        self.raise_(signum)

    def raise_(self, signum: int, at: float | None = None) -> None:
        """Record a stop (a signal, or one caught before this flag existed); the first one's time stands."""
        if self.signum is None:
            self.signum, self.raised_at = signum, time.time() if at is None else at

    @property
    def raised(self) -> bool:
        if self.signum is None and self.stop_file is not None:
            # One stat a step: microseconds against steps of tens of milliseconds and more.
            with contextlib.suppress(FileNotFoundError):
                self.raise_(signal.SIGTERM, at=self.stop_file.stat().st_mtime)
        return self.signum is not None

    def seconds_since(self) -> float:
        return 0.0 if self.raised_at is None else max(0.0, time.time() - self.raised_at)
