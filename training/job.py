"""What a run trains on, built from the config: the model (initialized, sped up, parallelized) and the data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from contract.hyperparameters import Strategy, TrainConfig, resumed_batch_layout
from contract.parallel import batch_ranks
from training.checkpoint.markers import recorded_global_batch
from training.data.datasets import make_datasets, read_meta
from training.environment import data_mode
from training.metrics.flops import honest_flops_per_sample
from training.models import build_model, count_params, data_kind, materialize, model_seq_len
from training.models.speedups import apply_speedups
from training.parallel.process_group import Dist
from training.parallel.strategies import Parallelized, apply_strategy, job_dims
from training.precision import Precision, resolve_precision

# Above this size FSDP/SMP allocate parameters only after sharding (meta-device init): a 7B model in fp32
# does not fit one GPU, let alone each rank's copy.
META_INIT_MIN_PARAMS = 500_000_000


@dataclass
class Job:
    par: Parallelized
    train_set: object
    val_set: object | None
    kind: str  # tokens | images
    seq_len: int
    global_batch: int
    # The sampler's view (training.data.datasets.GlobalBatchSampler): every rank its own slice, or with
    # micro_batch_per_group one slice per batch group, read by each of its ranks.
    data_rank: int
    data_world: int
    precision: Precision
    n_params: int
    flops_per_sample: float | None  # training.metrics.flops' honest convention where the model allows it
    export_config: dict
    fingerprint: dict  # what defines the trained function (`fingerprint`): a checkpoint records it
    runs_as: str  # the strategy the job's degrees run (contract.parallel.ParallelDims.strategy; smp: smp)

    @property
    def model(self) -> torch.nn.Module:
        return self.par.model


def build_job(cfg: TrainConfig, dist: Dist) -> Job:
    meta = read_meta(cfg.train_dir) if data_mode(cfg) == "channels" else {}
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, meta)
    kind, seq_len = data_kind(model), model_seq_len(model, cfg)
    train_set, val_set = make_datasets(cfg, kind, model, seq_len)
    dims = job_dims(cfg, dist)  # None for smp
    split = dims is not None and dims.splits_layers
    data_world = batch_ranks(dist.world_size, dims.tp if split else 1, dims.pp if split else 1,
                             split and cfg.micro_batch_per_group)
    # A resume keeps the global batch its checkpoints were trained with (contract.hyperparameters.resumed_batch_layout).
    recorded = dist.broadcast_object(recorded_global_batch(Path(cfg.checkpoint_dir)) if dist.is_main else None)
    global_batch, _, kept = resumed_batch_layout(data_world, cfg.micro_batch_size, cfg.global_batch_size,
                                                 cfg.grad_accum, recorded)
    if kept and dist.is_main:
        print(kept, flush=True)
    precision = resolve_precision(cfg.precision, dist.device)
    n_params = count_params(model)
    # pp and hybrid cut the built model into stages (training.parallel.pipeline_parallel): they materialize it first.
    late_init = n_params >= META_INIT_MIN_PARAMS and (dims is None or dims.strategy in (Strategy.FSDP, Strategy.HSDP, Strategy.TP))
    if not late_init:
        materialize(model, dist.device, cfg.seed)
    # Counted on the whole model, before a pipeline cuts it into stages or a wrapper hides its config.
    flops = honest_flops_per_sample(model) or (model.flops_per_sample() if hasattr(model, "flops_per_sample")
                                               else None)
    export_config = model.export_config() if hasattr(model, "export_config") else {"model": cfg.model}
    # Before any wrapper (activation checkpointing, compile, the strategy) renames or shards the parameters.
    identity = fingerprint(cfg, model, meta)
    apply_speedups(model, cfg)
    par = apply_strategy(model, cfg, dist, precision)
    if late_init:
        materialize(par.model, dist.device, cfg.seed)
    grouped = data_world < dist.world_size and par.random_stream is not None
    data_rank = par.random_stream if grouped else dist.rank
    return Job(par, train_set, val_set, kind, seq_len, global_batch, data_rank, data_world, precision, n_params, flops,
               export_config, identity, cfg.strategy if dims is None else dims.strategy)


# Settings of a model's config that change how it trains, not the function its weights define.
_NOT_SHAPE = ("dropout",)


def fingerprint(cfg: TrainConfig, model: torch.nn.Module, meta: dict) -> dict:
    """What a checkpoint's weights mean, as JSON: the model (reference name or factory), its shape (the
    model's `export_config()` less dropout; else every parameter's name and shape), the vocabulary size and
    the dtype of the master weights. Two runs whose fingerprints differ cannot share a checkpoint."""
    if hasattr(model, "export_config"):
        shape = {k: v for k, v in model.export_config().items() if k not in _NOT_SHAPE}
    else:
        shape = {name: list(p.shape) for name, p in model.named_parameters()}
    vocab = shape.get("vocab_size", meta.get("vocab_size"))
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    found = {"model": cfg.model, "shape": shape, "vocab_size": None if vocab is None else int(vocab),
             "master_dtype": ",".join(dtypes)}
    # As the marker's JSON gives it back (a tuple in a model's config reads back as a list), so they compare.
    return json.loads(json.dumps(found, default=str))


def _strategy(cfg: TrainConfig, job: Job) -> str:
    """The strategy that runs, and the name asked for where the degrees made it another (hsdp on one host)."""
    return job.runs_as if job.runs_as == cfg.strategy else f"{job.runs_as} (asked: {cfg.strategy})"


def announce(cfg: TrainConfig, job: Job, dist: Dist) -> None:
    if dist.is_main:
        accum = job.global_batch // (cfg.micro_batch_size * job.data_world)
        print(f"[train] {cfg.model}/{cfg.model_size} {job.n_params / 1e6:.2f}M params, strategy={_strategy(cfg, job)}, "
              f"world={dist.world_size}, global_batch={job.global_batch} (micro {cfg.micro_batch_size} x accum "
              f"{accum}), precision={str(job.precision.param).removeprefix('torch.')}, data={data_mode(cfg)}",
              flush=True)
