"""DistributedDataParallel: full replicas, gradients all-reduced in buckets during backward."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from training.parallel.strategies import Parallelized


def apply_ddp(model: nn.Module, mesh: DeviceMesh, device: torch.device) -> Parallelized:
    model = model.to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids, process_group=mesh.get_group())

    def grad_sync(enabled: bool):
        return contextlib.nullcontext() if enabled else ddp.no_sync()

    return Parallelized(model=ddp, grad_sync=grad_sync)
