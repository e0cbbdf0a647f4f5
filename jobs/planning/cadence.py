"""Checkpoint cadence and the time interruptions cost: Young/Daly over the expected time between interruptions.

Save time = model + optimizer bytes / write bandwidth; measured on one H100 host: 11.35 GiB (gpt 1b with AdamW)
in 16.0 s synchronously with torch.distributed.checkpoint (README, "Benchmark"), and async_save with default
staging stalls training 9.2 s of it. Every node writes its own shards, so bandwidth scales with nodes.
On demand, a node fails about every NODE_MTBI_HOURS (Llama 3 paper, arXiv 2407.21783, section 3.3.4: 419
unexpected interruptions in 54 days on 16,384 H100s = one per 50,700 GPU-hours, 6,300 per 8-GPU node). Spot
adds jobs.catalog.SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH. The optimal interval is sqrt(2 x save x MTBI) (Young
1974, Daly 2006); each interruption loses half an interval plus the restart.

The launcher sends the interval as the `checkpoint_minutes` hyperparameter of every attempt that sets none
(jobs.planning.auto_strategy.attempt_cadence), and on a training plan aligns it so that a save ends before the instances are
reclaimed (before_plan_end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jobs.catalog import SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH
from jobs.planning.layout import Numerics
from jobs.planning.memory import optimizer_bytes
from jobs.planning.shape import ModelFacts
from jobs.prices import HOURS_PER_MONTH
from jobs.timestamps import utc_datetime

SAVE_GIB_PER_S = 11.35 / 16.0  # per node, synchronous DCP save to local disk
ASYNC_STALL = 9.2 / 16.0  # share of a synchronous save that async_save still stalls
NODE_MTBI_HOURS = 16384 * 54 * 24 / 419 / 8
RESTART_HOURS = 10 / 60  # new instances, image pull, restore: SageMaker's Starting and Downloading phases
# SageMaker training plans reclaim their instances 30 minutes before the plan ends (SageMaker developer guide,
# "Training plans": training jobs are stopped 30 minutes before the end time).
PLAN_RECLAIM_HOURS = 0.5


@dataclass(frozen=True)
class Cadence:
    save_s: float  # training stall per checkpoint
    mtbi_h: float  # expected hours between interruptions of the whole job
    interval_min: float  # minutes between checkpoints
    overhead: float  # fraction of run time spent saving or redoing lost work

    @property
    def lost_per_interruption_h(self) -> float:
        return self.interval_min / 120 + RESTART_HOURS


def state_bytes(m: ModelFacts, n: Numerics) -> float:
    """What a checkpoint writes: fp32 weights plus the optimizer's state."""
    return 4 * m.params + optimizer_bytes(m.params, m.param_tensors, n.optimizer)


def cadence(state_bytes: float, nodes: int, spot: bool, async_checkpoint: bool,
            measured_stall_s: float | None = None) -> Cadence:
    """`measured_stall_s`: the seconds one save stalled the training loop, as an earlier attempt of the run
    measured them (jobs.outcome.run_record.measured_save_seconds; an async save's stall as it was), in place of the
    model above."""
    if measured_stall_s is not None:
        stall = measured_stall_s
    else:
        save = state_bytes / 2 ** 30 / (SAVE_GIB_PER_S * nodes)
        stall = save * (ASYNC_STALL if async_checkpoint else 1.0)
    rate = nodes / NODE_MTBI_HOURS + (nodes * SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH / HOURS_PER_MONTH if spot else 0)
    mtbi = 1 / rate
    interval_h = max(math.sqrt(2 * stall / 3600 * mtbi), 5 / 60)  # no more often than every 5 minutes
    lost = interval_h / 2 + RESTART_HOURS
    overhead = stall / 3600 / interval_h + lost / mtbi
    return Cadence(stall, mtbi, interval_h * 60, overhead)


def reclaim_epoch(end_time: str) -> float:
    """When a plan ending at `end_time` (ISO 8601, UTC) takes its instances back, as epoch seconds."""
    return utc_datetime(end_time).timestamp() - PLAN_RECLAIM_HOURS * 3600


def before_plan_end(interval_min: float, save_s: float, starts_at: float, reclaim_at: float) -> float:
    """The interval, at most `interval_min`, that divides the time from the job's first step to two saves before
    the reclaim evenly, so that the last save ends before the instances go (the warning's "checkpoint by" time).

    The first step is guessed as `starts_at` (the attempt's launch) plus RESTART_HOURS: the pending and download
    time of the real job is not known when it is rendered, so a later start moves every save later by as much.
    A window too short for one save keeps the interval (the job still saves on the stop)."""
    window_min = (reclaim_at - 2 * save_s - starts_at) / 60 - RESTART_HOURS * 60
    if window_min <= 0:
        return interval_min
    return window_min / math.ceil(window_min / interval_min)
