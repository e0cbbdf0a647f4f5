"""Reference models and the way to bring one's own.

`model=gpt` or `model=vit` with `model_size` a preset name builds a reference model. Any other model comes
as `model=package.module:factory` (the module importable from the source dir): `factory(cfg, data_meta)`
gets the TrainConfig and the train channel's meta.json (a dict, empty for synthetic data) and returns an
`nn.Module` mapping a batch of inputs to logits. The loop uses, when present:
  - `data_kind`: "tokens" (the default; batches of token ids, targets shifted by one) or "images";
  - `blocks`: an nn.ModuleList of the repeated layers (FSDP shards, checkpoints and compiles each one);
  - `init_weights()`: makes the model buildable on the meta device (required above ~1B parameters);
  - `flops_per_sample()`: enables the MFU metric; `export_config()`: written next to model.safetensors.
"""

from __future__ import annotations

import dataclasses
import importlib

import torch
from torch import nn

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from contract.models import PRESETS
from training.models.gpt import GPT
from training.models.vit import ViT


def build_model(cfg: TrainConfig, data_meta: dict) -> nn.Module:
    """The model on the meta device (reference models) or on the CPU (models without init_weights)."""
    if cfg.model in PRESETS:
        presets = PRESETS[cfg.model]
        if cfg.model_size not in presets:
            raise ConfigError(
                f"model_size {cfg.model_size!r} is not a {cfg.model} preset: use one of {', '.join(presets)}"
            )
        base = presets[cfg.model_size]
        with torch.device("meta"):
            if cfg.model == "gpt":
                c = dataclasses.replace(base, dropout=cfg.dropout, seq_len=cfg.seq_len or base.seq_len,
                                        vocab_size=int(data_meta.get("vocab_size", base.vocab_size)))
                return GPT(c)
            c = dataclasses.replace(
                base, dropout=cfg.dropout,
                image_size=int(data_meta.get("image_size", base.image_size)),
                channels=int(data_meta.get("channels", base.channels)),
                num_classes=int(data_meta.get("num_classes", base.num_classes)),
            )
            return ViT(c)
    module_name, _, attr = cfg.model.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"model {cfg.model!r} cannot be loaded ({e}): give 'package.module:factory' "
                          "with the module inside the source directory") from None
    model = factory(cfg, data_meta)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model factory {cfg.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def data_kind(model: nn.Module) -> str:
    return getattr(model, "data_kind", "tokens")


def model_seq_len(model: nn.Module, cfg: TrainConfig) -> int:
    c = getattr(model, "c", None)
    return getattr(c, "seq_len", None) or cfg.seq_len or 256


def materialize(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate meta parameters on `device` and initialize them deterministically from `seed`."""
    if not any(p.is_meta for p in model.parameters()):
        return
    if not hasattr(model, "init_weights"):
        raise ConfigError("a model built on the meta device needs an init_weights() method")
    model.to_empty(device=device)
    torch.manual_seed(seed)
    model.init_weights()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
