"""Why did an attempt fail? One category per failure, from the job's description or the API error.

Under a `createTrainingJob.sync` task a failure reaches the state machine's Catch as `{"Error", "Cause"}`:
- the job ran and failed or stopped: Error `States.TaskFailed` (or `SageMaker.AmazonSageMakerException`),
  Cause the DescribeTrainingJob output as JSON, as far as is known (REFERENCE.md marks that shape
  unverified, so a plain message is accepted too, and the handler falls back to DescribeTrainingJob);
- CreateTrainingJob itself failed: Error like `SageMaker.ResourceLimitExceededException` or
  `SageMaker.AmazonSageMakerException`, Cause the service's message (which names the error code).
The categories drive jobs.policy; "unknown" fails safe (no retry).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

CAPACITY = "capacity"
SPOT_INTERRUPTION = "spot_interruption"
INTERNAL = "internal"
QUOTA = "quota"
THROTTLING = "throttling"
USER_ERROR = "user_error"
USER_STOP = "user_stop"
MAX_RUNTIME = "max_runtime"
UNKNOWN = "unknown"

CATEGORIES = (CAPACITY, SPOT_INTERRUPTION, INTERNAL, QUOTA, THROTTLING, USER_ERROR, USER_STOP, MAX_RUNTIME, UNKNOWN)

# Longest time a job may sit in SecondaryStatus Pending before a failure counts as a capacity shortage
# even when its FailureReason does not say so (jobs on a training plan wait there until the plan starts).
PENDING_TOO_LONG_SECONDS = 1800


@dataclass(frozen=True)
class Failure:
    category: str
    reason: str  # one line, for the summary and the notification
    job_started: bool  # a job was created (so it has a name to describe, and billable time)


def parse_cause(cause: Any) -> dict[str, Any] | None:
    """The DescribeTrainingJob output inside a Catch's Cause, or None when it is a plain message."""
    if isinstance(cause, dict):
        data = cause
    else:
        try:
            data = json.loads(cause) if isinstance(cause, str) else None
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    # Lambda-style wrappers carry the message under errorMessage; a description has a status.
    if "TrainingJobStatus" in data or "TrainingJobName" in data and "SecondaryStatus" in data:
        return data
    return None


def classify_description(job: dict[str, Any]) -> Failure:
    """Classify a failed, stopped or interrupted job from its DescribeTrainingJob output."""
    status = job.get("TrainingJobStatus", "")
    secondary = job.get("SecondaryStatus", "")
    reason = (job.get("FailureReason") or "").strip()
    last_message = _last_status_message(job)
    text = reason or last_message
    short = _one_line(text) or f"{status}/{secondary}"

    if status == "Completed":
        return Failure(UNKNOWN, "the job completed; nothing to retry", True)
    # The statuses SageMaker sets outrank the text: a script killed by a Spot reclaim may still leave an
    # AlgorithmError behind.
    if secondary == "Interrupted":
        return Failure(SPOT_INTERRUPTION, f"Spot capacity was reclaimed: {short}", True)
    if secondary == "MaxWaitTimeExceeded":
        return Failure(SPOT_INTERRUPTION, f"MaxWaitTimeExceeded: Spot capacity did not last the run: {short}", True)
    if secondary == "MaxRuntimeExceeded":
        return Failure(MAX_RUNTIME, f"the attempt reached max_runtime_hours: {short}", True)
    if secondary == "Stopped" and not _mentions(text, r"MaxPendingTime"):
        return Failure(USER_STOP, f"stopped by a user: {short}", True)
    # FailureReason starts with SageMaker's own category; AlgorithmError and ClientError are the user's
    # code or data, whatever words ("internal error", "capacity") their message happens to contain.
    if re.match(r"(AlgorithmError|ClientError)\b", reason):
        return Failure(USER_ERROR, f"the training code or its data failed: {short}", True)
    if _mentions(text, r"spot (instance )?interrupt|reclaimed"):
        return Failure(SPOT_INTERRUPTION, f"Spot capacity was reclaimed: {short}", True)
    if _mentions(text, r"MaxWaitTime"):
        return Failure(SPOT_INTERRUPTION, f"MaxWaitTimeExceeded: Spot capacity did not last the run: {short}", True)
    if _mentions(text, r"CapacityError|Insufficient ?Capacity|Unable to provision requested ML compute capacity"):
        return Failure(CAPACITY, f"capacity shortage: {short}", True)
    if _mentions(text, r"MaxPendingTime") or status == "Failed" and _pending_too_long(job):
        return Failure(CAPACITY, f"waited too long for capacity (Pending): {short}", True)
    if _mentions(text, r"MaxRuntime"):
        return Failure(MAX_RUNTIME, f"the attempt reached max_runtime_hours: {short}", True)
    if status == "Stopped" or secondary == "Stopped":
        return Failure(USER_STOP, f"stopped by a user: {short}", True)
    if _mentions(text, r"InternalServerError|Internal ?Failure|internal error"):
        return Failure(INTERNAL, f"SageMaker internal error: {short}", True)
    if _mentions(text, r"ResourceLimitExceeded"):
        return Failure(QUOTA, f"quota: {short}", True)
    if _mentions(text, r"Throttl|Rate exceeded"):
        return Failure(THROTTLING, f"throttled: {short}", True)
    if _mentions(text, r"ValidationException|No such file|not found|invalid"):
        return Failure(USER_ERROR, f"the training code or its data failed: {short}", True)
    return Failure(UNKNOWN, f"unrecognised failure ({status}/{secondary}): {short}", True)


