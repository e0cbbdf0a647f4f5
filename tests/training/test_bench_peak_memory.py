"""bench.peak_memory runs end to end on the CPU (the peak read from the profiler's running total; the calibration
figures are measured on a GPU and kept in jobs.planning.memory.CALIBRATION): this keeps its command working."""

from __future__ import annotations

import pytest
import torch

from bench import peak_memory
from bench.step_overhead import build
from contract.hyperparameters import TrainConfig


def test_the_bench_runs_each_row_and_prints_it_in_calibrations_form(capsys):
    peak_memory.main(["gpt:small:4", "gpt:small:4:ac", "gpt:small:4:sac", "vit:tiny:2", "--steps", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# CPU, torch ") and "peak allocated GiB" in out[0]
    rows = [line.split(":") for line in out[1:]]
    assert [key.strip() for key, _ in rows] == [
        "('gpt', 'small', 4, None)", "('gpt', 'small', 4, 'full')", "('gpt', 'small', 4, 'selective')",
        "('vit', 'tiny', 2, None)"]
    none, full, selective, _ = (float(value.strip(" ,")) for _, value in rows)
    assert full < selective < none  # what each policy keeps, in the order it keeps it


def test_a_checkpointed_row_runs_the_checkpointed_model():
    """The `:ac` rows measure what the package runs with activation_checkpointing (training.job wraps the blocks)."""
    cfg = TrainConfig(model="gpt", model_size="tiny", activation_checkpointing=True)
    wrapped = [type(m).__name__ for m in build(cfg, torch.device("cpu")).modules()]
    plain = [type(m).__name__ for m in build(TrainConfig(model="gpt", model_size="tiny"), torch.device("cpu")).modules()]
    assert "CheckpointWrapper" in wrapped and "CheckpointWrapper" not in plain


@pytest.mark.parametrize(("row", "says"), [("gpt:1b", "write model:size:micro-batch"),
                                           ("gpt:1b:8:xac", "write model:size:micro-batch"),
                                           ("gpt:huge:8", "gpt:huge is not a preset")])
def test_a_malformed_row_is_refused_naming_the_form(row, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        peak_memory.main([row])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
