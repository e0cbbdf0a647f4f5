"""`trainctl`: plan, render, submit and watch training jobs on the platform, or run them on this machine.

    trainctl plan examples/fsdp-gpt-1b.json --platform examples/platform-settings.json  # no AWS call
    trainctl render examples/fsdp-gpt-1b.json --attempt 2 | jq .ResourceConfig          # settings from SSM
    trainctl submit examples/fsdp-gpt-1b.json --wait        # start the launcher state machine, follow it
    trainctl resume RUN [examples/fsdp-gpt-1b.json]         # continue a run that ended, on its checkpoints
    trainctl runs · trainctl show RUN [--chart run.png]     # runs, their goodput and cost
    trainctl status|list|stop|logs ...
    trainctl local examples/local-fsdp.json --nproc 2       # the same request, on this machine
    trainctl schema > job-request.schema.json               # the request's JSON Schema, for editors
    trainctl --version

Every problem a user can cause exits with status 2 and one message naming what to fix.
This module only wires the commands: each one's work is a function in the module named for it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from cli.aws import DEFAULT_PREFIX, Aws
from cli.commands import json_schema as schema
from cli.commands import local as local_runner
from cli.commands import logs, render, runs, status, stop, submit, version
from cli.errors import user_errors
from cli.options import (
    DEPLOYED,
    LOCAL,
    OFFLINE,
    ChartOpt,
    ExecutionArg,
    ExecutionNameOpt,
    ExecutionStatus,
    IntervalOpt,
    PlatformOpt,
    PrefixOpt,
    PricesOpt,
    RegionOpt,
    RequestArg,
    RunsLimitOpt,
    StateMachineOpt,
    WaitOpt,
    flag,
)
from contract.container import LOG_GROUP

app = typer.Typer(
    name="trainctl",
    help="Plan, render, submit and watch distributed training jobs on the SageMaker training platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"trainctl {version.package_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, metavar="",
        help="Print trainctl's version and exit.")] = False,
) -> None:
    # The options that come before the command; each command's own are on it.
    pass


@app.command("version", hidden=True)
def version_command() -> None:
    """Print trainctl's version (`trainctl --version` is the documented form; this spelling works too)."""
    typer.echo(f"trainctl {version.package_version()}")


# ---- offline: plan, render, schema ---------------------------------------------------------------------


@app.command("plan", rich_help_panel=OFFLINE)
@user_errors
def plan_command(
    request: RequestArg, platform: PlatformOpt = None, prefix: PrefixOpt = DEFAULT_PREFIX, region: RegionOpt = None,
    as_json: Annotated[bool, flag(
        "--json", help="Print the sizing as JSON: recommendation, candidates, warnings.")] = False,
    chart: Annotated[Path | None, typer.Option(
        "--chart", metavar="FILE.png", help="Draw hours and cost against GPU count (needs matplotlib).")] = None,
    prices: PricesOpt = "auto",
    runs: Annotated[str, typer.Option(
        "--runs", metavar="cache|none|FILE.json",
        help="The platform's finished runs that correct the step times: cache reads what `trainctl runs`/`show` "
             "kept in ~/.cache/trainctl; FILE.json holds a list of run records' measured sections; none uses the "
             "published rows only.")] = "cache",
) -> None:
    """Validate a request, show what would run, and size it: memory per GPU, step time, hours, cost.

    No AWS call when --platform is given and --prices is none or a file (auto asks the Price List API when AWS
    credentials are found).
    """
    render.show_plan(request, platform, Aws(region=region, prefix=prefix), as_json=as_json, chart=chart,
                     prices=prices, runs=runs)


