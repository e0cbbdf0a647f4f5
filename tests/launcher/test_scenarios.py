"""The synthesized state machine, executed in moto with scripted SageMaker outcomes.

Each scenario asserts the states entered (in order), the CreateTrainingJob calls made (fresh names, one
checkpoint prefix, instance types, Spot), what the decide function was told, the execution's result and the
notification.
"""

from __future__ import annotations

import json

import pytest

from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request
from tests.launcher.paths import ENDED_JOB, FAILURE_TAIL, GIVE_UP, RETRY, RETRY_API, START, SUCCESS_TAIL


def assert_attempts(result, instance_types: list[str], spot: list[bool]) -> None:
    calls = result.create_calls
    assert [c["ResourceConfig"]["InstanceType"] for c in calls] == instance_types
    assert [c["EnableManagedSpotTraining"] for c in calls] == spot
    names = result.job_names
    assert len(set(names)) == len(names), f"a job name was reused: {names}"
    assert all(n.startswith("mltrain-") and len(n) <= 63 for n in names), names
    prefixes = {c["CheckpointConfig"]["S3Uri"] for c in calls}
    assert len(prefixes) == 1, f"attempts of one run must share the checkpoint prefix: {prefixes}"
    assert next(iter(prefixes)).endswith("/")
    for call in calls:
        has_max_wait = "MaxWaitTimeInSeconds" in call["StoppingCondition"]
        assert has_max_wait == call["EnableManagedSpotTraining"], call["StoppingCondition"]


def decide_failures(result) -> list[dict]:
    return [event["failure"] for handler, event in result.lambda_calls if handler == "jobs.handler.decide"]


def assert_summary(result, status: str) -> None:
    summary = result.output if status == "Succeeded" else None
    ((subject, message),) = result.notifications
    assert ("succeeded" if status == "Succeeded" else "failed") in subject.lower()
    assert len(subject) <= 100
    for name in result.job_names:
        assert name in message
    if summary is not None:
        assert summary["status"] == "Succeeded"
        assert [a["job_name"] for a in summary["attempts"]] == result.job_names
        assert [a["instance_type"] for a in summary["attempts"]] == [
            c["ResourceConfig"]["InstanceType"] for c in result.create_calls
        ]


def test_success_first_time(harness):
    result = harness.run(
        job_request(), [sm.completed(train_loss=2.05, tokens_per_sec=51234.5)], name="success-first-time"
    )
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *SUCCESS_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge"], [False])
    assert_summary(result, "Succeeded")
    assert result.output["final_metrics"] == {"train_loss": 2.05, "tokens_per_sec": 51234.5}
    assert result.output["model_artifacts"].endswith(f"/{result.job_names[0]}/output/model.tar.gz")
    assert result.output["checkpoint_s3_uri"] == result.create_calls[0]["CheckpointConfig"]["S3Uri"]
    assert decide_failures(result) == []


def test_capacity_error_then_success_on_the_fallback_type(harness):
    result = harness.run(job_request(), [sm.capacity_error(), sm.completed()], name="capacity-then-fallback")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY, *SUCCESS_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge", "ml.p5.48xlarge"], [False, False])
    assert_summary(result, "Succeeded")
    # Under .sync a failed job fails the task with States.TaskFailed and the description as its Cause; the
    # state machine leaves the description out (it is as large as the request) and Decide looks the job up.
    failed = [e["taskFailedEventDetails"] for e in result.events("TaskFailed")]
    assert [f["error"] for f in failed] == ["States.TaskFailed"]
    description = json.loads(failed[0]["cause"])
    assert description["TrainingJobName"] == result.job_names[0]
    assert description["FailureReason"].startswith("CapacityError: Unable to provision")
    assert decide_failures(result) == [{"Error": "States.TaskFailed"}]
    assert result.output["attempts"][0]["category"] == "capacity"
    assert result.output["attempts"][0]["reason"].startswith("capacity shortage: CapacityError: Unable to provision")


def test_spot_interruption_then_resume(harness):
    result = harness.run(job_request(spot=True), [sm.spot_interrupted(), sm.completed()], name="spot-resume")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY, *SUCCESS_TAIL]
    # Same instance type, still on Spot, resuming from the same checkpoint prefix.
    assert_attempts(result, ["ml.p4d.24xlarge"] * 2, [True, True])
    assert result.output["interruptions"] == 1
    assert result.output["attempts"][0]["category"] == "spot_interruption"
    assert_summary(result, "Succeeded")


