"""A Vision Transformer classifier (patch embedding, class token, pre-norm encoder blocks)."""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn

from contract.models import ViTConfig


class EncoderBlock(nn.Module):
    tp_plan = {"qkv": "colwise", "proj": "rowwise", "fc": "colwise", "out": "rowwise"}  # see gpt.Block
    sp_plan = {"ln1": "sequence", "qkv": "colwise_from_sequence", "proj": "rowwise_to_sequence",
               "ln2": "sequence", "fc": "colwise_from_sequence", "out": "rowwise_to_sequence"}

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.head_dim = c.d_model // c.n_head
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)  # head-major rows, as in gpt.Attention
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.out = nn.Linear(4 * c.d_model, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(self.ln1(x))
        b, t, _ = qkv.shape  # the whole sequence, also when `x` is a sequence shard (sequence parallelism)
        q, k, v = qkv.view(b, t, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class ViT(nn.Module):
    data_kind = "images"
    pipeline_edges = (("patch", "cls", "pos"), ("ln_f", "head"))  # see gpt.GPT
    table_params = ("cls", "pos")  # added to the patches, never multiplied: no FLOPs (training.metrics.flops)
    per_sample_modules = ("head",)  # reads the class token alone: its FLOPs are per image (training.metrics.flops)
    input_modules = ("patch",)  # reads the pixels, which need no gradient (training.metrics.flops)

    def __init__(self, c: ViTConfig) -> None:
        super().__init__()
        self.c = c
        self.patch = nn.Conv2d(c.channels, c.d_model, kernel_size=c.patch_size, stride=c.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.pos = nn.Parameter(torch.zeros(1, c.num_patches + 1, c.d_model))
        self.blocks = nn.ModuleList(EncoderBlock(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.num_classes)

    @property
    def sequence_length(self) -> int:
        """Tokens per sample: the patches and the class token (197 at 224/16: tp rarely divides it)."""
        return self.c.num_patches + 1

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.patch is not None:
            x = self.patch(images).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        else:  # a later pipeline stage: hidden states in
            x = images
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x[:, 0])) if self.head is not None else x

    @torch.no_grad()
    def init_weights(self) -> None:
        """Truncated-normal weights and zero biases, as in the ViT paper's reference code."""
        for name, p in self.named_parameters():
            if ".ln" in f".{name}":  # LayerNorm
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif p.dim() == 1 or name.startswith("head"):
                nn.init.zeros_(p)
            else:
                nn.init.trunc_normal_(p, std=0.02)

    def flops_per_sample(self) -> float:
        c = self.c
        t = c.num_patches + 1
        n = sum(p.numel() for p in self.parameters())
        return 6 * n * t + 12 * c.n_layer * c.d_model * t * t

    def export_config(self) -> dict:
        return {"architecture": "vit", **asdict(self.c)}
