"""The run state the state machine carries between attempts, and the summary it ends with.

A run is one execution of the state machine: one request, one checkpoint prefix, one or more attempts
(training jobs). The state is plain JSON (it travels through Step Functions, 256 KB at most), e.g.
    {"run_id", "execution", "request", "started_at", "started_epoch", "attempt", "instance_type", "spot",
     "checkpoint_s3_uri", "counts": {...}, "waited_seconds", "attempts": [{...}, ...]}
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jobs import classify as c
from jobs.classify import Failure, to_epoch
from jobs.request import JobRequest


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """boto3 output (datetimes) as JSON values."""
    return json.loads(json.dumps(value, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v)))


def new_run(request: JobRequest, *, run_id: str, execution: dict[str, Any], now: float) -> dict[str, Any]:
    started = to_epoch(execution.get("start_time")) or now
    return {
        "run_id": run_id,
        "execution": {"name": execution.get("name", ""), "start_time": execution.get("start_time") or iso(started)},
        "request": request.to_dict(),
        "started_at": iso(started),
        "started_epoch": started,
        "attempt": 0,
        "instance_type": request.training_instance_type,
        "spot": request.spot,
        "checkpoint_s3_uri": "",
        "counts": {c.CAPACITY: 0, c.SPOT_INTERRUPTION: 0, c.INTERNAL: 0, c.QUOTA: 0, c.THROTTLING: 0,
                   "api_error_streak": 0},
        "waited_seconds": 0,
        "attempts": [],
    }


def start_attempt(run: dict[str, Any], create: dict[str, Any], *, attempt: int, now: float) -> None:
    resources = create["ResourceConfig"]
    run["attempt"] = attempt
    run["checkpoint_s3_uri"] = create["CheckpointConfig"]["S3Uri"]
    run["instance_type"] = resources.get("InstanceType") or run["instance_type"]
    run["spot"] = create["EnableManagedSpotTraining"]
    run["attempts"].append({
        "attempt": attempt,
        "job_name": create["TrainingJobName"],
        "instance_type": resources.get("InstanceType")
        or ",".join(f"{g['InstanceCount']}x{g['InstanceType']}" for g in resources.get("InstanceGroups", [])),
        "instance_count": resources.get("InstanceCount")
        or sum(g["InstanceCount"] for g in resources.get("InstanceGroups", [])),
        "spot": create["EnableManagedSpotTraining"],
        "status": "InProgress",
        "secondary_status": "",
        "category": "",
        "reason": "",
        "started_at": iso(now),
        "ended_at": "",
        "training_seconds": None,
        "billable_seconds": None,
        "lost_seconds": 0,
    })


def finish_attempt(run: dict[str, Any], *, now: float, job: dict[str, Any] | None,
                   failure: Failure | None = None) -> dict[str, Any]:
    """Record the outcome of the current attempt; on failure count it by category."""
    current = run["attempts"][-1]
    started = to_epoch(current["started_at"]) or now
    if job:
        current["status"] = job.get("TrainingJobStatus", current["status"])
        current["secondary_status"] = job.get("SecondaryStatus", "")
        current["training_seconds"] = job.get("TrainingTimeInSeconds")
        current["billable_seconds"] = job.get("BillableTimeInSeconds")
        started = to_epoch(job.get("CreationTime")) or started
        ended = to_epoch(job.get("TrainingEndTime")) or to_epoch(job.get("LastModifiedTime")) or now
    else:
        ended = now
    current["ended_at"] = iso(ended)
    if failure is None:
        current["category"] = ""
        return current
    if not job:
        current["status"] = "NotCreated" if not failure.job_started else "Failed"
    current["category"] = failure.category
    current["reason"] = failure.reason
    # Work since the last checkpoint is lost; without knowing when that was, count the attempt's training
    # time (or, lacking it, its wall-clock time) as the upper bound.
    current["lost_seconds"] = int(current["training_seconds"] if current["training_seconds"] is not None
                                  else max(ended - started, 0)) if failure.job_started else 0
    counts = run["counts"]
    if failure.category in counts:
        counts[failure.category] += 1
    counts["api_error_streak"] = counts["api_error_streak"] + 1 if failure.category in (c.QUOTA, c.THROTTLING) else 0
    return current


def summary(run: dict[str, Any], *, job: dict[str, Any] | None, decision: dict[str, Any] | None,
            now: float) -> dict[str, Any]:
    """What the execution outputs and the notification says."""
    attempts = run["attempts"]
    succeeded = decision is None and bool(job) and job.get("TrainingJobStatus") == "Completed"
    metrics = {m["MetricName"]: m["Value"] for m in (job or {}).get("FinalMetricDataList") or []}
    lost_interruptions = sum(a["lost_seconds"] for a in attempts if a["category"] == c.SPOT_INTERRUPTION)
    billable = [a["billable_seconds"] for a in attempts if a["billable_seconds"] is not None]
    return {
        "run_id": run["run_id"],
        "request_name": run["request"]["name"],
        "execution": run["execution"]["name"],
        "status": "Succeeded" if succeeded else "Failed",
        "reason": "" if succeeded else (decision or {}).get("reason", "the run did not complete"),
        "category": "" if succeeded else (decision or {}).get("category", c.UNKNOWN),
        "attempt_count": len(attempts),
        "attempts": [
            {k: a[k] for k in ("attempt", "job_name", "instance_type", "instance_count", "spot", "status",
                               "secondary_status", "category", "reason", "started_at", "ended_at",
                               "training_seconds", "billable_seconds", "lost_seconds")}
            for a in attempts],
        "instance_types_tried": list(dict.fromkeys(a["instance_type"] for a in attempts)),
        "interruptions": run["counts"][c.SPOT_INTERRUPTION],
        "time_lost_to_interruptions_seconds": lost_interruptions,
        "time_lost_seconds": sum(a["lost_seconds"] for a in attempts),
        "waited_seconds": run["waited_seconds"],
        "billable_seconds": sum(billable) if billable else None,
        "elapsed_seconds": int(max(now - run["started_epoch"], 0)),
        "final_metrics": metrics,
        "model_artifacts": ((job or {}).get("ModelArtifacts") or {}).get("S3ModelArtifacts") if succeeded else None,
        "checkpoint_s3_uri": run["checkpoint_s3_uri"],
    }


def describe_in_words(s: dict[str, Any]) -> tuple[str, str]:
    """(subject <= 100 characters, message) for the notification."""
    n = s["attempt_count"]
    if s["status"] == "Succeeded":
        subject = f"Training run {s['request_name']} succeeded ({n} attempt{'s' if n != 1 else ''})"
    else:
        subject = f"Training run {s['request_name']} failed: {s['category'] or 'error'}"
    if len(subject) > 100:
        subject = subject[:97] + "..."
    lines = [
        f"Run {s['run_id']} (execution {s['execution']}): {s['status']}.",
        *([f"Reason: {s['reason']}"] if s["reason"] else []),
        f"Attempts: {n}; instance types tried: {', '.join(s['instance_types_tried']) or 'none'}; "
        f"Spot interruptions: {s['interruptions']} ({s['time_lost_to_interruptions_seconds']} s lost).",
    ]
    for a in s["attempts"]:
        spot = "Spot" if a["spot"] else "on demand"
        tail = f" - {a['category']}: {a['reason']}" if a["category"] else ""
        lines.append(f"  {a['attempt']}. {a['job_name']} on {a['instance_type']} ({spot}): {a['status']}{tail}")
    if s["final_metrics"]:
        lines.append("Final metrics: " + ", ".join(f"{k}={v:g}" for k, v in sorted(s["final_metrics"].items())))
    if s["model_artifacts"]:
        lines.append(f"Model: {s['model_artifacts']}")
    lines.append(f"Checkpoints: {s['checkpoint_s3_uri']}")
    return subject, "\n".join(lines)
