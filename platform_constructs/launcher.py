"""JobLauncher: the Step Functions state machine that launches SageMaker training jobs and retries them.

The parts live in their own modules: the Lambda functions (launcher_functions), the definition
(launcher_definition), the raw-ASL Launch state and its IAM (launch_task), and what engineers may do with
the launcher (engineer_access: grant_submit, grant_observe, the engineers' managed policy).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from jobs.handler import ENDED_EXECUTION
from jobs.naming import MAX_NAME_PREFIX, NAME_PREFIX, jobs_named, run_id_tag_key
from jobs.platform import PlatformSettings
from platform_constructs import engineer_access
from platform_constructs.launch_task import LaunchTrainingJob, LaunchTrainingJobProps
from platform_constructs.launcher_definition import LauncherDefinition, LauncherDefinitionProps
from platform_constructs.launcher_functions import (
    INLINE_POLICY_REASON,
    REAPER,
    STATE_MACHINE_HANDLERS,
    LauncherFunctions,
    LauncherFunctionsProps,
    reserved_concurrency_problem,
)
from platform_constructs.nag import acknowledge, nag_form
from platform_constructs.run_registry import RunRegistry, RunRegistryProps


@dataclass(frozen=True, kw_only=True)
class JobLauncherProps:
    name_prefix: str
    """Starts every name the launcher gives (its jobs `<name_prefix>-*`, its state machine, topic, table): 1 to
    MAX_NAME_PREFIX letters, digits and inner hyphens (jobs.naming.NAME_PREFIX)."""
    key: kms.IKey
    """The platform key: the topic, log groups, the functions' environment, the registry table."""
    execution_role: iam.IRole
    """The SageMaker execution role the state machine passes to its jobs (the only role it may pass)."""
    settings: PlatformSettings | Mapping[str, Any]
    """The platform settings document (tokens allowed), which reaches every function as JSON."""
    log_retention: logs.RetentionDays
    """How long the state machine's and the functions' log groups keep their events."""
    notification_email: str | None = None
    """An address subscribed to the notifications topic. @default None: no subscription"""
    notify_refusals: bool = False
    """Whether requests Prepare refuses (RequestInvalid) are also published to the topic. @default False: only whoever
    started the execution sees them (trainctl prints the refusal; the console shows the cause)"""
    lambda_reserved_concurrency: int | None = None
    """Each function's reserved concurrency, 1 or more. @default None: unreserved"""
    role_path: str = "/"
    """The IAM path of every role the launcher creates (the path the platform key lets use it). @default '/'"""
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    """What deleting the stack does to the log groups, the queue and the registry table. @default RETAIN"""

    def __post_init__(self) -> None:
        if not re.fullmatch(NAME_PREFIX, self.name_prefix) or len(self.name_prefix) > MAX_NAME_PREFIX:
            raise ValueError(
                f"name_prefix {self.name_prefix!r}: use 1 to 20 letters, digits and inner hyphens "
                "(it starts every training job name, which SageMaker caps at 63 characters)"
            )
        if problem := reserved_concurrency_problem(self.lambda_reserved_concurrency):
            raise ValueError(f"lambda_reserved_concurrency={self.lambda_reserved_concurrency}: {problem}")


