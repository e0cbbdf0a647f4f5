"""The torch-native model-parallel layouts (hsdp, tp, pp, hybrid): request checks and the rank map.

Standard library only: the launcher's rules call `check_parallelism` before anything starts, the renderer
calls `request_hyperparameters` (contract.parallel.parallel_hyperparameters), and `trainctl plan` prints `describe_layout`. The training package builds
the same mesh (`training.parallel.mesh`); the rules, the degrees and the rank map are `contract.parallel`'s, which
the training package checks too, naming its hyperparameters where these name the request's fields.
"""

from __future__ import annotations

from contract.errors import Problem
from contract.hyperparameters import TrainConfig, canonical_hyperparameters
from contract.models import PRESETS
from contract.parallel import (
    REQUEST,
    ParallelDims,
    layout_problems,
    parallel_hyperparameters,
)


def check_parallelism(strategy: str, *, hosts: int, per_host: int, tensor: int = 1, pipeline: int = 1,
                      shard: int = 0, microbatches: int | None = None, schedule: str = "1f1b",
                      n_layer: int | None = None, n_head: int | None = None,
                      micro_batch_size: int | None = None, per_group: bool = False,
                      stages: int | None = None) -> list[Problem]:
    """Every reason the request's `parallel` section cannot run, each naming its field. `per_host`: GPUs
    (processes) per instance; `n_layer`/`n_head`: the model's shape when known (reference presets);
    `per_group`: hyperparameters.micro_batch_per_group."""
    return layout_problems(strategy, hosts=hosts, per_host=per_host, tensor=tensor, pipeline=pipeline, shard=shard,
                           microbatches=microbatches, schedule=schedule, n_layer=n_layer, n_head=n_head,
                           micro_batch_size=micro_batch_size, a=REQUEST, per_group=per_group, stages=stages)


def request_problems(request, hosts: int, per_host: int) -> list[Problem]:
    """check_parallelism for a parsed JobRequest on `hosts` x `per_host` GPUs (processes, locally): against the
    model's own shape, its `model_shape` (a model of one's own) or its preset."""
    n_layer, n_head = model_layers_and_heads(request)
    hps = canonical_hyperparameters(request.hyperparameters)
    p = request.parallel
    return check_parallelism(
        request.strategy.value, hosts=hosts, per_host=per_host, tensor=p.tensor_parallel_degree,
        pipeline=p.pipeline_parallel_degree, shard=p.hybrid_shard_degree, microbatches=p.pipeline_microbatches,
        schedule=p.pipeline_schedule, n_layer=n_layer, n_head=n_head,
        micro_batch_size=hps.get("micro_batch_size", TrainConfig.micro_batch_size),
        per_group=hps.get("micro_batch_per_group") is True, stages=p.pipeline_stages_per_rank)


def model_layers_and_heads(request) -> tuple[int | None, int | None]:
    """The layers and attention heads the job's model has, where known: a `model_shape`'s (only a model of one's
    own has one: a reference model trains its preset, jobs.request.cross_rules), else the preset's."""
    if request.model_shape is not None:
        return request.model_shape.layers, request.model_shape.heads
    preset = PRESETS.get(request.model, {}).get(request.model_size)
    return getattr(preset, "n_layer", None), getattr(preset, "n_head", None)


def rendered_problems(values: dict, model: str, model_size: str, hosts: int, per_host: int) -> list[Problem]:
    """check_parallelism for a rendered job's hyperparameters (decoded): the degrees the job will actually run,
    the planner's for `strategy: auto`, on `hosts` x `per_host` processes."""
    preset = PRESETS.get(model, {}).get(model_size)
    hps = canonical_hyperparameters(values)
    return check_parallelism(
        hps["strategy"], hosts=hosts, per_host=per_host, tensor=hps.get("tp_degree", 1),
        pipeline=hps.get("pp_degree", 1), shard=hps.get("dp_shard", 0), microbatches=hps.get("pp_microbatches"),
        schedule=hps.get("pp_schedule", "1f1b"), n_layer=getattr(preset, "n_layer", None),
        n_head=getattr(preset, "n_head", None), micro_batch_size=hps.get("micro_batch_size", TrainConfig.micro_batch_size),
        per_group=hps.get("micro_batch_per_group") is True, stages=hps.get("pp_stages_per_rank"))


def request_hyperparameters(request) -> dict:
    """parallel_hyperparameters from a parsed JobRequest's strategy and `parallel` section."""
    p = request.parallel
    return parallel_hyperparameters(request.strategy.value, p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                    p.hybrid_shard_degree, p.pipeline_microbatches, p.pipeline_schedule,
                                    p.pipeline_stages_per_rank)


def mesh_layout(strategy: str, hosts: list[str], per_host: int, tensor: int = 1, pipeline: int = 1,
                shard: int = 0) -> list[dict]:
    """One entry per rank: its host, local rank, and coordinates (pipeline stage, replica, shard, tensor)."""
    d = ParallelDims.resolve(strategy, len(hosts) * per_host, per_host, tensor, pipeline, shard)
    return [{"rank": rank, "host": hosts[rank // per_host], "local_rank": rank % per_host, **d.coordinates(rank)}
            for rank in range(len(hosts) * per_host)]


def describe_layout(strategy: str, hosts: list[str], per_host: int, tensor: int = 1, pipeline: int = 1,
                    shard: int = 0) -> list[str]:
    """`trainctl plan`'s lines: the degrees, then per host which ranks do what."""
    d = ParallelDims.resolve(strategy, len(hosts) * per_host, per_host, tensor, pipeline, shard)
    lines = [f"mesh (pipeline x replicate x shard x tensor) = {d.pp} x {d.replicate} x {d.shard} x {d.tp}"]
    for host in hosts:
        ranks = [r for r in mesh_layout(strategy, hosts, per_host, tensor, pipeline, shard) if r["host"] == host]
        cells = ", ".join(f"r{r['rank']}=pp{r['pipeline']}/dp{r['replica']}.{r['shard']}/tp{r['tensor']}"
                          for r in ranks)
        lines.append(f"{host}: {cells}")
    return lines
