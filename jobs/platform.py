"""The platform's settings, as the deployed stacks publish them.

One JSON document (the "platform settings") carries every value the launcher and trainctl
need to render a CreateTrainingJob request: the CDK app writes it into the launcher Lambda's
environment (PLATFORM_SETTINGS), into the SSM parameter `/<name_prefix>/platform-settings`
and into a stack output; `trainctl render --platform FILE` reads the same document from a file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class FsxSettings:
    file_system_id: str
    mount_name: str
    # The folder on the file system that the dataset bucket prefix is linked to (no leading slash).
    linked_path: str = "datasets"


@dataclass(frozen=True)
class TrainingPlan:
    name: str
    arn: str
    instance_type: str
    instance_count: int


@dataclass(frozen=True)
class PlatformSettings:
    name_prefix: str
    region: str
    execution_role_arn: str
    subnet_ids: list[str]
    security_group_ids: list[str]
    kms_key_arn: str
    checkpoint_bucket: str
    output_bucket: str
    dataset_bucket: str
    # S3 URI of the packed training/ package (sourcedir.tar.gz) that sagemaker_submit_directory names.
    source_dir_s3_uri: str
    # Container images resolved at synth time for the stack's region:
    # {"pytorch": {"2.8.0": {"gpu": uri, "cpu": uri}}, "pytorch-smp": {"2.5.1": {"gpu": uri}}}
    images: dict[str, dict[str, dict[str, str]]]
    default_framework_version: str
    default_smp_version: str
    allowed_instance_types: list[str]
    fsx: FsxSettings | None = None
    training_plans: dict[str, TrainingPlan] = field(default_factory=dict)
    default_warm_pool_minutes: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlatformSettings:
        data = dict(data)
        fsx = data.pop("fsx", None)
        plans = data.pop("training_plans", None) or {}
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"platform settings: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(
            fsx=FsxSettings(**fsx) if fsx else None,
            training_plans={name: TrainingPlan(name=name, **{k: v for k, v in p.items() if k != "name"})
                            for name, p in plans.items()},
            **data,
        )

    @classmethod
    def from_json(cls, text: str) -> PlatformSettings:
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
