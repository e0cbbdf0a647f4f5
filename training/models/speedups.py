"""Activation checkpointing and torch.compile, applied per repeated block before parallelization.

Both act on `model.blocks` (torchtitan's layout) so FSDP later shards the same units; a model without
`blocks` is compiled whole and cannot use activation checkpointing.

Two checkpointing policies (contract.hyperparameters.CHECKPOINTING_POLICIES):
- full: a block keeps only its input and recomputes its whole forward in backward;
- selective (per op, torchtitan's "op" mode): a block keeps the outputs of its attention and of every other
  matmul, and recomputes the rest: the norms, the activation function, the residual adds, and the matmuls in
  between. Matmuls and attention are where the FLOPs are, so recomputing the cheap ops costs little time,
  while their outputs (a LayerNorm's, the GELU's 4 x width) are a large part of the memory. Keeping every
  other matmul's output rather than all of them halves what the matmuls keep for one recomputed matmul in two
  (tests/training/models/test_selective_checkpointing.py measures both against no checkpointing).
Either applies to every block, or to every k-th (activation_checkpointing_every, torchtitan's layer-wise
selective checkpointing): the blocks between keep everything and recompute nothing.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from contract.errors import ConfigError

# Matmuls (nn.Linear is mm without a bias, addmm with one) and every attention kernel SDPA may pick (CPU, flash,
# memory-efficient, cuDNN), by name: a kernel one torch version lacks is left out.
_MATMULS = ("mm", "addmm")
_ATTENTION = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def _ops(names: tuple[str, ...]) -> frozenset:
    return frozenset(getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n))


MATMUL_OPS, ATTENTION_OPS = _ops(_MATMULS), _ops(_ATTENTION)


def selective_policy():
    """A fresh policy for one checkpointed block's forward and its recompute: keep attention's outputs and the odd
    matmuls' (1st, 3rd, ...), recompute the rest. The forward and the recompute count their matmuls apart, so
    both decide alike for the same matmul."""
    seen: defaultdict[bool, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func in MATMUL_OPS:
            seen[ctx.is_recompute] += 1
            keep = seen[ctx.is_recompute] % 2 == 1
        else:
            keep = func in ATTENTION_OPS
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(model: nn.Module, policy: str = "full", every: int = 1) -> None:
    """Wrap every `every`-th block (the 1st, then each `every` on) in a checkpoint of `policy`."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ConfigError("activation_checkpointing needs the model to keep its layers in `model.blocks`")
    # Recompute each block's activations in backward; the wrapper keeps state_dict keys unchanged.
    wrap = functools.partial(checkpoint_wrapper, preserve_rng_state=True)
    if policy == "selective":
        wrap = functools.partial(wrap, context_fn=selective_policy)
    for i, block in enumerate(blocks):
        if i % every == 0:
            blocks[i] = wrap(block)


def apply_speedups(model: nn.Module, cfg) -> None:
    """What a run's config asks of its model before the strategy wraps it: checkpointing (its policy) first, then
    compile, as training.job and bench.step_overhead both build it. `cfg`: a contract.hyperparameters.TrainConfig."""
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model, cfg.activation_checkpointing_policy, cfg.activation_checkpointing_every)
    if cfg.compile:
        apply_compile(model)


def apply_compile(model: nn.Module) -> None:
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        for block in blocks:
            block.compile()  # in place: parameter names (and so checkpoints) do not change
    else:
        model.compile()
