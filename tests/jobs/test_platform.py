"""The platform-settings document (the wide test one, tests/jobs/data/platform.json): read by the schema engine,
one problem per bad key, and back to JSON."""

from __future__ import annotations

import json

import pytest

from jobs.platform import PlatformSettings, PlatformSettingsInvalid, TrainingPlan

from .conftest import PLATFORM_FILE


def document() -> dict:
    return json.loads(PLATFORM_FILE.read_text())


def problems_of(doc) -> dict[str, str]:
    with pytest.raises(PlatformSettingsInvalid) as info:
        PlatformSettings.from_dict(doc)
    return {p.path: p.message for p in info.value.problems}


def test_the_test_platform_reads_and_round_trips(platform):
    assert platform.training_plans["p5-reserved"] == TrainingPlan(
        "p5-reserved", "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-reserved", "ml.p5.48xlarge", 4)
    assert platform.fsx is not None and platform.fsx.linked_path == "datasets"
    assert PlatformSettings.from_json(platform.to_json()) == platform
    assert json.loads(platform.to_json()) == platform.to_dict()


def test_optional_sections_may_be_null_or_absent():
    doc = {**document(), "fsx": None, "training_plans": None}
    del doc["default_warm_pool_minutes"]
    settings = PlatformSettings.from_dict(doc)
    assert (settings.fsx, settings.training_plans, settings.default_warm_pool_minutes) == (None, {}, 0)


def test_one_problem_per_bad_key():
    doc = {**document(), "regoin": "us-east-1", "subnet_ids": "subnet-1", "default_warm_pool_minutes": -1,
           "images": {"pytorch": {"2.8.0": {"gpu": 3}}},
           "training_plans": {"p5": {"arn": "arn:x", "instance_type": "ml.p5.48xlarge", "instance_count": "2"}}}
    del doc["kms_key_arn"]
    found = problems_of(doc)
    assert found == {
        "regoin": "unknown field; did you mean 'region'?",
        "subnet_ids": "expected a list of strings, got str",
        "default_warm_pool_minutes": "must be at least 0, got -1",
        "images.pytorch.2.8.0.gpu": "expected an image URI, got 3",
        "kms_key_arn": found["kms_key_arn"],
        "training_plans.p5.instance_count": "expected an integer, got string '2'",
    }
    assert found["kms_key_arn"].startswith("required field is missing")


def test_the_error_is_a_value_error_naming_each_key():
    with pytest.raises(ValueError, match=r"^allowed_instance_types\[0\]: expected a non-empty string"):
        PlatformSettings.from_dict({**document(), "allowed_instance_types": [""]})
    assert problems_of([]) == {"": "platform settings are a JSON object, got list"}


def test_request_policy_entries_are_checked_naming_the_entry():
    document = {**json.loads(PLATFORM_FILE.read_text()), "environment_patterns": ["MYLIB_*", "MY LIB", "A*B"],
                "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/team-a", "docker.io"]}
    with pytest.raises(PlatformSettingsInvalid) as info:
        PlatformSettings.from_dict(document)
    found = {p.path for p in info.value.problems}
    assert found == {"environment_patterns[1]", "environment_patterns[2]", "allowed_image_repositories[1]"}, found


@pytest.mark.parametrize(("server", "refused"), [
    ("arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/shared", None),
    ("https://mlflow.example.com:5000", None),
    ("arn:aws:sagemaker:us-east-1:1234:mlflow-tracking-server/shared", "SageMaker MLflow ARN"),  # not an account
    ("file:/tmp/mlruns", "SageMaker MLflow ARN"),  # a folder of this machine: no job could reach it
    ("http://host name", "SageMaker MLflow ARN"),
    ("", "must not be empty"),
])
def test_the_mlflow_server_is_one_a_job_can_log_to(server, refused):
    document = {**json.loads(PLATFORM_FILE.read_text()), "mlflow_tracking_uri": server}
    if refused is None:
        assert PlatformSettings.from_dict(document).mlflow_tracking_uri == server
        return
    with pytest.raises(PlatformSettingsInvalid) as info:
        PlatformSettings.from_dict(document)
    assert [p.path for p in info.value.problems] == ["mlflow_tracking_uri"] and refused in str(info.value)


@pytest.mark.parametrize(("prefix", "uri", "key"), [
    ("datasets/", "s3://{bucket}/datasets/tokens/train/", "tokens/train"),
    ("datasets/", "s3://{bucket}/datasets/", ""),
    ("datasets/", "s3://{bucket}/datasets-old/tokens/", None),  # only starts like the prefix
    ("datasets/", "s3://{bucket}/other/tokens/", None),
    ("datasets/", "s3://another-bucket/datasets/tokens/", None),
    ("team-a/data/", "s3://{bucket}/team-a/data/x", "x"),
    (None, "s3://{bucket}/datasets/tokens/", "datasets/tokens"),  # no prefix published: the whole bucket
])
def test_a_datasets_key_under_the_linked_prefix(platform, prefix, uri, key):
    settings = PlatformSettings.from_dict({**platform.to_dict(), "dataset_prefix": prefix})
    assert settings.dataset_key(uri.format(bucket=platform.dataset_bucket)) == key
