"""Stage cutting and the model factories the parallel tests train (`model=tests.training.parallel.test_parallel_models:...`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from contract.errors import ConfigError
from contract.models import GPTConfig, ViTConfig
from contract.pipeline_cut import balance
from training.metrics.flops import honest_flops_per_sample
from training.models.gpt import GPT, Block
from training.models.vit import ViT
from training.parallel.pipeline_parallel import part, split, stage_weights


def gpt4(cfg, data_meta: dict) -> GPT:
    """The tiny decoder with 4 blocks and 4 heads: 2 pipeline ranks x 2 interleaved stages, or 2 tensor ranks."""
    return GPT(GPTConfig(n_layer=4, n_head=4, d_model=32, seq_len=getattr(cfg, "seq_len", None) or 16,
                         vocab_size=int(data_meta.get("vocab_size", 64)), dropout=getattr(cfg, "dropout", 0.0)))


def gpt8(cfg, data_meta: dict) -> GPT:
    """gpt4 twice as deep: 2 pipeline ranks x 4 interleaved stages of one block each."""
    return GPT(GPTConfig(n_layer=8, n_head=4, d_model=32, seq_len=getattr(cfg, "seq_len", None) or 16,
                         vocab_size=int(data_meta.get("vocab_size", 64)), dropout=getattr(cfg, "dropout", 0.0)))


class BlockWithoutSequencePlan(Block):
    sp_plan = None  # tensor parallelism keeps the norms replicated (the path torch or the backend may force)


def gpt4_no_sp(cfg, data_meta: dict) -> GPT:
    """gpt4 whose blocks offer no sequence-parallel plan."""
    model = gpt4(cfg, data_meta)
    for block in model.blocks:
        block.__class__ = BlockWithoutSequencePlan
    return model


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


def test_stages_are_weighed_by_training_flops():
    # A GPT-2 small shape on the meta device: the token table (38.6M parameters) is a lookup and weighs nothing,
    # the output projection (the same size) is a matmul and weighs 6 FLOPs per parameter per token.
    c = GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=256, vocab_size=50304)
    with torch.device("meta"):
        model = GPT(c)
    blocks, first, last = stage_weights(model)
    block_params = sum(p.numel() for p in model.blocks[0].parameters())
    assert blocks == [6 * block_params + 12 * c.d_model * c.seq_len] * c.n_layer
    assert first == 0 and last == 6 * (c.vocab_size * c.d_model + 2 * c.d_model)  # head + final norm
    # The same convention as the MFU metric: the stages add up to the model.
    assert (sum(blocks) + first + last) * c.seq_len == pytest.approx(honest_flops_per_sample(model))
    # So the first stage takes more blocks than the last; by parameters the cut was 6/6 (bench.pipeline_balance).
    assert [len(r) for r in balance(blocks, 2, first, last)] == [9, 3]


class Shapeless(nn.Module):
    """Blocks and edges, but no `c` to say its layers, width and tokens."""

    pipeline_edges = (("inp",), ("out",))

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 40), nn.Linear(40, 4)
        self.blocks = nn.ModuleList(nn.Linear(40, 40) for _ in range(3))


def test_a_model_that_does_not_say_its_shape_is_weighed_by_parameters():
    model = Shapeless()
    assert stage_weights(model) == ([1640, 1640, 1640], 200, 164)


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


@pytest.mark.parametrize("overrides, world, per_host, message", [
    ({"strategy": "tp", "tp_degree": 3}, 4, 4, "tp_degree=3 x pp_degree=1 does not divide the world size 4"),
    ({"strategy": "tp", "tp_degree": 4}, 8, 2, "tp_degree=4 does not divide the 2 processes per host"),
    ({"strategy": "hsdp", "tp_degree": 2}, 4, 4, "strategy 'hsdp' shards data only"),
    ({"strategy": "hybrid", "pp_degree": 2}, 4, 4, "strategy 'hybrid' needs pp_degree >= 2 and tp_degree >= 2"),
    ({"strategy": "hsdp", "dp_shard": 3}, 4, 4, "dp_shard=3 does not divide the 4 data-parallel ranks"),
])
def test_bad_degrees_fail_before_any_process_group(overrides, world, per_host, message):
    from training.config import from_environment
    from training.parallel.mesh import checked_dims

    with pytest.raises(ConfigError, match=message):
        checked_dims(from_environment(overrides, {}), world, per_host)


def test_degrees_fill_the_world():
    from training.config import from_environment
    from training.parallel.mesh import checked_dims

    assert checked_dims(from_environment({"strategy": "hsdp"}, {}), 16, 8).shape == (1, 2, 8, 1)
    assert checked_dims(from_environment({"strategy": "hybrid", "pp_degree": 2, "tp_degree": 2}, {}), 8, 4
                           ).shape == (2, 1, 2, 2)


def test_pipeline_micro_batches_are_checked():
    from contract.parallel import ParallelDims
    from training.config import from_environment
    from training.parallel.strategies.pp import pipeline_microbatches

    with pytest.raises(ConfigError, match="pp_microbatches=1 is fewer than the 2 pipeline stages"):
        pipeline_microbatches(from_environment({"pp_microbatches": 1}, {}), ParallelDims(pp=2))
    with pytest.raises(ConfigError, match="pp_microbatches=3 does not divide the 4 samples"):
        pipeline_microbatches(from_environment({"pp_microbatches": 3, "micro_batch_size": 2}, {}), ParallelDims(pp=2))
    assert pipeline_microbatches(from_environment({"micro_batch_size": 2}, {}), ParallelDims(pp=2)) == 4


@pytest.mark.parametrize("model, size", [("gpt", "125m"), ("gpt", "350m"), ("gpt", "1b"), ("vit", "base")])
@pytest.mark.parametrize("stages", [2, 4])
def test_the_planner_expects_the_stages_the_package_cuts(model, size, stages):
    # The planner weighs stages from the model's shape (jobs.planning.shape); the package from its modules.
    from contract.hyperparameters import TrainConfig
    from contract.pipeline_cut import bottleneck_ratio
    from jobs.planning.shape import model_facts
    from training.models import build_model

    built = build_model(TrainConfig(model=model, model_size=size, data="synthetic"), {})  # meta device
    blocks, first, last = stage_weights(built)
    package = bottleneck_ratio(blocks, stages, first, last)
    planner = model_facts(model, size).pipeline_bottleneck(stages)
    assert planner == pytest.approx(package, rel=0.01)
    assert planner >= 1.0
