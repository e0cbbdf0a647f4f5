"""LauncherMonitoring: a CloudWatch dashboard and alarms for the job launcher and its training jobs."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

# SageMaker publishes training instance metrics per host ("<job name>/algo-N") in this namespace, and the
# metric definitions of a job (train_loss, tokens_per_sec...) per job (dimension TrainingJobName).
TRAINING_JOBS_NAMESPACE = "/aws/sagemaker/TrainingJobs"


class LauncherMonitoring(Construct):
    """A dashboard (executions, GPU utilization, throughput) and two alarms that notify `topic`.

    GPUUtilization is the sum over a host's GPUs (0 to 100 x GPUs), so the low-utilization threshold is
    `low_gpu_utilization_percent x gpus_per_host`; with mixed instance types pass the smallest GPU count, so
    that a fully busy small host never alarms. The alarm watches the least busy host of any running
    training job in the account (a Metrics Insights query: job names change per attempt, so no static
    dimension fits). Low utilization for a sustained period usually means the job is waiting on IO.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        name_prefix: str,
        state_machine: sfn.IStateMachine,
        topic: sns.ITopic,
        gpus_per_host: int = 8,
        low_gpu_utilization_percent: float = 80,
        low_gpu_utilization_minutes: int = 30,
    ) -> None:
        super().__init__(scope, id)
        if not 0 < low_gpu_utilization_percent <= 100:
            raise ValueError(
                f"low_gpu_utilization_percent={low_gpu_utilization_percent}: use a value in (0, 100]"
            )
        if gpus_per_host < 1:
            raise ValueError(
                f"gpus_per_host={gpus_per_host}: use the GPU count of the platform's instances (>= 1)"
            )
        if low_gpu_utilization_minutes < 5 or low_gpu_utilization_minutes % 5:
            raise ValueError(
                f"low_gpu_utilization_minutes={low_gpu_utilization_minutes}: use a multiple of 5"
            )
        action = actions.SnsAction(topic)
        period = Duration.minutes(5)

        self.failed_executions_alarm = cloudwatch.Alarm(
            self,
            "FailedExecutions",
            alarm_name=f"{name_prefix}-job-launcher-failed-executions",
            alarm_description="A training run ended in failure (the execution's error names the category, "
            "its cause the reason; the notification carries the summary).",
            metric=state_machine.metric_failed(period=period, statistic="Sum"),
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )

        least_busy_host = cloudwatch.MathExpression(
            expression=(
                f'SELECT AVG(GPUUtilization) FROM SCHEMA("{TRAINING_JOBS_NAMESPACE}", Host) '
                "GROUP BY Host ORDER BY AVG() ASC LIMIT 1"
            ),
            label="GPU utilization of the least busy host (sum over its GPUs)",
            period=period,
        )
        periods = low_gpu_utilization_minutes // 5
        threshold = low_gpu_utilization_percent * gpus_per_host
        self.low_gpu_utilization_alarm = cloudwatch.Alarm(
            self,
            "LowGpuUtilization",
            alarm_name=f"{name_prefix}-training-low-gpu-utilization",
            alarm_description=(
                f"A training host averaged below {low_gpu_utilization_percent:g}% GPU utilization per GPU "
                f"(assuming {gpus_per_host} GPUs per host) for {low_gpu_utilization_minutes} minutes: "
                "the job is "
                "probably IO-bound (data loading, checkpoint writes) or stuck."
            ),
            metric=least_busy_host,
            threshold=threshold,
            evaluation_periods=periods,
            datapoints_to_alarm=periods,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            # No training job running means no data, which is not a problem.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        for alarm in (self.failed_executions_alarm, self.low_gpu_utilization_alarm):
            alarm.add_alarm_action(action)
            alarm.add_ok_action(action)

        def search(metric: str, dimension: str, stat: str = "Average") -> cloudwatch.MathExpression:
            return cloudwatch.MathExpression(
                expression=(
                    f"SEARCH('{{{TRAINING_JOBS_NAMESPACE},{dimension}}} MetricName=\"{metric}\"', "
                    f"'{stat}', 300)"
                ),
                label="",
                period=period,
            )

        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{name_prefix}-training")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Launcher executions",
                left=[
                    state_machine.metric_started(period=period, statistic="Sum", label="started"),
                    state_machine.metric_succeeded(period=period, statistic="Sum", label="succeeded"),
                    state_machine.metric_failed(period=period, statistic="Sum", label="failed"),
                    state_machine.metric_aborted(period=period, statistic="Sum", label="aborted"),
                    state_machine.metric_timed_out(period=period, statistic="Sum", label="timed out"),
                ],
                width=12,
            ),
            cloudwatch.AlarmStatusWidget(
                title="Alarms",
                alarms=[self.failed_executions_alarm, self.low_gpu_utilization_alarm],
                width=12,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title=f"GPU utilization per host (sum over its GPUs; alarm below {threshold:g})",
                left=[search("GPUUtilization", "Host")],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=threshold, label="alarm threshold")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="GPU memory utilization per host",
                left=[search("GPUMemoryUtilization", "Host")],
                width=12,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Training throughput (tokens/s, from the [metrics] log lines)",
                left=[search("tokens_per_sec", "TrainingJobName")],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Training loss",
                left=[search("train_loss", "TrainingJobName")],
                width=12,
            ),
        )
