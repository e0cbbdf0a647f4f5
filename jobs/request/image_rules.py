"""Which container images a request may run: the platform's resolved table, or an image from a repository it allows.

The platform resolves image URIs for its region at synth time with the SageMaker SDK's offline resolver
(`sagemaker.core.image_uris.retrieve`) and hands the launcher the table in `PlatformSettings.images`:
{"pytorch": {"2.8.0": {"gpu": uri, "cpu": uri}}, "pytorch-smp": {"2.5.1": {"gpu": uri}}}. Nothing here
knows ECR account numbers; the Lambda stays free of the SDK.

A request's `image` must come from a repository the platform allows (`image_source_problem`): the registries of
the images in that table (the AWS deep-learning-container registries the SDK resolved for the region: AWS's
images of any framework and tag, so the account list lives in the SDK alone) and the platform settings'
`allowed_image_repositories` (a team's own ECR repositories). Any other image runs whatever its author put in it
with the execution role's permissions. The platform rules (jobs.request.platform_rules) check both; the renderer
picks the image (jobs.render.images.resolve_image).
"""

from __future__ import annotations

from contract.hyperparameters import Strategy
from jobs import catalog
from jobs.platform import PlatformSettings
from jobs.request.field_rules import image_parts
from jobs.request.schema import JobRequest

PYTORCH_FRAMEWORK = "pytorch"  # SageMaker's PyTorch training images (aws/deep-learning-containers)
SMP_FRAMEWORK = "pytorch-smp"  # the SMP v2 image


def image_key(request: JobRequest, platform: PlatformSettings, instance_type: str) -> tuple[str, str, str]:
    """(framework, version, device) to look up in platform.images."""
    spec = catalog.lookup(instance_type)
    device = spec.kind if spec else "gpu"
    if request.strategy is Strategy.SMP:
        return SMP_FRAMEWORK, request.framework_version or platform.default_smp_version, device
    return PYTORCH_FRAMEWORK, request.framework_version or platform.default_framework_version, device


def table_image(request: JobRequest, platform: PlatformSettings, instance_type: str) -> str | None:
    """The platform's image for this request on `instance_type` (None when its table has none: image_problem)."""
    framework, version, device = image_key(request, platform, instance_type)
    return platform.images.get(framework, {}).get(version, {}).get(device)


def starts_through_platform_entry(request: JobRequest, platform: PlatformSettings, instance_type: str) -> bool:
    """Whether the job starts through jobs.render.container_entry: the platform's PyTorch images do (their entry is
    known), whether the platform resolved one or the request named it; any other image, the SMP image included,
    keeps its own. By the image itself: a request naming the platform's own image must not lose the stop relay."""
    return (request.image or table_image(request, platform, instance_type)) in platform_pytorch_images(platform)


def platform_pytorch_images(platform: PlatformSettings) -> set[str]:
    """Every PyTorch image URI in the platform's table (each version, each device)."""
    return {uri for devices in platform.images.get(PYTORCH_FRAMEWORK, {}).values() for uri in devices.values()}


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


def allowed_image_sources(platform: PlatformSettings) -> list[str]:
    """`<registry>/` of every image in the platform's table, then its allowed_image_repositories."""
    registries = {f"{parts[0]}/" for versions in platform.images.values() for devices in versions.values()
                  for uri in devices.values() if (parts := image_parts(uri))}
    return sorted(registries) + [r for r in platform.allowed_image_repositories if r not in registries]


def source_covers(source: str, repository: str) -> bool:
    """Whether an allowed source takes `repository` (`<registry>/<repo>`, or another source): `<registry>/` holds
    every repository of the registry, `<registry>/<repo>` that repository and those under it."""
    repository = repository.rstrip("/")
    return repository == source.rstrip("/") or repository.startswith(source if source.endswith("/") else source + "/")


def image_source_problem(image: str, platform: PlatformSettings) -> str | None:
    """Why `image` is not from a repository the platform allows; None when it is."""
    parts = image_parts(image)
    if parts is None:  # the field rule (request_fields.check_image) reports its form
        return None
    reference = f"{parts[0]}/{parts[1]}"
    sources = allowed_image_sources(platform)
    if any(source_covers(source, reference) for source in sources):
        return None
    return (f"{image!r} is not from a repository this platform allows ({', '.join(sources) or 'none'}); use one of "
            "them, or leave image out for the platform's own, or ask the platform team to add the repository "
            "(platform config `allowed_image_repositories`)")
