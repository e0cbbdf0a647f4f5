"""A GPT-style decoder (pre-norm, causal self-attention through SDPA, GELU MLP), nanoGPT's shape."""

from __future__ import annotations

import math
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn

from contract.models import GPTConfig


class Attention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.head_dim = c.d_model // c.n_head
        # Head-major output rows (head, q|k|v, head_dim): a contiguous slice of rows is whole heads, so tensor
        # parallelism shards `qkv` by rows (ColwiseParallel) and each rank holds complete heads.
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.proj = nn.Linear(c.d_model, c.d_model, bias=False)
        self.dropout = c.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # The local head count comes from the (possibly tensor-parallel) projection's output width.
        q, k, v = self.qkv(x).view(b, t, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    # Tensor parallelism (training.parallel.strategies.tp): Megatron's split, one all-reduce per attention and per MLP.
    tp_plan = {"attn.qkv": "colwise", "attn.proj": "rowwise", "fc": "colwise", "out": "rowwise"}
    # With sequence parallelism: the norms on sequence shards, the attention gathering the whole sequence
    # first (it reads its length), the row-parallel outputs reduce-scattered back onto the sequence.
    sp_plan = {"ln1": "sequence", "attn": "gather", "attn.qkv": "colwise", "attn.proj": "rowwise_to_sequence",
               "ln2": "sequence", "fc": "colwise_from_sequence", "out": "rowwise_to_sequence"}
    # Where tensor parallelism splits activations that dropout touches without sequence parallelism: the heads
    # (attention dropout inside SDPA). Each tensor rank draws its own masks there (tp.fork_sharded_randomness).
    tp_sharded_randomness = ("attn",)

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.d_model)
        self.attn = Attention(c)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model, bias=False)
        self.out = nn.Linear(4 * c.d_model, c.d_model, bias=False)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    data_kind = "tokens"
    # What a pipeline's first stage keeps before `blocks`, and its last stage after them (training.parallel.pipeline_parallel).
    pipeline_edges = (("tok", "pos", "drop"), ("ln_f", "head"))
    # Outside the blocks: the vocabulary-sized tables, split by vocabulary (the logits gathered whole).
    tp_plan = {"tok": "embedding", "head": "colwise_gather"}

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)
        # Not tied to `tok`: safetensors refuses shared storage and FSDP shards the two separately anyway.
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    @property
    def sequence_length(self) -> int:
        """Tokens per sample (what sequence parallelism splits)."""
        return self.c.seq_len

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # A pipeline stage lacks the embeddings (it gets hidden states) or the head (it returns them).
        if self.tok is not None:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.drop(self.tok(idx) + self.pos(pos))
        else:
            x = idx
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.head is not None else x

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's init; residual projections scaled by depth. Uses the global RNG: seed it first."""
        for name, p in self.named_parameters():
            if p.dim() == 1:  # LayerNorm
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.c.n_layer))
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def flops_per_sample(self) -> float:
        """Training FLOPs for one sequence: 6 per parameter per token plus attention (PaLM appendix B)."""
        c = self.c
        n = sum(p.numel() for p in self.parameters()) - self.pos.weight.numel()
        return (6 * n + 12 * c.n_layer * c.d_model * c.seq_len) * c.seq_len

    def export_config(self) -> dict:
        return {"architecture": "gpt", **asdict(self.c)}
