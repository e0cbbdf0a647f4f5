"""Tensor parallelism (Megatron's split through `parallelize_module`), with FSDP2 on the data dimension.

Each block's attention projects q, k, v column-wise (each rank computes whole heads: the models lay `qkv`
out head-major and infer the local head count from the sharded width) and its output row-wise; the MLP
likewise; a GPT's embedding and head are split by vocabulary. Plans are the models' `tp_plan` attributes
(sub-module name -> style), so a model of one's own opts in the same way.

Inside the blocks, sequence parallelism (training.parallel.strategies.sequence) splits the norms, residual adds and
dropouts over the tensor ranks along the sequence, for a model whose blocks carry an `sp_plan`, where a
probe finds that torch and the backend compute it right; elsewhere the blocks' `tp_plan` runs with the norms
replicated (their gradients are equal on every tensor rank because their inputs are), and rank 0 says which
and why. Embeddings, the final norm and the head stay outside it. The tensor ranks train on one batch,
pooled from their sampler slices (`Parallelized.batch_group`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as torch_dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from contract.errors import ConfigError
from contract.parallel import ParallelDims
from training.parallel.grad_norm import clip_grad_norm
from training.parallel.mesh import batch_group, data_index, data_mesh
from training.parallel.strategies import Parallelized
from training.parallel.strategies.fsdp import gradient_sync, shard_model
from training.parallel.strategies.sequence import STYLES as SEQUENCE_STYLES
from training.parallel.strategies.sequence import sequence_parallel_problem, shard_sequence_through
from training.precision import Precision


@dataclass(frozen=True)
class Run:
    """Blocks that run back to back, and whether the stream enters and leaves them whole: a pipeline stage's
    between two others passes its sequence shard on (what crosses to the next stage is 1/tp of the activation on
    each tensor rank); the first stage's enters from the embeddings, the last stage's leaves for the head."""

    blocks: list[nn.Module]
    enters_whole: bool = True
    leaves_whole: bool = True


STYLES = {
    "colwise": lambda: ColwiseParallel(),
    "rowwise": lambda: RowwiseParallel(),
    # An nn.Embedding split by rows (vocabulary): each rank looks up its ids, the partial sums all-reduced.
    "embedding": lambda: RowwiseParallel(input_layouts=Replicate()),
    # The output head: vocabulary-sharded logits gathered whole for the loss.
    "colwise_gather": lambda: ColwiseParallel(output_layouts=Replicate()),
    **SEQUENCE_STYLES,
}


def tensor_parallelize(model: nn.Module, tp_mesh: DeviceMesh, runs: list[Run] | None = None) -> bool:
    """Apply the model's `tp_plan` and each block's `sp_plan` (sequence parallel) or `tp_plan` (a pipeline
    stage: what it has left). `runs`: the blocks that run back to back (a pipeline rank's stages), where the
    sequence is split and gathered (Run); default all of them, entering and leaving whole. True when sequence
    parallelism is on."""
    blocks = list(getattr(model, "blocks", []))
    if not blocks or not hasattr(blocks[0], "tp_plan"):
        raise ConfigError(f"tensor parallelism needs a model whose `blocks` carry a `tp_plan` "
                          f"({type(model).__name__} has none): use the gpt or vit reference models, or fsdp/hsdp")
    sequence = _sequence_parallel(model, blocks, tp_mesh)
    _apply_plan(model, tp_mesh, getattr(model, "tp_plan", {}))
    for block in blocks:
        _apply_plan(unwrapped(block), tp_mesh, block.sp_plan if sequence else block.tp_plan)
    if sequence:
        # A shard passed between stages becomes a DTensor again on the far side from its local piece, which holds
        # only where the sequence splits evenly (uneven pieces would be taken for an even split of another length):
        # elsewhere the whole activation crosses.
        even = _splits_evenly(model, tp_mesh.size())
        for run in runs or [Run(blocks)]:
            shard_sequence_through(run.blocks, tp_mesh, run.enters_whole or not even, run.leaves_whole or not even)
    if _has_dropout(model):
        for block in blocks:
            inner = unwrapped(block)
            # With sequence parallelism every activation inside a block is split; without it, only those between
            # the column- and the row-parallel layer of the modules the block names (a GPT's attention).
            names = [""] if sequence else getattr(inner, "tp_sharded_randomness", ())
            for name in names:
                fork_sharded_randomness(inner.get_submodule(name), tp_mesh.get_local_rank())
    return sequence


def _splits_evenly(model: nn.Module, tp: int) -> bool:
    """Does the model's sequence (its `sequence_length`; unknown: no) split into `tp` equal shards?"""
    length = getattr(model, "sequence_length", None)
    return bool(length) and length % tp == 0


def _has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


def fork_sharded_randomness(module: nn.Module, tp_rank: int) -> None:
    """Dropout inside `module` draws from this tensor rank's own stream; outside it, from the stream the
    tensor ranks share (training.parallel.strategies.Parallelized.random_stream), so a replicated activation gets one
    mask on every rank (different masks made the replicated norms and position table drift apart between
    tensor ranks, and the checkpoint keeps one copy) while split heads or sequence shards get masks of their
    own. Each forward draws one seed from the shared stream (every tensor rank draws the same), runs on a fork
    seeded by it and the tensor rank, then restores the shared stream. Activation checkpointing's recompute
    restores the shared stream first, so it draws the same seed and the same masks."""
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    forks: list = []

    def enter(mod, args) -> None:
        seed = int(torch.randint(0, 2**62, ()).item())
        fork = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type)
        fork.__enter__()
        forks.append(fork)
        torch.manual_seed((seed + 0x9E3779B97F4A7C15 * (tp_rank + 1)) % 2**63)

    def leave(mod, args, output) -> None:
        forks.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)


