"""Published training runs the time model is fitted to, the planner's figure for each, and what that says about
the planner's error per GPU generation (the `error_band` and `calibrated_from` of `trainctl plan --json`).

Each row is laid out as the planner lays a run out and sized by its real functions (shape_facts, numerics,
step_time). Where the planner cannot express a row's layout, the closest it can is used and `expressed` says how.
Other rows of the same sources are held out (not fitted to): they check the fit, they are not listed here.

    python -m jobs.planning.calibration     # each row: predicted, measured, error
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from jobs.catalog import GpuSpec, lookup
from jobs.planning.layout import Layout, numerics
from jobs.planning.shape import shape_facts
from jobs.planning.timing import generation, step_time

LLM_FOUNDRY = "llm-foundry scripts/train/benchmarking/README.md"
TORCHTITAN = "torchtitan docs/performance.md (Apr 2024)"
KORTHIKANTI = "Korthikanti et al. 2022, Tables 3 and 5"


@dataclass(frozen=True)
class Row:
    label: str
    source: str
    shape: dict[str, Any]  # layers, hidden, heads, vocab_size, seq_len (and params where the formula is off)
    instance_type: str
    layout: Layout
    hyperparameters: dict[str, Any]
    measured: float
    unit: str  # "tokens/s/GPU" or "s/iteration"
    expressed: str = ""  # how the planner expresses a layout it has no exact form for
    extra: dict = field(default_factory=dict)

    @property
    def gpu(self) -> GpuSpec:
        return lookup(self.instance_type).gpu


def mpt_shape(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """An llm-foundry MPT model's shape (its 50,368-entry vocabulary, sequences of 2048)."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab_size": 50368, "seq_len": 2048}


A100, H100 = "ml.p4de.24xlarge", "ml.p5.48xlarge"  # A100 80GB and H100 80GB, 8 per node, NVLink, EFA
ROWS: tuple[Row, ...] = (
    Row("MPT-7B, 8 x A100 80GB, FSDP", LLM_FOUNDRY, mpt_shape(32, 4096, 32), A100, Layout(1, 8, shard=8),
        {"micro_batch_size": 6, "grad_accum": 1}, 4641, "tokens/s/GPU"),
    Row("MPT-30B, 8 x A100 80GB, FSDP, AC", LLM_FOUNDRY, mpt_shape(48, 7168, 56), A100, Layout(1, 8, shard=8),
        {"micro_batch_size": 3, "grad_accum": 1, "activation_checkpointing": True}, 916, "tokens/s/GPU"),
    Row("MPT-1B, 8 x H100 80GB, FSDP", LLM_FOUNDRY, mpt_shape(24, 2048, 16), H100, Layout(1, 8, shard=8),
        {"micro_batch_size": 14, "grad_accum": 1}, 45455, "tokens/s/GPU"),
    Row("MPT-7B, 8 x H100 80GB, FSDP", LLM_FOUNDRY, mpt_shape(32, 4096, 32), H100, Layout(1, 8, shard=8),
        {"micro_batch_size": 6, "grad_accum": 1}, 10643, "tokens/s/GPU"),
    Row("Llama 3 8B, 64 x A100 80GB, FSDP2, selective AC", TORCHTITAN,
        {"layers": 32, "hidden": 4096, "heads": 32, "vocab_size": 128256, "seq_len": 8192, "params": 8_030_000_000},
        A100, Layout(8, 8, shard=64), {"micro_batch_size": 1, "grad_accum": 1,
                                                "activation_checkpointing": True,
                                                "activation_checkpointing_policy": "selective"}, 2904, "tokens/s/GPU",
        expressed="the gated MLP and grouped-query attention as a GPT block with Llama's 8.03B parameters (its "
                  "selective AC is the package's, torchtitan's op-level policy)"),
    Row("GPT 175B, 64 x A100 80GB, TP 8 x PP 8", KORTHIKANTI,
        {"layers": 96, "hidden": 12288, "heads": 96, "vocab_size": 51200, "seq_len": 2048}, A100,
        Layout(8, 8, tensor=8, pipeline=8, microbatches=64, schedule="interleaved_1f1b"),
        {"micro_batch_size": 1, "global_batch_size": 64}, 13.75, "s/iteration",
        expressed="no recomputation for selective AC (it recomputes only attention's softmax core, ~3% of the "
                  "FLOPs), sequence parallelism as the planner's tensor parallelism"),
)


def predict(row: Row) -> float:
    """The planner's figure for a row, in the row's unit."""
    sh = row.shape
    shape = SimpleNamespace(kind="decoder", layers=sh["layers"], hidden=sh["hidden"], heads=sh["heads"],
                            vocab_size=sh["vocab_size"], seq_len=sh["seq_len"], params=sh.get("params"),
                            flops_per_sample=None, image_size=None, patch_size=None)
    m = shape_facts(shape, sh["seq_len"])
    n = numerics({"precision": "bf16", **row.hyperparameters})
    seconds = step_time(m, n, lookup(row.instance_type), row.layout).total
    if row.unit == "s/iteration":
        return seconds
    return n.step_samples(n.readers(row.layout)) * m.tokens / seconds / row.layout.gpus


def throughput_error(row: Row) -> float:
    """Predicted throughput over measured, minus 1 (a time row's ratio inverted)."""
    ratio = predict(row) / row.measured
    return (1 / ratio if row.unit == "s/iteration" else ratio) - 1


@functools.cache
def _bands() -> dict[str, tuple[float, tuple[Row, ...]]]:
    out: dict[str, tuple[float, tuple[Row, ...]]] = {}
    for gen in {generation(r.gpu) for r in ROWS}:
        rows = tuple(r for r in ROWS if generation(r.gpu) == gen)
        worst = max(abs(throughput_error(r)) for r in rows)
        out[gen] = (math.ceil(worst * 100) / 100, rows)
    return out


def calibration_of(gpu: GpuSpec) -> tuple[float | None, list[str]]:
    """(error_band, calibrated_from) for a candidate on `gpu`: the largest relative throughput error of the
    published rows of its generation, rounded up to a percent, and those rows (marked where they ran on another
    GPU of the generation, e.g. A100 rows for an A10G). A generation without rows of its own borrows another's
    constant (jobs.planning.timing.BORROWED): no band, and calibrated_from says whose rows it borrows."""
    bands = _bands()
    borrowed = generation(gpu)
    if borrowed not in bands:
        return None, []
    band, rows = bands[borrowed]
    named = [f"{r.label} ({r.source})" for r in rows]
    if gpu.generation != borrowed:
        return None, [f"none of its own: {gpu.generation} borrows {borrowed}'s fit to {n}" for n in named]
    return band, [n if r.gpu == gpu else f"another {borrowed} GPU: {n}" for r, n in zip(rows, named, strict=True)]


def table() -> str:
    lines = [f"{'row':48s} {'unit':>13s} {'predicted':>10s} {'measured':>10s} {'throughput':>10s}"]
    for r in ROWS:
        lines.append(f"{r.label:48s} {r.unit:>13s} {predict(r):10.5g} {r.measured:10.5g} "
                     f"{100 * throughput_error(r):+9.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
