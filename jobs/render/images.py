"""Which container image an attempt runs: the request's override, else the platform's resolved table.

What a request may name, and whether the platform has an image for it, are the request rules' (jobs.request.image_rules,
checked before anything renders). The framework names are defined there; the constructs and stacks read them here.
"""

from __future__ import annotations

from jobs.platform import PlatformSettings
from jobs.request.image_rules import PYTORCH_FRAMEWORK, SMP_FRAMEWORK, image_key
from jobs.request.schema import JobRequest

__all__ = ["PYTORCH_FRAMEWORK", "SMP_FRAMEWORK", "resolve_image"]


def resolve_image(request: JobRequest, platform: PlatformSettings, instance_type: str) -> str:
    if request.image:
        return request.image
    framework, version, device = image_key(request, platform, instance_type)
    return platform.images[framework][version][device]
