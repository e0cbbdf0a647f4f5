"""The arguments and options several trainctl commands share, spelled once so that they read alike."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer


def flag(*names: str, help: str) -> Any:
    """A boolean option that takes no value. metavar "": typer's help shows a flag's type, `--json <bool>`, which
    reads as if it took a value, and `--json true` is an error."""
    return typer.Option(*names, help=help, metavar="")


RequestArg = Annotated[Path, typer.Argument(metavar="REQUEST.json", help="The job request (JSON).",
                                            show_default=False)]
PlatformOpt = Annotated[Path | None, typer.Option(
    "--platform", metavar="FILE",
    help="Platform settings JSON (as the stack publishes it). Without it, read from the deployed stack "
         "(SSM /<prefix>/platform-settings).")]
PrefixOpt = Annotated[str, typer.Option(
    "--prefix", envvar="TRAINCTL_PREFIX", help="The platform's name prefix (its SSM parameters live under it).")]
RegionOpt = Annotated[str | None, typer.Option(
    "--region", help="AWS region of the platform (default: AWS_REGION, then AWS_DEFAULT_REGION, then your AWS config; "
                     "submit --platform FILE: the file's region).")]
StateMachineOpt = Annotated[str | None, typer.Option(
    "--state-machine", metavar="ARN", help="State machine ARN (default: SSM /<prefix>/state-machine-arn).")]
ExecutionArg = Annotated[str, typer.Argument(
    metavar="EXECUTION", help="Execution name or ARN (names belong to the platform's state machine).")]
# The help's command groups: what needs AWS access and what does not.
OFFLINE = "Offline (no AWS access with --platform FILE)"
DEPLOYED = "The deployed platform (AWS credentials and region)"
LOCAL = "This machine"
IntervalOpt = Annotated[float, typer.Option("--interval", min=0.0, help="Seconds between polls.")]
WaitOpt = Annotated[bool, flag("--wait", help="Follow the execution until it ends; exit 1 if it fails.")]
ExecutionNameOpt = Annotated[str | None, typer.Option(
    "--name", metavar="EXECUTION_NAME", help="Execution name (default: <request name>-<UTC time>).")]

ChartOpt = Annotated[Path | None, typer.Option(
    "--chart", metavar="FILE.png",
    help="Also draw loss, validation loss and throughput against steps, one line per attempt (or local run), to this "
         "PNG (or .svg/.pdf). Needs matplotlib: pip install 'sagemaker-training-platform\\[chart]'.")]

class ExecutionStatus(StrEnum):
    """Step Functions' execution statuses: the choices of `trainctl list --status`."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    ABORTED = "ABORTED"
    PENDING_REDRIVE = "PENDING_REDRIVE"
PricesOpt = Annotated[str, typer.Option(
    "--prices", metavar="auto|aws|none|FILE.json",
    help="On-demand training prices for the costs: aws asks the AWS Price List API (pricing:GetProducts; "
         "cached 7 days in ~/.cache/trainctl, aws refreshes it); FILE.json holds "
         "{\"ml.p4d.24xlarge\": <USD per hour>, ...}; none goes without; auto uses aws when AWS credentials "
         "are found, else none.")]
RunsLimitOpt = Annotated[int, typer.Option(
    "--limit", min=1, help="Read at most this many of the launcher's executions, newest first, to find runs (a run "
                           "has one execution, and one more per resume).")]
