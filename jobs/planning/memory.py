"""Bytes per GPU: training state by strategy and degree, activations from the shapes, and overheads.

Training state (what the package allocates; tests/jobs/test_planner_memory.py checks it against PyTorch):
fp32 weights (4 B/param: autocast and FSDP's MixedPrecisionPolicy both keep fp32 masters), fp32 gradients
(4 B), AdamW's two fp32 moments (8 B) and one fp32 `step` per parameter tensor; the package's SGD has no
momentum (training.optim passes none), so no state. DDP also keeps gradient buckets (4 B/param:
gradient_as_bucket_view is off) and autocast caches bf16 copies of the weights (2 B/param) for the step.
FSDP accumulating over micro-batches holds its gradients' shards between micro-steps (fsdp_accumulation sharded,
the default: a reduce-scatter every micro-batch) or the whole model's, unsharded, in fp32 (unsharded; and a pipeline's
stage always, its schedule skipping the reduce-scatter until the last micro-batch); tests/training/parallel/
test_fsdp_accumulation.py measures both on the ranks.

Activations, bytes per token per block (flash attention, no dropout; a = 2 at bf16/fp16, 4 at fp32; r the
residual stream's bytes): the two LayerNorm inputs 2 x r.h; saved matmul inputs qkv a.h, proj a.h, fc a.h, out
a.4h; q, k, v 3a.h and the attention output a.h; the GELU input a.4h: 2r.h + 15a.h. The residual stream is fp32
under autocast (single, ddp, and tp or hybrid without a data dimension: the token table's output is fp32, r = 4)
and in the compute dtype where FSDP's MixedPrecisionPolicy casts the parameters instead (fsdp, hsdp, and the
data dimension of tp and pp: training.parallel.strategies, use_autocast=False; r = a). With activation checkpointing a
block keeps only its input (r.h; selective: and the outputs it keeps). A decoder's loss is the package's
(training.loss, chosen by training.step; `loss_bytes`), over the vocabulary V, the logits gathered whole under
tensor parallelism (training.parallel.strategies.tp), beside the head's input ((r + a).h a token).
Backward adds to what forward kept one thing after another, never two at once: first the loss's temporaries and the
logits' gradient, which the head's backward frees; then, with checkpointing, one block recomputed at a time. So the
peak is what forward kept plus the larger of the two (`activation_phases`). Autocast's bf16 weight cache (2 B/param,
single and DDP) is kept for backward by the matmuls without checkpointing; with it, autocast frees the cache as the
forward leaves it (the loss runs outside autocast), so it counts only where it exceeds what backward adds.
Measured on CPU with the package's step, the bytes per token each policy and loss form add per sample (gpt small at a
8,192 vocabulary, tests/jobs/test_planner_memory.py): none +2.4% (full loss) and +3.7% (chunked), full and selective
checkpointing of every block within 0.2%, of every second block (activation_checkpointing_every 2) +1.5% / +2.7%.
  - full (loss_chunk_tokens = 0; the calibration rows'): FULL_LOSS_BYTES.V a token at backward's log-softmax (its
    kept output, the NLL's gradient and its own input's gradient, fp32 each; the forward holds (a + 8).V, less).
  - chunked (the default, c = loss_chunk_tokens tokens a chunk, each under torch.utils.checkpoint): per token
    the logits (a) and their gradient (a, filled chunk by chunk during backward, then concatenated once the
    logits are freed): 2a.V; and once, one chunk's fp32 temporaries at backward's peak (the recomputed
    log-softmax, its gradient and the input's): 12.V.min(c, tokens). Measured on CPU with a bf16 head
    (tests/training/test_chunked_loss.py), 8192 tokens x 50,368: 2a.V a token + 10.V.c, this charge 4.8% above.
  - compiled (compile, outside a pipeline: training.step compiles the whole loss, fused): the logits and their
    gradient, 2a.V (measured on CPU: the gradient's a.V beside the logits, no fp32 copy).
The time model's traffic reads the full loss's bytes whatever the form (jobs.planning.timing: the chunked and the
compiled loss run the same elementwise passes; the chunked one recomputes its forward, not modelled).
Tensor parallelism (with sequence parallelism) divides the blocks' activations by the tensor degree.
Calibration (one H100, bf16 autocast, fp32 weights, fused AdamW, the full loss, peak allocated): see CALIBRATION.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.planning.layout import Layout, Numerics
from jobs.planning.shape import ModelFacts

GIB = 2 ** 30
ALLOCATOR_SLACK = 0.10  # reserved beyond allocated (fragmentation of PyTorch's caching allocator)
CONTEXT_GIB = 1.5  # CUDA context, cuBLAS workspace and NCCL buffers: outside PyTorch's allocated bytes
# The full loss's peak per token per vocabulary entry, at backward's log-softmax: its kept output, the NLL's gradient
# and its own input's gradient, fp32 each, whatever the logits' dtype (measured on CPU: 12.3 with the head's bytes).
FULL_LOSS_BYTES = 12

# (model, size, micro-batch, checkpointing policy or None) -> measured peak allocated GiB on one H100 80GB,
# torch 2.11, bf16 autocast, fp32 weights, fused AdamW, the full fp32 loss (loss_chunk_tokens = 0: the package's only
# loss then; tests/jobs/test_planner_memory.py evaluates them with it) (the brief of issue 11; vit base once read 21.5 GiB
# in an older run, we fit to the newer 17.70). `python -m bench.peak_memory` re-measures them (its docstring has the
# command); tests/jobs/test_planner_memory.py holds the model to each within 5%.
CALIBRATION = {
    ("gpt", "1b", 8, None): 40.53,
    ("gpt", "1b", 8, "full"): 23.01,
    ("gpt", "350m", 16, None): 28.10,
    ("vit", "base", 256, None): 17.70,
    ("vit", "large", 128, None): 25.52,
}


@dataclass(frozen=True)
class Memory:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    extra: float  # DDP buckets, autocast's weight cache, FSDP's gathered block and root, accumulated gradients

    @property
    def allocated(self) -> float:
        # zero_grad(set_to_none=True) frees the gradients before forward; backward refills them as it frees the
        # activations, so the peak (end of forward) holds the larger of the two, not both.
        return self.weights + self.optimizer + self.extra + max(self.activations, self.gradients)

    @property
    def needed_gib(self) -> float:
        """What the GPU must hold: allocated, the allocator's slack, and the CUDA/NCCL context."""
        return self.allocated * (1 + ALLOCATOR_SLACK) / GIB + CONTEXT_GIB


