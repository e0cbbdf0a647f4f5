"""What the platform stack hands to the stacks built on it (the launcher stack)."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from jobs.platform import PlatformSettings
from platform_constructs.teams import TeamSpec


@dataclass(frozen=True)
class TeamResources:
    """One team's part of the platform: its execution role and its settings document."""

    spec: TeamSpec
    execution_role: iam.IRole
    # The team's platform settings document; its values may be tokens (resolved by Stack.to_json_string).
    settings: PlatformSettings


@dataclass(frozen=True)
class PlatformResources:
    key: kms.IKey
    dataset_bucket: s3.IBucket
    teams: tuple[TeamResources, ...]
    # Roles created under this path may use the platform key (platform_constructs.encryption).
    role_path: str
