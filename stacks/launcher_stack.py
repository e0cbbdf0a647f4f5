"""The launcher stack: the job launcher state machine, its notifications, dashboard, alarms and engineers' policy."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from platform_constructs.launcher import JobLauncher
from platform_constructs.monitoring import LauncherMonitoring
from stacks.resources import PlatformResources


class LauncherStack(Stack):
    def __init__(self, scope: Construct, id: str, *, resources: PlatformResources,
                 notification_email: str | None = None,
                 log_retention: logs.RetentionDays = logs.RetentionDays.ONE_YEAR,
                 removal_policy: RemovalPolicy = RemovalPolicy.RETAIN, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        settings = resources.settings
        prefix = settings.name_prefix
        self.launcher = JobLauncher(
            self,
            "JobLauncher",
            name_prefix=prefix,
            key=resources.key,
            execution_role=resources.execution_role,
            settings=settings,
            notification_email=notification_email,
            log_retention=log_retention,
            removal_policy=removal_policy,
        )
        self.monitoring = LauncherMonitoring(
            self,
            "Monitoring",
            name_prefix=prefix,
            state_machine=self.launcher.state_machine,
            topic=self.launcher.topic,
            instance_types=settings.allowed_instance_types,
        )
        self.engineers_policy = self.launcher.add_engineers_policy()
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
        CfnOutput(
            self,
            "EngineersPolicyArn",
            value=self.engineers_policy.managed_policy_arn,
            description="Attach to engineers' roles: what trainctl submit/status/list/logs/stop need",
        )
