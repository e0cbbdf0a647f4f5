"""The torch-native model-parallel layouts (hsdp, tp, pp, hybrid): request checks and the rank map.

Standard library only: the launcher's rules call `check_parallelism` before anything starts, the renderer
calls `parallel_hyperparameters`, and `trainctl plan` prints `describe_layout`. The training package builds
the same mesh (`training.mesh`): dimensions outermost first pipeline, replicate, shard, tensor; ranks
numbered host after host in SM_HOSTS order, GPUs in order within a host, so that tensor groups (and hsdp's
shard groups) are contiguous ranks on one host.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.errors import Problem
from contract.hyperparameters import TrainConfig, canonical_name
from contract.models import PRESETS

F_TP = "parallel.tensor_parallel_degree"
F_PP = "parallel.pipeline_parallel_degree"
F_SHARD = "parallel.hybrid_shard_degree"
F_MICRO = "parallel.pipeline_microbatches"
F_SCHEDULE = "parallel.pipeline_schedule"
TORCH_NATIVE = ("hsdp", "tp", "pp", "hybrid")
DATA_ONLY = ("single", "ddp", "fsdp")


@dataclass(frozen=True)
class Degrees:
    pipeline: int
    replicate: int
    shard: int
    tensor: int

    @property
    def world(self) -> int:
        return self.pipeline * self.replicate * self.shard * self.tensor


def strategy_degree_problems(strategy: str, tensor: int, pipeline: int) -> list[Problem]:
    """Contradictions between the strategy and its tensor/pipeline degrees (known before the world size)."""
    rules = {
        "hsdp": (tensor == 1 and pipeline == 1, "hsdp shards data only: use 'tp', 'pp' or 'hybrid' for "
                 f"tensor_parallel_degree={tensor}, pipeline_parallel_degree={pipeline}"),
        "tp": (tensor >= 2 and pipeline == 1, f"tp needs tensor_parallel_degree >= 2 and pipeline_parallel_degree 1 "
               f"(got {tensor}, {pipeline}): set the tensor degree, or use 'hybrid' with a pipeline"),
        "pp": (pipeline >= 2 and tensor == 1, f"pp needs pipeline_parallel_degree >= 2 and tensor_parallel_degree 1 "
               f"(got {pipeline}, {tensor}): set the pipeline degree, or use 'hybrid' with tensor parallelism"),
        "hybrid": (pipeline >= 2 and tensor >= 2, "hybrid needs pipeline_parallel_degree >= 2 and "
                   f"tensor_parallel_degree >= 2 (got {pipeline}, {tensor}): use 'tp' or 'pp' for one of them"),
    }
    if strategy in rules:
        ok, why = rules[strategy]
        return [] if ok else [Problem("strategy", f"'{strategy}' contradicts the parallel degrees: {why}")]
    if strategy == "auto":
        return _auto_degree_problems(tensor, pipeline)
    if strategy in DATA_ONLY and (tensor > 1 or pipeline > 1):
        field = F_TP if tensor > 1 else F_PP
        return [Problem(field, f"strategy '{strategy}' splits no layers, but {field.split('.')[1]}="
                        f"{tensor if tensor > 1 else pipeline}: only the smp strategy and tp, pp, hybrid split "
                        "layers; use one of them, or set it to 1")]
    return []


def degrees_strategy(tensor: int, pipeline: int) -> str | None:
    """The torch-native strategy that splits layers into these degrees (None when neither splits)."""
    return {(True, False): "tp", (False, True): "pp", (True, True): "hybrid"}.get((tensor > 1, pipeline > 1))


def _auto_degree_problems(tensor: int, pipeline: int) -> list[Problem]:
    """`strategy: auto` refuses layer-splitting degrees rather than ignoring them. Honouring them would make
    auto exactly the strategy those degrees name (the section cannot tell "unset" from 1), and auto re-sizes
    its degrees for each attempt's instance type (a capacity retry on a fallback type), which fixed degrees
    contradict: so the request says which strategy to write instead."""
    named = degrees_strategy(tensor, pipeline)
    given = [(F_TP, tensor), (F_PP, pipeline)]
    return [Problem(field, f"{field.split('.')[1]}={value} is set, but strategy 'auto' picks its own degrees "
                           f"and would ignore it: set strategy '{named}' to run these degrees yourself, or leave "
                           f"{field.split('.')[1]} at 1 for auto to choose")
            for field, value in given if value > 1]


def resolve_degrees(strategy: str, hosts: int, per_host: int, tensor: int = 1, pipeline: int = 1,
                    shard: int = 0) -> Degrees:
    """The mesh shape training will build (assumes `check_parallelism` found no problem)."""
    world = hosts * per_host
    data = max(1, world // (tensor * pipeline))
    if not shard:
        shard = min(data, max(1, per_host // tensor)) if strategy == "hsdp" else data
    return Degrees(pipeline=pipeline, replicate=max(1, data // shard), shard=shard, tensor=tensor)


def check_parallelism(strategy: str, *, hosts: int, per_host: int, tensor: int = 1, pipeline: int = 1,
                      shard: int = 0, microbatches: int | None = None, schedule: str = "1f1b",
                      n_layer: int | None = None, n_head: int | None = None,
                      micro_batch_size: int | None = None) -> list[Problem]:
    """Every reason the request's `parallel` section cannot run, each naming its field. `per_host`: GPUs
    (processes) per instance; `n_layer`/`n_head`: the model's shape when known (reference presets)."""
    problems = strategy_degree_problems(strategy, tensor, pipeline)
    if strategy not in TORCH_NATIVE or problems:
        return problems
    world = hosts * per_host
    if world % (tensor * pipeline):
        problems.append(Problem(F_TP if tensor > 1 else F_PP, (
            f"tensor {tensor} x pipeline {pipeline} = {tensor * pipeline} does not divide the {world} GPUs "
            f"({hosts} x {per_host}): choose degrees whose product divides the GPU count")))
        return problems
    if tensor > 1 and per_host % tensor:
        problems.append(Problem(F_TP, (
            f"{tensor} does not divide the {per_host} GPUs of one instance: a tensor group would span instances "
            "(every layer would talk over the network); choose a divisor of the GPUs per instance")))
    data = world // (tensor * pipeline)
    if shard and data % shard:
        problems.append(Problem(F_SHARD, f"{shard} does not divide the {data} data-parallel GPUs "
                                f"({world} / (tensor {tensor} x pipeline {pipeline})): choose a divisor"))
    elif shard and strategy == "hsdp" and per_host % (shard * tensor) and shard < data:
        problems.append(Problem(F_SHARD, f"{shard} GPUs per shard group do not fit the {per_host} GPUs of an "
                                "instance: shard groups would span instances; use a divisor of the GPUs per instance"))
    if n_head and tensor > 1 and n_head % tensor:
        problems.append(Problem(F_TP, f"{tensor} does not divide the model's {n_head} attention heads: "
                                "choose a degree that divides the head count"))
    if pipeline > 1:
        problems += _pipeline_problems(pipeline, tensor, microbatches, schedule, n_layer, micro_batch_size)
    return problems