class JobLauncher(Construct):
    """The job launcher state machine, its three Lambda functions and its notification topic.

    The state machine role may create, describe, stop and tag only training jobs whose names start with
    `name_prefix-` (create, describe and stop: only those carrying the `<name_prefix>:run-id` tag), and may pass
    only `execution_role`, only to SageMaker. `settings` (the platform settings document; tokens allowed) reaches
    every function as JSON. Every role it creates is under `role_path`, the path the platform key lets use it.
    """

    def __init__(self, scope: Construct, id: str, props: JobLauncherProps) -> None:
        super().__init__(scope, id)
        name_prefix, key, settings = props.name_prefix, props.key, props.settings
        log_retention, role_path, removal_policy = props.log_retention, props.role_path, props.removal_policy
        stack = Stack.of(self)
        self.name_prefix = name_prefix
        self.state_machine_name = f"{name_prefix}-job-launcher"
        self.key = key
        self.training_job_arn_pattern = stack.format_arn(
            service="sagemaker", resource="training-job", resource_name=jobs_named(name_prefix)
        )
        # The tag key only this launcher writes on its jobs: `<prefix>-*` also matches the jobs of a platform named
        # `<prefix>-dev`; the tag does not (platform_constructs.teams).
        self.run_id_tag_key = run_id_tag_key(name_prefix)
        self.topic = self._topic(props.notification_email)

        document = settings.to_dict() if isinstance(settings, PlatformSettings) else dict(settings)
        # Id "Default": the functions keep the logical ids they had as direct children of the launcher.
        self.lambdas = LauncherFunctions(self, "Default", LauncherFunctionsProps(
            name_prefix=name_prefix, settings_json=stack.to_json_string(document),
            encryption_key=key, training_job_arn_pattern=self.training_job_arn_pattern,
            log_retention=log_retention, reserved_concurrency=props.lambda_reserved_concurrency,
            role_path=role_path, removal_policy=removal_policy))
        self.functions = self.lambdas.functions

        # The vendedlogs prefix keeps the log group's resource policy small (Step Functions' advice).
        self.log_group = logs.LogGroup(self, "ExecutionLogs", log_group_name=f"/aws/vendedlogs/states/"
                                       f"{self.state_machine_name}", encryption_key=key, retention=log_retention,
                                       removal_policy=removal_policy)
        launch = LaunchTrainingJob(self, "Launch", LaunchTrainingJobProps(
            training_job_arn_pattern=self.training_job_arn_pattern, run_id_tag_key=self.run_id_tag_key,
            execution_role=props.execution_role, encryption_key=key, subnet_ids=document["subnet_ids"],
            security_group_ids=document["security_group_ids"], job_tags=document.get("job_tags") or {}))
        self.definition = LauncherDefinition(self, "Definition", LauncherDefinitionProps(
            functions=self.lambdas.versions, launch=launch, topic=self.topic,
            state_machine_arn=engineer_access.state_machine_arn(self), notify_refusals=props.notify_refusals))
        # Its own role, under role_path: it publishes to the key-encrypted topic, and the key lets only roles
        # under that path use it (platform_constructs.encryption).
        role = iam.Role(self, "StateMachineRole", assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
                        path=role_path, description=f"{name_prefix} job launcher state machine")
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=self.state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(self.definition.start),
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            tracing_enabled=True,
            role=role,
            comment="Launches a SageMaker training job from a job request; retries resume from checkpoints.",
        )
        launch.grant_launch(role)
        # Every version of each function, not only this deploy's: an execution calls the versions it started with,
        # and one started before a deploy runs on after it (for days), as one started before versions did
        # (unqualified; jobs.handler.STATE_SHAPE).
        for name in STATE_MACHINE_HANDLERS:
            self.functions[name].grant_invoke(role)
        key.grant(role, "kms:Decrypt", "kms:GenerateDataKey*")
        self._acknowledge_state_machine_role()
        self.registry = self._registry(removal_policy)
        self.execution_ended = self._reaper_rule()
        self.reaper_failed_alarm = self._reaper_failed_alarm()

    def _registry(self, removal_policy: RemovalPolicy) -> RunRegistry:
        """The run registry (jobs.registry): every function writes it; Prepare takes a run over only from an
        execution that ended (DescribeExecution), the reaper finds an ended execution's run in its history. The
        executions' ARN is written from the state machine's name (engineer_access.executions_arn): the state
        machine's own ARN would make a cycle (it invokes these functions)."""
        registry = RunRegistry(self, "Runs", RunRegistryProps(name_prefix=self.name_prefix, key=self.key,
                                                              removal_policy=removal_policy))
        executions = engineer_access.executions_arn(self)
        for function in self.functions.values():
            registry.grant_write(function)
        # Prepare and the reaper ask whether an owner (or a named successor) has ended; Decide counts its execution's
        # events (a run nearing the history limit goes on in a new execution); the reaper finds an execution's run.
        for name, actions in (("prepare", ["states:DescribeExecution"]), ("decide", ["states:GetExecutionHistory"]),
                              (REAPER, ["states:DescribeExecution", "states:GetExecutionHistory"])):
            self.functions[name].add_to_role_policy(iam.PolicyStatement(actions=actions, resources=[executions]))
        for name in ("prepare", "decide", REAPER):
            acknowledge(self.functions[name].role, f"AwsSolutions-IAM5[Resource::{nag_form(self, executions)}]",
                        "The launcher's own executions (its state machine's name, then any execution name): the "
                        "execution that held a run is known only at run time.")
        return registry

    def _reaper_rule(self) -> events.Rule:
        """Whatever ends an execution (Summarize, a console stop, StopExecution from code, a failure no Catch takes,
        a timeout), EventBridge invokes the reaper with the status change: it stops the run's jobs that still run
        and lets the run go (jobs.handler.reap). Lambda retries a failed event twice, then keeps it in the
        reaper's dead-letter queue."""
        return events.Rule(
            self, "ExecutionEnded",
            description=f"{self.state_machine_name}: an execution ended; stop its run's jobs",
            event_pattern=events.EventPattern(
                source=["aws.states"], detail_type=["Step Functions Execution Status Change"],
                detail={"status": list(ENDED_EXECUTION), "stateMachineArn": [self.state_machine.state_machine_arn]}),
            targets=[targets.LambdaFunction(self.functions[REAPER], max_event_age=Duration.hours(24),
                                            retry_attempts=185)],
        )

    def _reaper_failed_alarm(self) -> cloudwatch.Alarm:
        """An ended execution whose jobs the reaper could not stop, past Lambda's retries: its event waits in the
        dead-letter queue, and a job may still bill. The team's topic is told."""
        queue = self.lambdas.reaper_dead_letters
        alarm = cloudwatch.Alarm(
            self, "ReapFailed", alarm_name=f"{self.state_machine_name}-reap-failed",
            alarm_description=(
                "An execution ended and the reaper could not stop its run's jobs (after Lambda's retries). The event "
                f"is in the dead-letter queue {queue.queue_name}: its detail.executionArn names the execution; "
                "`trainctl status EXECUTION` lists its jobs, stop any still running, then delete the message."),
            metric=queue.metric_approximate_number_of_messages_visible(period=Duration.minutes(5),
                                                                       statistic="Maximum"),
            threshold=1, evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING)
        action = cloudwatch_actions.SnsAction(self.topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)
        return alarm

    def _topic(self, notification_email: str | None) -> sns.Topic:
        topic = sns.Topic(self, "Notifications", topic_name=f"{self.name_prefix}-training-notifications",
                          display_name=f"{self.name_prefix} training jobs", master_key=self.key, enforce_ssl=True)
        if notification_email:
            topic.add_subscription(subscriptions.EmailSubscription(notification_email))
        return topic

    # ------------------------------------------------------------------------------- engineers' access

    def grant_submit(self, grantee: iam.IGrantable) -> iam.Grant:
        """What `trainctl submit` and `trainctl stop` need: find the launcher (SSM), start an execution, stop
        an execution and the training job it runs. Combine with grant_observe for status and logs."""
        return engineer_access.grant_submit(self, grantee)

    def grant_observe(self, grantee: iam.IGrantable) -> iam.Grant:
        """What `trainctl status`, `list` and `logs` need: read the launcher's executions and history, describe
        the platform's training jobs, read their log streams, read the platform's SSM parameters."""
        return engineer_access.grant_observe(self, grantee)

    def add_engineers_policy(self, id: str = "EngineersPolicy", *,
                             managed_policy_name: str | None = None) -> iam.ManagedPolicy:
        """A customer-managed policy holding grant_submit and grant_observe, to attach to engineers' roles;
        named `<name_prefix>-engineers` unless `managed_policy_name` says otherwise."""
        return engineer_access.engineers_policy(self, id, managed_policy_name or f"{self.name_prefix}-engineers")

    # ------------------------------------------------------------------------------------- permissions

    def _acknowledge_state_machine_role(self) -> None:
        role = self.state_machine.role
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::{nag_form(self, self.training_job_arn_pattern)}]",
            "Create/Describe/Stop/AddTags/ListTags are scoped to the platform's own jobs "
            f"({jobs_named(self.name_prefix)}): every attempt gets a fresh generated name, so a name prefix is the "
            "narrowest resource.",
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray and CloudWatch Logs delivery actions (added by the CDK for tracing and logging) "
            "support no resource-level permissions.",
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
            "Publishing to the KMS-encrypted notification topic needs GenerateDataKey* on the "
            "platform key (that key only).",
        )
        acknowledge(role, "NIST.800.53.R5-IAMNoInlinePolicy", INLINE_POLICY_REASON)
        for name, function in self.functions.items():
            acknowledge(
                role,
                f"AwsSolutions-IAM5[Resource::{nag_form(self, function.function_arn)}:*]",
                f"Invoking the {name} function and its versions (<arn>:*): an execution calls the version it "
                "started with; no other function.",
            )
