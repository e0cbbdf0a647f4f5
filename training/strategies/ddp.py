"""DistributedDataParallel: full replicas, gradients all-reduced in buckets during backward."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.config import TrainConfig
from training.distributed import Dist
from training.strategies import Parallelized


def apply(model: nn.Module, cfg: TrainConfig, dist: Dist, param_dtype: torch.dtype) -> Parallelized:
    model = model.to(dist.device)
    ids = [dist.local_rank] if dist.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids)

    def grad_sync(enabled: bool):
        return contextlib.nullcontext() if enabled else ddp.no_sync()

    return Parallelized(model=ddp, sharded=False, grad_sync=grad_sync)
