"""The dtypes a run computes and reduces in, from the `precision` hyperparameter and the device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
