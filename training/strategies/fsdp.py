"""FSDP2 (`fully_shard`): each repeated block, then the root, sharded over the mesh.

Parameters are stored in fp32 and cast to the compute dtype by FSDP's MixedPrecisionPolicy; gradients
are reduced in `precision.reduce`. Checkpoints hold sharded DTensors, which torch.distributed.checkpoint
reshards on load.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.precision import Precision
from training.strategies import Parallelized


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, device: torch.device, precision: Precision,
               reshard_after_forward: bool = True) -> Parallelized:
    if not any(p.is_meta for p in model.parameters()):
        model = model.to(device)
    mp = MixedPrecisionPolicy(param_dtype=precision.param, reduce_dtype=precision.reduce)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    # The root keeps its parameters unsharded after forward: backward needs them at once.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)

    @contextlib.contextmanager
    def grad_sync(enabled: bool):
        model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return Parallelized(model=model, grad_sync=grad_sync, use_autocast=False)
