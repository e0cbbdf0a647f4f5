"""The platform's KMS key (created with rotation, or imported by ARN), and a team's own key for its data."""

from __future__ import annotations

import re
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from jobs.registry import table_name

# The role FSx for Lustre uses to read a linked bucket; one per file system, named after its id.
FSX_S3_ROLE = "role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_*"
# What the account (through IAM) may do to the key without being one of its users: manage it (the account must keep
# PutKeyPolicy, or the key becomes unmanageable) but not encrypt or decrypt. CreateGrant is left out here: a grant is
# a way to use the key, given below only for AWS resources (volumes, file systems).
KEY_ADMIN_ACTIONS = ["kms:CreateAlias", "kms:Describe*", "kms:Enable*", "kms:List*", "kms:Put*", "kms:Update*",
                     "kms:Revoke*", "kms:Disable*", "kms:Get*", "kms:Delete*", "kms:TagResource", "kms:UntagResource",
                     "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion", "kms:RotateKeyOnDemand"]
KEY_USE_ACTIONS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:DescribeKey"]


def key_user_path(name_prefix: str) -> str:
    """The IAM path of every role of the platform that uses its key; the key policy lets only roles under it
    use the key (with their own IAM grants), so a broad kms:Decrypt elsewhere in the account decrypts nothing."""
    return f"/{name_prefix}/"


@dataclass(frozen=True, kw_only=True)
class PlatformKeyProps:
    name_prefix: str
    """The platform's name prefix: the key's alias is `alias/<name_prefix>-platform`. Letters, digits, '/', '_' or
    '-'."""
    imported_key_arn: str | None
    """An existing key to use instead of creating one (platform_config's `kms_key_arn`); None creates one."""
    user_path: str | None = None
    """The IAM path of the roles that may use a created key. @default key_user_path(name_prefix)"""
    budgets: bool = False
    """Whether AWS Budgets publishes to topics encrypted with the key (a team's budget). @default False"""
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN
    """What deleting the stack does to a created key. @default RETAIN"""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-zA-Z0-9/_-]{1,240}", self.name_prefix):
            raise ValueError(f"name_prefix {self.name_prefix!r}: use letters, digits, '/', '_' or '-' (it names the "
                             "key's alias)")


class PlatformKey(Construct):
    """One customer-managed key for buckets, volumes, logs, topics and the file system, aliased
    `alias/<name_prefix>-platform`; or, with `imported_key_arn`, an existing key. Only roles under `user_path`
    (default `/<name_prefix>/`) and the AWS services named in its policy may use a created key.

    An imported key's policy is not ours to change: README lists the statements it needs.
    """

    def __init__(self, scope: Construct, id: str, props: PlatformKeyProps) -> None:
        super().__init__(scope, id)
        name_prefix = props.name_prefix
        self.created = props.imported_key_arn is None
        if props.imported_key_arn is not None:
            self.key: kms.IKey = kms.Key.from_key_arn(self, "Imported", props.imported_key_arn)
            return
        # The least-privilege key policy (the CDK's key-administrators pattern): `policy` given, the CDK adds no
        # kms:* for the account root; the account keeps administration, and use is delegated to IAM only for the
        # platform's own roles (key_user_path) and the AWS services below.
        statements = [*_account_statements(props.user_path or key_user_path(name_prefix)),
                      _registry_readers(name_prefix), *_service_statements()]
        # A team's budget publishes to its key-encrypted notification topic (platform_constructs.budget).
        if props.budgets:
            statements.append(iam.PolicyStatement(
                sid="BudgetsPublish", principals=[iam.ServicePrincipal("budgets.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": cdk.Aws.ACCOUNT_ID}}))
        key = kms.Key(
            self, "Key", alias=f"alias/{name_prefix}-platform", enable_key_rotation=True,
            description=f"{name_prefix} training platform: checkpoints, outputs, datasets, logs, volumes",
            policy=iam.PolicyDocument(statements=statements),
            removal_policy=props.removal_policy, pending_window=cdk.Duration.days(30))
        self.key = key


@dataclass(frozen=True, kw_only=True)
class TeamKeyProps:
    name_prefix: str
    """The team's prefix (`<platform>--<team>`): the key's alias is `alias/<name_prefix>-data`."""
    user_path: str
    """The IAM path of the platform's roles (key_user_path): only roles under it may use the key..."""
    team_tag: tuple[str, str]
    """...and only those carrying this tag (key, value): the team's cost tag, which only the team's own roles carry
    (the stacks tag them; no role of the platform may tag a role)."""
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN
    """What deleting the stack does to the key. @default RETAIN"""


