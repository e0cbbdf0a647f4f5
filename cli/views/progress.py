"""Live progress of an execution for `trainctl submit --wait` (rich Live on a terminal, plain lines otherwise)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from cli.aws import Aws
from cli.execution_history import AttemptView, ExecutionView, describe, describe_job, job_metrics
from contract.metrics import METRIC_NAMES


@dataclass(frozen=True)
class Snapshot:
    status: str
    state: str | None
    attempt: int
    job_name: str | None
    instance_type: str | None
    job_status: str | None
    secondary_status: str | None
    metrics: tuple[tuple[str, float], ...]

    def line(self) -> str:
        parts = [f"execution={self.status}", f"state={self.state or '-'}"]
        if self.job_name:
            parts += [f"attempt={self.attempt}", f"job={self.job_name}", f"instance={self.instance_type}",
                      f"job_status={self.job_status or 'Creating'}/{self.secondary_status or '-'}"]
        parts += [f"{name}={format_metric(value)}" for name, value in self.metrics]
        return " ".join(parts)

    def table(self) -> Table:
        table = Table(show_header=False, box=None, pad_edge=False)
        table.add_column(style="bold")
        table.add_column()
        table.add_row("execution", self.status)
        table.add_row("state", self.state or "-")
        if self.job_name:
            table.add_row("attempt", str(self.attempt))
            table.add_row("training job", f"{self.job_name} ({self.instance_type})")
            table.add_row("job status", f"{self.job_status or 'Creating'} / {self.secondary_status or '-'}")
        for name, value in self.metrics:
            table.add_row(name, format_metric(value))
        return table


def format_metric(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def ordered_metrics(metrics: dict[str, float]) -> tuple[tuple[str, float], ...]:
    """The training package's metrics in METRIC_NAMES' order (how people read them), then any others by name."""
    known = [(n, metrics[n]) for n in METRIC_NAMES if n in metrics]
    return tuple(known + sorted((n, v) for n, v in metrics.items() if n not in METRIC_NAMES))


def snapshot(aws: Aws, view: ExecutionView, attempt: AttemptView | None = None) -> Snapshot:
    """The execution as it stands, showing `attempt` (the latest when not given)."""
    latest = attempt or view.latest
    job = describe_job(aws, latest.job_name) if latest else None
    return Snapshot(
        status=view.status,
        state=view.current_state,
        attempt=latest.number if latest else 0,
        job_name=latest.job_name if latest else None,
        instance_type=latest.instance_type if latest else None,
        job_status=job.get("TrainingJobStatus") if job else None,
        secondary_status=job.get("SecondaryStatus") if job else None,
        metrics=ordered_metrics(job_metrics(job)),
    )


def follow(aws: Aws, arn: str, *, console: Console, interval: float,
          sleep: Callable[[float], None] = time.sleep) -> ExecutionView:
    """Poll the execution until it ends, showing each change, and on through each execution the run went on in
    (continue-as-new); returns the final view."""
    live = console.is_terminal
    last: Snapshot | None = None
    shown = 0  # the highest attempt number shown so far
    with Live(console=console, auto_refresh=False, transient=False) if live else _nothing() as display:
        while True:
            view = describe(aws, arn)
            # An attempt that started and ended between two polls (a capacity error answered in seconds) is
            # still shown, once, as it ended: the watch never hides an attempt the run spent.
            for passed in [a for a in view.attempts[:-1] if a.number > shown]:
                _print_line(console, snapshot(aws, view, passed))
            current = snapshot(aws, view)
            shown = max(shown, current.attempt)
            if current != last:
                if display is not None:
                    display.update(current.table(), refresh=True)
                else:
                    _print_line(console, current)
                last = current
            if view.status != "RUNNING" and not view.continued_in:
                return view
            if view.continued_in:  # handed over near the history limit: the run, its job and this watch go on there
                console.print(escape(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] the run goes on in execution "
                                     f"{view.continued_in.rsplit(':', 1)[-1]} (this one's history neared Step "
                                     "Functions' limit)"), highlight=False)
                arn = view.continued_in
                continue
            sleep(interval)


def _print_line(console: Console, snap: Snapshot) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    console.print(escape(f"[{stamp}] {snap.line()}"), highlight=False)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
