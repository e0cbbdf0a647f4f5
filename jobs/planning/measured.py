"""The platform's own runs against the planner: what a finished run measured, beside the planner's figure for the
same layout (the run record's `measured` section, written by Summarize), and the plan corrected by such runs.

A run's `measured` section is read from its last training job's description alone (DescribeTrainingJob, as
Summarize holds it): the instance type and count (ResourceConfig), the strategy, degrees, model and numerics the
launcher sent (HyperParameters: jobs.render.training_job.training_hyperparameters) and the training package's last
step_time_ms and mfu (FinalMetricDataList). The planner sizes that layout (jobs.planning.timing.step_time), so
how far it was off is known when the run ends. A model of one's own (no preset) is recorded without a
prediction: its `model_shape` is the request's and never reaches the job.

The plan's correction: for a candidate, the runs on its instance type with its model family, narrowed to the
same model size and strategy where such runs exist (then the same strategy, then the family alone), scale its
step time by their median measured/predicted ratio (the median: one odd run, e.g. an input-bound one, does not
move it). Its error band is the spread of those runs' ratios around that median; from one run there is no
spread, and the generation's published band stays. No matching run: the candidate is as the planner made it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.hyperparameters import (
    TrainConfig,
    canonical_hyperparameters,
    decode_hyperparameters,
)
from contract.metrics import MFU, STEP_TIME_MS
from contract.parallel import ParallelDims, microbatches
from jobs import catalog
from jobs.planning.candidates import STARTUP_HOURS, Candidate
from jobs.planning.layout import SIZED_STRATEGIES, Layout, numerics
from jobs.planning.shape import PlanInputError, model_facts
from jobs.planning.timing import step_time

# The keys a `measured` section must hold to calibrate a plan; a record without them (older, or malformed) is
# left out of the plan, counted, never a traceback.
REQUIRED = ("instance_type", "model", "strategy", "step_time_s", "predicted_step_time_s")


def job_layout(strategy: str, nodes: int, per_node: int, hps: Mapping[str, Any]) -> Layout | None:
    """The planner's Layout of what the job ran (the training package's own degree rules,
    contract.parallel.ParallelDims.resolve); None for smp (SMP's degrees are not the planner's) or a strategy it
    does not know."""
    if strategy not in SIZED_STRATEGIES:
        return None
    d = ParallelDims.resolve(strategy, nodes * per_node, per_node, int(hps.get("tp_degree") or 1),
                             int(hps.get("pp_degree") or 1), int(hps.get("dp_shard") or 0))
    return Layout.of(d, nodes, per_node, microbatches=microbatches(hps.get("pp_microbatches"), d.pp),
                     schedule=str(hps.get("pp_schedule") or TrainConfig.pp_schedule),
                     stages=int(hps.get("pp_stages_per_rank") or 0) or None)


def measured_section(job: Mapping[str, Any] | None, run_id: str = "") -> dict[str, Any] | None:
    """The run record's `measured` section from its last job's description; None when the job measured no step
    time (it ended before its first log interval) or did not run on one instance type."""
    job = job or {}
    metrics = {m.get("MetricName"): m.get("Value") for m in job.get("FinalMetricDataList") or []}
    step_ms, resources = metrics.get(STEP_TIME_MS), job.get("ResourceConfig") or {}
    instance_type, count = resources.get("InstanceType"), resources.get("InstanceCount")
    if not _positive(step_ms) or not isinstance(instance_type, str) or not isinstance(count, int) or count < 1:
        return None
    hps = canonical_hyperparameters(decode_hyperparameters(job.get("HyperParameters") or {}))
    defaults = TrainConfig()
    section = {
        "run_id": run_id, "job_name": job.get("TrainingJobName", ""),
        "instance_type": instance_type, "instance_count": count, "strategy": hps.get("strategy", defaults.strategy),
        "model": hps.get("model", defaults.model), "model_size": hps.get("model_size", defaults.model_size),
        "micro_batch_size": hps.get("micro_batch_size", defaults.micro_batch_size), "seq_len": hps.get("seq_len"),
        # The step time in seconds (the metric is in ms, the planner in s); MFU under its metric's own name.
        "step_time_s": step_ms / 1e3, MFU: metrics.get(MFU),
    }
    predicted, why = _prediction(section, hps)
    section |= {"degrees": predicted.get("degrees"), "predicted_step_time_s": predicted.get("predicted_step_time_s"),
                "predicted_mfu": predicted.get("predicted_mfu"), "not_predicted": why}
    ratio = (section["step_time_s"] / section["predicted_step_time_s"]) if section["predicted_step_time_s"] else None
    section["measured_over_predicted"] = None if ratio is None else round(ratio, 4)
    return section


def _prediction(section: dict[str, Any], hps: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """({degrees, predicted_step_time_s, predicted_mfu} the planner gives the section's layout, ""), or (what it
    has, why it gives no figure)."""
    spec = catalog.lookup(section["instance_type"])
    if spec is None or not spec.accelerators or spec.gpu is None:
        return {}, f"{section['instance_type']} is not a GPU type of the catalog"
    # A hyperparameter of a type the planner cannot read (a job not launched by this platform's renderer) is said,
    # never a fault of Summarize.
    try:
        layout = job_layout(section["strategy"], section["instance_count"], spec.accelerators, hps)
        if layout is None:
            return {}, f"the planner does not lay out strategy {section['strategy']}"
        n = numerics(hps)
        m = model_facts(section["model"], section["model_size"], None, n.seq_len)
    except (PlanInputError, TypeError, ValueError) as exc:
        return {}, f"the planner cannot read the job's hyperparameters: {exc}"
    if m is None:
        return {"degrees": layout.degrees()}, (f"{section['model']} is not a preset: the request's model_shape "
                                               "does not reach the job")
    seconds = step_time(m, n, spec, layout).total
    samples = n.step_samples(layout.gpus)
    # The MFU metric's own formula (training.metrics.meter): FLOPs of the step's samples over the GPUs' peak.
    mfu = m.flops_per_sample * samples / seconds / (spec.gpu.peak_tflops * 1e12 * layout.gpus)
    return {"degrees": layout.degrees(), "predicted_step_time_s": round(seconds, 6),
            "predicted_mfu": round(mfu, 4)}, ""


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def usable(section: Any) -> bool:
    """Can this `measured` section calibrate a plan (every REQUIRED key, a positive step time and prediction)?"""
    return (isinstance(section, Mapping) and all(section.get(k) is not None for k in REQUIRED)
            and _positive(section["step_time_s"]) and _positive(section["predicted_step_time_s"])
            and all(isinstance(section[k], str) for k in ("instance_type", "model", "strategy")))


# ---- the plan corrected by runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunCalibration:
    """The runs a candidate's figures were corrected by, and how."""

    factor: float  # median measured/predicted step time
    runs: tuple[Mapping[str, Any], ...]
    matched_on: str  # the keys the runs share with the candidate: "instance type, model, model size, strategy", ...
    band: float | None  # the ratios' spread around the factor; None from one run

    def describe_runs(self) -> list[str]:
        return [f"run {r.get('run_id') or r.get('job_name') or '?'} ({r['strategy']} on {r.get('instance_count')} x "
                f"{r['instance_type']}, {r['model']} {r.get('model_size') or ''}".rstrip() + "): measured "
                f"{r['step_time_s']:.4g} s/step, the model {r['predicted_step_time_s']:.4g} s "
                f"({_ratio(r):.2f}x)" for r in self.runs]


