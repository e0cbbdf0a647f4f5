"""The batch arithmetic the training package and the launcher share (contract.hyperparameters.batch_layout)."""

from __future__ import annotations

import pytest

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig, batch_layout, nearest_global_batches


def test_one_step_is_micro_x_world_x_accumulation():
    assert batch_layout(16, 8, 256) == (256, 2)
    assert batch_layout(16, 8, 128) == (128, 1)
    assert batch_layout(16, 8) == (128, 1)  # no global batch: grad_accum (default 1) sets it
    assert batch_layout(4, 3, None, 5) == (60, 5)
    assert batch_layout(16, 8, 256, 2) == (256, 2)  # grad_accum may repeat what global_batch_size sets


@pytest.mark.parametrize(("world", "micro", "total", "accum", "says"), [
    (16, 8, 200, None, "global_batch_size=200 is not a multiple of micro_batch_size x world size = 8 x 16"),
    (16, 8, 64, None, "global_batch_size=64 is not a multiple"),  # smaller than one micro-batch per rank
    (16, 8, 256, 4, "grad_accum=4 disagrees with global_batch_size=256 / (micro_batch_size=8 x world size 16) = 2"),
])
def test_what_cannot_hold_together_is_one_clear_problem(world, micro, total, accum, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        batch_layout(world, micro, total, accum)


def test_train_config_uses_the_shared_arithmetic():
    for world, micro, total, accum in [(2, 4, 32, None), (2, 4, None, 3), (3, 2, 12, 2), (8, 1, 24, None)]:
        cfg = TrainConfig(micro_batch_size=micro, global_batch_size=total, grad_accum=accum)
        assert cfg.batch_layout(world) == batch_layout(world, micro, total, accum)
    for world, micro, total, accum in [(2, 4, 30, None), (3, 2, 12, 1), (8, 1, 4, None)]:
        cfg = TrainConfig(micro_batch_size=micro, global_batch_size=total, grad_accum=accum)
        with pytest.raises(ConfigError) as from_config:
            cfg.batch_layout(world)
        with pytest.raises(ConfigError) as shared:
            batch_layout(world, micro, total, accum)
        assert str(from_config.value) == str(shared.value)


def test_nearest_global_batches():
    assert nearest_global_batches(200, 128) == (128, 256)
    assert nearest_global_batches(64, 128) == (128,)  # nothing below one step
    assert nearest_global_batches(256, 128) == (256,)
    assert nearest_global_batches(100, 1) == (100,)


def test_a_resume_on_another_world_size_keeps_the_runs_global_batch_by_accumulation():
    from contract.hyperparameters import resumed_batch_layout

    # Began on 4 ranks x micro 2 (a batch of 8); resumed on 2 ranks: accumulation 2 keeps it, and says so.
    batch, accum, line = resumed_batch_layout(2, 2, None, None, recorded=8)
    assert (batch, accum) == (8, 2) and "grad_accum 1 -> 2" in line
    # The same world, a fresh run, or an explicit global_batch_size: nothing to keep, nothing said.
    assert resumed_batch_layout(4, 2, None, None, recorded=8) == (8, 1, None)
    assert resumed_batch_layout(2, 2, None, None, recorded=None) == (4, 1, None)
    assert resumed_batch_layout(2, 2, 12, None, recorded=8) == (12, 3, None)
    # An explicit grad_accum is what accumulation absorbs the change with.
    assert resumed_batch_layout(2, 2, None, 1, recorded=8)[:2] == (8, 2)


def test_a_resume_that_cannot_keep_the_global_batch_is_refused_naming_the_fix():
    from contract.hyperparameters import resumed_batch_layout

    with pytest.raises(ConfigError) as refused:
        resumed_batch_layout(3, 2, None, None, recorded=8)  # 8 / (2 x 3) is not whole
    message = str(refused.value)
    assert "written with a global batch of 8 samples; on 3 ranks with micro_batch_size=2" in message
    assert "use another process count" in message and "set global_batch_size" in message
    with pytest.raises(ConfigError, match="use micro_batch_size=3 "):  # the largest that keeps it: 12 / (3 x 2)
        resumed_batch_layout(2, 4, None, None, recorded=12)
