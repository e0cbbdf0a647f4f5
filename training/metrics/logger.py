"""Where metrics go: the `[metrics]` lines the job's MetricDefinitions parse (their names and format are
`contract.metrics`), the metrics JSONL file, and a terminal progress bar; and the GPUs' peak FLOP/s for MFU.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from contract.container import METRICS_FILE
from contract.gpus import PEAK_TFLOPS, peak_tflops
from contract.metrics import (
    RECORD_TIME,
    RUN_STARTED,
    SAMPLES_PER_SEC,
    STEP,
    TOKENS_PER_SEC,
    TRAIN_LOSS,
    format_metrics,
)

# Peak dense bf16/fp16 tensor-core FLOP/s per GPU: contract.gpus, the table the planner divides by too.
PEAK_FLOPS = {name: tflops * 1e12 for name, tflops in PEAK_TFLOPS.items()}


def peak_flops(device_name: str) -> float | None:
    """The peak for a GPU name such as 'NVIDIA H100 80GB HBM3'; None when unknown (MFU is then omitted)."""
    tflops = peak_tflops(device_name)
    return None if tflops is None else tflops * 1e12


def strict_json(value, **options) -> str:
    """JSON that every reader takes: a non-finite float (a NaN loss, a best validation loss of inf before the first
    evaluation) is null, where Python's json would write the bare `NaN`/`Infinity` that JSON has no word for."""
    return json.dumps(_finite(value), allow_nan=False, **options)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def numbers(record: dict) -> dict[str, float]:
    """Every number of a metrics record but its step: what TensorBoard and MLflow get of it, at its step."""
    return {name: float(value) for name, value in record.items()
            if name != STEP and isinstance(value, int | float) and not isinstance(value, bool)}


def _clock(seconds: float) -> str:
    """h:mm:ss (m:ss under an hour)."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class MetricsLogger:
    """Prints metric lines on stdout and appends the same records to metrics.jsonl (rank 0 only)."""

    def __init__(self, output_dir: str | Path, enabled: bool, total_steps: int, sinks=()) -> None:
        self.enabled = enabled
        # Where else each record goes, as numbers at its step: training.metrics.tensorboard.TensorBoardWriter,
        # training.metrics.mlflow_run.MlflowRun (each has write(record) and close()).
        self.sinks = [sink for sink in sinks if sink is not None]
        self.total_steps = total_steps
        self.path = Path(output_dir) / METRICS_FILE
        self.tty = enabled and sys.stderr.isatty()
        self.last: dict = {}  # the last logged record: what the progress bar shows of loss and throughput
        self.started: tuple[int, float] | None = None  # (step, time) of the first progress: the ETA's rate
        self.run_started = round(time.time(), 3)
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: v for k, v in record.items() if v is not None}
        self.last = {**self.last, **clean}  # an evaluation's record keeps the last training loss and throughput
        if self.tty:
            sys.stderr.write("\r\033[K")
        print(format_metrics(clean), flush=True)
        with self.path.open("a") as f:
            f.write(strict_json({**clean, RECORD_TIME: round(time.time(), 3), RUN_STARTED: self.run_started}) + "\n")
        for sink in self.sinks:
            sink.write(clean)

    def log_ranks(self, step: int, name: str, values: list[float]) -> None:
        """One number per rank at `step` (contract.metrics.RANK_STEP_TIME_MS), for the sinks that chart them
        (TensorBoard's write_ranks); not a line's metric, not in the metrics file."""
        if not self.enabled:
            return
        for sink in self.sinks:
            if hasattr(sink, "write_ranks"):
                sink.write_ranks(step, name, values)

    def final(self, record: dict) -> None:
        """The attempt's last metrics line, on stdout only: SageMaker keeps each metric's last value
        (FinalMetricDataList), which the launcher's run record reads; the metrics file keeps one record per
        log interval, as charts and readers of the file expect."""
        if self.enabled:
            print(format_metrics({k: v for k, v in record.items() if v is not None}), flush=True)

    def progress(self, step: int, now: float | None = None) -> None:
        """A one-line progress bar on stderr when it is a terminal (never in SageMaker's log stream): the step, the
        last logged loss and throughput, and the time left at the pace since the first step it drew."""
        if not self.tty:
            return
        sys.stderr.write(f"\r{self.progress_line(step, time.monotonic() if now is None else now)}")
        sys.stderr.flush()

    def progress_line(self, step: int, now: float) -> str:
        if self.started is None:
            self.started = (step, now)
        width = 30
        done = int(width * step / max(1, self.total_steps))
        parts = [f"[{'#' * done}{'.' * (width - done)}] {step}/{self.total_steps}"]
        if TRAIN_LOSS in self.last:
            parts.append(f"loss {self.last[TRAIN_LOSS]:.4f}")
        for key, unit in ((TOKENS_PER_SEC, "tokens/s"), (SAMPLES_PER_SEC, "samples/s")):
            if key in self.last:
                parts.append(f"{self.last[key]:,.0f} {unit}")
                break
        first_step, first_time = self.started
        if step > first_step and now > first_time:
            left = (self.total_steps - step) * (now - first_time) / (step - first_step)
            parts.append(f"ETA {_clock(left)}")
        return "  ".join(parts)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
        for sink in self.sinks:
            sink.close()
