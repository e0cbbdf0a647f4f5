"""The Launch state: SageMaker createTrainingJob.sync in raw ASL, and the IAM the state machine needs for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aws_cdk import Aws, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from jobs.render.training_job import CREATE_REQUEST_KEYS

# Step Functions creates and uses this EventBridge rule to learn when a `.sync` training job ends.
SYNC_EVENTS_RULE = "StepFunctionsGetEventsForSageMakerTrainingJobsRule"


@dataclass(frozen=True, kw_only=True)
class LaunchTrainingJobProps:
    training_job_arn_pattern: str
    """The jobs the state may create, describe, stop and tag (`.../training-job/<name_prefix>-*`)."""
    run_id_tag_key: str
    """The tag key only this launcher writes on its jobs: create, describe and stop need it on the job."""
    execution_role: iam.IRole
    """The one role the state may pass, and only to SageMaker."""
    encryption_key: kms.IKey
    """The key SageMaker creates grants on for the jobs' encrypted volumes."""
    subnet_ids: Sequence[str]
    """The training subnets: a job is created only in them (the renderer's VpcConfig, enforced by IAM too)."""
    security_group_ids: Sequence[str]
    """The team's training security groups: a job is created only with them, never with another team's."""
    job_tags: Mapping[str, str] = field(default_factory=dict)
    """Tags every job of the launcher carries with exactly these values (a team's cost allocation tag): no job
    is created or tagged with another value. @default none"""


class LaunchTrainingJob(sfn.CustomState):
    """Creates the training job described at `$.launch.create` and waits for it to end; the job's description
    replaces the create request: `$.launch` becomes {"job": description} (the state holds one of the two).

    The CDK's SageMakerCreateTrainingJob task cannot send CheckpointConfig, Spot, RetryStrategy,
    InstanceGroups, TrainingPlanArn, FSx channels...: the integration is stated directly, so the CDK does
    not know its permissions either. `grant_launch(role)` adds them: create, describe, stop and tag only jobs
    named `training_job_arn_pattern` (create only in `subnet_ids`, with `security_group_ids` and `job_tags`'
    values), pass only `execution_role` and only to SageMaker, the `.sync` events rule, and grants on
    `encryption_key` for the job's encrypted volumes.
    """

    def __init__(self, scope: Construct, id: str, props: LaunchTrainingJobProps) -> None:
        super().__init__(scope, id, state_json={
            "Type": "Task",
            "Resource": f"arn:{Aws.PARTITION}:states:::sagemaker:createTrainingJob.sync",
            "Parameters": {f"{key}.$": f"$.launch.create.{key}" for key in CREATE_REQUEST_KEYS},
            "ResultSelector": {"job.$": "$"},
            "ResultPath": "$.launch",
        })
        self.props = props
        self.training_job_arn_pattern = props.training_job_arn_pattern
        self.run_id_tag_key = props.run_id_tag_key
        self.execution_role = props.execution_role
        self.encryption_key = props.encryption_key

    def policy_statements(self) -> list[iam.PolicyStatement]:
        events_rule = Stack.of(self).format_arn(service="events", resource="rule", resource_name=SYNC_EVENTS_RULE)
        return [
            # The actions of the policy Step Functions itself generates for createTrainingJob.sync (which grants
            # ListTags on "*"), plus AddTags for the request's Tags, all scoped to the platform's job names; create,
            # describe and stop also to the jobs carrying this launcher's run-id tag key, which a job of another
            # platform whose name starts the same (`mltrain-dev-...` for `mltrain-*`) does not carry.
            # Only in the training subnets, only with the team's security groups (a job without a VpcConfig would
            # run outside the VPC: the keys must be present), only with the team's cost tag.
            iam.PolicyStatement(
                sid="CreateOwnTaggedJobs", actions=["sagemaker:CreateTrainingJob"],
                resources=[self.training_job_arn_pattern],
                conditions={
                    "Null": {f"aws:RequestTag/{self.run_id_tag_key}": "false", "sagemaker:VpcSubnets": "false",
                             "sagemaker:VpcSecurityGroupIds": "false"},
                    "ForAllValues:StringEquals": {"sagemaker:VpcSubnets": list(self.props.subnet_ids),
                                                  "sagemaker:VpcSecurityGroupIds":
                                                      list(self.props.security_group_ids)},
                    **self._job_tag_condition("StringEquals")}),
            iam.PolicyStatement(
                sid="FollowOwnTaggedJobs", actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                resources=[self.training_job_arn_pattern],
                conditions={"Null": {f"aws:ResourceTag/{self.run_id_tag_key}": "false"}}),
            iam.PolicyStatement(
                sid="TagOwnJobs", actions=["sagemaker:AddTags", "sagemaker:ListTags"],
                resources=[self.training_job_arn_pattern], conditions=self._job_tag_condition("StringEqualsIfExists")),
            iam.PolicyStatement(
                sid="PassTheExecutionRoleToSageMaker", actions=["iam:PassRole"],
                resources=[self.execution_role.role_arn],
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}),
            iam.PolicyStatement(
                sid="SyncIntegrationEventsRule", actions=["events:PutTargets", "events:PutRule", "events:DescribeRule"],
                resources=[events_rule]),
            # SageMaker creates grants on the platform key for the job's encrypted volumes, for the caller.
            iam.PolicyStatement(
                sid="EncryptedTrainingVolumes", actions=["kms:CreateGrant", "kms:DescribeKey"],
                resources=[self.encryption_key.key_arn],
                conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}}),
        ]

    def _job_tag_condition(self, operator: str) -> dict:
        """The launcher's own tags with their one value (nothing when it has none)."""
        tags = {f"aws:RequestTag/{key}": value for key, value in self.props.job_tags.items()}
        return {operator: tags} if tags else {}

    def grant_launch(self, role: iam.IRole) -> None:
        """Everything the state machine's role needs to run this state."""
        for statement in self.policy_statements():
            role.add_to_principal_policy(statement)