def optimizer_bytes(params: int, tensors: int, optimizer: str) -> int:
    """AdamW: exp_avg and exp_avg_sq in fp32 and a 4-byte `step` per tensor; SGD without momentum: none."""
    return 8 * params + 4 * tensors if optimizer == "adamw" else 0


def residual_bytes(n: Numerics, layout: Layout) -> int:
    """Bytes of a residual-stream element: the compute dtype where FSDP casts the parameters (a data dimension
    sharded by FSDP2), fp32 under autocast (see the module's docstring)."""
    return n.compute_bytes if layout.shard > 1 else 4


def block_activation_bytes(m: ModelFacts, n: Numerics, layout: Layout) -> float:
    """Saved bytes per token of one block (see the module's docstring)."""
    return 2 * residual_bytes(n, layout) * m.hidden + 15 * n.compute_bytes * m.hidden


def selective_block_bytes(m: ModelFacts, n: Numerics, layout: Layout) -> float:
    """Saved bytes per token of one block under selective checkpointing (training.models.speedups): its input (r.h),
    the outputs of attention (a.h) and of the 1st and 3rd matmuls, qkv (3a.h) and fc (4a.h). The norms' and
    GELU's outputs and the proj and out matmuls' are recomputed."""
    return residual_bytes(n, layout) * m.hidden + 8 * n.compute_bytes * m.hidden


LOSS_FORMS = ("full", "chunked", "compiled")


def loss_form(n: Numerics, layout: Layout) -> str:
    """How the package computes this run's loss (training.step): compiled whole with `compile` outside a pipeline
    (whose schedule calls it eager), else chunked, or full where loss_chunk_tokens is 0."""
    if n.compile and layout.pipeline == 1:
        return "compiled"
    return "chunked" if n.loss_chunk_tokens > 0 else "full"


def loss_bytes(m: ModelFacts, n: Numerics, tokens: float, form: str) -> float:
    """A decoder's loss on `tokens` tokens, the logits included (see the module's docstring); 0 for other models
    (a classifier's logits are a few thousand entries a sample)."""
    if m.kind != "decoder":
        return 0.0
    a = n.compute_bytes
    if form == "full":
        return tokens * FULL_LOSS_BYTES * m.vocab
    chunk = 12 * m.vocab * min(n.loss_chunk_tokens, tokens) if form == "chunked" else 0.0
    return tokens * 2 * a * m.vocab + chunk


def activation_bytes(m: ModelFacts, n: Numerics, layout: Layout, loss: str | None = None) -> float:
    """Peak activations on the busiest GPU: the first pipeline stage holds `in_flight` micro-batches. `loss`: the
    loss's form (LOSS_FORMS; default the run's, `loss_form`)."""
    return sum(activation_phases(m, n, layout, loss))


