"""`trainctl plan` sizing: candidates for the request's shape and others, the recommendation, and warnings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs import catalog
from jobs.planning import input_check
from jobs.planning.auto import AutoScope, auto_scope
from jobs.planning.candidates import (
    Candidate,
    best,
    evaluate,
    layouts,
    requested_layouts,
    runnable,
    shown,
    sized_numerics,
)
from jobs.planning.input_check import InputCheck
from jobs.planning.layout import AUTO_STRATEGIES, Numerics, numerics
from jobs.planning.measured import calibration_for, corrected, usable
from jobs.planning.shape import ModelFacts, PlanInputError, model_facts
from jobs.planning.warnings import PlanWarning, add_warnings
from jobs.prices import PRICE_RULE, usd_per_hour

# Shapes compared against the request's: the training families' largest sizes (8 GPUs, EFA).
COMPARED_TYPES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p5en.48xlarge",
                  "ml.g5.48xlarge", "ml.g6e.48xlarge")
COMPARED_NODES = (1, 2, 4, 8, 16, 32)
Correction = Callable[[Candidate], Candidate]


@dataclass
class PlanResult:
    recommendation: Candidate | None
    auto: Candidate | None  # the best strategy the training package runs, for `strategy: auto`
    candidates: list[Candidate]
    warnings: list[PlanWarning] = field(default_factory=list)
    model: ModelFacts | None = None
    reason: str = ""
    scope: AutoScope | None = None  # what `strategy: auto` may run here
    runs: tuple[int, int] = (0, 0)  # the platform's run records given, and those usable (jobs.planning.measured)
    input: InputCheck | None = None  # the loader's rate against the GPUs' need (jobs.planning.input_check)
    # Every layout of the requested shape (`candidates` holds each strategy's best few of it, and the other shapes'
    # bests): what `--json` lists so that any degrees the package runs can be found, with the request that runs them.
    every_layout: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"recommendation": self.recommendation.to_dict() if self.recommendation else None,
                "measured_runs": {"given": self.runs[0], "usable": self.runs[1],
                                  "corrected": sum(1 for c in self.candidates if getattr(c, "runs", None))},
                "auto_strategy": self.auto.layout.strategy if self.auto else None, "reason": self.reason,
                "candidates": [c.to_dict() for c in self.candidates],
                "every_layout": [c.to_dict() for c in self.every_layout],
                "warnings": [{"code": w.code, "message": w.message} for w in self.warnings],
                "input": self.input.to_dict() if self.input else None}


def requested_shape(spec: catalog.InstanceSpec, count: int, sizing: Any) -> tuple[int, int]:
    """(nodes, GPUs per node) the request asks for, cut down to sizing.max_gpus."""
    if count < 1:
        raise PlanInputError("instance.count", count, "must be at least 1 instance")
    max_gpus = getattr(sizing, "max_gpus", None)
    if max_gpus is not None and max_gpus < 1:
        raise PlanInputError("sizing.max_gpus", max_gpus, "must be at least 1 (1 asks for one GPU)")
    per_node = spec.accelerators
    if max_gpus is not None and max_gpus < count * per_node:
        return (1, max_gpus) if max_gpus < per_node else (max_gpus // per_node, per_node)
    return count, per_node


def _spec(instance_type: str) -> catalog.InstanceSpec:
    spec = catalog.lookup(instance_type)
    if spec is None:
        raise PlanInputError("instance.type", instance_type, "not in the instance catalog (jobs.catalog); "
                             "use e.g. ml.p4d.24xlarge")
    if not spec.runnable:
        raise PlanInputError("instance.type", instance_type, f"{spec.accelerator} runs Neuron, not CUDA: the "
                             "training package cannot run there; use a GPU type such as ml.p5.48xlarge")
    return spec


def shape_candidates(m: ModelFacts, n: Numerics, spec: catalog.InstanceSpec, nodes: int, per_node: int,
                     sizing: Any, spot: bool, pp_micro: int | None,
                     price_usd_hour: float | None = None, schedule: str = "1f1b",
                     correct: Correction | None = None) -> list[Candidate]:
    # Each layout gets the micro-batch that splits global_batch_size evenly over its ranks (the training package
    # divides by the world size); a layout with more ranks than samples per step is left out (it would refuse it), and
    # so is one whose degrees and micro-batches the package refuses (candidates.runnable).
    out = []
    for lay in layouts(m, nodes, per_node, pp_micro, schedule):
        fitted = sized_numerics(n, lay)
        lay = runnable(lay, fitted, m, pp_micro) if fitted is not None else None
        if lay is not None:
            sized = evaluate(m, fitted, spec, lay, sizing, spot, price_usd_hour)
            out.append(correct(sized) if correct else sized)
    return out


def other_shapes(m: ModelFacts, n: Numerics, request_type: str, sizing: Any, spot: bool,
                 taken: tuple[str, int, int], prices: Mapping[str, float] | None = None,
                 correct: Correction | None = None, allowed: Iterable[str] = ()) -> list[Candidate]:
    """The best layout of other shapes (node counts, and COMPARED_TYPES): only the instance types the platform
    allows (`allowed`; empty: every type), so the plan never proposes one a request would then be refused."""
    max_gpus = getattr(sizing, "max_gpus", None) or 10 ** 6
    allowed = set(allowed)
    out = []
    for instance_type in dict.fromkeys((request_type, *COMPARED_TYPES)):
        if allowed and instance_type not in allowed and instance_type != request_type:
            continue
        spec = catalog.lookup(instance_type)
        shapes = [(1, 1)] + [(k, spec.accelerators) for k in COMPARED_NODES]
        for nodes, per_node in shapes:
            if nodes * per_node > max_gpus or (instance_type, nodes, per_node) == taken:
                continue
            pick = best(shape_candidates(m, n, spec, nodes, per_node, sizing, spot, None,
                                         (prices or {}).get(instance_type), correct=correct))
            if pick is not None:
                out.append(pick)
    return out


def price_table(prices: Mapping[str, float] | None) -> Mapping[str, float]:
    """The plan's prices (instance type -> on-demand training USD per instance-hour): the table given, else none
    (jobs/catalog.py [smp]: no price kept in the code has a source to cite). The planner reads no other: where
    the prices come from (the AWS Price List API, a file) is the caller's concern."""
    if prices is None:
        return {}
    for instance_type, price in prices.items():
        if usd_per_hour(price) is None:
            raise PlanInputError(f"prices[{instance_type!r}]", price, PRICE_RULE)
    return prices


