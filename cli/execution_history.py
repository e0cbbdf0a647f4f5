"""What an execution is doing, read from Step Functions' own record of it.

The execution history is the source of truth for the attempts: every CreateTrainingJob task the
state machine scheduled carries the full request (job name, instance type, Spot), and the
`decision` objects the launcher's Lambda adds to the state say why an attempt was followed by
another. Nothing here needs the jobs package, so `status` works on any version of the launcher.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cli.aws import Aws
from jobs.retry.run_state import CONTINUED_IN

# The training task is `arn:aws:states:::sagemaker:createTrainingJob.sync` (resource `createTrainingJob.sync`).
_TRAINING_RESOURCE = "createTrainingJob"


@dataclass
class AttemptView:
    number: int
    job_name: str
    instance_type: str
    spot: bool
    # Filled from the task's failure and the launcher's decision, when there was one.
    error: str | None = None
    category: str | None = None
    reason: str | None = None
    action: str | None = None


@dataclass
class ExecutionView:
    arn: str
    name: str
    status: str
    start: datetime | None
    stop: datetime | None
    current_state: str | None
    attempts: list[AttemptView] = field(default_factory=list)
    error: str | None = None
    cause: str | None = None
    output: Any = None
    input: Any = None

    @property
    def latest(self) -> AttemptView | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def request_name(self) -> str | None:
        return self.input.get("name") if isinstance(self.input, dict) else None

    @property
    def continued_in(self) -> str:
        """The execution the run went on in, when this one handed it over near the history limit; "" otherwise."""
        return _continued_in(self.output) if self.status == "SUCCEEDED" else ""


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (TypeError, json.JSONDecodeError):
        return None  # a truncated payload (256 KiB limit): the view does without it


def _instance_type(params: dict[str, Any]) -> str:
    resources = params.get("ResourceConfig") or {}
    if resources.get("InstanceType"):
        return resources["InstanceType"]
    groups = resources.get("InstanceGroups") or []
    return " + ".join(f"{g.get('InstanceCount')}x {g.get('InstanceType')}" for g in groups) or "?"


def lambda_result(event: dict[str, Any]) -> dict[str, Any] | None:
    """What a launcher Lambda returned, from its history event: direct function ARN or the lambda:invoke
    integration (Payload); None for any other event."""
    if event["type"] == "LambdaFunctionSucceeded":
        result = _json(event["lambdaFunctionSucceededEventDetails"].get("output"))
    elif event["type"] == "TaskSucceeded" and event["taskSucceededEventDetails"].get("resourceType") == "lambda":
        result = _json(event["taskSucceededEventDetails"].get("output"))
        result = result.get("Payload") if isinstance(result, dict) else None
    else:
        return None
    return result if isinstance(result, dict) else None


def _decision(event: dict[str, Any]) -> dict[str, Any] | None:
    """The `decision` in a Lambda's result."""
    decision = (lambda_result(event) or {}).get("decision")
    return decision if isinstance(decision, dict) else None


