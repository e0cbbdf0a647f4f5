"""No training job launched twice or lost: the synthesized state machine, in moto, when a launch error does not
mean that no job runs, and when the run ends while one does.

Each scenario ends with exactly one job per attempt in the emulated SageMaker and none of them still
InProgress: asserted on the world's own job list, not on what the launcher believes.
"""

from __future__ import annotations

from jobs.retry.policy import (
    FUNCTION_RETRIES,
    STOP_RETRIES,
    STOP_RETRY_MAX_SECONDS,
    STOP_RETRY_SECONDS,
    retry_waits,
)
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request
from tests.launcher.paths import API_ERROR, FAILURE_TAIL, START, SUCCESS_TAIL, WATCH


def assert_one_job_per_attempt_none_running(result, attempts: int) -> None:
    names = list(result.jobs)
    assert len(names) == attempts, result.jobs
    assert [n[-3:] for n in names] == [f"-a{i}" for i in range(1, attempts + 1)], names
    assert "InProgress" not in result.jobs.values(), result.jobs
    assert len({c["CheckpointConfig"]["S3Uri"] for c in result.create_calls}) == 1


def test_a_5xx_after_the_job_was_created_waits_on_that_job(harness):
    # Attempt 1's CreateTrainingJob answers 500 but the job runs and completes: no second job.
    result = harness.run(job_request(), [sm.created_then_5xx(sm.completed(train_loss=1.9))], name="created-5xx")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered[:6] == [*START, *API_ERROR, "Decide"]
    assert result.states_entered.count("Launch") == 1
    assert "WaitForJob" in result.states_entered
    assert result.states_entered[-5:] == SUCCESS_TAIL
    assert_one_job_per_attempt_none_running(result, 1)
    assert list(result.jobs.values()) == ["Completed"]
    assert result.output["final_metrics"]["train_loss"] == 1.9
    assert result.output["attempts"][0]["status"] == "Completed"
    assert result.stop_calls == []


def test_a_5xx_after_create_then_the_job_fails_is_classified_and_retried(harness):
    result = harness.run(job_request(), [sm.created_then_5xx(sm.capacity_error()), sm.completed()],
                         name="created-5xx-then-capacity")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered.count("Launch") == 2
    assert_one_job_per_attempt_none_running(result, 2)
    assert list(result.jobs.values()) == ["Failed", "Completed"]
    # The attempt is decided by its job's own end (capacity: the next type), not by the launch's 500.
    assert result.output["attempts"][0]["category"] == "capacity"
    assert [c["ResourceConfig"]["InstanceType"] for c in result.create_calls] == ["ml.p4d.24xlarge",
                                                                                  "ml.p5.48xlarge"]


def test_a_throttled_poll_while_the_job_trains_does_not_start_a_second_job(harness):
    # Two throttled DescribeTrainingJob calls: the `.sync` poll (the launch fails), then decide's own
    # look-up (it looks again after a wait).
    result = harness.run(job_request(), [sm.throttled_while_training(sm.completed(), describes=2)],
                         name="throttled-poll")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    (failure,) = [e["failure"] for h, e in result.lambda_calls if h == "jobs.handler.decide"][:1]
    assert failure["Error"] == "SageMaker.AmazonSageMakerException"
    assert "Error Code: ThrottlingException" in failure["Cause"]
    assert result.states_entered[:9] == [*START, *API_ERROR, *WATCH, "Decide"]
    assert result.states_entered.count("Launch") == 1
    assert_one_job_per_attempt_none_running(result, 1)
    assert list(result.jobs.values()) == ["Completed"]
    assert result.output["attempts"][0]["lookup_errors"] == 0 and result.output["attempts"][0]["looks"] >= 1


def test_the_runs_own_name_in_use_waits_on_its_job(harness):
    # The create's answer was lost and the request sent again: ResourceInUse for the attempt's own job.
    result = harness.run(job_request(), [sm.name_in_use(sm.algorithm_error())], name="own-name-in-use")
    assert result.status == "FAILED"
    (failure,) = [e["failure"] for h, e in result.lambda_calls if h == "jobs.handler.decide"][:1]
    assert "Error Code: ResourceInUse" in failure["Cause"]
    # Not "the request was rejected": the run waited on its job and failed the way that job did.
    assert result.error == "user_error" and "AlgorithmError" in result.cause
    assert result.states_entered.count("Launch") == 1 and "WaitForJob" in result.states_entered
    assert_one_job_per_attempt_none_running(result, 1)
    assert list(result.jobs.values()) == ["Failed"]


def test_a_fault_in_decide_while_a_job_runs_stops_that_job(harness, monkeypatch):
    def broken_decide(event, context):
        raise KeyError("run")

    monkeypatch.setattr("jobs.handler.decide", broken_decide)
    result = harness.run(job_request(), [sm.created_then_5xx()], name="decide-fault-job-running")
    assert result.status == "FAILED"
    assert result.states_entered == [*START, *API_ERROR, "Decide", "DecideFailed", *FAILURE_TAIL]
    assert result.error == "launcher_error"
    assert_one_job_per_attempt_none_running(result, 1)
    (name,) = result.jobs
    assert result.stop_calls == [name]
    assert result.jobs[name] in ("Stopping", "Stopped")
    (subject, message) = result.notifications[0]
    assert f"Stopped as the run ended (still running): {name}" in message


