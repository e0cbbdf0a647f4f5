"""How large the launcher's state grows, and the request size guard that keeps it under Step Functions' limit.

A state's input or output, and a task's input as it is scheduled, may hold at most 256 KiB of UTF-8
(MAX_STATE_BYTES); past it the execution fails with States.DataLimitExceeded, which no Retry or Catch can take: no
summary, no notification, the job possibly left running. The request travels once: it is the execution's input,
which the state machine hands to Prepare and Decide (`$$.Execution.Input`) and never puts in the state. The state
holds the run state (small, a record per attempt) and one request-sized thing at a time, under `launch`: the
attempt's CreateTrainingJob request (environment, tags, metric definitions, hyperparameters: the request rendered)
until the Launch state, then the job's description SageMaker echoes back (the `.sync` result, or a failed job's
Cause, which the state machine drops before Decide), and at the end the summary and its message beside it.

So the largest state is the run state with all its attempts, plus the larger of the request (Decide's input) and
the create request with what SageMaker adds to it, plus the end's additions. tests/launcher/test_state_size.py
runs requests at the limit through the synthesized state machine and checks every state's input and output and
every task's input against the estimate and the limit.
"""

from __future__ import annotations

import json
from typing import Any

from contract.errors import Problem
from jobs.request.limits import MAX_STATE_BYTES

# What a job's description adds to the create request it echoes (status transitions, final metrics, times,
# ARNs, the model artifacts' URI), with room to spare: about 3 KiB measured.
DESCRIPTION_EXTRA = 8 * 1024
# A decision, the summary's fixed fields, the run's record and the notification's fixed lines: about 4 KiB.
END_EXTRA = 8 * 1024
# One attempt: its record in the run state, again in the summary, and its line in the message (about 1.5 KiB).
PER_ATTEMPT = 3 * 1024
# The request's fields that can make it large, in the order a message names them.
LARGE_FIELDS = ("environment", "tags", "metrics", "secrets", "hyperparameters", "instance_groups", "model_shape")


def _bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def largest_state_bytes(request: dict[str, Any], run: dict[str, Any], create: dict[str, Any],
                        max_attempts: int) -> int:
    """An upper bound of the largest state of the run: the run state as rendered for the first attempt with
    `max_attempts` attempts' records, the larger of the request and the job's description (the create request
    and what SageMaker adds), and the end's additions."""
    carried = max(_bytes(request), _bytes(create) + DESCRIPTION_EXTRA)
    return _bytes(run) + carried + END_EXTRA + PER_ATTEMPT * max_attempts


def state_size_problem(request: dict[str, Any], run: dict[str, Any], create: dict[str, Any],
                       max_attempts: int) -> Problem | None:
    """A Problem naming the request's largest field when the run's state would pass MAX_STATE_BYTES."""
    estimate = largest_state_bytes(request, run, create, max_attempts)
    if estimate <= MAX_STATE_BYTES:
        return None
    sizes = sorted(((name, _bytes(request.get(name))) for name in LARGE_FIELDS if request.get(name)),
                   key=lambda pair: -pair[1])
    largest = sizes[0][0] if sizes else ""
    listed = ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in sizes[:3]) or "no large field"
    return Problem(largest, (
        f"the launcher's state would reach about {estimate / 1024:.0f} KiB, over Step Functions' "
        f"{MAX_STATE_BYTES // 1024} KiB per state (an execution past it ends at once, without a summary or a "
        f"notification): make the request smaller ({listed}), or lower retry.max_attempts"))
