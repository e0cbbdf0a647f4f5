"""One process, one device: the model as it is."""

from __future__ import annotations

import torch
from torch import nn

from training.config import TrainConfig
from training.distributed import Dist
from training.strategies import Parallelized


def apply(model: nn.Module, cfg: TrainConfig, dist: Dist, param_dtype: torch.dtype) -> Parallelized:
    return Parallelized(model=model.to(dist.device), sharded=False)
