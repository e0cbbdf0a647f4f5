"""The training metrics: their names, the log line that carries them, and the regex that reads it back.

The training package prints one line per log interval,
    [metrics] step=120 train_loss=2.3141 lr=0.0003 tokens_per_sec=12345.6 step_time_ms=85.2 mfu=0.412
CreateTrainingJob's MetricDefinitions (one regex per name, `metric_definitions`) turn each `name=value`
into a CloudWatch metric of the job in METRIC_NAMESPACE; trainctl's progress view and the demo read the
same lines with `parse_metric_line`; the launcher's dashboard plots them by name.
To rename a metric, change its constant's string here; to add one, add a constant and put it in METRIC_NAMES:
the training package, the job definition, the dashboard and trainctl all follow (they name metrics by constant).
"""

from __future__ import annotations

import math
import re

# Each metric's name, defined here once: code names a metric by its constant (`TRAIN_LOSS`), never by its string,
# so renaming one is this file's change alone (tests/test_metric_names.py renames them all and checks the line,
# the MetricDefinitions, the dashboard, the summary, the chart and trainctl follow).
STEP = "step"
EPOCH = "epoch"
TRAIN_LOSS = "train_loss"
VAL_LOSS = "val_loss"
LR = "lr"
GRAD_NORM = "grad_norm"
TOKENS_PER_SEC = "tokens_per_sec"
SAMPLES_PER_SEC = "samples_per_sec"
STEP_TIME_MS = "step_time_ms"
MFU = "mfu"
LOSS_SCALE = "loss_scale"
# The input pipeline (training.data.loader): the mean time a step waited for its batch over the log interval
# (ranks averaged), and that wait's share of the step time (0..1). On the attempt's last line, the run's
# mean. Above input_bound_share the log names the run input bound with the measured rates.
DATA_WAIT_MS = "data_wait_ms"
DATA_WAIT_SHARE = "data_wait_share"
CHECKPOINT_AGE_S = "checkpoint_age_s"  # seconds since the newest complete checkpoint: the work a failure now would cost
# checkpoint_age_s / the seconds expected between checkpoints by the job's cadence (0 when it has none):
# dimensionless, so one alarm threshold fits every job whatever its cadence.
CHECKPOINT_OVERDUE = "checkpoint_overdue"
# Where this attempt's seconds went so far (training.metrics.meter.AttemptClock), cumulative, so the last value
# SageMaker keeps of each (FinalMetricDataList) is the attempt's total: the launcher's run record
# (jobs.outcome.run_record) reads them to split the attempt's billed time into goodput and its losses.
STARTUP_S = "startup_s"  # from the training process's start to its first step (imports, model build, restore)
TRAIN_S = "train_s"  # in training steps
CHECKPOINT_S = "checkpoint_s"  # the step loop blocked by checkpoint saves (the stall, not an async save's tail)
CHECKPOINT_SAVES = "checkpoint_saves"  # saves on the cadence (their mean stall: the save time the next attempt plans with)
EVAL_S = "eval_s"  # in evaluation
# Stragglers (training.resilience.stragglers), each log interval: the rank named as persistently slow (-1: none), and the
# slowest rank's own time against the median rank's (1.0: even). The last value is the run's verdict.
STRAGGLER_RANK = "straggler_rank"
SLOWEST_RANK_RATIO = "slowest_rank_ratio"
# Not a line's metric: each rank's own time per step (before it waits for the others at the step boundary), each log
# interval, in TensorBoard only (`rank_step_time_ms/rank_<r>`, a chart per rank): one number per rank, too many for a
# log line or an MLflow run at scale, whose slowest one slowest_rank_ratio carries.
RANK_STEP_TIME_MS = "rank_step_time_ms"

# Every metric, in the order a line carries them (and trainctl shows them).
METRIC_NAMES: tuple[str, ...] = (
    STEP, EPOCH, TRAIN_LOSS, VAL_LOSS, LR, GRAD_NORM, TOKENS_PER_SEC, SAMPLES_PER_SEC, STEP_TIME_MS, MFU, LOSS_SCALE,
    DATA_WAIT_MS, DATA_WAIT_SHARE, CHECKPOINT_AGE_S, CHECKPOINT_OVERDUE, STARTUP_S, TRAIN_S, CHECKPOINT_S,
    CHECKPOINT_SAVES, EVAL_S, STRAGGLER_RANK, SLOWEST_RANK_RATIO,
)
# Values a line carries to 4 decimals (losses, ratios, shares); the others to 1, small ones to 4 significant digits.
FOUR_DECIMALS = frozenset({TRAIN_LOSS, VAL_LOSS, GRAD_NORM, MFU, EPOCH, CHECKPOINT_OVERDUE, SLOWEST_RANK_RATIO,
                           DATA_WAIT_SHARE})

LINE_PREFIX = "[metrics]"

# The metrics file's own fields beside the metrics (training.metrics.logger writes them, charts read them): when a
# record was written, and when the training process that wrote it started (a run on a work folder: the chart tells a
# resumed run from the one before it by it, even where it resumed at the very step that one stopped).
RECORD_TIME = "time"
RUN_STARTED = "run_started"

# SageMaker publishes a training job's MetricDefinitions (and its instance metrics: GPUUtilization,
# GPUMemoryUtilization...) under this CloudWatch namespace, dimensioned by TrainingJobName or Host.
# It happens to be spelled like the job's log group (contract.container.LOG_GROUP); they are two facts.
METRIC_NAMESPACE = "/aws/sagemaker/TrainingJobs"

# What a job sends to its own platform's (team's) namespace (contract.container.ENV_METRICS_NAMESPACE) besides the
# line's metrics: each host's GPUs, sampled by the host's first rank, as the mean over its GPUs in percent (so one
# threshold fits hosts of any GPU count). Dimensions: the run (every attempt of a run draws one line), and the host.
GPU_UTILIZATION = "gpu_utilization"
GPU_MEMORY_UTILIZATION = "gpu_memory_utilization"
HOST_METRICS = (GPU_UTILIZATION, GPU_MEMORY_UTILIZATION)
RUN_DIMENSION = "RunId"
HOST_DIMENSION = "Host"

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
    if name == LR or (value != 0 and abs(value) < 1e-3):
        return f"{value:.4g}"
    if name in FOUR_DECIMALS:
        return f"{value:.4f}"
    return f"{value:.1f}"
