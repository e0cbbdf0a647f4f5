"""Sequence parallelism inside tensor-parallel blocks (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models"), with torch's `SequenceParallel` styles.

Between the attention and the MLP the residual stream is split over the tensor ranks along the sequence
(Shard(1)): the LayerNorms, the residual adds and the dropouts run on 1/tp of the tokens, and their
activations take 1/tp of the memory. The column-parallel projections all-gather the sequence on the way in
(`ColwiseParallel(input_layouts=Shard(1))`, or `PrepareModuleInput` in front of a GPT's attention, which
reads the whole sequence's shape), the row-parallel ones reduce-scatter it on the way out
(`RowwiseParallel(output_layouts=Shard(1))`) where plain tensor parallelism all-reduced: the same bytes
moved, in two halves. The norms' weights become DTensors replicated on the tensor mesh.

A model opts in with an `sp_plan` on each block (same names as `tp_plan`). The stream enters sharded at
the first block of each run of blocks (the model, or a pipeline stage) and leaves whole after the last, so
embeddings, the final norm and the head, and pipeline hops, see plain tensors as without it.

Whether it works depends on torch and the backend: torch 2.8's DTensor fails on a sequence that tp does
not divide (an all-gather with padding leaves a non-contiguous tensor that a later `view` rejects, in the
forward of the column-parallel matmul). `sequence_parallel_problem` therefore runs a tiny block through
the same styles on the real tensor mesh, at a length that tp divides exactly when it divides the model's,
before the model is touched.
"""

from __future__ import annotations

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

STYLES = {
    "sequence": lambda: SequenceParallel(),
    # Before a module that needs the whole sequence as a plain tensor (a GPT's attention reads its shape).
    "gather": lambda: PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                         use_local_output=True),
    "colwise_from_sequence": lambda: ColwiseParallel(input_layouts=Shard(1)),
    # DTensor out: the residual add beside it is a DTensor too, whose global shape stays right when tp
    # does not divide the sequence (a local shard would be taken for an even 1/tp).
    "rowwise_to_sequence": lambda: RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
}

# The probe's largest difference from the unsplit block, relative to the largest value (output, input and
# parameter gradients); measured up to 4.8e-7 in fp32 on CPU, torch 2.13 and 2.8.
PROBE_TOL = 1e-5


def shard_sequence_through(blocks: list[nn.Module], tp_mesh, enters_whole: bool = True,
                           leaves_whole: bool = True) -> None:
    """The stream enters `blocks[0]` split along the sequence (from a whole tensor: a local slice, no communication;
    or, `enters_whole` False, as the rank's shard already) and leaves `blocks[-1]` whole (an all-gather) or, with
    `leaves_whole` False, as the rank's shard: between two pipeline stages each tensor rank then sends its peer 1/tp
    of the activation instead of all of it (Megatron's boundary)."""
    parallelize_module(blocks[0], tp_mesh, PrepareModuleInput(
        input_layouts=(Replicate() if enters_whole else Shard(1),), desired_input_layouts=(Shard(1),),
        use_local_output=False))
    parallelize_module(blocks[-1], tp_mesh, PrepareModuleOutput(
        output_layouts=(Shard(1),), desired_output_layouts=(Replicate() if leaves_whole else Shard(1),),
        use_local_output=True))


class _ProbeBlock(nn.Module):
    """Norm, column- then row-parallel MLP, residual: every style and boundary a block uses."""

    sp_plan = {"ln": "sequence", "fc": "colwise_from_sequence", "out": "rowwise_to_sequence"}

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, hidden)
        self.out = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(F.gelu(self.fc(self.ln(x))))


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _probe(tp_mesh, seq_len: int) -> str | None:
    tp = tp_mesh.size()
    device = torch.device(tp_mesh.device_type)
    with torch.random.fork_rng(devices=[]):  # the job's RNG stream is left as it was
        torch.manual_seed(0)
        dense = _ProbeBlock(4, 4 * tp).to(device)
        sharded = _ProbeBlock(4, 4 * tp).to(device)
        sharded.load_state_dict(dense.state_dict())
        x = torch.randn(2, seq_len, 4, device=device)
    parallelize_module(sharded, tp_mesh, {name: STYLES[style]() for name, style in sharded.sp_plan.items()})
    shard_sequence_through([sharded], tp_mesh)
    xs, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = sharded(xs)
    with torch.no_grad():
        expected = dense(x)
    out.pow(2).sum().backward()
    dense(xd).pow(2).sum().backward()
    if isinstance(out, DTensor) or out.shape != x.shape:
        return f"the stream did not leave the block whole ({type(out).__name__} {tuple(out.shape)})"
    if not isinstance(sharded.ln.weight, DTensor):
        return "the norm's weight was not replicated as a DTensor"
    pairs = [("output", out.detach(), expected), ("input gradient", xs.grad, xd.grad)]
    pairs += [(f"{n} gradient", _full(p.grad).detach(), q.grad) for (n, p), q in zip(sharded.named_parameters(),
                                                                             dense.parameters(), strict=True)]
    for what, a, b in pairs:
        diff = ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
        if not diff <= PROBE_TOL:
            return f"the {what} differs from the unsplit block's by {diff:.2e} of its largest value"
    return None


_PROBED: dict = {}


def sequence_parallel_problem(tp_mesh, seq_len: int) -> str | None:
    """None when sequence parallelism computes what the unsplit block does on this mesh for sequences of
    `seq_len` tokens; else what failed. Collective over the tensor group; remembered."""
    # What decides is whether tp divides the sequence, so a short one with the same remainder stands in.
    key = (tp_mesh, 2 * tp_mesh.size() + seq_len % tp_mesh.size())
    if key not in _PROBED:
        try:
            problem = _probe(*key)
        except Exception as exc:  # noqa: BLE001 - any failure of the styles here means: use replicated norms
            problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        # Every tensor rank must take the same path, or the first block's collectives would not pair up.
        failed = torch.tensor([0 if problem is None else 1], device=torch.device(tp_mesh.device_type))
        torch_dist.all_reduce(failed, group=tp_mesh.get_group())
        if failed.item() and problem is None:
            problem = "another tensor rank's probe failed"
        _PROBED[key] = problem
    return _PROBED[key]
