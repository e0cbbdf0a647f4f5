"""Training job logs from CloudWatch Logs: group /aws/sagemaker/TrainingJobs, one stream per host, `<job>/algo-N-...`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from cli.aws import Aws

LOG_GROUP = "/aws/sagemaker/TrainingJobs"


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
    client = aws.client("logs")
    # FilterLogEvents takes at most 100 stream names per call; a job has one stream per host.
    for i in range(0, len(streams), 100):
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNames": streams[i : i + 100],
                                  "interleaved": True}
        if start_ms is not None:
            kwargs["startTime"] = start_ms
        while True:
            page = client.filter_log_events(**kwargs)
            yield from page["events"]
            token = page.get("nextToken")
            if not token or not page["events"]:
                break
            kwargs["nextToken"] = token


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
    from cli.executions import describe, describe_job

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
                return job is None or job["TrainingJobStatus"] in {"InProgress", "Stopping"}

            count += follow_job_logs(aws, attempt.job_name, emit, is_running=running, interval=interval,
                                     sleep=sleep)
