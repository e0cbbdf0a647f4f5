"""What the planner knows about a model: parameters, shape, FLOPs and bytes per sample.

Presets (contract.models) give exact counts, the same arithmetic as the modules training.models builds
(tests/jobs/test_planner_memory.py checks them against PyTorch's own count). A request's `model_shape` gives
the same facts for a model without a preset; a shape that contradicts itself is a PlanInputError naming
the field, the value and the fix.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from contract.models import PRESETS, GPTConfig, ViTConfig
from contract.pipeline_cut import bottleneck_ratio

# A shape's params may differ from the GPT formula's count by this much before it is a contradiction:
# real decoders differ from GPT-2's block (gated MLPs of 3 matrices, grouped-query attention), e.g. Llama 2 70B
# is 69.0B against the formula's 64.9B (6% off).
PARAMS_TOLERANCE = 0.25
# `other` models without a shape: activation bytes per forward FLOP at 16-bit, from NVIDIA's ResNet-50 v1.5
# recipe (DeepLearningExamples, PyTorch/Classification/ConvNets: batch 112 per 16 GB V100 in fp32, so ~130 MB
# per 224px image of 4.1 G multiply-adds = 8.2 GFLOPs forward: 0.016 B/FLOP in fp32, half at 16-bit).
OTHER_ACTIVATION_BYTES_PER_FWD_FLOP = 0.008


class PlanInputError(ValueError):
    """A planner input that cannot be used: `field`, the value, and how to fix it."""

    def __init__(self, field: str, value: Any, fix: str) -> None:
        super().__init__(f"{field}={value!r}: {fix}")
        self.field, self.value, self.fix = field, value, fix


@dataclass(frozen=True)
class ModelFacts:
    kind: str  # decoder, vit, other
    params: int
    param_tensors: int  # optimizers keep one `step` scalar per tensor
    flops_per_sample: float  # training (forward + backward), training.metrics.flops' convention (the MFU metric's)
    tokens: int = 1  # per sample: sequence length, or patches + class token
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    vocab: int = 0  # decoder output width (the logits' memory)
    image_bytes: int = 0  # vit: the input image, per sample, at 1 byte per pixel and channel
    other_activation_bytes: float = 0.0  # `other`: a rough rule, per sample at 16-bit
    sample_bytes: int | None = None  # read from storage per sample (None: unknown)
    label: str = ""

    @property
    def attention_flops_per_sample(self) -> float:
        """The part of flops_per_sample attention's score and value products make (12 x width x sequence per token
        per layer): it runs in the attention kernel, not in the matmuls."""
        return 12.0 * self.layers * self.hidden * self.tokens * self.tokens if self.kind != "other" else 0.0

    @property
    def block_params(self) -> int:
        """One repeated block's matrices (the unit FSDP gathers at a time)."""
        return 12 * self.hidden * self.hidden if self.hidden else self.params // max(self.layers, 1)

    def pipeline_bottleneck(self, stages: int) -> float:
        """The slowest of `stages` pipeline stages over an even share of the work, for the cut the training
        package makes (contract.pipeline_cut): blocks weighed by training FLOPs per token as training.metrics.flops
        weighs them (6 per block parameter, plus attention), a decoder's output projection on the last stage,
        its token table weighing nothing, a ViT's patch convolution on the first. 1.0 for a model whose blocks are not known, or for one stage. An
        interleaved schedule's stages on one rank are taken as one (the rank's share of the work)."""
        if stages <= 1 or not (self.layers and self.hidden) or self.layers < stages:
            return 1.0
        block = 6 * self.block_params + 12 * self.hidden * self.tokens
        head = 6 * self.hidden * self.vocab if self.kind == "decoder" else 0
        # A ViT's patch convolution: channels x patch^2 = the image's bytes over its patches, x width weights,
        # 4 FLOPs each per token (no pixel gradient).
        patch = 4 * self.hidden * self.image_bytes / (self.tokens - 1) if self.kind == "vit" else 0
        return _even_blocks_bottleneck(block, self.layers, stages, patch, head)


@functools.lru_cache(maxsize=4096)
def _even_blocks_bottleneck(block: float, layers: int, stages: int, first: float, last: float) -> float:
    """bottleneck_ratio of `layers` equal blocks, cached: the cut is a dynamic program over the layers, and a plan
    asks it for the same model and stage count once per pipeline candidate of every shape it compares."""
    return bottleneck_ratio([block] * layers, stages, first, last)


def gpt_params(c: GPTConfig) -> tuple[int, int]:
    """(parameters, tensors) of training.models.gpt.GPT: embeddings, blocks without biases, separate head."""
    h = c.d_model
    per_block = 2 * h + 3 * h * h + h * h + 2 * h + 4 * h * h + 4 * h * h
    params = c.vocab_size * h + c.seq_len * h + c.n_layer * per_block + 2 * h + h * c.vocab_size
    return params, 5 + 8 * c.n_layer


def vit_params(c: ViTConfig) -> tuple[int, int]:
    """(parameters, tensors) of training.models.vit.ViT: patch conv, class token, positions, blocks with biases."""
    h = c.d_model
    per_block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
    params = (c.channels * c.patch_size ** 2 * h + h) + h + (c.num_patches + 1) * h + c.n_layer * per_block \
        + 2 * h + (h * c.num_classes + c.num_classes)
    return params, 8 + 12 * c.n_layer