def classify_api_error(error: str, message: str) -> Failure:
    """Classify an error raised by CreateTrainingJob (or the .sync integration) itself."""
    text = f"{error} {message}"
    short = _one_line(message) or error
    if _mentions(text, r"ResourceLimitExceeded|ServiceQuota|account-level service limit"):
        return Failure(QUOTA, f"quota (ResourceLimitExceeded): {short}", False)
    if _mentions(text, r"Throttl|Rate exceeded|TooManyRequests|SlowDown"):
        return Failure(THROTTLING, f"throttled: {short}", False)
    if _mentions(text, r"CapacityError|InsufficientCapacity|Unable to provision"):
        return Failure(CAPACITY, f"capacity shortage: {short}", False)
    if _mentions(text, r"InternalServerError|InternalFailure|ServiceUnavailable|Status Code: 5\d\d"):
        return Failure(INTERNAL, f"SageMaker internal error: {short}", False)
    if _mentions(text, r"ValidationException|ValidationError|AccessDenied|ResourceInUse|ResourceNotFound"):
        return Failure(USER_ERROR, f"the request was rejected: {short}", False)
    if _mentions(text, r"States\.Timeout|States\.HeartbeatTimeout"):
        return Failure(UNKNOWN, f"the task timed out: {short}", False)
    return Failure(UNKNOWN, f"unrecognised error {error}: {short}", False)


def classify_failure(failure: dict[str, Any], describe=None) -> tuple[Failure, dict[str, Any] | None]:
    """Classify a Catch's `{"Error", "Cause"}`; returns the failure and the job description if known.

    `describe` is a callable returning DescribeTrainingJob output (or None when there is no such job);
    it is used only when the Cause is not a description but the error says the job itself failed.
    """
    error = str(failure.get("Error") or "")
    cause = failure.get("Cause")
    job = parse_cause(cause)
    if job is None and isinstance(cause, str):
        job = _embedded_description(cause)
    message = _message_of(cause)
    if job is None and describe is not None and _job_may_exist(error, message):
        job = describe()
    if job is not None and job.get("TrainingJobStatus") in ("Failed", "Stopped", "Completed") \
            or job is not None and job.get("SecondaryStatus") in ("Interrupted", "MaxWaitTimeExceeded"):
        return classify_description(job), job
    return classify_api_error(error, message), job


def _job_may_exist(error: str, message: str) -> bool:
    # An API error at create left no job; anything else (States.TaskFailed with a plain message) may be
    # a failed job whose description did not come along.
    return not _mentions(f"{error} {message}", r"ResourceLimitExceeded|Throttl|Rate exceeded|ValidationException"
                                               r"|AccessDenied|TooManyRequests")


def _embedded_description(cause: str) -> dict[str, Any] | None:
    # Some integrations wrap the description in a message, e.g. "... : {json}".
    start = cause.find("{")
    if start > 0:
        return parse_cause(cause[start:])
    return None


def _message_of(cause: Any) -> str:
    if isinstance(cause, str):
        try:
            data = json.loads(cause)
        except ValueError:
            return cause
        cause = data
    if isinstance(cause, dict):
        for key in ("errorMessage", "Message", "message", "FailureReason"):
            if isinstance(cause.get(key), str):
                code = cause.get("errorType") or cause.get("ErrorCode") or cause.get("Code") or ""
                return f"{code} {cause[key]}".strip()
        return json.dumps(cause)[:500]
    return "" if cause is None else str(cause)


def _mentions(text: str, pattern: str) -> bool:
    return bool(text) and re.search(pattern, text, re.IGNORECASE) is not None


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _last_status_message(job: dict[str, Any]) -> str:
    transitions = job.get("SecondaryStatusTransitions") or []
    for t in reversed(transitions):
        if t.get("StatusMessage"):
            return str(t["StatusMessage"])
    return ""


def _pending_too_long(job: dict[str, Any]) -> bool:
    for t in job.get("SecondaryStatusTransitions") or []:
        if t.get("Status") != "Pending":
            continue
        start, end = to_epoch(t.get("StartTime")), to_epoch(t.get("EndTime"))
        if start is not None and end is not None and end - start >= PENDING_TOO_LONG_SECONDS:
            return True
    return False


def to_epoch(value: Any) -> float | None:
    """Timestamps arrive as datetimes (boto3), ISO strings (Step Functions) or epoch seconds/milliseconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return value / 1000 if value > 1e11 else float(value)
    if hasattr(value, "timestamp"):
        return value.timestamp()
    if isinstance(value, str):
        from datetime import UTC, datetime

        text = value.strip().replace("Z", "+00:00")
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            try:
                return to_epoch(float(text))
            except ValueError:
                return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    return None
