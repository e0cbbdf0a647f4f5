"""Pipeline parallelism (`pp`), and with tensor parallelism inside each stage the 3-D `hybrid`.

The model is cut into pp_degree x stages-per-rank stages (training.parallel.pipeline_parallel); tensor parallelism, when
tp_degree > 1, splits each stage's layers over the tensor ranks; FSDP2, when more than one data-parallel
rank remains, shards each stage over them. The loop sees the rank's model (original names, only its parts)
and a `PipelineSchedule` that `TrainStep` drives instead of calling the model.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from contract.parallel import (
    HYPERPARAMETERS,
    ParallelDims,
    microbatch_problems,
    stages_per_rank,
    stages_problems,
)
from contract.parallel import microbatches as default_microbatches
from training.parallel.grad_norm import clip_grad_norm
from training.parallel.mesh import batch_group, data_index, data_mesh
from training.parallel.pipeline_parallel import PipelineSchedule, adopt_root_parameters, split
from training.parallel.strategies import Parallelized
from training.parallel.strategies.fsdp import shard_model
from training.parallel.strategies.tp import Run, check_heads, tensor_parallelize
from training.precision import Precision


def pipeline_microbatches(cfg: TrainConfig, degrees: ParallelDims) -> int:
    """How many micro-batches a pipeline-parallel step splits its batch into: pp_microbatches (or its default,
    contract.parallel.microbatches), checked by contract.parallel's rule, naming the hyperparameter."""
    problems = microbatch_problems(cfg.pp_microbatches, degrees.pp, degrees.tp, cfg.micro_batch_size, HYPERPARAMETERS,
                                   cfg.pp_schedule, cfg.micro_batch_per_group)
    if problems:
        raise ConfigError(problems[0].message)
    return default_microbatches(cfg.pp_microbatches, degrees.pp)


def pipeline_stages_per_rank(cfg: TrainConfig) -> int:
    """How many model stages each pipeline rank holds: pp_stages_per_rank (or the schedule's default), checked by
    contract.parallel's rule, naming the hyperparameter."""
    problems = stages_problems(cfg.pp_schedule, cfg.pp_stages_per_rank, HYPERPARAMETERS)
    if problems:
        raise ConfigError(problems[0].message)
    return stages_per_rank(cfg.pp_schedule, cfg.pp_stages_per_rank)


def apply_pp(model: nn.Module, mesh: DeviceMesh, degrees: ParallelDims, device: torch.device, precision: Precision,
             cfg: TrainConfig) -> Parallelized:
    if any(p.is_meta for p in model.parameters()):
        raise ConfigError("pp and hybrid build the whole model before cutting it: this model is too large for "
                          "that path today; use fsdp, hsdp or tp")
    m = pipeline_microbatches(cfg, degrees)
    n_stages = degrees.pp * pipeline_stages_per_rank(cfg)
    pp_mesh = mesh["pp"]
    model, stages = split(model.to(device), n_stages, pp_mesh.get_local_rank(), degrees.pp)
    if torch.distributed.get_rank() == 0:
        print(f"[pp] {n_stages} stages over {degrees.pp} pipeline ranks ({n_stages // degrees.pp} a rank, "
              f"{cfg.pp_schedule}, {m} micro-batches a step); this rank holds stages {sorted(stages)}", flush=True)
    if degrees.tp > 1:
        check_heads(model, degrees.tp)
        # Each stage runs its own blocks back to back. With sequence parallelism the sequence stays split from the
        # first stage's embeddings to the last stage's head: each tensor rank sends its peer in the next stage its
        # 1/tp shard (without it, the whole activation travels).
        tensor_parallelize(model, mesh["tp"], [Run(list(stage.blocks), s == 0, s == n_stages - 1)
                                               for s, stage in stages.items()])
    sharded = degrees.data > 1
    if sharded:
        for stage in stages.values():
            # Gathered parameters stay for the stage's backward: 1F1B interleaves them micro-batch by micro-batch.
            shard_model(stage, data_mesh(mesh, degrees), device, precision, reshard_after_forward=False)
        adopt_root_parameters(model, stages)
    model.pipeline_group = pp_mesh.get_group()  # read by the export (training.parallel.pipeline_parallel.gather_full_state_dict)
    schedule = PipelineSchedule(stages, n_stages, cfg.pp_schedule, m, pp_mesh.get_group(), device)
    return Parallelized(model=model, use_autocast=not sharded, batch_group=batch_group(mesh, degrees),
                        pipeline_schedule=schedule, random_stream=data_index(mesh, degrees),
                        grad_norm=lambda max_norm: clip_grad_norm(model.parameters(), max_norm, pp_mesh.get_group()))
