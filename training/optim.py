"""The optimizer (AdamW with decay only on matrices, or SGD) and the LR schedule (warmup, then cosine)."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from contract.hyperparameters import TrainConfig


def _one_kind(params: list) -> bool:
    """The multi-tensor kernels take one list per step: all plain tensors, or all DTensors of one mesh.
    Tensor parallelism mixes them (sharded layers, replicated norms; with FSDP two meshes)."""
    return len({p.device_mesh if isinstance(p, DTensor) else None for p in params}) <= 1


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = list(model.parameters())
    # None lets torch choose (foreach where it can); False runs one parameter at a time.
    foreach = None if _one_kind(params) else False
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=foreach)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms and biases
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (one launch for all parameters) on GPUs; CPUs use the default implementation.
    fused = (all(p.device.type == "cuda" for p in params) and foreach is None) or None
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused, foreach=foreach)


def lr_multiplier(cfg: TrainConfig):
    """Linear warmup, then cosine decay to min_lr_ratio at max_steps. `step` = optimizer steps taken."""

    def multiplier(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg))
