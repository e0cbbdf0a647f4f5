"""Why did an attempt fail? One category per failure, from the job's description or the API error.

Under a `createTrainingJob.sync` task a failure reaches the state machine's Catch as `{"Error", "Cause"}`:
- the job ran and failed or stopped: Error `States.TaskFailed` (or `SageMaker.AmazonSageMakerException`),
  Cause the DescribeTrainingJob output as JSON, as far as is known (docs/REFERENCE.md marks that shape
  unverified, so a plain message is accepted too, and the handler falls back to DescribeTrainingJob);
- CreateTrainingJob itself failed: Error like `SageMaker.ResourceLimitExceededException` or
  `SageMaker.AmazonSageMakerException`, Cause the service's message (which names the error code).
Both are read by one table of rules (RULES), first match wins; each rule says where its pattern is read
(Source). The categories drive jobs.retry.policy; "unknown" fails safe (no retry).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any

from contract.failures import OUT_OF_MEMORY_ADVICE, FailureCode, head_pattern, parse_failure_line
from jobs.timestamps import to_epoch


class Category(enum.StrEnum):
    CAPACITY = "capacity"
    SPOT_INTERRUPTION = "spot_interruption"
    # Stopped by someone the launcher does not know of (SageMaker itself, a training plan's end, the console):
    # a stop the launcher or a user asked for ends the execution first (trainctl stop, an abort), so Decide
    # never sees it. Resumed from the checkpoint like a Spot interruption.
    INTERRUPTION = "interruption"
    INTERNAL = "internal"
    QUOTA = "quota"
    THROTTLING = "throttling"
    HARDWARE = "hardware"  # an unhealthy instance, a GPU memory error, a broken NCCL/EFA transport
    USER_ERROR = "user_error"
    MAX_RUNTIME = "max_runtime"
    # Another execution of the run holds it (jobs.registry), or a newer attempt claimed its checkpoints
    # (training.checkpoint.fencing): this execution must not launch or write, and ends.
    SUPERSEDED = "superseded"
    # The platform's own setup refused the launch (the launcher may not pass the execution role, create or tag the
    # job): nothing in the request can fix it, and no wait will.
    PLATFORM_CONFIG = "platform_config"
    UNKNOWN = "unknown"


class Source(enum.StrEnum):
    """Where a rule's pattern is read."""

    # "<TrainingJobStatus>/<SecondaryStatus>", plus " Pending too long" when the job waited in Pending for
    # PENDING_TOO_LONG_SECONDS or more.
    STATUS = "status"
    FAILURE_REASON = "failure_reason"  # the description's FailureReason: SageMaker's own verdict
    # The last SecondaryStatusTransitions StatusMessage, read only when there is no FailureReason.
    STATUS_MESSAGE = "status_message"
    ERROR_CODE = "error_code"  # the Catch's Error of an API error: SageMaker.ResourceLimitExceededException
    ERROR_MESSAGE = "error_message"  # its Cause: the service's message


# Longest time a job may sit in SecondaryStatus Pending before a failure counts as a capacity shortage
# even when its FailureReason does not say so (jobs on a training plan wait there until the plan starts).
PENDING_TOO_LONG_SECONDS = 1800

JOB_TEXT = (Source.FAILURE_REASON, Source.STATUS_MESSAGE)
# How the Java SDK's message (the Catch's Cause of an API error) gives an answer's HTTP status when it was 5xx.
SERVER_ERROR = r"Status Code: 5\d\d"
API_ERROR = (Source.ERROR_CODE, Source.ERROR_MESSAGE)
ANY_TEXT = JOB_TEXT + API_ERROR


class Response(enum.StrEnum):
    """What a rule asks of the retry policy (jobs.retry.policy): the category's own retry, or giving up at once."""

    RETRY = "retry"  # the category's policy: wait, maybe the next type, within its bounds
    RETRY_CHECKED = "retry_checked"  # a new attempt with infra_check on, on the next type where there is one
    FAIL = "fail"  # no attempt can succeed as things stand: the reason says what to change


@dataclass(frozen=True)
class Rule:
    pattern: str  # searched case-insensitively
    sources: tuple[Source, ...]
    category: Category
    reason: str  # the summary's words; `{short}` is the failure's one-line text
    unless: str = ""  # a pattern that, found in any source, vetoes the rule
    action: Response = Response.RETRY  # what the policy does with it (categories it never retries ignore it)


