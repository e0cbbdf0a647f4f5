"""The job launcher's Lambda functions (jobs.handler.prepare, decide, relaunch, summarize, reap) and their roles."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration, IgnoreMode, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from jobs.naming import jobs_named
from platform_constructs.nag import acknowledge, nag_form

REPO_ROOT = Path(__file__).resolve().parents[1]

# The Lambda code is the `jobs/` package and the `contract/` facts it reads, nothing else (standard library
# + the runtime's boto3). Patterns are .dockerignore style, evaluated against the repository root: ignore
# everything, re-include the two packages, then drop byte code and dot files.
LAMBDA_CODE_EXCLUDE = ["*", "!jobs", "!jobs/**", "!contract", "!contract/**", "**/__pycache__", "**/*.pyc", "**/.*"]

# The state machine's four, and the reaper that the execution-status rule invokes when an execution ends.
STATE_MACHINE_HANDLERS = ("prepare", "decide", "relaunch", "summarize")
REAPER = "reap"
HANDLERS = (*STATE_MACHINE_HANDLERS, REAPER)
# How long a reaper's event that kept failing stays in its dead-letter queue (SQS's longest).
DEAD_LETTER_RETENTION_DAYS = 14
# What each function may do to the platform's training jobs: prepare describes a resumed run's earlier jobs;
# decide looks up whether a failed launch left a job running; summarize and reap also stop the run's jobs that
# still run when its execution ends.
SAGEMAKER_ACTIONS = {
    "prepare": ("sagemaker:DescribeTrainingJob",),
    "decide": ("sagemaker:DescribeTrainingJob",),
    "summarize": ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"),
    "reap": ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"),
}
# Who lists training jobs (no resource-level permissions): prepare finds a resumed run's earlier jobs, summarize and
# reap every running job carrying the run's marker (one whose create answered an error may show up late).
LISTING = ("prepare", "summarize", "reap")
# Who asks the Price List API: the two that launch an attempt (its MLflow run's cost) and summarize (the run's record).
PRICING = ("prepare", "relaunch", "summarize")

INLINE_POLICY_REASON = (
    "The CDK's grants write this role's least-privilege statements into a policy attached to this role only "
    "(its DefaultPolicy); a separately managed policy would hold the same statements."
)


def reserved_concurrency_problem(reserved: int | None) -> str | None:
    """What a reserved concurrency must be, or None when it is one Lambda takes (None: unreserved)."""
    return None if reserved is None or reserved >= 1 else "use 1 or more, or None to leave concurrency unreserved"


@dataclass(frozen=True, kw_only=True)
class LauncherFunctionsProps:
    name_prefix: str
    """The launcher's prefix, in the functions' and roles' descriptions."""
    settings_json: str
    """The platform settings document as JSON (tokens allowed: Stack.to_json_string), each function's
    PLATFORM_SETTINGS."""
    encryption_key: kms.IKey
    """The platform key: the functions' environment, log groups and the reaper's dead-letter queue."""
    training_job_arn_pattern: str
    """The training jobs the functions may describe (and summarize and reap stop)."""
    log_retention: logs.RetentionDays
    """How long each function's log group keeps its events."""
    reserved_concurrency: int | None = None
    """Each function's reserved concurrency, 1 or more. @default None: unreserved"""
    role_path: str = "/"
    """The IAM path of the functions' roles (the path the platform key lets use it). @default '/'"""
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    """What deleting the stack does to the log groups and the dead-letter queue. @default RETAIN"""

    def __post_init__(self) -> None:
        if problem := reserved_concurrency_problem(self.reserved_concurrency):
            raise ValueError(f"reserved_concurrency={self.reserved_concurrency}: {problem}")


