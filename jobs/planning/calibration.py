"""Published training runs and the package's own runs the time model is fitted to, the planner's figure for each,
and what that says about the planner's error per GPU generation (the `error_band` and `calibrated_from` of
`trainctl plan --json`).

Each published row is laid out as the planner lays a run out and sized by its real functions (shape_facts, numerics,
step_time with its stack's efficiencies: PUBLISHED, or MEGATRON for NVIDIA's recipes). Where the planner cannot
express a row's layout, the closest it can is used and `expressed` says how. The rows of
jobs/planning/published_runs.json carry their source, the commit that published them, their table and their text;
every second row of each table, in its published order, is held out (chosen before any fit): those check the fit,
the others and ROWS are fitted to.

Read and not used, so that nobody reads them again for this: torchtitan's H100 rows (the 96 GB H100 capped at 500 W,
a GPU the catalog lacks; its H200 rows are Float8); NVIDIA Megatron-Bridge's performance summary and archive (25.09 to
26.02: every dense H100 row is FP8, the BF16 ones are mixture-of-experts); MLPerf's and NVIDIA's H200 training figures
(FP8). No source read publishes a bf16 peak memory for a stack modelled here on an 80 GB part.

    python -m jobs.planning.calibration    # each row: predicted, measured, error; held-out summary
    python -m tools.fit_planner            # fit the constants again (scipy), print them beside the code's
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jobs.catalog import GPUS, GpuSpec, lookup
from jobs.planning import timing
from jobs.planning.layout import Layout, numerics
from jobs.planning.shape import model_facts, shape_facts
from jobs.planning.timing import Efficiency, generation, step_time

LLM_FOUNDRY = "llm-foundry scripts/train/benchmarking/README.md"
DGXC = "NVIDIA dgxc-benchmarking (DGX Cloud H100 recipes)"
TORCHTITAN = "torchtitan docs/performance.md (Apr 2024)"
KORTHIKANTI = "Korthikanti et al. 2022, Tables 3 and 5"
PUBLISHED_RUNS = Path(__file__).with_name("published_runs.json")
PUBLISHED_COLLECTIVES = Path(__file__).with_name("published_collectives.json")

# The published runs' stacks (see jobs.planning.timing): fitted with the package's own constants. PUBLISHED is
# llm-foundry's, torchtitan's (Apr 2024) and Megatron's of 2022; MEGATRON is NeMo's Megatron-Core with Transformer
# Engine (2025), a stack apart: its matmuls run faster, it reduces bf16 gradients with its distributed optimizer in
# buckets of max(40M, 1M x data-parallel size) elements (megatron.core.distributed's default bucket_size), and its
# recipes may overlap tensor
# parallelism's collectives with the matmuls (a row's `tensor_overlap`). Its attention is taken at its matmul rate
# (at 2,048-4,096 tokens its rows cannot tell them apart).
PUBLISHED = {"ampere": Efficiency(matmul=0.69, attention=0.53, traffic=3.6, p2p_overlap=True),
             "hopper": Efficiency(matmul=0.55, attention=0.29, traffic=3.6, p2p_overlap=True)}
MEGATRON = {"hopper": Efficiency(matmul=0.67, attention=0.67, traffic=5.6, gradient_bytes=2, bucket_bytes=40e6 * 2,
                                 bucket_bytes_per_rank=1e6 * 2, p2p_overlap=True)}
STACKS = {"published": PUBLISHED, "megatron": MEGATRON}


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
    held_out: bool = False
    stack: str = "published"  # whose efficiencies (STACKS)
    tensor_overlap: bool = False  # the run overlapped tensor parallelism's collectives with its matmuls

    def efficiency(self) -> dict[str, Efficiency]:
        """The stack this row ran on, per generation (with its tensor overlap as the row ran it)."""
        stack = STACKS[self.stack]
        if not self.tensor_overlap:
            return stack
        return {gen: dataclasses.replace(e, tensor_overlap=True) for gen, e in stack.items()}

    @property
    def gpu(self) -> GpuSpec:
        return lookup(self.instance_type).gpu


def mpt_shape(layers: int, hidden: int, heads: int) -> dict[str, Any]:
    """An llm-foundry MPT model's shape (its 50,368-entry vocabulary, sequences of 2048)."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab_size": 50368, "seq_len": 2048}


