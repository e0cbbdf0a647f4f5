"""One module per way of spreading the model over the ranks, each an `apply_*` function, torchtitan style.

Each takes the model, the device mesh it spreads over (none for `single`) and the dtypes, never the whole
config; `apply_strategy` is the glue that picks one and hands it what it uses. The loop only sees
`Parallelized`. Checkpoints need nothing from here: torch.distributed.checkpoint reads every strategy's
state dict through `get_state_dict`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass

from torch import nn

from contract.hyperparameters import TrainConfig
from training.distributed import Dist
from training.precision import Precision


@dataclass
class Parallelized:
    model: nn.Module
    # `grad_sync(False)` skips the gradient all-reduce on the micro-steps of an accumulation.
    grad_sync: Callable[[bool], ContextManager] = lambda enabled: contextlib.nullcontext()
    # False when the strategy casts parameters itself (FSDP's MixedPrecisionPolicy) instead of autocast.
    use_autocast: bool = True


def apply_strategy(model: nn.Module, cfg: TrainConfig, dist: Dist, precision: Precision) -> Parallelized:
    # Imported on use: each strategy pulls in its own part of torch.distributed (smp: torch.sagemaker).
    if cfg.strategy == "single":
        from training.strategies.single import apply_single

        return apply_single(model, dist.device)
    if cfg.strategy == "ddp":
        from training.strategies.ddp import apply_ddp

        return apply_ddp(model, dist.mesh(), dist.device)
    if cfg.strategy == "fsdp":
        from training.strategies.fsdp import apply_fsdp

        return apply_fsdp(model, dist.mesh(), dist.device, precision, cfg.fsdp_reshard_after_forward)
    from training.strategies.smp import apply_smp

    return apply_smp(model, dist.device, precision, cfg.mp_parameters)
