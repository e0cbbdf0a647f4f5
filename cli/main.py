"""`trainctl`: plan, render, submit and watch training jobs on the platform, or run them on this machine.

    trainctl plan examples/fsdp-gpt-1b.json --platform examples/platform-settings.json  # no AWS call
    trainctl render examples/fsdp-gpt-1b.json --attempt 2 | jq .ResourceConfig          # settings from SSM
    trainctl submit examples/fsdp-gpt-1b.json --wait        # start the launcher state machine, follow it
    trainctl status|list|stop|logs ...
    trainctl local examples/local-fsdp.json --nproc 2       # the same request, on this machine

Every problem a user can cause exits with status 2 and one message naming what to fix.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cli.aws import DEFAULT_PREFIX, Aws, console_url
from cli.errors import UserError, user_errors
from cli.request_file import load_request, validate_for_platform

app = typer.Typer(
    name="trainctl",
    help="Plan, render, submit and watch distributed training jobs on the SageMaker training platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)


def out() -> Console:
    """stdout for people. Made per call so that it sizes itself to the terminal (or COLUMNS) of this run."""
    return Console(soft_wrap=True, highlight=False)


# ---- options shared by the commands ------------------------------------------------------------------

RequestArg = Annotated[Path, typer.Argument(metavar="REQUEST.json", help="The job request (JSON).",
                                            show_default=False)]
PlatformOpt = Annotated[Path | None, typer.Option(
    "--platform", metavar="FILE",
    help="Platform settings JSON (as the stack publishes it). Without it, read from the deployed stack "
         "(SSM /<prefix>/platform-settings).")]
PrefixOpt = Annotated[str, typer.Option(
    "--prefix", envvar="TRAINCTL_PREFIX", help="The platform's name prefix (its SSM parameters live under it).")]
RegionOpt = Annotated[str | None, typer.Option(
    "--region", help="AWS region of the platform (default: AWS_REGION / your AWS config).")]
StateMachineOpt = Annotated[str | None, typer.Option(
    "--state-machine", metavar="ARN", help="State machine ARN (default: SSM /<prefix>/state-machine-arn).")]
ExecutionArg = Annotated[str, typer.Argument(
    metavar="EXECUTION", help="Execution name or ARN (names belong to the platform's state machine).")]
IntervalOpt = Annotated[float, typer.Option("--interval", min=0.0, help="Seconds between polls.")]


class ExecutionStatus(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    ABORTED = "ABORTED"
    PENDING_REDRIVE = "PENDING_REDRIVE"


def _render(loaded, platform, *, attempt: int, run_id: str | None, instance_type: str | None,
            on_demand: bool) -> dict:
    from contract.errors import RequestInvalid
    from jobs.render import new_run_id, render_create_training_job

    if instance_type is not None:
        _check_override(loaded.request, platform, instance_type)
    run_id = run_id or new_run_id(loaded.request.name, "trainctl-render")
    try:
        return render_create_training_job(loaded.request, platform, run_id=run_id, attempt=attempt,
                                          instance_type=instance_type, spot=False if on_demand else None)
    except RequestInvalid as exc:
        raise UserError(f"cannot render {loaded.path}:\n  " + str(exc).replace("\n", "\n  ")) from None
    except ValueError as exc:  # a --run-id that cannot make a SageMaker job name
        raise UserError(str(exc), "use letters, digits and dashes in --run-id, e.g. my-run-0123abcd") from None


def _check_override(request, platform, instance_type: str) -> None:
    """--instance-type gets the checks the request's own types get (catalog, platform's allowed list)."""
    import difflib

    from jobs.catalog import instance_types, lookup

    if request.instance_groups:
        raise UserError("--instance-type does not apply to a request with instance_groups")
    if lookup(instance_type) is None:
        close = difflib.get_close_matches(instance_type, instance_types(), n=1, cutoff=0.6)
        raise UserError(f"--instance-type: unknown instance type {instance_type!r}"
                        + (f"; did you mean {close[0]!r}?" if close else ""))
    allowed = platform.allowed_instance_types
    if allowed and instance_type not in allowed:
        raise UserError(f"--instance-type: {instance_type} is not allowed on this platform",
                        f"allowed: {', '.join(sorted(allowed))}")


# ---- offline: plan and render ------------------------------------------------------------------------


@app.command()
@user_errors
def plan(request: RequestArg, platform: PlatformOpt = None, prefix: PrefixOpt = DEFAULT_PREFIX,
         region: RegionOpt = None) -> None:
    """Validate a request and show what would run: instances, world size, parallelism, image, Spot, retries.

    No AWS call when --platform is given.
    """
    from cli.plan_view import plan_run_id, print_plan
    from cli.platform_source import load_platform

    loaded = load_request(request)
    settings = load_platform(platform, Aws(region=region, prefix=prefix))
    validate_for_platform(loaded, settings)
    create = _render(loaded, settings, attempt=1, run_id=plan_run_id(loaded.request.name), instance_type=None,
                     on_demand=False)
    print_plan(out(), loaded.request, settings, create)


@app.command()
@user_errors
def render(
    request: RequestArg,
    attempt: Annotated[int, typer.Option("--attempt", min=1, help="Attempt number (1 = first launch).")] = 1,
    platform: PlatformOpt = None,
    instance_type: Annotated[str | None, typer.Option(
        "--instance-type", metavar="TYPE", help="Render for this instance type (e.g. a fallback).")] = None,
    on_demand: Annotated[bool, typer.Option("--on-demand", help="Render without Spot.")] = False,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Run id: it names the job and the checkpoint prefix. Default: <request name>-<hash>, "
                         "the same on every call.")] = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Print the exact CreateTrainingJob request as JSON.

    Pipe it to jq, or to `aws sagemaker create-training-job --cli-input-json file:///dev/stdin`.
    """
    from cli.platform_source import load_platform

    loaded = load_request(request)
    settings = load_platform(platform, Aws(region=region, prefix=prefix))
    validate_for_platform(loaded, settings)
    create = _render(loaded, settings, attempt=attempt, run_id=run_id, instance_type=instance_type,
                     on_demand=on_demand)
    # Plain print, not rich: the output is a document for other programs.
    typer.echo(json.dumps(create, indent=2))


