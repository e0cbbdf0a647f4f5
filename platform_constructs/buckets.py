"""Encrypted, versioned, TLS-only buckets with access logs and lifecycle rules that keep costs bounded."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from platform_constructs.nag import acknowledge

NONCURRENT_VERSION_DAYS = 30
NO_REPLICATION = ("Cross-region replication needs a bucket in a second region, which this single-region platform "
                  "does not own; versioning, retention on delete and the lifecycle rules protect the data here. "
                  "Add a replication rule to a bucket of your DR region if your policy asks for one.")
ABORT_MULTIPART_DAYS = 7
ACCESS_LOG_DAYS = 365


@dataclass(frozen=True, kw_only=True)
class AccessLogBucketProps:
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN
    """What deleting the stack does to the bucket. @default RETAIN"""


class AccessLogBucket(Construct):
    """Where the other buckets' server access logs go. S3 log delivery cannot write SSE-KMS objects, so this
    one bucket uses S3-managed keys."""

    def __init__(self, scope: Construct, id: str, props: AccessLogBucketProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or AccessLogBucketProps()
        self.bucket = s3.Bucket(
            self, "Bucket", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True, versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(
                expiration=cdk.Duration.days(ACCESS_LOG_DAYS),
                noncurrent_version_expiration=cdk.Duration.days(NONCURRENT_VERSION_DAYS),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(ABORT_MULTIPART_DAYS))],
            removal_policy=props.removal_policy)
        acknowledge(self.bucket, "NIST.800.53.R5-S3DefaultEncryptionKMS",
                    "S3 server access log delivery cannot write to an SSE-KMS bucket; this bucket holds only "
                    "access logs and uses SSE-S3.")
        acknowledge(self.bucket, "NIST.800.53.R5-S3BucketReplicationEnabled", NO_REPLICATION)


@dataclass(frozen=True, kw_only=True)
class SecureBucketProps:
    encryption_key: kms.IKey
    """The key the bucket's objects are encrypted with (SSE-KMS, with an S3 bucket key)."""
    access_logs: s3.IBucket
    """Where the bucket's server access logs go (an AccessLogBucket)."""
    access_logs_prefix: str
    """The folder of `access_logs` for this bucket's logs, without a leading or trailing '/' (e.g. 'outputs')."""
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN
    """What deleting the stack does to the bucket. @default RETAIN"""

    def __post_init__(self) -> None:
        prefix = self.access_logs_prefix
        if not prefix or prefix.startswith("/") or prefix.endswith("/"):
            raise ValueError(f"access_logs_prefix {prefix!r}: use a folder name such as 'outputs' "
                             "(no leading or trailing '/'; the bucket adds the '/')")


class SecureBucket(Construct):
    """SSE-KMS with `encryption_key`, versioning, TLS only, no public access, server access logs into
    `access_logs` under `access_logs_prefix/`, and a lifecycle that expires non-current versions and aborts
    incomplete multipart uploads."""

    def __init__(self, scope: Construct, id: str, props: SecureBucketProps) -> None:
        super().__init__(scope, id)
        self.bucket = s3.Bucket(
            self, "Bucket", encryption=s3.BucketEncryption.KMS, encryption_key=props.encryption_key,
            bucket_key_enabled=True, enforce_ssl=True, versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=props.access_logs, server_access_logs_prefix=f"{props.access_logs_prefix}/",
            lifecycle_rules=[s3.LifecycleRule(
                noncurrent_version_expiration=cdk.Duration.days(NONCURRENT_VERSION_DAYS),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(ABORT_MULTIPART_DAYS))],
            removal_policy=props.removal_policy)
        acknowledge(self.bucket, "NIST.800.53.R5-S3BucketReplicationEnabled", NO_REPLICATION)