def _pipeline_problems(pipeline: int, tensor: int, microbatches: int | None, schedule: str, n_layer: int | None,
                       micro_batch_size: int | None) -> list[Problem]:
    problems = []
    per_rank = 2 if schedule == "interleaved_1f1b" else 1
    stages = pipeline * per_rank
    if n_layer and n_layer % stages:
        problems.append(Problem(F_PP, (
            f"the model's {n_layer} layers do not split into {stages} equal stages (pipeline {pipeline} x "
            f"{per_rank} per rank for {schedule}): choose a pipeline degree whose stage count divides the layers")))
    m = microbatches or 2 * pipeline
    if m < pipeline:
        problems.append(Problem(F_MICRO, f"{m} micro-batches are fewer than the {pipeline} pipeline stages: "
                                "the pipeline would never fill; use at least the pipeline degree (default 2 x)"))
    elif micro_batch_size and (micro_batch_size * pipeline * tensor) % m:
        pooled = micro_batch_size * pipeline * tensor
        problems.append(Problem(F_MICRO, (
            f"{m} does not divide the {pooled} samples a pipeline step gets (micro_batch_size {micro_batch_size} "
            f"x pipeline {pipeline} x tensor {tensor}): change it or hyperparameters.micro_batch_size")))
    return problems


def request_problems(request, hosts: int, per_host: int) -> list[Problem]:
    """check_parallelism for a parsed JobRequest on `hosts` x `per_host` GPUs (processes, locally)."""
    preset = PRESETS.get(request.model, {}).get(request.model_size)
    hps = {canonical_name(k): v for k, v in request.hyperparameters.items()}
    p = request.parallel
    return check_parallelism(
        request.strategy.value, hosts=hosts, per_host=per_host, tensor=p.tensor_parallel_degree,
        pipeline=p.pipeline_parallel_degree, shard=p.hybrid_shard_degree, microbatches=p.pipeline_microbatches,
        schedule=p.pipeline_schedule, n_layer=getattr(preset, "n_layer", None), n_head=getattr(preset, "n_head", None),
        micro_batch_size=hps.get("micro_batch_size", TrainConfig.micro_batch_size))


