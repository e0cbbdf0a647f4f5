"""The dtypes a run computes and reduces in, from the `precision` hyperparameter and the device."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    param: torch.dtype  # what forward and backward compute in (autocast, or FSDP's parameter cast)
    reduce: torch.dtype = torch.float32  # what gradients are reduced in across ranks

    @property
    def autocast(self) -> bool:
        return self.param != torch.float32

    @property
    def needs_loss_scaling(self) -> bool:
        return self.param == torch.float16


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """`auto`: bf16 on a GPU that has it, fp32 elsewhere."""
    if precision == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return Precision(torch.bfloat16 if bf16 else torch.float32)
    return Precision(_DTYPES[precision])


class PartsGradScaler(ShardedGradScaler):
    """fp16's loss scaler for gradients split over ranks: each rank unscales and checks its local parts, then
    the ranks agree on Inf/NaN (ShardedGradScaler's all-reduce), so all skip the step or none does.

    torch's scalers hand every gradient of one device and dtype to one fused kernel: tensor parallelism's mix
    of DTensors (split layers) and plain tensors (replicated norms) made it fail ("got mixed torch.Tensor and
    DTensor"), and a rank that checked only its own shard could skip a step its peers took."""

    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool = True):
        parts = defaultdict(list)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                        parts[(g.device, g.dtype)].append(g)
            found = {}
            for (device, _), grads in parts.items():
                if device not in found:
                    found[device] = found_inf.to(device, copy=True)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found[device], inv_scale.to(device))
        return found or {found_inf.device: found_inf}  # a rank without gradients still joins the agreement


def grad_scaler(precision: Precision, device: torch.device) -> torch.amp.GradScaler:
    """The loss scaler (enabled for fp16 only); across ranks, one whose skip decision the ranks share."""
    if not precision.needs_loss_scaling:
        return torch.amp.GradScaler(device.type, enabled=False)
    scaler = PartsGradScaler(device.type) if torch_dist.is_initialized() else torch.amp.GradScaler(device.type)
    # The scale is made on the first scale(loss): a pipeline's earlier stages never compute the loss, and their
    # unscale_ failed ("_scale is None"). Made here on every rank; the ranks' agreed skips keep them equal.
    scaler.scale(torch.zeros((), device=device))
    return scaler
