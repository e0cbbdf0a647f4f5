"""One optimizer step: forward and backward over the micro-batches (gradients synced only on the last),
clipping, optimizer, grad scaler, LR schedule. The benchmark times exactly this."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from training.precision import Precision
from training.strategies import Parallelized


def _grad_norm(model, max_norm: float) -> torch.Tensor:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class TrainStep:
    def __init__(self, par: Parallelized, optimizer, scheduler, scaler, precision: Precision,
                 device: torch.device, grad_clip: float) -> None:
        self.model, self.par = par.model, par
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.grad_clip = grad_clip
        dtype = precision.param
        use_autocast = par.use_autocast and precision.autocast
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if use_autocast else contextlib.nullcontext

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())

    def __call__(self, micro_batches: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`micro_batches`: (inputs, targets) pairs on the device. Returns (mean loss, grad norm), unsynced."""
        total = None
        n = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            with self.par.grad_sync(i == n - 1):
                loss = self.loss(x, y) / n
                self.scaler.scale(loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        grad_norm = None
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            grad_norm = _grad_norm(self.model, self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total, grad_norm