def unwrapped(block: nn.Module) -> nn.Module:
    """The block inside an activation-checkpointing wrapper (training.models.speedups), whose sub-modules the plans
    name: the wrapper holds it as `_checkpoint_wrapped_module`, and `parallelize_module`, which walks
    `named_children`, finds no `attn.qkv` under the wrapper. The plan then matched nothing: with sequence
    parallelism the block failed (a plain norm met the sharded DTensor stream), without it the block silently
    stayed whole on every tensor rank. The sequence boundaries (`shard_sequence_through`) stay on the wrapper,
    outside the recomputed region: the checkpoint saves the 1/tp input, and the exit all-gather is not redone."""
    while (inner := getattr(block, "_checkpoint_wrapped_module", None)) is not None:
        block = inner
    return block


def _apply_plan(module: nn.Module, tp_mesh: DeviceMesh, names: dict[str, str]) -> None:
    plan: dict[str, ParallelStyle] = {name: STYLES[style]() for name, style in names.items() if _present(module, name)}
    if plan:
        parallelize_module(module, tp_mesh, plan)


def _sequence_parallel(model: nn.Module, blocks: list[nn.Module], tp_mesh: DeviceMesh) -> bool:
    """On when every block has an `sp_plan` and the probe passes at the model's sequence length (unknown:
    tp + 1 tokens, the uneven case, which is the one that fails where any does)."""
    if not all(getattr(b, "sp_plan", None) for b in blocks):
        return False
    seq_len = getattr(model, "sequence_length", None) or tp_mesh.size() + 1
    problem = sequence_parallel_problem(tp_mesh, seq_len)
    if torch_dist.get_rank() == 0:
        state = "on: norms and residuals split over the sequence" if problem is None else (
            f"off, norms replicated: {seq_len} tokens over {tp_mesh.size()} tensor ranks fail the probe "
            f"({problem})")
        print(f"[tp] sequence parallelism {state}", flush=True)
    return problem is None


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


def apply_tp(model: nn.Module, mesh: DeviceMesh, degrees: ParallelDims, device: torch.device,
             precision: Precision, accumulation: str = "sharded") -> Parallelized:
    check_heads(model, degrees.tp)
    if not any(p.is_meta for p in model.parameters()):
        model = model.to(device)
    tensor_parallelize(model, mesh["tp"])
    grad_sync = None
    if degrees.data > 1:
        shard_model(model, data_mesh(mesh, degrees), device, precision)
        grad_sync = gradient_sync(model, accumulation)
    return Parallelized(
        model=model, use_autocast=degrees.data == 1, batch_group=batch_group(mesh, degrees),
        random_stream=data_index(mesh, degrees),
        grad_norm=lambda max_norm: clip_grad_norm(model.parameters(), max_norm),
        **({"grad_sync": grad_sync} if grad_sync else {}))
