"""The training loop, made of components (torchtitan's shape); it does not know which strategy it runs.

One optimizer step = `grad_accum` micro-batches per rank (`training.step`). Every step boundary the ranks
agree on the stop flag; metrics (`training.meter`), evaluation (`training.evaluation`) and checkpoints
(`training.checkpoint`, which owns their cadence) each decide when they are due.
"""

from __future__ import annotations

import torch

from contract.hyperparameters import TrainConfig
from training.checkpoint import CheckpointManager
from training.data import GlobalBatchSampler, micro_batches
from training.distributed import Dist, StopFlag
from training.evaluation import Evaluator
from training.job import announce, build_job
from training.meter import StepMeter
from training.metrics import MetricsLogger
from training.optim import build_optimizer, build_scheduler
from training.outcome import Result, finish
from training.state import LoopState, ModelState, OptimizerState, RngState, ScalerState
from training.step import TrainStep


def train(cfg: TrainConfig, dist: Dist, stop: StopFlag, stop_at: int | None = None) -> Result:
    """Run (or resume) the job. `stop_at` acts like a stop signal at that step (tests use it)."""
    job = build_job(cfg, dist)
    optimizer, state = build_optimizer(job.model, cfg), LoopState()
    scheduler = build_scheduler(optimizer, cfg)
    scaler = torch.amp.GradScaler(dist.device.type, enabled=job.precision.needs_loss_scaling)
    sampler = GlobalBatchSampler(len(job.train_set), job.global_batch, dist.rank, dist.world_size, cfg.seed)
    checkpoints = CheckpointManager(cfg, dist, {
        "model": ModelState(job.model), "optim": OptimizerState(job.model, optimizer), "scheduler": scheduler,
        "data": sampler, "scaler": ScalerState(scaler), "loop": state, "rng": RngState(dist, state)})
    if checkpoints.restore() is None:
        torch.manual_seed(cfg.seed + 1 + dist.rank)  # each rank its own stream (dropout)
    state.reopen(cfg.max_steps)
    announce(cfg, job, dist)
    train_step = TrainStep(job.par, optimizer, scheduler, scaler, job.precision, dist.device, cfg.grad_clip)
    evaluator = Evaluator(train_step, job.val_set, cfg, dist, job.global_batch)
    logger = MetricsLogger(cfg.output_data_dir, dist.is_main, cfg.max_steps)
    meter = StepMeter(dist, job.precision, cfg.effective_log_interval, cfg.max_steps, job.global_batch,
                      job.seq_len if job.kind == "tokens" else 1, job.kind, job.flops_per_sample)
    job.model.train()
    while state.status == "running":
        if dist.any_true(stop.raised or (stop_at is not None and state.step >= stop_at)):
            state.status = "stopped"
            break
        batches = micro_batches(job.train_set, sampler.next_indices(), cfg.micro_batch_size, dist.device)
        meter.add(*train_step(batches))
        state.step += 1
        if meter.due(state.step):
            logger.log(meter.record(state.step, sampler, scheduler, scaler))
        logger.progress(state.step)
        if evaluator.due(state.step):
            evaluator.run(state, logger)
            meter.restart()
        state.finish_if_done(cfg.max_steps)
        if checkpoints.save_if_due(state.step, running=state.status == "running"):
            meter.restart()
    logger.close()
    checkpoints.save_final(state.step)  # stopped, finished or early-stopped: a rerun resumes or sees it done
    return finish(cfg, dist, job.model, job.export_config, state)
