"""The platform's KMS key: created with rotation, or imported by ARN."""

from __future__ import annotations

import re

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

# The role FSx for Lustre uses to read a linked bucket; one per file system, named after its id.
FSX_S3_ROLE = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"


class PlatformKey(Construct):
    """One customer-managed key for buckets, volumes, logs, topics and the file system, aliased
    `alias/<name_prefix>-platform`; or, with `imported_key_arn`, an existing key.

    An imported key's policy is not ours to change: README lists the statements it needs.
    """

    def __init__(self, scope: Construct, id: str, *, name_prefix: str, imported_key_arn: str | None = None,
                 removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN) -> None:
        super().__init__(scope, id)
        if not re.fullmatch(r"[a-zA-Z0-9/_-]{1,240}", name_prefix):
            raise ValueError(f"name_prefix {name_prefix!r}: use letters, digits, '/', '_' or '-' (it names the "
                             "key's alias)")
        self.created = imported_key_arn is None
        if imported_key_arn is not None:
            self.key: kms.IKey = kms.Key.from_key_arn(self, "Imported", imported_key_arn)
            return
        key = kms.Key(
            self, "Key", alias=f"alias/{name_prefix}-platform", enable_key_rotation=True,
            description=f"{name_prefix} training platform: checkpoints, outputs, datasets, logs, volumes",
            removal_policy=removal_policy, pending_window=cdk.Duration.days(30))
        for statement in _service_statements():
            key.add_to_resource_policy(statement)
        self.key = key


def _service_statements() -> list[iam.PolicyStatement]:
    """What AWS services need from the key beyond the grants the CDK writes for our own roles."""
    region, account = cdk.Aws.REGION, cdk.Aws.ACCOUNT_ID
    return [
        # CloudWatch Logs encrypts log groups (flow logs, Step Functions, Lambda) with the key.
        iam.PolicyStatement(
            sid="CloudWatchLogsUse",
            principals=[iam.ServicePrincipal(f"logs.{region}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
            resources=["*"],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn":
                                    f"arn:{cdk.Aws.PARTITION}:logs:{region}:{account}:log-group:*"}}),
        # CloudWatch alarms publish to the key-encrypted notification topic.
        iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
            conditions={"StringEquals": {"aws:SourceAccount": account}}),
        # FSx reads (and exports to) the linked dataset bucket through its service-linked role, which must
        # be able to use the bucket's key; its name carries the file system id, so it is matched by pattern.
        iam.PolicyStatement(
            sid="FsxLinkedBucketAccess",
            principals=[iam.AccountRootPrincipal()],
            actions=["kms:Decrypt", "kms:GenerateDataKey*", "kms:DescribeKey"], resources=["*"],
            conditions={"ArnLike": {"aws:PrincipalArn": f"arn:{cdk.Aws.PARTITION}:iam::{account}:{FSX_S3_ROLE}"},
                        "StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}}),
    ]
