"""Checkpoints for the loop: `CheckpointManager` restores the newest complete step on start, saves on its
cadence and once more at the end (at a stop only what can finish before SIGKILL), and never saves a non-finite
step. Collective throughout: every rank calls it at the same steps.

It puts the folder's parts together (training.checkpoint's __init__ lists them): when (`cadence.Cadence`), where
and how (`storage.CheckpointStorage`: the `step-N` folders of torch.distributed.checkpoint for every strategy,
their markers, pruning, async saves), resuming (`restore.Restore`, `ownership`), other weights (`init_from`); and
it tells the hang watchdog's heartbeat that a save or a restore is not a training step (training.resilience).
"""

from __future__ import annotations

from pathlib import Path

from torch.distributed.checkpoint.stateful import Stateful

from contract.hyperparameters import TrainConfig
from training.checkpoint.cadence import Cadence
from training.checkpoint.init_from import start_from
from training.checkpoint.markers import step_number
from training.checkpoint.ownership import Owner, current_run_id
from training.checkpoint.restore import Restore
from training.checkpoint.storage import CheckpointStorage
from training.parallel.process_group import Dist
from training.resilience.heartbeat import Heartbeat, phased


class CheckpointManager:
    """Owns the checkpoint folder: restore on start, save on cadence and at the end. Collective throughout."""

    def __init__(self, cfg: TrainConfig, dist: Dist, parts: dict[str, Stateful], owner: Owner | None = None,
                 global_batch: int | None = None, heartbeat: Heartbeat | None = None) -> None:
        self.heartbeat = heartbeat  # the hang watchdog's progress marks: a save or a restore is a phase
        self.dist, self.init_from = dist, cfg.init_from
        self.cadence = Cadence(cfg)
        self.storage = CheckpointStorage(cfg, dist, parts, owner or Owner(current_run_id()), global_batch,
                                         self.cadence)

    # What the loop reads of the cadence (the overdue alarm's metric) and tests of the folder.
    @property
    def every_s(self) -> float:
        return self.cadence.every_s

    @property
    def interval(self) -> int:
        return self.cadence.interval

    @property
    def saved_at(self) -> int:
        return self.cadence.saved_at

    @property
    def root(self) -> Path:
        return self.storage.root

    @phased("the checkpoint restore")  # a large restore gets its own long allowance, apart from startup
    def restore(self) -> Path | None:
        """Check the folder can take the next save, then load the newest complete step that is this run's,
        verifies and loads into the parts, in place, falling back to older ones. None when there is none:
        then the model's weights come from `init_from` when it is set. Collective."""
        path = Restore(self.storage, self.init_from).run()
        if path is not None:
            self.cadence.saved_at = step_number(path)
        elif self.init_from:
            start_from(self.init_from, self.dist, self.storage.parts)
        return path

    def time_due(self) -> bool:
        return self.cadence.time_due()

    def due(self, step: int, running: bool, time_due: bool = False) -> bool:
        return self.cadence.due(step, running, time_due)

    def age(self) -> float:
        return self.cadence.age()

    @phased("a checkpoint save")  # not a training step: the hang watchdog's long allowance
    def save(self, step: int, nonfinite: int = 0) -> Path | None:
        """Write step-N; None when not written: `nonfinite` (the step's non-finite streak, the max over the
        ranks, from training.metrics.meter) above 0 means a loss or gradient norm is NaN/Inf, and such a model never
        becomes the newest checkpoint. Collective: every rank calls it at the same step."""
        if nonfinite:
            if self.dist.is_main:
                print(f"[checkpoint] step-{step} not saved: the loss or gradient norm is NaN/Inf there ({nonfinite} "
                      f"step(s) in a row on some rank); the newest checkpoint stays {self.cadence.newest()}",
                      flush=True)
            return None
        return self.storage.write(step)

    def wait(self) -> None:
        """Complete a pending async save: wait for its writes and this rank's checksums, then mark it. Collective."""
        self.storage.wait()

    @phased("the end's checkpoint save")
    def save_final(self, step: int, nonfinite: int = 0) -> None:
        """When the run ends for any reason: a rerun then resumes, or sees the job is done."""
        if step > 0 and self.cadence.saved_at != step:
            self.save(step, nonfinite)
        self.storage.close()

    @phased("the stop's checkpoint save")
    def save_at_stop(self, step: int, seconds_since_signal: float, nonfinite: int = 0) -> bool:
        """The save of a stop, if it can end before SIGKILL; else say so and keep the previous checkpoint.
        Rank 0 decides (each rank timed its own saves). Returns whether it saved."""
        if nonfinite:  # the same on every rank (the max over them): nothing to time
            self.save_final(step, nonfinite)
            return False
        fits, message = self.cadence.stop_save_fits(step, seconds_since_signal) if self.dist.is_main else (True, "")
        if not self.dist.broadcast_object(fits):
            if message:
                print(message, flush=True)
            self.storage.close()  # an async save already under way completes: it is the newest one
            return False
        self.storage.stopping = True
        self.save_final(step)
        return True
