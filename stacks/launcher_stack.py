"""The launcher stack: per team the job launcher state machine, its notifications, dashboard, alarms and engineers'
policy; and the platform team's dashboard of every team's jobs."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from jobs.naming import platform_prefix
from platform_constructs.budget import TeamBudget, TeamBudgetProps
from platform_constructs.launcher import JobLauncher, JobLauncherProps
from platform_constructs.monitoring import (
    AllJobsDashboard,
    AllJobsDashboardProps,
    LauncherMonitoring,
    LauncherMonitoringProps,
)
from stacks.resources import PlatformResources, TeamResources


class LauncherStack(Stack):
    """One launcher per team (the default team's at the stack's top, with the ids it always had): its state
    machine, topic, dashboard, engineers' policy (attached to the team's engineer roles, if any) and the SSM
    parameter `/<team prefix>/state-machine-arn` that trainctl reads (`trainctl --prefix <team prefix>`). Every prop
    is required: the defaults are the platform config's (app.py)."""

    def __init__(self, scope: Construct, id: str, *, resources: PlatformResources,
                 notification_email: str | None, notify_refusals: bool, log_retention: logs.RetentionDays,
                 removal_policy: RemovalPolicy,
                 **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        self.launchers: dict[str | None, JobLauncher] = {}
        for team in resources.teams:
            scope_ = self if team.spec.name is None else Construct(self, team.spec.construct_id)
            self.launchers[team.spec.name] = self._team(scope_, team, resources, notification_email,
                                                        notify_refusals, log_retention,
                                                        removal_policy)
        self.launcher = next(iter(self.launchers.values()))
        # The platform team's view of every team's jobs (SageMaker's shared namespace); each team's own dashboard and
        # alarms read only the team's namespace (platform_constructs.monitoring).
        every = AllJobsDashboard(self, "AllJobs", AllJobsDashboardProps(
            name_prefix=platform_prefix(self.launcher.name_prefix)))
        CfnOutput(self, "AllJobsDashboardName", value=every.dashboard.dashboard_name,
                  description="Every team's training jobs, for the platform team")

    def _team(self, scope: Construct, team: TeamResources, resources: PlatformResources,
              notification_email: str | None, notify_refusals: bool, log_retention: logs.RetentionDays,
              removal_policy: RemovalPolicy) -> JobLauncher:
        settings = team.settings
        prefix = settings.name_prefix
        launcher = JobLauncher(scope, "JobLauncher", JobLauncherProps(
            name_prefix=prefix,
            key=resources.key,
            execution_role=team.execution_role,
            settings=settings,
            notification_email=notification_email,
            notify_refusals=notify_refusals,
            log_retention=log_retention,
            role_path=resources.role_path,
            removal_policy=removal_policy,
        ))
        monitoring = LauncherMonitoring(scope, "Monitoring", LauncherMonitoringProps(
            name_prefix=prefix,
            state_machine=launcher.state_machine,
            topic=launcher.topic,
        ))
        if team.spec.monthly_budget_usd:
            TeamBudget(scope, "Budget", TeamBudgetProps(name_prefix=prefix, monthly_usd=team.spec.monthly_budget_usd,
                                                        tags=dict(team.spec.job_tags), topic=launcher.topic))
        policy = launcher.add_engineers_policy()
        for i, arn in enumerate(team.spec.engineer_roles):
            policy.attach_to_role(iam.Role.from_role_arn(scope, f"Engineers{i}", arn, mutable=False))
        arn = launcher.state_machine.state_machine_arn
        ssm.StringParameter(
            scope,
            "StateMachineArnParameter",
            parameter_name=f"/{prefix}/state-machine-arn",
            string_value=arn,
            description="The job launcher state machine (trainctl submit starts it).",
        )
        CfnOutput(scope, "StateMachineArn", value=arn, description="The job launcher state machine")
        CfnOutput(
            scope,
            "NotificationTopicArn",
            value=launcher.topic.topic_arn,
            description="Training run notifications (success, failure, alarms)",
        )
        CfnOutput(scope, "DashboardName", value=monitoring.dashboard.dashboard_name)
        CfnOutput(
            scope,
            "EngineersPolicyArn",
            value=policy.managed_policy_arn,
            description=f"Attach to {prefix} engineers' roles: what trainctl submit/status/list/logs/stop need",
        )
        return launcher
