"""The run registry's table (jobs.registry): one item per run, who holds it, its epochs and attempts."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from jobs.registry import KEY, table_name
from platform_constructs.nag import acknowledge

# What the launcher's functions do with it: read an item, create a run's, update it under a condition. No scan, no
# delete: a run's record outlives its executions.
WRITER_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
READER_ACTIONS = ("dynamodb:GetItem", "dynamodb:Scan")
# DynamoDB encrypts and decrypts the table's data key with the caller's rights (named actions, no wildcard).
KEY_ACTIONS = ("kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey")


@dataclass(frozen=True, kw_only=True)
class RunRegistryProps:
    name_prefix: str
    """The launcher's prefix: the table is `<name_prefix>-runs` (jobs.registry.table_name)."""
    key: kms.IKey
    """The platform key the table is encrypted with."""
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    """What deleting the stack does to the table; anything but DESTROY also turns deletion protection on.
    @default RETAIN"""


class RunRegistry(Construct):
    """A launcher's registry table, `<name_prefix>-runs` (a launcher per team, so a table per team): on demand,
    point-in-time recovery, encrypted with the platform key; deletion protection on and kept on stack deletion
    unless `removal_policy` is DESTROY (a throw-away platform)."""

    def __init__(self, scope: Construct, id: str, props: RunRegistryProps) -> None:
        super().__init__(scope, id)
        key, removal_policy = props.key, props.removal_policy
        self.key = key
        self.table = dynamodb.Table(
            self, "Table", table_name=table_name(props.name_prefix),
            partition_key=dynamodb.Attribute(name=KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED, encryption_key=key,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True),
            deletion_protection=removal_policy is not RemovalPolicy.DESTROY,
            removal_policy=removal_policy,
        )
        acknowledge(self.table, "NIST.800.53.R5-DynamoDBInBackupPlan",
                    "Point-in-time recovery keeps 35 days of the table's history; an AWS Backup plan is the account's "
                    "choice, not the platform's.")

    def grant_write(self, grantee: iam.IGrantable) -> iam.Grant:
        """What the launcher's functions need: read, create and conditionally update items, with the key."""
        self.key.grant(grantee, *KEY_ACTIONS)
        return self.table.grant(grantee, *WRITER_ACTIONS)

    def grant_read(self, grantee: iam.IGrantable) -> iam.Grant:
        """What `trainctl runs`, `show` and `resume` need: read the items, the key decrypting through DynamoDB only
        (the platform key's policy allows that much to the account for the registry tables: platform_constructs.
        encryption)."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["kms:Decrypt", "kms:DescribeKey"], resource_arns=[self.key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": f"dynamodb.{Stack.of(self).region}.amazonaws.com"}})
        # Written out rather than table.grant: the grantee is often a managed policy, which the table's grant reads
        # as a resource policy's principal and refuses.
        return iam.Grant.add_to_principal(grantee=grantee, actions=list(READER_ACTIONS),
                                          resource_arns=[self.table.table_arn])
