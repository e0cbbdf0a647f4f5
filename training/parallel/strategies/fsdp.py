"""FSDP2 (`fully_shard`): each repeated block, then the root, sharded over the mesh.

Parameters are stored in fp32 and cast to the compute dtype by FSDP's MixedPrecisionPolicy; gradients
are reduced in `precision.reduce`. Checkpoints hold sharded DTensors, which torch.distributed.checkpoint
reshards on load.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.parallel.strategies import Parallelized
from training.precision import Precision


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, device: torch.device, precision: Precision,
               reshard_after_forward: bool = True, accumulation: str = "sharded") -> Parallelized:
    if not any(p.is_meta for p in model.parameters()):
        model = model.to(device)
    shard_model(model, mesh, device, precision, reshard_after_forward)
    return Parallelized(model=model, grad_sync=gradient_sync(model, accumulation), use_autocast=False)


def shard_model(model: nn.Module, mesh: DeviceMesh, device: torch.device, precision: Precision,
                reshard_after_forward: bool = True) -> None:
    """FSDP2 on each block, then on the root. `mesh`: 1-D (shard) or 2-D (replicate, shard: HSDP). Also used
    by tp, pp and hybrid on their data dimensions (a pipeline stage is a root of its own)."""
    mp = MixedPrecisionPolicy(param_dtype=precision.param, reduce_dtype=precision.reduce)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    # The root keeps its parameters unsharded after forward: backward needs them at once.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    if not averages_on_reduce_scatter(mesh, device):
        force_sum_reductions(model)


def gradient_sync(model: nn.Module, accumulation: str):
    """What the micro-steps of an accumulation do with FSDP2's gradients (contract.hyperparameters'
    fsdp_accumulation). `sharded`: every micro-batch's backward reduce-scatters, and the shards accumulate (a
    rank holds a shard of the gradients: what lets a large model accumulate at all; torchtitan's default).
    `unsharded`: `grad_sync(False)` skips the reduce-scatter until the last micro-step, and FSDP2 keeps the
    unsharded gradients in between (the whole model's, in fp32, per rank; one reduce-scatter a step)."""
    if accumulation == "sharded":
        return lambda enabled: contextlib.nullcontext()

    @contextlib.contextmanager
    def grad_sync(enabled: bool):
        model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return grad_sync


def averages_on_reduce_scatter(mesh: DeviceMesh, device: torch.device) -> bool:
    """Does this process group's reduce-scatter honour ReduceOp.AVG? FSDP2 reduces fp32/bf16 gradients with it.

    Found by probing, not by version: on gloo, torch 2.8's reduce-scatter treats AVG as a sum, so FSDP2's
    gradients came out world-size times too large (2 CPU ranks trained differently from one process with the
    doubled batch; NCCL and newer torch average correctly). On an HSDP mesh the shard group is probed; the
    replicate all-reduce has no AVG on gloo at all, so a replicate dimension on gloo always sums.
    """
    if mesh.ndim > 1:
        if dist.get_backend(mesh.get_group(0)) == "gloo":
            return False
        mesh = mesh[mesh.mesh_dim_names[-1]]
    group = mesh.get_group()
    world = dist.get_world_size(group)
    out = torch.zeros(1, device=device)
    dist.reduce_scatter_tensor(out, torch.ones(world, device=device), op=dist.ReduceOp.AVG, group=group)
    return bool(out.item() == 1.0)


def force_sum_reductions(model: nn.Module) -> None:
    """Make every FSDP unit reduce with SUM and divide by the world size itself (FSDP's own fallback path).

    The setting is per FSDP unit (each block has its own parameter group), so it is set on every one.
    """
    for module in model.modules():
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
