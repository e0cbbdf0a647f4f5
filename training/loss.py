"""The package's loss: cross-entropy of the model's output against the targets, the mean over every target.

The full form casts the whole logits (tokens x vocabulary, in whatever dtype the model produced) to fp32 and
takes their log-softmax: per token the vocabulary x (4 + 4) bytes of fp32 temporaries beside the logits, and the
log-softmax is kept for backward. At MPT-125M's micro-batch 26 x 2048 tokens that is ~20 GiB.

The chunked form (the default, `loss_chunk_tokens` tokens a chunk) splits the tokens into chunks and computes each
chunk's fp32 cast and cross-entropy (summed) under torch.utils.checkpoint (non-reentrant): forward keeps only the
logits (checkpoint saves its inputs, views of them), backward recomputes one chunk at a time. So one chunk's fp32
temporaries are alive at a time, forward and backward; the logits and their gradient (what autograd hands the head)
are the only whole-batch tensors. The sum over chunks is divided by the number of targets that count (those not
equal to cross_entropy's ignore_index, -100, as F.cross_entropy's mean does: the package's data never uses it).

Why 1024 tokens a chunk: a chunk's fp32 temporaries are 12 bytes per vocabulary entry per token at backward's peak
(the recomputed log-softmax, its gradient and the input's; measured), 0.6 GB at a 50k vocabulary, 1.6 GB at Llama 3's
128k: small beside the whole batch's logits and their gradient at the micro-batches where the loss matters (26 x 2048
tokens at 50k: 10.7 GB in bf16), while a chunk's kernels still cover 30M+ elements, enough to keep a GPU busy. The
price is the loss's forward run twice (on CPU, 8192 x 50,368 bf16: 4.1 s forward and backward against 3.3 whole),
small beside the blocks' matmuls. tests/training/test_chunked_loss.py measures both forms' bytes on CPU;
`python -m bench.chunked_loss` prints them side by side.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from contract.hyperparameters import LOSS_CHUNK_TOKENS

IGNORE_INDEX = -100  # F.cross_entropy's default: a target equal to it does not count


def full_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The whole logits' fp32 cross-entropy at once (loss_chunk_tokens = 0)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())


def _chunk_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), y, reduction="sum")


def chunked_cross_entropy(logits: torch.Tensor, y: torch.Tensor, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> torch.Tensor:
    """full_cross_entropy's value, with one chunk's fp32 temporaries alive at a time (see the module's docstring)."""
    logits, y = logits.flatten(0, -2), y.flatten()
    recompute = torch.is_grad_enabled() and logits.requires_grad
    total = None
    for part, target in zip(logits.split(chunk_tokens), y.split(chunk_tokens), strict=True):
        s = checkpoint(_chunk_sum, part, target, use_reentrant=False) if recompute else _chunk_sum(part, target)
        total = s if total is None else total + s
    return total / (y != IGNORE_INDEX).sum()


def loss_function(chunk_tokens: int):
    """The loss a run computes: chunked with `chunk_tokens` tokens a chunk, the full form at 0."""
    if chunk_tokens <= 0:
        return full_cross_entropy

    def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return chunked_cross_entropy(logits, y, chunk_tokens)

    return loss
