"""Hybrid-sharded data parallel: FSDP2 over a 2-D (replicate, shard) mesh.

Parameters are sharded inside a shard group (by default the GPUs of one node, where the all-gathers and
reduce-scatters run over NVLink) and replicated across groups (one gradient all-reduce per step crosses
the network). With a replicate degree of 1 it is plain FSDP over the shard group.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from contract.parallel import ParallelDims
from training.parallel.mesh import data_mesh
from training.parallel.strategies import Parallelized
from training.parallel.strategies.fsdp import gradient_sync, shard_model
from training.precision import Precision


def apply_hsdp(model: nn.Module, mesh: DeviceMesh, degrees: ParallelDims, device: torch.device, precision: Precision,
               reshard_after_forward: bool = True, accumulation: str = "sharded") -> Parallelized:
    if not any(p.is_meta for p in model.parameters()):
        model = model.to(device)
    shard_model(model, data_mesh(mesh, degrees), device, precision, reshard_after_forward)
    return Parallelized(model=model, grad_sync=gradient_sync(model, accumulation), use_autocast=False)
