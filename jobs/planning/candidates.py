"""Candidate layouts for one instance shape, each sized: memory per GPU, step time, hours, cost."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jobs.catalog import SPOT_SAVINGS, InstanceSpec, lookup
from jobs.planning.cadence import Cadence, cadence, state_bytes
from jobs.planning.layout import Layout, Numerics
from jobs.planning.memory import memory_per_gpu
from jobs.planning.shape import ModelFacts
from jobs.planning.timing import micro_compute, step_time

STARTUP_HOURS = 0.15  # billed provisioning and image download before the first step (SageMaker Downloading)


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    instance_type: str
    memory_gib: float
    capacity_gib: float
    step_time_s: float
    throughput: float  # samples/s or tokens/s
    throughput_unit: str
    scaling_efficiency: float
    hours: float
    cost_usd: float | None
    cost_on_demand_usd: float | None
    spot: bool
    cadence: Cadence
    bubble: float
    step_samples: int  # samples per optimizer step over the job: micro_batch_size x world x grad accumulation
    micro_batch: int  # micro_batch_size per rank (tensor/pipeline groups pool theirs): the request's, lowered where
    # global_batch_size does not split evenly over the ranks

    @property
    def fits(self) -> bool:
        return self.memory_gib <= self.capacity_gib

    @property
    def headroom_gib(self) -> float:
        return self.capacity_gib - self.memory_gib

    def to_dict(self) -> dict[str, Any]:
        lay = self.layout
        # Imported here: jobs.planning.calibration also runs as a script (`python -m`), which an import at the top
        # (through jobs.planning's own imports) would load twice.
        from jobs.planning.calibration import calibration_of
        band, rows = calibration_of(lookup(self.instance_type).gpu)
        return {
            "strategy": lay.strategy, "degrees": lay.degrees(), "runnable": lay.runnable,
            "instance_type": self.instance_type, "instance_count": lay.nodes, "gpus": lay.gpus,
            "micro_batch_size": self.micro_batch, "samples_per_step": self.step_samples,
            "memory_per_gpu_gib": round(self.memory_gib, 2), "headroom_gib": round(self.headroom_gib, 2),
            "fits": self.fits, "step_time_s": round(self.step_time_s, 4),
            "throughput": round(self.throughput, 1), "throughput_unit": self.throughput_unit,
            "scaling_efficiency": round(self.scaling_efficiency, 3), "pipeline_bubble": round(self.bubble, 3),
            "hours": round(self.hours, 3),
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
            "cost_on_demand_usd": None if self.cost_on_demand_usd is None else round(self.cost_on_demand_usd, 2),
            "spot": self.spot, "checkpoint_minutes": round(self.cadence.interval_min, 1),
            "checkpoint_save_s": round(self.cadence.save_s, 1),
            "work_lost_per_interruption_minutes": round(self.cadence.lost_per_interruption_h * 60, 1),
            # How far the time model has been off on this GPU generation: the largest relative throughput error
            # over the published runs it was fitted to (null where the generation has none), and those runs.
            "error_band": band, "calibrated_from": rows,
        }


def layouts(m: ModelFacts, nodes: int, per_node: int, pp_microbatches: int | None = None) -> list[Layout]:
    """Every strategy that can lay this model over nodes x per_node GPUs."""
    world = nodes * per_node
    if world == 1:
        return [Layout("single", 1, 1)]
    out = [Layout("ddp", nodes, per_node, replicate=world), Layout("fsdp", nodes, per_node, shard=world)]
    if nodes > 1 and per_node > 1:
        out.append(Layout("hsdp", nodes, per_node, replicate=nodes, shard=per_node))
    heads_split = m.heads and per_node > 1 and m.heads % per_node == 0
    if heads_split:
        out.append(Layout("tp", nodes, per_node, shard=nodes, tensor=per_node))
    if nodes > 1 and m.layers >= nodes:
        micro = pp_microbatches or 2 * nodes
        out.append(Layout("pp", nodes, per_node, shard=per_node, pipeline=nodes, microbatches=micro))
        if heads_split:
            out.append(Layout("hybrid", nodes, per_node, tensor=per_node, pipeline=nodes, microbatches=micro))
    return out


def total_samples(m: ModelFacts, n: Numerics, sizing: Any, step_samples: int) -> float:
    """Samples to the end of the data (sizing), else max_steps global batches."""
    if sizing is not None and sizing.dataset_samples:
        return sizing.dataset_samples * sizing.epochs
    if sizing is not None and sizing.dataset_tokens:
        return sizing.dataset_tokens / max(m.tokens, 1) * sizing.epochs
    return n.max_steps * step_samples


def evaluate(m: ModelFacts, n: Numerics, spec: InstanceSpec, lay: Layout, sizing: Any, spot: bool,
             price_usd_hour: float | None = None) -> Candidate:
    """`price_usd_hour`: on-demand training USD per instance-hour from the plan's price table; None: unknown (the
    candidate has no cost)."""
    mem = memory_per_gpu(m, n, lay)
    st = step_time(m, n, spec, lay)
    step_samples = n.step_samples(lay.gpus)  # what the training package pools per optimizer step
    samples_s = step_samples / st.total
    ideal = n.micro_batch / micro_compute(m, n, spec, Layout("single", 1, 1))  # one GPU, no communication
    tokens = m.kind == "decoder"
    cad = cadence(state_bytes(m, n), lay.nodes, spot, n.async_checkpoint)
    train_h = total_samples(m, n, sizing, step_samples) / samples_s / 3600
    hours = STARTUP_HOURS + train_h * (1 + cad.overhead)
    on_demand = None if price_usd_hour is None else hours * price_usd_hour * lay.nodes
    cost = None if on_demand is None else on_demand * ((1 - SPOT_SAVINGS) if spot else 1.0)
    return Candidate(
        layout=lay, instance_type=spec.instance_type, memory_gib=mem.needed_gib,
        capacity_gib=float(spec.accelerator_memory_gib), step_time_s=st.total,
        throughput=samples_s * (m.tokens if tokens else 1), throughput_unit="tokens/s" if tokens else "samples/s",
        scaling_efficiency=samples_s / (ideal * lay.gpus), hours=hours, cost_usd=cost, cost_on_demand_usd=on_demand,
        spot=spot, cadence=cad, bubble=st.bubble, step_samples=step_samples, micro_batch=n.micro_batch)


def best(cands: list[Candidate], allowed: Callable[[Candidate], bool] | None = None) -> Candidate | None:
    """Highest throughput that fits (among those `allowed`); within 2% the simpler strategy wins (the order
    layouts() lists them in, counted over all of `cands` so that a filter does not change the ranking)."""
    pool = [c for c in cands if c.fits and (allowed is None or allowed(c))]
    return max(pool, key=lambda c: c.throughput / 1.02 ** cands.index(c)) if pool else None