def activation_phases(m: ModelFacts, n: Numerics, layout: Layout, loss: str | None = None) -> tuple[float, float]:
    """(kept, after): what forward keeps for backward (the blocks', the head's input, a ViT's patches), and the
    largest of what backward adds to it one after the other: the loss (its temporaries and the logits' gradient),
    then, with checkpointing, one block recomputed. The head's backward frees the first before any block is
    recomputed, so the two never meet (measured on CPU: tests/jobs/test_planner_memory.py)."""
    a, t, r = n.compute_bytes, layout.tensor, residual_bytes(n, layout)
    if m.kind == "other" and not m.hidden:
        return m.other_activation_bytes * n.micro_batch * a / 2, 0.0
    tokens = n.micro_batch * m.tokens
    layers = -(-m.layers // layout.pipeline)
    per_block = block_activation_bytes(m, n, layout) / t
    # What each block keeps from forward to backward: a checkpointed one its input (selective: and the outputs it
    # keeps); the others (all of them without checkpointing, those between every k-th with
    # activation_checkpointing_every k) everything.
    checkpointed = selective_block_bytes(m, n, layout) / t if n.selective else r * m.hidden / t
    share = n.checkpointed_share(layers)
    blocks = layers * (share * checkpointed + (1 - share) * per_block)
    # 1F1B's first stage holds at most one micro-batch per stage before its first backward; GPipe runs every
    # forward before any backward, so it holds them all.
    in_flight = (layout.microbatches if layout.schedule == "gpipe" else min(layout.pipeline, layout.microbatches)) \
        if layout.pipeline > 1 else 1
    if layout.stages_per_rank > 1:
        # Interleaving keeps more micro-batches in flight on the first rank: 1 + (p - 1) / (p v) times 1F1B's
        # (Korthikanti et al. 2022, section 4.2.3).
        in_flight *= 1 + (layout.pipeline - 1) / (layout.pipeline * layout.stages_per_rank)
    # The head's input split; the loss over the whole vocabulary (tensor parallelism gathers the logits).
    head = (r + a) * m.hidden / t if m.kind == "decoder" else 0.0
    inputs = a * m.image_bytes / m.tokens if m.kind == "vit" else 0.0  # the patch conv's saved input
    recompute = tokens * per_block if n.activation_checkpointing else 0.0
    return tokens * (blocks * in_flight + head + inputs), max(loss_bytes(m, n, tokens, loss or loss_form(n, layout)),
                                                              recompute)


def memory_per_gpu(m: ModelFacts, n: Numerics, layout: Layout) -> Memory:
    """`n`: the rank's numerics; activations are those of one forward pass of the batch group's pooled samples
    (Layout.forward_batch), gradients stay unsynced while more than one pass accumulates into them."""
    split = layout.state_split
    weights = 4 * m.params / split
    grads = 4 * m.params / split
    opt = optimizer_bytes(m.params, m.param_tensors, n.optimizer) / split
    extra = 0.0
    fwd_n = n.forward(layout)
    kept, after = activation_phases(m, fwd_n, layout)
    sharded = layout.shard > 1 or layout.tensor > 1 or layout.pipeline > 1
    if not sharded:
        if layout.gpus > 1:
            extra += 4 * m.params  # DDP's gradient buckets
        if n.compute_bytes < 4:
            # Autocast's bf16 weight cache: without checkpointing the matmuls keep its copies for backward; with it,
            # autocast frees the cache as the forward leaves it (training.step computes the loss outside): the
            # forward's end holds it beside what forward kept, backward's phases do not.
            cache = 2 * m.params
            extra += max(0.0, cache - after) if n.activation_checkpointing else cache
        if n.accum(n.readers(layout)) > 1:
            extra += grads  # the gradients accumulate in .grad: a later micro-step's forward runs beside them
    else:
        if layout.shard > 1 and layout.pipeline > 1:
            # A pipeline's stages stay gathered from forward to backward (training.parallel.strategies.pp:
            # reshard_after_forward=False, 1F1B interleaves micro-batches), in the compute dtype.
            extra += n.compute_bytes * m.params / (layout.tensor * layout.pipeline)
        elif layout.shard > 1:
            # FSDP2 gathers one block at a time, in the compute dtype (MixedPrecisionPolicy's param_dtype); the
            # root (token table, head) stays gathered (training.parallel.strategies.fsdp: reshard_after_forward=False).
            extra += n.compute_bytes * m.block_params / layout.tensor
            root = m.params - m.layers * m.block_params
            if root > 0:
                extra += n.compute_bytes * root / layout.tensor
        if n.accum(n.readers(layout)) * layout.chunks() > 1:
            if n.keeps_unsharded_gradients(layout):
                # Unsynced micro-steps keep unsharded gradients; FSDP2 accumulates them in its reduce dtype, fp32
                # (training.precision.Precision.reduce; FSDPParam.to_accumulated_grad_if_needed).
                extra += 4 * m.params / (layout.tensor * layout.pipeline)
            else:
                # fsdp_accumulation sharded: each micro-batch reduce-scatters, the shards accumulate in .grad, beside
                # the later micro-steps' forward.
                extra += grads
    return Memory(weights, grads, opt, kept + after, extra)
