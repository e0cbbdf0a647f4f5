"""Profiler traces on demand (training.metrics.profiling): profile_from / profile_steps / profile_ranks run the
named steps under torch.profiler and write a Chrome trace the trace readers open; on CPU here (the CUDA activity and
the memory snapshot need a GPU: not run here)."""

from __future__ import annotations

import json

import pytest

from contract.container import ENV_TENSORBOARD_DIR
from contract.errors import ConfigError
from tests.training.helpers import config
from tests.training.test_training_loop import run
from training.config import from_environment


def test_a_profile_of_two_steps_is_a_trace_of_those_steps(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setenv(ENV_TENSORBOARD_DIR, str(tmp_path / "tensorboard"))
    run(config(tmp_path, corpus, max_steps=5, profile_from=3, profile_steps=2))
    trace = tmp_path / "tensorboard" / "trace-rank0-steps3-4.json"
    assert f"[profile] steps 3-4 of rank 0: {trace}" in capsys.readouterr().out
    events = json.loads(trace.read_text())["traceEvents"]  # the Chrome trace format chrome://tracing and Perfetto read
    steps = sorted({e["name"] for e in events if e.get("name", "").startswith("train step ")})
    assert steps == ["train step 3", "train step 4"]  # the two profiled steps, nothing before or after
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert {"aten::mm", "aten::addmm"} & ops and any("Input Dims" in e.get("args", {}) for e in events)  # shapes
    assert any(e.get("name") == "[memory]" for e in events)  # memory events


def test_no_profile_by_default_and_on_other_ranks_only_when_named(tmp_path, corpus):
    from training.metrics.profiling import StepProfiler, profiles_rank

    run(config(tmp_path, corpus, max_steps=2))
    assert not list(tmp_path.rglob("trace-*.json"))
    assert profiles_rank("0", 0) and not profiles_rank("0", 1) and profiles_rank("all", 7) and profiles_rank("0,8", 8)
    import torch

    assert StepProfiler.for_run(config(tmp_path, corpus, profile_from=1, profile_ranks="1"), 0, torch.device("cpu")) \
        is None


@pytest.mark.parametrize("ranks", ["0;rm", "first", "0,", ""])
def test_profile_ranks_takes_all_or_rank_numbers(ranks):
    with pytest.raises(ConfigError, match="profile_ranks"):
        from_environment({"profile_ranks": ranks}, {})
