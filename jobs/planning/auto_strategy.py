"""`strategy: "auto"`: the strategy and degrees the training package runs, from the planner's sizing (jobs.planning).

`plan` is what request validation and rendering call (jobs.request.schema.resolved_strategy, jobs.render.training_job): the
best layout of the request's shape that fits among those `strategy: auto` may run (jobs.planning.auto: every
strategy the package runs but smp, degrees that pass jobs.request.parallelism.check_parallelism); when none fits, the one
needing the least memory. For hsdp, tp, pp and hybrid, `Plan.parallel` holds the hyperparameters the launcher
sends (tp_degree, pp_degree, dp_shard, pp_microbatches, pp_schedule), so the job builds the mesh that was sized.
It never raises: an input the planner cannot use falls back to FSDP, and `trainctl plan` reports the problem
itself through jobs.planning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs import catalog
from jobs.planning.auto import auto_scope
from jobs.planning.cadence import Cadence, cadence, state_bytes
from jobs.planning.layout import numerics
from jobs.planning.plan import requested_shape, shape_candidates
from jobs.planning.shape import PlanInputError, model_facts


@dataclass(frozen=True)
class Plan:
    strategy: str
    reason: str
    parallel: dict[str, Any] = field(default_factory=dict)  # torch-native degrees as hyperparameters; {} otherwise


def plan(model: str, model_size: str, instance_type: str, instance_count: int, *,
         hyperparameters: dict[str, Any] | None = None, model_shape: Any = None, sizing: Any = None,
         parallel: Any = None, one_type: bool = True) -> Plan:
    """`parallel`: the request's section (pipeline micro-batches and schedule); `one_type`: False for a
    heterogeneous cluster (instance_groups), where auto keeps to the data-parallel strategies."""
    spec = catalog.lookup(instance_type)
    if spec is None or spec.kind != "gpu":
        return Plan("ddp", f"{instance_type} has no NVIDIA GPUs: plain data parallel")
    try:
        n = numerics(hyperparameters or {})
        m = model_facts(model, model_size, model_shape, n.seq_len)
        if m is None:
            return Plan("fsdp", f"size of {model}:{model_size} unknown (no model_shape): FSDP shards whatever fits")
        nodes, per_node = requested_shape(spec, instance_count, sizing)
    except (PlanInputError, ValueError, TypeError) as exc:
        return Plan("fsdp", f"cannot size the run ({exc}): FSDP shards whatever fits")
    micro = getattr(parallel, "pipeline_microbatches", None)
    cands = shape_candidates(m, n, spec, nodes, per_node, sizing, False, micro, None,
                             getattr(parallel, "pipeline_schedule", None) or "1f1b")
    whole = one_type and (nodes, per_node) == (instance_count, spec.accelerators)
    scope = auto_scope(model, m, n, whole, parallel)
    pick = scope.pick(cands)
    if pick is None:
        return Plan("fsdp", f"no layout over {nodes} x {per_node} GPUs takes global_batch_size: FSDP shards "
                            "whatever fits")
    lay, hps = pick.layout, pick.layout.hyperparameters()
    shown = lay.strategy + (f" (pipeline {lay.pipeline} x replicate {lay.replicate} x shard {lay.shard} x tensor "
                            f"{lay.tensor})" if hps else "")
    if not pick.fits:
        return Plan(lay.strategy, f"nothing fits {nodes} x {spec.accelerators} {spec.accelerator}: {shown} needs "
                                  f"the least, {pick.memory_gib:.1f} GiB per GPU", hps)
    return Plan(lay.strategy, f"{shown}: {pick.memory_gib:.1f} of {spec.accelerator_memory_gib} GiB per "
                              f"{spec.accelerator}, {pick.step_time_s:.3g} s/step", hps)


def plan_for_request(request: Any, instance_type: str | None = None) -> Plan:
    """`plan` with everything the request says: hyperparameters, model_shape, sizing, parallel. `instance_type`:
    the attempt's, when a capacity retry moved to a fallback type (its GPUs per node set the degrees)."""
    count = request.instance.count if request.instance else 1
    return plan(request.model, request.model_size, instance_type or request.training_instance_type, count,
                hyperparameters=request.hyperparameters, model_shape=request.model_shape, sizing=request.sizing,
                parallel=request.parallel, one_type=request.instance is not None)


def attempt_cadence(request: Any, instance_type: str, spot: bool,
                    measured_stall_s: float | None = None) -> Cadence | None:
    """The Young/Daly checkpoint cadence of an attempt on `instance_type`, on Spot or not: the one `trainctl plan`
    shows for the request's shape (its nodes after sizing.max_gpus, its state size), so the job checkpoints as
    planned. None where the planner sizes nothing: no NVIDIA GPUs, an unknown model, inputs it cannot use.
    `measured_stall_s`: a save's stall as the run's earlier attempts measured it (jobs.planning.cadence.cadence)."""
    spec = catalog.lookup(instance_type)
    if spec is None or spec.kind != "gpu":
        return None
    count = request.instance.count if request.instance else sum(
        g.count for g in request.instance_groups if g.type == instance_type)
    try:
        n = numerics(request.hyperparameters)
        m = model_facts(request.model, request.model_size, request.model_shape, n.seq_len)
        if m is None:
            return None
        nodes, _ = requested_shape(spec, count, request.sizing)
    except (PlanInputError, ValueError, TypeError):
        return None
    return cadence(state_bytes(m, n), nodes, spot, n.async_checkpoint, measured_stall_s)
