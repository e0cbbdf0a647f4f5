"""FSDP2 (`fully_shard`): each repeated block, then the root, sharded over all ranks.

Parameters are stored in fp32 and cast to the compute dtype by FSDP's MixedPrecisionPolicy; gradients
are reduced in fp32. Checkpoints are sharded DTensors written with torch.distributed.checkpoint.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config import TrainConfig
from training.distributed import Dist
from training.strategies import Parallelized


def apply(model: nn.Module, cfg: TrainConfig, dist: Dist, param_dtype: torch.dtype) -> Parallelized:
    if not any(p.is_meta for p in model.parameters()):
        model = model.to(dist.device)
    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=cfg.fsdp_reshard_after_forward)
    # The root keeps its parameters unsharded after forward: backward needs them at once.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)

    @contextlib.contextmanager
    def grad_sync(enabled: bool):
        model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return Parallelized(model=model, sharded=True, grad_sync=grad_sync, use_autocast=False)
