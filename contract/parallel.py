"""The parallel layouts' facts, once: the degrees a layout is (`ParallelDims`), the strategy they derive, the
mesh they make, the rank map, and the rules the degrees obey. Standard library only.

Degrees are the fact and the strategy is derived from them (torchtitan's `ParallelDims` shape): a request's or a
hyperparameter's `strategy` names degrees (`ParallelDims.resolve`: `ddp` is every rank a replica, `fsdp` every rank
a shard, `hsdp` shards within a host and replicates across, `tp`/`pp`/`hybrid` split layers), and what runs,
what the planner prices and what a plan prints read the degrees back (`ParallelDims.strategy`). So a layout
that degenerates runs as what it is: `hsdp` on one host is `fsdp`, on hosts of one GPU `ddp`; anything on one
rank is `single`.

Two audiences read the same rules: the launcher checks a request (`parallel.tensor_parallel_degree`, "GPUs",
"instances") and the training package checks its hyperparameters (`tp_degree`, "processes", "hosts").
Each rule is written once; an `Audience` says how a problem names its field and counts.

The mesh's dimensions, outermost first: `pp` (pipeline stages), `dp_replicate` (full copies), `dp_shard`
(FSDP2 shards), `tp` (tensor parallel). Ranks fill it row-major and torchrun numbers them host after host,
so the innermost dimensions are contiguous ranks on one host: tensor groups (every layer talks inside them)
and hsdp's shard groups stay in a node; only pipeline hops and replica all-reduces cross the network.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.errors import Problem
from contract.hyperparameters import INTERLEAVED, Strategy

# The strategies that build the mesh below.
MODEL_PARALLEL = (Strategy.HSDP, Strategy.TP, Strategy.PP, Strategy.HYBRID)
DATA_ONLY = (Strategy.SINGLE, Strategy.DDP, Strategy.FSDP)  # the strategies that split no layers
# The torch-native ones that split layers (batch groups of several ranks).
LAYER_SPLITTING = (Strategy.TP, Strategy.PP, Strategy.HYBRID)
DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
DEFAULT_MICROBATCHES_PER_STAGE = 2  # pp_microbatches' default: twice the pipeline degree


@dataclass(frozen=True)
class ParallelDims:
    """A layout: its degrees over the mesh's dimensions (DIMS, outermost first). The strategy, the mesh and
    whether layers are split are read from them, never stated beside them."""

    pp: int = 1
    replicate: int = 1
    shard: int = 1
    tp: int = 1

    @classmethod
    def resolve(cls, strategy: str, world: int, per_host: int, tensor: int = 1, pipeline: int = 1,
                shard: int = 0) -> ParallelDims:
        """The degrees a strategy name and its `parallel` degrees make on `world` ranks of `per_host` each
        (assumes `layout_problems` found none). `shard` 0 is the default: hsdp shards within a host, the others
        over every data rank."""
        if strategy == "single":
            return cls()
        if strategy == "ddp":
            return cls(replicate=world)
        data = max(1, world // (tensor * pipeline))
        if not shard:
            shard = min(data, max(1, per_host // tensor)) if strategy == "hsdp" else data
        return cls(pp=pipeline, replicate=max(1, data // shard), shard=shard, tp=tensor)

    @property
    def strategy(self) -> Strategy:
        """The strategy these degrees run: layer splitting first (tp, pp, hybrid, each with FSDP2 over its data
        ranks), then how the data ranks hold the model (hsdp, fsdp, ddp), else one rank (single)."""
        if self.splits_layers:
            return degrees_strategy(self.tp, self.pp)
        if self.shard > 1:
            return Strategy.HSDP if self.replicate > 1 else Strategy.FSDP
        return Strategy.DDP if self.replicate > 1 else Strategy.SINGLE

    @property
    def splits_layers(self) -> bool:
        """Tensor or pipeline parallel: a batch group of several ranks trains one model on one batch."""
        return self.tp > 1 or self.pp > 1

    @property
    def builds_mesh(self) -> bool:
        """Runs on the 4-D mesh (MODEL_PARALLEL); ddp and fsdp use one dimension of every rank."""
        return self.strategy in MODEL_PARALLEL

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.replicate, self.shard, self.tp)

    @property
    def data(self) -> int:
        """The batch groups: ranks that train on different samples."""
        return self.replicate * self.shard

    @property
    def world(self) -> int:
        return self.pp * self.data * self.tp

    def coordinates(self, rank: int) -> dict[str, int]:
        """A global rank's place in the mesh: pipeline stage, replica, shard, tensor rank (row-major over DIMS)."""
        rest, tp = divmod(rank, self.tp)
        rest, shard = divmod(rest, self.shard)
        pp, replica = divmod(rest, self.replicate)
        return {"pipeline": pp, "replica": replica, "shard": shard, "tensor": tp}


