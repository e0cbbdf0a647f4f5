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
from contract.metrics import format_metrics

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


class MetricsLogger:
    """Prints metric lines on stdout and appends the same records to metrics.jsonl (rank 0 only)."""

    def __init__(self, output_dir: str | Path, enabled: bool, total_steps: int) -> None:
        self.enabled = enabled
        self.total_steps = total_steps
        self.path = Path(output_dir) / METRICS_FILE
        self.tty = enabled and sys.stderr.isatty()
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        clean = {k: v for k, v in record.items() if v is not None}
        if self.tty:
            sys.stderr.write("\r\033[K")
        print(format_metrics(clean), flush=True)
        with self.path.open("a") as f:
            f.write(strict_json({**clean, "time": round(time.time(), 3)}) + "\n")

    def final(self, record: dict) -> None:
        """The attempt's last metrics line, on stdout only: SageMaker keeps each metric's last value
        (FinalMetricDataList), which the launcher's run record reads; the metrics file keeps one record per
        log interval, as charts and readers of the file expect."""
        if self.enabled:
            print(format_metrics({k: v for k, v in record.items() if v is not None}), flush=True)

    def progress(self, step: int, loss: float | None = None) -> None:
        """A one-line progress bar on stderr when it is a terminal (never in SageMaker's log stream)."""
        if not self.tty:
            return
        width = 30
        done = int(width * step / max(1, self.total_steps))
        tail = f" loss {loss:.4f}" if loss is not None else ""
        sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {step}/{self.total_steps}{tail}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