@app.command("render", rich_help_panel=OFFLINE)
@user_errors
def render_command(
    request: RequestArg,
    attempt: Annotated[int, typer.Option("--attempt", min=1, help="Attempt number (1 = first launch).")] = 1,
    platform: PlatformOpt = None,
    instance_type: Annotated[str | None, typer.Option(
        "--instance-type", metavar="TYPE", help="Render for this instance type (e.g. a fallback).")] = None,
    on_demand: Annotated[bool, flag("--on-demand", help="Render without Spot.")] = False,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Run id: it names the job and the checkpoint prefix. Default: a stand-in, "
                         "<request name>-0000000000000000, the same on every call.")] = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Print the exact CreateTrainingJob request as JSON.

    Pipe it to jq, or to `aws sagemaker create-training-job --cli-input-json file:///dev/stdin`.
    """
    render.print_rendered(request, platform, Aws(region=region, prefix=prefix), attempt=attempt, run_id=run_id,
                          instance_type=instance_type, on_demand=on_demand)


@app.command("schema", rich_help_panel=OFFLINE)
@user_errors
def schema_command() -> None:
    """Print the job request's JSON Schema (draft 2020-12), for editors and request generators.

    The schema checks shapes and ranges; `trainctl plan` checks everything.
    """
    schema.print_request_schema()


# ---- the deployed platform ---------------------------------------------------------------------------


@app.command("submit", rich_help_panel=DEPLOYED)
@user_errors
def submit_command(
    request: RequestArg,
    wait: WaitOpt = False,
    name: ExecutionNameOpt = None,
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
    raise typer.Exit(submit.submit_request(request, Aws(region=region, prefix=prefix), name=name,
                                           platform=platform, state_machine=state_machine, wait=wait,
                                           interval=interval))


@app.command("resume", rich_help_panel=DEPLOYED)
@user_errors
def resume_command(
    run_id: Annotated[str, typer.Argument(
        metavar="RUN", help="The run id to continue (`trainctl runs` lists them).")],
    request: Annotated[Path | None, typer.Argument(
        metavar="[REQUEST.json]", help="The request to continue it with (more max_steps, other instances, a new "
                                       "retry budget). Default: the request its last execution was sent.",
        show_default=False)] = None,
    wait: WaitOpt = False,
    name: ExecutionNameOpt = None,
    limit: RunsLimitOpt = runs.DEFAULT_LIMIT,
    platform: PlatformOpt = None,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
    interval: IntervalOpt = 10.0,
) -> None:
    """Continue a run that ended (max runtime, attempts spent, stopped) on its checkpoints.

    Starts the launcher with the run's request (or REQUEST) and resume_run set to RUN: same run id and
    checkpoint prefix, attempt numbers following on. Refused while an execution of the run is running; the
    launcher refuses a run that completed, whose job still runs, or that trained another model.
    """
    raise typer.Exit(submit.resume_request(run_id, request, Aws(region=region, prefix=prefix), name=name,
                                           platform=platform, state_machine=state_machine, wait=wait,
                                           interval=interval, limit=limit))


@app.command("status", rich_help_panel=DEPLOYED)
@user_errors
def status_command(
    execution: ExecutionArg,
    as_json: Annotated[bool, flag("--json", help="Print the execution as JSON.")] = False,
    chart: ChartOpt = None,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Show an execution: status, attempts (job, instance, Spot, outcome), latest metrics, result."""
    status.show_status(Aws(region=region, prefix=prefix), execution, state_machine, as_json=as_json,
                       chart=chart)


