"""The launcher's own faults, in the synthesized state machine: a launcher function that times out or raises
once, in any of its states, does not end the run; one that keeps failing still ends it with a notification.

The run: a Spot interruption, then success (Prepare, Decide and Summarize each run). The fault is injected
into the handler the deployed function names (tests/launcher/lambda_inprocess.py reports a FunctionTimedOut
as Lambda reports a timeout: errorType Sandbox.Timedout).
"""

from __future__ import annotations

import re

import pytest

from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request
from tests.launcher.lambda_inprocess import FunctionTimedOut
from tests.launcher.paths import RETRY, START, SUCCESS_TAIL

HANDLERS = ("prepare", "decide", "relaunch", "summarize")
FAULTS = {"timeout": lambda: FunctionTimedOut(), "error": lambda: ConnectionResetError("connection reset by peer")}


def failing_first(monkeypatch, name: str, fault, times: int) -> list[int]:
    """Make jobs.handler.<name> fail its first `times` calls; returns the list its calls are counted in."""
    import jobs.handler

    real, calls = getattr(jobs.handler, name), []

    def flaky(event, context):
        calls.append(1)
        if len(calls) <= times:
            raise fault()
        return real(event, context)

    monkeypatch.setattr(jobs.handler, name, flaky)
    return calls


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", HANDLERS)
def test_one_fault_in_any_launcher_function_does_not_end_the_run(harness, monkeypatch, name, fault):
    calls = failing_first(monkeypatch, name, FAULTS[fault], times=1)
    result = harness.run(job_request(spot=True), [sm.spot_interrupted(), sm.completed()],
                         name=f"function-fault-{name}-{fault}")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert len(calls) == 2  # the fault, then the retry
    assert result.states_entered == [*START, *RETRY, *SUCCESS_TAIL]
    assert len(result.job_names) == 2 and len(set(result.job_names)) == 2  # no job doubled by a retry
    ((subject, _),) = result.notifications
    assert "succeeded" in subject


@pytest.mark.parametrize("name", ["decide", "relaunch"])
def test_a_function_that_keeps_timing_out_still_ends_the_run_with_a_notification(harness, monkeypatch, name):
    from jobs.retry.policy import FUNCTION_RETRIES

    calls = failing_first(monkeypatch, name, FAULTS["timeout"], times=99)
    result = harness.run(job_request(spot=True), [sm.spot_interrupted()], name=f"function-fault-persistent-{name}",
                         timeout=90)
    assert len(calls) == 1 + FUNCTION_RETRIES
    assert result.status == "FAILED" and result.error == "launcher_error"
    # In words (jobs.retry.policy.launcher_fault): the step, the tries, what it was doing, the error without its
    # JSON, and the way back.
    doing = {"decide": "deciding what follows attempt 1", "relaunch": "starting the attempt after attempt 1"}[name]
    assert result.cause.startswith(f"the {name} step failed {FUNCTION_RETRIES + 1} times while {doing} (job ")
    assert "Sandbox.Timedout: " in result.cause and "{" not in result.cause
    assert re.search(r"`trainctl resume [a-z0-9-]+-[a-z2-7]{16}` continues the run from its checkpoints$", result.cause)
    assert len(result.create_calls) == 1  # nothing launched after the fault
    ((subject, _),) = result.notifications
    assert subject == "Training run gpt-125m-fsdp failed: launcher_error"


@pytest.mark.parametrize("fault", FAULTS)
def test_a_prepare_that_keeps_failing_ends_the_execution_told_in_words_with_a_notification(harness, monkeypatch,
                                                                                          fault):
    from jobs.retry.policy import FUNCTION_RETRIES

    calls = failing_first(monkeypatch, "prepare", FAULTS[fault], times=99)
    result = harness.run(job_request(), [], name=f"prepare-fault-{fault}", timeout=90)
    assert len(calls) == 1 + FUNCTION_RETRIES
    assert result.status == "FAILED" and result.error == "launcher_error"
    said = {"timeout": "(Sandbox.Timedout): ", "error": "(ConnectionResetError): connection reset by peer"}[fault]
    assert result.cause.startswith(f"the prepare step failed {FUNCTION_RETRIES + 1} times while reading the "
                                   f"request and taking the run {said}")
    assert "nothing was launched" in result.cause and "{" not in result.cause
    assert result.create_calls == []
    ((subject, message),) = result.notifications
    assert subject == "Training run prepare-fault-" + fault + " failed: launcher_error" and message == result.cause


def test_a_refused_request_is_not_retried(harness, monkeypatch):
    import jobs.handler

    calls = failing_first(monkeypatch, "prepare", FAULTS["error"], times=0)  # counts the calls only
    result = harness.run(job_request(instance={"type": "ml.p4d.24xlarge", "count": 0}), [], name="refused-once")
    assert result.status == "FAILED" and result.error == "RequestInvalid"
    assert len(calls) == 1 and jobs.handler.prepare is not None