def test_a_fault_in_summarize_still_stops_the_job_and_notifies(harness, monkeypatch):
    def broken(event, context):
        raise RuntimeError("summarize broke")

    monkeypatch.setattr("jobs.handler.decide", broken)
    monkeypatch.setattr("jobs.handler.summarize", broken)
    result = harness.run(job_request(), [sm.created_then_5xx()], name="summarize-fault-job-running")
    assert result.status == "FAILED"
    assert result.states_entered == [*START, *API_ERROR, "Decide", "DecideFailed", "Summarize",
                                     "StopCurrentJob", "SummarizeFault", "SummarizeFaultCause", "SummarizeFaultParsed",
                                     "SummarizeFaultMessage", "SummarizeFailed", "Notify", "Outcome", "Failed"]
    # In words: the error's message out of the Lambda error (never its JSON), the job stopped, the way back.
    assert result.error == "launcher_error" and result.cause.startswith(
        "the summarize step kept failing (past its retries) while ending the run (RuntimeError): summarize broke; ")
    assert "{" not in result.cause and f"`trainctl resume {result.create_calls[0]['Environment']['TRAINING_RUN_ID']}`" \
        in result.cause
    assert_one_job_per_attempt_none_running(result, 1)
    assert result.stop_calls == list(result.jobs)
    ((subject, _),) = result.notifications
    assert subject == "Training run gpt-125m-fsdp failed: launcher_error"


def test_twenty_throttled_look_ups_do_not_stop_a_healthy_job(harness):
    """Every look-up is throttled, far past retry.api_error_max_retries: the run keeps waiting on the job it
    cannot see (it may run for its whole max runtime), and succeeds with it; nothing is stopped or doubled."""
    request = job_request(retry={"api_error_max_retries": 1})
    result = harness.run(request, [sm.throttled_while_training(sm.completed(), describes=20)],
                         name="lookups-throttled", timeout=120)
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered.count("Launch") == 1
    assert result.stop_calls == [] and list(result.jobs.values()) == ["Completed"]


def test_a_job_unreadable_for_longer_than_it_can_run_ends_the_run_and_is_stopped(harness, monkeypatch):
    """Past the job's own stopping condition and a margin, nobody can say more: the run ends, and the job
    it could not see is stopped (should it somehow run)."""
    import jobs.handler

    # Prepare launches now; by the first look-up the clock is past max_runtime_hours (12 h) + the margin.
    start, calls = jobs.handler.clock(), []
    monkeypatch.setattr(jobs.handler, "clock", lambda: start + 14 * 3600 * bool(calls.append(1) or len(calls) > 1))
    result = harness.run(job_request(), [sm.throttled_while_training(sm.completed(), describes=4)],
                         name="lookups-past-the-deadline")
    assert result.status == "FAILED"
    assert "could not look up" in result.cause and "longer than it can run" in result.cause
    assert result.states_entered.count("Launch") == 1
    assert_one_job_per_attempt_none_running(result, 1)
    assert result.stop_calls == list(result.jobs)


def test_a_throttled_stop_is_tried_again_until_it_is_taken(harness, monkeypatch):
    """The run ends while its job runs (Decide broke) and StopTrainingJob is throttled past the SDK's own tries:
    Summarize fails so that the state machine runs it again, and once the throttling passes the job is stopped
    and the run's summary says so. (Were it to persist, Summarize's Catch runs StopCurrentJob and notifies, as
    test_a_fault_in_summarize_still_stops_the_job_and_notifies shows.)"""
    import dataclasses

    monkeypatch.setattr("jobs.handler.decide", lambda event, context: (_ for _ in ()).throw(KeyError("run")))
    # The SDK tries 4 times per call (without its sleeps: the harness fixture): throttled through 5 runs of
    # Summarize, more than a function fault's FUNCTION_RETRIES.
    training = ("Starting", "Downloading", *["Training"] * 20, "Uploading", "Completed")  # a look-up moves it on
    outcome = dataclasses.replace(sm.created_then_5xx(), throttled_stops=20, secondary=training)
    result = harness.run(job_request(), [outcome], name="stop-throttled", timeout=90)
    assert result.status == "FAILED" and result.error == "launcher_error"
    (name,) = result.jobs
    ((_, message),) = result.notifications
    assert "StopCurrentJob" not in result.states_entered and len(result.stop_calls) == 21
    summarize_runs = [handler for handler, _ in result.lambda_calls].count("jobs.handler.summarize")
    assert summarize_runs == 6 > FUNCTION_RETRIES + 1
    # 10 s doubling, at most 5 minutes apart (the harness records the waits): room for about 40 minutes in all.
    assert result.retry_waits[-5:] == retry_waits(STOP_RETRIES, STOP_RETRY_SECONDS, STOP_RETRY_MAX_SECONDS)[:5]
    assert result.retry_waits[-5:] == [10, 20, 40, 80, 160]
    assert result.jobs[name] in ("Stopping", "Stopped")
    assert f"Stopped as the run ended (still running): {name}" in message
