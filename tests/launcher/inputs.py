"""Test inputs: the platform settings document, and job requests whose retry waits are 0 so that
executions run in moments."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

# The platform settings the Lambda handlers get in PLATFORM_SETTINGS (the shape a deployed stack publishes).
SETTINGS_FILE = Path(__file__).with_name("platform_settings.json")

DATASET = "s3://mltrain-datasets-123456789012-us-east-1/datasets/tokens/"

# Every wait the policy takes is configurable; 0 keeps moto's Wait states (real-time) instant.
FAST_RETRY = {
    "capacity_wait_seconds": 0,
    "capacity_wait_max_seconds": 0,
    "interruption_wait_seconds": 0,
    "internal_error_wait_seconds": 0,
    "api_error_wait_seconds": 0,
    "api_error_wait_max_seconds": 0,
}


def job_request(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "name": "gpt-125m-fsdp",
        "strategy": "fsdp",
        "model": "gpt",
        "model_size": "125m",
        "dataset": DATASET,
        "instance": {"type": "ml.p4d.24xlarge", "count": 2, "fallbacks": ["ml.p5.48xlarge"]},
        "max_runtime_hours": 12,
        "checkpoint_interval": 200,
        "hyperparameters": {"lr": 0.0003, "global_batch_size": 256},
        "retry": dict(FAST_RETRY),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(request.get(key), dict):
            request[key] = {**request[key], **value}
        else:
            request[key] = copy.deepcopy(value)
    return request
