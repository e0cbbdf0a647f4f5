"""Failure classification: every category, from a description in the Cause, a plain message, or an API error."""

from __future__ import annotations

import json

import pytest

from jobs.retry.classify import (
    Category,
    classify_api_error,
    classify_description,
    classify_launch,
    ended_job_in,
    parse_cause,
)
from jobs.timestamps import to_epoch

CAPACITY_REASON = ("CapacityError: Unable to provision requested ML compute capacity. "
                   "Please retry using a different ML instance type.")


def job(status="Failed", secondary="Failed", reason=None, **extra) -> dict:
    d = {"TrainingJobName": "mltrain-run-1234abcd-a1", "TrainingJobStatus": status, "SecondaryStatus": secondary}
    if reason is not None:
        d["FailureReason"] = reason
    d.update(extra)
    return d


@pytest.mark.parametrize(("description", "category"), [
    (job(reason=CAPACITY_REASON), Category.CAPACITY),
    (job(reason="InsufficientCapacityError: not enough capacity"), Category.CAPACITY),
    (job("Stopped", "Stopped", reason="Training job exceeded MaxPendingTimeInSeconds"), Category.CAPACITY),
    (job("Failed", "Failed", reason="", SecondaryStatusTransitions=[
        {"Status": "Starting", "StartTime": "2026-11-21T08:00:00Z", "EndTime": "2026-11-21T08:00:10Z"},
        {"Status": "Pending", "StartTime": "2026-11-21T08:00:10Z", "EndTime": "2026-11-21T09:30:00Z"}]),
     Category.CAPACITY),
    (job("Stopped", "Interrupted"), Category.SPOT_INTERRUPTION),
    (job("Failed", "Interrupted", reason="Spot interruption"), Category.SPOT_INTERRUPTION),
    (job("Stopped", "MaxWaitTimeExceeded"), Category.SPOT_INTERRUPTION),
    (job(reason="InternalServerError: We encountered an internal error. Please try again."), Category.INTERNAL),
    (job(reason="AlgorithmError: ExecuteUserScriptError: Command \"/opt/conda/bin/python3 train.py\""),
     Category.USER_ERROR),
    (job(reason="ClientError: Data download failed: NoSuchKey"), Category.USER_ERROR),
    (job(reason="ClientError: Please ensure the S3 path exists"), Category.USER_ERROR),
    (job("Stopped", "Stopped"), Category.INTERRUPTION),  # no one the launcher knows of asked for it
    (job("Stopped", "MaxRuntimeExceeded"), Category.MAX_RUNTIME),
    (job(reason="Something nobody has seen before"), Category.UNKNOWN),
    # the user's own error, whatever its message says
    (job(reason="AlgorithmError: RuntimeError: CUDA error: an internal error occurred; capacity 0"), Category.USER_ERROR),
    (job(reason="ClientError: Rate exceeded while reading my dataset"), Category.USER_ERROR),
    # SageMaker's statuses outrank the text: the reclaimed script exited non-zero
    (job("Failed", "Interrupted", reason="AlgorithmError: killed by SIGTERM"), Category.SPOT_INTERRUPTION),
    (job("Stopped", "MaxRuntimeExceeded", reason="AlgorithmError: exit 143"), Category.MAX_RUNTIME),
    (job("Stopped", "Stopped", reason="AlgorithmError: exit 143"), Category.INTERRUPTION),
])
def test_descriptions(description, category):
    assert classify_description(description).category == category


def test_the_reason_keeps_the_failure_reason():
    f = classify_description(job(reason=CAPACITY_REASON))
    assert f.reason.startswith("capacity shortage: CapacityError: Unable to provision") and f.job_started


@pytest.mark.parametrize(("error", "message", "category"), [
    ("SageMaker.ResourceLimitExceededException", "The account-level service limit 'ml.p4d.24xlarge for "
     "training job usage' is 0 Instances", Category.QUOTA),
    ("SageMaker.AmazonSageMakerException", "... (Service: AmazonSageMaker; Status Code: 400; Error Code: "
     "ResourceLimitExceeded; Request ID: 1)", Category.QUOTA),
    ("SageMaker.AmazonSageMakerException", "Rate exceeded (Service: AmazonSageMaker; Status Code: 400; "
     "Error Code: ThrottlingException)", Category.THROTTLING),
    ("SageMaker.ThrottlingException", "Rate exceeded", Category.THROTTLING),
    ("SageMaker.AmazonSageMakerException", "Internal error (Status Code: 500; Error Code: InternalFailure)",
     Category.INTERNAL),
    ("SageMaker.AmazonSageMakerException", "Error Code: ValidationException; Training job names must be unique",
     Category.USER_ERROR),
    ("States.Timeout", "", Category.UNKNOWN),
    ("Lambda.Unknown", "boom", Category.UNKNOWN),
])
def test_api_errors(error, message, category):
    f = classify_api_error(error, message)
    assert f.category == category and not f.job_started


