"""One optimizer step: forward and backward over the micro-batches (gradients synced only on the last),
clipping, optimizer, grad scaler, LR schedule. The benchmark times exactly this.

Tensor- and pipeline-parallel ranks first pool their micro-batches (`share_batch`): the ranks of a batch
group then run one model on the same samples. A pipeline runs forward and backward through its schedule.

The loss is training.loss's: chunked (`loss_chunk_tokens`, one chunk's fp32 temporaries alive at a time) or whole.
With `compile` the whole loss (fp32 upcast of the logits, log-softmax, NLL, and their backward) is compiled instead:
eager it writes and reads the fp32 logits (batch x sequence x vocabulary, gigabytes at 1B scale) four times;
compiled it reads the low-precision logits and writes their gradient, a few fused kernels, and keeps no fp32 copy
(measured on CPU, `python -m bench.chunked_loss`: beside the bf16 logits, their gradient's 2 bytes an entry, where
the compiled chunked loss kept 6 and the eager chunked 4: under torch.compile the checkpointed chunks keep more than
the fused whole loss). A pipeline calls the loss inside its schedule, stage by stage: kept eager there, chunked as
set."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as torch_dist
from torch.distributed.tensor import DTensor

from contract.hyperparameters import LOSS_CHUNK_TOKENS
from training.loss import full_cross_entropy, loss_function
from training.parallel.strategies import Parallelized
from training.precision import Precision


def _grad_norm(model, max_norm: float) -> torch.Tensor:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def share_batch(x: torch.Tensor, y: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's micro-batch of `group`, concatenated in rank order (no group: the batch as it is)."""
    if group is None:
        return x, y
    n = torch_dist.get_world_size(group)
    out = []
    for t in (x, y):
        parts = [torch.empty_like(t) for _ in range(n)]
        torch_dist.all_gather(parts, t.contiguous(), group=group)
        out.append(torch.cat(parts))
    return out[0], out[1]


class TrainStep:
    def __init__(self, par: Parallelized, optimizer, scheduler, scaler, precision: Precision,
                 device: torch.device, grad_clip: float, compile_loss: bool = False, observe=None,
                 loss_chunk_tokens: int = LOSS_CHUNK_TOKENS) -> None:
        self.model, self.par = par.model, par
        # observe(event, self) at "gradients" (unscaled, before clipping), "clipped" and "updated" (after the
        # optimizer): the conformance tests read each layout's whole gradient and weights there. None in jobs.
        self.observe = observe
        # The eager loss (what a pipeline's schedule calls); compiled, outside a pipeline, the whole loss (see above).
        self.eager_loss = loss_function(loss_chunk_tokens)
        compiled = compile_loss and par.pipeline_schedule is None
        self.loss_fn = torch.compile(full_cross_entropy) if compiled else self.eager_loss
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.grad_clip = grad_clip
        dtype = precision.param
        use_autocast = par.use_autocast and precision.autocast
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if use_autocast else contextlib.nullcontext

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            logits = self.model(x)
        return self.loss_fn(logits, y)

    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(mean loss, samples) of one evaluation micro-batch, pooled over the batch group; no gradients."""
        x, y = share_batch(x, y, self.par.batch_group)
        if self.par.pipeline_schedule is not None:
            with self.autocast():
                return self.par.pipeline_schedule.forward_loss(x, y, self.eager_loss), len(x)
        return self.loss(x, y), len(x)

    def __call__(self, micro_batches: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`micro_batches`: (inputs, targets) pairs on the device. Returns (mean loss, grad norm), unsynced."""
        micro_batches = [share_batch(x, y, self.par.batch_group) for x, y in micro_batches]
        if self.par.pipeline_schedule is not None:
            with self.autocast():
                total = self.par.pipeline_schedule.step(micro_batches, self.eager_loss, self.scaler)
        else:
            total = self._forward_backward(micro_batches)
        grad_norm = None
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            self._observe("gradients")
            grad_norm = (self.par.grad_norm(self.grad_clip) if self.par.grad_norm is not None
                         else _grad_norm(self.model, self.grad_clip))
            self._observe("clipped")
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self._observe("updated")
        return total, grad_norm

    def _observe(self, event: str) -> None:
        if self.observe is not None:
            self.observe(event, self)

    def _forward_backward(self, micro_batches: list) -> torch.Tensor:
        total = None
        n = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            with self.par.grad_sync(i == n - 1):
                loss = self.loss(x, y) / n
                self.scaler.scale(loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        return total

