"""LauncherMonitoring: a CloudWatch dashboard and alarms for the job launcher and its training jobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from contract.hyperparameters import INPUT_BOUND_SHARE
from contract.metrics import (
    CHECKPOINT_AGE_S,
    CHECKPOINT_OVERDUE,
    CHECKPOINT_S,
    DATA_WAIT_MS,
    DATA_WAIT_SHARE,
    EVAL_S,
    METRIC_NAMES,
    METRIC_NAMESPACE,
    SLOWEST_RANK_RATIO,
    STARTUP_S,
    TOKENS_PER_SEC,
    TRAIN_LOSS,
    TRAIN_S,
)
from jobs.catalog import lookup

# SageMaker publishes training instance metrics per host ("<job name>/algo-N") in METRIC_NAMESPACE, and the
# metric definitions of a job (contract.metrics.METRIC_NAMES) per job (dimension TrainingJobName).
# The instance metrics are SageMaker's own names, not the training package's.
GPU_UTILIZATION = "GPUUtilization"
GPU_MEMORY_UTILIZATION = "GPUMemoryUtilization"
PERIOD = Duration.minutes(5)


def job_metric(name: str) -> str:
    """A metric the training package prints; a name it does not print would chart nothing."""
    if name not in METRIC_NAMES:
        raise ValueError(f"metric {name!r} is not printed by the training package; use one of {METRIC_NAMES}")
    return name


def smallest_gpu_count(instance_types: Sequence[str]) -> int:
    """The fewest GPUs on any of these instance types that has GPUs (1 when none has).

    GPUUtilization sums over a host's GPUs, so one alarm threshold must assume a GPU count: the smallest
    never alarms on a fully busy small host; on larger hosts it alarms at a lower per-GPU utilization.
    """
    counts = [spec.accelerators for t in instance_types if (spec := lookup(t)) and spec.kind == "gpu"]
    return min(counts, default=1)


@dataclass(frozen=True, kw_only=True)
class LauncherMonitoringProps:
    """The thresholds are the construct's own (the platform config sets none of them); each bad one raises naming
    itself and what to use."""

    name_prefix: str
    """The launcher's prefix: the dashboard is `<name_prefix>-training`, the alarms are named after it."""
    state_machine: sfn.IStateMachine
    """The launcher's state machine: its executions' metrics and the failed-executions alarm."""
    topic: sns.ITopic
    """Where the alarms (and their return to OK) are sent."""
    gpus_per_host: int | None = None
    """The GPU count the low-utilization threshold assumes per host; give this or `instance_types`, not both.
    @default derived from instance_types, or 8 when neither is given"""
    instance_types: Sequence[str] | None = None
    """The allowed instance types, to derive gpus_per_host from (smallest_gpu_count). @default None"""
    low_gpu_utilization_percent: float = 80
    """The per-GPU utilization below which a host alarms, in (0, 100]. @default 80"""
    low_gpu_utilization_minutes: int = 30
    """How long a host stays below it before the alarm, a multiple of 5. @default 30"""
    checkpoint_overdue_factor: float = 2
    """How many of its cadences a job's newest checkpoint may age before the alarm, above 1. @default 2"""
    checkpoint_overdue_minutes: int = 10
    """How long a job stays overdue before the alarm, a multiple of 5. @default 10"""

    def __post_init__(self) -> None:
        if self.gpus_per_host is not None and self.instance_types is not None:
            raise ValueError("pass gpus_per_host or instance_types, not both (instance_types derives gpus_per_host)")
        percent, minutes = self.low_gpu_utilization_percent, self.low_gpu_utilization_minutes
        if not 0 < percent <= 100:
            raise ValueError(f"low_gpu_utilization_percent={percent}: use a value in (0, 100]")
        if self.host_gpus < 1:
            raise ValueError(f"gpus_per_host={self.host_gpus}: use the GPU count of the platform's instances (>= 1)")
        if minutes < 5 or minutes % 5:
            raise ValueError(f"low_gpu_utilization_minutes={minutes}: use a multiple of 5")
        factor, minutes = self.checkpoint_overdue_factor, self.checkpoint_overdue_minutes
        if factor <= 1:
            raise ValueError(f"checkpoint_overdue_factor={factor}: use a value above 1 (1 is the cadence itself)")
        if minutes < 5 or minutes % 5:
            raise ValueError(f"checkpoint_overdue_minutes={minutes}: use a multiple of 5")

    @property
    def host_gpus(self) -> int:
        """The GPU count the low-utilization threshold assumes: gpus_per_host, else instance_types' smallest, else
        8."""
        if self.gpus_per_host is not None:
            return self.gpus_per_host
        return 8 if self.instance_types is None else smallest_gpu_count(self.instance_types)


