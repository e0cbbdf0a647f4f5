"""Bounded history: a job the launcher watches for long (its `.sync` poll failed while it trains) keeps the
execution's history within Step Functions' 25,000 events (Standard workflows), whatever the request's retry waits
say. A history past the limit ends the execution with an error no Catch takes: no summary, no notification, an
unwatched job.

Time is simulated: each Wait state moves a clock on by the seconds it asked for; the launcher's functions
(jobs.handler.clock) and the emulated job (it trains until that clock says its time is up) read it. Nothing sleeps.
"""

from __future__ import annotations

import pytest

from jobs.retry.policy import HISTORY_LIMIT, WATCH_MIN_SECONDS
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request

LONGEST_JOB_DAYS = 28  # SageMaker's longest MaxRuntimeInSeconds
# A loop that does not move the clock (0 s waits) is cut here, well past a day's share of looks.
LOOKS_CUT = 600


@pytest.mark.parametrize("request_wait", [0])
def test_a_day_long_watch_stays_within_a_days_share_of_the_history(harness, simulated_clock, request_wait):
    """A 1-day job, watched from its first minutes (a throttled poll ended its `.sync` task) with the request's
    api_error_wait_seconds at 0 s (the schema's least; 1 s measured the same, 730 events, and is left out for time):
    its execution's events stay within a day's share of the limit (25,000 / 28), so SageMaker's longest job stays
    within the whole of it. The waits start at WATCH_MIN_SECONDS and double."""
    looks = []

    def cut_endless(arn: str, state: str, seconds: float) -> None:
        looks.append(seconds)
        if len(looks) > LOOKS_CUT:
            harness.stop(arn)

    harness.on_wait = cut_endless
    try:
        world = harness.new_world([sm.throttled_while_training(sm.Outcome(
            status="Stopped", secondary=("Starting", "Downloading", "Training", "MaxRuntimeExceeded"),
            trains_for_seconds=24 * 3600), describes=1)])
        world.clock = simulated_clock
        request = job_request(max_runtime_hours=24, retry={"api_error_wait_seconds": request_wait,
                                                           "api_error_wait_max_seconds": request_wait})
        result = harness.wait(harness.start(request, name=f"day-long-watch-{request_wait}"))
    finally:
        harness.on_wait = None
    assert result.status == "FAILED" and result.error == "max_runtime", (result.status, result.error, result.cause)
    assert looks and min(looks) >= WATCH_MIN_SECONDS
    assert harness.waited >= 24 * 3600
    share = HISTORY_LIMIT / LONGEST_JOB_DAYS
    assert len(result.history) <= share, (len(result.history), share, len(looks))
