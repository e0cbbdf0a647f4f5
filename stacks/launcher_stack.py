"""The launcher stack: the job launcher state machine, its notifications, dashboard and alarms."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from jobs.catalog import lookup
from platform_constructs.launcher import JobLauncher
from platform_constructs.monitoring import LauncherMonitoring
from platform_constructs.retention import retention
from stacks.resources import PlatformResources


class LauncherStack(Stack):
    def __init__(self, scope: Construct, id: str, *, resources: PlatformResources, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        config = resources.config
        prefix = config.name_prefix
        self.launcher = JobLauncher(
            self,
            "JobLauncher",
            name_prefix=prefix,
            key=resources.key,
            execution_role=resources.execution_role,
            settings=resources.settings,
            notification_email=config.notification_email,
            log_retention=retention(config.log_retention_days),
            removal_policy=RemovalPolicy.RETAIN
            if getattr(config, "retain_data", True)
            else RemovalPolicy.DESTROY,
        )
        self.monitoring = LauncherMonitoring(
            self,
            "Monitoring",
            name_prefix=prefix,
            state_machine=self.launcher.state_machine,
            topic=self.launcher.topic,
            gpus_per_host=smallest_gpu_count(config.allowed_instance_types),
        )
        arn = self.launcher.state_machine.state_machine_arn
        ssm.StringParameter(
            self,
            "StateMachineArnParameter",
            parameter_name=f"/{prefix}/state-machine-arn",
            string_value=arn,
            description="The job launcher state machine (trainctl submit starts it).",
        )
        CfnOutput(self, "StateMachineArn", value=arn, description="The job launcher state machine")
        CfnOutput(
            self,
            "NotificationTopicArn",
            value=self.launcher.topic.topic_arn,
            description="Training run notifications (success, failure, alarms)",
        )
        CfnOutput(self, "DashboardName", value=self.monitoring.dashboard.dashboard_name)


def smallest_gpu_count(instance_types: list[str] | tuple[str, ...]) -> int:
    """The fewest GPUs on any allowed GPU instance type (1 when none is a GPU type).

    GPUUtilization sums over a host's GPUs, so one alarm threshold must assume a GPU count: the smallest
    never alarms on a fully busy small host; on larger hosts it alarms at a lower per-GPU utilization.
    """
    counts = [spec.accelerators for t in instance_types if (spec := lookup(t)) and spec.kind == "gpu"]
    return min(counts, default=1)
