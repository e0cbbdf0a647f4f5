"""Training FLOPs of the reference models, one convention for the MFU metric, the bench and pipeline stages.

Per token: 6 x the parameters that do matrix work + 12 x width x sequence length per layer for attention's two
matmuls (torchtitan's count). Embedding and position tables do no matmul and count nothing (`nn.Embedding`
weights, and what a model lists in `table_params`: a ViT's class token and position table). The output
projection counts. Modules a model lists in `per_sample_modules` see one token per sample (a ViT's classifier
reads the class token alone): 6 per parameter per sample, not per token. Modules in `input_modules` read the
data itself (a ViT's patch convolution): no gradient flows to the pixels, so 4 per parameter per token.
Checked against torch.utils.flop_counter (tests/training/metrics/test_honest_flops.py).
"""

from __future__ import annotations

from torch import nn


def _shape(model: nn.Module) -> tuple[int, int, int] | None:
    """(layers, width, tokens per sample) of a model that says them, else None."""
    c = getattr(model, "c", None)
    layers, width = getattr(c, "n_layer", None), getattr(c, "d_model", None)
    tokens = getattr(model, "sequence_length", None)
    return (layers, width, tokens) if layers and width and tokens else None


def parameters_of(parts) -> list[nn.Parameter]:
    """The parameters of some parts of a model: modules, parameters, or None (a part a stage does not hold)."""
    return [p for x in parts if x is not None for p in ([x] if isinstance(x, nn.Parameter) else x.parameters())]


def _listed(model: nn.Module, attribute: str) -> set[int]:
    """ids of the parameters of the parts a model names in `attribute`."""
    return {id(p) for p in parameters_of(getattr(model, name, None) for name in getattr(model, attribute, ()))}


def _per_token_factors(model: nn.Module, tokens: int) -> dict[int, float]:
    """FLOPs per token per element of each parameter (by id), the convention above."""
    tables = _listed(model, "table_params") | {id(p) for m in model.modules() if isinstance(m, nn.Embedding)
                                               for p in m.parameters()}
    once, inputs = _listed(model, "per_sample_modules"), _listed(model, "input_modules")
    return {id(p): 0.0 if id(p) in tables else 6.0 / tokens if id(p) in once else 4.0 if id(p) in inputs else 6.0
            for p in model.parameters()}


def honest_flops_per_sample(model: nn.Module) -> float | None:
    """Training FLOPs of one sample, for a model that says its layers and width (`model.c.n_layer`,
    `model.c.d_model`) and its tokens per sample (`model.sequence_length`); else None (then the model's own
    `flops_per_sample` is used). DDP's wrapper is looked through; FSDP2 and compile keep the class."""
    inner = getattr(model, "module", model)
    shape = _shape(inner)
    if shape is None:
        return None
    layers, width, tokens = shape
    factors = _per_token_factors(inner, tokens)
    per_token = sum(factors[id(p)] * p.numel() for p in inner.parameters())
    return (per_token + 12 * layers * width * tokens) * tokens


def part_flops_per_token(model: nn.Module, parts: list[nn.Module | nn.Parameter | None],
                         blocks: int = 0) -> float | None:
    """Training FLOPs per token of some parts of `model` (modules or parameters; None skipped) holding `blocks`
    of its blocks, whose attention counts too: the weight of a pipeline stage. None for a model without the
    shape (then stages are weighed by parameters)."""
    shape = _shape(model)
    if shape is None:
        return None
    _, width, tokens = shape
    factors = _per_token_factors(model, tokens)
    params = {id(p): p for p in parameters_of(parts)}
    return sum(factors[i] * p.numel() for i, p in params.items()) + 12 * width * tokens * blocks
