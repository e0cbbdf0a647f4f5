"""JobLauncher: the Step Functions state machine that launches SageMaker training jobs and retries them.

    Prepare (Lambda jobs.handler.prepare) --RequestInvalid--> ParseRequestError -> RequestInvalid (Fail)
      |
    Launch (sagemaker:createTrainingJob.sync) --any error--> Decide (Lambda jobs.handler.decide)
      |                                                        |   (its own fault: DecideFailed -> Summarize)
      |                        retry: Backoff (Wait) -> NextAttempt (Pass) -> Launch
      |                        fail:  |
    Summarize (Lambda jobs.handler.summarize) <----------------+
      |
    Notify (SNS) -> Outcome? -> Summary -> Succeeded (output: the summary)
                             -> Failed (error: the category, cause: the reason)

Every decision (classify the failure, pick the next instance type, wait, give up) is made by the `jobs`
package inside the Lambda functions, so the same code is unit-tested, used by `trainctl`, and executed
here. The definition only moves the state object between them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aws_cdk import Aws, Duration, IgnoreMode, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from jobs.render import CREATE_REQUEST_KEYS
from platform_constructs.nag import acknowledge, nag_form

REPO_ROOT = Path(__file__).resolve().parents[1]

# Step Functions creates and uses this EventBridge rule to learn when a `.sync` training job ends.
SYNC_EVENTS_RULE = "StepFunctionsGetEventsForSageMakerTrainingJobsRule"

# The Lambda code is the `jobs/` package and nothing else (standard library + the runtime's boto3).
# Patterns are .dockerignore style, evaluated against the repository root: ignore everything, then
# re-include jobs/, then drop byte code.
LAMBDA_CODE_EXCLUDE = ["*", "!jobs", "!jobs/**", "**/__pycache__", "**/*.pyc", "**/.*"]

HANDLERS = ("prepare", "decide", "summarize")


INLINE_POLICY_REASON = (
    "The CDK's grants write this role's least-privilege statements into a policy attached to this role only "
    "(its DefaultPolicy); a separately managed policy would hold the same statements."
)


class JobLauncher(Construct):
    """The job launcher state machine, its three Lambda functions and its notification topic.

    The state machine role may create, describe, stop and tag only training jobs whose names start with
    `name_prefix-`, and may pass only `execution_role`, only to SageMaker.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        name_prefix: str,
        key: kms.IKey,
        execution_role: iam.IRole,
        settings: dict[str, Any],
        notification_email: str | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        lambda_reserved_concurrency: int | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        if not re.fullmatch(r"[A-Za-z0-9](-*[A-Za-z0-9]){0,19}", name_prefix):
            raise ValueError(
                f"name_prefix {name_prefix!r}: use 1 to 20 letters, digits and inner hyphens "
                "(it starts every training job name, which SageMaker caps at 63 characters)"
            )
        stack = Stack.of(self)
        self.name_prefix = name_prefix
        self.key = key
        self.training_job_arn_pattern = stack.format_arn(
            service="sagemaker", resource="training-job", resource_name=f"{name_prefix}-*"
        )

        self.topic = sns.Topic(
            self,
            "Notifications",
            topic_name=f"{name_prefix}-training-notifications",
            display_name=f"{name_prefix} training jobs",
            master_key=key,
            enforce_ssl=True,
        )
        if notification_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(notification_email))

        settings_json = stack.to_json_string(settings)
        self.code = lambda_.Code.from_asset(
            str(REPO_ROOT), exclude=LAMBDA_CODE_EXCLUDE, ignore_mode=IgnoreMode.DOCKER
        )
        self.functions = {
            name: self._handler_function(
                name, settings_json, log_retention, lambda_reserved_concurrency, removal_policy
            )
            for name in HANDLERS
        }
        # The decide function looks a job up when a failure's Cause is not its description.
        self.functions["decide"].add_to_role_policy(
            iam.PolicyStatement(
                actions=["sagemaker:DescribeTrainingJob"], resources=[self.training_job_arn_pattern]
            )
        )
        acknowledge(
            self.functions["decide"].role,
            f"AwsSolutions-IAM5[Resource::{self._nag_training_job_arn}]",
            f"DescribeTrainingJob is scoped to the platform's own jobs ({name_prefix}-*): job names are "
            "generated per attempt, so a name prefix is the narrowest resource that fits.",
        )

        self.log_group = logs.LogGroup(
            self,
            "ExecutionLogs",
            # The vendedlogs prefix keeps the log group's resource policy small (Step Functions' advice).
            log_group_name=f"/aws/vendedlogs/states/{name_prefix}-job-launcher",
            encryption_key=key,
            retention=log_retention,
            removal_policy=removal_policy,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=f"{name_prefix}-job-launcher",
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_chainable(self._definition()),
            logs=sfn.LogOptions(
                destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True
            ),
            tracing_enabled=True,
            comment="Launches a SageMaker training job from a job request; retries resume from checkpoints.",
        )
        self._grant_training_jobs(self.state_machine.role, execution_role)
        key.grant(self.state_machine.role, "kms:Decrypt", "kms:GenerateDataKey*")
        self._acknowledge_state_machine_role()

    # ----------------------------------------------------------------------------------------- Lambdas

    def _handler_function(
        self,
        name: str,
        settings_json: str,
        log_retention: logs.RetentionDays,
        reserved_concurrency: int | None,
        removal_policy: RemovalPolicy,
    ) -> lambda_.Function:
        title = name.capitalize()
        log_group = logs.LogGroup(
            self,
            f"{title}Logs",
            encryption_key=self.key,
            retention=log_retention,
            removal_policy=removal_policy,
        )
        # A role per function, written out, instead of the AWSLambdaBasicExecutionRole managed policy.
        role = iam.Role(
            self,
            f"{title}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{self.name_prefix} job launcher: the {name} function",
        )
        log_group.grant_write(role)
        function = lambda_.Function(
            self,
            f"{title}Function",
            description=f"{self.name_prefix} job launcher: jobs.handler.{name}",
            runtime=lambda_.Runtime.PYTHON_3_12,
            architecture=lambda_.Architecture.ARM_64,
            handler=f"jobs.handler.{name}",
            code=self.code,
            environment={"PLATFORM_SETTINGS": settings_json},
            environment_encryption=self.key,
            role=role,
            log_group=log_group,
            memory_size=256,
            timeout=Duration.seconds(60),
            tracing=lambda_.Tracing.ACTIVE,
            reserved_concurrent_executions=reserved_concurrency,
        )
        self.key.grant_decrypt(role)
        acknowledge(role, "NIST.800.53.R5-IAMNoInlinePolicy", INLINE_POLICY_REASON)
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray PutTraceSegments/PutTelemetryRecords support no resource-level permissions.",
        )
        acknowledge(
            function,
            "NIST.800.53.R5-LambdaInsideVPC",
            "The function reaches nothing inside the VPC (only decide calls an AWS API, SageMaker "
            "DescribeTrainingJob); it handles job requests and job descriptions, never training data.",
        )
        acknowledge(
            function,
            "NIST.800.53.R5-LambdaDLQ",
            "Invoked synchronously by Step Functions, which retries and catches its errors; a DLQ "
            "applies only to asynchronous invocations.",
        )
        acknowledge(
            function,
            "AwsSolutions-L1",
            "Python 3.12 is the runtime the jobs package is written and tested for (fixed contract).",
        )
        if reserved_concurrency is None:
            acknowledge(
                function,
                "NIST.800.53.R5-LambdaConcurrency",
                "Each execution calls each function at most once at a time. Reserving concurrency "
                "would take from the account's unreserved pool (minimum 10) and fail deploys in "
                "new accounts; set lambda_reserved_concurrency to reserve it.",
            )
        return function

    # -------------------------------------------------------------------------------------- definition

    def _invoke(
        self, id: str, name: str, payload: dict[str, Any] | None = None, result_path: str | None = None
    ) -> tasks.LambdaInvoke:
        return tasks.LambdaInvoke(
            self,
            id,
            lambda_function=self.functions[name],
            payload=sfn.TaskInput.from_object(payload) if payload else None,
            # The handler's return value is the state (no Lambda response envelope around it).
            payload_response_only=True,
            retry_on_service_exceptions=True,
            result_path=result_path,
        )

    def _definition(self) -> sfn.IChainable:
        prepare = self._invoke(
            "Prepare",
            "prepare",
            {
                "request": sfn.JsonPath.entire_payload,
                "execution": {
                    "name": sfn.JsonPath.execution_name,
                    "start_time": sfn.JsonPath.string_at("$$.Execution.StartTime"),
                },
            },
        )
        # The Lambda error's Cause is the JSON {errorMessage, errorType, ...};
        # the Fail state shows the message,
        # one "field.path: problem" line per problem.
        parse_error = sfn.Pass(
            self,
            "ParseRequestError",
            parameters={
                "error.$": "States.StringToJson($.error.Cause)",
            },
        )
        request_invalid = sfn.Fail(
            self, "RequestInvalid", error="RequestInvalid", cause_path="$.error.errorMessage"
        )
        prepare.add_catch(parse_error.next(request_invalid), errors=["RequestInvalid"], result_path="$.error")

        launch = sfn.CustomState(
            self,
            "Launch",
            state_json={
                "Type": "Task",
                # The CDK's SageMakerCreateTrainingJob task cannot send CheckpointConfig, Spot, RetryStrategy,
                # InstanceGroups, TrainingPlanArn, FSx channels...: state the integration directly.
                "Resource": f"arn:{Aws.PARTITION}:states:::sagemaker:createTrainingJob.sync",
                "Parameters": {f"{key}.$": f"$.create.{key}" for key in CREATE_REQUEST_KEYS},
                "ResultPath": "$.job",
            },
        )
        decide = self._invoke(
            "Decide",
            "decide",
            {
                "run": sfn.JsonPath.object_at("$.run"),
                "create": sfn.JsonPath.object_at("$.create"),
                "failure": sfn.JsonPath.object_at("$.failure"),
            },
        )
        launch.add_catch(decide, errors=["States.ALL"], result_path="$.failure")

        backoff = sfn.Wait(self, "Backoff", time=sfn.WaitTime.seconds_path("$.decision.wait_seconds"))
        # Drop the last decision so that Summarize sees either `job` (success) or `decision` (failure).
        next_attempt = sfn.Pass(
            self,
            "NextAttempt",
            parameters={
                "run.$": "$.run",
                "create.$": "$.create",
            },
        )

        summarize = self._invoke("Summarize", "summarize", result_path="$.result")
        notify = tasks.SnsPublish(
            self,
            "Notify",
            topic=self.topic,
            subject=sfn.JsonPath.string_at("$.result.subject"),
            message=sfn.TaskInput.from_json_path_at("$.result.message"),
            result_path=sfn.JsonPath.DISCARD,
        )
        outcome = sfn.Choice(self, "Outcome")
        # The execution's output is the summary: a Pass selects it (cfn-lint's schema gives Succeed no paths).
        succeeded = sfn.Pass(self, "Summary", input_path="$.result.summary").next(
            sfn.Succeed(self, "Succeeded")
        )
        failed = sfn.Fail(self, "Failed", error_path="$.decision.category", cause_path="$.decision.reason")
        # A notification that cannot be sent must not hide the job's outcome.
        notify.add_catch(outcome, errors=["States.ALL"], result_path="$.notify_error")

        retry_or_fail = (
            sfn.Choice(self, "RetryOrFail")
            .when(
                sfn.Condition.string_equals("$.decision.action", "retry"),
                backoff.next(next_attempt).next(launch),
            )
            .otherwise(summarize)
        )
        decide.next(retry_or_fail)
        # A fault in the decide function itself must still end in a summary and a notification.
        decide_failed = sfn.Pass(
            self,
            "DecideFailed",
            parameters={
                "run.$": "$.run",
                "create.$": "$.create",
                "decision": {
                    "action": "fail",
                    "wait_seconds": 0,
                    "category": "launcher_error",
                    "reason.$": "States.Format('the decide function failed ({}): {}', $.decide_error.Error, "
                    "$.decide_error.Cause)",
                },
            },
        )
        decide.add_catch(decide_failed.next(summarize), errors=["States.ALL"], result_path="$.decide_error")
        return (
            prepare.next(launch)
            .next(summarize)
            .next(notify)
            .next(
                outcome.when(sfn.Condition.boolean_equals("$.result.succeeded", True), succeeded).otherwise(
                    failed
                )
            )
        )

    # ------------------------------------------------------------------------------------- permissions

    def _grant_training_jobs(self, role: iam.IRole, execution_role: iam.IRole) -> None:
        stack = Stack.of(self)
        # The actions of the policy Step Functions itself generates for createTrainingJob.sync (which grants
        # ListTags on "*"), plus AddTags for the request's Tags, all scoped to the platform's job names.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="TrainingJobsUnderThePrefix",
                actions=[
                    "sagemaker:CreateTrainingJob",
                    "sagemaker:DescribeTrainingJob",
                    "sagemaker:StopTrainingJob",
                    "sagemaker:AddTags",
                    "sagemaker:ListTags",
                ],
                resources=[self.training_job_arn_pattern],
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="PassTheExecutionRoleToSageMaker",
                actions=["iam:PassRole"],
                resources=[execution_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="SyncIntegrationEventsRule",
                actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                resources=[
                    stack.format_arn(service="events", resource="rule", resource_name=SYNC_EVENTS_RULE)
                ],
            )
        )
        # SageMaker creates grants on the platform key for the job's encrypted volumes, for the caller.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="EncryptedTrainingVolumes",
                actions=["kms:CreateGrant", "kms:DescribeKey"],
                resources=[self.key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}},
            )
        )

    @property
    def _nag_training_job_arn(self) -> str:
        return nag_form(self, self.training_job_arn_pattern)

    def _acknowledge_state_machine_role(self) -> None:
        role = self.state_machine.role
        acknowledge(
            role,
            f"AwsSolutions-IAM5[Resource::{self._nag_training_job_arn}]",
            "Create/Describe/Stop/AddTags/ListTags are scoped to the platform's own jobs "
            f"({self.name_prefix}-*): every attempt gets a fresh generated name, so a name prefix is the "
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
                f"The CDK's LambdaInvoke grants the {name} function and its versions (<arn>:*); "
                "no other function.",
            )
