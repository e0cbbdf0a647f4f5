"""One device mesh per job for the torch-native model-parallel strategies (hsdp, tp, pp, hybrid).

Dimensions, outermost first: `pp` (pipeline stages), `dp_replicate` (full copies), `dp_shard` (FSDP2
shards), `tp` (tensor parallel). Ranks fill the mesh row-major and torchrun numbers them host after host
(node rank = the host's place in SM_HOSTS, then the local GPU), so the innermost dimensions are contiguous
ranks on one host: tensor groups (every layer talks inside them) and hsdp's shard groups stay in a node,
and only pipeline hops and replica all-reduces cross the network. `jobs.parallelism` checks the same rules
for the launcher before anything starts; this module checks them again against the world it finds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig

DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
MODEL_PARALLEL = ("hsdp", "tp", "pp", "hybrid")


@dataclass(frozen=True)
class Degrees:
    pp: int = 1
    replicate: int = 1
    shard: int = 1
    tp: int = 1

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.replicate, self.shard, self.tp)

    @property
    def data(self) -> int:
        return self.replicate * self.shard

    @property
    def world(self) -> int:
        return self.pp * self.data * self.tp


def resolve_degrees(cfg: TrainConfig, world: int, per_host: int) -> Degrees:
    """The mesh shape for this strategy, world and host size; a ConfigError naming the hyperparameter if none fits."""
    s, tp, pp = cfg.strategy, cfg.tp_degree, cfg.pp_degree
    if s == "hsdp" and (tp > 1 or pp > 1):
        raise ConfigError(f"strategy 'hsdp' shards data only, but tp_degree={tp}, pp_degree={pp}: "
                          "use strategy 'tp', 'pp' or 'hybrid', or set both degrees to 1")
    if s == "tp" and (tp < 2 or pp > 1):
        raise ConfigError(f"strategy 'tp' needs tp_degree >= 2 and pp_degree 1 (got {tp}, {pp}): "
                          "set tp_degree, or use 'hybrid' with a pipeline")
    if s == "pp" and (pp < 2 or tp > 1):
        raise ConfigError(f"strategy 'pp' needs pp_degree >= 2 and tp_degree 1 (got {pp}, {tp}): "
                          "set pp_degree, or use 'hybrid' with tensor parallelism")
    if s == "hybrid" and (pp < 2 or tp < 2):
        raise ConfigError(f"strategy 'hybrid' needs pp_degree >= 2 and tp_degree >= 2 (got {pp}, {tp}): "
                          "use 'tp' or 'pp' for one of them")
    if world % (tp * pp):
        raise ConfigError(f"tp_degree={tp} x pp_degree={pp} does not divide the world size {world}: "
                          "choose degrees whose product divides the number of processes")
    if tp > 1 and per_host % tp:
        raise ConfigError(f"tp_degree={tp} does not divide the {per_host} processes per host: a tensor group "
                          "would span hosts; choose a divisor of the GPUs per instance")
    data = world // (tp * pp)
    shard = cfg.dp_shard or (max(1, per_host // tp) if s == "hsdp" else data)
    shard = min(shard, data) if s == "hsdp" and not cfg.dp_shard else shard
    if data % shard:
        raise ConfigError(f"dp_shard={shard} does not divide the {data} data-parallel ranks "
                          f"(world {world} / (tp_degree {tp} x pp_degree {pp})): choose a divisor")
    return Degrees(pp=pp, replicate=data // shard, shard=shard, tp=tp)


def build_mesh(degrees: Degrees, device: torch.device):
    """The 4-D mesh (`pp`, `dp_replicate`, `dp_shard`, `tp`); size-1 dimensions stay, so slices always exist."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, degrees.shape, mesh_dim_names=DIMS)


def data_mesh(mesh, degrees: Degrees):
    """What FSDP2 shards over: (replicate, shard) for HSDP, the shard dimension alone otherwise."""
    return mesh["dp_replicate", "dp_shard"] if degrees.replicate > 1 else mesh["dp_shard"]


def data_index(mesh, degrees: Degrees) -> int:
    """This rank's data-parallel coordinate: which batch group (and so which random stream) it belongs to."""
    return mesh["dp_replicate"].get_local_rank() * degrees.shard + mesh["dp_shard"].get_local_rank()


def batch_group(mesh, degrees: Degrees):
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
