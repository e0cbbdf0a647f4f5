"""The request size guard at its limit, through the synthesized state machine: the largest request Prepare
accepts runs through a Spot interruption and a service fault to completion with every state's input and output
under Step Functions' 256 KiB (moto does not enforce the limit: the history's events are measured here) and
under the guard's estimate; one a little larger is refused in Prepare naming the field to shrink.
"""

from __future__ import annotations

import json

import pytest

from contract.errors import RequestInvalid
from jobs import handler
from jobs.api_limits import MAX_STATE_BYTES
from jobs.state_size import largest_state_bytes
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request

ATTEMPTS = 3


def big_request(value_length: int) -> dict:
    """Every large field filled as the request rules allow: 97 variables, 45 tags, 20 metric definitions."""
    environment = {f"NCCL_X{i:03d}" + "Y" * 40: "a" * value_length for i in range(97)}
    tags = {f"k{i:02d}" + "t" * 120: "v" * 256 for i in range(45)}
    metrics = [{"name": f"m{i:02d}" + "n" * 200, "regex": "m=(" + "[0-9]" * 95 + ")"} for i in range(20)]
    return job_request(spot=True, environment=environment, tags=tags, metrics=metrics,
                       retry={"max_attempts": ATTEMPTS})


def accepted(request: dict) -> bool:
    try:
        handler.prepare({"request": request, "execution": {"name": "size-check"}})
    except RequestInvalid:
        return False
    return True


@pytest.fixture(scope="module")
def at_the_limit(platform_settings) -> tuple[int, dict]:
    """The longest environment value (and its request) the guard accepts, by bisection on Prepare itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLATFORM_SETTINGS", json.dumps(platform_settings))
        low, high = 0, 512
        assert accepted(big_request(low)) and not accepted(big_request(high))
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if accepted(big_request(middle)) else (low, middle)
    return low, big_request(low)


def state_sizes(result) -> list[int]:
    sizes = []
    for event in result.history:
        for details in event.values():
            if isinstance(details, dict):
                sizes += [len(details[k].encode()) for k in ("input", "output", "parameters")
                          if isinstance(details.get(k), str)]
    return sizes


def test_a_request_at_the_guards_limit_runs_to_the_end_under_the_state_limit(harness, at_the_limit):
    length, request = at_the_limit
    assert length > 100  # the guard leaves the large fields real room
    result = harness.run(request, [sm.spot_interrupted(), sm.internal_error(), sm.completed()],
                         name="state-size-at-the-limit", timeout=90)
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert len(result.create_calls) == ATTEMPTS
    ((subject, _),) = result.notifications
    assert "succeeded" in subject
    prepared = result.lambda_calls[1][1]  # Decide's first input: the run state and create request Prepare rendered
    estimate = largest_state_bytes(prepared["run"], prepared["create"], ATTEMPTS)
    largest = max(state_sizes(result))
    print(f"environment values of {length} characters: request {len(json.dumps(request))} B, largest state "
          f"{largest} B, estimate {estimate} B, limit {MAX_STATE_BYTES} B")
    assert largest <= estimate <= MAX_STATE_BYTES


def test_a_little_more_is_refused_in_prepare_naming_the_field(harness, at_the_limit):
    length, _ = at_the_limit
    result = harness.run(big_request(length + 1), [], name="state-size-over")
    assert result.status == "FAILED" and result.error == "RequestInvalid" and result.create_calls == []
    assert "environment:" in result.cause and "256 KiB per state" in result.cause
