"""LauncherMonitoring: a CloudWatch dashboard and alarms for the job launcher and its training jobs."""

from __future__ import annotations

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
    GPU_MEMORY_UTILIZATION,
    GPU_UTILIZATION,
    HOST_DIMENSION,
    METRIC_NAMES,
    METRIC_NAMESPACE,
    RUN_DIMENSION,
    SLOWEST_RANK_RATIO,
    STARTUP_S,
    TOKENS_PER_SEC,
    TRAIN_LOSS,
    TRAIN_S,
)
from jobs.naming import metrics_namespace

# SageMaker publishes training instance metrics per host ("<job name>/algo-N") in METRIC_NAMESPACE, and the
# metric definitions of a job (contract.metrics.METRIC_NAMES) per job (dimension TrainingJobName), all teams' jobs
# in that one namespace, which every team's job role may write (IAM cannot scope a data point's dimensions). Only
# the platform team's all-jobs dashboard reads it; a team's alarms and dashboard read the team's own namespace
# (jobs.naming.metrics_namespace), where its jobs send the same lines and their hosts' GPUs
# (training.metrics.cloudwatch) and no other team's role may write.
SAGEMAKER_GPU_UTILIZATION = "GPUUtilization"  # SageMaker's: the sum over a host's GPUs
SAGEMAKER_GPU_MEMORY_UTILIZATION = "GPUMemoryUtilization"
PERIOD = Duration.minutes(5)


def job_metric(name: str) -> str:
    """A metric the training package prints; a name it does not print would chart nothing."""
    if name not in METRIC_NAMES:
        raise ValueError(f"metric {name!r} is not printed by the training package; use one of {METRIC_NAMES}")
    return name


@dataclass(frozen=True, kw_only=True)
class LauncherMonitoringProps:
    """The thresholds are the construct's own (the platform config sets none of them); each bad one raises naming
    itself and what to use."""

    name_prefix: str
    """The launcher's (team's) prefix: the dashboard is `<name_prefix>-training`, the alarms are named after it, and
    both read the metrics namespace `metrics_namespace(name_prefix)` alone."""
    state_machine: sfn.IStateMachine
    """The launcher's state machine: its executions' metrics and the failed-executions alarm."""
    topic: sns.ITopic
    """Where the alarms (and their return to OK) are sent."""
    low_gpu_utilization_percent: float = 80
    """The mean utilization of a host's GPUs below which it alarms, in (0, 100]. @default 80"""
    low_gpu_utilization_minutes: int = 30
    """How long a host stays below it before the alarm, a multiple of 5. @default 30"""
    checkpoint_overdue_factor: float = 2
    """How many of its cadences a run's newest checkpoint may age before the alarm, above 1. @default 2"""
    checkpoint_overdue_minutes: int = 10
    """How long a run stays overdue before the alarm, a multiple of 5. @default 10"""

    def __post_init__(self) -> None:
        percent, minutes = self.low_gpu_utilization_percent, self.low_gpu_utilization_minutes
        if not 0 < percent <= 100:
            raise ValueError(f"low_gpu_utilization_percent={percent}: use a value in (0, 100]")
        if minutes < 5 or minutes % 5:
            raise ValueError(f"low_gpu_utilization_minutes={minutes}: use a multiple of 5")
        factor, minutes = self.checkpoint_overdue_factor, self.checkpoint_overdue_minutes
        if factor <= 1:
            raise ValueError(f"checkpoint_overdue_factor={factor}: use a value above 1 (1 is the cadence itself)")
        if minutes < 5 or minutes % 5:
            raise ValueError(f"checkpoint_overdue_minutes={minutes}: use a multiple of 5")