def gpt_facts(c: GPTConfig, label: str) -> ModelFacts:
    params, tensors = gpt_params(c)
    # training.metrics.flops' convention, the one the MFU metric divides: 6 per matmul parameter per token (the token and
    # position tables do no matmul), plus attention's 12 x width x sequence per layer.
    tables = (c.vocab_size + c.seq_len) * c.d_model
    flops = (6 * (params - tables) + 12 * c.n_layer * c.d_model * c.seq_len) * c.seq_len
    return ModelFacts("decoder", params, tensors, flops, tokens=c.seq_len, layers=c.n_layer, hidden=c.d_model,
                      heads=c.n_head, vocab=c.vocab_size, sample_bytes=2 * (c.seq_len + 1), label=label)


def vit_facts(c: ViTConfig, label: str) -> ModelFacts:
    params, tensors = vit_params(c)
    t, h = c.num_patches + 1, c.d_model
    # training.metrics.flops' convention (the MFU metric's): the patch convolution 4 per parameter per token (no pixel
    # gradient), the class token and position table nothing, the classifier 6 per parameter per image.
    patch = c.channels * c.patch_size ** 2 * h + h
    tables = h + t * h
    head = h * c.num_classes + c.num_classes
    per_token = 6 * (params - patch - tables - head) + 4 * patch
    flops = per_token * t + 6 * head + 12 * c.n_layer * h * t * t
    pixels = c.channels * c.image_size ** 2
    return ModelFacts("vit", params, tensors, flops, tokens=t, layers=c.n_layer, hidden=c.d_model, heads=c.n_head,
                      image_bytes=pixels, sample_bytes=pixels, label=label)


def model_facts(model: str, model_size: str, shape: Any = None, seq_len: int | None = None) -> ModelFacts | None:
    """The facts of a request's model: its `model_shape` when given, else its preset; None when neither."""
    if shape is not None:
        return shape_facts(shape, seq_len)
    preset = PRESETS.get(model, {}).get(model_size)
    if isinstance(preset, GPTConfig):
        return gpt_facts(preset if seq_len is None else GPTConfig(**{**preset.__dict__, "seq_len": seq_len}),
                         f"{model}:{model_size}")
    if isinstance(preset, ViTConfig):
        return vit_facts(preset, f"{model}:{model_size}")
    return None


def _need(shape: Any, *names: str) -> None:
    for name in names:
        if getattr(shape, name) is None:
            raise PlanInputError(f"model_shape.{name}", None, f"a {shape.kind} shape needs {', '.join(names)}; "
                                 "give them, or give params and flops_per_sample with kind `other`")


def shape_facts(shape: Any, seq_len: int | None = None) -> ModelFacts:
    kind = str(shape.kind)
    if kind == "other":
        if shape.params is None or shape.flops_per_sample is None:
            missing = "params" if shape.params is None else "flops_per_sample"
            raise PlanInputError(f"model_shape.{missing}", None,
                                 "an `other` model needs params and flops_per_sample (training FLOPs per sample)")
        fwd = shape.flops_per_sample / 3  # backward is about twice the forward
        return ModelFacts("other", shape.params, max(shape.layers or 1, 1) * 4, shape.flops_per_sample,
                          layers=shape.layers or 0, hidden=shape.hidden or 0, heads=shape.heads or 0,
                          other_activation_bytes=OTHER_ACTIVATION_BYTES_PER_FWD_FLOP * fwd, label="other")
    _need(shape, "layers", "hidden", "heads")
    if shape.hidden % shape.heads:
        raise PlanInputError("model_shape.heads", shape.heads,
                             f"must divide model_shape.hidden={shape.hidden}: attention splits the width over heads")
    if kind == "decoder":
        c = GPTConfig(n_layer=shape.layers, n_head=shape.heads, d_model=shape.hidden,
                      seq_len=seq_len or shape.seq_len or 2048, vocab_size=shape.vocab_size or 50304)
        facts = gpt_facts(c, "decoder")
    else:
        _need(shape, "image_size", "patch_size")
        if shape.image_size % shape.patch_size:
            raise PlanInputError("model_shape.patch_size", shape.patch_size,
                                 f"must divide model_shape.image_size={shape.image_size}")
        c = ViTConfig(image_size=shape.image_size, patch_size=shape.patch_size, channels=3, n_layer=shape.layers,
                      n_head=shape.heads, d_model=shape.hidden, num_classes=1000)
        facts = vit_facts(c, "vit")
    return _with_given(facts, shape)


def _with_given(facts: ModelFacts, shape: Any) -> ModelFacts:
    """A shape's own params/flops win over the formula's, unless they contradict the layers and width."""
    params, flops = facts.params, facts.flops_per_sample
    if shape.params is not None:
        if abs(shape.params - facts.params) > PARAMS_TOLERANCE * facts.params:
            raise PlanInputError(
                "model_shape.params", shape.params,
                f"contradicts layers={shape.layers} x hidden={shape.hidden}, which make ~{facts.params / 1e9:.3g}B "
                "parameters: fix one of them, or leave params null")
        flops = flops * shape.params / facts.params
        params = shape.params
    if shape.flops_per_sample is not None:
        flops = shape.flops_per_sample
    return ModelFacts(**{**facts.__dict__, "params": params, "flops_per_sample": flops})
