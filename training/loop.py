"""The training loop, made of components (torchtitan's shape); it does not know which strategy it runs.

One optimizer step = `grad_accum` micro-batches per rank (`training.step`). Every step boundary the ranks
agree, in one all-reduce, on the stop flag and the checkpoint time cadence; metrics (`training.metrics.meter`),
evaluation (`training.evaluation`) and checkpoints (`training.checkpoint`, whose cadence says when) each
decide when they are due. Failures the package knows end the run as `TrainingFailure` (training.resilience.outcome):
CUDA out of memory, and a loss or gradient norm non-finite for `nonfinite_patience` steps in a row.
"""

from __future__ import annotations

import os
import time

import torch

from contract.errors import ConfigError
from contract.failures import OUT_OF_MEMORY_ADVICE, FailureCode, failure_line
from contract.hyperparameters import TrainConfig
from contract.metrics import CHECKPOINT_AGE_S, CHECKPOINT_OVERDUE, STEP
from training.checkpoint.manager import CheckpointManager
from training.checkpoint.ownership import Owner, current_run_id
from training.checkpoint.state import LoopState, ModelState, OptimizerState, RngState, ScalerState
from training.data.datasets import describe
from training.data.loader import BatchSource, resolve_workers
from training.data.sampler import GlobalBatchSampler
from training.environment import container
from training.evaluation import Evaluator
from training.job import announce, build_job
from training.metrics.cloudwatch import CloudWatchMetrics
from training.metrics.logger import MetricsLogger
from training.metrics.meter import AttemptClock, StepMeter, checkpoint_overdue, input_bound_line
from training.metrics.mlflow_run import MlflowRun
from training.metrics.profiling import StepProfiler
from training.metrics.tensorboard import TensorBoardWriter
from training.optim import build_optimizer, build_scheduler
from training.parallel.process_group import Dist, default_store
from training.precision import grad_scaler
from training.resilience.heartbeat import Heartbeat
from training.resilience.outcome import Result, TrainingFailure, finish, known_failure
from training.resilience.peers import peer_gone
from training.resilience.stop import StopFlag
from training.resilience.stragglers import StepTiming
from training.resilience.watchdog import Watchdog
from training.step import TrainStep

# torch >= 2.5 names it at the top; older ones only as torch.cuda's.
OutOfMemory = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


def train(cfg: TrainConfig, dist: Dist, stop: StopFlag, stop_at: int | None = None, observe=None) -> Result:
    """Run (or resume) the job under this rank's hang watchdog. `stop_at` acts like a stop signal at that step;
    `observe` sees every step's gradients and weights (training.step.TrainStep.observe). Tests use both.

    A run of several ranks that cannot go on ends together (training.resilience.peers): a rank that fails tells its peers its
    line before it leaves, and a rank whose collective says a peer went away raises `host_lost` or `process_lost`
    naming the ranks and hosts that no longer answer (its peers' watchdogs answer and end theirs with the same)."""
    heartbeat, timing, dog = _watch(cfg, dist)
    tracking = MlflowRun.from_environment(vars(cfg), is_main=dist.is_main)
    ended, model_path = "failed", None
    try:
        result = _train(cfg, dist, stop, stop_at, observe, heartbeat, timing, tracking)
        ended, model_path = result.status, result.model_path
        return result
    except (TrainingFailure, ConfigError) as e:
        if dist.world_size > 1:
            dog.conclude(failed=failure_line(known_failure(e), str(e)))
        raise
    except Exception as e:
        if dist.world_size == 1 or (saw := peer_gone(e)) is None:
            raise
        raise TrainingFailure(*dog.conclude(saw=saw)) from None
    finally:
        dog.stop()
        timing.close()  # rank 0 prints the run's straggler summary
        if tracking is not None:
            tracking.end(ended, model_path)