# Hardware and transport faults, as SageMaker, CUDA and NCCL spell them (docs/REFERENCE.md; tests/jobs/
# test_failure_texts.py cites a public thread for each).
HARDWARE_PATTERN = (
    r"Launched instance was unhealthy|uncorrectable ECC|ECC_UNCORRECTABLE|ECC error|GPU has fallen off the bus|"
    r"\bXid\b|NCCL WARN NET/OFI|aws-ofi-nccl|ncclSystemError|ncclInternalError|NCCL error.{0,80}unhandled "
    r"(?:system|cuda) error|\bEFA\b.{0,40}(?:error|fail)|libfabric|fi_\w+ failed|NCCL communicator was aborted|"
    r"instance .{0,40}(?:failed|did not pass) .{0,20}health check|"
    # cuDNN failing inside the library, reported beside ECC errors on SageMaker jobs: the GPU, not the code.
    r"CUDNN_STATUS_INTERNAL_ERROR|"
    # A collective that never completed: a rank stopped (a GPU, NCCL/EFA or host fault), as torch's NCCL
    # watchdog says it (torch 2.x) and as gloo's control collectives time out.
    r"Watchdog caught collective operation timeout|ProcessGroupNCCL's watchdog got stuck|Heartbeat monitor timed "
    r"out|NCCL operations have failed or timed out|Timed out waiting \d+ ?ms for (?:send|recv) operation")

# The job's subnets could not reach S3 while SageMaker downloaded the input: the platform's network (its VPC, route
# tables, S3 gateway endpoint, security groups), never the user's data, though SageMaker calls it a ClientError.
NO_S3_ROUTE_PATTERN = r"route to an S3 VPC endpoint or a NAT device|network ACL allow outbound traffic to S3"

STOPPED = ("stopped, not by the launcher or trainctl (SageMaker, a training plan's end, or the console): resumed "
           "from its checkpoint; `trainctl stop` (or stopping the execution) ends a run: {short}")

