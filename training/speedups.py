"""Activation checkpointing and torch.compile, applied per repeated block before parallelization.

Both act on `model.blocks` (torchtitan's layout) so FSDP later shards the same units; a model without
`blocks` is compiled whole and cannot use activation checkpointing.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from contract.errors import ConfigError


def apply_activation_checkpointing(model: nn.Module) -> None:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ConfigError("activation_checkpointing needs the model to keep its layers in `model.blocks`")
    for i, block in enumerate(blocks):
        # Recompute each block's activations in backward; the wrapper keeps state_dict keys unchanged.
        blocks[i] = checkpoint_wrapper(block, preserve_rng_state=True)


def apply_compile(model: nn.Module) -> None:
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList):
        for block in blocks:
            block.compile()  # in place: parameter names (and so checkpoints) do not change
    else:
        model.compile()
