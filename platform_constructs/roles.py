"""The SageMaker execution role, least privilege: what a training job does and nothing more."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract.container import LOG_GROUP, MLFLOW_ARN, MLFLOW_RUN_ACTIONS
from contract.metrics import METRIC_NAMESPACE
from jobs.naming import jobs_named, metrics_namespace
from jobs.render.images import PYTORCH_FRAMEWORK, SMP_FRAMEWORK
from platform_constructs.nag import acknowledge, logical_id, nag_form

ECR_REGISTRY = re.compile(r"(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?")
# ECR repositories of the AWS deep-learning containers that jobs pull (PyTorch and SMP v2).
IMAGE_REPOSITORIES = {PYTORCH_FRAMEWORK: "pytorch-training", SMP_FRAMEWORK: "smdistributed-modelparallel"}


@dataclass(frozen=True, kw_only=True)
class ExecutionRoleProps:
    name_prefix: str
    """The platform's (or team's) prefix: the jobs `<name_prefix>-*` may assume the role; it reads and writes
    `<name_prefix>/` of the checkpoint and output buckets and the secrets `<name_prefix>/*`."""
    key: kms.IKey
    """The platform key, which the role encrypts and decrypts with."""
    dataset_bucket: s3.IBucket
    """The bucket the role reads datasets from, under `dataset_prefix` only."""
    dataset_prefix: str
    """The key prefix of `dataset_bucket` the role may read and list (ending in '/')."""
    checkpoint_bucket: s3.IBucket
    """The bucket of the jobs' checkpoints (the team's own with `data_key`)."""
    output_bucket: s3.IBucket
    """The bucket of the jobs' outputs (models)."""
    image_accounts: Mapping[str, str]
    """The registry account of each framework's AWS deep-learning images (ImageMapping.account; tokens allowed)."""
    vpc: ec2.IVpc
    """The VPC the jobs' network interfaces are managed in."""
    subnets: Sequence[ec2.ISubnet]
    """The training subnets SageMaker creates the jobs' network interfaces in."""
    security_groups: Sequence[ec2.ISecurityGroup]
    """The training security groups of the jobs' network interfaces."""
    image_repositories: Sequence[str]
    """ECR sources (`<registry>/<repo>` or `<registry>/`) requests may name in `image`, beyond the AWS images."""
    role_path: str = "/"
    """The role's IAM path (the path the platform key lets use it: key_user_path). @default '/'"""
    data_key: kms.IKey | None = None
    """The team's own key (TeamKey) that encrypts its checkpoint and output buckets; the role must carry the team's
    tag to use it. @default None: those buckets use `key`"""
    mlflow_tracking_server: str | None = None
    """The MLflow tracking server the jobs log their runs to; a SageMaker managed one's ARN gets MLFLOW_RUN_ACTIONS on
    that server (an http(s) server authorizes on its own). @default None: none"""


