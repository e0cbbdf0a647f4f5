"""The loop's progress marks: each completed step's beat, the work between steps that is not a training step
(`phase`: a checkpoint save, an evaluation, the export), and the timed steps' count and seconds.

The loop beats once per completed step on every rank, at the same steps; what does long work between steps says
so with `phase`. The hang watchdog (training.resilience.watchdog) reads these marks from its own thread (a few
attribute reads); the straggler timing (training.resilience.stragglers.StepTiming) takes each timed step's
seconds. A step that held a phase, and the startup through the first two beats (build, restore, compile), is
not a timed step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time

# Test-only injections (tests/training/resilience/test_watchdog.py), read once at start: "RANK:STEP" makes that
# rank block forever after completing that step; "RANK:SECONDS" ("*" for every rank) makes it sleep that long after
# each step. Never set by the platform, nor by a request (no TRAINING_ name is on jobs.request.environment_rules'
# allow-list).
ENV_TEST_HANG = "TRAINING_TEST_HANG_AT"
ENV_TEST_SLOW = "TRAINING_TEST_SLOW_RANK"


class Heartbeat:
    """This rank's progress: the last completed step and when, the open phases, the timed steps."""

    def __init__(self, rank: int = 0, clock=time.monotonic) -> None:
        self.rank, self.clock = rank, clock
        self.step: int | None = None  # the last completed step
        self.last = self.last_beat = clock()  # the last sign of progress (a beat, a phase's start or end)
        self.beats = self.timed_steps = 0
        self.timed_s = 0.0
        self.phases: list[str] = []  # open phases (nested: a save inside the end's work)
        self._phased = True  # a phase (or the startup) fell in the current interval: it is not a timed step
        self._hang_at, self._slow_s = _test_injections(rank)

    def beat(self, step: int) -> float | None:
        """A step completed: its seconds when it is a timed step, else None."""
        if self._slow_s:  # test-only: this rank's work takes longer (before its timestamp, like real work)
            time.sleep(self._slow_s)
        now = self.clock()
        interval = None
        if not self._phased:
            interval = now - self.last_beat
            self.timed_steps += 1
            self.timed_s += interval
        self._phased = bool(self.phases)
        self.step, self.last, self.last_beat = step, now, now
        self.beats += 1
        if self._hang_at == step:  # test-only: this rank stops after completing `step`, as a hung GPU would
            print(f"[watchdog] test injection {ENV_TEST_HANG}: rank {self.rank} blocks after step {step}",
                  file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)
        return interval

    @contextlib.contextmanager
    def phase(self, what: str):
        """Work that is not a training step (a checkpoint save, an evaluation, the export): the long allowance."""
        self.phases.append(what)
        self.last = self.clock()
        self._phased = True
        try:
            yield
        finally:
            self.phases.pop()
            self.last = self.clock()


def during(heartbeat: Heartbeat | None, what: str):
    """`heartbeat.phase(what)`; nothing without a heartbeat (a checkpoint manager or an evaluator used alone, as
    tests and benches do)."""
    return heartbeat.phase(what) if heartbeat is not None else contextlib.nullcontext()


def phased(what: str):
    """Decorator for a method of an object that holds a `heartbeat` (or None): the call is that phase."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(self, *args, **kwargs):
            with during(self.heartbeat, what):
                return fn(self, *args, **kwargs)
        return run
    return wrap


def _test_injections(rank: int) -> tuple[int | None, float]:
    hang_at, slow = None, 0.0
    spec = os.environ.get(ENV_TEST_HANG, "")
    if spec.partition(":")[0] == str(rank):
        hang_at = int(spec.partition(":")[2])
    spec = os.environ.get(ENV_TEST_SLOW, "")
    if spec.partition(":")[0] in (str(rank), "*"):
        slow = float(spec.partition(":")[2])
    return hang_at, slow
