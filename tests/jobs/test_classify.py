"""Failure classification: every category, from a description in the Cause, a plain message, or an API error."""

from __future__ import annotations

import json

import pytest

from jobs import classify as c
from jobs.classify import classify_api_error, classify_description, classify_failure, parse_cause, to_epoch

CAPACITY_REASON = ("CapacityError: Unable to provision requested ML compute capacity. "
                   "Please retry using a different ML instance type.")


def job(status="Failed", secondary="Failed", reason=None, **extra) -> dict:
    d = {"TrainingJobName": "mltrain-run-1234abcd-a1", "TrainingJobStatus": status, "SecondaryStatus": secondary}
    if reason is not None:
        d["FailureReason"] = reason
    d.update(extra)
    return d


@pytest.mark.parametrize(("description", "category"), [
    (job(reason=CAPACITY_REASON), c.CAPACITY),
    (job(reason="InsufficientCapacityError: not enough capacity"), c.CAPACITY),
    (job("Stopped", "Stopped", reason="Training job exceeded MaxPendingTimeInSeconds"), c.CAPACITY),
    (job("Failed", "Failed", reason="", SecondaryStatusTransitions=[
        {"Status": "Starting", "StartTime": "2026-11-21T08:00:00Z", "EndTime": "2026-11-21T08:00:10Z"},
        {"Status": "Pending", "StartTime": "2026-11-21T08:00:10Z", "EndTime": "2026-11-21T09:30:00Z"}]),
     c.CAPACITY),
    (job("Stopped", "Interrupted"), c.SPOT_INTERRUPTION),
    (job("Failed", "Interrupted", reason="Spot interruption"), c.SPOT_INTERRUPTION),
    (job("Stopped", "MaxWaitTimeExceeded"), c.SPOT_INTERRUPTION),
    (job(reason="InternalServerError: We encountered an internal error. Please try again."), c.INTERNAL),
    (job(reason="AlgorithmError: ExecuteUserScriptError: Command \"/opt/conda/bin/python3 train.py\""),
     c.USER_ERROR),
    (job(reason="ClientError: Data download failed: NoSuchKey"), c.USER_ERROR),
    (job(reason="ClientError: Please ensure the S3 path exists"), c.USER_ERROR),
    (job("Stopped", "Stopped"), c.USER_STOP),
    (job("Stopped", "MaxRuntimeExceeded"), c.MAX_RUNTIME),
    (job(reason="Something nobody has seen before"), c.UNKNOWN),
    # the user's own error, whatever its message says
    (job(reason="AlgorithmError: RuntimeError: CUDA error: an internal error occurred; capacity 0"), c.USER_ERROR),
    (job(reason="ClientError: Rate exceeded while reading my dataset"), c.USER_ERROR),
    # SageMaker's statuses outrank the text: the reclaimed script exited non-zero
    (job("Failed", "Interrupted", reason="AlgorithmError: killed by SIGTERM"), c.SPOT_INTERRUPTION),
    (job("Stopped", "MaxRuntimeExceeded", reason="AlgorithmError: exit 143"), c.MAX_RUNTIME),
    (job("Stopped", "Stopped", reason="AlgorithmError: exit 143"), c.USER_STOP),
])
def test_descriptions(description, category):
    assert classify_description(description).category == category


def test_the_reason_keeps_the_failure_reason():
    f = classify_description(job(reason=CAPACITY_REASON))
    assert f.reason.startswith("capacity shortage: CapacityError: Unable to provision") and f.job_started


@pytest.mark.parametrize(("error", "message", "category"), [
    ("SageMaker.ResourceLimitExceededException", "The account-level service limit 'ml.p4d.24xlarge for "
     "training job usage' is 0 Instances", c.QUOTA),
    ("SageMaker.AmazonSageMakerException", "... (Service: AmazonSageMaker; Status Code: 400; Error Code: "
     "ResourceLimitExceeded; Request ID: 1)", c.QUOTA),
    ("SageMaker.AmazonSageMakerException", "Rate exceeded (Service: AmazonSageMaker; Status Code: 400; "
     "Error Code: ThrottlingException)", c.THROTTLING),
    ("SageMaker.ThrottlingException", "Rate exceeded", c.THROTTLING),
    ("SageMaker.AmazonSageMakerException", "Internal error (Status Code: 500; Error Code: InternalFailure)",
     c.INTERNAL),
    ("SageMaker.AmazonSageMakerException", "Error Code: ValidationException; Training job names must be unique",
     c.USER_ERROR),
    ("States.Timeout", "", c.UNKNOWN),
    ("Lambda.Unknown", "boom", c.UNKNOWN),
])
def test_api_errors(error, message, category):
    f = classify_api_error(error, message)
    assert f.category == category and not f.job_started


def test_a_json_description_in_the_cause():
    failure, described = classify_failure({"Error": "States.TaskFailed",
                                           "Cause": json.dumps(job(reason=CAPACITY_REASON))})
    assert failure.category == c.CAPACITY and described["TrainingJobStatus"] == "Failed"


def test_a_plain_message_falls_back_to_describe():
    calls = []

    def describe():
        calls.append(1)
        return job("Stopped", "Interrupted")

    failure, described = classify_failure({"Error": "States.TaskFailed", "Cause": "Training job failed"}, describe)
    assert failure.category == c.SPOT_INTERRUPTION and calls == [1] and described["SecondaryStatus"] == "Interrupted"
    # no job (creation failed): classified from the message
    failure, described = classify_failure({"Error": "States.TaskFailed", "Cause": "InternalServerError"},
                                          lambda: None)
    assert failure.category == c.INTERNAL and described is None


def test_api_errors_do_not_call_describe():
    def describe():
        raise AssertionError("a job that was never created cannot be described")

    failure, _ = classify_failure({"Error": "SageMaker.ResourceLimitExceededException", "Cause": "limit"}, describe)
    assert failure.category == c.QUOTA


def test_cause_shapes():
    assert parse_cause(json.dumps(job())) is not None
    assert parse_cause(job()) is not None
    assert parse_cause("not json") is None
    assert parse_cause(json.dumps({"errorMessage": "x", "errorType": "Y"})) is None
    failure, _ = classify_failure({"Error": "SageMaker.AmazonSageMakerException", "Cause": json.dumps(
        {"errorMessage": "Rate exceeded", "errorType": "ThrottlingException"})})
    assert failure.category == c.THROTTLING
    # a description wrapped in a message
    failure, _ = classify_failure({"Error": "States.TaskFailed",
                                   "Cause": "Training job failed: " + json.dumps(job("Stopped", "Stopped"))})
    assert failure.category == c.USER_STOP
    failure, _ = classify_failure({})
    assert failure.category == c.UNKNOWN


def test_timestamps_in_every_shape():
    from datetime import UTC, datetime

    t = datetime(2026, 11, 21, 8, 0, tzinfo=UTC).timestamp()
    for value in ("2026-11-21T08:00:00Z", "2026-11-21T08:00:00+00:00", "2026-11-21T08:00:00", t, t * 1000,
                  datetime(2026, 11, 21, 8, 0, tzinfo=UTC), str(t)):
        assert to_epoch(value) == pytest.approx(t), value
    assert to_epoch(None) is None and to_epoch("yesterday") is None
