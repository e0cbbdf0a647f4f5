"""The SageMaker execution role, least privilege: what a training job does and nothing more."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from contract.container import LOG_GROUP
from contract.metrics import METRIC_NAMESPACE
from jobs.images import PYTORCH_FRAMEWORK, SMP_FRAMEWORK
from platform_constructs.nag import acknowledge, logical_id

# ECR repositories of the AWS deep-learning containers that jobs pull (PyTorch and SMP v2).
IMAGE_REPOSITORIES = {PYTORCH_FRAMEWORK: "pytorch-training", SMP_FRAMEWORK: "smdistributed-modelparallel"}


class ExecutionRole(Construct):
    """Assumed by SageMaker for training jobs: read the dataset prefix, read/write checkpoints and outputs, use
    the platform key, pull the AWS deep-learning images, write logs and metrics, and manage the network
    interfaces SageMaker puts in the training subnets."""

    def __init__(self, scope: Construct, id: str, *, name_prefix: str, key: kms.IKey,
                 dataset_bucket: s3.IBucket, dataset_prefix: str, checkpoint_bucket: s3.IBucket,
                 output_bucket: s3.IBucket, image_accounts: dict[str, str], vpc: ec2.IVpc,
                 subnets: list[ec2.ISubnet], security_groups: list[ec2.ISecurityGroup]) -> None:
        super().__init__(scope, id)
        partition, region, account = cdk.Aws.PARTITION, cdk.Aws.REGION, cdk.Aws.ACCOUNT_ID
        role = iam.Role(
            self, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com").with_conditions(
                {"StringEquals": {"aws:SourceAccount": account}}),
            description=f"{name_prefix} SageMaker training jobs")
        self.role = role
        dataset_bucket.grant_read(role, f"{dataset_prefix}*")
        checkpoint_bucket.grant_read_write(role, f"{name_prefix}/*")
        output_bucket.grant_read_write(role, f"{name_prefix}/*")
        key.grant_encrypt_decrypt(role)

        # The AWS deep-learning images live in AWS-owned registries (one account per region, from the image table);
        # grant_pull adds the pull actions on each repository and the registry login, which has no resource.
        for framework, repository in IMAGE_REPOSITORIES.items():
            ecr.Repository.from_repository_attributes(
                self, f"{framework.title().replace('-', '')}Images", repository_name=repository,
                repository_arn=f"arn:{partition}:ecr:{region}:{image_accounts[framework]}:repository/{repository}",
            ).grant_pull(role)
        role.add_to_policy(iam.PolicyStatement(
            sid="TrainingLogs",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            resources=[f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}",
                       f"arn:{partition}:logs:{region}:{account}:log-group:{LOG_GROUP}:log-stream:*"]))
        # PutMetricData has no resource to scope to: the namespace condition is the scope.
        role.add_to_policy(iam.PolicyStatement(
            sid="TrainingMetrics", actions=["cloudwatch:PutMetricData"], resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}}))

        # SageMaker creates the job's network interfaces in the training subnets with the training groups.
        subnet_arns = [f"arn:{partition}:ec2:{region}:{account}:subnet/{s.subnet_id}" for s in subnets]
        sg_arns = [f"arn:{partition}:ec2:{region}:{account}:security-group/{g.security_group_id}"
                   for g in security_groups]
        eni_arn = f"arn:{partition}:ec2:{region}:{account}:network-interface/*"
        role.add_to_policy(iam.PolicyStatement(
            sid="CreateTrainingInterfaces", actions=["ec2:CreateNetworkInterface"],
            resources=[*subnet_arns, *sg_arns, eni_arn]))
        role.add_to_policy(iam.PolicyStatement(
            sid="ManageTrainingInterfaces",
            actions=["ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
                     "ec2:DeleteNetworkInterfacePermission"],
            resources=[eni_arn],
            conditions={"ArnEquals": {"ec2:Vpc": f"arn:{partition}:ec2:{region}:{account}:vpc/{vpc.vpc_id}"}}))
        # EC2 Describe* actions do not support resource-level permissions.
        role.add_to_policy(iam.PolicyStatement(
            sid="DescribeNetwork",
            actions=["ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs", "ec2:DescribeDhcpOptions",
                     "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups"],
            resources=["*"]))

        self._acknowledge(dataset_bucket, dataset_prefix, checkpoint_bucket, output_bucket, name_prefix)

    def _acknowledge(self, dataset_bucket: s3.IBucket, dataset_prefix: str, checkpoint_bucket: s3.IBucket,
                     output_bucket: s3.IBucket, name_prefix: str) -> None:
        """Each wildcard the role's policy keeps, and why it cannot be narrower."""
        wildcards = {
            "Action::s3:GetObject*": "CDK bucket grants (GetObject, GetObjectVersion...) on the prefixes below",
            "Action::s3:GetBucket*": "CDK bucket grants read bucket metadata of the platform buckets only",
            "Action::s3:List*": "CDK bucket grants list the platform buckets only",
            "Action::s3:DeleteObject*": "checkpoint rotation deletes old step-N checkpoints under the run prefix",
            "Action::s3:Abort*": "aborting failed multipart uploads of checkpoints and model artifacts",
            "Action::kms:GenerateDataKey*": "SSE-KMS writes with the platform key only",
            "Action::kms:ReEncrypt*": "SSE-KMS with the platform key only",
            "Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*":
                "SageMaker creates the job's network interfaces, whose ids are unknown before the job runs; "
                "changes are limited to the platform VPC by condition",
            f"Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:{LOG_GROUP}:log-stream:*":
                "one log stream per training job and host, named by SageMaker",
            "Resource::*": "ecr:GetAuthorizationToken, cloudwatch:PutMetricData (scoped by a namespace "
                           "condition) and ec2:Describe* support no resource-level permissions",
        }
        for bucket, prefix in ((checkpoint_bucket, f"{name_prefix}/"), (output_bucket, f"{name_prefix}/"),
                               (dataset_bucket, dataset_prefix)):
            if bucket.node.default_child is not None:  # an imported dataset bucket prints its name, not a ref
                wildcards[f"Resource::<{logical_id(bucket)}.Arn>/{prefix}*"] = \
                    "objects under this platform's prefix of the bucket only"
            else:
                wildcards[f"Resource::arn:<AWS::Partition>:s3:::{bucket.bucket_name}/{prefix}*"] = \
                    "objects under the dataset prefix of the imported dataset bucket only"
        for finding, why in wildcards.items():
            acknowledge(self.role, f"AwsSolutions-IAM5[{finding}]", f"Wildcard needed: {why}.")
        acknowledge(self.role, "NIST.800.53.R5-IAMNoInlinePolicy",
                    "The execution role's policy is written by CDK grants for this one role; a managed policy "
                    "could be attached to other principals, which least privilege avoids.")
