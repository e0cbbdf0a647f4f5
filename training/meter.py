"""The training metrics of a log interval: mean loss over the ranks, step time, throughput, MFU."""

from __future__ import annotations

import time

import torch
import torch.distributed as torch_dist

from training.data import GlobalBatchSampler, epoch_fraction
from training.distributed import Dist
from training.metrics import peak_flops
from training.precision import Precision


class StepMeter:
    """Accumulates steps between metric lines; time spent evaluating or checkpointing is left out."""

    def __init__(self, dist: Dist, precision: Precision, log_interval: int, max_steps: int, global_batch: int,
                 samples_unit: int, kind: str, flops_per_sample: float | None) -> None:
        self.dist, self.log_interval, self.max_steps = dist, log_interval, max_steps
        self.global_batch, self.flops_per_sample = global_batch, flops_per_sample
        self.unit = global_batch * samples_unit  # tokens (or samples) per optimizer step
        self.rate_name = "tokens_per_sec" if kind == "tokens" else "samples_per_sec"
        peak = peak_flops(torch.cuda.get_device_name(dist.device)) if dist.device.type == "cuda" else None
        # MFU against the bf16/fp16 tensor-core peak: meaningless for an fp32 run.
        self.peak = peak if precision.autocast else None
        self.loss_sum = torch.zeros((), device=dist.device)
        self.loss_steps = 0
        self.grad_norm: torch.Tensor | None = None
        self.restart()

    def restart(self) -> None:
        self.timed_steps, self.t0 = 0, time.perf_counter()

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> None:
        self.loss_sum += loss
        self.loss_steps += 1
        self.timed_steps += 1
        self.grad_norm = grad_norm

    def due(self, step: int) -> bool:
        return step % self.log_interval == 0 or step == self.max_steps

    def record(self, step: int, sampler: GlobalBatchSampler, scheduler, scaler) -> dict:
        """The interval's metrics (a collective: the loss is averaged over the ranks); starts the next one."""
        if torch_dist.is_initialized():
            torch_dist.all_reduce(self.loss_sum, op=torch_dist.ReduceOp.AVG)
        per_step = (time.perf_counter() - self.t0) / self.timed_steps
        record = {"step": step, "epoch": epoch_fraction(sampler), "train_loss": self.loss_sum.item() / self.loss_steps,
                  "lr": scheduler.get_last_lr()[0], "step_time_ms": per_step * 1000,
                  "grad_norm": self.grad_norm.item() if self.grad_norm is not None else None,
                  "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
                  self.rate_name: self.unit / per_step}
        if self.peak and self.flops_per_sample:
            record["mfu"] = self.flops_per_sample * self.global_batch / per_step / (self.peak * self.dist.world_size)
        self.loss_sum.zero_()
        self.loss_steps = 0
        self.restart()
        return record
