"""Any sequence of SageMaker outcomes: the executed state machine keeps its invariants (hypothesis)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request

MAX_ATTEMPTS = 4
OUTCOMES = {
    "completed": sm.completed,
    "capacity": sm.capacity_error,
    "user_error": sm.algorithm_error,
    "internal": sm.internal_error,
    "spot": sm.spot_interrupted,
    "stopped": sm.stopped_by_user,
    "quota": sm.resource_limit_exceeded,
    "throttled": sm.throttled,
}
FINAL = {"completed", "user_error"}  # outcomes after which no attempt follows
# The failure category the run ends with when an outcome is its last.
CATEGORY = {
    "capacity": "capacity",
    "user_error": "user_error",
    "internal": "internal",
    "spot": "spot_interruption",
    "stopped": "interruption",  # not trainctl stop (it ends the execution first): resumed
    "quota": "quota",
    "throttled": "throttling",
}
names = itertools.count()


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kinds=st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=MAX_ATTEMPTS, max_size=MAX_ATTEMPTS),
    spot=st.booleans(),
)
def test_any_outcome_sequence_ends_cleanly(harness, kinds, spot):
    request = job_request(spot=spot, retry={"max_attempts": MAX_ATTEMPTS})
    result = harness.run(request, [OUTCOMES[k]() for k in kinds], name=f"sequence-{next(names)}")

    calls = len(result.create_calls)
    assert 1 <= calls <= MAX_ATTEMPTS
    used = kinds[:calls]
    # Nothing follows a final outcome, and the run stops at the first one.
    assert not any(k in FINAL for k in used[:-1]), used
    assert result.status == ("SUCCEEDED" if used[-1] == "completed" else "FAILED"), (used, result.cause)
    if result.status == "FAILED":
        # Ends with the category of the last outcome, and early only on a final one or a category's own cap.
        assert result.error == CATEGORY[used[-1]], (used, result.error, result.cause)
        assert used[-1] in FINAL or calls == MAX_ATTEMPTS or "persisted" in result.cause, (used, result.cause)
    # Every attempt: a fresh name, the run's one checkpoint prefix, botocore-valid (checked at create).
    assert len(set(result.job_names)) == calls
    assert len({c["CheckpointConfig"]["S3Uri"] for c in result.create_calls}) == 1
    assert_told(result)
    assert result.states_entered[-1] == ("Succeeded" if result.status == "SUCCEEDED" else "Failed")
    assert result.states_entered.count("Launch") == calls


def assert_told(result) -> None:
    """What every end of a run gives the operator (jobs.outcome.ends): one notification; a failure's reason in words
    (never a raw payload) with the way back."""
    assert len(result.notifications) == 1, result.notifications
    if result.status == "FAILED":
        assert result.cause and "{" not in result.cause, result.cause
        assert "trainctl resume" in result.cause, result.cause


FAULTY_FUNCTIONS = ("decide", "relaunch", "summarize")  # the handlers a soak run makes fail, once or for good


@pytest.mark.soak
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=MAX_ATTEMPTS, max_size=MAX_ATTEMPTS),
       spot=st.booleans(), fault=st.sampled_from([None, *FAULTY_FUNCTIONS]), persistent=st.booleans())
def test_hundreds_of_random_runs_all_end_told(harness, kinds, spot, fault, persistent):
    """Random outcome sequences with a launcher function that fails once or keeps failing: no end without a reason
    in words and the way back, none without its notification (a loop: `python -m pytest -m soak -n 0 -s`)."""
    import jobs.handler
    from tests.launcher.lambda_inprocess import FunctionTimedOut

    request = job_request(spot=spot, retry={"max_attempts": MAX_ATTEMPTS, "capacity_wait_seconds": 0,
                                            "capacity_wait_max_seconds": 0, "interruption_wait_seconds": 0,
                                            "internal_error_wait_seconds": 0, "api_error_wait_seconds": 0,
                                            "api_error_wait_max_seconds": 0})
    with pytest.MonkeyPatch.context() as patch:
        if fault is not None:
            real, calls = getattr(jobs.handler, fault), []

            def flaky(event, context=None):
                calls.append(1)
                if persistent or len(calls) == 1:
                    raise FunctionTimedOut()
                return real(event, context)

            patch.setattr(jobs.handler, fault, flaky)
        result = harness.run(request, [OUTCOMES[k]() for k in kinds], name=f"soak-{next(names)}", timeout=120)
    assert result.status in ("SUCCEEDED", "FAILED"), (result.status, result.cause)
    assert_told(result)
