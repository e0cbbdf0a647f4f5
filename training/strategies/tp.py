"""Tensor parallelism (Megatron's split through `parallelize_module`), with FSDP2 on the data dimension.

Each block's attention projects q, k, v column-wise (each rank computes whole heads: the models lay `qkv`
out head-major and infer the local head count from the sharded width) and its output row-wise; the MLP
likewise; a GPT's embedding and head are split by vocabulary. Plans are the models' `tp_plan` attributes
(sub-module name -> style), so a model of one's own opts in the same way.

Sequence parallelism (norms and dropout on sequence shards) is left off: the reference models add
position embeddings and norms on plain tensors, which stay replicated; their gradients are equal on every
tensor rank because their inputs are. The tensor ranks train on one batch, pooled from their sampler
slices (`Parallelized.batch_group`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from contract.errors import ConfigError
from training.grad_norm import clip_grad_norm
from training.mesh import Degrees, batch_group, data_mesh
from training.precision import Precision
from training.strategies import Parallelized
from training.strategies.fsdp import gradient_sync, shard_model

STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "rowwise": lambda: RowwiseParallel(),
    # An nn.Embedding split by rows (vocabulary): each rank looks up its ids, the partial sums all-reduced.
    "embedding": lambda: RowwiseParallel(input_layouts=Replicate()),
    # The output head: vocabulary-sharded logits gathered whole for the loss.
    "colwise_gather": lambda: ColwiseParallel(output_layouts=Replicate()),
}


def tensor_parallelize(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Apply every `tp_plan` found on the model and its blocks (a pipeline stage: what it has left)."""
    blocks = list(getattr(model, "blocks", []))
    if not blocks or not hasattr(blocks[0], "tp_plan"):
        raise ConfigError(f"tensor parallelism needs a model whose `blocks` carry a `tp_plan` "
                          f"({type(model).__name__} has none): use the gpt or vit reference models, or fsdp/hsdp")
    for module in [model, *blocks]:
        plan = {name: STYLES[style]() for name, style in getattr(module, "tp_plan", {}).items()
                if _present(module, name)}
        if plan:
            parallelize_module(module, tp_mesh, plan)


def _present(module: nn.Module, name: str) -> bool:
    for part in name.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    return True


def check_heads(model: nn.Module, tp: int) -> None:
    c = getattr(model, "c", None)
    heads = getattr(c, "n_head", None)
    if heads is not None and heads % tp:
        raise ConfigError(f"tp_degree={tp} does not divide the model's {heads} attention heads: "
                          "choose a tp_degree that divides n_head")


def apply_tp(model: nn.Module, mesh: DeviceMesh, degrees: Degrees, device: torch.device,
             precision: Precision) -> Parallelized:
    check_heads(model, degrees.tp)
    if not any(p.is_meta for p in model.parameters()):
        model = model.to(device)
    tensor_parallelize(model, mesh["tp"])
    grad_sync = None
    if degrees.data > 1:
        shard_model(model, data_mesh(mesh, degrees), device, precision)
        grad_sync = gradient_sync(model)
    return Parallelized(
        model=model, use_autocast=degrees.data == 1, batch_group=batch_group(mesh, degrees),
        grad_norm=lambda max_norm: clip_grad_norm(model.parameters(), max_norm),
        **({"grad_sync": grad_sync} if grad_sync else {}))