class LauncherMonitoring(Construct):
    """A team's dashboard (executions, GPU utilization, throughput, checkpoint age, per run) and three alarms that
    notify `topic`, all reading the team's own metrics namespace (`metrics_namespace(name_prefix)`), which only
    the team's job role may write: no other team's job can raise, mask or show up in them.

    The GPU alarm watches the least busy host of any of the team's running runs, a host's GPUs averaged by the job
    itself (training.metrics.cloudwatch), so one percentage fits hosts of any GPU count (a Metrics Insights query:
    runs come and go, so no static dimension fits). Low utilization for a sustained period usually means the job
    is waiting on IO.

    The checkpoint alarm fires when a run's newest complete checkpoint is older than `checkpoint_overdue_factor`
    times its own cadence for `checkpoint_overdue_minutes`: the job sends `checkpoint_overdue` (the age over the
    seconds its cadence puts between checkpoints), so one threshold fits runs of any cadence, and the query takes
    the most overdue run. It means saves fail, hang, or take longer than the cadence allows: a failure now would
    cost more work than the run was sized for.

    A job with network isolation cannot reach CloudWatch: its runs send nothing here (it says so in its log), and
    missing data never alarms.
    """

    def __init__(self, scope: Construct, id: str, props: LauncherMonitoringProps) -> None:
        super().__init__(scope, id)
        name_prefix, state_machine = props.name_prefix, props.state_machine
        self.namespace = metrics_namespace(name_prefix)
        self.threshold = props.low_gpu_utilization_percent
        self.overdue_factor = props.checkpoint_overdue_factor
        self.failed_executions_alarm = self._failed_executions_alarm(name_prefix, state_machine)
        self.low_gpu_utilization_alarm = self._low_gpu_alarm(name_prefix, props.low_gpu_utilization_minutes)
        self.checkpoint_overdue_alarm = self._checkpoint_overdue_alarm(name_prefix, props.checkpoint_overdue_minutes)
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

    def _low_gpu_alarm(self, name_prefix: str, minutes: int) -> cloudwatch.Alarm:
        least_busy_host = cloudwatch.MathExpression(
            expression=(
                f'SELECT AVG({GPU_UTILIZATION}) FROM SCHEMA("{self.namespace}", {RUN_DIMENSION}, {HOST_DIMENSION}) '
                f"GROUP BY {RUN_DIMENSION}, {HOST_DIMENSION} ORDER BY AVG() ASC LIMIT 1"
            ),
            label="GPU utilization of the team's least busy host (mean over its GPUs)",
            period=PERIOD,
        )
        return self._sustained_alarm(
            "LowGpuUtilization", f"{name_prefix}-training-low-gpu-utilization",
            f"A training host of this team averaged below {self.threshold:g}% utilization over its GPUs for "
            f"{minutes} minutes: the job is probably IO-bound (data loading, checkpoint writes) or stuck.",
            least_busy_host, self.threshold, minutes, cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD)

    @property
    def alarms(self) -> tuple[cloudwatch.Alarm, ...]:
        return (self.failed_executions_alarm, self.low_gpu_utilization_alarm, self.checkpoint_overdue_alarm)

    def _checkpoint_overdue_alarm(self, name_prefix: str, minutes: int) -> cloudwatch.Alarm:
        most_overdue_run = cloudwatch.MathExpression(
            expression=(f'SELECT MAX({job_metric(CHECKPOINT_OVERDUE)}) '
                        f'FROM SCHEMA("{self.namespace}", {RUN_DIMENSION})'),
            label="Checkpoint age of the team's most overdue run, in its cadences",
            period=PERIOD,
        )
        return self._sustained_alarm(
            "CheckpointOverdue", f"{name_prefix}-training-checkpoint-overdue",
            f"A training run's newest complete checkpoint stayed older than {self.overdue_factor:g} times its "
            f"checkpoint cadence for {minutes} minutes (metric {CHECKPOINT_OVERDUE}): its saves fail, hang or "
            "take longer than the cadence allows, so a failure now would lose more work than planned. Read "
            "the job's [checkpoint] log lines.",
            most_overdue_run, self.overdue_factor, minutes, cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD)

    def _sustained_alarm(self, construct_id: str, name: str, description: str, metric: cloudwatch.IMetric,
                         threshold: float, minutes: int,
                         comparison: cloudwatch.ComparisonOperator) -> cloudwatch.Alarm:
        """An alarm on a training metric that breaches in every 5-minute period for `minutes`."""
        periods = minutes // 5
        return cloudwatch.Alarm(
            self, construct_id, alarm_name=name, alarm_description=description, metric=metric,
            threshold=threshold, evaluation_periods=periods, datapoints_to_alarm=periods,
            comparison_operator=comparison,
            # No training job running (or none sending the metric yet) means no data, which is not a problem.
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
        host = (RUN_DIMENSION, HOST_DIMENSION)
        dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title=f"GPU utilization per host (mean over its GPUs, %; alarm below {self.threshold:g})",
                left=[_search(self.namespace, GPU_UTILIZATION, host)],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=self.threshold, label="alarm threshold")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="GPU memory in use per host (mean over its GPUs, %)",
                left=[_search(self.namespace, GPU_MEMORY_UTILIZATION, host)],
                width=12,
            ),
        )
        _add_training_widgets(dashboard, self.namespace, RUN_DIMENSION, "run", self.overdue_factor)
        return dashboard


