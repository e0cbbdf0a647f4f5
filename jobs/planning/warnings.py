"""What the plan warns about: a run that does not fit, does not pay, misses its deadline or budget, cannot be
fed by its loader (jobs.planning.input_check) or its input mode, or outlives its training plan."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from jobs.planning.cadence import PLAN_RECLAIM_HOURS
from jobs.planning.candidates import STARTUP_HOURS
from jobs.planning.input_check import fixes
from jobs.planning.timing import pipeline_bubble
from jobs.timestamps import utc_datetime

POOR_EFFICIENCY = 0.5  # below this, more than half of the GPU-hours wait on communication
# A pipeline idling more than this share of each step is told how micro-batches shrink its bubble: 1F1B at the
# default 2 micro-batches a stage idles (p - 1) / (3p - 1), 27% at 4 stages and 30% at 8 (GPU-hours paid for nothing).
IDLE_PIPELINE = 0.2
# FSx for Lustre: the platform's file system (README: PERSISTENT_2, 1200 GiB at 250 MB/s per TiB). FastFile
# streams from S3 on demand: we take 0.5 GB/s per instance (an assumption, not a published figure). File mode
# copies the data to local storage first, then reads at disk speed: never the bottleneck, but slower to start.
FSX_BYTES_S = 1.2 * 250e6
FASTFILE_BYTES_S_PER_NODE = 0.5e9
CAPACITY_WAIT_HOURS = 1.0  # Spot capacity does not come back at once after an interruption


@dataclass(frozen=True)
class PlanWarning:
    code: str
    message: str


def shape_words(c: Any) -> str:
    return f"{c.layout.strategy} on {c.layout.nodes} x {c.instance_type} ({c.layout.gpus} GPUs)"


def nearest_fit(result: Any) -> Any:
    """The layout that fits nearest the recommendation's shape: the fewest GPUs of its instance type, else of any
    type the plan compared (only those the platform allows); None when nothing fits."""
    rec = result.recommendation
    fitting = [c for c in result.candidates if c.fits]
    same = [c for c in fitting if c.instance_type == rec.instance_type]
    return min(same or fitting, key=lambda c: (c.layout.gpus, c.step_time_s), default=None)


def add_warnings(result: Any, request: Any, platform: Any, now: dt.datetime) -> None:
    rec, w = result.recommendation, result.warnings
    sizing = request.sizing
    if not rec.fits:
        nearest = nearest_fit(result)
        w.append(PlanWarning("does_not_fit", (
            f"no strategy fits {rec.layout.nodes} x {rec.instance_type}: the best needs {rec.memory_gib:.1f} GiB per "
            f"GPU of {rec.capacity_gib:.0f}; set hyperparameters.activation_checkpointing, lower micro_batch_size"
            + (f", or use {shape_words(nearest)}" if nearest else "") + ".")))
    if result.auto is not None and result.auto is not rec and rec.fits:
        why = (result.scope and result.scope.refusal(rec)) or "is not one auto picks"
        w.append(PlanWarning("auto_picks_other", (
            f"{rec.layout.strategy} would be best, but it {why}: `strategy: auto` "
            f"runs {result.auto.layout.strategy} ({result.auto.step_time_s:.3g} s/step against "
            f"{rec.step_time_s:.3g}).")))
    if rec.layout.gpus > 1 and rec.scaling_efficiency < POOR_EFFICIENCY:
        cheaper = [c for c in result.candidates if c.layout.gpus < rec.layout.gpus and c.fits]
        alt = min(cheaper, key=lambda c: c.hours * c.layout.nodes, default=None)
        w.append(PlanWarning("distribution_does_not_pay", (
            f"{rec.layout.gpus} GPUs run at {rec.scaling_efficiency:.0%} of linear scaling: communication outweighs "
            "the compute per step (raise micro_batch_size, or use fewer GPUs)"
            + (f"; {shape_words(alt)} takes {alt.hours:.2f} h" + (f" for ${alt.cost_usd:,.0f}" if alt.cost_usd else "")
               if alt else "") + ".")))
    if rec.fits and rec.layout.pipeline > 1 and rec.bubble > IDLE_PIPELINE:
        w.append(_pipeline_bubble(rec.layout, rec.bubble))
    _deadline_and_budget(result, sizing, w)
    _io(result, request, w)
    _training_plan(result, request, platform, now, w)


def _pipeline_bubble(lay: Any, bubble: float) -> PlanWarning:
    """How much of each step the recommended pipeline idles, and what four times its micro-batches would idle (the
    bubble the time model charges, timing.pipeline_bubble). The planner compares schedules but takes the micro-batch
    count as given, so that is the fix it names."""
    p, v, m = lay.pipeline, lay.stages_per_rank, lay.microbatches
    more = 4 * m
    return PlanWarning("pipeline_bubble", (
        f"the pipeline idles {bubble:.0%} of each step (filling and draining {p} stages around {m} micro-batches"
        + (f", {v} stages a rank" if v > 1 else "") + f"); {more} micro-batches would idle "
        f"{pipeline_bubble(p, v, more):.0%}: raise parallel.pipeline_microbatches, with "
        "hyperparameters.micro_batch_size so that they divide the samples a pipeline step gets."))


def _deadline_and_budget(result: Any, sizing: Any, w: list) -> None:
    rec = result.recommendation
    deadline = getattr(sizing, "deadline_hours", None)
    if deadline is not None and rec.hours > deadline:
        meets = [c for c in result.candidates if c.fits and c.hours <= deadline]
        pick = cheapest(meets)
        w.append(PlanWarning("deadline_unreachable", (
            f"the run takes {rec.hours:.2f} h, past the {deadline:g} h deadline; "
            + (f"{shape_words(pick)} meets it in {pick.hours:.2f} h" if pick else
               "no candidate within sizing.max_gpus meets it: extend the deadline or shrink the data/epochs") + ".")))
    elif deadline is not None and rec.spot:
        interruptions = rec.hours / rec.cadence.mtbi_h
        worst = rec.hours + interruptions * (rec.cadence.lost_per_interruption_h + CAPACITY_WAIT_HOURS) * 2
        if worst > deadline:
            w.append(PlanWarning("spot_risks_deadline", (
                f"on Spot, expect {interruptions:.1f} interruptions; with capacity waits the run may take "
                f"{worst:.1f} h, past the {deadline:g} h deadline: set spot false, or "
                "retry.interruptions_before_on_demand lower.")))
    budget = getattr(sizing, "budget_usd", None)
    if rec.cost_usd is None:
        w.append(PlanWarning("price_unknown", _price_unknown(rec.instance_type, budget)))
    elif budget is not None and rec.cost_usd > budget:
        w.append(PlanWarning("over_budget", f"the run costs ${rec.cost_usd:,.0f}, over sizing.budget_usd={budget:g}."))


def cheapest(cands: list) -> Any:
    """By dollars when every candidate has a price, else by instance-hours: one unit, never dollars against hours."""
    if all(c.cost_usd is not None for c in cands):
        return min(cands, key=lambda c: c.cost_usd, default=None)
    return min(cands, key=lambda c: c.hours * c.layout.nodes, default=None)


def _price_unknown(instance_type: str, budget: float | None) -> str:
    """The plan's price table has no price for the type (jobs.planning.plan.price_table): say so rather than show a
    made-up cost."""
    text = (f"price unknown: the plan's price table has no on-demand training price for {instance_type}, so the "
            "plan shows no cost")
    if budget is not None:
        text += f" and cannot check sizing.budget_usd={budget:g}"
    return text + (" (`trainctl plan --prices aws` reads prices from the AWS Price List API, `--prices FILE.json` "
                   "from a file of instance type -> USD per hour).")


def _io(result: Any, request: Any, w: list) -> None:
    """io_bound: the input check's shortfall (result.input: the loader's decode rate against the GPUs' need), and
    the input mode's bandwidth against the bytes those samples take in the dataset's format."""
    rec, m = result.recommendation, result.model
    check = getattr(result, "input", None)
    if m is None or check is None:
        return
    short = []
    if check.bound:
        short.append(f"the loader supplies {check.supply:,.0f} samples/s per instance ({check.processes} processes "
                     f"at ~{check.rate_per_process:,.0f} each, {check.data_format}), the GPUs consume "
                     f"{check.need:,.0f}: {check.wait_share:.0%} of each step waits for data, over input_bound_share "
                     f"{check.limit:g}, and the run takes ~{_fed_hours(rec.hours, check.wait_share):,.2f} h, not "
                     f"{rec.hours:,.2f} (fix: {fixes(check, rec.instance_type)})")
    # An unknown format is read as the model's raw sample (a ViT's: pixels as .npy arrays, the largest).
    sample_bytes = check.bytes_per_sample if check.checked else m.sample_bytes
    if sample_bytes is not None:
        samples_s = rec.throughput / (m.tokens if rec.throughput_unit == "tokens/s" else 1)
        need = samples_s * sample_bytes
        mode = request.effective_input_mode
        supply = {"FSx": FSX_BYTES_S, "FastFile": FASTFILE_BYTES_S_PER_NODE * rec.layout.nodes}.get(mode)
        if supply is not None and need > supply:
            as_what = f"{check.data_format}" if check.checked else "raw samples: the format is unknown"
            fix = "a larger FSx (its throughput grows with its size), File mode" if mode == "FSx" else \
                "FSx for Lustre or File mode"
            short.append(f"{samples_s:,.0f} samples/s need {need / 1e6:,.0f} MB/s of input ({as_what}); {mode} "
                         f"gives about {supply / 1e6:,.0f} MB/s (fix: {fix}, or fewer GPUs)")
    if short:
        w.append(PlanWarning("io_bound", "the GPUs will wait for input: " + "; and ".join(short) + "."))


def _fed_hours(hours: float, wait_share: float) -> float:
    """The run's hours when each step also waits `wait_share` of its time for data: its steps (not the startup)
    take 1 / (1 - share) as long."""
    return STARTUP_HOURS + (hours - STARTUP_HOURS) / (1 - wait_share)


def _training_plan(result: Any, request: Any, platform: Any, now: dt.datetime, w: list) -> None:
    name = getattr(request, "training_plan", None)
    plan = (getattr(platform, "training_plans", None) or {}).get(name) if name else None
    if plan is None:
        return
    end = getattr(plan, "end_time", None)
    if end is None:
        w.append(PlanWarning("training_plan_end_unknown", (
            f"training plan {name!r} has no end time in the platform settings: the planner cannot check the run "
            "ends before SageMaker reclaims the instances (30 min before the plan ends); add `end_time` (ISO 8601, "
            "UTC) to PlatformSettings.training_plans entries.")))
        return
    end = utc_datetime(end)
    rec = result.recommendation
    left = (end - now).total_seconds() / 3600 - PLAN_RECLAIM_HOURS
    if rec.hours > left:
        last = end - dt.timedelta(hours=PLAN_RECLAIM_HOURS, seconds=rec.cadence.save_s * 2)
        w.append(PlanWarning("training_plan_ends", (
            f"the run takes {rec.hours:.1f} h but plan {name!r} reclaims its instances in {max(left, 0):.1f} h: "
            f"checkpoint by {last:%Y-%m-%d %H:%M} UTC (set hyperparameters.checkpoint_minutes) and resume on a new plan.")))
