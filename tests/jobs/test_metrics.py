"""Metric definitions: the contract's regexes, and the training package's own log lines parse with them."""

from __future__ import annotations

import math
import re

from contract.metrics import METRIC_NAMES, metric_definitions, parse_metric_line


def test_names_and_regexes_are_the_contracts():
    assert METRIC_NAMES == ("step", "epoch", "train_loss", "val_loss", "lr", "grad_norm", "tokens_per_sec",
                            "samples_per_sec", "step_time_ms", "mfu", "loss_scale", "data_wait_ms", "data_wait_share",
                            "checkpoint_age_s",
                            "checkpoint_overdue", "startup_s", "train_s", "checkpoint_s", "checkpoint_saves",
                            "eval_s", "straggler_rank", "slowest_rank_ratio")
    defs = metric_definitions()
    assert [d["Name"] for d in defs] == list(METRIC_NAMES)
    for d in defs:
        assert d["Regex"] == r"\[metrics\].*?\b" + d["Name"] + r"=([-+0-9.eE]+|nan|inf)"
        assert len(d["Regex"]) <= 500 and re.compile(d["Regex"]).groups == 1


def test_a_metric_line_parses():
    line = "[metrics] step=120 train_loss=2.3141 lr=0.0003 tokens_per_sec=12345.6 step_time_ms=85.2 mfu=0.412"
    assert parse_metric_line(line) == {"step": 120, "train_loss": 2.3141, "lr": 0.0003, "tokens_per_sec": 12345.6,
                                       "step_time_ms": 85.2, "mfu": 0.412}
    # `loss` names do not bleed into each other; scientific notation and nan parse
    assert math.isnan(parse_metric_line("[metrics] step=7 grad_norm=nan")["grad_norm"])
    got = parse_metric_line("[metrics] step=7 val_loss=1.5e+00 lr=3e-05")
    assert got == {"step": 7.0, "val_loss": 1.5, "lr": 3e-05}
    assert "train_loss" not in got
    assert parse_metric_line("step=3 train_loss=1.0") == {}, "only [metrics] lines count"


def test_training_package_lines_parse_back():
    # One source of truth: the training package prints exactly the names contract.metrics defines.
    from training.metrics.logger import format_metrics

    record = {"step": 120, "epoch": 1.25, "train_loss": 2.31415, "val_loss": 2.5, "lr": 0.0003, "grad_norm": 0.875,
              "tokens_per_sec": 12345.6, "samples_per_sec": 48.2, "step_time_ms": 85.2, "mfu": 0.412,
              "loss_scale": 65536.0, "data_wait_ms": 12.5, "data_wait_share": 0.1471, "checkpoint_age_s": 312.5, "checkpoint_overdue": 1.25, "startup_s": 41.5,
              "train_s": 3600.2, "checkpoint_s": 55.1, "checkpoint_saves": 6, "eval_s": 12.0,
              "straggler_rank": 3, "slowest_rank_ratio": 1.375}
    parsed = parse_metric_line(format_metrics(record))
    assert set(parsed) == set(METRIC_NAMES)
    for name, value in record.items():
        assert abs(parsed[name] - value) <= 1e-3 * max(1.0, abs(value)), name
