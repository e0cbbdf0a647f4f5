"""The test-only SageMaker world behaves like SageMaker where the scenarios rely on it."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from moto import mock_aws

from jobs.platform import PlatformSettings
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from tests.launcher import sagemaker_sync as sm
from tests.launcher.definition import REGION
from tests.launcher.inputs import SETTINGS_FILE, job_request


@pytest.fixture
def create_request() -> dict:
    platform = PlatformSettings.from_json(SETTINGS_FILE.read_text())
    return render_create_training_job(
        parse_request(job_request()), platform, run_id="unit-0a1b2c3d", attempt=1
    )


@pytest.fixture
def client():
    with mock_aws(), sm.sagemaker_hooks():
        # One try per call, as the integration and the handlers make them: an emulated throttle shows.
        yield boto3.client("sagemaker", region_name=REGION, config=Config(retries={"total_max_attempts": 1}))


def test_a_reused_job_name_is_rejected(client, create_request):
    world = sm.ScriptedSageMaker([sm.completed(), sm.completed()])
    world.create(client, create_request)
    with pytest.raises(ClientError) as raised:
        world.create(client, create_request)
    # As the real API answers (moto itself would say ValidationException, or accept the name).
    assert raised.value.response["Error"]["Code"] == "ResourceInUse"
    assert "must be unique" in raised.value.response["Error"]["Message"]
    assert list(world.statuses()) == [create_request["TrainingJobName"]]


def test_requests_botocore_would_reject_are_rejected(client, create_request):
    world = sm.ScriptedSageMaker([sm.completed()])
    bad = json.loads(json.dumps(create_request))
    bad["ResourceConfig"]["InstanceCount"] = "2"
    del bad["RoleArn"]
    with pytest.raises(sm.InvalidCreateRequest, match="RoleArn") as raised:
        world.create(client, bad)
    assert "InstanceCount" in str(raised.value)


def test_a_job_walks_through_its_statuses(client, create_request):
    world = sm.ScriptedSageMaker([sm.spot_interrupted()])
    world.create(client, create_request)
    name = create_request["TrainingJobName"]
    seen = []
    while (described := world.describe(client, name))["TrainingJobStatus"] in ("InProgress", "Stopping"):
        seen.append(described["SecondaryStatus"])
    assert seen == ["Downloading", "Training", "Interrupted", "Starting", "Stopping"]
    assert world.describe_calls == len(seen) + 1
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == (
        "Stopped",
        "MaxWaitTimeExceeded",
    )
    transitions = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert transitions == list(sm.spot_interrupted().secondary)
    # Every reader sees the same job: a plain DescribeTrainingJob agrees with the poller.
    assert client.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "MaxWaitTimeExceeded"


def test_a_failed_job_carries_its_reason_and_no_artifacts(client, create_request):
    world = sm.ScriptedSageMaker([sm.algorithm_error()])
    world.create(client, create_request)
    name = create_request["TrainingJobName"]
    while (described := world.describe(client, name))["TrainingJobStatus"] == "InProgress":
        pass
    assert described["TrainingJobStatus"] == "Failed"
    assert described["FailureReason"].startswith("AlgorithmError:")
    assert "ModelArtifacts" not in described and described["FinalMetricDataList"] == []


def test_api_errors_at_create_create_no_job(client, create_request):
    world = sm.ScriptedSageMaker([sm.resource_limit_exceeded()])
    with pytest.raises(ClientError) as raised:
        world.create(client, create_request)
    assert raised.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    assert "ResourceLimitExceeded" in sm.MODELLED_ERRORS  # so Step Functions names it ...Exception
    assert client.list_training_jobs()["TrainingJobSummaries"] == []
    assert len(world.create_calls) == 1


def test_a_5xx_after_create_leaves_the_job_running(client, create_request):
    world = sm.ScriptedSageMaker([sm.created_then_5xx()])
    with pytest.raises(ClientError) as raised:
        world.create(client, create_request)
    error = raised.value.response
    assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("InternalFailure", 500)
    name = create_request["TrainingJobName"]
    assert world.statuses() == {name: "InProgress"}
    assert client.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"


def test_a_resent_create_meets_its_own_name_in_use(client, create_request):
    world = sm.ScriptedSageMaker([sm.name_in_use()])
    with pytest.raises(ClientError) as raised:
        world.create(client, create_request)
    assert raised.value.response["Error"]["Code"] == "ResourceInUse"
    assert len(world.create_calls) == 2 and world.statuses() == {create_request["TrainingJobName"]: "InProgress"}


def test_describe_is_throttled_while_the_job_trains_whoever_asks(client, create_request):
    world = sm.ScriptedSageMaker([sm.throttled_while_training(describes=2)])
    world.create(client, create_request)
    name = create_request["TrainingJobName"]
    assert client.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "Downloading"
    assert client.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "Training"
    for _ in range(2):
        with pytest.raises(ClientError) as raised:
            client.describe_training_job(TrainingJobName=name)
        assert raised.value.response["Error"]["Code"] == "ThrottlingException"
    # A throttled call does not move the job on; the next one does.
    assert client.describe_training_job(TrainingJobName=name)["SecondaryStatus"] == "Uploading"


def test_stop_ends_a_running_job_and_refuses_others(client, create_request):
    world = sm.ScriptedSageMaker([sm.completed()])
    world.create(client, create_request)
    name = create_request["TrainingJobName"]
    client.stop_training_job(TrainingJobName=name)
    assert client.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "Stopped"
    assert world.statuses() == {name: "Stopped"} and world.stop_calls == [name]
    for job in (name, "mltrain-no-such-job"):
        with pytest.raises(ClientError) as raised:
            client.stop_training_job(TrainingJobName=job)
        assert raised.value.response["Error"]["Code"] == "ValidationException"
