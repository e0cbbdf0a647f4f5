"""Candidate layouts for one instance shape, each sized: memory per GPU, step time, hours, cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.hyperparameters import INTERLEAVED, PIPELINE_SCHEDULES
from contract.parallel import ParallelDims, layer_split_problems, microbatches, stages_per_rank
from jobs.catalog import SPOT_SAVINGS, InstanceSpec, lookup
from jobs.planning.cadence import Cadence, cadence, state_bytes
from jobs.planning.layout import SIZED_STRATEGIES, Layout, Numerics, given_stages
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
    per_group: bool = False  # micro_batch_per_group: the micro-batch is a batch group's (sized_numerics)
    # fsdp_accumulation where it matters (FSDP accumulating over micro-batches without a pipeline), else None
    accumulation: str | None = None

    @property
    def fits(self) -> bool:
        return self.memory_gib <= self.capacity_gib

    @property
    def headroom_gib(self) -> float:
        return self.capacity_gib - self.memory_gib

    def hyperparameters(self) -> dict[str, Any]:
        """The hyperparameters a request needs to run this candidate as sized: a grouped batch, FSDP's unsharded
        accumulation (sharded is the package's default)."""
        return {**({"micro_batch_per_group": True} if self.per_group else {}),
                **({"fsdp_accumulation": "unsharded"} if self.accumulation == "unsharded" else {})}

    def to_dict(self) -> dict[str, Any]:
        lay = self.layout
        # Imported here: jobs.planning.calibration also runs as a script (`python -m`), which an import at the top
        # (through jobs.planning's own imports) would load twice.
        from jobs.planning.calibration import calibration_of
        band, rows = calibration_of(lookup(self.instance_type).gpu)
        hyperparameters = self.hyperparameters()
        return {
            "strategy": lay.strategy, "degrees": lay.degrees(),
            # the request's strategy and `parallel` section that run it (and the hyperparameter a grouped batch needs)
            "request": {**lay.request_fields(), **({"hyperparameters": hyperparameters} if hyperparameters else {})},
            "fsdp_accumulation": self.accumulation,
            "instance_type": self.instance_type, "instance_count": lay.nodes, "gpus": lay.gpus,
            "micro_batch_size": self.micro_batch, "samples_per_step": self.step_samples,
            "memory_per_gpu_gib": round(self.memory_gib, 2), "headroom_gib": round(self.headroom_gib, 2),
            "fits": self.fits, "step_time_s": round(self.step_time_s, 4),
            "throughput": round(self.throughput, 1), "throughput_unit": self.throughput_unit,
            "scaling_efficiency": round(self.scaling_efficiency, 3), "pipeline_bubble": round(self.bubble, 3),
            "pipeline_schedule": lay.schedule if lay.pipeline > 1 else None,
            "pipeline_microbatches": lay.microbatches if lay.pipeline > 1 else None,
            "pipeline_stages_per_rank": lay.stages_per_rank if lay.pipeline > 1 else None,
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


# The schedules the planner considers for every pipeline, of the training package's (contract.hyperparameters.
# PIPELINE_SCHEDULES), plus the request's own when it names another: gpipe has 1F1B's bubble and keeps every
# micro-batch's activations, so it is no candidate of the planner's own.
PLANNED_SCHEDULES = tuple(s for s in PIPELINE_SCHEDULES if s != "gpipe")
SHOWN_PER_STRATEGY = 2  # the table's rows per strategy and shape (see shown)


def layouts(m: ModelFacts, nodes: int, per_node: int, pp_microbatches: int | None = None,
            schedule: str = "1f1b") -> list[Layout]:
    """Every layout the training package runs for this model over nodes x per_node GPUs, simplest strategy first:
    data parallel (ddp, fsdp, hsdp), tensor parallel at each degree dividing a node's GPUs (the rest sharded),
    and pipelines (tensor inside a stage when heads allow) at each degree whose stages tile the nodes: fewer
    stages than nodes (several pipeline replicas, FSDP over them), one per node, or several per node; each with
    the 1F1B and the interleaved schedule (at each count of stages a rank that splits the layers equally), and
    `schedule` (the request's)."""
    world = nodes * per_node
    if world == 1:
        return [Layout(1, 1)]
    out = [Layout(nodes, per_node, replicate=world), Layout(nodes, per_node, shard=world)]
    if nodes > 1 and per_node > 1:
        out.append(Layout(nodes, per_node, replicate=nodes, shard=per_node))
    tensors = [t for t in range(2, per_node + 1) if per_node % t == 0 and m.heads and m.heads % t == 0]
    out += [Layout(nodes, per_node, shard=world // t, tensor=t) for t in tensors]
    schedules = tuple(dict.fromkeys((*PLANNED_SCHEDULES, schedule)))
    pipelines = [_pipelines(m, nodes, per_node, t, pp_microbatches, schedules) for t in (1, *tensors)]
    return out + [lay for group in pipelines for lay in group]


def _pipelines(m: ModelFacts, nodes: int, per_node: int, tensor: int, given: int | None,
               schedules: tuple[str, ...]) -> list[Layout]:
    """Pipelines with this tensor degree: a stage (world / pipeline consecutive ranks, the mesh's outermost
    dimension) is whole nodes or a part of one node, never straddling two; FSDP shards it over its data ranks."""
    world, out = nodes * per_node, []
    for p in range(2, world // tensor + 1):
        stage = world // p
        if world % p or stage % tensor or (per_node % stage if stage < per_node else stage % per_node):
            continue
        for schedule in schedules:
            for v in _stages_per_rank(m.layers, p, schedule):
                out.append(Layout(nodes, per_node, shard=stage // tensor, tensor=tensor, pipeline=p,
                                  microbatches=microbatches(given, p), schedule=schedule,
                                  virtual=given_stages(schedule, v)))
    return out


def _stages_per_rank(layers: int, pipeline: int, schedule: str) -> list[int]:
    """The stages a rank may hold on this schedule: one, or for the interleaved schedule every count from two whose
    stages split the layers equally (the request's rule, contract.parallel.layer_split_problems). More stages a
    rank shrink the bubble and add point-to-point hops; the time model weighs the two."""
    if schedule != INTERLEAVED:
        return [1] if layers >= pipeline else []
    return [v for v in range(2, layers // pipeline + 1) if not layer_split_problems(pipeline, schedule, layers, given=v)]


def shown(cands: list[Candidate], keep: tuple[Candidate | None, ...] = ()) -> list[Candidate]:
    """The rows `trainctl plan` shows of one shape's candidates: per strategy the SHOWN_PER_STRATEGY fastest that
    fit (none fitting: the one needing the least memory), and `keep` (the recommendation, auto's pick), in the
    candidates' order. Variants of a strategy that are slower than its best two decide nothing the table's
    reader decides (which strategy, how fast, how full) and would bury the strategies under dozens of degree
    combinations (gpt 7b on 4 nodes x 8 GPUs: 33 layouts)."""
    picked: set[int] = {id(c) for c in keep if c is not None}
    for strategy in dict.fromkeys(c.layout.strategy for c in cands):
        mine = [c for c in cands if c.layout.strategy == strategy]
        fitting = sorted((c for c in mine if c.fits), key=lambda c: -c.throughput)
        picked |= {id(c) for c in (fitting[:SHOWN_PER_STRATEGY] or [min(mine, key=lambda c: c.memory_gib)])}
    return [c for c in cands if id(c) in picked]


def requested_layouts(cands: list[Candidate], request: Any) -> list[Candidate]:
    """The candidates that are the layout a request names: the degrees its strategy and `parallel` section resolve
    to on each candidate's GPUs (contract.parallel.ParallelDims.resolve: hsdp on one node is fsdp there), and a
    pipeline's schedule. None for auto and smp, which name no degrees."""
    strategy, p = request.strategy.value, request.parallel
    if strategy not in SIZED_STRATEGIES:
        return []
    degrees = (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.hybrid_shard_degree) if p else (1, 1, 0)
    return [c for c in cands
            if c.layout.dims == ParallelDims.resolve(strategy, c.layout.gpus, c.layout.gpus_per_node, *degrees)
            and (c.layout.pipeline == 1 or p is None or (
                c.layout.schedule == p.pipeline_schedule
                and c.layout.stages_per_rank == stages_per_rank(p.pipeline_schedule, p.pipeline_stages_per_rank)))]


def runnable(lay: Layout, n: Numerics, m: ModelFacts, given: int | None) -> Layout | None:
    """`lay` as the training package would run it with numerics `n`, or None where it refuses it (contract.parallel's
    rules, the request's own check), so that no candidate, and no recommendation, carries fields a request is
    refused with. A pipeline the request gives no micro-batch count keeps the default (two a stage) where the samples
    a pipeline step gets split into it, else takes the fewest, at least one a stage, that they split into."""
    def problems(layout: Layout) -> list:
        return layout.problems(m.layers, m.heads, n.micro_batch, n.per_group)

    if lay.pipeline > 1 and given is None and problems(lay):
        pooled = lay.forward_batch(n.micro_batch, n.per_group) * lay.microbatches  # the samples a step splits
        counts = (c for c in range(lay.pipeline, int(pooled) + 1) if pooled % c == 0)
        lay = next((t for t in (dataclasses.replace(lay, microbatches=c) for c in counts) if not problems(t)), lay)
    return None if problems(lay) else lay


def sized_numerics(n: Numerics, lay: Layout) -> Numerics | None:
    """The numerics `lay` runs with: the micro-batch lowered so global_batch_size splits evenly over the ranks that
    read micro-batches (Numerics.fitted). A tensor/pipeline layout with more ranks than the global batch has
    samples reads one micro-batch per batch group (micro_batch_per_group) where that splits; None when neither."""
    fitted = n.fitted(n.readers(lay))
    if fitted is None and lay.dims.splits_layers and not n.per_group:
        grouped = dataclasses.replace(n, per_group=True)
        fitted = grouped.fitted(grouped.readers(lay))
    return fitted


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
    candidate has no cost). Where FSDP accumulates over micro-batches and the request left fsdp_accumulation to the
    planner, the layout is sized both ways: unsharded gradients (one reduce-scatter a step) where they fit, else
    sharded ones (a reduce-scatter every micro-batch, a shard of the gradients' memory)."""
    if lay.fsdp_accumulation_applies and n.accum(n.readers(lay)) > 1:
        if n.accumulation_given:
            return _evaluate(m, n, spec, lay, sizing, spot, price_usd_hour, n.accumulation)
        unsharded = _evaluate(m, dataclasses.replace(n, accumulation="unsharded"), spec, lay, sizing, spot, price_usd_hour,
                              "unsharded")
        if unsharded.fits:
            return unsharded
        return _evaluate(m, dataclasses.replace(n, accumulation="sharded"), spec, lay, sizing, spot, price_usd_hour, "sharded")
    return _evaluate(m, n, spec, lay, sizing, spot, price_usd_hour, None)


def _evaluate(m: ModelFacts, n: Numerics, spec: InstanceSpec, lay: Layout, sizing: Any, spot: bool,
              price_usd_hour: float | None, accumulation: str | None) -> Candidate:
    mem = memory_per_gpu(m, n, lay)
    st = step_time(m, n, spec, lay)
    step_samples = n.step_samples(n.readers(lay))  # what the training package trains on per optimizer step
    samples_s = step_samples / st.total
    ideal = n.micro_batch / micro_compute(m, n, spec, Layout(1, 1))  # one GPU, no communication
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
        spot=spot, cadence=cad, bubble=st.bubble, step_samples=step_samples, micro_batch=n.micro_batch,
        per_group=n.per_group and lay.dims.splits_layers, accumulation=accumulation)


def best(cands: list[Candidate], allowed: Callable[[Candidate], bool] | None = None) -> Candidate | None:
    """Highest throughput that fits (among those `allowed`); within 2% the simpler strategy wins (the order
    layouts() lists the strategies in, counted over all of `cands` so that a filter does not change the ranking;
    variants of one strategy rank by throughput alone, the first listed on a tie)."""
    rank = {s: i for i, s in enumerate(dict.fromkeys(c.layout.strategy for c in cands))}
    pool = [c for c in cands if c.fits and (allowed is None or allowed(c))]
    return max(pool, key=lambda c: c.throughput / 1.02 ** rank[c.layout.strategy]) if pool else None
