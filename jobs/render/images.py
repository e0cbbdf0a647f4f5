"""Which container image an attempt runs: the request's override, else the platform's resolved table.

What a request may name, and whether the platform has an image for it, are the request rules' (jobs.request.image_rules,
checked before anything renders). The framework names are defined there; the constructs and stacks read them here.
"""

from __future__ import annotations

from jobs.platform import PlatformSettings
from jobs.request.image_rules import PYTORCH_FRAMEWORK, SMP_FRAMEWORK, image_key, table_image
from jobs.request.schema import JobRequest

__all__ = ["PYTORCH_FRAMEWORK", "SMP_FRAMEWORK", "resolve_image"]


def resolve_image(request: JobRequest, platform: PlatformSettings, instance_type: str) -> str:
    image = request.image or table_image(request, platform, instance_type)
    if image is None:  # the platform rules refuse such a request first (image_problem)
        raise KeyError(f"the platform has no image for {image_key(request, platform, instance_type)}")
    return image
