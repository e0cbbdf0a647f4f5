"""`strategy: auto`: which of one shape's sized layouts a request may run, and the pick among them.

Auto picks among jobs.planning.layout.AUTO_STRATEGIES; the renderer sends the pick's degrees (jobs.planning.auto_strategy), so a
torch-native pick must be a mesh the training package builds on the cluster the job gets:
- its degrees pass jobs.request.parallelism.check_parallelism (the launcher's and training's own check) with the
  request's micro_batch_size and pipeline schedule;
- the sized shape is the whole cluster of one instance type (not cut by sizing.max_gpus, no instance_groups);
- tp, pp and hybrid only for the reference models: they opt in to layer splitting (`tp_plan`, `blocks`,
  `pipeline_edges`); whether a model of one's own does cannot be seen from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.models import REFERENCE_MODELS
from jobs.planning.candidates import Candidate, best
from jobs.planning.layout import Numerics
from jobs.planning.shape import ModelFacts


@dataclass(frozen=True)
class AutoScope:
    model: ModelFacts
    native: bool  # hsdp, tp, pp, hybrid allowed: the sized shape is the job's whole cluster
    split_layers: bool  # tp, pp, hybrid allowed: native, and a reference model
    micro_batch: int  # the request's micro_batch_size: training checks pipeline micro-batches against it
    schedule: str  # the request's parallel.pipeline_schedule: auto runs pipelines with it alone
    stages: int | None = None  # the request's parallel.pipeline_stages_per_rank: None lets auto choose
    per_group: bool = False  # the request's micro_batch_per_group: auto sends no hyperparameter of its own

    def refusal(self, c: Candidate) -> str | None:
        """Why `strategy: auto` may not run `c` (a phrase after "it"), or None when it may."""
        lay = c.layout
        if lay.dims.builds_mesh and not self.native:
            return ("needs its mesh over the job's whole cluster of one instance type (sizing.max_gpus or "
                    "instance_groups size another shape)")
        if lay.dims.splits_layers and not self.split_layers:
            return ("splits layers, which auto does only for the reference models (set strategy and `parallel` "
                    "for a model of your own that has a tp_plan and pipeline_edges)")
        if c.per_group and not self.per_group:
            return ("reads one micro-batch per batch group, which auto does not switch on (set "
                    "hyperparameters.micro_batch_per_group, or name this layout's strategy and degrees)")
        if lay.pipeline > 1 and lay.schedule != self.schedule:
            return (f"runs the {lay.schedule} schedule, and the request's parallel.pipeline_schedule is "
                    f"{self.schedule} (set it to {lay.schedule} for auto to run this)")
        if lay.pipeline > 1 and self.stages is not None and lay.stages_per_rank != self.stages:
            return (f"holds {lay.stages_per_rank} stages a rank, and the request's parallel.pipeline_stages_per_rank "
                    f"is {self.stages} (leave it unset for auto to choose)")
        problems = lay.problems(self.model.layers, self.model.heads, self.micro_batch, c.per_group)
        return f"has degrees the training package refuses ({problems[0].message})" if problems else None

    def pick(self, cands: list[Candidate]) -> Candidate | None:
        """The best that fits among those auto may run; when none fits, the one needing the least memory."""
        allowed = [c for c in cands if self.refusal(c) is None]
        ids = {id(c) for c in allowed}
        return best(cands, lambda c: id(c) in ids) or min(allowed, key=lambda c: c.memory_gib, default=None)


def auto_scope(model: str, m: ModelFacts, n: Numerics, whole_cluster: bool, parallel: object = None) -> AutoScope:
    """`whole_cluster`: the shape sized is every GPU of the job (one instance type, no sizing.max_gpus cut);
    `parallel`: the request's `parallel` section (its pipeline schedule), None for the default."""
    return AutoScope(m, native=whole_cluster, split_layers=whole_cluster and model in REFERENCE_MODELS,
                     micro_batch=n.micro_batch, schedule=getattr(parallel, "pipeline_schedule", None) or "1f1b",
                     stages=getattr(parallel, "pipeline_stages_per_rank", None), per_group=n.per_group)