# ---- the deployed platform ---------------------------------------------------------------------------

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
# Step Functions allows more (no whitespace or URL-reserved characters); this subset is safe in URLs,
# CloudWatch and shells, and it is what the launcher's run ids are built from.
_EXECUTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")


def default_execution_name(request_name: str, now: datetime | None = None) -> str:
    """`<request name>-<UTC time>`, within Step Functions' 80 characters of [A-Za-z0-9_-]."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    base = _NAME_UNSAFE.sub("-", request_name).strip("-")[: 80 - len(stamp) - 1] or "job"
    return f"{base}-{stamp}"


@app.command()
@user_errors
def submit(
    request: RequestArg,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the execution until it ends; exit 1 if it fails.")]
    = False,
    name: Annotated[str | None, typer.Option(
        "--name", metavar="EXECUTION_NAME", help="Execution name (default: <request name>-<UTC time>).")] = None,
    platform: PlatformOpt = None,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
    interval: IntervalOpt = 10.0,
) -> None:
    """Validate a request, then start the launcher state machine with it.

    The request is checked here first (nothing reaches AWS when it is invalid), then against the platform's
    settings (allowed instance types, training plans, FSx).
    """
    from botocore.exceptions import ClientError

    from cli.platform_source import load_platform

    loaded = load_request(request)
    execution_name = name or default_execution_name(loaded.request.name)
    if not _EXECUTION_NAME.fullmatch(execution_name):
        raise UserError(f"--name {execution_name!r} is not a valid execution name",
                        "use 1-80 letters, digits, '-' and '_'")
    aws = Aws(region=region, prefix=prefix)
    validate_for_platform(loaded, load_platform(platform, aws))
    machine = aws.state_machine_arn(state_machine)
    try:
        started = aws.client("stepfunctions").start_execution(
            stateMachineArn=machine, name=execution_name, input=json.dumps(loaded.document))
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code == "ExecutionAlreadyExists":
            raise UserError(f"an execution named {execution_name} already exists",
                            "choose another --name") from None
        raise
    arn = started["executionArn"]
    out().print(f"started [bold]{execution_name}[/]")
    out().print(f"execution: {arn}")
    out().print(f"console:   {console_url(arn)}")
    if not wait:
        return
    from cli.progress import watch
    from cli.views import print_outcome, succeeded

    console = out()
    view = watch(aws, arn, console=console, interval=interval)
    print_outcome(console, view)
    raise typer.Exit(0 if succeeded(view) else 1)


@app.command()
@user_errors
def status(
    execution: ExecutionArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print the execution as JSON.")] = False,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Show an execution: status, attempts (job, instance, Spot, outcome), latest metrics, result."""
    from dataclasses import asdict

    from cli.executions import describe
    from cli.views import print_execution

    aws = Aws(region=region, prefix=prefix)
    view = describe(aws, aws.execution_arn(execution, state_machine))
    if as_json:
        typer.echo(json.dumps(asdict(view), indent=2, default=str))
    else:
        print_execution(out(), aws, view)