def rendered_problems(values: dict, model: str, model_size: str, hosts: int, per_host: int) -> list[Problem]:
    """check_parallelism for a rendered job's hyperparameters (decoded): the degrees the job will actually run,
    the planner's for `strategy: auto`, on `hosts` x `per_host` processes."""
    preset = PRESETS.get(model, {}).get(model_size)
    hps = {canonical_name(k): v for k, v in values.items()}
    return check_parallelism(
        hps["strategy"], hosts=hosts, per_host=per_host, tensor=hps.get("tp_degree", 1),
        pipeline=hps.get("pp_degree", 1), shard=hps.get("dp_shard", 0), microbatches=hps.get("pp_microbatches"),
        schedule=hps.get("pp_schedule", "1f1b"), n_layer=getattr(preset, "n_layer", None),
        n_head=getattr(preset, "n_head", None), micro_batch_size=hps.get("micro_batch_size", TrainConfig.micro_batch_size))


def request_hyperparameters(request) -> dict:
    """parallel_hyperparameters from a parsed JobRequest's strategy and `parallel` section."""
    p = request.parallel
    return parallel_hyperparameters(request.strategy.value, p.tensor_parallel_degree, p.pipeline_parallel_degree,
                                    p.hybrid_shard_degree, p.pipeline_microbatches, p.pipeline_schedule)


def parallel_hyperparameters(strategy: str, tensor: int = 1, pipeline: int = 1, shard: int = 0,
                             microbatches: int | None = None, schedule: str = "1f1b") -> dict:
    """The hyperparameters the launcher sends for a torch-native strategy (contract.hyperparameters names)."""
    if strategy not in TORCH_NATIVE:
        return {}
    hps = {"tp_degree": tensor, "pp_degree": pipeline, "dp_shard": shard, "pp_schedule": schedule}
    if microbatches is not None:
        hps["pp_microbatches"] = microbatches
    return hps


def mesh_layout(strategy: str, hosts: list[str], per_host: int, tensor: int = 1, pipeline: int = 1,
                shard: int = 0) -> list[dict]:
    """One entry per rank: its host, local rank, and coordinates (pipeline stage, replica, shard, tensor)."""
    d = resolve_degrees(strategy, len(hosts), per_host, tensor, pipeline, shard)
    rows = []
    for rank in range(len(hosts) * per_host):
        rest, tp = divmod(rank, d.tensor)
        rest, sh = divmod(rest, d.shard)
        pp, rep = divmod(rest, d.replicate)
        rows.append({"rank": rank, "host": hosts[rank // per_host], "local_rank": rank % per_host,
                     "pipeline": pp, "replica": rep, "shard": sh, "tensor": tp})
    return rows


def describe_layout(strategy: str, hosts: list[str], per_host: int, tensor: int = 1, pipeline: int = 1,
                    shard: int = 0) -> list[str]:
    """`trainctl plan`'s lines: the degrees, then per host which ranks do what."""
    d = resolve_degrees(strategy, len(hosts), per_host, tensor, pipeline, shard)
    lines = [f"mesh (pipeline x replicate x shard x tensor) = {d.pipeline} x {d.replicate} x {d.shard} x {d.tensor}"]
    for host in hosts:
        ranks = [r for r in mesh_layout(strategy, hosts, per_host, tensor, pipeline, shard) if r["host"] == host]
        cells = ", ".join(f"r{r['rank']}=pp{r['pipeline']}/dp{r['replica']}.{r['shard']}/tp{r['tensor']}"
                          for r in ranks)
        lines.append(f"{host}: {cells}")
    return lines
