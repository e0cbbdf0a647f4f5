"""Which region trainctl talks to: --region, then (submit --platform FILE) the file's, then AWS_REGION, then
AWS_DEFAULT_REGION, then the AWS config file. Each platform below lives in its own region under moto."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from jobs.naming import new_run_id
from jobs.platform import PlatformSettings
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from tests.cli import machines
from tests.cli.conftest import DATA, ROLE, run

REGIONS = ("eu-west-1", "us-west-2", "eu-central-1", "ap-southeast-2")


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform_doc):
    """A platform deployed in each of REGIONS (its checkpoint bucket names the region), no region set."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    with mock_aws():
        for region in REGIONS:
            doc = platform_doc | {"region": region, "checkpoint_bucket": f"checkpoints-{region}"}
            boto3.client("ssm", region_name=region).put_parameter(
                Name="/mltrain/platform-settings", Value=json.dumps(doc), Type="String")
        yield monkeypatch


def _rendered_region(*args: str) -> str:
    result = run("render", DATA / "ddp.json", *args)  # reads the settings from SSM in the chosen region
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["CheckpointConfig"]["S3Uri"].split("/")[2].removeprefix("checkpoints-")


def test_each_source_wins_over_the_next(regions, tmp_path):
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-1\n")
    regions.setenv("AWS_CONFIG_FILE", str(config))
    assert _rendered_region() == "eu-west-1"
    regions.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert _rendered_region() == "us-west-2"
    regions.setenv("AWS_REGION", "eu-central-1")  # boto3 alone would ignore it
    assert _rendered_region() == "eu-central-1"
    assert _rendered_region("--region", "ap-southeast-2") == "ap-southeast-2"


def test_an_empty_aws_region_counts_as_unset(regions):
    regions.setenv("AWS_REGION", "")
    regions.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert _rendered_region() == "us-west-2"


def test_no_region_anywhere_says_how_to_set_one(regions):
    result = run("list")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "no AWS region configured" in result.stderr and "set AWS_REGION" in result.stderr


# ---- submit --platform FILE ------------------------------------------------------------------------------


def _deploy(region: str, platform_doc: dict) -> str:
    request = parse_request(json.loads((DATA / "ddp.json").read_text()))
    create = render_create_training_job(request, PlatformSettings.from_dict(platform_doc),
                                        run_id=new_run_id(request.name), attempt=1)
    arn = boto3.client("stepfunctions", region_name=region).create_state_machine(
        name="mltrain-launcher", definition=json.dumps(machines.training_machine(create, machines.WAIT_LONG)),
        roleArn=ROLE)["stateMachineArn"]
    boto3.client("ssm", region_name=region).put_parameter(Name="/mltrain/state-machine-arn", Value=arn,
                                                          Type="String")
    return arn


def _executions(arn: str) -> list[str]:
    region = arn.split(":")[3]
    listed = boto3.client("stepfunctions", region_name=region).list_executions(stateMachineArn=arn)
    return [e["name"] for e in listed["executions"]]


@pytest.fixture
def platform_in_eu(regions, platform_doc, tmp_path) -> Path:
    path = tmp_path / "platform-eu.json"
    path.write_text(json.dumps(platform_doc | {"region": "eu-west-1"}))
    return path


def test_submit_starts_in_the_platform_files_region_and_says_so(regions, platform_doc, platform_in_eu):
    in_file = _deploy("eu-west-1", platform_doc)
    in_env = _deploy("us-west-2", platform_doc)
    regions.setenv("AWS_REGION", "us-west-2")
    result = run("submit", DATA / "ddp.json", "--platform", platform_in_eu, "--name", "eu")
    assert result.exit_code == 0, result.output
    assert _executions(in_file) == ["eu"] and _executions(in_env) == []
    assert (f"note: using region eu-west-1 from {platform_in_eu}, not us-west-2 from the environment"
            in result.stderr)


def test_submit_region_option_wins_over_the_platform_file(regions, platform_doc, platform_in_eu):
    in_file = _deploy("eu-west-1", platform_doc)
    chosen = _deploy("us-west-2", platform_doc)
    result = run("submit", DATA / "ddp.json", "--platform", platform_in_eu, "--name", "w", "--region", "us-west-2")
    assert result.exit_code == 0, result.output
    assert _executions(chosen) == ["w"] and _executions(in_file) == []
    assert (f"note: --region us-west-2 differs from the region of {platform_in_eu} (eu-west-1); using us-west-2"
            in result.stderr)


def test_submit_with_agreeing_regions_has_nothing_to_say(regions, platform_doc, platform_in_eu):
    machine = _deploy("eu-west-1", platform_doc)
    regions.setenv("AWS_REGION", "eu-west-1")
    result = run("submit", DATA / "ddp.json", "--platform", platform_in_eu, "--name", "same")
    assert result.exit_code == 0 and _executions(machine) == ["same"]
    assert "note:" not in result.stderr
