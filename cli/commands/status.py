"""`trainctl status` and `trainctl list`: what the launcher's executions are doing or did."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.markup import escape

from cli.aws import Aws
from cli.console import out
from cli.errors import stderr
from cli.views.charts import check_chart_option, execution_runs, write_chart


def show_status(aws: Aws, execution: str, state_machine: str | None, *, as_json: bool,
                chart: Path | None = None) -> None:
    """One execution: status, attempts, latest metrics, result; as JSON for programs; with `chart`, its
    metrics per attempt drawn to that file."""
    from cli.execution_history import describe
    from cli.views.executions import print_execution

    if chart is not None:
        check_chart_option(chart)
    view = describe(aws, aws.execution_arn(execution, state_machine))
    if as_json:
        typer.echo(json.dumps(asdict(view), indent=2, default=str))
    else:
        print_execution(out(), aws, view)
    if chart is not None:
        # With --json, stdout is the JSON alone: the chart's line goes to stderr.
        console = stderr if as_json else out()
        if write_chart(execution_runs(aws, view), chart, f"{view.name} ({view.status})"):
            console.print(f"chart: {escape(str(chart))}")
        else:
            console.print(f"[yellow]no chart:[/] no attempt of {escape(view.name)} has logged metrics yet")


def list_executions(aws: Aws, statuses: list[str], limit: int, state_machine: str | None) -> None:
    """The newest `limit` executions, of any status or only of `statuses`."""
    from cli.views.executions import executions_table

    machine = aws.state_machine_arn(state_machine)
    paginator = aws.client("stepfunctions").get_paginator("list_executions")
    items: list[dict] = []
    # ListExecutions filters by one status at a time: one listing per status wanted, merged by start time.
    for wanted in statuses or [None]:
        kwargs = {"stateMachineArn": machine, "PaginationConfig": {"MaxItems": limit}}
        if wanted is not None:
            kwargs["statusFilter"] = wanted
        for page in paginator.paginate(**kwargs):
            items.extend(page["executions"])
    items.sort(key=lambda item: item["startDate"], reverse=True)
    if not items:
        out().print("no executions")
        return
    out().print(executions_table(items[:limit]))
