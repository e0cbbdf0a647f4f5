"""The training loop. It does not know which strategy it runs: that is `Parallelized`'s job.

One optimizer step = `grad_accum` micro-batches per rank (gradients synced only on the last one), then
clipping, the optimizer, the LR schedule. Every step boundary the ranks agree on the stop flag; every
`checkpoint_interval` steps, on stop, and at the end they checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from training.checkpoint import Checkpointer
from training.config import TrainConfig, data_mode
from training.data import (
    GlobalBatchSampler,
    ImageDataset,
    SyntheticImages,
    SyntheticTokens,
    TokenDataset,
    epoch_fraction,
    read_meta,
    validation_indices,
)
from training.distributed import Dist, StopFlag
from training.export import save_model
from training.metrics import MetricsLogger, peak_flops
from training.models import build_model, count_params, data_kind, materialize, model_seq_len
from training.speedups import apply_activation_checkpointing, apply_compile
from training.strategies import Parallelized, apply_strategy

# Above this size FSDP/SMP allocate parameters only after sharding (meta-device init): a 7B model in fp32
# does not fit one GPU, let alone each rank's copy.
META_INIT_MIN_PARAMS = 500_000_000
STATUS_FILE = "training_status.json"


@dataclass
class Result:
    status: str  # completed | early_stopped | stopped
    step: int
    best_val_loss: float
    model_path: Path | None = None


def resolve_precision(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    if cfg.precision == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]


def lr_multiplier(cfg: TrainConfig):
    """Linear warmup, then cosine decay to min_lr_ratio at max_steps. `step` = optimizer steps taken."""

    def multiplier(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms and biases
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (one launch for all parameters) on GPUs; CPUs use the default implementation.
    fused = all(p.device.type == "cuda" for p in model.parameters()) or None
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def make_datasets(cfg: TrainConfig, kind: str, model, seq_len: int):
    if data_mode(cfg) == "synthetic":
        if kind == "images":
            c = model.c
            make = lambda seed: SyntheticImages(c.image_size, c.channels, c.num_classes, seed)  # noqa: E731
        else:
            vocab = getattr(getattr(model, "c", None), "vocab_size", 256)
            make = lambda seed: SyntheticTokens(vocab, seq_len, seed)  # noqa: E731
        return make(cfg.seed), make(cfg.seed + 1)
    load = (lambda d: ImageDataset(d)) if kind == "images" else (lambda d: TokenDataset(d, seq_len))
    return load(cfg.train_dir), (load(cfg.validation_dir) if cfg.validation_dir else None)


def _grad_norm(model, max_norm: float) -> torch.Tensor:
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class TrainStep:
    """One optimizer step: forward and backward over the micro-batches (gradients synced only on the last),
    clipping, optimizer, grad scaler, LR schedule. The benchmark times exactly this."""

    def __init__(self, par: Parallelized, optimizer, scheduler, scaler, dtype: torch.dtype, device: torch.device,
                 grad_clip: float) -> None:
        self.model, self.par = par.model, par
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.grad_clip = grad_clip
        use_autocast = par.use_autocast and dtype != torch.float32
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if use_autocast else contextlib.nullcontext

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            logits = self.model(x)
        return F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())

    def __call__(self, micro_batches: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`micro_batches`: (inputs, targets) pairs on the device. Returns (mean loss, grad norm), unsynced."""
        total = None
        n = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            with self.par.grad_sync(i == n - 1):
                loss = self.loss(x, y) / n
                self.scaler.scale(loss).backward()
            total = loss.detach() if total is None else total + loss.detach()
        grad_norm = None
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            grad_norm = _grad_norm(self.model, self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return total, grad_norm


@dataclass
class Job:
    """Everything `train` works on, built from the config: the parallelized model and the data."""

    par: Parallelized
    train_set: object
    val_set: object | None
    kind: str  # tokens | images
    seq_len: int
    global_batch: int
    dtype: torch.dtype
    n_params: int
    flops_per_sample: float | None
    export_config: dict


def build_job(cfg: TrainConfig, dist: Dist) -> Job:
    meta = read_meta(cfg.train_dir) if data_mode(cfg) == "channels" else {}
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, meta)
    kind, seq_len = data_kind(model), model_seq_len(model, cfg)
    train_set, val_set = make_datasets(cfg, kind, model, seq_len)
    global_batch, _ = cfg.batch_layout(dist.world_size)
    dtype = resolve_precision(cfg, dist.device)
    n_params = count_params(model)
    late_init = n_params >= META_INIT_MIN_PARAMS and cfg.strategy in ("fsdp", "smp")
    if not late_init:
        materialize(model, dist.device, cfg.seed)
    flops = model.flops_per_sample() if hasattr(model, "flops_per_sample") else None
    export_config = model.export_config() if hasattr(model, "export_config") else {"model": cfg.model}
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    if cfg.compile:
        apply_compile(model)
    par = apply_strategy(model, cfg, dist, dtype)
    if late_init:
        materialize(par.model, dist.device, cfg.seed)
    return Job(par, train_set, val_set, kind, seq_len, global_batch, dtype, n_params, flops, export_config)


