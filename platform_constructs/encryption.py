"""The platform's KMS key: created with rotation, or imported by ARN."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from platform_constructs.config import PlatformConfig

# The role FSx for Lustre uses to read a linked bucket; one per file system, named after its id.
FSX_S3_ROLE = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"


class PlatformKey(Construct):
    """One customer-managed key for buckets, volumes, logs, topics and the file system.

    An imported key's policy is not ours to change: README lists the statements it needs.
    """

    def __init__(self, scope: Construct, id: str, *, config: PlatformConfig) -> None:
        super().__init__(scope, id)
        self.created = config.kms_key_arn is None
        if not self.created:
            self.key: kms.IKey = kms.Key.from_key_arn(self, "Imported", config.kms_key_arn)
            return
        key = kms.Key(
            self, "Key", alias=f"alias/{config.name_prefix}-platform", enable_key_rotation=True,
            description=f"{config.name_prefix} training platform: checkpoints, outputs, datasets, logs, volumes",
            removal_policy=cdk.RemovalPolicy.RETAIN if config.retain_data else cdk.RemovalPolicy.DESTROY,
            pending_window=cdk.Duration.days(30))
        region, account = cdk.Aws.REGION, cdk.Aws.ACCOUNT_ID
        # CloudWatch Logs encrypts log groups (flow logs, Step Functions, Lambda) with the key.
        key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchLogsUse",
            principals=[iam.ServicePrincipal(f"logs.{region}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn":
                                    f"arn:{cdk.Aws.PARTITION}:logs:{region}:{account}:log-group:*"}}))
        # CloudWatch alarms publish to the key-encrypted notification topic.
        key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": account}}))
        # FSx reads (and exports to) the linked dataset bucket through its service-linked role, which must
        # be able to use the bucket's key; its name carries the file system id, so it is matched by pattern.
        key.add_to_resource_policy(iam.PolicyStatement(
            sid="FsxLinkedBucketAccess",
            principals=[iam.AccountRootPrincipal()],
            actions=["kms:Decrypt", "kms:GenerateDataKey*", "kms:DescribeKey"], resources=["*"],
            conditions={"ArnLike": {"aws:PrincipalArn": f"arn:{cdk.Aws.PARTITION}:iam::{account}:{FSX_S3_ROLE}"},
                        "StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}))
        self.key = key
