"""Every cloud example plans and renders on a platform synthesized from the default cdk.json: the settings
document the platform stack publishes, resolved by tools/platform_settings.py."""

from __future__ import annotations

import json

import pytest

from jobs.platform import PlatformSettings
from jobs.platform_rules import validate_for_platform
from jobs.render import render_create_training_job
from jobs.request import parse_request
from tools import platform_settings as tool

from .conftest import EXAMPLES, assert_valid_create_request

CLOUD_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.json")
                        if p.name != "platform-settings.json" and not p.name.startswith("local-"))


@pytest.fixture(scope="module")
def synthesized(cdk_out) -> dict:
    return tool.settings_document(cdk_out)


def test_the_published_document_reads_and_holds_no_token(synthesized):
    platform = PlatformSettings.from_dict(synthesized)
    assert platform.dataset_prefix == "datasets/"
    text = repr(synthesized)
    assert "Token[" not in text and "Fn::" not in text and "${" not in text
    assert platform.dataset_bucket.startswith(f"{platform.name_prefix}-datasets-")


@pytest.mark.parametrize("path", CLOUD_EXAMPLES, ids=lambda p: p.stem)
def test_every_cloud_example_plans_and_renders_on_the_default_platform(synthesized, path):
    platform = PlatformSettings.from_dict(synthesized)
    request = parse_request(json.loads(path.read_text()))
    validate_for_platform(request, platform)  # raises RequestInvalid naming the field
    create = render_create_training_job(request, platform, run_id="example-0a1b2c3d", attempt=1)
    assert_valid_create_request(create)
    assert create["AlgorithmSpecification"]["TrainingImage"] in {
        uri for versions in synthesized["images"].values() for devices in versions.values()
        for uri in devices.values()}


def test_the_tool_refuses_what_it_cannot_resolve():
    template = {"Resources": {"Queue1": {"Type": "AWS::SQS::Queue"}}, "Mappings": {}}
    with pytest.raises(tool.UnresolvedIntrinsic, match="AWS::SQS::Queue"):
        tool.resolve({"Ref": "Queue1"}, template, "mltrain")
    with pytest.raises(tool.UnresolvedIntrinsic, match="Fn::ImportValue"):
        tool.resolve({"Fn::ImportValue": "x"}, template, "mltrain")
