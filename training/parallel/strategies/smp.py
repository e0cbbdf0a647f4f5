"""SageMaker model parallelism v2: `torch.sagemaker` transforms the model, then FSDP shards it.

`torch.sagemaker` exists only in the SMP v2 images; everywhere else this strategy stops with a plain
error naming the image. Edge of what runs here: `parse_mp_parameters` and that error are tested; the
code past `import torch.sagemaker` runs only inside the SMP image on GPUs.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from contract.errors import ConfigError
from training.parallel.strategies import Parallelized
from training.precision import Precision

SMP_IMAGE = "658645717510.dkr.ecr.<region>.amazonaws.com/smdistributed-modelparallel:<torch>-gpu-<py>-<cuda>"


def import_smp():
    try:
        import torch.sagemaker as tsm
    except ImportError:
        raise ConfigError(
            "strategy 'smp' needs SageMaker model parallelism v2 (torch.sagemaker), which only the SMP v2 "
            f"image provides ({SMP_IMAGE}, framework 'pytorch-smp'); run it there, or use strategy=fsdp"
        ) from None
    return tsm


def apply_smp(model: nn.Module, device: torch.device, precision: Precision, mp_parameters: dict) -> Parallelized:
    """SMP builds its own device mesh from `mp_parameters` inside `tsm.init`, so none is passed in."""
    tsm = import_smp()
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    # The launcher's mp_parameters (tensor_parallel_degree, hybrid_shard_degree, ...) configure SMP;
    # values given to the estimator/job take precedence over these inside tsm.init.
    tsm.init(mp_parameters)
    model = tsm.transform(model)
    block_types = {type(b) for b in getattr(model, "blocks", [])}
    # SMP v2's docs: the FSDP call stays as it is; `hybrid_shard_degree` in the SMP config turns FULL_SHARD
    # into sharding over groups of that many GPUs, and tensor parallelism comes from tsm.transform.
    fsdp = FullyShardedDataParallel(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=block_types),
        mixed_precision=MixedPrecision(param_dtype=precision.param, reduce_dtype=precision.reduce,
                                       buffer_dtype=precision.param),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=device,
        use_orig_params=True,
        param_init_fn=(lambda m: m.to_empty(device=device, recurse=False))
        if any(p.is_meta for p in model.parameters()) else None,
    )

    def grad_sync(enabled: bool):
        import contextlib

        return contextlib.nullcontext() if enabled else fsdp.no_sync()

    return Parallelized(model=fsdp, grad_sync=grad_sync, use_autocast=False)