class TeamKey(Construct):
    """A team's own key, for its own checkpoint and output buckets (platform config `team_keys`): usable only by the
    platform's roles that carry the team's tag (its execution role), so another team's role cannot decrypt what
    the team's jobs write even if an S3 permission let it read the objects; the account keeps administration.
    Volumes, logs, topics and datasets stay on the platform key."""

    def __init__(self, scope: Construct, id: str, props: TeamKeyProps) -> None:
        super().__init__(scope, id)
        partition, account = cdk.Aws.PARTITION, cdk.Aws.ACCOUNT_ID
        root = iam.AccountRootPrincipal()
        tag_key, team = props.team_tag
        statements = [
            iam.PolicyStatement(sid="KeyAdministration", principals=[root], actions=KEY_ADMIN_ACTIONS,
                                resources=["*"]),
            iam.PolicyStatement(
                sid="TeamRolesUse", principals=[root], actions=KEY_USE_ACTIONS, resources=["*"],
                conditions={"ArnLike": {"aws:PrincipalArn": f"arn:{partition}:iam::{account}:role{props.user_path}*"},
                            "StringEquals": {f"aws:PrincipalTag/{tag_key}": team}}),
        ]
        self.key = kms.Key(
            self, "Key", alias=f"alias/{props.name_prefix}-data", enable_key_rotation=True,
            description=f"{props.name_prefix}: the team's checkpoints and outputs",
            policy=iam.PolicyDocument(statements=statements),
            removal_policy=props.removal_policy, pending_window=cdk.Duration.days(30))


def _account_statements(user_path: str) -> list[iam.PolicyStatement]:
    """Administration for the account; use for the platform's roles; grants only for AWS resources."""
    partition, region, account = cdk.Aws.PARTITION, cdk.Aws.REGION, cdk.Aws.ACCOUNT_ID
    root = iam.AccountRootPrincipal()
    return [
        iam.PolicyStatement(sid="KeyAdministration", principals=[root], actions=KEY_ADMIN_ACTIONS, resources=["*"]),
        # The platform's roles (execution roles, launcher functions, state machines) carry user_path; each still
        # needs its own IAM grant (the constructs write them), as the account delegates to IAM.
        iam.PolicyStatement(
            sid="PlatformRolesUse", principals=[root], actions=KEY_USE_ACTIONS, resources=["*"],
            conditions={"ArnLike": {"aws:PrincipalArn": f"arn:{partition}:iam::{account}:role{user_path}*"}}),
        # SageMaker (job volumes), FSx (the file system) and Lambda (its environment) use the key through grants
        # they create for their own resources, with the caller's permission.
        iam.PolicyStatement(
            sid="GrantsForAwsResources", principals=[root], actions=["kms:CreateGrant", "kms:DescribeKey"],
            resources=["*"], conditions={"Bool": {"kms:GrantIsForAWSResource": "true"}}),
        # Deploying a function encrypts its environment (the platform settings, no secrets) through Lambda with the
        # deployer's permissions.
        iam.PolicyStatement(
            sid="LambdaEnvironmentEncryption", principals=[root],
            actions=["kms:Encrypt", "kms:GenerateDataKey*", "kms:DescribeKey"], resources=["*"],
            conditions={"StringEquals": {"kms:ViaService": f"lambda.{region}.amazonaws.com",
                                         "kms:CallerAccount": account}}),
    ]


def _registry_readers(name_prefix: str) -> iam.PolicyStatement:
    """Engineers (outside the platform's path) read their launcher's run registry through trainctl: the key decrypts
    for them only through DynamoDB and only for the platform's registry tables (`<prefix>*-runs`, one per team; each
    engineers' policy names its own team's table and key)."""
    region, account = cdk.Aws.REGION, cdk.Aws.ACCOUNT_ID
    return iam.PolicyStatement(
        sid="RunRegistryReaders", principals=[iam.AccountRootPrincipal()], actions=["kms:Decrypt", "kms:DescribeKey"],
        resources=["*"],
        conditions={"StringEquals": {"kms:ViaService": f"dynamodb.{region}.amazonaws.com", "kms:CallerAccount": account},
                    "StringLike": {"kms:EncryptionContext:aws:dynamodb:tableName": table_name(f"{name_prefix}*")}})


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
