"""Run identity, in the synthesized state machine in moto: a run's id and its jobs' names cannot be taken by
another run, by chance or on purpose, and a job that holds an attempt's name is never the run's own.

The old scheme (the request name plus 32 bits of a hash of the execution name) let two executions share one
run id: the second met "name in use", adopted the first run's job by its checkpoint prefix, and both
succeeded on one job. The executions below collide under that scheme.
"""

from __future__ import annotations

import hashlib
import itertools

import boto3
import pytest
from moto.sagemaker.models import sagemaker_backends

from contract.container import ENV_RUN_ID
from jobs.render import training_job as render
from tests.launcher import sagemaker_sync as sm
from tests.launcher.definition import ACCOUNT, REGION
from tests.launcher.harness import STATE_MACHINE_ROLE
from tests.launcher.inputs import job_request
from tests.launcher.paths import START, SUCCESS_TAIL


def old_digest(execution_name: str) -> str:
    """The run id's suffix before run ids were random: 8 hex digits (32 bits) of the execution name's hash."""
    return hashlib.sha256(execution_name.encode()).hexdigest()[:8]


def colliding_execution_names(tag: str) -> tuple[str, str]:
    """Two execution names whose old digests match (a birthday search: about 2**16 names)."""
    seen: dict[str, str] = {}
    for i in itertools.count():
        name = f"{tag}-{i}"
        digest = old_digest(name)
        if digest in seen:
            return seen[digest], name
        seen[digest] = name
    raise AssertionError("unreachable")


def test_executions_that_collided_under_the_old_scheme_are_two_runs(harness):
    first_name, second_name = colliding_execution_names("collide")
    assert first_name != second_name and old_digest(first_name) == old_digest(second_name)
    first = harness.run(job_request(), [sm.completed(train_loss=1.5)], name=first_name)
    second = harness.run(job_request(), [sm.completed(train_loss=2.5)], name=second_name)
    for result, loss in ((first, 1.5), (second, 2.5)):
        assert result.status == "SUCCEEDED", (result.error, result.cause)
        assert result.states_entered == [*START, *SUCCESS_TAIL]  # no "name in use", no Decide
        assert list(result.jobs.values()) == ["Completed"]
        assert result.output["final_metrics"]["train_loss"] == loss  # each trained its own request
    assert first.output["run_id"] != second.output["run_id"]
    assert first.output["checkpoint_s3_uri"] != second.output["checkpoint_s3_uri"]
    assert set(first.jobs).isdisjoint(second.jobs)
    for result in (first, second):
        (create,) = result.create_calls
        assert create["Environment"][ENV_RUN_ID] == result.output["run_id"]


def _squat(name: str, marker: str, status: str = "InProgress") -> None:
    """Another party's training job under `name`, carrying another run's marker."""
    client = boto3.client("sagemaker", region_name=REGION)
    client.create_training_job(
        TrainingJobName=name,
        AlgorithmSpecification={"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/other:latest",
                                "TrainingInputMode": "File"},
        RoleArn=STATE_MACHINE_ROLE,
        OutputDataConfig={"S3OutputPath": "s3://someone-else/output/"},
        ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )
    job = sagemaker_backends[ACCOUNT][REGION].training_jobs[name]
    job.environment = {ENV_RUN_ID: marker}
    job.training_job_status, job.secondary_status = status, "Training"


@pytest.mark.parametrize("marker", ["another-run-0000000000000000", None], ids=["other-marker", "no-marker"])
def test_a_job_squatting_an_attempts_name_is_not_adopted(harness, monkeypatch, marker):
    # The name generator hands out a known name first; somebody created a job under it before the launch.
    squatted = f"mltrain-squatted-{marker is None:d}-a1"
    names = iter([squatted])
    real = render.job_name
    monkeypatch.setattr(render, "job_name", lambda *args: next(names, None) or real(*args))
    _squat(squatted, marker)
    result = harness.run(job_request(), [sm.completed(train_loss=1.25), sm.completed(train_loss=1.25)],
                         name=f"squatted-{marker is None:d}")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered[:3] == START and result.states_entered.count("Launch") == 2
    assert result.job_names[0] == squatted and result.job_names[1] != squatted
    # The run completed on its own job, under a fresh name, with its own marker.
    assert list(result.jobs) == [result.job_names[1]] and list(result.jobs.values()) == ["Completed"]
    assert result.create_calls[1]["Environment"][ENV_RUN_ID] == result.output["run_id"]
    first, second = result.output["attempts"]
    assert first["status"] == "NotCreated" and "taken by a job this run did not create" in first["reason"]
    assert second["status"] == "Completed" and result.output["final_metrics"]["train_loss"] == 1.25
    # Never stopped, never waited on: the squatter still runs as its owner left it.
    assert squatted not in result.stop_calls and "WaitForJob" not in result.states_entered
    assert sagemaker_backends[ACCOUNT][REGION].training_jobs[squatted].training_job_status == "InProgress"
