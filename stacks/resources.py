"""What the platform stack hands to the stacks built on it (the launcher stack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3


@dataclass(frozen=True)
class PlatformResources:
    # The validated platform config (platform_constructs.config.PlatformConfig).
    config: Any
    key: kms.IKey
    checkpoint_bucket: s3.IBucket
    output_bucket: s3.IBucket
    dataset_bucket: s3.IBucket
    execution_role: iam.IRole
    # The platform settings document (jobs.platform.PlatformSettings.to_dict() shape), values may be tokens.
    settings: dict[str, Any]