class LauncherMonitoring(Construct):
    """A dashboard (executions, GPU utilization, throughput, checkpoint age) and three alarms that notify `topic`.

    GPUUtilization is the sum over a host's GPUs (0 to 100 x GPUs), so the low-utilization threshold is
    `low_gpu_utilization_percent x gpus_per_host`; with mixed instance types pass the smallest GPU count, so
    that a fully busy small host never alarms, or pass `instance_types` (the allowed ones) to have it derived.
    The alarm watches the least busy host of any running training job in the account (a Metrics Insights query: job names change per attempt, so no static
    dimension fits). Low utilization for a sustained period usually means the job is waiting on IO.

    The checkpoint alarm fires when a job's newest complete checkpoint is older than `checkpoint_overdue_factor`
    times its own cadence for `checkpoint_overdue_minutes`: the job prints `checkpoint_overdue` (the age over
    the seconds its cadence puts between checkpoints), so one threshold fits jobs of any cadence, and the
    query takes the most overdue job. It means saves fail, hang, or take longer than the cadence allows: a
    failure now would cost more work than the job was sized for.
    """

    def __init__(self, scope: Construct, id: str, props: LauncherMonitoringProps) -> None:
        super().__init__(scope, id)
        name_prefix, state_machine = props.name_prefix, props.state_machine
        gpus_per_host = props.host_gpus
        low_gpu_utilization_percent = props.low_gpu_utilization_percent
        low_gpu_utilization_minutes = props.low_gpu_utilization_minutes
        checkpoint_overdue_factor = props.checkpoint_overdue_factor
        checkpoint_overdue_minutes = props.checkpoint_overdue_minutes
        self.threshold = low_gpu_utilization_percent * gpus_per_host
        self.overdue_factor = checkpoint_overdue_factor
        self.failed_executions_alarm = self._failed_executions_alarm(name_prefix, state_machine)
        self.low_gpu_utilization_alarm = self._low_gpu_alarm(name_prefix, gpus_per_host,
                                                             low_gpu_utilization_percent, low_gpu_utilization_minutes)
        self.checkpoint_overdue_alarm = self._checkpoint_overdue_alarm(name_prefix, checkpoint_overdue_minutes)
        action = actions.SnsAction(props.topic)
        for alarm in self.alarms:
            alarm.add_alarm_action(action)
            alarm.add_ok_action(action)
        self.dashboard = self._dashboard(name_prefix, state_machine)

    def _failed_executions_alarm(self, name_prefix: str, state_machine: sfn.IStateMachine) -> cloudwatch.Alarm:
        return cloudwatch.Alarm(
            self,
            "FailedExecutions",
            alarm_name=f"{name_prefix}-job-launcher-failed-executions",
            alarm_description="A training run ended in failure (the execution's error names the category, "
            "its cause the reason; the notification carries the summary).",
            metric=state_machine.metric_failed(period=PERIOD, statistic="Sum"),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _low_gpu_alarm(self, name_prefix: str, gpus_per_host: int, percent: float, minutes: int) -> cloudwatch.Alarm:
        least_busy_host = cloudwatch.MathExpression(
            expression=(
                f'SELECT AVG({GPU_UTILIZATION}) FROM SCHEMA("{METRIC_NAMESPACE}", Host) '
                "GROUP BY Host ORDER BY AVG() ASC LIMIT 1"
            ),
            label="GPU utilization of the least busy host (sum over its GPUs)",
            period=PERIOD,
        )
        return self._sustained_alarm(
            "LowGpuUtilization", f"{name_prefix}-training-low-gpu-utilization",
            f"A training host averaged below {percent:g}% GPU utilization per GPU "
            f"(assuming {gpus_per_host} GPUs per host) for {minutes} minutes: "
            "the job is "
            "probably IO-bound (data loading, checkpoint writes) or stuck.",
            least_busy_host, self.threshold, minutes, cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD)

    @property
    def alarms(self) -> tuple[cloudwatch.Alarm, ...]:
        return (self.failed_executions_alarm, self.low_gpu_utilization_alarm, self.checkpoint_overdue_alarm)

    def _checkpoint_overdue_alarm(self, name_prefix: str, minutes: int) -> cloudwatch.Alarm:
        most_overdue_job = cloudwatch.MathExpression(
            expression=(f'SELECT MAX({job_metric(CHECKPOINT_OVERDUE)}) '
                        f'FROM SCHEMA("{METRIC_NAMESPACE}", TrainingJobName)'),
            label="Checkpoint age of the most overdue job, in its cadences",
            period=PERIOD,
        )
        return self._sustained_alarm(
            "CheckpointOverdue", f"{name_prefix}-training-checkpoint-overdue",
            f"A training job's newest complete checkpoint stayed older than {self.overdue_factor:g} times its "
            f"checkpoint cadence for {minutes} minutes (metric {CHECKPOINT_OVERDUE}): its saves fail, hang or "
            "take longer than the cadence allows, so a failure now would lose more work than planned. Read "
            "the job's [checkpoint] log lines.",
            most_overdue_job, self.overdue_factor, minutes, cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD)

    def _sustained_alarm(self, construct_id: str, name: str, description: str, metric: cloudwatch.IMetric,
                         threshold: float, minutes: int,
                         comparison: cloudwatch.ComparisonOperator) -> cloudwatch.Alarm:
        """An alarm on a training-job metric that breaches in every 5-minute period for `minutes`."""
        periods = minutes // 5
        return cloudwatch.Alarm(
            self, construct_id, alarm_name=name, alarm_description=description, metric=metric,
            threshold=threshold, evaluation_periods=periods, datapoints_to_alarm=periods,
            comparison_operator=comparison,
            # No training job running (or none printing the metric yet) means no data, which is not a problem.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

    def _dashboard(self, name_prefix: str, state_machine: sfn.IStateMachine) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{name_prefix}-training")
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Launcher executions",
                left=[
                    state_machine.metric_started(period=PERIOD, statistic="Sum", label="started"),
                    state_machine.metric_succeeded(period=PERIOD, statistic="Sum", label="succeeded"),
                    state_machine.metric_failed(period=PERIOD, statistic="Sum", label="failed"),
                    state_machine.metric_aborted(period=PERIOD, statistic="Sum", label="aborted"),
                    state_machine.metric_timed_out(period=PERIOD, statistic="Sum", label="timed out"),
                ],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(
                title="Alarms",
                alarms=list(self.alarms),
                width=12,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title=f"GPU utilization per host (sum over its GPUs; alarm below {self.threshold:g})",
                left=[_search(GPU_UTILIZATION, "Host")],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=self.threshold, label="alarm threshold")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="GPU memory utilization per host",
                left=[_search(GPU_MEMORY_UTILIZATION, "Host")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Training throughput (tokens/s, from the [metrics] log lines)",
                left=_per_job(TOKENS_PER_SEC, stat="Average"),
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Training loss",
                left=_per_job(TRAIN_LOSS, stat="Average"),
                width=12,
            ),
        )
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Checkpoint age per job (s since its newest complete checkpoint)",
                left=_per_job(CHECKPOINT_AGE_S),
                width=12,
            ),
            cloudwatch.GraphWidget(
                title=f"Checkpoint age per job in its cadences (alarm above {self.overdue_factor:g})",
                left=_per_job(CHECKPOINT_OVERDUE),
                left_annotations=[cloudwatch.HorizontalAnnotation(value=self.overdue_factor, label="alarm threshold")],
                width=12,
            ),
        )
        dashboard.add_widgets(
            # training.resilience.stragglers: each log interval, the slowest rank's own delays against the median rank's.
            cloudwatch.GraphWidget(
                title="Slowest rank per job, its time over the median rank's (1 = even)",
                left=_per_job(SLOWEST_RANK_RATIO),
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Where each attempt's time went (s: startup, training, checkpoint stalls, evaluation)",
                left=_per_job(STARTUP_S, TRAIN_S, CHECKPOINT_S, EVAL_S),
                width=12,
            ),
        )
        dashboard.add_widgets(
            # training.data.loader: how long each step waited for its batch; above the share the job logs 'input bound'.
            cloudwatch.GraphWidget(
                title="Input pipeline: ms each step waited for its batch (ranks' mean)",
                left=_per_job(DATA_WAIT_MS),
                width=12,
            ),
            cloudwatch.GraphWidget(
                title=f"Input pipeline: share of the step spent waiting for data (input bound above "
                      f"{INPUT_BOUND_SHARE:g}, the default input_bound_share)",
                left=_per_job(DATA_WAIT_SHARE),
                left_annotations=[cloudwatch.HorizontalAnnotation(value=INPUT_BOUND_SHARE, label="input bound")],
                width=12,
            ),
        )
        return dashboard


def _per_job(*names: str, stat: str = "Maximum") -> list[cloudwatch.MathExpression]:
    """One line per training job for each of the training package's metrics `names`."""
    return [_search(job_metric(name), "TrainingJobName", stat=stat) for name in names]


def _search(metric: str, dimension: str, stat: str = "Average") -> cloudwatch.MathExpression:
    return cloudwatch.MathExpression(
        expression=f"SEARCH('{{{METRIC_NAMESPACE},{dimension}}} MetricName=\"{metric}\"', '{stat}', 300)",
        label="",
        period=PERIOD,
    )