def test_repeated_interruptions_then_on_demand(harness):
    request = job_request(spot=True, retry={"interruptions_before_on_demand": 2})
    result = harness.run(
        request, [sm.spot_interrupted(), sm.spot_interrupted(), sm.completed()], name="spot-then-on-demand"
    )
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY, *RETRY, *SUCCESS_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge"] * 3, [True, True, False])
    assert result.output["interruptions"] == 2
    assert_summary(result, "Succeeded")


def test_user_code_error_fails_after_one_attempt(harness):
    result = harness.run(job_request(), [sm.algorithm_error()], name="user-code-error")
    assert result.status == "FAILED"
    assert result.states_entered == [*START, *GIVE_UP, *FAILURE_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge"], [False])
    assert result.error == "user_error"
    assert "AlgorithmError" in result.cause
    assert_summary(result, "Failed")


def test_internal_error_is_retried(harness):
    result = harness.run(job_request(), [sm.internal_error(), sm.completed()], name="internal-error")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY, *SUCCESS_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge"] * 2, [False, False])
    assert result.output["attempts"][0]["category"] == "internal"


def test_resource_limit_exceeded_then_success(harness):
    result = harness.run(
        job_request(), [sm.resource_limit_exceeded(), sm.completed()], name="quota-then-success"
    )
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY_API, *SUCCESS_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge"] * 2, [False, False])
    (failure,) = decide_failures(result)
    assert failure["Error"] == "SageMaker.ResourceLimitExceededException"
    assert "Error Code: ResourceLimitExceeded" in failure["Cause"]
    # The rejected request created no job; the retry still gets a fresh name.
    assert result.output["attempts"][0]["category"] == "quota"
    assert_summary(result, "Succeeded")


def test_throttling_then_success_waits_in_the_backoff_state(harness):
    request = job_request(retry={"api_error_wait_seconds": 1, "api_error_wait_max_seconds": 1})
    result = harness.run(request, [sm.throttled(), sm.completed()], name="throttled-then-success")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY_API, *SUCCESS_TAIL]
    (failure,) = decide_failures(result)
    assert failure["Error"] == "SageMaker.AmazonSageMakerException"
    assert "Error Code: ThrottlingException" in failure["Cause"]
    (entered,) = [e for e in result.history if e["type"] == "WaitStateEntered"]
    (exited,) = [e for e in result.history if e["type"] == "WaitStateExited"]
    assert json.loads(entered["stateEnteredEventDetails"]["input"])["decision"]["wait_seconds"] == 1
    assert ("throttled-then-success", "Backoff", 1) in harness.waits  # the harness records a Wait, never sleeps it
    assert result.output["attempts"][0]["category"] == "throttling"


def test_a_stop_nobody_asked_for_is_resumed(harness):
    """A job Stopped with no failure reason while its execution runs: not `trainctl stop` (which ends the
    execution first) nor an abort, so SageMaker or the console stopped it: resumed from its checkpoint."""
    result = harness.run(job_request(), [sm.stopped_by_user(), sm.completed()], name="stopped-by-someone")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == [*START, *RETRY, *SUCCESS_TAIL]
    assert_attempts(result, ["ml.p4d.24xlarge"] * 2, [False, False])
    assert result.output["attempts"][0]["category"] == "interruption"
    assert_summary(result, "Succeeded")


def test_a_training_plan_an_attempt_was_stopped_on_is_not_targeted_again(harness, platform_settings, monkeypatch):
    """A plan's end stops its jobs (SageMaker's stop, no reason given) and its ARN is refused after: the next
    attempt runs on demand on the same type, without the plan (whose end the settings do not say)."""
    plan = {"name": "p5-week", "arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week",
            "instance_type": "ml.p5.48xlarge", "instance_count": 2}
    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps({**platform_settings, "training_plans": {"p5-week": plan}}))
    request = job_request(training_plan="p5-week", instance={"type": "ml.p5.48xlarge", "count": 2, "fallbacks": []})
    result = harness.run(request, [sm.stopped_by_user(), sm.completed()], name="plan-ended")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    first, second = (c["ResourceConfig"] for c in result.create_calls)
    assert first["TrainingPlanArn"] == plan["arn"] and "TrainingPlanArn" not in second
    assert second["InstanceType"] == plan["instance_type"]


PLAN_ENDS = {
    # SageMaker's own word when a job on a plan found no capacity (its user guide: terminated with it after 2 days
    # Pending), naming the plan.
    "failed-for-capacity": [sm.Outcome(status="Failed", secondary=("Starting", "Pending", "Failed"), training_seconds=0,
                                       failure_reason="InsufficientCapacityError: the capacity of training plan p5-week "
                                                      "is no longer available"), sm.completed()],
    # The create is refused once the plan has expired (its ARN in the message).
    "create-refused": [sm.Outcome(api_error=("ValidationException", "Training plan arn:aws:sagemaker:us-east-1:"
                                                                    "123456789012:training-plan/p5-week is Expired.")),
                       sm.completed()],
}


