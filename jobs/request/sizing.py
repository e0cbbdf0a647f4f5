"""The planner's inputs beyond the request: the model's shape (for models without a preset) and the run's size.

Both are optional sections of a job request. A preset (`model` gpt/vit with `model_size`) fills the shape in
itself; `sizing` says how much data, by when, for how much, on how many GPUs at most.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from contract.data_formats import FORMATS
from contract.schema import meta


class ModelKind(enum.StrEnum):
    DECODER = "decoder"
    VIT = "vit"
    OTHER = "other"


@dataclass(frozen=True)
class ModelShape:
    kind: ModelKind = field(metadata=meta("decoder, vit, or other (then give params and flops_per_sample)"))
    params: int | None = field(default=None, metadata=meta("parameters (null: from the shape)", min=1))
    layers: int | None = field(default=None, metadata=meta("repeated blocks", min=1))
    hidden: int | None = field(default=None, metadata=meta("width of a block", min=1))
    heads: int | None = field(default=None, metadata=meta("attention heads", min=1))
    seq_len: int | None = field(default=None, metadata=meta("decoder: tokens per sample", min=1))
    vocab_size: int | None = field(default=None, metadata=meta("decoder: vocabulary", min=1))
    image_size: int | None = field(default=None, metadata=meta("vit: pixels on a side", min=1))
    patch_size: int | None = field(default=None, metadata=meta("vit: pixels on a patch side", min=1))
    flops_per_sample: float | None = field(default=None, metadata=meta(
        "training FLOPs per sample, forward and backward (null: from the shape)", min=1))


@dataclass(frozen=True)
class Sizing:
    dataset_samples: int | None = field(default=None, metadata=meta("samples in one epoch", min=1))
    dataset_tokens: int | None = field(default=None, metadata=meta("decoder: tokens in one epoch", min=1))
    epochs: float = field(default=1.0, metadata=meta("passes over the data", min=0.001, max=10000))
    deadline_hours: float | None = field(default=None, metadata=meta("wall-clock hours the run must end in", min=0.01))
    budget_usd: float | None = field(default=None, metadata=meta("most the run may cost, USD", min=0.01))
    max_gpus: int | None = field(default=None, metadata=meta("most GPUs to consider (1: one GPU)", min=1))
    allow_spot: bool = field(default=True, metadata=meta("consider Spot capacity when the deadline allows"))
    data_format: str | None = field(default=None, metadata=meta(
        "the dataset's format, for the input check (loader rate against the GPUs' consumption): tokens, images "
        "(.npy arrays) or webdataset (encoded images in tar shards); null: the dataset's meta.json says (`trainctl "
        "plan` reads an S3 prefix's when it reads the deployed platform), a decoder reads tokens, else "
        "the check is not made", choices=FORMATS))