@app.command("list")
@user_errors
def list_(
    status: Annotated[list[ExecutionStatus] | None, typer.Option(
        "--status", help="Only executions with this status (repeat for several).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many, newest first.")] = 20,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """List the launcher's executions, newest first."""
    from cli.views import executions_table

    aws = Aws(region=region, prefix=prefix)
    machine = aws.state_machine_arn(state_machine)
    paginator = aws.client("stepfunctions").get_paginator("list_executions")
    items: list[dict] = []
    for wanted in status or [None]:
        kwargs = {"stateMachineArn": machine, "PaginationConfig": {"MaxItems": limit}}
        if wanted is not None:
            kwargs["statusFilter"] = wanted.value
        for page in paginator.paginate(**kwargs):
            items.extend(page["executions"])
    items.sort(key=lambda item: item["startDate"], reverse=True)
    if not items:
        out().print("no executions")
        return
    out().print(executions_table(items[:limit]))


@app.command()
@user_errors
def stop(
    execution: ExecutionArg,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Stop an execution and its current training job (the job gets SIGTERM and checkpoints)."""
    from cli.executions import describe, describe_job

    aws = Aws(region=region, prefix=prefix)
    view = describe(aws, aws.execution_arn(execution, state_machine))
    if view.status != "RUNNING":
        out().print(f"{view.name} is not running ({view.status}); nothing to stop")
        return
    # Stop the job ourselves: Step Functions stops a .sync job when its execution is stopped, but only as
    # a best effort; an explicit StopTrainingJob makes sure the instances are released.
    latest = view.latest
    job = describe_job(aws, latest.job_name) if latest else None
    if job and job["TrainingJobStatus"] == "InProgress":
        aws.client("sagemaker").stop_training_job(TrainingJobName=latest.job_name)
        out().print(f"stopping training job {latest.job_name}")
    aws.client("stepfunctions").stop_execution(
        executionArn=view.arn, error="StoppedByUser", cause="stopped with trainctl stop")
    out().print(f"stopped execution {view.name}")


@app.command()
@user_errors
def logs(
    target: Annotated[str, typer.Argument(
        metavar="EXECUTION|JOB_NAME", help="An execution (name or ARN) or a training job name.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")]
    = False,
    attempt: Annotated[int | None, typer.Option(
        "--attempt", min=1, help="For an execution: only this attempt (default: every attempt; with -f, each "
                                 "new attempt as the execution starts it).")]
    = None,
    interval: IntervalOpt = 5.0,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Print a training job's CloudWatch logs (/aws/sagemaker/TrainingJobs), or every attempt's of an execution."""
    from botocore.exceptions import ClientError

    from cli.executions import describe, describe_job
    from cli.logs import follow_execution_logs, follow_job_logs, print_job_logs

    aws = Aws(region=region, prefix=prefix)
    # A training job name first: it needs no SSM look-up. Otherwise it names an execution.
    job = describe_job(aws, target) if not target.startswith("arn:") else None
    if job is not None:
        if follow:
            def running() -> bool:
                return describe_job(aws, target)["TrainingJobStatus"] in {"InProgress", "Stopping"}

            follow_job_logs(aws, target, typer.echo, is_running=running, interval=interval)
        elif print_job_logs(aws, target, typer.echo) == 0:
            out().print(f"[dim]no log lines for {target} yet[/]")
        return
    arn = aws.execution_arn(target, state_machine)
    if follow and attempt is None:
        follow_execution_logs(aws, arn, typer.echo, interval=interval)
        return
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
                return job is None or job["TrainingJobStatus"] in {"InProgress", "Stopping"}

            follow_job_logs(aws, one.job_name, typer.echo, is_running=running, interval=interval)
        elif print_job_logs(aws, one.job_name, typer.echo) == 0:
            out().print(f"[dim]no log lines for {one.job_name} yet[/]")


# ---- this machine --------------------------------------------------------------------------------------


@app.command()
@user_errors
def local(
    request: RequestArg,
    nproc: Annotated[int | None, typer.Option("--nproc", min=1, help="Processes (default: GPUs, or 1).")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="Where the job's /opt/ml-like folders go; run again on it to resume. "
                          "Default: .trainctl/local/<request name>.")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", metavar="DIR", help="Dataset folder: DIR/train and DIR/validation when present, else DIR as "
                                      "the train channel.")] = None,
) -> None:
    """Run a request on this machine, as SageMaker would run it (torchrun; gloo on CPU)."""
    from cli.local_runner import DEFAULT_WORKDIR_ROOT, run_request_locally

    loaded = load_request(request)
    workdir = workdir or DEFAULT_WORKDIR_ROOT / loaded.request.name
    started = time.time()
    code = run_request_locally(loaded, workdir=workdir, nproc=nproc, data=data)
    out().print(local_outcome(code, workdir, since=started))
    raise typer.Exit(code)


def local_outcome(code: int, workdir: Path, *, since: float) -> str:
    """One line on how a local run ended, from the status file the training loop writes (this run's only)."""
    status: dict = {}
    path = workdir / "output" / "data" / "training_status.json"
    with contextlib.suppress(OSError, json.JSONDecodeError):
        if path.stat().st_mtime >= since:
            status = json.loads(path.read_text())
    if code != 0:
        return f"[red]the run exited with status {code}[/]; worker logs: {workdir / 'output' / 'logs'}"
    if status.get("status") == "stopped":
        return (f"stopped at step {status.get('step')} with a checkpoint in {workdir / 'checkpoints'}; "
                f"run again with --workdir {workdir} to resume")
    return (f"done at step {status.get('step', '?')}: model in {workdir / 'model'}, metrics in "
            f"{workdir / 'output' / 'data'}")


if __name__ == "__main__":
    app()