class ExecutionRole(Construct):
    """Assumed by SageMaker for the jobs named `<name_prefix>-*` of this account only: read (and list) the dataset
    prefix, read/write/list `<name_prefix>/` of the checkpoint and output buckets, read the secrets named
    `<name_prefix>/*`, use the platform key, pull the AWS deep-learning images and `image_repositories`, write logs
    and metrics, and manage the network interfaces SageMaker puts in the training subnets. One per team: nothing
    here reaches another team's prefix (tests/infra/test_team_isolation.py)."""

    def __init__(self, scope: Construct, id: str, props: ExecutionRoleProps) -> None:
        super().__init__(scope, id)
        name_prefix, dataset_bucket, dataset_prefix = props.name_prefix, props.dataset_bucket, props.dataset_prefix
        checkpoint_bucket, output_bucket = props.checkpoint_bucket, props.output_bucket
        partition, region, account = cdk.Aws.PARTITION, cdk.Aws.REGION, cdk.Aws.ACCOUNT_ID
        # SageMaker assumes the role for this platform's (or team's) own jobs only: a job of another prefix, or of
        # another account, that names this role cannot use it (the confused-deputy conditions).
        jobs = f"arn:{partition}:sagemaker:{region}:{account}:training-job/{jobs_named(name_prefix)}"
        role = iam.Role(
            self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com").with_conditions(
                {"StringEquals": {"aws:SourceAccount": account}, "ArnLike": {"aws:SourceArn": jobs}}),
            description=f"{name_prefix} SageMaker training jobs", path=props.role_path)
        self.role = role
        grant_prefix_read(role, dataset_bucket, dataset_prefix, "Datasets")
        for sid, bucket in (("Checkpoints", checkpoint_bucket), ("Outputs", output_bucket)):
            grant_prefix_read_write(role, bucket, f"{name_prefix}/", sid)
        props.key.grant_encrypt_decrypt(role)
        if props.data_key is not None:
            props.data_key.grant_encrypt_decrypt(role)
        # A request's `secrets` are read in the container (jobs.render.container_entry): only the team's own, named
        # `<name_prefix>/...` (jobs.request.platform_rules refuses other ARNs before anything launches).
        role.add_to_policy(iam.PolicyStatement(
            sid="OwnSecrets", actions=["secretsmanager:GetSecretValue"],
            resources=[secrets_arn(name_prefix)]))

        # The AWS deep-learning images live in AWS-owned registries (one account per region, from the image table);
        # grant_pull adds the pull actions on each repository and the registry login, which has no resource.
        for framework, repository in IMAGE_REPOSITORIES.items():
            image_account = props.image_accounts[framework]
            ecr.Repository.from_repository_attributes(
                self, f"{framework.title().replace('-', '')}Images", repository_name=repository,
                repository_arn=f"arn:{partition}:ecr:{region}:{image_account}:repository/{repository}",
            ).grant_pull(role)
        self._grant_image_repositories(props.image_repositories)
        # SageMaker names a job's log streams `<job name>/algo-N-<time>` in the one training log group: the team's
        # jobs write only streams named for its own jobs (`<name_prefix>-*`), so no job can put lines into a stream
        # named like another team's job, which that team's engineers, `trainctl logs` and the classifier would read.
        group = f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}"
        role.add_to_policy(iam.PolicyStatement(
            sid="TrainingLogGroup", actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"], resources=[group]))
        role.add_to_policy(iam.PolicyStatement(
            sid="OwnTrainingLogStreams", actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[own_log_streams(name_prefix)]))
        # PutMetricData has no resource to scope to: the namespace condition is the scope. SageMaker's namespace (its
        # instance metrics and the MetricDefinitions, which SageMaker publishes with this role) is every team's, and
        # IAM cannot scope a data point's dimensions, so the team's alarms and dashboard read only its own namespace,
        # which no other team's role may write (contract.container.ENV_METRICS_NAMESPACE).
        role.add_to_policy(iam.PolicyStatement(
            sid="TrainingMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": [METRIC_NAMESPACE, metrics_namespace(name_prefix)]}}))

        if props.mlflow_tracking_server and MLFLOW_ARN.fullmatch(props.mlflow_tracking_server):
            role.add_to_policy(iam.PolicyStatement(sid="MlflowRuns", actions=sorted(set(MLFLOW_RUN_ACTIONS.values())),
                                                   resources=[props.mlflow_tracking_server]))

        # SageMaker creates the job's network interfaces in the training subnets with the training groups.
        subnet_arns = [f"arn:{partition}:ec2:{region}:{account}:subnet/{s.subnet_id}" for s in props.subnets]
        sg_arns = [f"arn:{partition}:ec2:{region}:{account}:security-group/{g.security_group_id}"
                   for g in props.security_groups]
        eni_arn = f"arn:{partition}:ec2:{region}:{account}:network-interface/*"
        role.add_to_policy(iam.PolicyStatement(
            sid="CreateTrainingInterfaces", actions=["ec2:CreateNetworkInterface"],
            resources=[*subnet_arns, *sg_arns, eni_arn]))
        vpc_arn = f"arn:{partition}:ec2:{region}:{account}:vpc/{props.vpc.vpc_id}"
        # Only interfaces in the training subnets. SageMaker attaches them to instances in its own account, so the
        # one permission it grants is INSTANCE-ATTACH (never EIP-ASSOCIATE). EC2 has no condition on an interface's
        # security group or creator: another team's interfaces share these subnets (docs/SECURITY.md).
        in_training_subnets = {"ArnEquals": {"ec2:Vpc": vpc_arn, "ec2:Subnet": subnet_arns}}
        role.add_to_policy(iam.PolicyStatement(
            sid="ManageTrainingInterfaces",
            actions=["ec2:DeleteNetworkInterface", "ec2:DeleteNetworkInterfacePermission"],
            resources=[eni_arn], conditions=in_training_subnets))
        role.add_to_policy(iam.PolicyStatement(
            sid="AttachTrainingInterfaces", actions=["ec2:CreateNetworkInterfacePermission"], resources=[eni_arn],
            conditions={**in_training_subnets, "StringEquals": {"ec2:Permission": "INSTANCE-ATTACH"}}))
        # EC2 Describe* actions do not support resource-level permissions.
        role.add_to_policy(iam.PolicyStatement(
            sid="DescribeNetwork",
            actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                     "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"],
            resources=["*"]))

        self._acknowledge(dataset_bucket, dataset_prefix, checkpoint_bucket, output_bucket, name_prefix)

    def _grant_image_repositories(self, sources: Sequence[str]) -> None:
        """Pull from the ECR repositories requests may name in `image` (`<registry>/<repo>`: that repository and
        those under it; `<registry>/`: all of the registry's). A registry outside ECR needs no IAM."""
        arns = [arn for source in sources for arn in ecr_repository_arns(source)]
        if not arns:
            return
        self.role.add_to_policy(iam.PolicyStatement(
            sid="AllowedImageRepositories",
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
            resources=arns))
        for arn in arns:
            if arn.endswith("*"):
                acknowledge(self.role, f"AwsSolutions-IAM5[Resource::{nag_form(self, arn)}]",
                            "Wildcard needed: the platform config allows every repository under this registry "
                            "or repository path (allowed_image_repositories), and pulls need the repository ARN.")

    def _acknowledge(self, dataset_bucket: s3.IBucket, dataset_prefix: str, checkpoint_bucket: s3.IBucket,
                     output_bucket: s3.IBucket, name_prefix: str) -> None:
        """Each wildcard the role's policy keeps, and why it cannot be narrower."""
        wildcards = {
            "Action::kms:GenerateDataKey*": "SSE-KMS writes with the platform key only",
            "Action::kms:ReEncrypt*": "SSE-KMS with the platform key only",
            "Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*":
                "SageMaker creates the job's network interfaces, whose ids are unknown before the job runs; "
                "changes are limited to the platform VPC by condition",
            f"Resource::{nag_form(self, own_log_streams(name_prefix))}":
                "the log streams of this platform's (or team's) own jobs, one per job and host, named by SageMaker",
            f"Resource::{nag_form(self, secrets_arn(name_prefix))}":
                "the secrets named under this platform's (or team's) prefix, which requests name by ARN",
            "Resource::*": "ecr:GetAuthorizationToken, cloudwatch:PutMetricData (scoped by a namespace "
                           "condition) and ec2:Describe* support no resource-level permissions",
        }
        for bucket, prefix in ((checkpoint_bucket, f"{name_prefix}/"), (output_bucket, f"{name_prefix}/"),
                               (dataset_bucket, dataset_prefix)):
            if bucket.node.default_child is not None:  # an imported dataset bucket prints its name, not a ref
                wildcards[f"Resource::<{logical_id(bucket)}.Arn>/{prefix}*"] = \
                    "objects under this platform's (or team's) prefix of the bucket only"
            else:
                wildcards[f"Resource::arn:<AWS::Partition>:s3:::{bucket.bucket_name}/{prefix}*"] = \
                    "objects under the dataset prefix of the imported dataset bucket only"
        for finding, why in wildcards.items():
            acknowledge(self.role, f"AwsSolutions-IAM5[{finding}]", f"Wildcard needed: {why}.")
        acknowledge(self.role, "NIST.800.53.R5-IAMNoInlinePolicy",
                    "The execution role's policy is written by CDK grants for this one role; a managed policy "
                    "could be attached to other principals, which least privilege avoids.")