# Order matters: SageMaker's statuses outrank the text (a script killed by a Spot reclaim may still leave an
# AlgorithmError behind), and a FailureReason starting with AlgorithmError or ClientError is the user's code
# or data, whatever words ("internal error", "capacity") its message happens to contain.
RULES: tuple[Rule, ...] = (
    Rule(r"^Completed/", (Source.STATUS,), Category.UNKNOWN, "the job completed; nothing to retry"),
    Rule(r"/Interrupted\b", (Source.STATUS,), Category.SPOT_INTERRUPTION, "Spot capacity was reclaimed: {short}"),
    Rule(r"/MaxWaitTimeExceeded\b", (Source.STATUS,), Category.SPOT_INTERRUPTION,
         "MaxWaitTimeExceeded: Spot capacity did not last the run: {short}"),
    Rule(r"/MaxRuntimeExceeded\b", (Source.STATUS,), Category.MAX_RUNTIME,
         "the attempt reached max_runtime_hours: {short}"),
    Rule(r"/Stopped\b", (Source.STATUS,), Category.INTERRUPTION, STOPPED, unless=r"MaxPendingTime"),
    # The training package's hang watchdog (training.resilience.watchdog): a rank stopped progressing; the line names it and
    # its host. Like a collective timeout, a fresh, health-checked instance cures the usual causes.
    Rule(head_pattern(FailureCode.HANG), JOB_TEXT, Category.HARDWARE,
         "a rank stopped progressing (hang), retried on a health-checked instance: {short}",
         action=Response.RETRY_CHECKED),
    # Every rank of a host stopped answering at once (training.resilience.peers): the instance was lost. A process killed on a
    # live host (`process_lost`, most often the out-of-memory killer) is the user's, with the rule below.
    Rule(head_pattern(FailureCode.HOST_LOST), JOB_TEXT, Category.HARDWARE,
         "an instance was lost mid-run, retried on a health-checked instance: {short}",
         action=Response.RETRY_CHECKED),
    # A newer attempt of the run claimed its checkpoint folder (training.checkpoint.fencing): whoever runs it, not this run.
    Rule(head_pattern(FailureCode.SUPERSEDED), JOB_TEXT, Category.SUPERSEDED,
         "a newer attempt of the run writes its checkpoints, so this one stopped: {short}", action=Response.FAIL),
    # The training package's own verdict (contract.failures), inside "AlgorithmError: ...": the user's to fix.
    Rule(head_pattern(), JOB_TEXT, Category.USER_ERROR, "the training package reported: {short}",
         action=Response.FAIL),
    # Broken hardware surfaces through the script (an AlgorithmError) or as a status message; a fresh instance
    # cures it, a health check first keeps the next one from being as bad.
    Rule(HARDWARE_PATTERN, JOB_TEXT, Category.HARDWARE, "hardware or network fault: {short}",
         action=Response.RETRY_CHECKED),
    # Retried as a service fault (a bounded number of times, after a wait: a route or endpoint being replaced
    # passes); one that persists is the platform team's to fix, and the reason says where.
    Rule(NO_S3_ROUTE_PATTERN, JOB_TEXT, Category.INTERNAL,
         "the platform's network could not reach S3 to download the input (not the job's data): {short} (if it "
         "persists, the platform team checks the training subnets' route to the VPC's S3 gateway endpoint and the "
         "security groups' and network ACLs' outbound HTTPS to S3)"),
    Rule(r"^(?-i:AlgorithmError|ClientError)\b", (Source.FAILURE_REASON,), Category.USER_ERROR,
         "the training code or its data failed: {short}"),
    Rule(r"spot (instance )?interrupt|reclaimed", JOB_TEXT, Category.SPOT_INTERRUPTION,
         "Spot capacity was reclaimed: {short}"),
    Rule(r"MaxWaitTime", JOB_TEXT, Category.SPOT_INTERRUPTION,
         "MaxWaitTimeExceeded: Spot capacity did not last the run: {short}"),
    Rule(r"CapacityError|Insufficient ?Capacity|Unable to provision", ANY_TEXT, Category.CAPACITY,
         "capacity shortage: {short}"),
    Rule(r"MaxPendingTime", JOB_TEXT, Category.CAPACITY, "waited too long for capacity (Pending): {short}"),
    Rule(r"^Failed/.* Pending too long$", (Source.STATUS,), Category.CAPACITY,
         "waited too long for capacity (Pending): {short}"),
    Rule(r"MaxRuntime", JOB_TEXT, Category.MAX_RUNTIME, "the attempt reached max_runtime_hours: {short}"),
    Rule(r"^Stopped/|/Stopped\b", (Source.STATUS,), Category.INTERRUPTION, STOPPED),
    # Quotas that waiting cannot fix: a limit of 0, a type the region does not offer, more than the limit.
    Rule(r"service limit .{0,120}? is 0 Instances|not available in this region|not supported in this region",
         ANY_TEXT, Category.QUOTA, "quota that no wait can satisfy: {short} (raise the quota in Service Quotas, "
         "or choose an instance type the region offers)", action=Response.FAIL),
    Rule(r"ResourceLimitExceeded|ServiceQuota|account-level service limit", ANY_TEXT, Category.QUOTA,
         "quota (ResourceLimitExceeded): {short}"),
    Rule(r"Throttl|Rate exceeded|TooManyRequests|SlowDown", ANY_TEXT, Category.THROTTLING, "throttled: {short}"),
    # HTTP 5xx in every spelling: the service's error codes, the Java SDK's "Status Code: 500", botocore's
    # "An error occurred (500) ... Internal Server Error", 503 Service Unavailable.
    Rule(r"InternalServerError|Internal ?Failure|internal error|Internal Server Error|Service ?Unavailable|"
         rf"{SERVER_ERROR}|\(5\d\d\)|\b50[0-4] (?:Internal|Service|Bad Gateway|Gateway)", ANY_TEXT,
         Category.INTERNAL, "SageMaker internal error: {short}"),
    Rule(r"ValidationException|No such file|not found|invalid", JOB_TEXT, Category.USER_ERROR,
         "the training code or its data failed: {short}"),
    Rule(r"AccessDenied|not authorized to perform|iam:PassRole", API_ERROR, Category.PLATFORM_CONFIG,
         "the platform's own permissions refused the launch: {short}"),
    Rule(r"ValidationException|ValidationError|ResourceInUse|ResourceNotFound", API_ERROR,
         Category.USER_ERROR, "the request was rejected: {short}"),
    Rule(r"States\.Timeout|States\.HeartbeatTimeout", API_ERROR, Category.UNKNOWN, "the task timed out: {short}"),
)


def first_rule(evidence: dict[Source, str]) -> Rule | None:
    """The first rule whose pattern is found in one of its sources (and whose `unless` is found in none)."""
    for rule in RULES:
        if any(_mentions(evidence.get(s, ""), rule.pattern) for s in rule.sources) \
                and not (rule.unless and any(_mentions(text, rule.unless) for text in evidence.values())):
            return rule
    return None


