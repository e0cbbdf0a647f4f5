"""The training metrics: their names, the log line that carries them, and the regex that reads it back.

The training package prints one line per log interval,
    [metrics] step=120 train_loss=2.3141 lr=0.0003 tokens_per_sec=12345.6 step_time_ms=85.2 mfu=0.412
CreateTrainingJob's MetricDefinitions (one regex per name, `metric_definitions`) turn each `name=value`
into a CloudWatch metric of the job in METRIC_NAMESPACE; trainctl's progress view and the demo read the
same lines with `parse_metric_line`; the launcher's dashboard plots them by name.
To add or rename a metric, change METRIC_NAMES here: the training package, the job definition, the
dashboard and trainctl all follow.
"""

from __future__ import annotations

import math
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
    # The input pipeline (training.loader): the mean time a step waited for its batch over the log interval
    # (ranks averaged), and that wait's share of the step time (0..1). On the attempt's last line, the run's
    # mean. Above input_bound_share the log names the run input bound with the measured rates.
    "data_wait_ms",
    "data_wait_share",
    "checkpoint_age_s",  # seconds since the newest complete checkpoint: the work a failure now would cost
    # checkpoint_age_s / the seconds expected between checkpoints by the job's cadence (0 when it has none):
    # dimensionless, so one alarm threshold fits every job whatever its cadence.
    "checkpoint_overdue",
    # Where this attempt's seconds went so far (training.meter.AttemptClock), cumulative, so the last value
    # SageMaker keeps of each (FinalMetricDataList) is the attempt's total: the launcher's run record
    # (jobs.run_record) reads them to split the attempt's billed time into goodput and its losses.
    "startup_s",  # from the training process's start to its first step (imports, model build, restore)
    "train_s",  # in training steps
    "checkpoint_s",  # the step loop blocked by checkpoint saves (the stall, not an async save's tail)
    "checkpoint_saves",  # saves on the cadence (their mean stall: the save time the next attempt plans with)
    "eval_s",  # in evaluation
    # Stragglers (training.stragglers), each log interval: the rank named as persistently slow (-1: none), and the
    # slowest rank's own time against the median rank's (1.0: even). The last value is the run's verdict.
    "straggler_rank",
    "slowest_rank_ratio",
)

LINE_PREFIX = "[metrics]"

# SageMaker publishes a training job's MetricDefinitions (and its instance metrics: GPUUtilization,
# GPUMemoryUtilization...) under this CloudWatch namespace, dimensioned by TrainingJobName or Host.
# It happens to be spelled like the job's log group (contract.container.LOG_GROUP); they are two facts.
METRIC_NAMESPACE = "/aws/sagemaker/TrainingJobs"

# CreateTrainingJob accepts at most 40 definitions, each regex at most 500 characters.
MAX_METRIC_DEFINITIONS = 40
MAX_REGEX_LENGTH = 500

# `.*?` lets the pair sit anywhere on the line; `\b` keeps `loss` from matching inside `val_loss`.
_REGEX = re.escape(LINE_PREFIX) + r".*?\b{name}=([-+0-9.eE]+|nan|inf)"


def metric_regex(name: str) -> str:
    return _REGEX.format(name=re.escape(name))


def metric_definitions() -> list[dict[str, str]]:
    """MetricDefinitions for AlgorithmSpecification: one per metric the training package prints."""
    return [{"Name": name, "Regex": metric_regex(name)} for name in METRIC_NAMES]


def parse_metric_line(line: str) -> dict[str, float]:
    """What SageMaker would scrape from one log line (trainctl's progress view, the demo, tests)."""
    found = {}
    for name in METRIC_NAMES:
        match = re.search(metric_regex(name), line)
        if match:
            try:
                found[name] = float(match.group(1))
            except ValueError:  # e.g. a lone sign: SageMaker would drop it too
                continue
    return found


def format_metrics(record: dict) -> str:
    """`[metrics] name=value ...` in METRIC_NAMES order; unknown names are a programming error."""
    unknown = set(record) - set(METRIC_NAMES)
    if unknown:
        raise ValueError(f"unknown metric names {sorted(unknown)}; allowed: {METRIC_NAMES}")
    parts = [f"{name}={format_value(name, record[name])}" for name in METRIC_NAMES if record.get(name) is not None]
    return f"{LINE_PREFIX} " + " ".join(parts)


def format_value(name: str, value: float | int) -> str:
    """A metric's value as the line carries it: integers plain, small numbers in 4 significant digits."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if name == "lr" or (value != 0 and abs(value) < 1e-3):
        return f"{value:.4g}"
    if name in ("train_loss", "val_loss", "grad_norm", "mfu", "epoch", "checkpoint_overdue", "slowest_rank_ratio",
                "data_wait_share"):
        return f"{value:.4f}"
    return f"{value:.1f}"
