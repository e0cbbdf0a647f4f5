"""The run state the state machine carries: typed in the handlers, the same plain JSON between states."""

from __future__ import annotations

import dataclasses
import json

from contract.container import ENV_RUN_ID
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from jobs.retry import run_state as runs
from jobs.retry.classify import Category, Failure
from jobs.retry.run_state import Execution, RunState, is_ours

T0 = 1_800_000_000.0
KEYS = ["run_id", "name", "execution", "started_at", "started_epoch", "attempt", "job_name", "instance_type", "spot",
        "checkpoint_s3_uri", "tensorboard_s3_uri", "mlflow_tracking_uri", "mlflow_experiment", "counts", "waited_seconds", "attempts", "resumed_after", "plans_ended"]
ATTEMPT_KEYS = ["attempt", "job_name", "instance_type", "instance_count", "spot", "status", "secondary_status",
                "category", "reason", "started_at", "ended_at", "limit_seconds", "training_plan", "infra_check",
                "training_seconds", "billable_seconds",
                "lost_seconds", "looks", "lookup_errors", "stopped_by_launcher", "lost_is_upper_bound",
                "queued_seconds", "startup_seconds", "train_seconds", "checkpoint_seconds", "eval_seconds", "step",
                "checkpoint_saves"]
# The attempt's keys before the launcher waited on jobs left running: states of executions started then
# must still read.
EARLIER_ATTEMPT_KEYS = [k for k in ATTEMPT_KEYS[:17] if k not in ("limit_seconds", "training_plan", "infra_check")]


def started(platform) -> tuple:
    req = parse_request({"name": "gpt", "dataset": "s3://b-1/x/", "spot": True,
                         "instance": {"type": "ml.p4d.24xlarge", "fallbacks": ["ml.p4de.24xlarge"]}})
    run = runs.new_run(req, run_id="gpt-1234abcd", execution={"name": "e"}, now=T0)
    runs.start_attempt(run, render_create_training_job(req, platform, run_id="gpt-1234abcd", attempt=1),
                       attempt=1, now=T0)
    return req, run


def test_the_json_shape_is_the_state_machines(platform):
    req, run = started(platform)
    data = json.loads(run.to_json())
    assert list(data) == KEYS
    assert data["execution"] == {"name": "e", "start_time": "2027-01-15T08:00:00Z", "arn": ""}
    assert data["counts"] == {"capacity": 0, "spot_interruption": 0, "internal": 0, "quota": 0, "throttling": 0,
                              "api_error_streak": 0, "interruption": 0}
    assert list(data["attempts"][0]) == ATTEMPT_KEYS
    assert data["attempts"][0]["status"] == "InProgress" and data["name"] == "gpt"
    assert data["job_name"] == data["attempts"][0]["job_name"]
    # What Decide needs of the attempt's CreateTrainingJob request once the request itself has moved on.
    stopping = render_create_training_job(req, platform, run_id="gpt-1234abcd", attempt=1)["StoppingCondition"]
    assert data["attempts"][0]["limit_seconds"] == stopping["MaxWaitTimeInSeconds"]  # Spot: the wait bounds the job
    assert data["attempts"][0]["training_plan"] == "" and data["attempts"][0]["infra_check"] is req.infra_check
    assert RunState.from_json(run.to_json()) == run


def test_a_state_that_carried_the_request_still_reads(platform):
    """Executions started before the request left the run state (trainctl reads their histories; in-flight
    ones reach the new functions): `request` becomes `name`, the current job's name comes from its attempt."""
    req, run = started(platform)
    data = json.loads(run.to_json())
    del data["name"], data["job_name"]
    data["request"] = req.to_dict()
    for key in ("limit_seconds", "training_plan", "infra_check"):
        del data["attempts"][0][key]
    earlier = RunState.from_dict(data)
    assert earlier.name == "gpt" and earlier.job_name == run.current.job_name


