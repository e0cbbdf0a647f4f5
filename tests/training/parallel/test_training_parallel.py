"""FSDP on 2 gloo ranks with AdamW: exact resume mid-epoch, async checkpoints, a 2-rank checkpoint on 1 rank, the
large-model initialization path. Every layout against one process: test_conformance."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.training.helpers import ADAMW, config, max_diff, weights
from training.checkpoint.markers import read_checkpoint, why_invalid
from training.loop import train
from training.parallel.process_group import setup, teardown
from training.resilience.stop import StopFlag

pytestmark = pytest.mark.slow

# Adam divides by sqrt(v): rounding noise grows to ~1e-4 (REFERENCE.md).
ADAM_TOL = 1e-4


def test_resume_mid_epoch_is_bit_identical(two_rank_runs):
    strategy = "fsdp"  # with AdamW; every layout's resume with SGD: test_conformance
    straight = weights(two_rank_runs / f"{strategy}_straight")
    resumed = weights(two_rank_runs / f"{strategy}_resumed")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    checkpoints = two_rank_runs / f"{strategy}_resumed" / "checkpoints"
    # The stop at step 3 wrote its checkpoint mid-epoch; the resumed run crossed into epoch 1 and finished.
    state = read_checkpoint(checkpoints / "step-3")
    assert (state["data"]["epoch"], state["data"]["batch"]) == (0, 3)
    final = read_checkpoint(checkpoints / "step-8")
    assert final["data"]["epoch"] == 1 and final["loop"]["status"] == "completed"


def test_fsdp_checkpoint_from_two_ranks_resumes_on_one(two_rank_runs, corpus, tmp_path, monkeypatch, capsys):
    shutil.copytree(two_rank_runs / "fsdp_resumed" / "checkpoints" / "step-3", tmp_path / "checkpoints" / "step-3")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    cfg = config(tmp_path, corpus, strategy="fsdp", micro_batch_size=4, **ADAMW)
    try:
        result = train(cfg, setup(cfg), StopFlag())
    finally:
        teardown()
    assert "resumed from" in capsys.readouterr().out and "step-3" in str(tmp_path / "checkpoints" / "step-3")
    assert result.step == 8
    assert max_diff(weights(tmp_path), weights(two_rank_runs / "fsdp_straight")) < ADAM_TOL


def test_async_checkpoints_are_complete_and_resume_exactly(two_rank_runs):
    checkpoints = two_rank_runs / "fsdp_async" / "checkpoints"
    # Every 2 steps, the stop at 5, the end at 8; all marked complete once their background write finished.
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-2", "step-4", "step-5", "step-6", "step-8"]
    assert all(why_invalid(p) is None for p in checkpoints.iterdir())
    straight, resumed = weights(two_rank_runs / "fsdp_straight"), weights(two_rank_runs / "fsdp_async")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_large_model_path_initializes_after_sharding(two_rank_runs):
    # The path models above META_INIT_MIN_PARAMS take: built on the meta device, sharded, then each shard
    # allocated and initialized. The export (lr 0) must be a real initialization, not to_empty's garbage.
    init = weights(two_rank_runs / "fsdp_meta_init")
    assert init["tok.weight"].std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.equal(init["ln_f.weight"], torch.ones_like(init["ln_f.weight"]))
    assert torch.equal(init["blocks.0.ln1.bias"], torch.zeros_like(init["blocks.0.ln1.bias"]))
    assert all(torch.isfinite(t).all() for t in init.values())
