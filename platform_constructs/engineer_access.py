"""What an engineers' role needs to use the launcher through trainctl, as grants and as a managed policy.

trainctl (cli/) calls, besides reading `/<prefix>/platform-settings` and `/<prefix>/state-machine-arn`:
  submit: states:StartExecution                      stop: sagemaker:StopTrainingJob, states:StopExecution
  status: states:DescribeExecution, GetExecutionHistory, sagemaker:DescribeTrainingJob
  list:   states:ListExecutions                      logs: logs:DescribeLogStreams, logs:GetLogEvents
  runs, show, resume: the run registry's items (dynamodb:GetItem, Scan; the key decrypting through DynamoDB)
It reads no CloudWatch metrics, so none is granted.

Everything is the launcher's own: its executions, the jobs named `<prefix>-*` that also carry its run-id tag key
(a platform named `<prefix>-dev` has jobs named `<prefix>-dev-...` but tags them `<prefix>-dev:run-id`), and the
log streams of those jobs. Every training job logs to one group (contract.container.LOG_GROUP), and
FilterLogEvents is granted on a whole group, never on a stream: it would read every team's logs, so it is not
granted; GetLogEvents is, on the streams `<prefix>-*` (a stream is `<job name>/algo-N-...`). DescribeLogStreams
(a group-level action) lists stream names, that is other teams' job names, not their lines.
"""

from __future__ import annotations

from typing import Protocol

import jsii
from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Node

from contract.container import LOG_GROUP
from jobs.naming import jobs_named
from platform_constructs.nag import acknowledge, nag_form
from platform_constructs.roles import own_log_streams
from platform_constructs.run_registry import RunRegistry


class JobLauncher(Protocol):
    """What these grants read from platform_constructs.launcher.JobLauncher (named here, not imported: the
    launcher imports this module)."""

    node: Node
    name_prefix: str
    state_machine: sfn.StateMachine
    state_machine_name: str
    training_job_arn_pattern: str
    run_id_tag_key: str
    registry: RunRegistry

_TRAINING_LOGS_ID = "TrainingJobLogs"


def grant_submit(launcher: JobLauncher, grantee: iam.IGrantable) -> iam.Grant:
    machine = launcher.state_machine
    return (machine.grant_start_execution(grantee)
            .combine(_grant_executions(launcher, grantee, "states:StopExecution"))
            .combine(_grant_jobs(launcher, grantee, "sagemaker:StopTrainingJob"))
            .combine(_grant_parameters(launcher, grantee)))


def grant_observe(launcher: JobLauncher, grantee: iam.IGrantable) -> iam.Grant:
    machine = launcher.state_machine
    return (machine.grant(grantee, "states:ListExecutions")
            .combine(_grant_executions(launcher, grantee, "states:DescribeExecution", "states:GetExecutionHistory"))
            .combine(_grant_jobs(launcher, grantee, "sagemaker:DescribeTrainingJob"))
            .combine(_training_logs(launcher).grant(grantee, "logs:DescribeLogStreams"))
            .combine(iam.Grant.add_to_principal(grantee=grantee, actions=["logs:GetLogEvents"],
                                                resource_arns=[log_streams_arn(launcher)]))
            .combine(_grant_parameters(launcher, grantee))
            .combine(launcher.registry.grant_read(grantee)))


def _grant_jobs(launcher: JobLauncher, grantee: iam.IGrantable, *actions: str) -> iam.Grant:
    """The launcher's own jobs: its name prefix and its run-id tag key (see the module's docstring)."""
    return iam.Grant.add_to_principal(
        grantee=grantee, actions=list(actions), resource_arns=[launcher.training_job_arn_pattern],
        conditions={"Null": {f"aws:ResourceTag/{launcher.run_id_tag_key}": "false"}})


def log_streams_arn(launcher: JobLauncher) -> str:
    """The log streams of the launcher's jobs (what its execution role writes: roles.own_log_streams)."""
    return own_log_streams(launcher.name_prefix)


def _grant_parameters(launcher: JobLauncher, grantee: iam.IGrantable) -> iam.Grant:
    return iam.Grant.add_to_principal(grantee=grantee, actions=["ssm:GetParameter"],
                                      resource_arns=[parameters_arn(launcher)])