@pytest.mark.parametrize("form", list(PLAN_ENDS))
def test_a_plan_that_ended_in_any_form_is_not_targeted_again(harness, platform_settings, monkeypatch, form):
    """A plan's end seen as a capacity failure naming the plan, or as a create refused for the plan: like the
    stopped form above, the next attempt runs on demand without the plan, and the run does not end as the user's
    error."""
    plan = {"name": "p5-week", "arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week",
            "instance_type": "ml.p5.48xlarge", "instance_count": 2}
    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps({**platform_settings, "training_plans": {"p5-week": plan}}))
    request = job_request(training_plan="p5-week", instance={"type": "ml.p5.48xlarge", "count": 2, "fallbacks": []})
    result = harness.run(request, PLAN_ENDS[form], name=f"plan-ended-{form}")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    first, second = (c["ResourceConfig"] for c in result.create_calls)
    assert first["TrainingPlanArn"] == plan["arn"] and "TrainingPlanArn" not in second
    assert result.output["attempts"][0]["category"] == "capacity"
    assert "training plan p5-week can no longer run the job" in result.output["attempts"][0]["reason"]


def test_a_launch_the_platforms_permissions_refuse_is_the_platforms_to_fix(harness):
    """CreateTrainingJob refused because the launcher may not pass the execution role: not the request's fault, not
    retried, and the run's end says who must fix what and how to go on."""
    denied = sm.Outcome(api_error=("AccessDeniedException", "User: arn:aws:sts::123456789012:assumed-role/mltrain-"
                                   "job-launcher/abc is not authorized to perform: iam:PassRole on resource: "
                                   "arn:aws:iam::123456789012:role/mltrain-execution"))
    result = harness.run(job_request(), [denied], name="passrole-denied")
    assert result.status == "FAILED" and result.error == "platform_config", (result.error, result.cause)
    assert len(result.create_calls) == 1
    assert "iam:PassRole" in result.cause and "platform team" in result.cause and "trainctl resume" in result.cause
    assert "fix the code or data" not in result.cause
    ((subject, _),) = result.notifications
    assert "platform_config" in subject


def test_bad_input_fails_in_prepare_naming_the_field(harness):
    request = job_request(instance={"type": "ml.p4d.24xlarge", "cuont": 2}, max_runtime_hours=-1)
    result = harness.run(request, [], name="bad-input")
    assert result.status == "FAILED"
    assert result.states_entered == ["Prepare", "ParseRequestError", "RequestInvalid"]
    assert result.error == "RequestInvalid"
    # One line per problem, each naming its field path.
    assert "instance.cuont" in result.cause and "did you mean" in result.cause
    assert "max_runtime_hours" in result.cause
    assert result.create_calls == []
    assert result.notifications == []
    # The handler's exception surfaced as Lambda reports it: Error = class name, Cause = the error JSON.
    (failed,) = result.events("LambdaFunctionFailed")
    details = failed["lambdaFunctionFailedEventDetails"]
    assert details["error"] == "RequestInvalid"
    cause = json.loads(details["cause"])
    assert cause["errorType"] == "RequestInvalid" and cause["errorMessage"] == result.cause


def test_attempts_exhausted(harness):
    request = job_request(retry={"max_attempts": 3})
    result = harness.run(request, [sm.capacity_error()] * 3, name="attempts-exhausted")
    assert result.status == "FAILED"
    assert result.states_entered == [*START, *RETRY, *RETRY, *GIVE_UP, *FAILURE_TAIL]
    assert len(result.create_calls) == 3
    assert len(set(result.job_names)) == 3
    assert "attempts exhausted" in result.cause
    assert result.error == "capacity"
    assert_summary(result, "Failed")


def test_a_fault_in_the_decide_function_still_ends_with_a_summary(harness, monkeypatch):
    def broken_decide(event, context):
        raise KeyError("run")

    monkeypatch.setattr("jobs.handler.decide", broken_decide)
    result = harness.run(job_request(), [sm.capacity_error()], name="decide-fault")
    assert result.status == "FAILED"
    assert result.states_entered == [*START, *ENDED_JOB, "Decide", "DecideFailed", *FAILURE_TAIL]
    assert result.error == "launcher_error"
    assert result.cause.startswith("the decide step failed 4 times while deciding what follows attempt 1 (job ")
    assert "KeyError: 'run'" in result.cause and "trainctl resume" in result.cause
    assert_summary(result, "Failed")
