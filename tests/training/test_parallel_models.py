"""Stage cutting and the model factories the parallel tests train (`model=tests.training.test_parallel_models:...`)."""

from __future__ import annotations

import pytest
import torch

from contract.errors import ConfigError
from contract.models import GPTConfig, ViTConfig
from training.models.gpt import GPT
from training.models.vit import ViT
from training.pipeline import balance, part, split


def gpt4(cfg, data_meta: dict) -> GPT:
    """The tiny decoder with 4 blocks and 4 heads: 2 pipeline ranks x 2 interleaved stages, or 2 tensor ranks."""
    return GPT(GPTConfig(n_layer=4, n_head=4, d_model=32, seq_len=getattr(cfg, "seq_len", None) or 16,
                         vocab_size=int(data_meta.get("vocab_size", 64))))


def vit4(cfg, data_meta: dict) -> ViT:
    return ViT(ViTConfig(image_size=8, patch_size=4, channels=3, n_layer=4, n_head=2, d_model=16, num_classes=4))


def test_balance_minimizes_the_heaviest_stage():
    assert balance([1, 1, 1, 1], 2) == [range(0, 2), range(2, 4)]
    # A heavy embedding on the first stage pushes blocks to the later ones.
    assert balance([1, 1, 1, 1], 2, first=2) == [range(0, 1), range(1, 4)]
    weights = [5, 1, 1, 1, 1, 1]
    ranges = balance(weights, 3)
    assert ranges[0] == range(0, 1) and max(sum(weights[i] for i in r) for r in ranges) == 5
    with pytest.raises(ConfigError, match="fewer than the 4 pipeline stages"):
        balance([1, 1, 1], 4)


def test_stages_keep_the_original_names_and_compose_to_the_model():
    torch.manual_seed(0)
    model = gpt4(None, {})
    rank0, stages0 = split(model, 4, 0, 2)  # interleaved: stages 0 and 2 on pipeline rank 0
    rank1, stages1 = split(model, 4, 1, 2)
    assert sorted(stages0) == [0, 2] and sorted(stages1) == [1, 3]
    names = set(model.state_dict())
    assert set(rank0.state_dict()) | set(rank1.state_dict()) == names
    assert not set(rank0.state_dict()) & set(rank1.state_dict())
    assert "blocks.2.attn.qkv.weight" in rank0.state_dict() and "head.weight" in rank1.state_dict()
    x = torch.randint(0, 64, (2, 16))
    out = x
    for s in range(4):
        out = (stages0 | stages1)[s](out)
    assert torch.equal(out, model(x))  # same modules, same order: bit-identical


def test_vit_stages_compose_too():
    torch.manual_seed(0)
    model = vit4(None, {})
    first, last = part(model, range(0, 2), True, False), part(model, range(2, 4), False, True)
    images = torch.randn(2, 3, 8, 8)
    assert torch.equal(last(first(images)), model(images))
    assert first.head is None and last.cls is None and "cls" in first.state_dict()
