"""The Lambda handlers the launcher's state machine calls: prepare, decide, summarize.

Each takes the state object and returns the next one; the platform's settings arrive as JSON in the
environment variable PLATFORM_SETTINGS. Standard library plus boto3 (the Python runtime's own, imported
only where decide needs DescribeTrainingJob), so the function's code is just the `jobs/` folder.

    prepare   {"request", "execution": {"name", "start_time"}} -> {"run", "create"}
    decide    {"run", "create", "failure": {"Error", "Cause"}}  -> {"run", "create", "decision"}
    summarize {"run", "create", "job"? | "decision"?}           -> {"succeeded", "subject", "message", "summary"}
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from typing import Any

from contract.errors import Problem, RequestInvalid
from jobs import run as runs
from jobs.classify import classify_failure
from jobs.platform import PlatformSettings
from jobs.platform_rules import validate_for_platform
from jobs.policy import Action
from jobs.policy import decide as decide_next
from jobs.render import new_run_id, render_create_training_job
from jobs.request import parse_request
from jobs.run import RunState
from jobs.summary import describe_in_words, summary

log = logging.getLogger(__name__)
log.setLevel(logging.INFO)

# Tests replace the clock; the handlers never sleep (the state machine's Wait state does).
clock = time.time


def platform_settings() -> PlatformSettings:
    text = os.environ.get("PLATFORM_SETTINGS")
    if not text:
        raise RuntimeError("PLATFORM_SETTINGS is not set: the launcher stack passes the platform's settings "
                           "to this function as JSON")
    return PlatformSettings.from_json(text)


def prepare(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Validate and render attempt 1. A bad request raises RequestInvalid: nothing is launched."""
    document = event.get("request") if isinstance(event, dict) else None
    if document is None:
        raise RequestInvalid([Problem("request", "the execution input needs a `request` object (the job request)")])
    platform = platform_settings()
    request = parse_request(document)
    validate_for_platform(request, platform)
    execution = event.get("execution") or {}
    now = clock()
    run_id = new_run_id(request.name, execution.get("name") or uuid.uuid4().hex)
    run = runs.new_run(request, run_id=run_id, execution=execution, now=now)
    create = render_create_training_job(request, platform, run_id=run_id, attempt=1)
    runs.start_attempt(run, create, attempt=1, now=now)
    log.info("run %s: attempt 1 is %s on %s", run_id, create["TrainingJobName"], run.instance_type)
    return {"run": run.to_dict(), "create": create}


def decide(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Classify the failed attempt and either render the next attempt or give up."""
    platform = platform_settings()
    run, create = RunState.from_dict(event["run"]), event["create"]
    failure_event = event.get("failure") or {}
    request = parse_request(run.request)
    job_name = create["TrainingJobName"]
    failure, job = classify_failure(failure_event, describe=lambda: describe_training_job(job_name, platform.region))
    now = clock()
    runs.finish_attempt(run, now=now, job=job, failure=failure)
    decision = decide_next(request, run, failure, now)
    log.info("run %s attempt %s: %s -> %s", run.run_id, run.attempt, failure.category, decision.reason)
    if decision.action is Action.RETRY:
        attempt = run.attempt + 1
        create = render_create_training_job(request, platform, run_id=run.run_id, attempt=attempt,
                                            instance_type=decision.instance_type, spot=decision.spot,
                                            infra_check=decision.infra_check if decision.infra_check is not None
                                            else create["InfraCheckConfig"]["EnableInfraCheck"])
        run.waited_seconds += decision.wait_seconds
        runs.start_attempt(run, create, attempt=attempt, now=now + decision.wait_seconds)
    return {"run": run.to_dict(), "create": create, "decision": decision.to_event()}


def summarize(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The execution's output and the notification's text."""
    run = RunState.from_dict(event["run"])
    job = event.get("job")
    # A retried run still carries the earlier "retry" decision when its last attempt succeeds: only a
    # "fail" decision means the run failed.
    decision = event.get("decision")
    if not (isinstance(decision, dict) and decision.get("action") == Action.FAIL):
        decision = None
    now = clock()
    if job and decision is None and run.attempts and run.current.status == "InProgress":
        job = runs.jsonable(job)
        runs.finish_attempt(run, now=now, job=job)
    outcome = summary(run, job=job, decision=decision, now=now)
    subject, message = describe_in_words(outcome)
    return {"succeeded": outcome["status"] == "Succeeded", "subject": subject, "message": message,
            "summary": outcome}


def describe_training_job(job_name: str, region: str) -> dict[str, Any] | None:
    """DescribeTrainingJob as JSON values, or None when the job does not exist (creation failed)."""
    import boto3  # the Lambda runtime provides it; imported here so the rest of jobs needs only the stdlib
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client("sagemaker", region_name=os.environ.get("AWS_REGION") or region)
    try:
        return runs.jsonable(client.describe_training_job(TrainingJobName=job_name))
    except ClientError as exc:
        log.warning("describe_training_job(%s) failed: %s", job_name, exc)
        return None
    except BotoCoreError as exc:
        log.warning("describe_training_job(%s) failed: %s", job_name, exc)
        return None


if __name__ == "__main__":  # a quick manual check: PLATFORM_SETTINGS=... python -m jobs.handler REQUEST.json
    import sys
    from pathlib import Path

    print(json.dumps(prepare({"request": json.loads(Path(sys.argv[1]).read_text())}), indent=2))
