"""What a run trains on, built from the config: the model (initialized, sped up, parallelized) and the data."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from contract.hyperparameters import TrainConfig
from training.data import make_datasets, read_meta
from training.distributed import Dist
from training.environment import data_mode
from training.flops import honest_flops_per_sample
from training.models import build_model, count_params, data_kind, materialize, model_seq_len
from training.precision import Precision, resolve_precision
from training.speedups import apply_activation_checkpointing, apply_compile
from training.strategies import Parallelized, apply_strategy

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
    precision: Precision
    n_params: int
    flops_per_sample: float | None  # training.flops' honest convention where the model allows it
    export_config: dict

    @property
    def model(self) -> torch.nn.Module:
        return self.par.model


def build_job(cfg: TrainConfig, dist: Dist) -> Job:
    meta = read_meta(cfg.train_dir) if data_mode(cfg) == "channels" else {}
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, meta)
    kind, seq_len = data_kind(model), model_seq_len(model, cfg)
    train_set, val_set = make_datasets(cfg, kind, model, seq_len)
    global_batch, _ = cfg.batch_layout(dist.world_size)
    precision = resolve_precision(cfg.precision, dist.device)
    n_params = count_params(model)
    # pp and hybrid cut the built model into stages (training.pipeline): they materialize it first.
    late_init = n_params >= META_INIT_MIN_PARAMS and cfg.strategy in ("fsdp", "smp", "hsdp", "tp")
    if not late_init:
        materialize(model, dist.device, cfg.seed)
    # Counted on the whole model, before a pipeline cuts it into stages or a wrapper hides its config.
    flops = honest_flops_per_sample(model) or (model.flops_per_sample() if hasattr(model, "flops_per_sample")
                                               else None)
    export_config = model.export_config() if hasattr(model, "export_config") else {"model": cfg.model}
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    if cfg.compile:
        apply_compile(model)
    par = apply_strategy(model, cfg, dist, precision)
    if late_init:
        materialize(par.model, dist.device, cfg.seed)
    return Job(par, train_set, val_set, kind, seq_len, global_batch, precision, n_params, flops, export_config)


def announce(cfg: TrainConfig, job: Job, dist: Dist) -> None:
    if dist.is_main:
        accum = job.global_batch // (cfg.micro_batch_size * dist.world_size)
        print(f"[train] {cfg.model}/{cfg.model_size} {job.n_params / 1e6:.2f}M params, strategy={cfg.strategy}, "
              f"world={dist.world_size}, global_batch={job.global_batch} (micro {cfg.micro_batch_size} x accum "
              f"{accum}), precision={str(job.precision.param).removeprefix('torch.')}, data={data_mode(cfg)}",
              flush=True)