class LauncherFunctions(Construct):
    """One function per handler (HANDLERS), each with its own role (no AWSLambdaBasicExecutionRole), an encrypted log
    group, X-Ray tracing, and the platform settings (JSON) in PLATFORM_SETTINGS.

    `decide` may describe the training jobs matching `training_job_arn_pattern` (whether a failed launch left
    a job running), nothing else; `relaunch` (the next attempt's request, after the wait) calls no SageMaker API; `summarize` may describe and stop them (a run that ends stops the job it
    left running) and read public prices (the run's cost), nothing else; `prepare` may list training jobs and
    describe the platform's (a request that resumes a run or starts from one: its jobs), nothing else.
    """

    def __init__(self, scope: Construct, id: str, props: LauncherFunctionsProps) -> None:
        super().__init__(scope, id)
        name_prefix, training_job_arn_pattern = props.name_prefix, props.training_job_arn_pattern
        self.role_path = props.role_path
        self.name_prefix = name_prefix
        self.key = props.encryption_key
        self.code = lambda_.Code.from_asset(str(REPO_ROOT), exclude=LAMBDA_CODE_EXCLUDE,
                                            ignore_mode=IgnoreMode.DOCKER)
        self.functions = {
            name: self._function(name, props.settings_json, props.log_retention, props.reserved_concurrency,
                                 props.removal_policy)
            for name in HANDLERS
        }
        for name, actions in SAGEMAKER_ACTIONS.items():
            self.functions[name].add_to_role_policy(iam.PolicyStatement(
                actions=list(actions), resources=[training_job_arn_pattern]))
            acknowledge(
                self.functions[name].role,
                f"AwsSolutions-IAM5[Resource::{nag_form(self, training_job_arn_pattern)}]",
                f"{' and '.join(a.split(':')[1] for a in actions)} scoped to the platform's own jobs "
                f"({jobs_named(name_prefix)}): job names are generated per attempt, so a name prefix is the narrowest "
                "resource that fits.",
            )
        for name in LISTING:
            self.functions[name].add_to_role_policy(iam.PolicyStatement(
                actions=["sagemaker:ListTrainingJobs"], resources=["*"]))
        # The run's record prices its instance-hours, and a launch prices its attempt for the MLflow run's cost
        # (jobs.handler.training_prices: the AWS Price List API, public prices); GetProducts has no resource-level
        # permissions either.
        for name in PRICING:
            self.functions[name].add_to_role_policy(iam.PolicyStatement(
                actions=["pricing:GetProducts"], resources=["*"]))

    def __getitem__(self, name: str) -> lambda_.Function:
        return self.functions[name]

    @property
    def versions(self) -> dict[str, lambda_.IVersion]:
        """Each state machine function's version of this deploy: what the state machine's definition invokes."""
        return {name: self.functions[name].current_version for name in STATE_MACHINE_HANDLERS}

    def _function(self, name: str, settings_json: str, log_retention: logs.RetentionDays,
                  reserved_concurrency: int | None, removal_policy: RemovalPolicy) -> lambda_.Function:
        title = name.capitalize()
        log_group = logs.LogGroup(self, f"{title}Logs", encryption_key=self.key, retention=log_retention,
                                  removal_policy=removal_policy)
        # A role per function, written out, instead of the AWSLambdaBasicExecutionRole managed policy.
        # Under role_path: the platform key lets only roles under it decrypt (the function's environment).
        role = iam.Role(self, f"{title}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description=f"{self.name_prefix} job launcher: the {name} function", path=self.role_path)
        log_group.grant_write(role)
        dead_letters = self._dead_letters(role, removal_policy) if name == REAPER else None
        function = lambda_.Function(
            self, f"{title}Function",
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
            # The reaper is invoked asynchronously (EventBridge): an event it failed on, after Lambda's own retries,
            # is kept for an operator rather than dropped.
            dead_letter_queue=dead_letters,
            # A version per deploy that changes the code or the settings, kept: an execution keeps the definition
            # it started with, which calls the versions deployed with it (`versions`), never newer code that
            # expects another shape of the state. Deleting the function deletes its versions.
            current_version_options=lambda_.VersionOptions(removal_policy=RemovalPolicy.RETAIN),
        )
        self.key.grant_decrypt(role)
        _acknowledge(name, role, function, reserved_concurrency)
        return function

    def _dead_letters(self, role: iam.Role, removal_policy: RemovalPolicy) -> sqs.Queue:
        queue = sqs.Queue(self, "ReapDeadLetters", encryption=sqs.QueueEncryption.KMS, encryption_master_key=self.key,
                          enforce_ssl=True, retention_period=Duration.days(DEAD_LETTER_RETENTION_DAYS),
                          removal_policy=removal_policy)
        self.key.grant(role, "kms:GenerateDataKey", "kms:Decrypt")
        acknowledge(queue, "AwsSolutions-SQS3", "This queue is the reaper function's dead-letter queue itself.")
        self.reaper_dead_letters = queue
        return queue


def _acknowledge(name: str, role: iam.Role, function: lambda_.Function, reserved_concurrency: int | None) -> None:
    acknowledge(role, "NIST.800.53.R5-IAMNoInlinePolicy", INLINE_POLICY_REASON)
    listing = {"prepare": " and SageMaker ListTrainingJobs (finding a resumed run's earlier jobs)",
               "summarize": ", SageMaker ListTrainingJobs (the run's running jobs) and the Price List API's "
                            "GetProducts (public prices, for the run's cost)",
               "reap": " and SageMaker ListTrainingJobs (the run's running jobs)"}.get(name, "")
    acknowledge(role, "AwsSolutions-IAM5[Resource::*]",
                f"X-Ray PutTraceSegments/PutTelemetryRecords{listing} support no resource-level permissions.")
    acknowledge(function, "NIST.800.53.R5-LambdaInsideVPC",
                "The function reaches nothing inside the VPC (it calls SageMaker's ListTrainingJobs, "
                "DescribeTrainingJob and StopTrainingJob, the Price List API, the launcher's run registry table and "
                "its executions' status, only); it handles job requests and job descriptions, never training data.")
    if name != REAPER:
        acknowledge(function, "NIST.800.53.R5-LambdaDLQ",
                    "Invoked synchronously by Step Functions, which retries and catches its errors; a DLQ "
                    "applies only to asynchronous invocations.")
    acknowledge(function, "AwsSolutions-L1",
                "Python 3.12 is the runtime the jobs package is written and tested for (fixed contract).")
    if reserved_concurrency is None:
        acknowledge(function, "NIST.800.53.R5-LambdaConcurrency",
                    "Each execution calls each function at most once at a time. Reserving concurrency "
                    "would take from the account's unreserved pool (minimum 10) and fail deploys in "
                    "new accounts; set lambda_reserved_concurrency to reserve it.")
