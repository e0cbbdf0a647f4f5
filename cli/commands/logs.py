"""`trainctl logs`: training job logs from CloudWatch Logs (contract.container.LOG_GROUP, one stream per host,
`<job>/algo-N-...`), of one job or of every attempt of an execution."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import typer
from botocore.exceptions import ClientError

from cli.aws import Aws
from cli.console import out
from cli.errors import UserError
from contract.container import LOG_GROUP

# A job in one of these may still write lines.
_RUNNING = {"InProgress", "Stopping"}


def job_streams(aws: Aws, job_name: str) -> list[str]:
    """The job's log streams. The trailing `/` keeps job `x-a1` from matching `x-a10`."""
    paginator = aws.client("logs").get_paginator("describe_log_streams")
    names: list[str] = []
    try:
        for page in paginator.paginate(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job_name}/"):
            names.extend(s["logStreamName"] for s in page["logStreams"])
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return []  # no training job has logged in this region yet
        raise
    return sorted(names)


def _events(aws: Aws, streams: list[str], start_ms: int | None) -> Iterator[dict[str, Any]]:
    """Every event of these streams since `start_ms`, with its stream's name and an id for de-duplication.

    GetLogEvents, one stream at a time: an engineer's policy grants it on the streams of their own team's jobs,
    while FilterLogEvents would read the whole log group, every team's jobs included (docs/SECURITY.md). Read
    from the head, following nextForwardToken until it comes back unchanged (the API's end of a stream): a page
    may be empty while later ones are not."""
    client = aws.client("logs")
    for stream in streams:
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
        if start_ms is not None:
            kwargs["startTime"] = start_ms
        token = None
        while True:
            page = client.get_log_events(**kwargs, **({"nextToken": token} if token else {}))
            for event in page["events"]:
                # GetLogEvents gives no eventId: the stream, the times and the text identify a line.
                yield {**event, "logStreamName": stream, "eventId": f"{stream}/{event['timestamp']}/"
                       f"{event.get('ingestionTime')}/{hash(event['message'])}"}
            if page.get("nextForwardToken") in (None, token):
                break
            token = page["nextForwardToken"]


def metric_records(aws: Aws, job_name: str) -> list[dict[str, float]]:
    """The job's `[metrics]` records in the order they were logged, read from its log lines as its
    MetricDefinitions read them (contract.metrics). The lines carry the step; CloudWatch's metric series
    would carry only the time, at one-minute resolution. Only rank 0 prints them, so no host repeats one."""
    from contract.metrics import LINE_PREFIX, STEP, parse_metric_line

    events = [e for e in _events(aws, job_streams(aws, job_name), None) if LINE_PREFIX in e["message"]]
    records = (parse_metric_line(e["message"]) for e in sorted(events, key=lambda e: e["timestamp"]))
    return [values for values in records if STEP in values]


def format_event(job_name: str, event: dict[str, Any]) -> str:
    host = event["logStreamName"].removeprefix(f"{job_name}/")
    stamp = datetime.fromtimestamp(event["timestamp"] / 1000, UTC).strftime("%H:%M:%S")
    return f"{stamp} {host} {event['message'].rstrip()}"


def print_job_logs(aws: Aws, job_name: str, emit: Callable[[str], None]) -> int:
    """Print every line the job has logged so far; returns how many."""
    count = 0
    for event in sorted(_events(aws, job_streams(aws, job_name), None), key=lambda e: e["timestamp"]):
        emit(format_event(job_name, event))
        count += 1
    return count


def follow_job_logs(aws: Aws, job_name: str, emit: Callable[[str], None], *, is_running: Callable[[], bool],
                    interval: float, sleep: Callable[[float], None] = time.sleep) -> int:
    """Print the job's lines as they arrive until the job stops running (then drain once more)."""
    seen: set[str] = set()
    since: int | None = None
    count = 0
    while True:
        running = is_running()  # read before fetching, so lines written before the job ended are not lost
        fresh = [e for e in _events(aws, job_streams(aws, job_name), since) if e["eventId"] not in seen]
        for event in sorted(fresh, key=lambda e: e["timestamp"]):
            emit(format_event(job_name, event))
            seen.add(event["eventId"])
            since = max(since or 0, event["timestamp"])
            count += 1
        if not running:
            return count
        sleep(interval)


