"""What a run ends with: the execution's output (a summary of every attempt) and the notification's words."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from contract.hyperparameters import INPUT_BOUND_SHARE, canonical_hyperparameters, decode_hyperparameters
from contract.metrics import DATA_WAIT_MS, DATA_WAIT_SHARE
from jobs.outcome.run_record import run_record
from jobs.planning.measured import measured_section
from jobs.render.training_job import tensorboard_command
from jobs.retry.classify import Category
from jobs.retry.resume import resume_command
from jobs.retry.run_state import RunState
from jobs.timestamps import duration


def summary(run: RunState, *, job: dict[str, Any] | None, decision: dict[str, Any] | None,
            now: float, stopped_jobs: list[str] = (), jobs_left_running: list[str] = (),
            prices: dict[str, float] | None = None) -> dict[str, Any]:
    """What the execution outputs and the notification says. `decision` is a "fail" decision's event, if any;
    `stopped_jobs` the run's jobs the launcher stopped as the run ended, `jobs_left_running` those it could
    not stop ("name (why)"); `prices` USD per instance-hour by type, for the record's cost."""
    attempts = run.attempts
    succeeded = decision is None and bool(job) and job.get("TrainingJobStatus") == "Completed"
    metrics = {m["MetricName"]: m["Value"] for m in (job or {}).get("FinalMetricDataList") or []}
    lost_interruptions = sum(a.lost_seconds for a in attempts if a.category == Category.SPOT_INTERRUPTION)
    billable = [a.billable_seconds for a in attempts if a.billable_seconds is not None]
    return {
        "run_id": run.run_id,
        "request_name": run.name,
        "execution": run.execution.name,
        "status": "Succeeded" if succeeded else "Failed",
        "reason": "" if succeeded else (decision or {}).get("reason", "the run did not complete"),
        "category": "" if succeeded else (decision or {}).get("category", Category.UNKNOWN.value),
        "attempt_count": len(attempts),
        "attempts": [asdict(a) for a in attempts],
        "instance_types_tried": list(dict.fromkeys(a.instance_type for a in attempts)),
        "interruptions": run.counts.spot_interruption,
        "time_lost_to_interruptions_seconds": lost_interruptions,
        "time_lost_seconds": sum(a.lost_seconds for a in attempts),
        "waited_seconds": run.waited_seconds,
        "billable_seconds": sum(billable) if billable else None,
        "elapsed_seconds": int(max(now - run.started_epoch, 0)),
        "final_metrics": metrics,
        "input_bound": input_bound(metrics, job),
        "model_artifacts": ((job or {}).get("ModelArtifacts") or {}).get("S3ModelArtifacts") if succeeded else None,
        "checkpoint_s3_uri": run.checkpoint_s3_uri,
        "tensorboard_s3_uri": run.tensorboard_s3_uri,
        "mlflow": run.mlflow_run or None,
        "stopped_jobs": list(stopped_jobs),
        "jobs_left_running": list(jobs_left_running),
        # This execution's attempts only: a resumed run's earlier ones are in their executions (trainctl show).
        # + what its last job measured against the planner's figure for that layout (trainctl plan reads it).
        "record": run_record(attempts, started=run.started_epoch, ended=now, prices=prices)
        | {"measured": measured_section(job, run.run_id)},
        "resumed_after": run.resumed_after,
    }


def input_bound(metrics: dict[str, float], job: dict[str, Any] | None) -> dict[str, float] | None:
    """The last job's wait for data when it was over its input_bound_share (the training package's mean over the
    attempt, on its last metrics line), else None: the run's GPUs waited on its input pipeline."""
    share, wait_ms = metrics.get(DATA_WAIT_SHARE), metrics.get(DATA_WAIT_MS)
    # The job's hyperparameters as the request wrote them: `input-bound-share` is the same key.
    given = canonical_hyperparameters(decode_hyperparameters((job or {}).get("HyperParameters") or {}))
    threshold = float(given.get("input_bound_share", INPUT_BOUND_SHARE))
    if share is None or share <= threshold:
        return None
    return {DATA_WAIT_SHARE: share, DATA_WAIT_MS: wait_ms, "input_bound_share": threshold}


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
    if s.get("stopped_jobs"):
        lines.append(f"Stopped as the run ended (still running): {', '.join(s['stopped_jobs'])}.")
    if s.get("jobs_left_running"):
        lines.append(f"Could not stop, stop by hand (aws sagemaker stop-training-job --training-job-name NAME): "
                     f"{', '.join(s['jobs_left_running'])}.")
    lines += record_in_words(s["record"], resumed=bool(s.get("resumed_after")))
    if s["status"] != "Succeeded" and resume_command(s["run_id"]) not in s["reason"]:
        lines.append(f"To continue from its newest checkpoint: {resume_command(s['run_id'])}")
    if bound := s.get("input_bound"):
        per_step = f"{bound[DATA_WAIT_MS]:g} ms a step; " if bound[DATA_WAIT_MS] is not None else ""
        lines.append(f"Input bound: the steps waited {bound[DATA_WAIT_SHARE]:.0%} of their time for data "
                     f"({per_step}input_bound_share {bound['input_bound_share']:g}): raise hyperparameters.data_workers, "
                     "use an instance with more CPUs per GPU, or store the data pre-decoded.")
    if s["final_metrics"]:
        lines.append("Final metrics: " + ", ".join(f"{k}={v:g}" for k, v in sorted(s["final_metrics"].items())))
    if s["model_artifacts"]:
        lines.append(f"Model: {s['model_artifacts']}")
    lines.append(f"Checkpoints: {s['checkpoint_s3_uri']}")
    if s.get("tensorboard_s3_uri"):
        lines.append(f"TensorBoard: {s['tensorboard_s3_uri']} ({tensorboard_command(s['tensorboard_s3_uri'], s['run_id'])})")
    if s.get("mlflow"):
        lines.append(f"MLflow: {s['mlflow']}")
    return subject, "\n".join(lines)


def money(usd: float | None) -> str:
    return "unknown" if usd is None else f"${usd:,.2f}"


def record_in_words(record: dict[str, Any], *, resumed: bool = False) -> list[str]:
    """The record's lines in the notification (trainctl show prints the same figures as a table)."""
    scope = " (this execution; `trainctl show RUN` for the whole run)" if resumed else ""
    split = record["instance_seconds"]
    held = record["held_instance_seconds"]
    share = ", ".join(f"{name} {split[name] / held:.0%}" for name in split if split[name]) if held else "none"
    goodput = "unknown" if record["goodput"] is None else f"{record['goodput']:.0%}"
    if record["unmeasured_attempts"]:
        goodput += f" (at least: attempts {record['unmeasured_attempts']} did not measure their time)"
    cost = record["cost"]
    unpriced = f" (no price for {', '.join(cost['unpriced'])})" if cost["unpriced"] else ""
    return [
        f"Record{scope}: wall time {duration(record['wall_seconds'])}, step {record['step'] or 0}, "
        f"queued {duration(record['queued_seconds'])}, between attempts {duration(record['between_attempts_seconds'])}.",
        f"Goodput {goodput} of {held / 3600:.2f} instance-hours held: {share}.",
        f"Cost {money(cost['total_usd'])}: on demand {money(cost['on_demand_usd'])}, Spot {money(cost['spot_usd'])} "
        f"(saved {money(cost['spot_savings_usd'])}){unpriced}.",
    ]
