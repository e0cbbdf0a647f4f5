"""The MFU numerator (training.metrics.flops.honest_flops_per_sample) against what PyTorch itself counts.

torch.utils.flop_counter.FlopCounterMode counts the matmuls and convolutions of a forward and backward pass.
Attention runs on SDPA's math backend here so that its two matmuls show up as `bmm` (the fused CPU kernel is
not counted by every torch the package supports). The honest figure charges 6 FLOPs per parameter per token
also for norms and biases, which the counter does not count (they are not matmuls): about 1/width of the
total. Measured honest/counted - 1 (torch 2.13, CPU): decoders below +0.26% and +0.44%, ViTs +0.42% and
+0.47%; 1% tolerance. Before the class token and position table were left out, the classifier counted once
per image and the patch convolution 4 per parameter (no pixel gradient), a ViT-B/16 shape was +1.4%.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from contract.models import GPTConfig, ViTConfig
from training.metrics.flops import honest_flops_per_sample
from training.models.gpt import GPT
from training.models.vit import ViT

TOLERANCE = 0.01


def counted_flops(model: torch.nn.Module, batch: torch.Tensor) -> float:
    """FLOPs PyTorch counts for one training pass, per sample."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).float().sum().backward()
    return counter.get_total_flops() / batch.shape[0]


@pytest.mark.parametrize("c", [GPTConfig(n_layer=2, n_head=4, d_model=128, seq_len=64, vocab_size=512),
                               GPTConfig(n_layer=1, n_head=2, d_model=64, seq_len=256, vocab_size=97)])
def test_a_decoder_is_charged_what_pytorch_counts(c):
    model = GPT(c)
    honest = honest_flops_per_sample(model)
    counted = counted_flops(model, torch.randint(0, c.vocab_size, (2, c.seq_len)))
    assert honest == pytest.approx(counted, rel=TOLERANCE)
    # The model's own figure charges the token table's lookups as if they were matmuls.
    assert model.flops_per_sample() > honest * (1 + TOLERANCE)


@pytest.mark.parametrize("c", [ViTConfig(image_size=224, patch_size=16, channels=3, n_layer=2, n_head=4, d_model=256,
                                         num_classes=100),
                               ViTConfig(image_size=64, patch_size=8, channels=3, n_layer=2, n_head=4, d_model=256,
                                         num_classes=1000)])
def test_a_vit_is_charged_what_pytorch_counts(c):
    model = ViT(c)
    honest = honest_flops_per_sample(model)
    counted = counted_flops(model, torch.randn(2, c.channels, c.image_size, c.image_size))
    assert honest == pytest.approx(counted, rel=TOLERANCE)
    assert model.flops_per_sample() > honest * (1 + TOLERANCE)


def test_a_model_that_does_not_say_its_shape_gets_none():
    assert honest_flops_per_sample(torch.nn.Linear(4, 4)) is None