def follow_execution_logs(aws: Aws, arn: str, emit: Callable[[str], None], *, interval: float,
                          sleep: Callable[[float], None] = time.sleep) -> int:
    """Follow an execution's training jobs one after another (a retry starts a new job) until it ends."""
    from cli.execution_history import describe, describe_job

    followed: set[str] = set()
    count = 0
    while True:
        view = describe(aws, arn)
        pending = [a for a in view.attempts if a.job_name not in followed]
        if not pending:
            if view.status != "RUNNING":
                return count
            sleep(interval)  # in Prepare, or waiting out a backoff before the next attempt
            continue
        for attempt in pending:  # in order: a finished attempt drains at once, the running one is followed
            followed.add(attempt.job_name)
            emit(f"== attempt {attempt.number}: {attempt.job_name} ({attempt.instance_type}) ==")

            def running(name: str = attempt.job_name) -> bool:
                job = describe_job(aws, name)
                # Not created yet counts as running: the .sync task creates it right after scheduling it.
                return job is None or job["TrainingJobStatus"] in _RUNNING

            count += follow_job_logs(aws, attempt.job_name, emit, is_running=running, interval=interval,
                                     sleep=sleep)


def show_logs(aws: Aws, target: str, *, follow: bool, attempt: int | None, interval: float,
              state_machine: str | None) -> None:
    """A training job's lines, or an execution's (every attempt, or one); with `follow`, until it ends."""
    from cli.execution_history import describe_job

    # A training job name first: it needs no SSM look-up. Otherwise it names an execution.
    if not target.startswith("arn:") and describe_job(aws, target) is not None:
        _show_job_logs(aws, target, follow=follow, interval=interval)
        return
    arn = aws.execution_arn(target, state_machine)
    if follow and attempt is None:
        follow_execution_logs(aws, arn, typer.echo, interval=interval)
        return
    _show_attempt_logs(aws, arn, target, follow=follow, attempt=attempt, interval=interval)


def _show_job_logs(aws: Aws, job_name: str, *, follow: bool, interval: float) -> None:
    from cli.execution_history import describe_job

    if follow:
        def running() -> bool:
            return describe_job(aws, job_name)["TrainingJobStatus"] in _RUNNING

        follow_job_logs(aws, job_name, typer.echo, is_running=running, interval=interval)
    elif print_job_logs(aws, job_name, typer.echo) == 0:
        out().print(f"[dim]no log lines for {job_name} yet[/]")


def _show_attempt_logs(aws: Aws, arn: str, target: str, *, follow: bool, attempt: int | None,
                       interval: float) -> None:
    """The execution's attempts (or the one asked for), one after another."""
    from cli.execution_history import describe, describe_job

    try:
        view = describe(aws, arn)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ExecutionDoesNotExist":
            raise
        raise UserError(f"no training job and no execution named {target}",
                        "`trainctl list` shows the executions; job names are in `trainctl status`") from None
    if not view.attempts:
        raise UserError(f"execution {view.name} has launched no training job yet",
                        "use --follow to wait for it")
    if attempt is not None and attempt > len(view.attempts):
        raise UserError(f"execution {view.name} has {len(view.attempts)} attempt(s), not {attempt}")
    chosen = [view.attempts[attempt - 1]] if attempt is not None else view.attempts
    for one in chosen:
        out().print(f"[bold]== attempt {one.number}: {one.job_name} ({one.instance_type}) ==[/]")
        if follow:
            def running(name: str = one.job_name) -> bool:
                job = describe_job(aws, name)
                return job is None or job["TrainingJobStatus"] in _RUNNING

            follow_job_logs(aws, one.job_name, typer.echo, is_running=running, interval=interval)
        elif print_job_logs(aws, one.job_name, typer.echo) == 0:
            out().print(f"[dim]no log lines for {one.job_name} yet[/]")