@dataclass(frozen=True)
class Audience:
    """How a problem names its fields (the path) and what it counts (GPUs of instances, processes of hosts)."""

    tensor: str
    pipeline: str
    shard: str
    microbatches: str
    stages_per_rank: str
    micro_batch_size: str
    degrees: str  # "{tensor}", "{pipeline}", "{product}" filled in
    world: str  # "{world}", "{hosts}", "{per_host}" filled in
    per_host: str
    hosts: str

    @staticmethod
    def name(path: str) -> str:
        return path.rsplit(".", 1)[-1]


REQUEST = Audience(
    tensor="parallel.tensor_parallel_degree", pipeline="parallel.pipeline_parallel_degree",
    shard="parallel.hybrid_shard_degree", microbatches="parallel.pipeline_microbatches",
    stages_per_rank="parallel.pipeline_stages_per_rank", micro_batch_size="hyperparameters.micro_batch_size",
    degrees="tensor {tensor} x pipeline {pipeline} = {product}",
    world="the {world} GPUs ({hosts} x {per_host})", per_host="the {per_host} GPUs of one instance", hosts="instances")
HYPERPARAMETERS = Audience(
    tensor="tp_degree", pipeline="pp_degree", shard="dp_shard", microbatches="pp_microbatches",
    stages_per_rank="pp_stages_per_rank", micro_batch_size="micro_batch_size",
    degrees="tp_degree={tensor} x pp_degree={pipeline}",
    world="the world size {world}", per_host="the {per_host} processes per host", hosts="hosts")


DEFAULT_INTERLEAVED_STAGES = 2  # pp_stages_per_rank's default under the interleaved schedule


def stages_per_rank(schedule: str, given: int | None = None) -> int:
    """Model stages each pipeline rank holds: pp_stages_per_rank for the interleaved schedule (default two; more
    shrink the bubble to (p - 1) / (v m + p - 1) at v point-to-point hops a micro-batch), one for the others."""
    if schedule != INTERLEAVED:
        return 1
    return given or DEFAULT_INTERLEAVED_STAGES


def stages_problems(schedule: str, given: int | None, a: Audience = REQUEST) -> list[Problem]:
    """pp_stages_per_rank against the schedule: several stages a rank need the interleaved schedule, and the
    interleaved schedule needs several (with one it is 1F1B with more bookkeeping)."""
    name = a.name(a.stages_per_rank)
    if given is None:
        return []
    if schedule == INTERLEAVED and given < 2:
        return [Problem(a.stages_per_rank, f"{name}={given} with the {INTERLEAVED} schedule, which loops at least 2 "
                        f"stages a rank: use schedule 1f1b for one stage a rank, or {name} >= 2")]
    if schedule != INTERLEAVED and given != 1:
        return [Problem(a.stages_per_rank, f"{name}={given} needs the {INTERLEAVED} schedule (the {schedule} "
                        f"schedule runs one stage a rank): set the schedule to {INTERLEAVED}, or leave {name} unset")]
    return []


def microbatches(given: int | None, pipeline: int) -> int:
    """pp_microbatches, or its default."""
    return given or DEFAULT_MICROBATCHES_PER_STAGE * pipeline


def batch_ranks(world: int, tensor: int = 1, pipeline: int = 1, per_group: bool = False) -> int:
    """The ranks that each read their own micro-batch (contract.hyperparameters.batch_layout's world size): every
    rank, tensor and pipeline ranks too (a batch group pools its ranks' micro-batches); with
    micro_batch_per_group, one per batch group, whose ranks read the same samples."""
    return world // (tensor * pipeline) if per_group else world


def degrees_strategy(tensor: int, pipeline: int) -> Strategy | None:
    """The torch-native strategy that splits layers into these degrees (None when neither splits)."""
    return {(True, False): Strategy.TP, (False, True): Strategy.PP, (True, True): Strategy.HYBRID}.get(
        (tensor > 1, pipeline > 1))