A100, H100 = "ml.p4de.24xlarge", "ml.p5.48xlarge"  # A100 80GB and H100 80GB, 8 per node, NVLink, EFA
HAND_ROWS: tuple[Row, ...] = (
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


def _published_row(source: str, run: dict[str, Any]) -> Row:
    """A row of published_runs.json as the planner lays it out: FSDP over every GPU, 8 to a node."""
    gpus, sh = run["gpus"], run["shape"]
    per_node = min(gpus, 8)
    hyperparameters = {"micro_batch_size": run["micro_batch_size"], "grad_accum": run["grad_accum"],
                       "activation_checkpointing": run["activation_checkpointing"]}
    if run["sharding"] == "SHARD_GRAD_OP":  # the gathered weights kept from forward to backward
        hyperparameters["fsdp_reshard_after_forward"] = False
    spec = lookup(run["instance_type"])
    label = (f"{source.split()[0]} {sh['layers']}x{sh['hidden']} seq {sh['seq_len']}, {gpus} x {spec.accelerator} "
             f"{spec.accelerator_memory_gib}GB, micro {run['micro_batch_size']} x {run['grad_accum']}"
             f"{', AC' if run['activation_checkpointing'] else ''}")
    return Row(label, source, sh, run["instance_type"], Layout(gpus // per_node, per_node, shard=gpus),
               hyperparameters, run["tokens_per_s_per_gpu"], "tokens/s/GPU", held_out=run["set"] == "held_out",
               extra={"table": run["table"], "commit": run["commit"], "row": run["row"]})


def _megatron_row(source: str, run: dict[str, Any]) -> Row:
    """A row of a Megatron recipe (tensor x pipeline x data, Megatron's interleaving) as the planner lays it out: the
    data dimension replicated (the distributed optimizer shards only the optimizer's state, which the step time does
    not read), a pipeline step of `grad_accum` micro-batches that one batch group reads at once."""
    gpus, sh, tp, pp = run["gpus"], run["shape"], run["tensor"], run["pipeline"]
    dp = gpus // (tp * pp)
    hyperparameters = {"micro_batch_per_group": True, "global_batch_size": run["global_batch_size"]}
    if pp > 1:
        layout = Layout(gpus // 8, 8, replicate=dp, tensor=tp, pipeline=pp, microbatches=run["grad_accum"],
                        schedule="interleaved_1f1b", virtual=run["virtual"])
        hyperparameters["micro_batch_size"] = run["micro_batch_size"] * run["grad_accum"]
    else:
        layout = Layout(gpus // 8, 8, replicate=dp, tensor=tp)
        hyperparameters["micro_batch_size"] = run["micro_batch_size"]
    label = (f"{run['table'].split(' (')[0]}, {gpus} x H100, TP {tp} x PP {pp}"
             f"{' x VP ' + str(run['virtual']) if pp > 1 else ''} x DP {dp}, micro {run['micro_batch_size']} x "
             f"{run['grad_accum']}")
    expressed = ("sequence parallelism as the planner's tensor parallelism"
                 + (", no recomputation for selective recompute (attention's core)" if run["selective_recompute"]
                    else "") + ("; grouped-query attention as multi-head with the model's parameter count"
                                if "params" in sh else ""))
    return Row(label, source, sh, run["instance_type"], layout, hyperparameters, run["step_seconds"], "s/iteration",
               expressed=expressed, held_out=run["set"] == "held_out", stack="megatron",
               tensor_overlap=run["tensor_overlap"],
               extra={"table": run["table"], "commit": run["commit"], "row": run["row"]})


def _load_published() -> tuple[Row, ...]:
    doc = json.loads(PUBLISHED_RUNS.read_text())
    read = {"published": _published_row, "megatron": _megatron_row}
    return tuple(read[entry.get("stack", "published")](source, run) for source, entry in doc.items()
                 for run in entry["rows"])


ROWS: tuple[Row, ...] = HAND_ROWS + _load_published()
FITTED = tuple(r for r in ROWS if not r.held_out)
HELD_OUT = tuple(r for r in ROWS if r.held_out)

# The package's own step on one H100 80GB (torch 2.11, bf16 autocast, eager unless compiled; bench.step_overhead):
# (model, size, micro-batch, hyperparameters, milliseconds a step).
OWN_RUNS = (("gpt", "1b", 8, {}, 225.7), ("gpt", "1b", 8, {"activation_checkpointing": True}, 269.9),
            ("gpt", "1b", 8, {"compile": True}, 205.5), ("gpt", "350m", 16, {}, 121.3),
            ("vit", "base", 256, {}, 101.3), ("vit", "large", 128, {}, 148.5))
OWN_INSTANCE = "ml.p5.48xlarge"


@dataclass(frozen=True)
class CollectiveRow:
    """One nccl-tests all_reduce measurement: `bytes` per GPU over `nodes` x `gpus_per_node` GPUs."""
    source: str
    instance_type: str
    nodes: int
    gpus_per_node: int
    bytes: int
    seconds: float
    held_out: bool = False


def _load_collectives() -> tuple[CollectiveRow, ...]:
    """Every measured size; every second one of each table (a source's instance type and node count, in its published
    order) held out, as the runs are: chosen before any fit."""
    doc = json.loads(PUBLISHED_COLLECTIVES.read_text())
    rows, seen = [], {}
    for source, entry in doc["sources"].items():
        for r in entry["rows"]:
            table = (source, r["instance_type"], r["nodes"])
            seen[table] = seen.get(table, 0) + 1
            rows.append(CollectiveRow(source, r["instance_type"], r["nodes"], r["gpus_per_node"], r["bytes"],
                                      r["microseconds"] * 1e-6, held_out=seen[table] % 2 == 0))
    return tuple(rows)


COLLECTIVES = _load_collectives()
FITTED_COLLECTIVES = tuple(r for r in COLLECTIVES if not r.held_out)
HELD_OUT_COLLECTIVES = tuple(r for r in COLLECTIVES if r.held_out)


def collective_error(row: CollectiveRow) -> float:
    """The planner's seconds for a measured all-reduce over the measured ones, minus 1."""
    spec = lookup(row.instance_type)
    return timing.collective("ar", row.bytes, spec, row.gpus_per_node, row.nodes, 1) / row.seconds - 1


def own_seconds(run: tuple) -> float:
    """The planner's seconds a step for one of OWN_RUNS (the package's stack)."""
    model, size, micro, flags, _ = run
    n = numerics({"micro_batch_size": micro, "precision": "bf16", **flags})
    return step_time(model_facts(model, size), n, lookup(OWN_INSTANCE), Layout(1, 1)).total


def predict(row: Row) -> float:
    """The planner's figure for a row, in the row's unit, with the published stacks' efficiencies."""
    sh = row.shape
    shape = SimpleNamespace(kind="decoder", layers=sh["layers"], hidden=sh["hidden"], heads=sh["heads"],
                            vocab_size=sh["vocab_size"], seq_len=sh["seq_len"], params=sh.get("params"),
                            flops_per_sample=None, image_size=None, patch_size=None)
    m = shape_facts(shape, sh["seq_len"])
    n = numerics({"precision": "bf16", **row.hyperparameters})
    seconds = step_time(m, n, lookup(row.instance_type), row.layout, row.efficiency()).total
    if row.unit == "s/iteration":
        return seconds
    return n.step_samples(n.readers(row.layout)) * m.tokens / seconds / row.layout.gpus


def throughput_error(row: Row) -> float:
    """Predicted throughput over measured, minus 1 (a time row's ratio inverted)."""
    ratio = predict(row) / row.measured
    return (1 / ratio if row.unit == "s/iteration" else ratio) - 1


def own_error(run: tuple) -> float:
    """The same for one of OWN_RUNS: measured seconds over predicted, minus 1."""
    return run[-1] / 1e3 / own_seconds(run) - 1


@functools.cache
def _bands() -> dict[str, float]:
    """Per generation, the largest held-out throughput error, rounded up to a percent."""
    out: dict[str, float] = {}
    for gen in {generation(r.gpu) for r in HELD_OUT}:
        worst = max(abs(throughput_error(r)) for r in HELD_OUT if generation(r.gpu) == gen)
        out[gen] = math.ceil(worst * 100) / 100
    return out


def gpu_name(gpu: GpuSpec) -> str:
    return next(name for name, spec in GPUS.items() if spec == gpu)


@functools.cache
def _sources(gpu: GpuSpec, gen: str) -> tuple[str, ...]:
    """What a generation's fit rests on, by source: runs on this GPU, and on the generation's others."""
    out = []
    for source in dict.fromkeys(r.source for r in ROWS):
        rows = [r for r in ROWS if r.source == source and generation(r.gpu) == gen]
        if not rows:
            continue
        same = [r for r in rows if r.gpu == gpu]
        held = sum(r.held_out for r in rows)
        where = f"{len(same)} on {gpu_name(gpu)}" + (f", {len(rows) - len(same)} on another {gen} GPU"
                                                 if len(same) < len(rows) else "")
        out.append(f"{source}: {len(rows)} published runs ({where}; {held} held out to check the fit)")
    if gen == generation(lookup(OWN_INSTANCE).gpu):
        out.append(f"the package's own runs on one {gpu_name(lookup(OWN_INSTANCE).gpu)}: {len(OWN_RUNS)}")
    return tuple(out)


def calibration_of(gpu: GpuSpec) -> tuple[float | None, list[str]]:
    """(error_band, calibrated_from) for a candidate on `gpu`: the largest relative throughput error of the
    held-out published rows of its generation, rounded up to a percent, and what the fit rests on (runs on
    another GPU of the generation said as such, e.g. A100 rows for an A10G). A generation without rows of its own
    borrows another's constants (jobs.planning.timing.BORROWED): no band, and calibrated_from says whose."""
    gen = generation(gpu)
    bands = _bands()
    if gen not in bands:
        return None, []
    if gpu.generation != gen:
        return None, [f"none of its own: {gpu.generation} borrows {gen}'s fit to {s}" for s in _sources(gpu, gen)]
    return bands[gen], list(_sources(gpu, gen))


def summary(rows: tuple[Row, ...]) -> dict[str, dict[str, float]]:
    """Per generation: rows, mean and largest |throughput error|, and how many are beyond 15%."""
    out = {}
    for gen in sorted({generation(r.gpu) for r in rows}):
        errors = [abs(throughput_error(r)) for r in rows if generation(r.gpu) == gen]
        out[gen] = {"rows": len(errors), "mean": statistics.mean(errors), "max": max(errors),
                    "beyond_15": sum(e > 0.15 for e in errors)}
    return out


def table() -> str:
    lines = [f"{'row':72s} {'unit':>13s} {'predicted':>10s} {'measured':>10s} {'throughput':>10s}"]
    for r in ROWS:
        lines.append(f"{r.label + (' [held out]' if r.held_out else ''):72s} {r.unit:>13s} {predict(r):10.5g} "
                     f"{r.measured:10.5g} {100 * throughput_error(r):+9.1f}%")
    for o in OWN_RUNS:
        lines.append(f"{'the package: ' + ' '.join(map(str, o[:4])):72s} {'ms/step':>13s} {own_seconds(o) * 1e3:10.5g} "
                     f"{o[-1]:10.5g} {100 * own_error(o):+9.1f}%")
    errors = [abs(collective_error(r)) for r in COLLECTIVES]
    lines.append(f"collectives (nccl-tests all_reduce): {len(errors)} sizes, mean |error| {100 * statistics.mean(errors):.1f}%, "
                 f"largest {100 * max(errors):.1f}%")
    for name, rows in (("fitted", FITTED), ("held out", HELD_OUT)):
        for gen, s in summary(rows).items():
            lines.append(f"{name} {gen}: {s['rows']} rows, mean |error| {100 * s['mean']:.1f}%, largest "
                         f"{100 * s['max']:.1f}%, {s['beyond_15']} beyond 15%")
    for source in dict.fromkeys(r.source for r in HELD_OUT):  # which source the held-out error comes from
        for gen, s in summary(tuple(r for r in HELD_OUT if r.source == source)).items():
            lines.append(f"  held out {gen}, {source}: {s['rows']} rows, mean |error| {100 * s['mean']:.1f}%, "
                         f"largest {100 * s['max']:.1f}%")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
