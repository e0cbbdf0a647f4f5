"""The training metrics SageMaker scrapes from the job's log: one source of truth for names and regexes.

The training package prints one line per log interval,
    [metrics] step=120 train_loss=2.3141 lr=0.0003 tokens_per_sec=12345.6 step_time_ms=85.2 mfu=0.412
and CreateTrainingJob's MetricDefinitions turn each `name=value` into a CloudWatch metric of the job.
The names here must equal `training.metrics.METRIC_NAMES` (a test checks it; jobs cannot import training).
"""

from __future__ import annotations

import re

METRIC_NAMES: tuple[str, ...] = (
    "step",
    "epoch",
    "train_loss",
    "val_loss",
    "lr",
    "grad_norm",
    "tokens_per_sec",
    "samples_per_sec",
    "step_time_ms",
    "mfu",
    "loss_scale",
)

# `.*?` lets the pair sit anywhere on the line; `\b` keeps `loss` from matching inside `val_loss`.
_REGEX = r"\[metrics\].*?\b{name}=([-+0-9.eE]+|nan|inf)"

# CreateTrainingJob accepts at most 40 definitions, each regex at most 500 characters.
MAX_METRIC_DEFINITIONS = 40
MAX_REGEX_LENGTH = 500


def metric_regex(name: str) -> str:
    return _REGEX.format(name=re.escape(name))


def metric_definitions() -> list[dict[str, str]]:
    """MetricDefinitions for AlgorithmSpecification: one per metric the training package prints."""
    return [{"Name": name, "Regex": metric_regex(name)} for name in METRIC_NAMES]


def parse_metric_line(line: str) -> dict[str, float]:
    """What SageMaker would scrape from one log line (used by tests and trainctl's progress view)."""
    found = {}
    for name in METRIC_NAMES:
        match = re.search(metric_regex(name), line)
        if match:
            try:
                found[name] = float(match.group(1))
            except ValueError:  # e.g. a lone sign: SageMaker would drop it too
                continue
    return found
