"""One module per way of spreading the model over the ranks, each an `apply_*` function, torchtitan style.

Each takes the model, the device mesh it spreads over (none for `single`) and the dtypes, never the whole
config; `apply_strategy` is the glue that picks one and hands it what it uses. The loop only sees
`Parallelized`. Checkpoints need nothing from here: torch.distributed.checkpoint reads every strategy's
state dict through `get_state_dict`, and every strategy keeps the original model's parameter names (a
pipeline rank's `model` is the original model with only its own stages' parts left), so a checkpoint
resumes under any other strategy or degrees.

Which one runs is read from the job's degrees (`job_dims`, contract.parallel.ParallelDims), never compared as
the request's name. The torch-native model-parallel strategies (hsdp, tp, pp, hybrid) share one device mesh
(`training.parallel.mesh`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

import torch.distributed as torch_dist
from torch import nn

from contract.hyperparameters import Strategy, TrainConfig
from contract.parallel import ParallelDims
from training.parallel.mesh import build_mesh, checked_dims
from training.parallel.process_group import Dist
from training.precision import Precision


@dataclass
class Parallelized:
    model: nn.Module
    # `grad_sync(False)` skips the gradient all-reduce on the micro-steps of an accumulation.
    grad_sync: Callable[[bool], ContextManager] = lambda enabled: contextlib.nullcontext()
    # False when the strategy casts parameters itself (FSDP's MixedPrecisionPolicy) instead of autocast.
    use_autocast: bool = True
    # Tensor- and pipeline-parallel ranks must see the same samples: the loop's sampler deals every rank its
    # own slice, so the ranks of this group pool theirs (`training.step.share_batch`) and each group trains
    # on the union, which is one data-parallel rank's share. None: every rank trains on its own slice.
    batch_group: torch_dist.ProcessGroup | None = None
    # Pipeline parallelism (training.parallel.pipeline_parallel.PipelineSchedule) runs forward and backward through
    # its schedule instead of the step calling the model.
    pipeline_schedule: Any = None
    # The global gradient norm when torch's clip_grad_norm_ cannot compute it: parameters that are DTensors
    # on different meshes next to plain tensors (tp), or split over pipeline ranks (pp).
    grad_norm: Callable[[float], Any] | None = None
    # The rank's random stream (dropout) when it is not the rank itself: the ranks of a batch group train one
    # model on one batch, so their streams must be equal where tensor parallelism replicates activations (a
    # tensor rank's own randomness, where it shards them, is forked from it: tp.fork_sharded_randomness).
    random_stream: int | None = None


def job_dims(cfg: TrainConfig, dist: Dist) -> ParallelDims | None:
    """The degrees this job runs, checked against the world torchrun gave (training.parallel.mesh.checked_dims);
    None for smp, whose degrees are SMP's own (`mp_parameters`)."""
    if cfg.strategy == Strategy.SMP:
        return None
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size))
    return checked_dims(cfg, dist.world_size, per_host)


def apply_strategy(model: nn.Module, cfg: TrainConfig, dist: Dist, precision: Precision) -> Parallelized:
    """Spread `model` as the job's degrees say (`job_dims`): the strategy is the one they derive
    (contract.parallel.ParallelDims.strategy), not the name the request used, so hsdp on one host runs as fsdp
    and any strategy on one rank as single."""
    dims = job_dims(cfg, dist)
    # Imported on use: each strategy pulls in its own part of torch.distributed (smp: torch.sagemaker).
    if dims is None:
        from training.parallel.strategies.smp import apply_smp

        return apply_smp(model, dist.device, precision, cfg.mp_parameters)
    if dims.strategy is Strategy.SINGLE:
        from training.parallel.strategies.single import apply_single

        return apply_single(model, dist.device)
    if dims.strategy is Strategy.DDP:
        from training.parallel.strategies.ddp import apply_ddp

        return apply_ddp(model, dist.mesh(), dist.device)
    if dims.strategy is Strategy.FSDP:
        from training.parallel.strategies.fsdp import apply_fsdp

        return apply_fsdp(model, dist.mesh(), dist.device, precision, cfg.fsdp_reshard_after_forward,
                          cfg.fsdp_accumulation)
    return apply_model_parallel(model, cfg, dims, dist, precision)


def apply_model_parallel(model: nn.Module, cfg: TrainConfig, dims: ParallelDims, dist: Dist,
                         precision: Precision) -> Parallelized:
    """hsdp, tp, pp and hybrid: one mesh from the degrees, then the strategy's own `apply_*` on it. With
    micro_batch_per_group a batch group's ranks read the same samples (the loop samples per batch group), so
    they pool nothing."""
    par = _apply_model_parallel(model, cfg, dims, dist, precision)
    if cfg.micro_batch_per_group:
        par.batch_group = None
    return par


def _apply_model_parallel(model: nn.Module, cfg: TrainConfig, dims: ParallelDims, dist: Dist,
                          precision: Precision) -> Parallelized:
    mesh = build_mesh(dims, dist.device)
    if dims.strategy is Strategy.HSDP:
        from training.parallel.strategies.hsdp import apply_hsdp

        return apply_hsdp(model, mesh, dims, dist.device, precision, cfg.fsdp_reshard_after_forward,
                          cfg.fsdp_accumulation)
    if dims.strategy is Strategy.TP:
        from training.parallel.strategies.tp import apply_tp

        return apply_tp(model, mesh, dims, dist.device, precision, cfg.fsdp_accumulation)
    from training.parallel.strategies.pp import apply_pp

    return apply_pp(model, mesh, dims, dist.device, precision, cfg)
