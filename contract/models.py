"""The reference models' presets: names and shapes, which the training package builds and the planner sizes.

A preset is pure data (no torch): `training.models` builds the network from it, `jobs` validates
`model_size` against the names and sizes runs from the shapes. Add a preset here and both follow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-style decoder: pre-norm blocks, causal attention, GELU MLP of 4 x d_model, a separate output head."""

    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    vocab_size: int
    dropout: float = 0.0


@dataclass(frozen=True)
class ViTConfig:
    """A Vision Transformer classifier: patch embedding, class token, pre-norm encoder blocks."""

    image_size: int
    patch_size: int
    channels: int
    n_layer: int
    n_head: int
    d_model: int
    num_classes: int
    dropout: float = 0.0

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# Sizes people size platforms for. Parameter counts are for the preset's own vocabulary.
GPT_PRESETS = {
    "tiny": GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=32, vocab_size=256),  # tests: ~40k
    "small": GPTConfig(n_layer=6, n_head=6, d_model=384, seq_len=256, vocab_size=256),  # ~10M, laptop demo
    "125m": GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024, vocab_size=50304),
    "350m": GPTConfig(n_layer=24, n_head=16, d_model=1024, seq_len=1024, vocab_size=50304),
    "1b": GPTConfig(n_layer=16, n_head=16, d_model=2048, seq_len=2048, vocab_size=50304),  # ~1.0B
    "7b": GPTConfig(n_layer=32, n_head=32, d_model=4096, seq_len=4096, vocab_size=32000),  # ~6.7B
}

VIT_PRESETS = {
    "tiny": ViTConfig(image_size=32, patch_size=8, channels=3, n_layer=2, n_head=2, d_model=32, num_classes=10),
    "base": ViTConfig(image_size=224, patch_size=16, channels=3, n_layer=12, n_head=12, d_model=768,
                      num_classes=1000),  # ViT-B/16, 86M
    "large": ViTConfig(image_size=224, patch_size=16, channels=3, n_layer=24, n_head=16, d_model=1024,
                       num_classes=1000),  # ViT-L/16, 304M
    "huge": ViTConfig(image_size=224, patch_size=14, channels=3, n_layer=32, n_head=16, d_model=1280,
                      num_classes=1000),  # ViT-H/14, 632M
}

PRESETS: dict[str, dict[str, GPTConfig | ViTConfig]] = {"gpt": GPT_PRESETS, "vit": VIT_PRESETS}
REFERENCE_MODELS = tuple(PRESETS)

# `model` is a reference model's name or `package.module:factory` for one's own.
FACTORY_PATTERN = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"


def preset_names(model: str) -> tuple[str, ...]:
    return tuple(PRESETS.get(model, ()))