@dataclass(frozen=True)
class Failure:
    category: Category
    reason: str  # one line, for the summary and the notification
    job_started: bool  # a job was created (so it has a name to describe, and billable time)
    action: Response = Response.RETRY  # the rule's: jobs.retry.policy gives up at once on FAIL


# The account limit, usage and request of a ResourceLimitExceeded message: a request above the limit itself
# can never fit, however long the run waits.
_QUOTA_NUMBERS = re.compile(r"is (\d+) Instances?, with current utilization of (\d+) Instances? and a request "
                            r"delta of (\d+) Instances?", re.IGNORECASE)


def _failure(rule: Rule, short: str, evidence: dict[Source, str], job_started: bool) -> Failure:
    """The failure a rule describes, with the words the user needs: the package's own line, what to raise."""
    reason, action = rule.reason.format(short=short), rule.action
    found = next((line for text in evidence.values() if (line := parse_failure_line(text or ""))), None)
    if rule.category is Category.USER_ERROR and found is not None:
        code, message = found
        reason = f"the training package reported {code.value}: {message}"
        if code is FailureCode.OUT_OF_MEMORY and OUT_OF_MEMORY_ADVICE not in message:
            reason += f" ({OUT_OF_MEMORY_ADVICE})"
    numbers = next((m for text in evidence.values() if (m := _QUOTA_NUMBERS.search(text or ""))), None)
    if rule.category is Category.QUOTA and action is Response.RETRY and numbers:
        limit, _, delta = (int(n) for n in numbers.groups())
        if delta > limit:
            action = Response.FAIL
            reason = (f"quota that no wait can satisfy: the request needs {delta} instances and the account limit "
                      f"is {limit}: {short} (raise the quota to at least {delta} in Service Quotas, or lower "
                      "instance.count)")
    return Failure(rule.category, reason, job_started, action)


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
    short = _one_line(reason or last_message) or f"{status}/{secondary}"
    evidence = {
        Source.STATUS: f"{status}/{secondary}" + (" Pending too long" if _pending_too_long(job) else ""),
        Source.FAILURE_REASON: reason,
        Source.STATUS_MESSAGE: "" if reason else last_message,
    }
    rule = first_rule(evidence)
    if rule is None:
        return Failure(Category.UNKNOWN, f"unrecognised failure ({status}/{secondary}): {short}", True)
    return _failure(rule, short, evidence, True)


def classify_api_error(error: str, message: str) -> Failure:
    """Classify an error raised by CreateTrainingJob (or the .sync integration) itself."""
    short = _one_line(message) or error
    evidence = {Source.ERROR_CODE: error, Source.ERROR_MESSAGE: message}
    rule = first_rule(evidence)
    if rule is None:
        return Failure(Category.UNKNOWN, f"unrecognised error {error}: {short}", False)
    return _failure(rule, short, evidence, False)


# TrainingJobStatus values of a job that has ended (jobs.retry.run_state.RUNNING: of one that runs).
ENDED = ("Completed", "Failed", "Stopped")


def _ended(job: dict[str, Any] | None) -> bool:
    return job is not None and (job.get("TrainingJobStatus") in ENDED
                                or job.get("SecondaryStatus") in ("Interrupted", "MaxWaitTimeExceeded"))


def ended_job_in(failure: dict[str, Any]) -> dict[str, Any] | None:
    """The description of an ended job that a Catch's Cause carries (the `.sync` task's failed job), if any."""
    cause = failure.get("Cause")
    job = parse_cause(cause)
    if job is None and isinstance(cause, str):
        job = _embedded_description(cause)
    return job if _ended(job) else None


def classify_launch(failure: dict[str, Any], job: dict[str, Any] | None) -> Failure:
    """Classify a launch failure once the attempt's job has been looked up: by the job when it ended, else
    by the API error (no job was created, or a job of that name is not the run's)."""
    if _ended(job):
        return classify_description(job)
    return classify_api_error(str(failure.get("Error") or ""), _message_of(failure.get("Cause")))


def may_have_created(failure: dict[str, Any]) -> bool:
    """Whether a failed create may still have made its job: SageMaker answered it with a server error (5xx), which
    it also does after creating the job (docs/REFERENCE.md)."""
    return str(failure.get("Error") or "").startswith("SageMaker.") and bool(
        re.search(SERVER_ERROR, str(failure.get("Cause") or "")))


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
