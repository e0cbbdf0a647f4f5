"""Any sequence of SageMaker outcomes: the executed state machine keeps its invariants (hypothesis)."""

from __future__ import annotations

import itertools

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
    assert len(result.notifications) == 1
    assert result.states_entered[-1] == ("Succeeded" if result.status == "SUCCEEDED" else "Failed")
    assert result.states_entered.count("Launch") == calls
