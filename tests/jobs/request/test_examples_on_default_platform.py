"""Every cloud example plans and renders on a platform synthesized from the default cdk.json: the settings
document the platform stack publishes, resolved by tools/platform_settings.py; examples/platform-settings.json
is that document, checked in (the job-model tests use the wider tests/jobs/data/platform.json)."""

from __future__ import annotations

import json
import re

import pytest

from jobs.platform import PlatformSettings
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from jobs.request.platform_rules import validate_for_platform
from tests.jobs.conftest import EXAMPLES, assert_valid_create_request
from tools import platform_settings as tool

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


def test_the_checked_in_example_is_what_the_default_synth_publishes(synthesized):
    """examples/platform-settings.json is generated, not hand-written: regenerate it after a change to the stacks
    or cdk.json with `python -m tools.platform_settings --cdk-out cdk.out` (after `make synth`)."""
    checked_in = tool.EXAMPLE.read_text()
    # The source bundle's asset hash changes with every edit of training/ or contract/: masked on both sides.
    assert re.search(r"/[0-9a-f]{64}\.gz\"", checked_in), "the example names a real source bundle"
    assert tool.masked(checked_in) == tool.masked(tool.render(synthesized))


def test_check_ignores_the_asset_hash_only(cdk_out, tmp_path):
    out = tmp_path / "platform-settings.json"
    assert tool.main(["--cdk-out", str(cdk_out), "--out", str(out)]) == 0
    text = out.read_text()
    out.write_text(re.sub(r"[0-9a-f]{64}", "0" * 64, text))
    assert tool.main(["--cdk-out", str(cdk_out), "--out", str(out), "--check"]) == 0
    out.write_text(text.replace('"default_warm_pool_minutes": 0', '"default_warm_pool_minutes": 5'))
    assert tool.main(["--cdk-out", str(cdk_out), "--out", str(out), "--check"]) == 1


def test_the_tool_refuses_what_it_cannot_resolve():
    template = {"Resources": {"Queue1": {"Type": "AWS::SQS::Queue"}}, "Mappings": {}}
    with pytest.raises(tool.UnresolvedIntrinsic, match="AWS::SQS::Queue"):
        tool.resolve({"Ref": "Queue1"}, template, "mltrain")
    with pytest.raises(tool.UnresolvedIntrinsic, match="Fn::ImportValue"):
        tool.resolve({"Fn::ImportValue": "x"}, template, "mltrain")