def _watch(cfg: TrainConfig, dist: Dist) -> tuple[Heartbeat, StepTiming, Watchdog]:
    """This rank's progress marks, its straggler timing, and the hang watchdog over the marks, started: every
    rank's, and a single process's too, whose loader or I/O can hang as well (it has no peer to wait for or to be
    slower than). Collective (the ranks' hosts)."""
    hosts = dist.all_gather_object(container(os.environ).current_host)
    several = dist.world_size > 1
    heartbeat = Heartbeat(dist.rank)
    timing = StepTiming(cfg, rank=dist.rank, world=dist.world_size, hosts=hosts,
                        gather=dist.gather_floats if several else None)
    dog = Watchdog(cfg, heartbeat, rank=dist.rank, world=dist.world_size, hosts=hosts, backend=dist.backend,
                   store=default_store() if several else None)
    return heartbeat, timing, dog.start()


def _train(cfg: TrainConfig, dist: Dist, stop: StopFlag, stop_at: int | None, observe, heartbeat: Heartbeat,
           timing: StepTiming, tracking: MlflowRun | None) -> Result:
    clock = AttemptClock()
    job = build_job(cfg, dist)
    optimizer, state = build_optimizer(job.model, cfg), LoopState()
    scheduler = build_scheduler(optimizer, cfg)
    scaler = grad_scaler(job.precision, dist.device)
    sampler = GlobalBatchSampler(len(job.train_set), job.global_batch, job.data_rank, job.data_world, cfg.seed,
                                 source=describe(job.train_set))
    # Dropout's stream: each batch group its own, shared by the tensor and pipeline ranks that train on its batch.
    stream = dist.rank if job.par.random_stream is None else job.par.random_stream
    checkpoints = CheckpointManager(cfg, dist, {
        "model": ModelState(job.model), "optim": OptimizerState(job.model, optimizer), "scheduler": scheduler,
        "data": sampler, "scaler": ScalerState(scaler), "loop": state, "rng": RngState(dist, state, stream)},
        owner=Owner(current_run_id(), job.fingerprint), global_batch=job.global_batch, heartbeat=heartbeat)
    if checkpoints.restore() is None:
        torch.manual_seed(cfg.seed + 1 + stream)
    state.reopen(cfg.max_steps)
    announce(cfg, job, dist)
    train_step = TrainStep(job.par, optimizer, scheduler, scaler, job.precision, dist.device, cfg.grad_clip,
                           compile_loss=cfg.compile, observe=observe,
                           loss_chunk_tokens=cfg.loss_chunk_tokens)
    evaluator = Evaluator(train_step, job.val_set, cfg, dist, job.global_batch, (job.data_rank, job.data_world),
                          heartbeat=heartbeat)
    logger = MetricsLogger(cfg.output_data_dir, dist.is_main, cfg.max_steps,
                           sinks=(TensorBoardWriter.from_environment(is_main=dist.is_main), tracking))
    timing.logger = logger
    cloud = CloudWatchMetrics.from_environment(os.environ, current_run_id(), is_main=dist.is_main,
                                               local_rank=dist.local_rank)
    profiler = StepProfiler.for_run(cfg, dist.rank, dist.device)
    meter = StepMeter(dist, job.precision, cfg.effective_log_interval, cfg.max_steps, job.global_batch,
                      job.seq_len if job.kind == "tokens" else 1, job.kind, job.flops_per_sample,
                      nonfinite_patience=cfg.nonfinite_patience, count_grad_norm=not scaler.is_enabled())
    workers = resolve_workers(cfg.data_workers, job.train_set)
    # Built after the restore: its workers start from the restored position at the first step.
    source = BatchSource(job.train_set, sampler, cfg.micro_batch_size, dist.device, workers, timing=timing)
    if dist.is_main:
        print(f"[data] {describe(job.train_set)}: {len(job.train_set):,} samples, {workers} loader worker(s) per "
              f"rank{' (data_workers=auto)' if cfg.data_workers is None else ''}", flush=True)
    job.model.train()
    clock.training_starts()
    while state.status == "running":
        stopping, time_due = dist.agree(stop.raised or (stop_at is not None and state.step >= stop_at),
                                        checkpoints.time_due(), waited=timing.waited_at_boundary)
        if stopping:
            state.status = "stopped"
            break
        if checkpoints.due(state.step, running=True, time_due=time_due):
            _checkpoint(checkpoints, meter, clock, state.step)
        batches = source.next()
        if profiler is not None:
            profiler.before(state.step + 1)
        try:
            meter.add(*train_step(batches))
        except OutOfMemory as e:
            raise TrainingFailure(FailureCode.OUT_OF_MEMORY, _oom_message(cfg, job, dist, state.step + 1, e)) from None
        meter.waited(source.data_wait_s)
        state.step += 1
        if profiler is not None:
            profiler.after(state.step)
        # The hang watchdog's progress mark; the straggler exchange every log interval (collective).
        timing.stepped(state.step, heartbeat.beat(state.step))
        if meter.due(state.step):
            meter.raise_if_nonfinite(state.step)
            record = meter.record(state.step, sampler, scheduler, scaler)
            line = {**record, **_checkpoint_age(checkpoints, meter), **clock.metrics(meter.trained_s)}
            logger.log(line)
            _send(cloud, dist, line)
            bound = input_bound_line(record, cfg.input_bound_share, job.global_batch, workers)
            if bound and dist.is_main:
                print(bound, flush=True)
        logger.progress(state.step)
        if evaluator.due(state.step):
            with clock.evaluating():
                evaluator.run(state, logger)
            meter.restart()
        state.finish_if_done(cfg.max_steps)
        if checkpoints.due(state.step, running=state.status == "running"):
            _checkpoint(checkpoints, meter, clock, state.step)
    source.close()
    logger.close()
    if profiler is not None:
        profiler.close()
    trained_s = meter.trained_s
    nonfinite = meter.raise_if_nonfinite(state.step)  # a diverged run fails; a non-finite last step is not saved
    with clock.checkpointing():
        if state.status == "stopped":  # SIGKILL follows SageMaker's SIGTERM: save only what can finish
            checkpoints.save_at_stop(state.step, dist.max_float(stop.seconds_since()), nonfinite)
        else:  # finished or early-stopped: a rerun resumes or sees it done
            checkpoints.save_final(state.step, nonfinite)
    if meter.run_steps or meter.timed_steps:  # this attempt trained: its totals, the stop's save included
        last = {STEP: state.step, **_checkpoint_age(checkpoints, meter), **clock.metrics(trained_s),
                **meter.run_data_wait()}
        logger.final(last)
        _send(cloud, dist, last)
    if cloud:
        cloud.close()
    return finish(cfg, dist, job.model, job.export_config, state, heartbeat=heartbeat, stragglers=timing.report())


