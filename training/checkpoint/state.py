"""What a checkpoint holds, as `Stateful` parts that torch.distributed.checkpoint saves and loads in place.

Parts (the keys of a checkpoint): model, optim, scheduler (LambdaLR), data (the sampler's position),
scaler, loop (step, status, early stopping) and rng (every rank's generators). Model and optimizer go
through `get_state_dict`/`set_state_dict`, so one layout serves single, DDP and FSDP, and DCP reshards
them when the world size changes.
"""

from __future__ import annotations

import math
import pickle
import random
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from training.parallel.process_group import Dist


class ModelState(Stateful):
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.model, state)


# Flattened: one key per parameter and setting. DCP keeps a non-tensor value from one rank only, so a nested
# `param_groups` would hand every pipeline rank rank 0's groups on resume (KeyError: 'betas').
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class OptimizerState(Stateful):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer, options=_FLAT)

    def load_state_dict(self, state: dict) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state, options=_FLAT)


class ScalerState(Stateful):
    """The fp16 loss scale; a disabled scaler (fp32, bf16) has no state and loads none."""

    def __init__(self, scaler: torch.amp.GradScaler) -> None:
        self.scaler = scaler

    def state_dict(self) -> dict:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.scaler.is_enabled() and state:
            self.scaler.load_state_dict(state)


@dataclass
class LoopState(Stateful):
    step: int = 0
    status: str = "running"  # running | completed | early_stopped | stopped
    best_val_loss: float = math.inf
    bad_evals: int = 0

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.step, self.status = int(state["step"]), state["status"]
        self.best_val_loss, self.bad_evals = float(state["best_val_loss"]), int(state["bad_evals"])

    def reopen(self, max_steps: int) -> None:
        """After a resume: an interrupted run, or one finished with a max_steps since raised, carries on;
        an early-stopped one stays done."""
        if self.status == "stopped" or (self.status == "completed" and self.step < max_steps):
            self.status = "running"
        if self.status == "running" and self.step >= max_steps:
            self.status = "completed"

    def finish_if_done(self, max_steps: int) -> None:
        if self.status == "running" and self.step >= max_steps:
            self.status = "completed"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class RngState(Stateful):
    """Every rank's generators, gathered: the same world resumes each rank's own streams; another world
    size cannot, and derives fresh ones from the step and the rank's stream (equal on ranks that must agree).

    Stored as one pickled blob: DCP keeps a non-tensor value from one rank only, and would otherwise
    descend into the generator tensors.
    """

    def __init__(self, dist: Dist, loop: LoopState, stream: int) -> None:
        self.dist, self.loop, self.stream = dist, loop, stream  # stream: see training.parallel.strategies.Parallelized

    def state_dict(self) -> dict:
        ranks = self.dist.all_gather_object(rng_state())  # collective: DCP asks every rank at once
        return {"ranks": pickle.dumps(ranks), "world_size": self.dist.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state["world_size"] == self.dist.world_size:
            set_rng_state(pickle.loads(state["ranks"])[self.dist.rank])
        else:  # the loop part is loaded before this one: its step seeds the new streams
            torch.manual_seed(self.loop.step * 1009 + self.stream)
