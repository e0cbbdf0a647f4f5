"""bench.peak_memory runs end to end on the CPU (it has no peak to read there, and says so; the figures are measured
on a GPU and kept in jobs.planning.memory.CALIBRATION): this keeps its command working."""

from __future__ import annotations

import pytest
import torch

from bench import peak_memory
from bench.step_overhead import build
from contract.hyperparameters import TrainConfig


def test_the_bench_runs_each_row_and_prints_it_in_calibrations_form(capsys):
    peak_memory.main(["gpt:tiny:2", "gpt:tiny:2:ac", "vit:tiny:2", "--steps", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# CPU, torch ") and "peak allocated GiB" in out[0]
    assert [line.split(":")[0].strip() for line in out[1:]] == [
        "('gpt', 'tiny', 2, False)", "('gpt', 'tiny', 2, True)", "('vit', 'tiny', 2, False)"]
    assert all("no peak to read (run it on a GPU)" in line for line in out[1:])


def test_a_checkpointed_row_runs_the_checkpointed_model():
    """The `:ac` rows measure what the package runs with activation_checkpointing (training.job wraps the blocks)."""
    cfg = TrainConfig(model="gpt", model_size="tiny", activation_checkpointing=True)
    wrapped = [type(m).__name__ for m in build(cfg, torch.device("cpu")).modules()]
    plain = [type(m).__name__ for m in build(TrainConfig(model="gpt", model_size="tiny"), torch.device("cpu")).modules()]
    assert "CheckpointWrapper" in wrapped and "CheckpointWrapper" not in plain


@pytest.mark.parametrize(("row", "says"), [("gpt:1b", "write model:size:micro-batch"),
                                           ("gpt:1b:8:sac", "write model:size:micro-batch"),
                                           ("gpt:huge:8", "gpt:huge is not a preset")])
def test_a_malformed_row_is_refused_naming_the_form(row, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        peak_memory.main([row])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
