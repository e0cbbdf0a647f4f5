"""`strategy: "auto"`: the strategy the training package runs, from the planner's sizing (jobs.planning).

`plan` keeps the signature request validation and rendering call (jobs.request_schema.resolved_strategy): the
best layout of the request's shape that fits among jobs.planning.layout.AUTO_STRATEGIES (single, ddp, fsdp); when
none fits, the one needing the least memory (FSDP shards the most). It never raises: an input the planner
cannot use falls back to FSDP, and `trainctl plan` reports the problem itself through jobs.planning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs import catalog
from jobs.planning.candidates import best
from jobs.planning.layout import numerics
from jobs.planning.plan import requested_shape, shape_candidates
from jobs.planning.shape import PlanInputError, model_facts


@dataclass(frozen=True)
class Plan:
    strategy: str
    reason: str


def plan(model: str, model_size: str, instance_type: str, instance_count: int, *,
         hyperparameters: dict[str, Any] | None = None, model_shape: Any = None, sizing: Any = None) -> Plan:
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
    cands = shape_candidates(m, n, spec, nodes, per_node, sizing, False, None)
    runnable = [c for c in cands if c.layout.auto_ok]
    pick = best(runnable)
    if pick is None:
        pick = min(runnable, key=lambda c: c.memory_gib)
        return Plan(pick.layout.strategy, f"nothing fits {nodes} x {spec.accelerators} {spec.accelerator}: "
                                          f"{pick.layout.strategy} needs the least, {pick.memory_gib:.1f} GiB per GPU")
    return Plan(pick.layout.strategy, f"{pick.memory_gib:.1f} of {spec.accelerator_memory_gib} GiB per "
                                      f"{spec.accelerator}, {pick.step_time_s:.3g} s/step")


def plan_for_request(request: Any) -> Plan:
    """`plan` with everything the request says: hyperparameters, model_shape, sizing."""
    count = request.instance.count if request.instance else 1
    return plan(request.model, request.model_size, request.training_instance_type, count,
                hyperparameters=request.hyperparameters, model_shape=request.model_shape, sizing=request.sizing)
