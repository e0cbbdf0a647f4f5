"""The training metrics of a log interval: mean loss over the ranks, step time, throughput, MFU; and the
watch on non-finite losses and gradient norms.

MFU: the job's FLOPs per sample (training.metrics.flops' honest convention where the model allows it) against the
GPU's dense bf16 peak (training.metrics.logger.PEAK_FLOPS).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist

from contract.failures import FailureCode
from contract.metrics import (
    CHECKPOINT_S,
    CHECKPOINT_SAVES,
    DATA_WAIT_MS,
    DATA_WAIT_SHARE,
    EPOCH,
    EVAL_S,
    GRAD_NORM,
    LOSS_SCALE,
    LR,
    MFU,
    SAMPLES_PER_SEC,
    STARTUP_S,
    STEP,
    STEP_TIME_MS,
    TOKENS_PER_SEC,
    TRAIN_LOSS,
    TRAIN_S,
)
from training.data.sampler import GlobalBatchSampler, epoch_fraction
from training.metrics.logger import peak_flops
from training.parallel.process_group import Dist
from training.precision import Precision
from training.resilience.outcome import TrainingFailure


def input_bound_line(record: dict, threshold: float, samples_per_step: int, workers: int) -> str | None:
    """The log's 'input bound' line when the interval's wait for data exceeds `threshold` of the step time
    (input_bound_share), with the measured rates: what the run got, and what its steps would take without the
    wait (the rate the loader must reach before more GPUs, or faster ones, can help)."""
    share, wait_ms, step_ms = record.get(DATA_WAIT_SHARE), record.get(DATA_WAIT_MS), record.get(STEP_TIME_MS)
    if share is None or not step_ms or share <= threshold:
        return None
    got = samples_per_step / (step_ms / 1000)
    compute_ms = max(step_ms - wait_ms, 1e-6)
    needed = samples_per_step / (compute_ms / 1000)
    return (f"[data] input bound at step {record[STEP]}: waited {wait_ms:.1f} ms of a {step_ms:.1f} ms step "
            f"({share:.0%} > input_bound_share {threshold:g}) for the next batch; the loader delivers "
            f"{got:.1f} samples/s, the steps alone would take {needed:.1f} samples/s (data_workers={workers}): "
            "raise data_workers, give the job more CPUs per GPU, or store the data pre-decoded")


def checkpoint_overdue(age_s: float, every_s: float, interval: int, step_s: float | None) -> float:
    """`checkpoint_age_s` over the seconds the job's cadence puts between checkpoints (`checkpoint_overdue`).

    Expected seconds: `checkpoint_minutes` x 60, and `checkpoint_interval` x the run's mean step time; with
    both set a save comes at whichever is due first, so the shorter one. 0 when the job has no cadence (or no
    step timed yet for a step-only cadence): such a job can never be overdue, and 0 never alarms.
    """
    cadences = [c for c in (every_s, interval * step_s if interval and step_s else 0.0) if c > 0]
    return age_s / min(cadences) if cadences else 0.0


def process_started_at() -> float:
    """When this process started (epoch seconds): Linux's /proc record of it, so that the interpreter's and
    torch's imports count as startup; where there is none, the time this module was imported."""
    try:
        # Field 22 of /proc/self/stat (the 20th after the command name's closing parenthesis): clock ticks
        # after boot; /proc/stat's btime: the boot, in epoch seconds.
        ticks = int(Path("/proc/self/stat").read_text().rpartition(")")[2].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


_IMPORTED_AT = time.time()


class AttemptClock:
    """Where this attempt's seconds went, as cumulative metrics (contract.metrics: startup_s, train_s,
    checkpoint_s, eval_s) on every metrics line and once more when the attempt ends.

    The launcher's run record (jobs.outcome.run_record) reads their last values from the job to split the billed time
    into productive training and the losses (startup, checkpoint stalls, evaluation); the work redone after a
    failure it reads from checkpoint_age_s. Rank 0's clock speaks for the job: the ranks step together.
    """

    def __init__(self, started_at: float | None = None) -> None:
        self.started_at = process_started_at() if started_at is None else started_at
        self.startup_s: float | None = None
        # Seconds the loop was held by checkpoint saves and by evaluations, by the metric that carries each.
        self.held_s = {CHECKPOINT_S: 0.0, EVAL_S: 0.0}
        self.saves = 0  # checkpoints saved on the cadence: their mean stall is the next attempt's save time

    def training_starts(self) -> None:
        """The first step begins: everything before it was startup."""
        if self.startup_s is None:
            self.startup_s = max(time.time() - self.started_at, 0.0)

    def saved(self, seconds: float) -> None:
        """A checkpoint on the cadence stalled the loop this long."""
        self.held_s[CHECKPOINT_S] += seconds
        self.saves += 1

    def checkpointing(self):
        """The end's save (and the wait for an async one): a stall, not a save on the cadence."""
        return self._timed(CHECKPOINT_S)

    def evaluating(self):
        return self._timed(EVAL_S)

    @contextlib.contextmanager
    def _timed(self, metric: str):
        """Add the block's seconds to `metric`'s total."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.held_s[metric] += time.perf_counter() - began

    def metrics(self, train_s: float) -> dict:
        return {STARTUP_S: self.startup_s, TRAIN_S: train_s, CHECKPOINT_S: self.held_s[CHECKPOINT_S],
                CHECKPOINT_SAVES: self.saves, EVAL_S: self.held_s[EVAL_S]}


class StepMeter:
    """Accumulates steps between metric lines; time spent evaluating or checkpointing is left out."""

    def __init__(self, dist: Dist, precision: Precision, log_interval: int, max_steps: int, global_batch: int,
                 samples_unit: int, kind: str, flops_per_sample: float | None, nonfinite_patience: int = 3,
                 count_grad_norm: bool = True) -> None:
        self.dist, self.log_interval, self.max_steps = dist, log_interval, max_steps
        self.global_batch, self.flops_per_sample = global_batch, flops_per_sample
        self.unit = global_batch * samples_unit  # tokens (or samples) per optimizer step
        self.rate_name = TOKENS_PER_SEC if kind == "tokens" else SAMPLES_PER_SEC
        peak = peak_flops(torch.cuda.get_device_name(dist.device)) if dist.device.type == "cuda" else None
        # MFU against the bf16/fp16 tensor-core peak: meaningless for an fp32 run.
        self.peak = peak if precision.autocast else None
        self.loss_sum = torch.zeros((), device=dist.device)
        self.loss_steps = 0
        self.grad_norm: torch.Tensor | None = None
        # Non-finite steps in a row, counted on the device (no sync per step) and read at log time and
        # before a save. An fp16 run's scaler skips steps with an Inf gradient on purpose: only its loss counts.
        self.patience, self.count_grad_norm = nonfinite_patience, count_grad_norm
        self.streak = torch.zeros((), dtype=torch.int32, device=dist.device)
        self.worst = torch.zeros((), dtype=torch.int32, device=dist.device)
        # Every logged interval's time and steps, for the run's mean step time (the checkpoint cadence in s).
        self.run_seconds, self.run_steps = 0.0, 0
        # Seconds the loop waited for its next batch: this interval's timed steps, and the run's logged ones.
        self.run_wait_s = 0.0
        self.restart()

    @property
    def mean_step_s(self) -> float | None:
        """The mean seconds of a timed training step over the run so far (None before the first log)."""
        return self.run_seconds / self.run_steps if self.run_steps else None

    @property
    def trained_s(self) -> float:
        """Seconds spent in training steps so far, the interval not yet logged included."""
        return self.run_seconds + (time.perf_counter() - self.t0 if self.timed_steps else 0.0)

    def restart(self) -> None:
        self.timed_steps, self.t0, self.wait_s = 0, time.perf_counter(), 0.0

    def waited(self, seconds: float) -> None:
        """The step just added waited this long for its batch (training.data.loader.BatchSource.data_wait_s)."""
        self.wait_s += seconds

    def run_data_wait(self) -> dict:
        """The run's mean wait for a batch per logged step and its share of the step time: the summary's
        values, on the attempt's last metrics line (SageMaker keeps each metric's last value)."""
        if not self.run_steps:
            return {}
        return {DATA_WAIT_MS: self.run_wait_s / self.run_steps * 1000,
                DATA_WAIT_SHARE: self.run_wait_s / self.run_seconds if self.run_seconds else 0.0}

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        self.loss_sum += loss
        self.loss_steps += 1
        self.timed_steps += 1
        self.grad_norm = grad_norm
        bad = ~torch.isfinite(loss.detach())
        if grad_norm is not None and self.count_grad_norm:
            bad = bad | ~torch.isfinite(grad_norm.detach())
        self.streak = torch.where(bad, self.streak + 1, torch.zeros_like(self.streak))
        self.worst = torch.maximum(self.worst, self.streak)

    def raise_if_nonfinite(self, step: int) -> int:
        """Fail the run when any rank saw `nonfinite_patience` non-finite steps in a row; otherwise return the
        current streak, the max over the ranks: 0 when this step is finite on every rank, the only kind a
        checkpoint may hold. Collective: one all-reduce of both counts, at the same step on every rank."""
        counts = torch.stack([self.worst, self.streak])
        if torch_dist.is_initialized():
            torch_dist.all_reduce(counts, op=torch_dist.ReduceOp.MAX)
        self.worst = self.streak.clone()
        worst, streak = (int(v) for v in counts.tolist())
        if worst >= self.patience:
            what = "loss" if not self.count_grad_norm else "loss or gradient norm"
            raise TrainingFailure(FailureCode.NON_FINITE, (
                f"the {what} was NaN/Inf for {worst} steps in a row by step {step} "
                f"(nonfinite_patience={self.patience}): lower lr, keep grad_clip above 0, or use precision=bf16 "
                "instead of fp16"))
        return streak

    def due(self, step: int) -> bool:
        return step % self.log_interval == 0 or step == self.max_steps

    def record(self, step: int, sampler: GlobalBatchSampler, scheduler, scaler) -> dict:
        """The interval's metrics (a collective: the loss is averaged over the ranks); starts the next one."""
        # The loss and the wait for data averaged over the ranks in one all-reduce: a rank whose loader lags
        # shows in the mean (and by name in training.resilience.stragglers).
        totals = torch.stack([self.loss_sum, torch.tensor(self.wait_s, dtype=self.loss_sum.dtype,
                                                          device=self.loss_sum.device)])
        if torch_dist.is_initialized():
            torch_dist.all_reduce(totals, op=torch_dist.ReduceOp.AVG)
        loss_sum, wait_s = totals.tolist()
        elapsed = time.perf_counter() - self.t0
        per_step = elapsed / self.timed_steps
        self.run_seconds += elapsed
        self.run_steps += self.timed_steps
        self.run_wait_s += wait_s
        record = {STEP: step, EPOCH: epoch_fraction(sampler), TRAIN_LOSS: loss_sum / self.loss_steps,
                  LR: scheduler.get_last_lr()[0], STEP_TIME_MS: per_step * 1000,
                  GRAD_NORM: self.grad_norm.item() if self.grad_norm is not None else None,
                  LOSS_SCALE: scaler.get_scale() if scaler.is_enabled() else None,
                  self.rate_name: self.unit / per_step,
                  DATA_WAIT_MS: wait_s / self.timed_steps * 1000, DATA_WAIT_SHARE: min(1.0, wait_s / elapsed)}
        if self.peak and self.flops_per_sample:
            record[MFU] = self.flops_per_sample * self.global_batch / per_step / (self.peak * self.dist.world_size)
        self.loss_sum.zero_()
        self.loss_steps = 0
        self.restart()
        return record