@dataclass(frozen=True, kw_only=True)
class AllJobsDashboardProps:
    name_prefix: str
    """The platform's own prefix: the dashboard is `<name_prefix>-training-all-jobs`."""


class AllJobsDashboard(Construct):
    """The platform team's view of every job in the account: SageMaker's own namespace (its instance metrics per
    host, the MetricDefinitions per job), which every team's jobs share, so this dashboard shows them all. No alarm
    reads it (a team's job may write any data point there); the teams' alarms read their own namespaces."""

    def __init__(self, scope: Construct, id: str, props: AllJobsDashboardProps) -> None:
        super().__init__(scope, id)
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard",
                                              dashboard_name=f"{props.name_prefix}-training-all-jobs")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="GPU utilization per host (SageMaker's: the sum over its GPUs)",
                left=[_search(METRIC_NAMESPACE, SAGEMAKER_GPU_UTILIZATION, ("Host",))],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="GPU memory utilization per host (SageMaker's)",
                left=[_search(METRIC_NAMESPACE, SAGEMAKER_GPU_MEMORY_UTILIZATION, ("Host",))],
                width=12,
            ),
        )
        _add_training_widgets(self.dashboard, METRIC_NAMESPACE, "TrainingJobName", "job", None)


def _add_training_widgets(dashboard: cloudwatch.Dashboard, namespace: str, dimension: str, per: str,
                          overdue_factor: float | None) -> None:
    """The training package's metrics, one line per `dimension` value (a run in a team's namespace, a job in
    SageMaker's), with the alarm's threshold where one reads them."""
    def lines(*names: str, stat: str = "Maximum") -> list[cloudwatch.MathExpression]:
        return [_search(namespace, job_metric(name), (dimension,), stat=stat) for name in names]

    overdue = [] if overdue_factor is None else [
        cloudwatch.HorizontalAnnotation(value=overdue_factor, label="alarm threshold")]
    dashboard.add_widgets(
        cloudwatch.GraphWidget(title=f"Training throughput per {per} (tokens/s)",
                               left=lines(TOKENS_PER_SEC, stat="Average"), width=12),
        cloudwatch.GraphWidget(title=f"Training loss per {per}", left=lines(TRAIN_LOSS, stat="Average"), width=12),
    )
    dashboard.add_widgets(
        cloudwatch.GraphWidget(title=f"Checkpoint age per {per} (s since its newest complete checkpoint)",
                               left=lines(CHECKPOINT_AGE_S), width=12),
        cloudwatch.GraphWidget(
            title=f"Checkpoint age per {per} in its cadences"
                  + ("" if overdue_factor is None else f" (alarm above {overdue_factor:g})"),
            left=lines(CHECKPOINT_OVERDUE), left_annotations=overdue, width=12),
    )
    dashboard.add_widgets(
        # training.resilience.stragglers: each log interval, the slowest rank's own delays against the median rank's.
        cloudwatch.GraphWidget(title=f"Slowest rank per {per}, its time over the median rank's (1 = even)",
                               left=lines(SLOWEST_RANK_RATIO), width=12),
        cloudwatch.GraphWidget(
            title="Where each attempt's time went (s: startup, training, checkpoint stalls, evaluation)",
            left=lines(STARTUP_S, TRAIN_S, CHECKPOINT_S, EVAL_S), width=12),
    )
    dashboard.add_widgets(
        # training.data.loader: how long each step waited for its batch; above the share the job logs 'input bound'.
        cloudwatch.GraphWidget(title="Input pipeline: ms each step waited for its batch (ranks' mean)",
                               left=lines(DATA_WAIT_MS), width=12),
        cloudwatch.GraphWidget(
            title=f"Input pipeline: share of the step spent waiting for data (input bound above "
                  f"{INPUT_BOUND_SHARE:g}, the default input_bound_share)",
            left=lines(DATA_WAIT_SHARE),
            left_annotations=[cloudwatch.HorizontalAnnotation(value=INPUT_BOUND_SHARE, label="input bound")],
            width=12),
    )


def _search(namespace: str, metric: str, dimensions: tuple[str, ...], stat: str = "Average") -> cloudwatch.MathExpression:
    """Every series of `metric` in `namespace` with exactly these dimensions (a SEARCH reads no other namespace)."""
    schema = ",".join((namespace, *dimensions))
    return cloudwatch.MathExpression(
        expression=f"SEARCH('{{{schema}}} MetricName=\"{metric}\"', '{stat}', 300)",
        label="",
        period=PERIOD,
    )
