"""How a run is laid out (strategy and degrees over nodes x GPUs) and the numerics it trains with.

Numerics come from the request's `hyperparameters` read as the training package reads them: the
defaults are contract.hyperparameters.TrainConfig's, keys may be spelled with dashes.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from contract.hyperparameters import (
    LOSS_CHUNK_TOKENS,
    TRAINING_STRATEGIES,
    TrainConfig,
    canonical_hyperparameters,
)
from contract.parallel import (
    ParallelDims,
    batch_ranks,
    layout_problems,
    parallel_hyperparameters,
    stages_per_rank,
)
from jobs.planning.shape import PlanInputError

DEGREES = ("replicate", "shard", "tensor", "pipeline")
# The strategies whose degrees the planner sizes: every one the training package runs but smp (its own image, and
# SMP's degrees are not the planner's).
SIZED_STRATEGIES = tuple(s for s in TRAINING_STRATEGIES if s != "smp")
# What `strategy: auto` may resolve to: every one the planner sizes. For hsdp, tp, pp and hybrid the renderer sends
# the chosen layout's degrees (jobs.planning.auto_strategy.Plan.parallel), so the job runs the mesh it sized.
AUTO_STRATEGIES = SIZED_STRATEGIES
# Strategies that split layers (contract.parallel.LAYER_SPLITTING): the model must opt in (`tp_plan`, `blocks` and
# `pipeline_edges`), which the reference models do; the planner cannot see whether a model of one's own does.


@dataclass(frozen=True)
class Layout:
    """Degrees over `nodes` instances of `gpus_per_node` GPUs; replicate x shard x tensor x pipeline = GPUs. The
    strategy is what the degrees derive (contract.parallel.ParallelDims), as the training package reads them."""

    nodes: int
    gpus_per_node: int
    replicate: int = 1
    shard: int = 1
    tensor: int = 1
    pipeline: int = 1
    microbatches: int = 1  # per pipeline step
    schedule: str = "1f1b"  # the pipeline's (contract.hyperparameters.PIPELINE_SCHEDULES); no meaning without one
    # Model stages a pipeline rank holds where they are not the schedule's default: the request's
    # parallel.pipeline_stages_per_rank (the package's pp_stages_per_rank; Megatron calls it the virtual pipeline
    # size, jobs.planning.calibration); 0: the schedule's default (contract.parallel.stages_per_rank).
    virtual: int = 0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def data_parallel(self) -> int:
        """Ranks that see different samples."""
        return self.replicate * self.shard

    @property
    def state_split(self) -> int:
        """Ways parameters, gradients and optimizer state are divided."""
        return self.shard * self.tensor * self.pipeline

    # Cached: a plan reads them some ten times per candidate, over thousands of candidates (the instance is frozen).
    @functools.cached_property
    def dims(self) -> ParallelDims:
        return ParallelDims(pp=self.pipeline, replicate=self.replicate, shard=self.shard, tp=self.tensor)

    @functools.cached_property
    def strategy(self) -> str:
        """The strategy these degrees run (and the request's `strategy` that runs them)."""
        return self.dims.strategy

    @property
    def fsdp_accumulation_applies(self) -> bool:
        """Does fsdp_accumulation choose how this layout accumulates? FSDP shards a data dimension and no pipeline
        schedule runs the micro-batches (its PipelineStage decides for itself)."""
        return self.shard > 1 and self.pipeline == 1

    @classmethod
    def of(cls, dims: ParallelDims, nodes: int, gpus_per_node: int, microbatches: int = 1,
           schedule: str = "1f1b", stages: int | None = None) -> Layout:
        """`stages`: pp_stages_per_rank as a job ran it (None: the schedule's default)."""
        return cls(nodes, gpus_per_node, replicate=dims.replicate, shard=dims.shard, tensor=dims.tp,
                   pipeline=dims.pp, microbatches=microbatches, schedule=schedule,
                   virtual=given_stages(schedule, stages))

    def forward_batch(self, micro_batch: float, per_group: bool = False) -> float:
        """Samples one model replica runs per forward pass, as the training package runs them: the ranks of a
        tensor/pipeline batch group pool their micro-batches (training.step.share_batch; with micro_batch_per_group
        they read one), and a pipeline step splits the pooled batch into `microbatches` chunks
        (training.parallel.pipeline_parallel.PipelineSchedule). Fractional where they do not divide: check_parallelism refuses those, the
        sizing still reads."""
        pooled = micro_batch * (1 if per_group else self.tensor * self.pipeline)
        return pooled / self.microbatches if self.pipeline > 1 else pooled

    @property
    def stages_per_rank(self) -> int:
        """Model stages a pipeline rank holds (the interleaved schedule's v: its bubble is that much smaller)."""
        if self.pipeline == 1:
            return 1
        return stages_per_rank(self.schedule, self.virtual or None)

    def chunks(self) -> int:
        """Forward passes in one pipeline step (1 without a pipeline)."""
        return self.microbatches if self.pipeline > 1 else 1

    def degrees(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in DEGREES}

    def problems(self, layers: int | None, heads: int | None, micro_batch_size: int, per_group: bool = False) -> list:
        """contract.parallel.layout_problems of these degrees and schedule, named for the request as
        jobs.request.parallelism.check_parallelism names them (the launcher's and the training package's own check): e.g. a pipeline whose stages do not split the layers, or micro-batches that do not
        divide."""
        return list(_layout_problems(self, layers or None, heads or None, micro_batch_size, per_group))

    def request_fields(self) -> dict[str, Any]:
        """The job request's `strategy` and `parallel` section that run this layout (what `trainctl plan --json`
        shows as a candidate's `request`): degrees other than 1, the shard degree where it is not the default
        (contract.parallel.ParallelDims.resolve), a pipeline's micro-batches and schedule, and its stages a rank
        where they are not the schedule's default."""
        if not self.dims.builds_mesh:
            return {"strategy": self.strategy}
        parallel = {name: value for name, value in (("tensor_parallel_degree", self.tensor),
                                                    ("pipeline_parallel_degree", self.pipeline)) if value > 1}
        default = ParallelDims.resolve(self.strategy, self.gpus, self.gpus_per_node, self.tensor, self.pipeline)
        if self.shard != default.shard:
            parallel["hybrid_shard_degree"] = self.shard
        if self.pipeline > 1:
            parallel |= {"pipeline_microbatches": self.microbatches, "pipeline_schedule": self.schedule}
            if self.virtual:
                parallel["pipeline_stages_per_rank"] = self.virtual
        return {"strategy": self.strategy, "parallel": parallel}

    def hyperparameters(self) -> dict[str, Any]:
        """What the launcher sends for this layout (contract.parallel.parallel_hyperparameters); {} for data-only."""
        return parallel_hyperparameters(self.strategy, self.tensor, self.pipeline,
                                        self.shard if self.dims.builds_mesh else 0,
                                        self.microbatches if self.pipeline > 1 else None, self.schedule,
                                        (self.virtual or None) if self.pipeline > 1 else None)


@dataclass(frozen=True)
class Numerics:
    compute_bytes: int  # bytes of an activation element: 2 (bf16/fp16 autocast) or 4 (fp32)
    optimizer: str
    activation_checkpointing: bool
    micro_batch: int
    seq_len: int | None
    global_batch: int | None
    grad_accum: int | None
    max_steps: int
    reshard_after_forward: bool
    compile: bool
    async_checkpoint: bool
    checkpointing_policy: str = "full"  # what activation_checkpointing recomputes (training.models.speedups)
    checkpoint_every: int = 1  # activation_checkpointing_every: every k-th block checkpointed
    per_group: bool = False  # micro_batch_per_group: a tensor/pipeline batch group reads one micro-batch
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS  # the cross-entropy's chunk (training.loss); 0: computed whole
    # FSDP's accumulation (contract.hyperparameters' fsdp_accumulation), and whether the request chose it (else
    # the planner does, per layout: candidates.evaluate).
    accumulation: str = "sharded"
    accumulation_given: bool = False

    def forward(self, layout: Layout) -> Numerics:
        """These numerics at the micro-batch one forward pass of `layout` runs (Layout.forward_batch)."""
        return _with_micro_batch(self, layout.forward_batch(self.micro_batch, self.per_group))

    def keeps_unsharded_gradients(self, layout: Layout) -> bool:
        """Does an accumulating step of `layout` hold unsharded gradients between its micro-steps? FSDP's (a data
        dimension sharded, no pipeline) only in the `unsharded` mode; a pipeline's schedule always (torch's
        PipelineStage skips the reduce-scatter until its last micro-batch); without FSDP there is nothing to
        shard."""
        return self.accumulation == "unsharded" if layout.fsdp_accumulation_applies else True

    def readers(self, layout: Layout) -> int:
        """The ranks that read their own micro-batches on `layout` (contract.parallel.batch_ranks): the world size
        TrainConfig.batch_layout divides by."""
        return batch_ranks(layout.gpus, layout.tensor, layout.pipeline, layout.dims.splits_layers and self.per_group)

    @property
    def selective(self) -> bool:
        """Per-op (selective) activation checkpointing: attention's and every other matmul's outputs kept."""
        return self.activation_checkpointing and self.checkpointing_policy == "selective"

    def checkpointed_share(self, layers: int) -> float:
        """The share of `layers` blocks that are checkpointed (every checkpoint_every-th, the first included)."""
        if not self.activation_checkpointing or layers <= 0:
            return 0.0
        return -(-layers // self.checkpoint_every) / layers

    def accum(self, world: int) -> int:
        """Micro-batches per optimizer step per rank, as TrainConfig.batch_layout computes it over the world size
        (every rank, tensor and pipeline ranks too; rounded up). A pipeline runs one pipeline step per micro-batch."""
        if self.global_batch is None:
            return self.grad_accum or 1
        return max(1, -(-self.global_batch // (self.micro_batch * world)))

    def fitted(self, world: int) -> Numerics | None:
        """These numerics with the micro-batch lowered so `global_batch_size` splits evenly over the `world` ranks, as
        a user would lower it; None when it cannot (fewer samples than ranks). The training package refuses an uneven
        split (TrainConfig.batch_layout divides by the world size, tensor and pipeline ranks included)."""
        if self.global_batch is None:
            return self
        per_rank, left = divmod(self.global_batch, world)
        if left or per_rank < 1:
            return None
        micro = max(m for m in range(1, min(self.micro_batch, per_rank) + 1) if per_rank % m == 0)
        return dataclasses.replace(self, micro_batch=micro)

    def step_samples(self, world: int) -> int:
        """Samples per optimizer step over the whole job: micro_batch_size x world size x accumulation."""
        return self.micro_batch * world * self.accum(world)


def numerics(hyperparameters: dict[str, Any]) -> Numerics:
    """The request's hyperparameters over TrainConfig's defaults; `precision: auto` is bf16 on GPUs."""
    given = canonical_hyperparameters(hyperparameters)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in given.items() if k in known and k not in ("strategy", "model")})
    for name in ("micro_batch_size", "max_steps", "activation_checkpointing_every"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise PlanInputError(f"hyperparameters.{name}", value, "must be a whole number of at least 1")
    if not isinstance(cfg.loss_chunk_tokens, int) or cfg.loss_chunk_tokens < 0:
        raise PlanInputError("hyperparameters.loss_chunk_tokens", cfg.loss_chunk_tokens,
                             "must be a whole number of at least 0")
    # `auto` is bf16 on a GPU (training.precision); without native bf16 (V100, T4) it is emulated, still 2 bytes.
    compute_bytes = 4 if cfg.precision == "fp32" else 2
    return Numerics(compute_bytes=compute_bytes, optimizer=cfg.optimizer,
                    activation_checkpointing=bool(cfg.activation_checkpointing), micro_batch=cfg.micro_batch_size,
                    seq_len=cfg.seq_len, global_batch=cfg.global_batch_size, grad_accum=cfg.grad_accum,
                    max_steps=cfg.max_steps, reshard_after_forward=bool(cfg.fsdp_reshard_after_forward),
                    compile=bool(cfg.compile), async_checkpoint=bool(cfg.async_checkpoint),
                    checkpointing_policy=cfg.activation_checkpointing_policy,
                    checkpoint_every=cfg.activation_checkpointing_every,
                    per_group=bool(cfg.micro_batch_per_group), loss_chunk_tokens=cfg.loss_chunk_tokens,
                    accumulation=cfg.fsdp_accumulation, accumulation_given="fsdp_accumulation" in given)


def given_stages(schedule: str, stages: int | None) -> int:
    """Layout.virtual for a pipeline that holds `stages` stages a rank: 0 where that is the schedule's default (so one
    layout has one spelling, and a request names the count only where it is not the default)."""
    return stages if stages and stages != stages_per_rank(schedule) else 0


@functools.lru_cache(maxsize=4096)
def _with_micro_batch(n: Numerics, micro: float) -> Numerics:
    # Cached: dataclasses.replace was a quarter of a plan's time (it runs for every candidate's time and memory).
    return dataclasses.replace(n, micro_batch=micro)


@functools.lru_cache(maxsize=8192)
def _layout_problems(lay: Layout, layers: int | None, heads: int | None, micro_batch_size: int,
                     per_group: bool) -> tuple:
    # Cached: a plan asks of the same layouts for each shape it compares, and the candidates' own check asks again.
    return tuple(layout_problems(
        lay.strategy, hosts=lay.nodes, per_host=lay.gpus_per_node, tensor=lay.tensor,
        pipeline=lay.pipeline, shard=lay.shard if lay.dims.builds_mesh else 0,
        microbatches=lay.microbatches if lay.pipeline > 1 else None, schedule=lay.schedule,
        n_layer=layers, n_head=heads, micro_batch_size=micro_batch_size, per_group=per_group,
        stages=lay.virtual or None))