def _checkpoint(checkpoints: CheckpointManager, meter: StepMeter, clock: AttemptClock, step: int) -> None:
    # A diverged run fails here; a step non-finite on any rank, below the patience, is not saved.
    began = time.perf_counter()
    if checkpoints.save(step, nonfinite=meter.raise_if_nonfinite(step)) is not None:
        clock.saved(time.perf_counter() - began)
        meter.restart()  # the save's stall is not training time


def _send(cloud: CloudWatchMetrics | None, dist: Dist, line: dict) -> None:
    """To the team's own namespace (training.metrics.cloudwatch): the line from the main rank, each host's GPUs from
    its first rank."""
    if cloud is None:
        return
    cloud.send_gpus()
    if dist.is_main:
        cloud.send_values(line)


def _checkpoint_age(checkpoints: CheckpointManager, meter: StepMeter) -> dict:
    """The age of the newest complete checkpoint, in seconds and in cadences (the overdue alarm's metric)."""
    age = checkpoints.age()
    overdue = checkpoint_overdue(age, checkpoints.every_s, checkpoints.interval, meter.mean_step_s)
    return {CHECKPOINT_AGE_S: age, CHECKPOINT_OVERDUE: overdue}


def _oom_message(cfg: TrainConfig, job, dist: Dist, step: int, error: Exception) -> str:
    shape = f"{cfg.micro_batch_size} x {job.seq_len} tokens" if job.kind == "tokens" else f"{cfg.micro_batch_size} images"
    first = next((line for line in str(error).splitlines() if line.strip()), "")[:200]
    return (f"CUDA out of memory on rank {dist.rank} in step {step}, on a micro-batch of {shape} "
            f"(micro_batch_size={cfg.micro_batch_size}, strategy={cfg.strategy}, precision={cfg.precision}; {first}): "
            f"{OUT_OF_MEMORY_ADVICE}")
