"""Rules a parsed request must obey on one deployed platform: its allowed instance types, training plans,
FSx file system, dataset bucket and container images. `validate_for_platform` raises RequestInvalid
naming every problem's field."""

from __future__ import annotations

from contract.errors import Problem, RequestInvalid
from jobs import catalog
from jobs.api_limits import PLATFORM_TAGS
from jobs.images import image_problem
from jobs.parallelism import TORCH_NATIVE, request_problems
from jobs.platform import PlatformSettings
from jobs.request_fields import dataset_kind
from jobs.request_schema import JobRequest


def validate_for_platform(request: JobRequest, platform: PlatformSettings) -> None:
    """Raise RequestInvalid for what the platform cannot run: types, plans, FSx, images."""
    found: list[Problem] = []
    found += _instance_type_problems(request, platform)
    found += _training_plan_problems(request, platform)
    found += _dataset_problems(request, platform)
    found += _readable_problems(request, platform)
    found += _tag_problems(request, platform)
    found += _parallelism_problems(request, platform)
    if request.image is None and (problem := image_problem(request, platform)):
        found.append(Problem(*problem))
    if found:
        raise RequestInvalid(found)


def is_local_platform(platform: PlatformSettings) -> bool:
    """`trainctl local` renders with settings whose name_prefix is `local` (no AWS behind them)."""
    return platform.name_prefix == "local" or getattr(platform, "local", False)


def _instance_type_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    allowed = set(platform.allowed_instance_types)
    if not allowed:
        return []
    typed = [("instance.type" if i == 0 else f"instance.fallbacks[{i - 1}]", t)
             for i, t in enumerate(request.instance_types)]
    typed += [(f"instance_groups[{i}].type", g.type) for i, g in enumerate(request.instance_groups)]
    return [Problem(path, f"{t} is not allowed on this platform; allowed: {', '.join(sorted(allowed))}")
            for path, t in typed if t not in allowed]


def _training_plan_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    if request.training_plan is None:
        return []
    plan = platform.training_plans.get(request.training_plan)
    if plan is None:
        known = ", ".join(sorted(platform.training_plans)) or "none"
        return [Problem("training_plan", f"{request.training_plan!r} is not one of the platform's training plans "
                                         f"({known})")]
    found = []
    if request.instance is not None:
        if request.instance.type != plan.instance_type:
            found.append(Problem("instance.type", f"{request.instance.type} does not match training plan "
                                                  f"{plan.name!r}, which reserves {plan.instance_type}"))
        if request.instance.count > plan.instance_count:
            found.append(Problem("instance.count", f"{request.instance.count} is more than training plan "
                                                   f"{plan.name!r} reserves ({plan.instance_count})"))
    return found


def _readable_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """S3 datasets the execution role can read: the dataset bucket, under dataset_prefix."""
    if platform.dataset_prefix is None or is_local_platform(platform):
        return []
    readable = f"s3://{platform.dataset_bucket}/{platform.dataset_prefix.lstrip('/')}"
    return [Problem(path, f"{uri!r} is outside what the training jobs may read; put the data under {readable}")
            for path, uri in (("dataset", request.dataset), ("validation_dataset", request.validation_dataset))
            if uri is not None and dataset_kind(uri) == "s3" and not (uri.rstrip("/") + "/").startswith(readable)]


def _tag_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """The platform's own tags (`<name_prefix>:run-id`, ...) are written by the launcher, never by a request."""
    own = f"{platform.name_prefix}:".lower()
    return [Problem(f"tags.{key}", f"keys starting with {own!r} are the platform's own (it writes "
                                   f"{', '.join(own + t for t in PLATFORM_TAGS)}); rename the tag")
            for key in request.tags if key.lower().startswith(own)]


def _dataset_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    found = []
    for path, uri in (("dataset", request.dataset), ("validation_dataset", request.validation_dataset)):
        if uri is None:
            continue
        kind = dataset_kind(uri)
        if (kind == "fsx" or request.effective_input_mode == "FSx") and platform.fsx is None:
            found.append(Problem(path, "this platform has no FSx for Lustre file system; use an s3:// dataset"))
        elif request.effective_input_mode == "FSx" and kind == "s3":
            bucket = uri[len("s3://"):].split("/", 1)[0]
            if bucket != platform.dataset_bucket:
                found.append(Problem(path, f"input_mode FSx reads the dataset bucket {platform.dataset_bucket!r} "
                                           f"through FSx; {bucket!r} is not linked to the file system"))
        if kind == "local" and not is_local_platform(platform):
            found.append(Problem(path, f"{uri!r} is a local folder: it only runs with `trainctl local`; upload it "
                                       "to S3 or FSx"))
    return found


def _parallelism_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """The torch-native degrees against the cluster: GPUs per instance and instances. `trainctl local` checks
    them against its process count instead (it knows --nproc only when it runs)."""
    if is_local_platform(platform) or request.instance is None or request.strategy.value not in TORCH_NATIVE:
        return []
    spec = catalog.lookup(request.instance.type)
    return request_problems(request, hosts=request.instance.count, per_host=max(1, spec.accelerators if spec else 1))
