"""How executions, attempts and outcomes are printed (status, list, the end of submit --wait)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.aws import Aws, console_url
from cli.execution_history import ExecutionView, describe_job, job_metrics
from cli.views.progress import format_metric, ordered_metrics


def succeeded(view: ExecutionView) -> bool:
    """The run succeeded: the execution did, and its summary (when it has one) does not say otherwise."""
    output = view.output if isinstance(view.output, dict) else {}
    says_failed = output.get("succeeded") is False or output.get("status") == "Failed"
    return view.status == "SUCCEEDED" and not says_failed


def failure_reason(view: ExecutionView) -> str:
    output = view.output if isinstance(view.output, dict) else {}
    if output.get("subject"):
        return str(output["subject"])
    if output.get("reason"):
        return ": ".join(str(p) for p in (output.get("category"), output["reason"]) if p)
    parts = [p for p in (view.error, _short(view.cause)) if p]
    if parts:
        return ": ".join(parts)
    if view.latest and view.latest.reason:
        return view.latest.reason
    return f"execution {view.status}"


def summary_lines(output: Any) -> list[str]:
    """The launcher's run summary (the execution's output on success), in a few lines."""
    if not isinstance(output, dict) or "attempts" not in output:
        return []
    lines = [f"attempts: {output.get('attempt_count', len(output['attempts']))}; instance types tried: "
             f"{', '.join(output.get('instance_types_tried') or []) or '-'}"]
    if output.get("interruptions"):
        lines.append(f"spot interruptions: {output['interruptions']} "
                     f"({output.get('time_lost_to_interruptions_seconds', 0)} s lost)")
    metrics = ordered_metrics(output.get("final_metrics") or {})
    if metrics:
        lines.append("final metrics: " + "  ".join(f"{n}={format_metric(v)}" for n, v in metrics))
    if output.get("model_artifacts"):
        lines.append(f"model: {output['model_artifacts']}")
    if output.get("checkpoint_s3_uri"):
        lines.append(f"checkpoints: {output['checkpoint_s3_uri']}")
    if output.get("mlflow"):
        lines.append(f"mlflow: {output['mlflow']}")
    return lines


def _short(cause: str | None, limit: int = 300) -> str | None:
    if not cause:
        return None
    try:  # a Lambda error's cause is JSON with errorMessage; show the message
        data = json.loads(cause)
        if isinstance(data, dict) and data.get("errorMessage"):
            cause = f"{data.get('errorType', 'Error')}: {data['errorMessage']}"
    except json.JSONDecodeError:
        pass
    return cause if len(cause) <= limit else cause[: limit - 3] + "..."


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if value else "-"


def _duration(view: ExecutionView) -> str:
    if not view.start:
        return "-"
    end = view.stop or datetime.now(view.start.tzinfo)
    seconds = int((end - view.start).total_seconds())
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def print_execution(console: Console, aws: Aws, view: ExecutionView) -> None:
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    head.add_row("execution", escape(view.name))
    head.add_row("request", escape(view.request_name or "-"))
    head.add_row("status", view.status)
    head.add_row("started", _when(view.start))
    head.add_row("stopped", _when(view.stop))
    head.add_row("duration", _duration(view))
    if view.status == "RUNNING":
        head.add_row("state", escape(view.current_state or "-"))
    head.add_row("console", console_url(view.arn))
    console.print(head)
    print_attempts(console, aws, view)
    if summary_lines(view.output):  # a finished run: its summary (printed below) has the final numbers
        print_outcome(console, view)
        return
    latest_job = describe_job(aws, view.latest.job_name) if view.latest else None
    metrics = ordered_metrics(job_metrics(latest_job))
    if metrics:
        console.print("[bold]latest metrics:[/] " + escape("  ".join(f"{n}={format_metric(v)}" for n, v in metrics)))
    if latest_job and latest_job.get("ModelArtifacts", {}).get("S3ModelArtifacts") and view.status == "SUCCEEDED":
        console.print(f"[bold]model:[/] {escape(latest_job['ModelArtifacts']['S3ModelArtifacts'])}")
    print_outcome(console, view)


def print_attempts(console: Console, aws: Aws, view: ExecutionView) -> None:
    if not view.attempts:
        console.print("no training job launched yet")
        return
    table = Table(title="attempts", title_justify="left")
    for column in ("#", "training job", "instance", "spot", "job status", "outcome"):
        table.add_column(column, overflow="fold")
    for attempt in view.attempts:
        job = describe_job(aws, attempt.job_name)
        status = (f"{job['TrainingJobStatus']}/{job.get('SecondaryStatus', '-')}" if job else "not created")
        outcome = " ".join(p for p in (attempt.category, attempt.action and f"-> {attempt.action}") if p)
        if attempt.reason:
            outcome = f"{outcome}: {attempt.reason}" if outcome else attempt.reason
        elif not outcome and job and job.get("FailureReason"):
            outcome = job["FailureReason"]
        elif not outcome and job and job["TrainingJobStatus"] == "Completed":
            outcome = "completed"
        table.add_row(str(attempt.number), escape(attempt.job_name), attempt.instance_type,
                      "yes" if attempt.spot else "no", status, escape(outcome or attempt.error or ""))
    console.print(table)


def print_outcome(console: Console, view: ExecutionView) -> None:
    if view.status == "RUNNING":
        return
    if view.continued_in:
        console.print(f"[bold]continued[/] {escape(view.name)}: its history neared Step Functions' limit; the run and "
                      f"its job went on in execution {escape(view.continued_in.rsplit(':', 1)[-1])} "
                      f"(`trainctl status {escape(view.continued_in)}`)")
        return
    message = view.output.get("message") if isinstance(view.output, dict) else None
    if message:
        console.print(escape(str(message)))
    for line in summary_lines(view.output):
        console.print(escape(line))
    if succeeded(view):
        console.print(f"[bold green]succeeded[/] {escape(view.name)}")
    else:
        console.print(f"[bold red]{view.status.lower()}[/] {escape(view.name)}: {escape(failure_reason(view))}")


def executions_table(items: list[dict[str, Any]]) -> Table:
    table = Table()
    for column in ("execution", "status", "started", "stopped"):
        table.add_column(column, overflow="fold")
    for item in items:
        table.add_row(escape(item["name"]), item["status"], _when(item.get("startDate")), _when(item.get("stopDate")))
    return table
