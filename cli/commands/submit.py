"""`trainctl submit` and `resume`: validate a request here, then start the launcher state machine with it."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

from rich.markup import escape

from cli.aws import Aws, console_url
from cli.console import out
from cli.errors import UserError, stderr
from cli.request_file import (
    LoadedRequest,
    load_request,
    parse_loaded,
    read_json_object,
    validate_for_platform,
)
from jobs.naming import EXECUTION_CHARACTERS, EXECUTION_NAME, EXECUTION_NAME_MAX

_NAME_UNSAFE = re.compile(rf"[^{EXECUTION_CHARACTERS}]+")


def default_execution_name(request_name: str, now: datetime | None = None) -> str:
    """`<request name>-<UTC time>`, an execution name (jobs.naming.EXECUTION_NAME)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = _NAME_UNSAFE.sub("-", request_name).strip("-")[: EXECUTION_NAME_MAX - len(stamp) - 1] or "job"
    return f"{base}-{stamp}"


def submit_request(request: Path, aws: Aws, *, name: str | None, platform: Path | None,
                   state_machine: str | None, wait: bool, interval: float) -> int:
    """Start an execution; with `wait`, follow it to its end. Returns the exit status (1: the run failed)."""
    return start_execution(load_request(request), aws, name=name, platform=platform, state_machine=state_machine,
                           wait=wait, interval=interval)


def resume_request(run_id: str, request: Path | None, aws: Aws, *, name: str | None, platform: Path | None,
                   state_machine: str | None, wait: bool, interval: float, limit: int) -> int:
    """Start an execution that continues run `run_id` with `request` (default: the request its last execution
    was sent) and `resume_run` set: same run id and checkpoints, attempts numbered on. A run whose execution
    still runs (training, or waiting between attempts) is refused here; the launcher's Prepare checks the rest
    (no job of the run active, not completed, same model). With a request, a run whose executions are not
    found (Step Functions keeps an execution's history 90 days; its checkpoints stay) is left to Prepare."""
    from cli.commands.runs import find_run, search_run
    from jobs.request.field_rules import check_run_id
    from jobs.retry.resume import FIELD

    if problem := check_run_id(run_id):
        raise UserError(f"RUN: {problem}")
    machine = aws.state_machine_arn(state_machine)
    view = find_run(aws, machine, run_id, limit) if request is None else search_run(aws, machine, run_id, limit)
    active = [e.name for e in view.executions if e.status == "RUNNING"] if view else []
    if active:
        raise UserError(f"run {run_id} is still active: execution {active[-1]} is RUNNING",
                        f"wait for it to end, or `trainctl stop {active[-1]}`, then resume")
    if view is not None and view.status == "completed":  # what Prepare would refuse, refused where it was asked
        raise UserError(f"run {run_id} completed (execution {view.executions[-1].name}): there is nothing to resume",
                        f"start a new run with `trainctl submit REQUEST` (hyperparameters.init_from_run {run_id} "
                        "starts it from this run's weights)")
    if request is None:
        document, where = view.executions[-1].request, Path(f"<the request of {view.executions[-1].name}>")
        if document is None:
            raise UserError(f"the last execution of run {run_id} has no readable request",
                            f"give the request file: trainctl resume {run_id} REQUEST.json")
    else:
        document, where = read_json_object(request, "job request"), request
    earlier = document.get(FIELD)
    if request is not None and earlier not in (None, run_id):
        raise UserError(f"{request} sets {FIELD} {earlier!r}, not {run_id!r}",
                        f"remove {FIELD} from the file (trainctl resume sets it), or resume that run")
    loaded = parse_loaded(where, {**document, FIELD: run_id})
    _same_model(loaded, view, run_id)
    return start_execution(loaded, aws, name=name, platform=platform, state_machine=state_machine, wait=wait,
                           interval=interval)


