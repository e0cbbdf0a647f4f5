"""Which container image an attempt runs: the request's override, else the platform's resolved table.

The platform resolves image URIs for its region at synth time with the SageMaker SDK's offline resolver
(`sagemaker.core.image_uris.retrieve`) and hands this module the table in `PlatformSettings.images`:
{"pytorch": {"2.8.0": {"gpu": uri, "cpu": uri}}, "pytorch-smp": {"2.5.1": {"gpu": uri}}}. Nothing here
knows ECR account numbers; the Lambda stays free of the SDK.
"""

from __future__ import annotations

from contract.hyperparameters import Strategy
from jobs import catalog
from jobs.platform import PlatformSettings
from jobs.request_schema import JobRequest

PYTORCH_FRAMEWORK = "pytorch"  # SageMaker's PyTorch training images (aws/deep-learning-containers)
SMP_FRAMEWORK = "pytorch-smp"  # the SMP v2 image


def image_key(request: JobRequest, platform: PlatformSettings, instance_type: str) -> tuple[str, str, str]:
    """(framework, version, device) to look up in platform.images."""
    spec = catalog.lookup(instance_type)
    device = spec.kind if spec else "gpu"
    if request.strategy is Strategy.SMP:
        return SMP_FRAMEWORK, request.framework_version or platform.default_smp_version, device
    return PYTORCH_FRAMEWORK, request.framework_version or platform.default_framework_version, device


def resolve_image(request: JobRequest, platform: PlatformSettings, instance_type: str) -> str:
    if request.image:
        return request.image
    framework, version, device = image_key(request, platform, instance_type)
    return platform.images[framework][version][device]


def image_problem(request: JobRequest, platform: PlatformSettings) -> tuple[str, str] | None:
    """(field path, message) when the platform has no image for some instance type the run may use."""
    if request.image:
        return None
    types = list(request.instance_types) or [request.training_instance_type]
    for instance_type in types:
        framework, version, device = image_key(request, platform, instance_type)
        versions = platform.images.get(framework, {})
        if version not in versions:
            known = ", ".join(sorted(versions)) or "none"
            return ("framework_version", f"the platform has no {framework} image for version {version} "
                                         f"(available: {known}); pick one of those or set image")
        if device not in versions[version]:
            return ("image", f"the platform has no {device.upper()} {framework} {version} image for {instance_type}; "
                             "set image to a container image URI that runs there")
    return None
