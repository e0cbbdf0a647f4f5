"""Spawned ranks for the multi-process tests (torch.multiprocessing needs them importable by name)."""

from __future__ import annotations

import os

import torch

from training import job
from training.config import from_environment, parse_args
from training.job import META_INIT_MIN_PARAMS
from training.loop import train
from training.parallel.process_group import setup, teardown
from training.resilience.stop import StopFlag


def run_scenarios(rank: int, world: int, port: int, runs: list[tuple[dict, int | None]]) -> None:
    """Each run: (config overrides or {"argv": [...]} for toolkit-style arguments, stop_at)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        for overrides, stop_at in runs:
            overrides = dict(overrides)
            # Lets a tiny model take the large-model path: shard on the meta device, then initialize.
            job.META_INIT_MIN_PARAMS = overrides.pop("meta_init_min_params", META_INIT_MIN_PARAMS)
            if "argv" in overrides:
                cfg = parse_args(overrides["argv"], env=overrides.get("env", {}))
            else:
                cfg = from_environment(overrides, {})
            train(cfg, setup(cfg), StopFlag(), stop_at=stop_at)
    finally:
        teardown()