def strategy_degree_problems(strategy: str, tensor: int, pipeline: int, a: Audience = REQUEST) -> list[Problem]:
    """Contradictions between the strategy and its tensor/pipeline degrees (known before the world size)."""
    tn, pn = a.name(a.tensor), a.name(a.pipeline)
    rules = {
        "hsdp": (tensor == 1 and pipeline == 1, f"shards data only, but {tn}={tensor}, {pn}={pipeline}: use "
                 "strategy 'tp', 'pp' or 'hybrid', or set both degrees to 1"),
        "tp": (tensor >= 2 and pipeline == 1, f"needs {tn} >= 2 and {pn} 1 (got {tensor}, {pipeline}): set {tn}, "
               "or use 'hybrid' with a pipeline"),
        "pp": (pipeline >= 2 and tensor == 1, f"needs {pn} >= 2 and {tn} 1 (got {pipeline}, {tensor}): set {pn}, "
               "or use 'hybrid' with tensor parallelism"),
        "hybrid": (pipeline >= 2 and tensor >= 2, f"needs {pn} >= 2 and {tn} >= 2 (got {pipeline}, {tensor}): "
                   "use 'tp' or 'pp' for one of them"),
    }
    if strategy in rules:
        ok, why = rules[strategy]
        return [] if ok else [Problem("strategy", f"strategy '{strategy}' {why}")]
    if strategy == "auto":
        return _auto_degree_problems(tensor, pipeline, a)
    if strategy in DATA_ONLY and (tensor > 1 or pipeline > 1):
        field, value = (a.tensor, tensor) if tensor > 1 else (a.pipeline, pipeline)
        return [Problem(field, f"strategy '{strategy}' splits no layers, but {a.name(field)}={value}: only the "
                        "smp strategy and tp, pp, hybrid split layers; use one of them, or set it to 1")]
    return []


def _auto_degree_problems(tensor: int, pipeline: int, a: Audience) -> list[Problem]:
    """`strategy: auto` refuses layer-splitting degrees rather than ignoring them. Honouring them would make
    auto exactly the strategy those degrees name (the section cannot tell "unset" from 1), and auto re-sizes
    its degrees for each attempt's instance type (a capacity retry on a fallback type), which fixed degrees
    contradict: so the request says which strategy to write instead."""
    named = degrees_strategy(tensor, pipeline)
    return [Problem(field, f"{a.name(field)}={value} is set, but strategy 'auto' picks its own degrees and would "
                           f"ignore it: set strategy '{named}' to run these degrees yourself, or leave "
                           f"{a.name(field)} at 1 for auto to choose")
            for field, value in ((a.tensor, tensor), (a.pipeline, pipeline)) if value > 1]


def layout_problems(strategy: str, *, hosts: int, per_host: int, tensor: int = 1, pipeline: int = 1,
                    shard: int = 0, microbatches: int | None = None, schedule: str = "1f1b",
                    n_layer: int | None = None, n_head: int | None = None, micro_batch_size: int | None = None,
                    a: Audience = REQUEST, per_group: bool = False, stages: int | None = None) -> list[Problem]:
    """Every reason this layout cannot run on `hosts` x `per_host` GPUs, each naming its field.
    `n_layer`/`n_head`: the model's shape when known; `micro_batch_size` when the pipeline's split is checked;
    `stages`: pp_stages_per_rank as given (None: the schedule's default)."""
    problems = strategy_degree_problems(strategy, tensor, pipeline, a)
    if strategy not in MODEL_PARALLEL or problems:
        return problems
    world = hosts * per_host
    if world % (tensor * pipeline):
        return [Problem(a.tensor if tensor > 1 else a.pipeline, (
            f"{a.degrees.format(tensor=tensor, pipeline=pipeline, product=tensor * pipeline)} does not divide "
            f"{a.world.format(world=world, hosts=hosts, per_host=per_host)}: choose degrees whose product divides "
            "the GPU count"))]
    if tensor > 1 and per_host % tensor:
        problems.append(Problem(a.tensor, (
            f"{a.name(a.tensor)}={tensor} does not divide {a.per_host.format(per_host=per_host)}: a tensor group "
            f"would span {a.hosts} (every layer would talk over the network); choose a divisor of the GPUs per "
            "instance")))
    problems += _shard_problems(strategy, per_host, tensor, pipeline, shard, world, a)
    if n_head and tensor > 1 and n_head % tensor:
        problems.append(Problem(a.tensor, f"{a.name(a.tensor)}={tensor} does not divide the model's {n_head} "
                                "attention heads: choose a degree that divides the head count"))
    if pipeline > 1:
        problems += stages_problems(schedule, stages, a)
        problems += layer_split_problems(pipeline, schedule, n_layer, a, stages)
        problems += microbatch_problems(microbatches, pipeline, tensor, micro_batch_size, a, schedule, per_group)
    return problems