def latest_run_state(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run state (jobs.retry.run_state.RunState's dict form) as the launcher's last Lambda left it: every handler
    returns it ("run"; Summarize's "summary" holds its attempts); None when Prepare never succeeded."""
    for event in reversed(events):
        result = lambda_result(event)
        if result and isinstance(result.get("run"), dict):
            return result["run"]
    return None


def final_summary(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Summarize's summary (jobs.outcome.summary.summary), the run's attempts as they ended; None before it ran."""
    for event in reversed(events):
        summary = (lambda_result(event) or {}).get("summary")
        if isinstance(summary, dict):
            return summary
    return None


def continued_in(events: list[dict[str, Any]]) -> str:
    """ExecutionView.continued_in, read from the execution's history (its ExecutionSucceeded event's output)."""
    ended = next((e for e in reversed(events) if e["type"] == "ExecutionSucceeded"), None)
    return _continued_in(_json(ended["executionSucceededEventDetails"].get("output"))) if ended else ""


def _continued_in(output: Any) -> str:
    """The launcher's Continued end names the execution the run went on in (jobs.retry.run_state.CONTINUED_IN)."""
    found = output.get(CONTINUED_IN) if isinstance(output, dict) else None
    return found if isinstance(found, str) else ""


def history_events(aws: Aws, arn: str) -> list[dict[str, Any]]:
    paginator = aws.client("stepfunctions").get_paginator("get_execution_history")
    events: list[dict[str, Any]] = []
    for page in paginator.paginate(executionArn=arn, includeExecutionData=True):
        events.extend(page["events"])
    return events


def view_from(description: dict[str, Any], events: list[dict[str, Any]]) -> ExecutionView:
    view = ExecutionView(
        arn=description["executionArn"],
        name=description["name"],
        status=description["status"],
        start=description.get("startDate"),
        stop=description.get("stopDate"),
        current_state=None,
        error=description.get("error"),
        cause=description.get("cause"),
        output=_json(description.get("output")),
        input=_json(description.get("input")),
    )
    for event in events:
        kind = event["type"]
        if kind.endswith("StateEntered"):
            view.current_state = event["stateEnteredEventDetails"]["name"]
        elif kind == "TaskScheduled":
            details = event["taskScheduledEventDetails"]
            if details.get("resourceType") == "sagemaker" and details.get("resource", "").startswith(
                _TRAINING_RESOURCE
            ):
                params = _json(details.get("parameters")) or {}
                view.attempts.append(AttemptView(
                    number=len(view.attempts) + 1,
                    job_name=params.get("TrainingJobName", "?"),
                    instance_type=_instance_type(params),
                    spot=bool(params.get("EnableManagedSpotTraining")),
                ))
        elif kind == "TaskFailed" and view.attempts:
            details = event["taskFailedEventDetails"]
            if details.get("resourceType") == "sagemaker" and view.latest.error is None:
                view.latest.error = details.get("error")
        elif view.attempts and (decision := _decision(event)) is not None:
            # Only the launcher's decide Lambda returns a decision, once per failed attempt.
            view.latest.category = decision.get("category")
            view.latest.reason = decision.get("reason")
            view.latest.action = decision.get("action")
    _enrich_from_summary(view)
    return view


def _enrich_from_summary(view: ExecutionView) -> None:
    """A finished run's output is the launcher's summary; its per-attempt records fill what history lacks."""
    summary = view.output if isinstance(view.output, dict) else {}
    records = {a.get("job_name"): a for a in summary.get("attempts") or [] if isinstance(a, dict)}
    for attempt in view.attempts:
        record = records.get(attempt.job_name)
        if record:
            attempt.category = attempt.category or record.get("category") or None
            attempt.reason = attempt.reason or record.get("reason") or None


def describe(aws: Aws, arn: str) -> ExecutionView:
    description = aws.client("stepfunctions").describe_execution(executionArn=arn)
    return view_from(description, history_events(aws, arn))


def describe_job(aws: Aws, job_name: str) -> dict[str, Any] | None:
    """DescribeTrainingJob, or None when the job was never created (e.g. CreateTrainingJob was refused).

    An engineer may describe only jobs tagged with their team's run tag (docs/SECURITY.md), so a job that does
    not exist answers AccessDenied rather than "not found": both read as no job here (the attempt's name is the
    run's own, from its execution history)."""
    from botocore.exceptions import ClientError

    try:
        return aws.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"ValidationException", "ResourceNotFound",
                                                           "AccessDeniedException"}:
            return None
        raise


def job_metrics(job: dict[str, Any] | None) -> dict[str, float]:
    """The latest value of each metric SageMaker parsed from the job's log lines."""
    if not job:
        return {}
    return {m["MetricName"]: m["Value"] for m in job.get("FinalMetricDataList") or []}