def own_log_streams(name_prefix: str) -> str:
    """The training log streams of the jobs `<name_prefix>-*` (SageMaker names each `<job name>/algo-N-<time>`): what
    a team's jobs write and its engineers read (engineer_access)."""
    return (f"arn:{cdk.Aws.PARTITION}:logs:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:log-group:{LOG_GROUP}"
            f":log-stream:{jobs_named(name_prefix)}")


def grant_prefix_read(role: iam.IRole, bucket: s3.IBucket, prefix: str, sid: str) -> None:
    """Get the objects under `prefix`, and list the bucket only under it: the keys (run ids, request names) of
    other prefixes are not listed either. The CDK's grant_read would list the whole bucket."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid=f"Read{sid}", actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{prefix}*")]))
    _grant_list(role, bucket, prefix, sid)


def grant_prefix_read_write(role: iam.IRole, bucket: s3.IBucket, prefix: str, sid: str) -> None:
    """Read, write and delete (checkpoint rotation; aborted multipart uploads) under `prefix` only."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid=f"ReadWrite{sid}",
        actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
        resources=[bucket.arn_for_objects(f"{prefix}*")]))
    _grant_list(role, bucket, prefix, sid)


def _grant_list(role: iam.IRole, bucket: s3.IBucket, prefix: str, sid: str) -> None:
    # SageMaker lists an S3Prefix channel and the checkpoint prefix with the prefix as `s3:prefix`.
    role.add_to_principal_policy(iam.PolicyStatement(
        sid=f"List{sid}", actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[bucket.bucket_arn],
        conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}}))


def secrets_arn(name_prefix: str) -> str:
    """The secrets a job of `name_prefix` may read: `<name_prefix>/<name>` (Secrets Manager adds `-<6 chars>`)."""
    return f"arn:{cdk.Aws.PARTITION}:secretsmanager:{cdk.Aws.REGION}:{cdk.Aws.ACCOUNT_ID}:secret:{name_prefix}/*"


def ecr_repository_arns(source: str) -> list[str]:
    """The ECR repository ARNs of an allowed image source (jobs.render.images: `<registry>/<repo>` is that repository and
    those under it, `<registry>/` every repository); [] for a registry outside ECR."""
    registry, _, repository = source.partition("/")
    found = ECR_REGISTRY.fullmatch(registry)
    if found is None:
        return []
    account, region, china = found.groups()
    base = f"arn:{'aws-cn' if china else cdk.Aws.PARTITION}:ecr:{region}:{account}:repository/"
    repository = repository.rstrip("/")
    return [f"{base}*"] if not repository else [f"{base}{repository}", f"{base}{repository}/*"]