def test_failures_are_counted_by_category_and_written_as_strings(platform):
    _, run = started(platform)
    runs.finish_attempt(run, now=T0 + 60, job=None, failure=Failure(Category.QUOTA, "quota", False))
    assert (run.counts.quota, run.counts.api_error_streak, run.current.status) == (1, 1, "NotCreated")
    data = json.loads(json.dumps(run.to_dict()))
    assert data["attempts"][0]["category"] == "quota" and type(run.to_dict()["attempts"][0]["category"]) is str
    assert RunState.from_dict(data) == run
    # a failure the policy does not bound is not counted, and ends the API-error streak
    run.counts.record(Category.USER_ERROR)
    assert run.counts.api_error_streak == 0 and run.counts.of(Category.USER_ERROR) == 0


def test_a_state_written_before_runs_could_be_resumed_still_reads(platform):
    _, run = started(platform)
    data = json.loads(run.to_json())
    del data["resumed_after"]
    earlier = RunState.from_dict(data)
    assert earlier.resumed_after == 0 and earlier.attempts_used == earlier.attempt == 1


def test_a_state_written_before_the_watch_fields_still_reads(platform):
    _, run = started(platform)
    data = json.loads(run.to_json())
    data["attempts"] = [{k: v for k, v in a.items() if k in EARLIER_ATTEMPT_KEYS} for a in data["attempts"]]
    again = RunState.from_dict(data)
    assert (again.current.looks, again.current.lookup_errors, again.current.stopped_by_launcher) == (0, 0, False)
    assert again.current.job_name == run.current.job_name


def test_a_state_written_before_mlflow_still_reads(platform):
    # Executions started before the platform logged to MLflow carry states without its two keys.
    _, run = started(dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com"))
    assert (run.mlflow_tracking_uri, run.mlflow_experiment) == ("https://mlflow.example.com", platform.name_prefix)
    data = {k: v for k, v in json.loads(run.to_json()).items() if not k.startswith("mlflow_")}
    assert (RunState.from_dict(data).mlflow_tracking_uri, RunState.from_dict(data).mlflow_experiment) == ("", "")


ROLE = "arn:aws:iam::123456789012:role/mltrain/ExecutionRole"


def _job(marker=None, checkpoint=None, role=ROLE) -> dict:
    job = {"TrainingJobName": "mltrain-x-a1", "TrainingJobStatus": "InProgress", "RoleArn": role}
    if marker is not None:
        job["Environment"] = {ENV_RUN_ID: marker}
    if checkpoint is not None:
        job["CheckpointConfig"] = {"S3Uri": checkpoint}
    return job


def test_a_job_is_the_runs_own_only_by_its_marker_and_the_platforms_role():
    run = RunState(run_id="gpt-abcdefghijklmnop", name="gpt", execution=Execution(), started_at="",
                   started_epoch=0.0, checkpoint_s3_uri="s3://ckpt/mltrain/gpt-abcdefghijklmnop/checkpoints/")
    assert is_ours(run, _job(run.run_id), ROLE)
    # The same name and checkpoint prefix prove nothing: anyone allowed to create jobs can copy them.
    assert not is_ours(run, _job("gpt-qrstuvwxyz234567", run.checkpoint_s3_uri), ROLE)
    assert not is_ours(run, _job(None, run.checkpoint_s3_uri), ROLE)
    assert not is_ours(run, _job(None), ROLE)
    # Nor does the marker, which is public: a job that runs as another role was not created by the launcher.
    assert not is_ours(run, _job(run.run_id, role="arn:aws:iam::123456789012:role/squatter"), ROLE)
    assert not is_ours(run, _job(run.run_id, role=None), ROLE)


def test_runs_started_before_the_marker_keep_the_checkpoint_rule():
    legacy = RunState(run_id="gpt-1234abcd", name="gpt", execution=Execution(), started_at="", started_epoch=0.0,
                      checkpoint_s3_uri="s3://ckpt/mltrain/gpt-1234abcd/checkpoints/")
    assert is_ours(legacy, _job(None, legacy.checkpoint_s3_uri), ROLE)
    assert not is_ours(legacy, _job(None, "s3://ckpt/mltrain/other/checkpoints/"), ROLE)
    assert not is_ours(legacy, _job("someone-else", legacy.checkpoint_s3_uri), ROLE)