def _ratio(section: Mapping[str, Any]) -> float:
    return section["step_time_s"] / section["predicted_step_time_s"]


# Narrowest first: the first tier with a matching run is the one used.
TIERS = (("model_size", "strategy"), ("strategy",), ())


def calibration_for(candidate: Candidate, model: str, model_size: str | None,
                    runs: Iterable[Mapping[str, Any]]) -> RunCalibration | None:
    """The runs that correct `candidate` (of `model` / `model_size`), narrowest tier first; None when none match."""
    wanted = {"instance_type": candidate.instance_type, "model": model, "model_size": model_size,
              "strategy": candidate.layout.strategy}
    same = [r for r in runs if usable(r) and r["instance_type"] == wanted["instance_type"]
            and r["model"] == model]
    for keys in TIERS:
        matched = [r for r in same if all(r.get(k) == wanted[k] for k in keys)]
        if matched:
            ratios = [_ratio(r) for r in matched]
            factor = statistics.median(ratios)
            # Rounded up to a percent; rounded to 1e-6 first so that float noise (25.0000001%) does not add one.
            spread = max(abs(x / factor - 1) for x in ratios)
            band = math.ceil(round(spread * 100, 6)) / 100 if len(matched) > 1 else None
            on = ", ".join(("instance type", "model", *(k.replace("_", " ") for k in keys)))
            return RunCalibration(factor, tuple(matched), on, band)
    return None


@dataclass(frozen=True)
class CorrectedCandidate(Candidate):
    """A candidate whose step time, throughput, hours and cost were scaled by the platform's runs."""

    # Not compared: candidates are hashed (the plan's shortlist), and the runs are their source, not their identity.
    runs: RunCalibration | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        cal = self.runs
        band = cal.band if cal.band is not None else d["error_band"]
        return d | {"error_band": band, "calibrated_from": cal.describe_runs() + d["calibrated_from"],
                    "measured_runs": {"count": len(cal.runs), "matched_on": cal.matched_on,
                                      "measured_over_predicted": round(cal.factor, 4),
                                      "spread": cal.band}}


def corrected(candidate: Candidate, cal: RunCalibration | None) -> Candidate:
    """`candidate` with its step time scaled by `cal.factor` (and what follows from it); unchanged without runs."""
    if cal is None:
        return candidate
    f = cal.factor
    hours = STARTUP_HOURS + (candidate.hours - STARTUP_HOURS) * f
    scale = hours / candidate.hours
    fields = {k.name: getattr(candidate, k.name) for k in dataclasses.fields(Candidate)}
    return CorrectedCandidate(**fields | {
        "step_time_s": candidate.step_time_s * f, "throughput": candidate.throughput / f,
        "hours": hours,
        "cost_usd": None if candidate.cost_usd is None else candidate.cost_usd * scale,
        "cost_on_demand_usd": None if candidate.cost_on_demand_usd is None else candidate.cost_on_demand_usd * scale,
    }, runs=cal)
