"""When a run saves, and whether a stop's save can end before SageMaker's SIGKILL.

Cadence: every `checkpoint_interval` steps, and every `checkpoint_minutes` since the last save started, while
the run goes on; once more when it ends (completed, early-stopped, stopped by a signal) unless that step is
saved. At a stop the save is written only if, by the longest earlier save, it ends before SageMaker's SIGKILL
(contract.container.STOP_KILL_AFTER_SECONDS after the signal); otherwise the run exits at once and the
previous checkpoint stands. Keeps the newest K complete ones.
"""

from __future__ import annotations

import time

from contract.container import STOP_KILL_AFTER_SECONDS
from contract.hyperparameters import TrainConfig

# After the stop-time save: the ranks still export nothing but write the status file and leave the process
# group; 10 s of the 120 s is kept for that. A save is predicted to take this much longer than the longest
# earlier one (page cache, a busier disk at shutdown).
STOP_EXIT_SECONDS = 10.0

STOP_SAVE_SAFETY = 1.25


class Cadence:
    """The run's save times: what is due, how long saves took, the newest complete one's age."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.interval = cfg.checkpoint_interval
        self.every_s = cfg.checkpoint_minutes * 60
        self.saved_at = -1  # the newest step saved (or resumed from)
        self.totals: list[float] = []  # each finished save's seconds, start to marker: the stop-time estimate
        self.started = self.complete_at = time.time()  # nothing at risk before the first step

    def time_due(self) -> bool:
        """This rank's clock says `checkpoint_minutes` passed since the last save began (the loop agrees it
        over the ranks with the stop flag, in one all-reduce)."""
        return bool(self.every_s) and time.time() - self.started >= self.every_s

    def due(self, step: int, running: bool, time_due: bool = False) -> bool:
        """Every `interval` steps, or when the time cadence is due, while the run goes on."""
        by_steps = bool(self.interval) and step % self.interval == 0
        return running and step > 0 and self.saved_at != step and (by_steps or time_due)

    def began(self, step: int, at: float) -> None:
        """A save of `step` began at `at` (wall clock)."""
        self.saved_at, self.started = step, at

    def completed(self, total: float) -> None:
        """A save was marked complete, `total` seconds after it began."""
        self.totals.append(total)
        self.complete_at = time.time()

    def age(self) -> float:
        """Seconds since the newest complete checkpoint (since the start before the first)."""
        return time.time() - self.complete_at

    def newest(self) -> str:
        return f"step-{self.saved_at}" if self.saved_at >= 0 else "no checkpoint"

    def stop_save_fits(self, step: int, seconds_since_signal: float) -> tuple[bool, str]:
        """(whether a stop's save of `step` ends before SIGKILL by the longest earlier save, the line saying it
        does not). Without an earlier save, or with `step` saved, nothing to time: it fits."""
        if not self.totals or self.saved_at == step:
            return True, ""
        left = STOP_KILL_AFTER_SECONDS - STOP_EXIT_SECONDS - seconds_since_signal
        needed = max(self.totals) * STOP_SAVE_SAFETY
        return needed <= left, (
            f"[checkpoint] stop at step {step}: a save takes about {needed:.0f} s and {left:.0f} s are "
            f"left before SIGKILL: exiting now; the previous checkpoint ({self.newest()}) stands")
