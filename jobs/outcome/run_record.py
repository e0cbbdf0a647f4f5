"""A run's record: where its time went (goodput and the losses) and what it cost.

Per attempt, from its training job's description (DescribeTrainingJob, as the launcher sees it when the
attempt ends) and the training package's cumulative metrics (contract.metrics: startup_s, train_s,
checkpoint_s, eval_s, checkpoint_age_s; their last values are the job's FinalMetricDataList):

    queued      CreationTime -> TrainingStartTime: waiting for instances; not billed
    held        TrainingTimeInSeconds: the instances were the job's, and billed (per instance)
      startup     TrainingStartTime -> the "Training" phase (image and data download), plus the training
                  process's own start to its first step (imports, model build, checkpoint restore)
      checkpoint  the step loop blocked by checkpoint saves
      eval        evaluation
      redone      work lost when the attempt ended without finishing: the age of its newest complete
                  checkpoint when it stopped (its last checkpoint_age_s); the next attempt trains it again.
                  Without metrics, the whole attempt's training time (an upper bound, said so)
      productive  training steps that the final model keeps: train_s - redone
      other       the rest of the held time: uploads, teardown, what the job did not measure

Goodput = productive / held, both in instance-seconds (seconds x instances), over every attempt of the run.
The time between attempts (the launcher waiting out a capacity shortage or a Spot interruption) and the
queueing are wall time, not billed: shown beside goodput, not in it.

Cost: SageMaker bills BillableTimeInSeconds x instances at the instance type's on-demand rate; for managed
Spot, BillableTimeInSeconds is smaller than TrainingTimeInSeconds by the Spot discount ("savings = 1 -
billable / training", DescribeTrainingJob's documentation). So on-demand and Spot cost are the same sum over
their own attempts, and the Spot savings are what the held time would have cost on demand minus that. The
price table is the caller's (trainctl's --prices, the source `trainctl plan` uses); a type without a price
leaves the cost unknown, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jobs.prices import cluster_usd_per_hour, priced
from jobs.timestamps import to_epoch

# The held-time split, in the order a chart stacks it.
BUCKETS = ("startup", "productive", "checkpoint", "eval", "redone", "other")
# "2xml.p4d.24xlarge,1xml.c5.4xlarge": an attempt on instance groups (jobs.retry.run_state.start_attempt).
_GROUP = re.compile(r"(\d+)x(.+)")


def measured_save_seconds(attempts: Iterable[Any]) -> float | None:
    """Seconds one checkpoint save stalled the newest attempt that saved on its cadence (its checkpoint time
    over its saves: the end's save, included in that time, makes it a slight overestimate); None when no
    attempt measured one. The next attempt's checkpoint cadence plans with it (jobs.planning.cadence)."""
    for attempt in reversed(list(attempts)):
        if attempt.checkpoint_saves and attempt.checkpoint_seconds is not None:
            return attempt.checkpoint_seconds / attempt.checkpoint_saves
    return None


@dataclass(frozen=True)
class AttemptTime:
    """One attempt's held seconds (per instance) split into BUCKETS, and its instance count."""

    held: int
    instances: int
    startup: int
    productive: int
    checkpoint: int
    eval: int
    redone: int
    other: int
    measured: bool  # the job printed the training package's time metrics

    def bucket(self, name: str) -> int:
        return getattr(self, name)


def attempt_time(attempt: Any) -> AttemptTime:
    """The split of what one attempt (a jobs.retry.run_state.Attempt) held."""
    held = attempt.training_seconds or attempt.billable_seconds or 0
    measured = attempt.train_seconds is not None
    parts = [min(value or 0, held) for value in (attempt.startup_seconds, attempt.train_seconds,
                                                  attempt.checkpoint_seconds, attempt.eval_seconds)]
    startup, train, checkpoint, evaluation = parts
    redone = min(attempt.lost_seconds, train if measured else held)
    parts = [startup, train - redone if measured else 0, checkpoint, evaluation, redone]
    # Measured parts can overlap by rounding and clocks (rank 0's process vs SageMaker's): scaled to fit the
    # held time rather than reported above it.
    total = sum(parts)
    if total > held > 0:
        parts = [p * held // total for p in parts]
    startup, productive, checkpoint, evaluation, redone = parts
    return AttemptTime(held=held, instances=attempt.instance_count or 1, startup=startup, productive=productive,
                       checkpoint=checkpoint, eval=evaluation, redone=redone, other=held - sum(parts),
                       measured=measured)


def cluster_types(instance_type: str, instance_count: int) -> list[tuple[int, str]]:
    """(count, type) of an attempt's cluster: one type, or its instance groups ("2xml.p4d.24xlarge,1x...")."""
    groups = [_GROUP.fullmatch(part) for part in instance_type.split(",")]
    if "," in instance_type and all(groups):
        return [(int(g.group(1)), g.group(2)) for g in groups]
    return [(instance_count, instance_type)]


def run_cost(attempts: Iterable[Any], prices: Mapping[str, float] | None) -> dict[str, Any]:
    """{on_demand_usd, spot_usd, spot_savings_usd, total_usd, unpriced}; a sum is None when an attempt it
    covers held instances of a type without a price (named in `unpriced`)."""
    prices = prices or {}
    sums: dict[str, float | None] = {"on_demand_usd": 0.0, "spot_usd": 0.0, "spot_savings_usd": 0.0}
    unpriced: set[str] = set()
    for attempt in attempts:
        billable, held = attempt.billable_seconds or 0, attempt.training_seconds or 0
        if not billable and not held:
            continue  # never held instances: nothing billed
        cluster = cluster_types(attempt.instance_type, attempt.instance_count)
        keys = ("spot_usd", "spot_savings_usd") if attempt.spot else ("on_demand_usd",)
        hourly = cluster_usd_per_hour(cluster, prices)
        if hourly is None:
            unpriced |= {kind for _, kind in cluster if priced(prices, kind) is None}
            sums.update(dict.fromkeys(keys))
            continue
        rate = hourly / 3600
        amounts = (billable * rate, max(held - billable, 0) * rate) if attempt.spot else (billable * rate,)
        for key, amount in zip(keys, amounts, strict=True):
            if sums[key] is not None:
                sums[key] += amount
    parts = (sums["on_demand_usd"], sums["spot_usd"])
    total = None if None in parts else sum(parts)
    return {**{k: None if v is None else round(v, 2) for k, v in sums.items()},
            "total_usd": None if total is None else round(total, 2), "unpriced": sorted(unpriced)}


def run_record(attempts: list[Any], *, started: float, ended: float,
               prices: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The run's record over `attempts` (jobs.retry.run_state.Attempt, every execution's, oldest first): wall time from
    `started` to `ended` (epoch seconds), queueing and waits between attempts, held time split into BUCKETS
    in instance-seconds, goodput (a lower bound when an attempt did not measure its time: its held time
    counts, none of it as productive), the step reached and the cost."""
    times = [attempt_time(a) for a in attempts]
    held = sum(t.held * t.instances for t in times)
    split = {name: sum(t.bucket(name) * t.instances for t in times) for name in BUCKETS}
    steps = [a.step for a in attempts if a.step is not None]
    return {
        "wall_seconds": int(max(ended - started, 0)),
        "queued_seconds": sum(a.queued_seconds or 0 for a in attempts),
        "between_attempts_seconds": _gaps(attempts),
        "held_instance_seconds": held,
        "instance_seconds": split,
        "goodput": round(split["productive"] / held, 4) if held else None,
        "unmeasured_attempts": [a.attempt for a, t in zip(attempts, times, strict=True) if t.held and not t.measured],
        "step": max(steps) if steps else None,
        "cost": run_cost(attempts, prices),
    }


def _gaps(attempts: list[Any]) -> int:
    """Seconds between one attempt's end and the next one's start (the launcher's waits)."""
    total = 0
    for before, after in zip(attempts, attempts[1:], strict=False):
        ended, began = to_epoch(before.ended_at), to_epoch(after.started_at)
        if ended and began and began > ended:
            total += int(began - ended)
    return total