def run_correction(request: Any, runs: list[Any]) -> Correction:
    """Each candidate corrected by the platform's runs of its instance type and the request's model (see
    jobs.planning.measured); unchanged where none match."""
    return lambda c: corrected(c, calibration_for(c, request.model, request.model_size, runs))


def plan_request(request: Any, platform: Any = None, now: dt.datetime | None = None,
                 prices: Mapping[str, float] | None = None,
                 dataset_meta: Mapping[str, Any] | str | None = None, runs: Iterable[Any] = ()) -> PlanResult:
    """Size a parsed JobRequest. Raises PlanInputError for inputs the planner cannot use.

    `prices`: on-demand training USD per instance-hour by instance type ("ml.p4d.24xlarge"); a type missing from it
    has no cost ("price unknown"). None: no prices (see price_table). `dataset_meta`: the dataset's meta.json (its format
    feeds the input check), or why the caller could not read it (cli.dataset_meta), or None. `runs`: the platform's
    run records' `measured` sections (jobs.planning.measured), which correct the candidates they match; one it cannot
    use is left out."""
    prices = price_table(prices)
    runs = list(runs)
    usable_runs = [r for r in runs if usable(r)]
    correct = run_correction(request, usable_runs) if usable_runs else None
    spec = _spec(request.training_instance_type)
    if spec.kind != "gpu":
        return PlanResult(None, None, [], [PlanWarning("not_sized", f"{spec.instance_type} has no GPU: the planner "
                                                    "sizes GPU runs only")], reason="CPU instance: plain ddp")
    count = request.instance.count if request.instance else sum(g.count for g in request.instance_groups
                                                                 if g.type == spec.instance_type)
    sizing = request.sizing
    n = numerics(request.hyperparameters)
    m = model_facts(request.model, request.model_size, request.model_shape, n.seq_len)
    if m is None:
        raise PlanInputError("model_shape", None, f"{request.model!r} has no preset: give model_shape (kind, "
                             "layers, hidden, heads, or params and flops_per_sample)")
    spot = bool(request.spot) and (sizing.allow_spot if sizing else True)
    nodes, per_node = requested_shape(spec, count, sizing)
    pp_micro = request.parallel.pipeline_microbatches if request.parallel else None
    schedule = request.parallel.pipeline_schedule if request.parallel else "1f1b"
    mine = shape_candidates(m, n, spec, nodes, per_node, sizing, spot, pp_micro, prices.get(spec.instance_type),
                            schedule, correct)
    if not mine:
        raise _no_layout(n, spec, nodes, per_node)
    least = min(mine, key=lambda c: c.memory_gib)
    rec = best(mine) or least
    whole = request.instance is not None and (nodes, per_node) == (count, spec.accelerators)
    scope = auto_scope(request.model, m, n, whole, request.parallel)
    auto = scope.pick(mine)
    others = other_shapes(m, n, spec.instance_type, sizing, spot, (spec.instance_type, nodes, per_node), prices,
                          correct, getattr(platform, "allowed_instance_types", ()))
    # The table shows each strategy's best few of this shape (candidates.shown), the recommendation, auto's pick and
    # the layout the request names.
    keep = (rec, auto, *requested_layouts(mine, request))
    result = PlanResult(rec, auto, shown(mine, keep) + others, model=m, reason=_reason(rec, auto), scope=scope,
                        input=input_check.check(rec, m, spec, request, dataset_meta), runs=(len(runs), len(usable_runs)),
                        every_layout=mine)
    add_warnings(result, request, platform, now or dt.datetime.now(dt.UTC))
    return result


def _no_layout(n: Numerics, spec: catalog.InstanceSpec, nodes: int, per_node: int) -> PlanInputError:
    """Why no layout of the requested shape runs, as the field to change. Every data-parallel layout runs without a
    global batch (no degrees, no pipeline micro-batches to refuse), so only the global batch leaves none: the training
    package splits it evenly over the ranks that read micro-batches, and over fewer samples than ranks it cannot."""
    return PlanInputError("hyperparameters.global_batch_size", n.global_batch, (
        f"splits evenly over no layout of {nodes} x {spec.instance_type} ({nodes * per_node} GPUs): the training "
        f"package divides it by the ranks that read micro-batches; use a multiple of {nodes * per_node}, or fewer GPUs"))


def _reason(rec: Candidate, auto: Candidate | None) -> str:
    lay = rec.layout
    fit = (f"{rec.memory_gib:.1f} of {rec.capacity_gib:.0f} GiB per GPU" if rec.fits
           else f"needs {rec.memory_gib:.1f} GiB per GPU, more than {rec.capacity_gib:.0f}")
    text = f"{lay.strategy} over {lay.gpus} GPU(s): {fit}, {rec.step_time_s:.3g} s/step"
    if auto is None:
        text += "; `strategy: auto` finds no layout the training package runs on this shape"
    elif auto is not rec:
        text += f"; `strategy: auto` runs {auto.layout.strategy} (auto picks among {', '.join(AUTO_STRATEGIES)})"
    return text