@app.command("list", rich_help_panel=DEPLOYED)
@user_errors
def list_command(
    status_: Annotated[list[ExecutionStatus] | None, typer.Option(
        "--status", help="Only executions with this status (repeat for several).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many, newest first.")] = 20,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """List the launcher's executions, newest first."""
    status.list_executions(Aws(region=region, prefix=prefix), [s.value for s in status_ or []], limit,
                           state_machine)


@app.command("runs", rich_help_panel=DEPLOYED)
@user_errors
def runs_command(
    limit: RunsLimitOpt = runs.DEFAULT_LIMIT,
    prices: PricesOpt = "auto",
    as_json: Annotated[bool, flag("--json", help="Print the runs and their records as JSON.")] = False,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """List runs, newest first: name, id, status, attempts, instance types, step, wall time, goodput, cost.

    A run is one id and checkpoint prefix across its executions (the first and each `trainctl resume`).
    """
    runs.list_runs(Aws(region=region, prefix=prefix), state_machine, limit=limit, prices=prices, as_json=as_json)


@app.command("show", rich_help_panel=DEPLOYED)
@user_errors
def show_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run id (`trainctl runs` lists them).")],
    chart: Annotated[Path | None, typer.Option(
        "--chart", metavar="FILE.png", help="Draw the run's attempts on a time axis, colored by where their "
                                            "time went (needs matplotlib).")] = None,
    limit: RunsLimitOpt = runs.DEFAULT_LIMIT,
    prices: PricesOpt = "auto",
    as_json: Annotated[bool, flag("--json", help="Print the run and its record as JSON.")] = False,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Show one run in full: its executions, every attempt, where the held instance-time went (goodput and the
    losses: startup, checkpoint stalls, evaluation, work redone after an interruption), and its cost."""
    runs.show_run(Aws(region=region, prefix=prefix), run_id, state_machine, limit=limit, prices=prices,
                  as_json=as_json, chart=chart)


@app.command("stop", rich_help_panel=DEPLOYED)
@user_errors
def stop_command(
    execution: ExecutionArg,
    state_machine: StateMachineOpt = None,
    prefix: PrefixOpt = DEFAULT_PREFIX,
    region: RegionOpt = None,
) -> None:
    """Stop an execution and its current training job (the job gets SIGTERM and checkpoints)."""
    stop.stop_execution(Aws(region=region, prefix=prefix), execution, state_machine)


@app.command("logs", rich_help_panel=DEPLOYED, help=f"Print a training job's CloudWatch logs ({LOG_GROUP}), or every attempt's of an "
                          "execution.")
@user_errors
def logs_command(
    target: Annotated[str, typer.Argument(
        metavar="EXECUTION|JOB_NAME", help="An execution (name or ARN) or a training job name.")],
    follow: Annotated[bool, flag("--follow", "-f", help="Keep printing new lines until the job ends.")]
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
    logs.show_logs(Aws(region=region, prefix=prefix), target, follow=follow, attempt=attempt, interval=interval,
                   state_machine=state_machine)


# ---- this machine --------------------------------------------------------------------------------------


@app.command("local", rich_help_panel=LOCAL)
@user_errors
def local_command(
    request: RequestArg,
    nproc: Annotated[int | None, typer.Option(
        "--nproc", min=1, help="Processes (default: GPUs, or 1). At most one per GPU, or per CPU without GPUs, "
                               "unless --oversubscribe.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="Where the job's /opt/ml-like folders go; run again on it to resume. "
                          "Default: .trainctl/local/<request name>.")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", metavar="DIR", help="Dataset folder: DIR/train and DIR/validation when present, else DIR as "
                                      "the train channel.")] = None,
    hosts: Annotated[int, typer.Option(
        "--hosts", min=1, help="Emulated instances, each with its own /opt/ml-like folders and --nproc processes, "
                               "checkpoints synced through an emulated S3 prefix as SageMaker syncs them.")] = 1,
    chart: ChartOpt = None,
    oversubscribe: Annotated[bool, flag(
        "--oversubscribe", help="Allow --nproc above this machine's GPUs (or CPUs, without GPUs): the processes "
                                "share them, and each holds its own copy of the model.")] = False,
    mlflow: Annotated[str | None, typer.Option(
        "--mlflow", metavar="URI", help="An MLflow tracking server (http://host:port, or a SageMaker MLflow ARN with "
                                        "sagemaker-mlflow installed): the run is an MLflow run there. Default: "
                                        "$MLFLOW_TRACKING_URI when set.")] = None,
) -> None:
    """Run a request on this machine, as SageMaker would run it (torchrun; gloo on CPU)."""
    if chart is None:
        raise typer.Exit(local_runner.run_local_command(request, nproc=nproc, workdir=workdir, data=data,
                                                        oversubscribe=oversubscribe, hosts=hosts, mlflow=mlflow))
    from cli.container_emulator import instance_root
    from cli.request_file import load_request
    from cli.views.charts import chart_local_run, check_chart_option

    check_chart_option(chart)  # before the run: a missing matplotlib is no reason to train for nothing
    workdir = workdir or local_runner.DEFAULT_WORKDIR_ROOT / load_request(request).request.name
    started = time.time()
    code = local_runner.run_local_command(request, nproc=nproc, workdir=workdir, data=data,
                                          oversubscribe=oversubscribe, hosts=hosts, mlflow=mlflow)
    chart_local_run(instance_root(workdir, hosts), chart, started=started)
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
