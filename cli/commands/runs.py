"""`trainctl runs` and `trainctl show RUN`: runs (one id, one checkpoint prefix, every execution that trained
on it: the first and each `trainctl resume`) with their record: attempts, step, wall time, goodput, cost.

A run's attempts are read from Step Functions' own history of each execution: the run state every launcher
Lambda returns (jobs.retry.run_state.RunState) and, once the run ended, Summarize's summary, whose attempts carry the
figures of their jobs (jobs.retry.run_state.job_figures). The record is jobs.outcome.run_record's, priced with the prices
`--prices` names (cli.price_source, as `trainctl plan`). An attempt still running counts once it has ended.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from cli.aws import Aws
from cli.console import out
from cli.errors import UserError
from jobs.outcome.run_record import BUCKETS, run_record
from jobs.outcome.summary import money
from jobs.registry import Registry, table_name
from jobs.retry.run_state import MAY_RUN, Attempt, RunState
from jobs.timestamps import duration

# Executions read when looking for runs: each costs a GetExecutionHistory call.
DEFAULT_LIMIT = 50


@dataclass
class ExecutionOfRun:
    name: str
    status: str  # the execution's: RUNNING, SUCCEEDED, FAILED, ABORTED, TIMED_OUT
    start: datetime | None
    stop: datetime | None
    outcome: str  # the summary's status (Succeeded/Failed), or "" before Summarize ran
    request: dict[str, Any] | None = None  # the execution's input: the request document as it was sent
    # The execution it handed the run over to near the history limit (jobs.handler.continue_near_limit): its
    # attempts, record and summary are that one's.
    continued_in: str = ""

    @property
    def shown_status(self) -> str:
        return "continued" if self.continued_in else self.status.lower()


@dataclass
class RunView:
    run_id: str
    request_name: str
    checkpoint_s3_uri: str
    started: float
    tensorboard_s3_uri: str = ""
    mlflow: str = ""  # where its MLflow run is (RunState.mlflow_run), when it logs one
    executions: list[ExecutionOfRun] = field(default_factory=list)  # oldest first
    attempts: list[Attempt] = field(default_factory=list)  # every execution's, oldest first
    # Each ended execution's `measured` section (its last job against the planner: jobs.planning.measured).
    measured: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        """running; completed; or ended (resumable: stopped, failed, out of attempts or runtime)."""
        last = self.executions[-1]
        if last.status == "RUNNING":
            return "running"
        return "completed" if last.outcome == "Succeeded" else "ended"

    @property
    def ended(self) -> float:
        last = self.executions[-1]
        return last.stop.timestamp() if last.stop else time.time()

    def record(self, prices: dict[str, float] | None) -> dict[str, Any]:
        return run_record(self.attempts, started=self.started, ended=self.ended, prices=prices)


def registered_executions(aws: Aws, *, run_id: str | None, limit: int) -> list[str] | None:
    """The executions the run registry (jobs.registry) records: run `run_id`'s, or those of its newest `limit` runs;
    None when it cannot be read (a platform deployed before it, or a role without its read grant)."""
    from botocore.exceptions import BotoCoreError, ClientError

    registry = Registry(aws.client("dynamodb"), table_name(aws.prefix))
    try:
        if run_id is not None:
            records = [r] if (r := registry.read(run_id)) else []
        else:
            records = sorted(registry.scan(), key=lambda r: r.updated_at, reverse=True)[:limit]
    except (BotoCoreError, ClientError):
        return None
    return [arn for record in records for arn in Registry.executions(record)]


def _listed_executions(aws: Aws, machine: str, limit: int) -> list[dict[str, Any]]:
    items = []
    paginator = aws.client("stepfunctions").get_paginator("list_executions")
    for page in paginator.paginate(stateMachineArn=machine, PaginationConfig={"MaxItems": limit}):
        items.extend(page["executions"])
    return items


def _execution_runs(aws: Aws, machine: str, limit: int,
                    run_id: str | None = None) -> list[tuple[dict[str, Any], dict, dict | None, Any, str]]:
    """(execution, latest run state, summary, input, the execution it continued in) of the executions that got a
    run: for one run, those the registry records (every one, however old; a run from before the registry: the newest
    `limit` executions); for all runs, those of the registry's newest `limit` runs and the newest `limit` executions
    (runs from before it)."""
    from cli.execution_history import continued_in, final_summary, history_events, latest_run_state

    registered = registered_executions(aws, run_id=run_id, limit=limit)
    sfn = aws.client("stepfunctions")
    items = [sfn.describe_execution(executionArn=arn) for arn in registered or []]
    if registered is None or run_id is None or not registered:
        known = {item["executionArn"] for item in items}
        items += [item for item in _listed_executions(aws, machine, limit) if item["executionArn"] not in known]
    found = []
    for item in items:
        events = history_events(aws, item["executionArn"])
        state = latest_run_state(events)
        if state is not None:  # Prepare refused the request: no run
            found.append((item, state, final_summary(events), _input(events), continued_in(events)))
    return found


def _input(events: list[dict[str, Any]]) -> Any:
    for event in events:
        if event["type"] == "ExecutionStarted":
            try:
                return json.loads(event["executionStartedEventDetails"].get("input") or "null")
            except json.JSONDecodeError:
                return None
    return None


def collect_runs(aws: Aws, machine: str, limit: int = DEFAULT_LIMIT, run_id: str | None = None) -> list[RunView]:
    """The runs (`run_id`'s only, when given) of the run registry and of the newest `limit` executions, newest run
    first."""
    runs: dict[str, RunView] = {}
    for item, state, summary, document, successor in sorted(_execution_runs(aws, machine, limit, run_id),
                                                            key=lambda x: x[0]["startDate"]):
        run = RunState.from_dict(state)
        view = runs.setdefault(run.run_id, RunView(run.run_id, run.name, run.checkpoint_s3_uri,
                                                   run.started_epoch))
        view.tensorboard_s3_uri = run.tensorboard_s3_uri or view.tensorboard_s3_uri
        view.mlflow = run.mlflow_run or view.mlflow
        attempts = [Attempt(**a) for a in summary["attempts"]] if summary else run.attempts
        if not successor:  # a successor carries the attempts of the execution it took the run over from
            view.attempts.extend(attempts)
        measured = ((summary or {}).get("record") or {}).get("measured")
        if isinstance(measured, dict):
            view.measured.append(measured)
        view.executions.append(ExecutionOfRun(item["name"], item["status"], item.get("startDate"),
                                              item.get("stopDate"), (summary or {}).get("status", ""),
                                              document if isinstance(document, dict) else None, successor))
    for view in runs.values():
        settle_last_job(aws, view)
    return sorted(runs.values(), key=lambda v: v.executions[-1].start or 0, reverse=True)


def settle_last_job(aws: Aws, view: RunView) -> None:
    """An execution that ended without a summary (stopped, timed out) left its last attempt as it last saw it:
    look its job up, so that a job that completed as the stop arrived reads as completed, not resumable."""
    from cli.execution_history import describe_job

    last = view.executions[-1]
    if last.status == "RUNNING" or last.outcome or not view.attempts or \
            view.attempts[-1].status not in MAY_RUN:
        return
    job = describe_job(aws, view.attempts[-1].job_name)
    if job is not None:
        view.attempts[-1].status = job.get("TrainingJobStatus", view.attempts[-1].status)
        if view.attempts[-1].status == "Completed":
            last.outcome = "Succeeded"


def search_run(aws: Aws, machine: str, run_id: str, limit: int) -> RunView | None:
    return next((view for view in collect_runs(aws, machine, limit, run_id) if view.run_id == run_id), None)


def find_run(aws: Aws, machine: str, run_id: str, limit: int) -> RunView:
    view = search_run(aws, machine, run_id, limit)
    if view is not None:
        return view
    raise UserError(f"no run {run_id} in the run registry nor among the launcher's newest {limit} executions",
                    "check the id (`trainctl runs` lists them), or look further back with --limit")


def keep_measured(views: list[RunView]) -> None:
    """The runs' `measured` sections into trainctl plan's cache (cli.run_cache); a cache that cannot be written
    is said on stderr."""
    from cli.errors import stderr
    from cli.run_cache import remember

    # Oldest first (collect_runs lists the newest run first): the cache keeps the newest it was given.
    if note := remember(m for view in reversed(views) for m in view.measured):
        stderr.print(f"[yellow]run cache[/]: {escape(note)}")


def _prices(option: str, aws: Aws):
    from cli.price_source import resolve_prices

    return resolve_prices(option, aws.region_name, aws)


# ---- trainctl runs ------------------------------------------------------------------------------------


def list_runs(aws: Aws, state_machine: str | None, *, limit: int, prices: str, as_json: bool) -> None:
    views = collect_runs(aws, aws.state_machine_arn(state_machine), limit)
    keep_measured(views)
    table = _prices(prices, aws)
    rows = [(view, view.record(table.prices)) for view in views]
    if as_json:
        print(json.dumps([_as_dict(view, record) for view, record in rows], indent=2, default=str))
        return
    console = out()
    if not rows:
        console.print(f"no runs in the launcher's newest {limit} executions")
        return
    grid = Table(caption=f"prices: {escape(table.describe())}", caption_justify="left")
    for column in ("run", "id", "status", "attempts", "instance types", "step", "wall time", "goodput", "cost"):
        grid.add_column(column, overflow="fold")
    for view, record in rows:
        grid.add_row(escape(view.request_name), escape(view.run_id), view.status, str(len(view.attempts)),
                     escape(", ".join(dict.fromkeys(a.instance_type for a in view.attempts))),
                     str(record["step"] if record["step"] is not None else "-"), duration(record["wall_seconds"]),
                     _goodput(record), money(record["cost"]["total_usd"]))
    console.print(grid)


def _goodput(record: dict[str, Any]) -> str:
    if record["goodput"] is None:
        return "-"
    return f"{'>=' if record['unmeasured_attempts'] else ''}{record['goodput']:.0%}"


def _as_dict(view: RunView, record: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import asdict

    return {"run_id": view.run_id, "request_name": view.request_name, "status": view.status,
            "checkpoint_s3_uri": view.checkpoint_s3_uri, "tensorboard_s3_uri": view.tensorboard_s3_uri,
            "mlflow": view.mlflow or None,
            "executions": [asdict(e) for e in view.executions],
            "attempts": [asdict(a) for a in view.attempts], "record": record, "measured": view.measured}


# ---- trainctl show RUN --------------------------------------------------------------------------------


def show_run(aws: Aws, run_id: str, state_machine: str | None, *, limit: int, prices: str, as_json: bool,
             chart: Path | None) -> None:
    from cli.views.charts import check_chart_option

    if chart is not None:
        check_chart_option(chart)
    view = find_run(aws, aws.state_machine_arn(state_machine), run_id, limit)
    keep_measured([view])
    table = _prices(prices, aws)
    record = view.record(table.prices)
    if as_json:
        print(json.dumps(_as_dict(view, record), indent=2, default=str))
    else:
        print_run(view, record, table.describe())
    if chart is not None:
        from cli.errors import stderr
        from cli.views.charts import write_run_chart

        write_run_chart(view, record, chart)
        (stderr if as_json else out()).print(f"chart: {escape(str(chart))}")


def print_run(view: RunView, record: dict[str, Any], prices: str) -> None:
    from jobs.render.training_job import tensorboard_command
    from jobs.retry.resume import resume_command

    console = out()
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    rows = [("run", view.run_id), ("request", view.request_name), ("status", view.status),
            ("executions", ", ".join(f"{e.name} ({e.shown_status})" for e in view.executions)),
            ("checkpoints", view.checkpoint_s3_uri), ("step", str(record["step"] if record["step"] is not None
                                                                 else "-")),
            ("wall time", f"{duration(record['wall_seconds'])} (queued in SageMaker {duration(record['queued_seconds'])}"
                          f", waiting between attempts {duration(record['between_attempts_seconds'])})"),
            ("goodput", _goodput(record) + (f" (attempts {record['unmeasured_attempts']} did not measure their time)"
                                            if record["unmeasured_attempts"] else ""))]
    rows += [("measured", measured_text(m)) for m in view.measured]
    if view.tensorboard_s3_uri:
        rows.append(("tensorboard", f"{view.tensorboard_s3_uri}: "
                                    f"{tensorboard_command(view.tensorboard_s3_uri, view.run_id)}"))
    if view.mlflow:
        rows.append(("mlflow", view.mlflow))
    if view.status == "ended":
        rows.append(("resume", resume_command(view.run_id) + " REQUEST"))
    for name, value in rows:
        head.add_row(name, escape(value))
    console.print(head)
    console.print(_attempts_table(view))
    console.print(_split_table(record))
    cost = record["cost"]
    unpriced = f"; no price for {', '.join(cost['unpriced'])}" if cost["unpriced"] else ""
    console.print(f"[bold]cost[/] {money(cost['total_usd'])}: on demand {money(cost['on_demand_usd'])}, Spot "
                  f"{money(cost['spot_usd'])} (saved {money(cost['spot_savings_usd'])} against on demand){unpriced}")
    console.print(f"prices: {escape(prices)}")


def measured_text(m: dict[str, Any]) -> str:
    """One execution's last job: its measured step time and MFU against the planner's for the same layout."""
    from contract.metrics import MFU

    mfu = f", MFU {m[MFU]:.1%}" if isinstance(m.get(MFU), int | float) else ""
    text = f"{m.get('strategy')} on {m.get('instance_count')} x {m.get('instance_type')}: {m.get('step_time_s')} s/step{mfu}"
    if m.get("predicted_step_time_s"):
        text += (f"; the planner: {m['predicted_step_time_s']:.4g} s (measured {m.get('measured_over_predicted')}x"
                 " its figure)")
    elif m.get("not_predicted"):
        text += f"; no planner figure: {m['not_predicted']}"
    return text


def _attempts_table(view: RunView) -> Table:
    grid = Table(title="attempts", title_justify="left")
    for column in ("#", "training job", "instances", "spot", "status", "queued", "held", "productive", "redone",
                   "step", "outcome"):
        grid.add_column(column, overflow="fold")
    for a in view.attempts:
        redone = duration(a.lost_seconds) + (" (at most)" if a.lost_is_upper_bound else "") if a.lost_seconds else "-"
        productive = a.train_seconds - min(a.lost_seconds, a.train_seconds) if a.train_seconds is not None else None
        grid.add_row(str(a.attempt), escape(a.job_name), f"{a.instance_count}x {escape(a.instance_type)}",
                     "yes" if a.spot else "no", a.status, duration(a.queued_seconds), duration(a.training_seconds),
                     duration(productive), redone, str(a.step if a.step is not None else "-"),
                     escape(f"{a.category}: {a.reason}" if a.category else ""))
    return grid


def _split_table(record: dict[str, Any]) -> Table:
    held = record["held_instance_seconds"]
    grid = Table(title="where the held instance-time went", title_justify="left")
    for column in ("", "instance-hours", "share"):
        grid.add_column(column, justify="right" if column else "left")
    for name in BUCKETS:
        seconds = record["instance_seconds"][name]
        grid.add_row(name, f"{seconds / 3600:.2f}", f"{seconds / held:.1%}" if held else "-")
    grid.add_row("[bold]held[/]", f"{held / 3600:.2f}", "100%" if held else "-")
    return grid