def evaluate(step: TrainStep, val_set, cfg: TrainConfig, dist: Dist, global_batch: int) -> float:
    """Mean validation loss over the same `eval_batches` global batches every time, across all ranks."""
    step.model.eval()
    total = torch.zeros(2, device=dist.device)
    with torch.no_grad():
        for idx in validation_indices(len(val_set), global_batch, dist.rank, dist.world_size, cfg.eval_batches):
            for i in range(0, len(idx), cfg.micro_batch_size):
                x, y = (t.to(dist.device) for t in val_set.batch(idx[i : i + cfg.micro_batch_size]))
                total += torch.stack([step.loss(x, y) * len(x), torch.tensor(float(len(x)), device=dist.device)])
    if torch_dist.is_initialized():
        torch_dist.all_reduce(total)
    step.model.train()
    return (total[0] / total[1]).item() if total[1] > 0 else math.nan


def train(cfg: TrainConfig, dist: Dist, stop: StopFlag, stop_at: int | None = None) -> Result:
    """Run (or resume) the job. `stop_at` acts like a stop signal at that step (tests use it)."""
    job = build_job(cfg, dist)
    par, train_set, val_set, dtype, global_batch = job.par, job.train_set, job.val_set, job.dtype, job.global_batch
    model = par.model
    optimizer = build_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg))
    scaler = torch.amp.GradScaler(dist.device.type, enabled=dtype == torch.float16)
    sampler = GlobalBatchSampler(len(train_set), global_batch, dist.rank, dist.world_size, cfg.seed)
    ckpt = Checkpointer(cfg.checkpoint_dir, dist, par.sharded, cfg.keep_checkpoints, cfg.async_checkpoint)
    state = {"step": 0, "status": "running", "best_val_loss": math.inf, "bad_evals": 0}
    saved_at = -1

    latest = ckpt.latest()
    if latest is not None:
        extra = ckpt.load(latest, model, optimizer)
        scheduler.load_state_dict(extra["scheduler"])
        sampler.load_state_dict(extra["data"])
        scaler.load_state_dict(extra["scaler"])
        state.update(extra["loop"])
        # Interrupted before, or finished with a max_steps since raised: carry on. Early-stopped stays done.
        if state["status"] == "stopped" or (state["status"] == "completed" and state["step"] < cfg.max_steps):
            state["status"] = "running"
        saved_at = state["step"]
        if dist.is_main:
            print(f"[checkpoint] resumed from {latest} at step {state['step']}", flush=True)
    else:
        torch.manual_seed(cfg.seed + 1 + dist.rank)  # each rank its own stream (dropout)
    if dist.is_main:
        accum = global_batch // (cfg.micro_batch_size * dist.world_size)
        print(f"[train] {cfg.model}/{cfg.model_size} {job.n_params / 1e6:.2f}M params, strategy={cfg.strategy}, "
              f"world={dist.world_size}, global_batch={global_batch} (micro {cfg.micro_batch_size} x accum "
              f"{accum}), precision={str(dtype).removeprefix('torch.')}, data={data_mode(cfg)}", flush=True)

    def trainer_state() -> dict:
        return {"step": state["step"], "loop": dict(state), "scheduler": scheduler.state_dict(),
                "data": sampler.state_dict(), "scaler": scaler.state_dict()}

    if cfg.eval_interval and val_set is None and dist.is_main:
        print("[train] no validation channel: evaluation and early stopping are off", flush=True)
    logger = MetricsLogger(cfg.output_data_dir, dist.is_main, cfg.max_steps)
    train_step = TrainStep(par, optimizer, scheduler, scaler, dtype, dist.device, cfg.grad_clip)
    peak = peak_flops(torch.cuda.get_device_name(dist.device)) if dist.device.type == "cuda" else None
    unit = global_batch * (job.seq_len if job.kind == "tokens" else 1)
    micro = cfg.micro_batch_size

    loss_sum = torch.zeros((), device=dist.device)
    loss_steps = timed_steps = 0
    t0 = time.perf_counter()
    grad_norm = None
    model.train()
    if state["status"] == "running" and state["step"] >= cfg.max_steps:
        state["status"] = "completed"
    while state["status"] == "running":
        if dist.any_true(stop.raised or (stop_at is not None and state["step"] >= stop_at)):
            state["status"] = "stopped"
            break
        indices = sampler.next_indices()
        batches = [tuple(t.to(dist.device, non_blocking=True) for t in train_set.batch(indices[i : i + micro]))
                   for i in range(0, len(indices), micro)]
        loss, grad_norm = train_step(batches)
        loss_sum += loss
        state["step"] += 1
        loss_steps += 1
        timed_steps += 1
        step = state["step"]

        if step % cfg.log_interval == 0 or step == cfg.max_steps:
            if torch_dist.is_initialized():
                torch_dist.all_reduce(loss_sum, op=torch_dist.ReduceOp.AVG)
            train_loss = loss_sum.item() / loss_steps
            elapsed = time.perf_counter() - t0
            per_step = elapsed / timed_steps
            record = {"step": step, "epoch": epoch_fraction(sampler), "train_loss": train_loss,
                      "lr": scheduler.get_last_lr()[0], "step_time_ms": per_step * 1000,
                      "grad_norm": grad_norm.item() if grad_norm is not None else None,
                      "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
                      ("tokens_per_sec" if job.kind == "tokens" else "samples_per_sec"): unit / per_step}
            if peak and job.flops_per_sample and dtype != torch.float32:
                record["mfu"] = job.flops_per_sample * global_batch / per_step / (peak * dist.world_size)
            logger.log(record)
            loss_sum.zero_()
            loss_steps = timed_steps = 0
            t0 = time.perf_counter()
        logger.progress(step)

        if cfg.eval_interval and val_set is not None and step % cfg.eval_interval == 0:
            val_loss = evaluate(train_step, val_set, cfg, dist, global_batch)
            logger.log({"step": step, "val_loss": val_loss})
            if val_loss < state["best_val_loss"]:
                state["best_val_loss"], state["bad_evals"] = val_loss, 0
            else:
                state["bad_evals"] += 1
                if cfg.early_stopping_patience and state["bad_evals"] >= cfg.early_stopping_patience:
                    state["status"] = "early_stopped"
                    if dist.is_main:
                        print(f"[train] early stopping at step {step}: val_loss has not improved on "
                              f"{state['best_val_loss']:.4f} for {state['bad_evals']} evaluations", flush=True)
            t0, timed_steps = time.perf_counter(), 0
        if step >= cfg.max_steps and state["status"] == "running":
            state["status"] = "completed"
        if cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0 and state["status"] == "running":
            ckpt.save(step, model, optimizer, trainer_state())
            saved_at = step
            t0, timed_steps = time.perf_counter(), 0
    logger.close()

    # Stopped, finished or early-stopped: checkpoint (a rerun then resumes, or sees the job is done).
    if saved_at != state["step"] and state["step"] > 0:
        ckpt.save(state["step"], model, optimizer, trainer_state())
    ckpt.wait()
    model_path = None
    if state["status"] != "stopped":
        model_path = save_model(model, dist, cfg.model_dir, {**job.export_config, "step": state["step"]})
    if dist.is_main:
        Path(cfg.output_data_dir).mkdir(parents=True, exist_ok=True)
        summary = {"status": state["status"], "step": state["step"], "best_val_loss": state["best_val_loss"]}
        (Path(cfg.output_data_dir) / STATUS_FILE).write_text(json.dumps(summary) + "\n")
        print(f"[train] {state['status']} at step {state['step']}", flush=True)
    return Result(state["status"], state["step"], state["best_val_loss"], model_path)
