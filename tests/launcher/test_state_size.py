"""The launcher's state at its largest, through the synthesized state machine.

The request travels once (the execution's input, read by Prepare and Decide from the context object), and the
state holds one request-sized thing at a time (jobs.request.state_size), so the largest request the request rules accept
(every large field at its limit, retry.max_attempts at its maximum) stays well under Step Functions' 256 KiB per
state: here it runs through every attempt it may have, each state's input and output and each task's input
measured (moto does not enforce the limit: the history's events are), against the guard's estimate and the
limit. The guard stays as the net for a rule that changes: with the limit lowered it refuses in Prepare, naming
the field to shrink.
"""

from __future__ import annotations

import copy
import json

import pytest

from contract.errors import RequestInvalid
from contract.metrics import MAX_METRIC_DEFINITIONS, MAX_REGEX_LENGTH, METRIC_NAMES
from jobs import handler
from jobs.request import state_size
from jobs.request.limits import (
    MAX_ENVIRONMENT,
    MAX_ENVIRONMENT_TEXT,
    MAX_METRIC_NAME,
    MAX_STATE_BYTES,
    MAX_TAG_KEY,
    MAX_TAG_VALUE,
)
from jobs.request.schema import JobRequest, RetrySettings
from jobs.request.state_size import largest_state_bytes
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request
from tests.launcher.paths import RETRY, START, SUCCESS_TAIL

MAX_ATTEMPTS = RetrySettings.__dataclass_fields__["max_attempts"].metadata["max"]
MAX_TAGS = JobRequest.__dataclass_fields__["tags"].metadata["max"]
MAX_METRICS = MAX_METRIC_DEFINITIONS - len(METRIC_NAMES)


def largest_request(*, variables=MAX_ENVIRONMENT, name_length=MAX_ENVIRONMENT_TEXT, value_length=MAX_ENVIRONMENT_TEXT,
                    tags=MAX_TAGS, tag_key=MAX_TAG_KEY, tag_value=MAX_TAG_VALUE, metrics=MAX_METRICS,
                    metric_name=MAX_METRIC_NAME, regex_length=MAX_REGEX_LENGTH, attempts=MAX_ATTEMPTS) -> dict:
    """Every large field at what the request rules allow (one more of any is refused: tested below); Spot
    interruptions retried at once, on Spot, as often as the attempts allow."""
    prefix = "NCCL_X"  # an allowed variable family
    environment = {f"{prefix}{i:03d}".ljust(name_length, "Y"): "a" * value_length for i in range(variables)}
    tag_map = {f"k{i:02d}".ljust(tag_key, "t"): "v" * tag_value for i in range(tags)}
    regex = "m=(" + "[0-9]" * ((regex_length - 4) // 5) + ")"
    regex = regex[:-1].ljust(regex_length - 1, "x") + ")"
    metric_list = [{"name": f"m{i:02d}".ljust(metric_name, "n"), "regex": regex} for i in range(metrics)]
    return job_request(spot=True, environment=environment, tags=tag_map, metrics=metric_list,
                       retry={"max_attempts": attempts, "interruptions_before_on_demand": None,
                              "interruption_wait_seconds": 0})


def refused(request: dict) -> bool:
    try:
        handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request, "execution": {"name": "size-check"}})
    except RequestInvalid:
        return True
    return False


@pytest.fixture
def settings(monkeypatch, platform_settings):
    monkeypatch.setenv("PLATFORM_SETTINGS", json.dumps(platform_settings))


def test_the_largest_request_is_the_largest_the_rules_accept(settings):
    assert not refused(largest_request())
    one_more = {"variables": MAX_ENVIRONMENT + 1, "name_length": MAX_ENVIRONMENT_TEXT + 1,
                "value_length": MAX_ENVIRONMENT_TEXT + 1, "tags": MAX_TAGS + 1, "tag_key": MAX_TAG_KEY + 1,
                "tag_value": MAX_TAG_VALUE + 1, "metrics": MAX_METRICS + 1, "metric_name": MAX_METRIC_NAME + 1,
                "regex_length": MAX_REGEX_LENGTH + 1, "attempts": MAX_ATTEMPTS + 1}
    accepted = [name for name, value in one_more.items() if not refused(largest_request(**{name: value}))]
    assert accepted == [], f"one more of these is still accepted, so the test's request is not the largest: {accepted}"


def state_sizes(result) -> list[int]:
    sizes = []
    for event in result.history:
        for details in event.values():
            if isinstance(details, dict):
                sizes += [len(details[k].encode()) for k in ("input", "output", "parameters")
                          if isinstance(details.get(k), str)]
    return sizes


def test_the_largest_request_runs_every_attempt_under_the_state_limit(harness):
    request = largest_request()
    outcomes = [sm.spot_interrupted()] * (MAX_ATTEMPTS - 1) + [sm.completed()]
    result = harness.run(request, outcomes, name="state-size-largest", timeout=240)
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert len(result.create_calls) == MAX_ATTEMPTS
    assert result.states_entered == [*START, *RETRY * (MAX_ATTEMPTS - 1), *SUCCESS_TAIL]
    ((subject, message),) = result.notifications
    assert "succeeded" in subject and f"({MAX_ATTEMPTS} attempts)" in subject
    prepared = result.lambda_calls[0]
    run = handler.prepare(prepared[1])["run"]
    estimate = largest_state_bytes(request, run, result.create_calls[0], MAX_ATTEMPTS)
    largest = max(state_sizes(result))
    request_bytes = len(json.dumps(request).encode())
    print(f"largest request {request_bytes} B, {MAX_ATTEMPTS} attempts: largest state {largest} B "
          f"({largest / request_bytes:.2f} x the request), estimate {estimate} B, limit {MAX_STATE_BYTES} B")
    assert largest <= estimate <= MAX_STATE_BYTES
    # What changes is carried, not the request again: the largest state is the request once plus the run's record.
    assert largest < 2 * request_bytes


def test_the_guard_refuses_past_the_limit_naming_the_field(settings, monkeypatch):
    monkeypatch.setattr(handler, "clock", lambda: 1_795_248_000.0)  # the run state's times: the same length twice
    request = largest_request(attempts=3)
    run = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request, "execution": {}})
    estimate = largest_state_bytes(request, run["run"], run["launch"]["create"], 3)
    monkeypatch.setattr(state_size, "MAX_STATE_BYTES", estimate - 1)
    with pytest.raises(RequestInvalid) as refusal:
        handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request, "execution": {}})
    (problem,) = refusal.value.problems
    assert problem.path == "environment" and "per state" in problem.message
    monkeypatch.setattr(state_size, "MAX_STATE_BYTES", estimate)
    handler.prepare({"state_shape": handler.STATE_SHAPE, "request": copy.deepcopy(request), "execution": {}})
