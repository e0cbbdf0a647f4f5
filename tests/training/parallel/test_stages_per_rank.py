"""Pipeline ranks that hold more than two model stages (pp_stages_per_rank, Megatron's virtual pipeline size): 2 ranks
x 4 interleaved stages of an 8-block decoder train what one process trains, resume exactly (on the same layout, and on
one process), and a stage count the schedule cannot run is refused naming the hyperparameter."""

from __future__ import annotations

import shutil

import pytest
import torch

from contract.errors import ConfigError
from tests.training.conformance import (
    BASE,
    FEATURES,
    SAVED_AT,
    STEPS,
    cell_config,
    logged,
    observed,
    run_cell,
    worker,
)
from tests.training.helpers import config, free_port, max_diff, start_ranks, weights
from training.config import from_environment
from training.parallel.pipeline_parallel import split
from training.parallel.process_group import teardown
from training.parallel.strategies.pp import pipeline_stages_per_rank

pytestmark = pytest.mark.slow

GPT8 = "tests.training.parallel.test_parallel_models:gpt8"
FEATURE = "accumulation_checkpointing"  # two micro-batches a rank, each recomputed: the most bookkeeping per stage
FOUR_A_RANK = {"strategy": "pp", "pp_degree": 2, "pp_schedule": "interleaved_1f1b", "pp_stages_per_rank": 4,
               "pp_microbatches": 2, "model": GPT8}


def test_a_rank_holds_every_pipeline_degreeth_stage():
    from tests.training.parallel.test_parallel_models import gpt8

    model = gpt8(None, {})
    rank0, stages0 = split(model, 8, 0, 2)
    rank1, stages1 = split(model, 8, 1, 2)
    assert sorted(stages0) == [0, 2, 4, 6] and sorted(stages1) == [1, 3, 5, 7]
    # One block a stage, under its own index; the rank's model holds the union of its stages' blocks.
    assert [sorted(int(k.split(".")[1]) for k in stages0[s].state_dict() if k.startswith("blocks.")) for s in (0, 6)
            ] == [[0] * len(list(model.blocks[0].state_dict())), [6] * len(list(model.blocks[6].state_dict()))]
    assert {k.split(".")[1] for k in rank0.state_dict() if k.startswith("blocks.")} == {"0", "2", "4", "6"}
    assert {k.split(".")[1] for k in rank1.state_dict() if k.startswith("blocks.")} == {"1", "3", "5", "7"}


@pytest.mark.parametrize("overrides, message", [
    ({"pp_stages_per_rank": 4}, "pp_stages_per_rank=4 needs the interleaved_1f1b schedule"),
    ({"pp_stages_per_rank": 4, "pp_schedule": "gpipe"}, "pp_stages_per_rank=4 needs the interleaved_1f1b schedule"),
    ({"pp_stages_per_rank": 1, "pp_schedule": "interleaved_1f1b"}, "pp_stages_per_rank=1 with the interleaved_1f1b"),
])
def test_a_stage_count_the_schedule_cannot_run_is_refused_naming_it(overrides, message):
    with pytest.raises(ConfigError, match=message):
        pipeline_stages_per_rank(from_environment(overrides, {}))


@pytest.mark.parametrize("overrides, stages", [
    ({}, 1), ({"pp_schedule": "interleaved_1f1b"}, 2), ({"pp_schedule": "interleaved_1f1b", "pp_stages_per_rank": 4}, 4),
    ({"pp_stages_per_rank": 1}, 1)])
def test_the_stages_a_rank_holds(overrides, stages):
    assert pipeline_stages_per_rank(from_environment(overrides, {})) == stages


def test_four_stages_a_rank_train_what_one_process_trains_and_resume_anywhere(tmp_path, corpus, capfd):
    values = {"micro_batch_size": 2, **BASE, **FEATURES[FEATURE], **FOUR_A_RANK}
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    runs = [(straight, vars(config(straight, corpus, **values)), None),
            (resumed, vars(config(resumed, corpus, **values)), straight / "checkpoints" / f"step-{SAVED_AT}")]
    start_ranks(worker, (2, free_port(), runs), 2)
    assert "[pp] 8 stages over 2 pipeline ranks (4 a rank, interleaved_1f1b, 2 micro-batches a step); this rank " \
           "holds stages [0, 2, 4, 6]" in capfd.readouterr().out
    # One process of the same model on the same global batch (2 ranks' micro-batches). Tolerances: the conformance
    # matrix's fp32 ones (tests/training/test_conformance.py TOLERANCES), reduction order only.
    reference = tmp_path / "one"
    try:
        run_cell(reference, cell_config(reference, corpus, None, FEATURE, 2, GPT8), None)
    finally:
        teardown()

    seen, one = observed(straight), observed(reference)
    for step in range(1, STEPS + 1):
        assert abs(logged(straight)[step]["train_loss"] - logged(reference)[step]["train_loss"]) <= 5e-6
        assert abs(seen[step]["norm"] / one[step]["norm"] - 1) <= 1e-6
        assert max((seen[step]["weights"][k] - one[step]["weights"][k]).abs().max().item()
                   for k in one[step]["weights"]) <= 1e-6
    assert max_diff(weights(straight), weights(reference)) <= 1e-6
    a, b = logged(straight), logged(resumed)
    assert [b[s]["train_loss"] for s in range(SAVED_AT + 1, STEPS + 1)] == \
        [a[s]["train_loss"] for s in range(SAVED_AT + 1, STEPS + 1)]
    ends, again = weights(straight), weights(resumed)
    assert all(torch.equal(ends[k], again[k]) for k in ends)
    # Resharding: the step-2 checkpoint of 8 stages on 2 ranks, finished by one process, ends where the layout did.
    finished = tmp_path / "finished"
    shutil.copytree(straight / "checkpoints" / f"step-{SAVED_AT}", finished / "checkpoints" / f"step-{SAVED_AT}")
    try:
        run_cell(finished, cell_config(finished, corpus, None, FEATURE, 2, GPT8), None)
    finally:
        teardown()
    assert sorted(logged(finished)) == list(range(SAVED_AT + 1, STEPS + 1))
    assert max_diff(weights(finished), ends) <= 1e-6