def _shard_problems(strategy: str, per_host: int, tensor: int, pipeline: int, shard: int, world: int,
                    a: Audience) -> list[Problem]:
    data = world // (tensor * pipeline)
    if not shard:
        return []
    if data % shard:
        return [Problem(a.shard, f"{a.name(a.shard)}={shard} does not divide the {data} data-parallel ranks "
                        f"(world {world} / ({a.name(a.tensor)} {tensor} x {a.name(a.pipeline)} {pipeline})): "
                        "choose a divisor")]
    if strategy == "hsdp" and per_host % (shard * tensor) and shard < data:
        return [Problem(a.shard, f"{a.name(a.shard)}={shard}: shard groups of {shard} do not fit "
                        f"{a.per_host.format(per_host=per_host)} and would span {a.hosts}; use a divisor of it")]
    return []


def layer_split_problems(pipeline: int, schedule: str, n_layer: int | None, a: Audience = REQUEST,
                         given: int | None = None) -> list[Problem]:
    """The request's rule that a pipeline's stages hold equally many layers (the model's shape when known)."""
    per_rank = stages_per_rank(schedule, given)
    stages = pipeline * per_rank
    if n_layer and n_layer % stages:
        return [Problem(a.stages_per_rank if given else a.pipeline, (
            f"the model's {n_layer} layers do not split into {stages} equal stages ({a.name(a.pipeline)} {pipeline} "
            f"x {per_rank} per rank for {schedule}): choose a pipeline degree "
            f"{'and ' + a.name(a.stages_per_rank) + ' ' if schedule == INTERLEAVED else ''}whose stage count "
            "divides the layers"))]
    return []


def microbatch_problems(given: int | None, pipeline: int, tensor: int, micro_batch_size: int | None,
                        a: Audience = REQUEST, schedule: str = "1f1b", per_group: bool = False) -> list[Problem]:
    """A pipeline step splits the batch group's pooled micro-batches (micro_batch_size x pipeline x tensor
    ranks) into pp_microbatches: at least one per stage, and a divisor of the pooled samples. The interleaved
    schedule runs them in rounds of about one per stage (torch's ScheduleInterleaved1F1B refuses a count that
    its rounds, count // stages, do not divide)."""
    m, name = microbatches(given, pipeline), a.name(a.microbatches)
    if m < pipeline:
        return [Problem(a.microbatches, f"{name}={m} is fewer than the {pipeline} pipeline stages: the pipeline "
                        f"would never fill; use at least {a.name(a.pipeline)} micro-batches (default "
                        f"{DEFAULT_MICROBATCHES_PER_STAGE} x)")]
    rounds = m // pipeline
    if schedule == INTERLEAVED and m % rounds:
        return [Problem(a.microbatches, f"{name}={m} does not split into the interleaved schedule's {rounds} rounds "
                        f"({m} // {a.name(a.pipeline)} {pipeline}): use a multiple of {a.name(a.pipeline)}")]
    pooled = (micro_batch_size or 0) * (1 if per_group else pipeline * tensor)
    if micro_batch_size and pooled % m:
        how = "per batch group" if per_group else \
            f"x {a.name(a.pipeline)} {pipeline} x {a.name(a.tensor)} {tensor}"
        return [Problem(a.microbatches, (
            f"{name}={m} does not divide the {pooled} samples a pipeline step gets ({a.name(a.micro_batch_size)} "
            f"{micro_batch_size} {how}): change it or {a.micro_batch_size}"))]
    return []


def parallel_hyperparameters(strategy: str, tensor: int = 1, pipeline: int = 1, shard: int = 0,
                             microbatches: int | None = None, schedule: str = "1f1b",
                             stages: int | None = None) -> dict:
    """The hyperparameters the launcher sends for a torch-native strategy (contract.hyperparameters names): a
    request's `parallel` section (jobs.request.parallelism) or the planner's pick (jobs.planning.layout)."""
    if strategy not in MODEL_PARALLEL:
        return {}
    hps = {"tp_degree": tensor, "pp_degree": pipeline, "dp_shard": shard, "pp_schedule": schedule}
    if microbatches is not None:
        hps["pp_microbatches"] = microbatches
    if stages is not None:
        hps["pp_stages_per_rank"] = stages
    return hps
