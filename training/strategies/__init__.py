"""One module per way of spreading the model over the ranks; the loop only sees `Parallelized`.

Each strategy module has `apply(model, cfg, dist, param_dtype) -> Parallelized`, torchtitan style.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass

import torch
from torch import nn

from training.config import TrainConfig
from training.distributed import Dist


@dataclass
class Parallelized:
    model: nn.Module
    # True: checkpoints are sharded (torch.distributed.checkpoint, every rank writes its part).
    # False: the state is replicated and rank 0 writes it once.
    sharded: bool
    # `grad_sync(False)` skips the gradient all-reduce on the micro-steps of an accumulation.
    grad_sync: Callable[[bool], ContextManager] = lambda enabled: contextlib.nullcontext()
    # False when the strategy casts parameters itself (FSDP's MixedPrecisionPolicy) instead of autocast.
    use_autocast: bool = True


def apply_strategy(model: nn.Module, cfg: TrainConfig, dist: Dist, param_dtype: torch.dtype) -> Parallelized:
    if cfg.strategy == "single":
        from training.strategies import single as strategy
    elif cfg.strategy == "ddp":
        from training.strategies import ddp as strategy
    elif cfg.strategy == "fsdp":
        from training.strategies import fsdp as strategy
    else:
        from training.strategies import smp as strategy
    return strategy.apply(model, cfg, dist, param_dtype)