def parameters_arn(launcher: JobLauncher) -> str:
    """The platform's SSM parameters, `/<name_prefix>/*` (the platform and launcher stacks publish there)."""
    return Stack.of(launcher).format_arn(service="ssm", resource="parameter",
                                         resource_name=f"{launcher.name_prefix}/*")


def _grant_executions(launcher: JobLauncher, grantee: iam.IGrantable, *actions: str) -> iam.Grant:
    # StateMachine.grant_execution would name the machine by a token (Select/Split of its ARN); the name is
    # ours, so the policy can say it plainly.
    return iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=[executions_arn(launcher)])


def state_machine_arn(launcher: JobLauncher) -> str:
    """The launcher's state machine, written from its name (its own definition starts it: the attribute is a cycle)."""
    return Stack.of(launcher).format_arn(service="states", resource="stateMachine",
                                         arn_format=ArnFormat.COLON_RESOURCE_NAME,
                                         resource_name=launcher.state_machine_name)


def executions_arn(launcher: JobLauncher) -> str:
    """Every execution of the launcher's state machine."""
    return Stack.of(launcher).format_arn(
        service="states", resource="execution", arn_format=ArnFormat.COLON_RESOURCE_NAME,
        resource_name=f"{launcher.state_machine_name}:*")


def _training_logs(launcher: JobLauncher) -> logs.ILogGroup:
    """The training jobs' log group (SageMaker creates it), imported once per launcher."""
    found = launcher.node.try_find_child(_TRAINING_LOGS_ID)
    return found or logs.LogGroup.from_log_group_name(launcher, _TRAINING_LOGS_ID, LOG_GROUP)


def engineers_policy(launcher: JobLauncher, id: str, name: str) -> iam.ManagedPolicy:
    policy = iam.ManagedPolicy(launcher, id, managed_policy_name=name,
                               description=f"{launcher.name_prefix}: submit, follow and stop training runs "
                                           "with trainctl")
    holder = _PolicyHolder(policy)
    grant_submit(launcher, holder)
    grant_observe(launcher, holder)
    wildcards = {
        executions_arn(launcher): "execution names are chosen per run (trainctl submit), so every execution of "
                                  "the launcher's own state machine is named by <state machine>:*",
        launcher.training_job_arn_pattern: f"training job names are generated per attempt; the platform's prefix "
                                           f"({jobs_named(launcher.name_prefix)}) is the narrowest resource",
        _training_logs(launcher).log_group_arn: "DescribeLogStreams on the training jobs' log group (SageMaker "
                                                "creates it; the action has no stream-level resource)",
        log_streams_arn(launcher): "GetLogEvents on the log streams of the launcher's own jobs: one stream per job "
                                   "and host, named <job name>/algo-N-... by SageMaker",
        parameters_arn(launcher): f"the platform's own parameters under /{launcher.name_prefix}/ (settings and the "
                                  "state machine ARN), which trainctl reads to find the platform",
    }
    for resource, why in wildcards.items():
        acknowledge(policy, f"AwsSolutions-IAM5[Resource::{nag_form(launcher, resource)}]", f"Wildcard needed: {why}.")
    return policy


@jsii.implements(iam.IPrincipal)
class _PolicyHolder:
    """A grantee whose grants land in a managed policy (the L2 grants need a principal; the policy is not one)."""

    def __init__(self, policy: iam.ManagedPolicy) -> None:
        self._policy = policy

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self

    @property
    def assume_role_action(self) -> str:
        return "sts:AssumeRole"

    @property
    def policy_fragment(self) -> iam.PrincipalPolicyFragment:
        raise NotImplementedError("a managed policy is not a principal of a resource policy")

    @property
    def principal_account(self) -> str | None:
        return Stack.of(self._policy).account

    def add_to_policy(self, statement: iam.PolicyStatement) -> bool:
        return self.add_to_principal_policy(statement).statement_added

    def add_to_principal_policy(self, statement: iam.PolicyStatement) -> iam.AddToPrincipalPolicyResult:
        self._policy.add_statements(statement)
        return iam.AddToPrincipalPolicyResult(statement_added=True, policy_dependable=self._policy)
