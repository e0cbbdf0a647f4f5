"""`--chart FILE`: a run's loss, validation loss and throughput against steps, one line per attempt.

`trainctl status EXECUTION --chart` reads each attempt's `[metrics]` lines from its logs (cli.commands.logs), and
`trainctl local ... --chart` reads the work folder's metrics file (contract.container.METRICS_FILE), which
every local run on that folder appends to. matplotlib is an optional extra (`[chart]`): trainctl works
without it until a chart is asked for, and then says how to install it before doing anything else.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.errors import UserError
from contract.container import METRICS_FILE
from contract.metrics import (
    METRIC_NAMES,
    RECORD_TIME,
    RUN_STARTED,
    SAMPLES_PER_SEC,
    STEP,
    TOKENS_PER_SEC,
    TRAIN_LOSS,
    VAL_LOSS,
)

CHART_SUFFIXES = (".png", ".svg", ".pdf")
INSTALL_HINT = "pip install 'sagemaker-training-platform[chart]' (or: pip install matplotlib)"
# Throughput: tokens for language models, samples for the others (the training package prints one or both).
THROUGHPUT = ((TOKENS_PER_SEC, "tokens/s"), (SAMPLES_PER_SEC, "samples/s"))


@dataclass
class RunMetrics:
    """One attempt's (or one local run's) metric records, in the order they were logged."""

    label: str
    records: list[dict[str, float]] = field(default_factory=list)


def series(run: RunMetrics, name: str) -> tuple[list[float], list[float]]:
    """The steps and values of one metric; records without it (val_loss is logged only at evaluations)
    or with a non-finite value (a diverged loss) are left out."""
    steps, values = [], []
    for record in run.records:
        value = record.get(name)
        if STEP in record and value is not None and math.isfinite(value):
            steps.append(record[STEP])
            values.append(value)
    return steps, values


def throughput_metric(runs: list[RunMetrics]) -> tuple[str, str] | None:
    """(metric, axis label) of the throughput the runs logged, tokens/s before samples/s."""
    for name, label in THROUGHPUT:
        if any(series(run, name)[0] for run in runs):
            return name, label
    return None


def check_chart_option(path: Path) -> None:
    """Refuse a --chart value that cannot be written, and a missing matplotlib, before any work starts."""
    if path.suffix.lower() not in CHART_SUFFIXES:
        raise UserError(f"--chart {path}: the file name must end in {', '.join(CHART_SUFFIXES)}",
                        f"e.g. --chart {path.with_suffix('.png')}")
    if path.is_dir():
        raise UserError(f"--chart {path}: is a directory", f"name a file, e.g. --chart {path / 'chart.png'}")
    _check_chart_folder(path)
    _matplotlib()


def _check_chart_folder(path: Path) -> None:
    """The chart's folder must exist or be creatable (save_figure creates it): checked before any work, since
    matplotlib's own error would come as a traceback after it."""
    existing = next((folder for folder in path.parents if folder.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        raise UserError(f"--chart {path}: {existing} is a file, not a folder",
                        f"name a file in a folder, e.g. --chart {Path.cwd() / path.name}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--chart {path}: cannot write in {existing}",
                        f"name a file in a folder you can write to, e.g. --chart {Path.cwd() / path.name}")


def save_figure(figure: Any, path: Path, **kwargs: Any) -> None:
    """figure.savefig into path, its folders created; a path the system refuses is a UserError, not a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, **kwargs)
    except OSError as exc:
        raise UserError(f"--chart {path}: cannot write it: {exc.strerror or exc}",
                        "name a file in a folder you can write to") from None


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UserError("--chart needs matplotlib, which is not installed", INSTALL_HINT) from None
    return matplotlib


def render(runs: list[RunMetrics], title: str) -> Any:
    """A matplotlib Figure (Agg canvas, no pyplot state): loss above, throughput below, steps across."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    figure = Figure(figsize=(9, 6.5), layout="constrained")
    FigureCanvasAgg(figure)
    loss, speed = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    colors = _colors(len(runs))
    for run, color in zip(runs, colors, strict=True):
        steps, values = series(run, TRAIN_LOSS)
        loss.plot(steps, values, color=color, linewidth=1.6, label=f"{run.label} train")
        steps, values = series(run, VAL_LOSS)
        if steps:
            loss.plot(steps, values, color=color, linestyle="--", marker="o", markersize=4,
                      label=f"{run.label} validation")
    throughput = throughput_metric(runs)
    for run, color in zip(runs, colors, strict=True):
        if throughput:
            steps, values = series(run, throughput[0])
            speed.plot(steps, values, color=color, linewidth=1.4, label=run.label)
    _mark_restarts(runs, (loss, speed))
    loss.set_title(title, loc="left", fontsize=11)
    loss.set_ylabel("loss")
    loss.legend(fontsize=8, loc="upper right")
    speed.set_ylabel(throughput[1] if throughput else "throughput (not logged)")
    speed.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    speed.set_xlabel(STEP)
    for axes in (loss, speed):
        axes.grid(True, alpha=0.3)
    return figure


def _colors(count: int) -> list[str]:
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]
    return [palette[i % len(palette)] for i in range(count)]


def _mark_restarts(runs: list[RunMetrics], axes: tuple[Any, ...]) -> None:
    """A dotted line where each attempt after the first logged its first step: where it resumed."""
    for run in runs[1:]:
        steps = [r[STEP] for r in run.records if STEP in r]
        if steps:
            for one in axes:
                one.axvline(steps[0], color="#888888", linestyle=":", linewidth=1)


def write_chart(runs: list[RunMetrics], path: Path, title: str) -> bool:
    """Draw and save; False (nothing written) when no run logged a step yet."""
    runs = [run for run in runs if any(STEP in r for r in run.records)]
    if not runs:
        return False
    save_figure(render(runs, title), path, dpi=110)
    return True


# ---- where the records come from -------------------------------------------------------------------


def read_metrics_file(path: Path) -> list[dict[str, float]]:
    """The records of a metrics JSONL file: the known metrics and `time`. A line cut short (a run killed
    while writing) or not a record is skipped; the rest still charts."""
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            records.append({k: float(v) for k, v in data.items()
                            if (k in METRIC_NAMES or k in (RECORD_TIME, RUN_STARTED)) and isinstance(v, int | float)})
    return records


def split_runs(records: list[dict[str, float]], started: float | None = None) -> list[RunMetrics]:
    """One RunMetrics per run on a work folder: a new run starts where the records' run_started changes (each
    training process stamps its own), where the step goes back (a run resumed from an earlier checkpoint; files
    written before the stamp) and at `started`, when this command's run began."""
    runs: list[list[dict[str, float]]] = []
    previous: dict[str, float] | None = None
    for record in records:
        if not runs or _restarted(previous, record) or (
                started is not None and previous.get(RECORD_TIME, 0.0) < started <= record.get(RECORD_TIME, 0.0)) or (
                _other_process(previous, record)):
            runs.append([])
        runs[-1].append(record)
        previous = record
    return [RunMetrics(f"run {i}", run) for i, run in enumerate(runs, start=1)]


def _other_process(previous: dict[str, float], record: dict[str, float]) -> bool:
    """Both records carry the training process's start, and the starts differ."""
    before, now = previous.get(RUN_STARTED), record.get(RUN_STARTED)
    return before is not None and now is not None and before != now


def _restarted(previous: dict[str, float], record: dict[str, float]) -> bool:
    """The step went back, or a step's training record came twice. (An evaluation's record shares the
    step of the training record before it: that is the same run.)"""
    step, before = record.get(STEP, math.inf), previous.get(STEP, -math.inf)
    return step < before or (step == before and TRAIN_LOSS in record and TRAIN_LOSS in previous)


def local_runs(workdir: Path, started: float | None = None) -> list[RunMetrics]:
    return split_runs(read_metrics_file(workdir / "output" / "data" / METRICS_FILE), started)


def chart_local_run(workdir: Path, path: Path, *, started: float | None = None) -> bool:
    """`trainctl local --chart`: every run on the work folder, the one that began at `started` last."""
    from rich.markup import escape

    from cli.console import out

    if write_chart(local_runs(workdir, started), path, f"{workdir.name} (local, {workdir})"):
        out().print(f"chart: {escape(str(path))}")
        return True
    out().print(f"[yellow]no chart:[/] {escape(str(workdir / 'output' / 'data' / METRICS_FILE))} holds no metrics")
    return False


def execution_runs(aws: Any, view: Any) -> list[RunMetrics]:
    """Each attempt of an execution (cli.execution_history.ExecutionView) with the records its job logged."""
    from cli.commands.logs import metric_records

    return [RunMetrics(f"attempt {a.number} ({a.instance_type}{', Spot' if a.spot else ''})",
                       metric_records(aws, a.job_name)) for a in view.attempts]


# ---- a run's attempts on a time axis (trainctl show RUN --chart) ---------------------------------------

# Each segment of an attempt, in the order it is drawn (jobs.outcome.run_record.BUCKETS after the queueing), and its color.
SEGMENTS = (("queued", "#d9d9d9"), ("startup", "#ff7f0e"), ("productive", "#2ca02c"), ("checkpoint", "#1f77b4"),
            ("eval", "#9467bd"), ("other", "#8c8c8c"), ("redone", "#d62728"))


def attempt_segments(attempt: Any) -> list[tuple[str, float, float]]:
    """(segment, start epoch, seconds) of one attempt (jobs.retry.run_state.Attempt): its queueing from its start, then its
    held time split as jobs.outcome.run_record splits it, the work redone last (it is the end that was lost). The
    order inside the held time is a summary, not a trace: saves and evaluations happened along the way."""
    from jobs.outcome.run_record import attempt_time
    from jobs.timestamps import to_epoch

    start = to_epoch(attempt.started_at)
    if start is None:
        return []
    split = attempt_time(attempt)
    parts = [("queued", attempt.queued_seconds or 0)] + [(name, split.bucket(name)) for name, _ in SEGMENTS[1:]]
    segments, at = [], start
    for name, seconds in parts:
        if seconds:
            segments.append((name, at, float(seconds)))
            at += seconds
    return segments


def write_run_chart(view: Any, record: dict[str, Any], path: Path) -> None:
    """One bar per attempt (cli.commands.runs.RunView) on a UTC time axis, colored by where its time went; the gaps
    between bars are the launcher's waits."""
    _matplotlib()
    import datetime as dt

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, date2num
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from jobs.outcome.summary import money

    colors = dict(SEGMENTS)
    figure = Figure(figsize=(10, 1.2 + 0.5 * max(len(view.attempts), 1)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    labels = []
    for row, attempt in enumerate(view.attempts):
        for name, start, seconds in attempt_segments(attempt):
            left = date2num(dt.datetime.fromtimestamp(start, dt.UTC))
            axes.barh(row, seconds / 86400, left=left, color=colors[name], height=0.6,
                      hatch="//" if name == "redone" else None, edgecolor="white", linewidth=0.3)
        spot = ", Spot" if attempt.spot else ""
        labels.append(f"{attempt.attempt}: {attempt.instance_count}x {attempt.instance_type}{spot} ({attempt.status})")
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.invert_yaxis()
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    axes.set_xlabel("UTC")
    axes.grid(True, axis="x", alpha=0.3)
    goodput = "-" if record["goodput"] is None else f"{record['goodput']:.0%}"
    axes.set_title(f"{view.run_id}: goodput {goodput}, cost {money(record['cost']['total_usd'])}", loc="left",
                   fontsize=10)
    axes.legend(handles=[Patch(color=c, label=n, hatch="//" if n == "redone" else None) for n, c in SEGMENTS],
                fontsize=7, ncols=len(SEGMENTS), loc="upper center", bbox_to_anchor=(0.5, -0.35 if labels else -0.1))
    save_figure(figure, path, dpi=110)
