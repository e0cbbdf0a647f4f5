"""Where the platform settings come from: a file, the deployed stack (SSM), or this machine (`trainctl local`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli.aws import Aws
from cli.errors import UserError
from cli.request_file import read_json_object

REPO_ROOT = Path(__file__).resolve().parents[1]


def _settings(data: dict[str, Any], where: str) -> Any:
    from jobs.platform import PlatformSettings

    try:
        return PlatformSettings.from_dict(data)
    except (TypeError, ValueError) as exc:
        # from_dict names unknown keys; a missing key surfaces as the dataclass's TypeError.
        raise UserError(f"{where}: not a platform-settings document: {exc}",
                        "use the document the stack publishes (SSM /<prefix>/platform-settings)") from None


def platform_from_file(path: Path) -> Any:
    return _settings(read_json_object(path, "platform settings"), str(path))


def platform_from_stack(aws: Aws) -> Any:
    from botocore.exceptions import NoCredentialsError, NoRegionError, PartialCredentialsError

    name = f"/{aws.prefix}/platform-settings"
    try:
        text = aws.parameter("platform-settings")
    except (NoRegionError, NoCredentialsError, PartialCredentialsError) as exc:
        # The first AWS call of plan and render, which a new user need not make at all.
        what = "no AWS region configured" if isinstance(exc, NoRegionError) else "no AWS credentials found"
        raise UserError(f"{what} to read the platform settings (SSM {name}) from the deployed stack",
                        "pass --platform FILE (e.g. examples/platform-settings.json) to work offline; or set "
                        "AWS_REGION or --region, and your credentials, to read the deployed ones") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"SSM parameter {name} does not hold JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise UserError(f"SSM parameter {name} does not hold a JSON object")
    return _settings(data, f"SSM parameter {name}")


def load_platform(path: Path | None, aws: Aws) -> Any:
    """From --platform FILE when given (no AWS call), else from the deployed stack."""
    return platform_from_file(path) if path is not None else platform_from_stack(aws)


def local_platform(framework_version: str | None = None) -> Any:
    """Settings for rendering a request to run on this machine (their type, LocalPlatformSettings, marks them).

    The role, network, key and buckets are placeholders that nothing reads locally; the image is never
    pulled (training runs from this checkout), and `sagemaker_submit_directory` points at the repo's
    training package, so the emulated launcher runs the same entry script SageMaker would.
    """
    from jobs.catalog import instance_types
    from jobs.platform import LocalPlatformSettings

    version = framework_version or "local"
    image = f"trainctl-local/pytorch:{version}"
    devices = {"gpu": image, "cpu": image, "neuron": image}
    return LocalPlatformSettings(
        name_prefix="local",
        region="us-east-1",
        execution_role_arn="arn:aws:iam::000000000000:role/local-training",
        subnet_ids=["subnet-00000000000000000"],
        security_group_ids=["sg-00000000000000000"],
        kms_key_arn="arn:aws:kms:us-east-1:000000000000:key/00000000-0000-0000-0000-000000000000",
        checkpoint_bucket="local-checkpoints",
        output_bucket="local-output",
        dataset_bucket="local-datasets",
        source_dir_s3_uri=(REPO_ROOT / "training").as_uri(),
        images={"pytorch": {version: dict(devices)}, "pytorch-smp": {version: dict(devices)}},
        default_framework_version=version,
        default_smp_version=version,
        allowed_instance_types=instance_types(),
    )
