"""Evaluation on the validation channel, and early stopping on its loss."""

from __future__ import annotations

import math

import torch
import torch.distributed as torch_dist

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from contract.metrics import STEP, VAL_LOSS
from training.checkpoint.state import LoopState
from training.data.datasets import describe
from training.data.loader import eval_batches, resolve_workers
from training.data.sampler import validation_indices
from training.metrics.logger import MetricsLogger
from training.parallel.process_group import Dist
from training.resilience.heartbeat import Heartbeat, during
from training.step import TrainStep


class Evaluator:
    def __init__(self, step: TrainStep, val_set, cfg: TrainConfig, dist: Dist, global_batch: int,
                 data: tuple[int, int] | None = None, heartbeat: Heartbeat | None = None) -> None:
        """`data`: (rank, ranks) that read their own samples (training.job.Job.data_rank, data_world); None: the
        world's. `heartbeat`: the hang watchdog's progress marks (an evaluation is a phase of its own)."""
        self.heartbeat = heartbeat
        self.step, self.val_set, self.dist, self.global_batch = step, val_set, dist, global_batch
        self.data_rank, self.data_world = data or (dist.rank, dist.world_size)
        self.interval, self.batches, self.micro = cfg.eval_interval, cfg.eval_batches, cfg.micro_batch_size
        self.patience = cfg.early_stopping_patience
        # The training loader's rule: data_workers, or auto's choice for the validation channel's format.
        self.workers = resolve_workers(cfg.data_workers, val_set) if val_set is not None else 0
        if self.interval and val_set is None and dist.is_main:
            print("[train] no validation channel: evaluation and early stopping are off", flush=True)
        if self.interval and self.batches and val_set is not None and len(val_set) < global_batch:
            # An evaluation would see no sample: its loss would be NaN, and NaN never improves (early stop).
            raise ConfigError(
                f"the validation set, {describe(val_set)}, holds {len(val_set)} samples, fewer than one global batch "
                f"({global_batch} = micro_batch_size {cfg.micro_batch_size} x {self.data_world} ranks x "
                f"accumulation {global_batch // (cfg.micro_batch_size * self.data_world)}): add validation data, "
                "lower micro_batch_size or global_batch_size, or set eval_interval=0")

    def due(self, step: int) -> bool:
        return bool(self.interval and self.batches) and self.val_set is not None and step % self.interval == 0

    def run(self, state: LoopState, logger: MetricsLogger) -> None:
        with during(self.heartbeat, "an evaluation"):  # not a training step: the hang watchdog's long allowance
            self._run(state, logger)

    def _run(self, state: LoopState, logger: MetricsLogger) -> None:
        """Evaluate, log val_loss, and stop the run early when it has not improved for `patience` evaluations."""
        val_loss = self.evaluate()
        logger.log({STEP: state.step, VAL_LOSS: val_loss})
        if val_loss < state.best_val_loss:
            state.best_val_loss, state.bad_evals = val_loss, 0
            return
        state.bad_evals += 1
        if self.patience and state.bad_evals >= self.patience:
            state.status = "early_stopped"
            if self.dist.is_main:
                print(f"[train] early stopping at step {state.step}: {VAL_LOSS} has not improved on "
                      f"{state.best_val_loss:.4f} for {state.bad_evals} evaluations", flush=True)

    def evaluate(self) -> float:
        """Mean validation loss over the same `eval_batches` global batches every time, across all ranks."""
        dist, model = self.dist, self.step.model
        model.eval()
        total = torch.zeros(2, device=dist.device)
        keys = [(0, idx[i : i + self.micro])  # validation reads epoch 0 always: no augmentation, same samples
                for idx in validation_indices(len(self.val_set), self.global_batch, self.data_rank,
                                              self.data_world, self.batches)
                for i in range(0, len(idx), self.micro)]
        with torch.no_grad():
            for x, y in eval_batches(self.val_set, keys, dist.device, self.workers):
                # Tensor/pipeline ranks pool (or share) their samples and all get the group's loss: summed
                # over the world, each group counts as often in the loss as in the count.
                loss, n = self.step.eval_loss(x, y)
                total += torch.stack([loss.float() * n, torch.tensor(float(n), device=dist.device)])
        if torch_dist.is_initialized():
            torch_dist.all_reduce(total)
        model.train()
        return (total[0] / total[1]).item() if total[1] > 0 else math.nan
