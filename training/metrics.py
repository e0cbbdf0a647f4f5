"""Metric lines the launcher's MetricDefinitions parse, the metrics JSONL file, and a terminal progress bar.

Line format (fixed; the launcher's regex for a name N is `\\[metrics\\].*?\\bN=([-+0-9.eE]+|nan|inf)`):
    [metrics] step=120 train_loss=2.3141 lr=0.0003 tokens_per_sec=12345.6 step_time_ms=85.2 mfu=0.412
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

METRIC_NAMES = (
    "step",
    "epoch",
    "train_loss",
    "val_loss",
    "lr",
    "grad_norm",
    "tokens_per_sec",
    "samples_per_sec",
    "step_time_ms",
    "mfu",
    "loss_scale",
)

# Peak dense bf16/fp16 tensor-core FLOP/s per GPU, from the vendors' data sheets (SXM parts).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "B200": 2250e12,
}


def peak_flops(device_name: str) -> float | None:
    """The peak for a GPU name such as 'NVIDIA H100 80GB HBM3'; None when unknown (MFU is then omitted)."""
    for key, value in PEAK_FLOPS.items():
        if key in device_name:
            return value
    return None


def _format_value(name: str, value: float | int) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if name == "lr" or (value != 0 and abs(value) < 1e-3):
        return f"{value:.4g}"
    if name in ("train_loss", "val_loss", "grad_norm", "mfu", "epoch"):
        return f"{value:.4f}"
    return f"{value:.1f}"


def format_metrics(record: dict) -> str:
    """`[metrics] name=value ...` in METRIC_NAMES order; unknown names are a programming error."""
    unknown = set(record) - set(METRIC_NAMES)
    if unknown:
        raise ValueError(f"unknown metric names {sorted(unknown)}; allowed: {METRIC_NAMES}")
    parts = [f"{name}={_format_value(name, record[name])}" for name in METRIC_NAMES if record.get(name) is not None]
    return "[metrics] " + " ".join(parts)


class MetricsLogger:
    """Prints metric lines on stdout and appends the same records to metrics.jsonl (rank 0 only)."""

    def __init__(self, output_dir: str | Path, enabled: bool, total_steps: int) -> None:
        self.enabled = enabled
        self.total_steps = total_steps
        self.path = Path(output_dir) / "metrics.jsonl"
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
            f.write(json.dumps({**clean, "time": round(time.time(), 3)}) + "\n")

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