def _same_model(loaded: LoadedRequest, view, run_id: str) -> None:
    """A run continues only with its own model (its checkpoints are that model's): refused here, as Prepare would."""
    import dataclasses

    from jobs.request.schema import JobRequest

    earlier = view.executions[-1].request if view is not None and view.executions else None
    if not isinstance(earlier, dict):
        return
    # A field the earlier request left out had the request's default (read from the schema, not restated).
    defaults = {f.name: f.default for f in dataclasses.fields(JobRequest) if f.name in ("model", "model_size")}
    then = tuple(earlier.get(name, defaults[name]) for name in ("model", "model_size"))
    now = (loaded.request.model, loaded.request.model_size)
    if then != now:
        raise UserError(f"{loaded.path} trains {now[0]} {now[1]}, but run {run_id} trained {then[0]} {then[1]}: its "
                        "checkpoints are that model's",
                        f"resume with model {then[0]} and model_size {then[1]}, or start a new run from its weights "
                        f"(hyperparameters.init_from_run {run_id})")


def start_execution(loaded: LoadedRequest, aws: Aws, *, name: str | None, platform: Path | None,
                    state_machine: str | None, wait: bool, interval: float) -> int:
    """Check the request against the platform, then start the launcher with it as the input."""
    from botocore.exceptions import ClientError

    from cli.platform_source import load_platform

    execution_name = name or default_execution_name(loaded.request.name)
    if not EXECUTION_NAME.fullmatch(execution_name):
        raise UserError(f"--name {execution_name!r} is not a valid execution name",
                        f"use 1-{EXECUTION_NAME_MAX} letters, digits, '-' and '_'")
    settings = load_platform(platform, aws)
    validate_for_platform(loaded, settings)
    if platform is not None:  # the file says where the platform is deployed: start the execution there
        note = aws.use_platform_region(settings.region, str(platform))
        if note:
            stderr.print(f"[yellow]note:[/] {escape(note)}")
    machine = aws.state_machine_arn(state_machine)
    try:
        started = aws.client("stepfunctions").start_execution(
            stateMachineArn=machine, name=execution_name, input=json.dumps(loaded.document))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ExecutionAlreadyExists":
            raise UserError(f"an execution named {execution_name} already exists",
                            "choose another --name") from None
        raise
    arn = started["executionArn"]
    ended = prepare_verdict(aws, arn)
    if ended is not None:
        error, cause = ended
        if error == "RequestInvalid":
            raise UserError(f"the launcher refused {execution_name}: {cause}",
                            "fix what it names and submit again (nothing was launched)")
        raise UserError(f"{execution_name} failed as it started ({error}): {cause}",
                        f"`trainctl status {execution_name}` shows it; nothing was launched")
    out().print(f"started [bold]{execution_name}[/]")
    out().print(f"execution: {arn}")
    out().print(f"console:   {console_url(arn)}")
    return follow_to_the_end(aws, arn, interval) if wait else 0


# How long `submit` and `resume` wait for the launcher's Prepare to take or refuse the request (it answers in seconds)
# before saying "started", and how often they look.
VERDICT_SECONDS = 60
VERDICT_POLL_SECONDS = 0.5


def prepare_verdict(aws: Aws, arn: str, timeout: float = VERDICT_SECONDS) -> tuple[str, str] | None:
    """(error, cause) of an execution that failed before it got past Prepare: its refusal (RequestInvalid, one
    "field: problem" line each) or Prepare's own fault; None once it went past Prepare (or succeeded, or the wait
    ran out: its status then tells)."""
    import time

    from jobs.outcome.ends import taken_by

    sfn = aws.client("stepfunctions")
    deadline = time.monotonic() + timeout
    while True:
        described = sfn.describe_execution(executionArn=arn)
        events = sfn.get_execution_history(executionArn=arn, maxResults=100)["events"]
        taken = any(taken_by((e.get("stateEnteredEventDetails") or {}).get("name", "")) for e in events)
        if described["status"] != "RUNNING":
            if described["status"] != "FAILED" or taken:
                return None
            return described.get("error") or "failed", described.get("cause") or "no cause given"
        if taken or time.monotonic() >= deadline:
            return None
        time.sleep(VERDICT_POLL_SECONDS)


def follow_to_the_end(aws: Aws, arn: str, interval: float) -> int:
    """Show the execution's progress until it ends, then its outcome; 0 when the run succeeded, else 1."""
    from cli.views.executions import print_outcome, succeeded
    from cli.views.progress import follow

    console = out()
    view = follow(aws, arn, console=console, interval=interval)
    print_outcome(console, view)
    return 0 if succeeded(view) else 1
