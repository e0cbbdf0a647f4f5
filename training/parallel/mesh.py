"""A job's degrees and, for the torch-native model-parallel strategies (hsdp, tp, pp, hybrid), its device mesh.

The degrees (`ParallelDims`), the mesh's shape, its dimensions' order, the rank map and the rules the degrees
obey are `contract.parallel`'s (the launcher checks the same rules before anything starts); this module checks
them again against the world torchrun gives, naming the hyperparameters, and builds the mesh.
"""

from __future__ import annotations

import torch

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from contract.parallel import DIMS, HYPERPARAMETERS, ParallelDims, layout_problems


def checked_dims(cfg: TrainConfig, world: int, per_host: int) -> ParallelDims:
    """The degrees this strategy and its hyperparameters make on the world torchrun gives
    (contract.parallel.ParallelDims.resolve); a ConfigError naming the hyperparameter if they cannot run.
    Not for smp, whose degrees are SMP's own."""
    problems = layout_problems(cfg.strategy, hosts=max(1, world // per_host), per_host=per_host, tensor=cfg.tp_degree,
                               pipeline=cfg.pp_degree, shard=cfg.dp_shard, a=HYPERPARAMETERS)
    if problems:
        raise ConfigError(problems[0].message)
    return ParallelDims.resolve(cfg.strategy, world, per_host, cfg.tp_degree, cfg.pp_degree, cfg.dp_shard)


def build_mesh(degrees: ParallelDims, device: torch.device):
    """The 4-D mesh (`pp`, `dp_replicate`, `dp_shard`, `tp`); size-1 dimensions stay, so slices always exist."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, degrees.shape, mesh_dim_names=DIMS)


def data_mesh(mesh, degrees: ParallelDims):
    """What FSDP2 shards over: (replicate, shard) for HSDP, the shard dimension alone otherwise."""
    return mesh["dp_replicate", "dp_shard"] if degrees.replicate > 1 else mesh["dp_shard"]


def data_index(mesh, degrees: ParallelDims) -> int:
    """This rank's data-parallel coordinate: which batch group (and so which random stream) it belongs to."""
    return mesh["dp_replicate"].get_local_rank() * degrees.shard + mesh["dp_shard"].get_local_rank()


def batch_group(mesh, degrees: ParallelDims):
    """The ranks that train on one batch: same data coordinates, any pipeline stage and tensor rank. Every
    rank creates every such group (new_group is collective), in the same order."""
    import torch.distributed as torch_dist

    if degrees.pp * degrees.tp == 1:
        return None
    ranks = mesh.mesh  # (pp, replicate, shard, tp) -> global rank
    mine = None
    for r in range(degrees.replicate):
        for s in range(degrees.shard):
            members = sorted(ranks[:, r, s, :].flatten().tolist())
            group = torch_dist.new_group(members)
            if torch_dist.get_rank() in members:
                mine = group
    return mine
