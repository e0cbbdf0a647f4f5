"""One module per way of spreading the model over the ranks, each an `apply_*` function, torchtitan style.

Each takes the model, the device mesh it spreads over (none for `single`) and the dtypes, never the whole
config; `apply_strategy` is the glue that picks one and hands it what it uses. The loop only sees
`Parallelized`. Checkpoints need nothing from here: torch.distributed.checkpoint reads every strategy's
state dict through `get_state_dict`, and every strategy keeps the original model's parameter names (a
pipeline rank's `model` is the original model with only its own stages' parts left), so a checkpoint
resumes under any other strategy or degrees.

The torch-native model-parallel strategies (hsdp, tp, pp, hybrid) share one device mesh (`training.parallel.mesh`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

import torch.distributed as torch_dist
from torch import nn

from contract.hyperparameters import TrainConfig
from contract.parallel import MODEL_PARALLEL
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


def apply_strategy(model: nn.Module, cfg: TrainConfig, dist: Dist, precision: Precision) -> Parallelized:
    # Imported on use: each strategy pulls in its own part of torch.distributed (smp: torch.sagemaker).
    if cfg.strategy == "single":
        from training.parallel.strategies.single import apply_single

        return apply_single(model, dist.device)
    if cfg.strategy == "ddp":
        from training.parallel.strategies.ddp import apply_ddp

        return apply_ddp(model, dist.mesh(), dist.device)
    if cfg.strategy == "fsdp":
        from training.parallel.strategies.fsdp import apply_fsdp

        return apply_fsdp(model, dist.mesh(), dist.device, precision, cfg.fsdp_reshard_after_forward)
    if cfg.strategy in MODEL_PARALLEL:
        return apply_model_parallel(model, cfg, dist, precision)
    from training.parallel.strategies.smp import apply_smp

    return apply_smp(model, dist.device, precision, cfg.mp_parameters)


def apply_model_parallel(model: nn.Module, cfg: TrainConfig, dist: Dist, precision: Precision) -> Parallelized:
    """hsdp, tp, pp and hybrid: one mesh from the degrees, then the strategy's own `apply_*` on it. With
    micro_batch_per_group a batch group's ranks read the same samples (the loop samples per batch group), so
    they pool nothing."""
    par = _apply_model_parallel(model, cfg, dist, precision)
    if cfg.micro_batch_per_group:
        par.batch_group = None
    return par


def _apply_model_parallel(model: nn.Module, cfg: TrainConfig, dist: Dist, precision: Precision) -> Parallelized:
    import os

    from training.parallel.mesh import build_mesh, checked_degrees

    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world_size))
    degrees = checked_degrees(cfg, dist.world_size, per_host)
    mesh = build_mesh(degrees, dist.device)
    if cfg.strategy == "hsdp":
        from training.parallel.strategies.hsdp import apply_hsdp

        return apply_hsdp(model, mesh, degrees, dist.device, precision, cfg.fsdp_reshard_after_forward)
    if cfg.strategy == "tp":
        from training.parallel.strategies.tp import apply_tp

        return apply_tp(model, mesh, degrees, dist.device, precision)
    from training.parallel.strategies.pp import apply_pp

    return apply_pp(model, mesh, degrees, dist.device, precision, cfg)
