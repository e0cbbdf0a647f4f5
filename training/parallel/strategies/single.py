"""One process, one device: the model as it is."""

from __future__ import annotations

import torch
from torch import nn

from training.parallel.strategies import Parallelized


def apply_single(model: nn.Module, device: torch.device) -> Parallelized:
    return Parallelized(model=model.to(device))