def decide_classifies(failure: dict, look_up=lambda: None):
    """What Decide does with a Launch failure (jobs.handler._decide): the ended job the Cause carries, else the job
    looked up by the attempt's name (`look_up`: its DescribeTrainingJob, None when there is none), then
    classify_launch. Returns the failure and the job it was classified by."""
    described = ended_job_in(failure)
    if described is None:
        described = look_up()
    return classify_launch(failure, described), described


def test_a_json_description_in_the_cause():
    failure, described = decide_classifies({"Error": "States.TaskFailed",
                                            "Cause": json.dumps(job(reason=CAPACITY_REASON))})
    assert failure.category == Category.CAPACITY and described["TrainingJobStatus"] == "Failed"


def test_a_description_in_the_cause_is_not_looked_up():
    def look_up():
        raise AssertionError("the Cause carried the ended job: no look-up")

    failure, _ = decide_classifies({"Error": "States.TaskFailed", "Cause": json.dumps(job(reason=CAPACITY_REASON))},
                                   look_up)
    assert failure.category == Category.CAPACITY


def test_a_plain_message_falls_back_to_the_looked_up_job():
    calls = []

    def look_up():
        calls.append(1)
        return job("Stopped", "Interrupted")

    failure, described = decide_classifies({"Error": "States.TaskFailed", "Cause": "Training job failed"}, look_up)
    assert failure.category == Category.SPOT_INTERRUPTION and calls == [1] and described["SecondaryStatus"] == "Interrupted"
    # no job (creation failed): classified from the message
    failure, described = decide_classifies({"Error": "States.TaskFailed", "Cause": "InternalServerError"})
    assert failure.category == Category.INTERNAL and described is None


def test_api_errors_without_a_job_are_classified_by_the_error():
    failure, _ = decide_classifies({"Error": "SageMaker.ResourceLimitExceededException", "Cause": "limit"})
    assert failure.category == Category.QUOTA


def test_a_job_that_is_not_ended_is_not_the_failure():
    """A job still running (Decide waits on it instead) or unknown to be ended: the API error classifies."""
    running = job("InProgress", "Training")
    assert classify_launch({"Error": "SageMaker.ResourceLimitExceededException", "Cause": "limit"},
                           running).category == Category.QUOTA
    assert ended_job_in({"Error": "States.TaskFailed", "Cause": json.dumps(running)}) is None


def test_cause_shapes():
    assert parse_cause(json.dumps(job())) is not None
    assert parse_cause(job()) is not None
    assert parse_cause("not json") is None
    assert parse_cause(json.dumps({"errorMessage": "x", "errorType": "Y"})) is None
    failure, _ = decide_classifies({"Error": "SageMaker.AmazonSageMakerException", "Cause": json.dumps(
        {"errorMessage": "Rate exceeded", "errorType": "ThrottlingException"})})
    assert failure.category == Category.THROTTLING
    # a description wrapped in a message
    failure, _ = decide_classifies({"Error": "States.TaskFailed",
                                    "Cause": "Training job failed: " + json.dumps(job("Stopped", "Stopped"))})
    assert failure.category == Category.INTERRUPTION
    failure, _ = decide_classifies({})
    assert failure.category == Category.UNKNOWN


def test_timestamps_in_every_shape():
    from datetime import UTC, datetime

    t = datetime(2026, 11, 21, 8, 0, tzinfo=UTC).timestamp()
    for value in ("2026-11-21T08:00:00Z", "2026-11-21T08:00:00+00:00", "2026-11-21T08:00:00", t, t * 1000,
                  datetime(2026, 11, 21, 8, 0, tzinfo=UTC), str(t)):
        assert to_epoch(value) == pytest.approx(t), value
    assert to_epoch(None) is None and to_epoch("yesterday") is None


def test_one_rule_table_reads_job_descriptions_and_api_errors_alike():
    from jobs.retry.classify import RULES, Source

    # the same words mean the same category wherever SageMaker puts them
    for text, category in (("InsufficientCapacityError: none left", Category.CAPACITY),
                           ("TooManyRequestsException", Category.THROTTLING),
                           ("ServiceQuotaExceeded for ml.p5.48xlarge", Category.QUOTA),
                           ("InternalFailure", Category.INTERNAL)):
        assert classify_description(job(reason=text)).category == category, text
        assert classify_api_error("SageMaker.AmazonSageMakerException", text).category == category, text
    assert all(rule.sources and set(rule.sources) <= set(Source) for rule in RULES)
    assert {rule.category for rule in RULES} == set(Category)
