"""bench.step_overhead runs end to end on the CPU for both reference models (figures are never asserted: the
bench's numbers belong in README, measured side by side; this keeps its command working)."""

from __future__ import annotations

import pytest

from bench import step_overhead


@pytest.mark.parametrize("model, unit", [("gpt", "tokens/s"), ("vit", "images/s")])
def test_the_bench_times_both_loops_and_reports_throughput(model, unit, capsys):
    step_overhead.main(["--model", model, "--size", "tiny", "--batch", "4", "--steps", "2", "--warmup", "1"])
    out = capsys.readouterr().out
    assert f"model: {model}/tiny" in out and unit in out
    assert "training package" in out and "hand-written loop" in out and "package overhead:" in out


def test_a_size_of_the_other_model_is_refused_naming_the_presets(capsys):
    with pytest.raises(SystemExit) as exit_:
        step_overhead.main(["--model", "vit", "--size", "1b"])
    assert exit_.value.code == 2
    assert "'1b' is not a vit preset: use one of tiny, base, large, huge" in capsys.readouterr().err
