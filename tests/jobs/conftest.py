"""Fixtures for the job model: a test platform, the examples, and a strict CreateTrainingJob check.

The test platform (data/platform.json) is wider than examples/platform-settings.json, which is what a synth of the
default cdk.json publishes (test_examples_on_default_platform keeps it so): more instance types, a `p5-reserved`
training plan and no dataset_prefix, so the rules for those are exercised without a custom synth.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import boto3
import pytest
from botocore.model import Shape
from botocore.validate import validate_parameters

from jobs.platform import PlatformSettings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PLATFORM_FILE = Path(__file__).with_name("data") / "platform.json"
REQUEST_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.json") if p.name != "platform-settings.json")


def load_platform() -> PlatformSettings:
    return PlatformSettings.from_json(PLATFORM_FILE.read_text())


@pytest.fixture(scope="session")
def platform() -> PlatformSettings:
    return load_platform()


@pytest.fixture
def platform_env(monkeypatch, platform):
    """PLATFORM_SETTINGS as the launcher stack sets it for the Lambda functions."""
    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps(platform.to_dict()))
    return platform


_INPUT_SHAPE = None


def create_training_job_shape() -> Shape:
    global _INPUT_SHAPE
    if _INPUT_SHAPE is None:
        client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
        _INPUT_SHAPE = client.meta.service_model.operation_model("CreateTrainingJob").input_shape
    return _INPUT_SHAPE


def _walk(value, shape: Shape, path: str, problems: list[str]) -> None:
    """What botocore's validator leaves out: enums, maximum lengths and sizes, and patterns.

    Patterns written in Java syntax that Python cannot compile (\\p{L}...) are skipped.
    """
    meta = shape.metadata
    if shape.type_name == "structure":
        for name, member in shape.members.items():
            if name in value:
                _walk(value[name], member, f"{path}.{name}", problems)
    elif shape.type_name == "list":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} items > {meta['max']}")
        for i, item in enumerate(value):
            _walk(item, shape.member, f"{path}[{i}]", problems)
    elif shape.type_name == "map":
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: {len(value)} entries > {meta['max']}")
        for k, v in value.items():
            _walk(k, shape.key, f"{path}<key {k}>", problems)
            _walk(v, shape.value, f"{path}.{k}", problems)
    elif shape.type_name == "string":
        if shape.enum and value not in shape.enum:
            problems.append(f"{path}: {value!r} not in the enum")
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{path}: longer than {meta['max']}")
        pattern = meta.get("pattern")
        if pattern and r"\p{L}" in pattern:  # tag keys and values: letters, separators, numbers, _.:/=+-@
            if not all(ch.isalnum() or ch.isspace() or ch in "_.:/=+-@" for ch in value):
                problems.append(f"{path}: {value!r} has characters outside {pattern}")
        elif pattern:
            try:
                compiled = re.compile(pattern)
            except re.error:
                compiled = None
            if compiled is not None and not compiled.fullmatch(value):
                problems.append(f"{path}: {value!r} does not match {pattern}")
    elif shape.type_name in ("integer", "long") and "max" in meta and value > meta["max"]:
        problems.append(f"{path}: {value} > {meta['max']}")


def assert_valid_create_request(create: dict) -> None:
    """botocore's own parameter validation, plus enums, maxima and patterns."""
    shape = create_training_job_shape()
    validate_parameters(create, shape)  # raises ParamValidationError
    problems: list[str] = []
    _walk(create, shape, "", problems)
    assert not problems, "\n".join(problems)
