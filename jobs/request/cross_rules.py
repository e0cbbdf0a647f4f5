"""Rules across the fields of a parsed job request (CreateTrainingJob's and the training package's), each
problem naming the field to change. `cross_field_problems` runs them all; field-level rules are in
jobs.request.field_rules, rules that need the deployed platform in jobs.request.platform_rules."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from contract.errors import Problem
from contract.hyperparameters import Strategy, canonical_name
from contract.metrics import MAX_REGEX_LENGTH, METRIC_NAMES
from contract.models import FACTORY_PATTERN, PRESETS, REFERENCE_MODELS, preset_names
from contract.parallel import MODEL_PARALLEL, strategy_degree_problems
from jobs import catalog
from jobs.request.environment_rules import secrets_problems
from jobs.request.field_rules import dataset_kind
from jobs.request.hyperparameter_rules import platform_hyperparameter_count
from jobs.request.limits import MAX_HYPERPARAMETERS
from jobs.request.schema import JobRequest

Add = Callable[[str, str], None]
# (field path, spec) of every instance type a request may run on: instance.type, fallbacks, groups.
Specs = list[tuple[str, catalog.InstanceSpec]]


def cross_field_problems(r: JobRequest) -> list[Problem]:
    found: list[Problem] = []

    def add(path: str, message: str) -> None:
        found.append(Problem(path, message))

    specs = [("instance.type" if i == 0 else f"instance.fallbacks[{i - 1}]", catalog.lookup(t))
             for i, t in enumerate(r.instance_types)]
    specs += [(f"instance_groups[{i}].type", catalog.lookup(g.type)) for i, g in enumerate(r.instance_groups)]
    _model_problems(r, add)
    _init_problems(r, add)
    _data_problems(r, add)
    _instance_problems(r, add)
    _budget_problems(r, specs, add)
    _capacity_problems(r, add)
    _strategy_problems(r, specs, add)
    _api_limit_problems(r, add)
    for path, message in secrets_problems(r.environment, r.secrets):
        add(path, message)
    return found


def _model_problems(r: JobRequest, add: Add) -> None:
    if r.model in PRESETS and r.model_size not in preset_names(r.model):
        presets = preset_names(r.model)
        close = difflib.get_close_matches(r.model_size, presets, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        add("model_size", f"{r.model} has no preset {r.model_size!r}; {hint}presets: {', '.join(presets)}")
    elif r.model not in PRESETS and not re.fullmatch(FACTORY_PATTERN, r.model):
        add("model", f"{r.model!r}: use {', '.join(REFERENCE_MODELS)}, or `package.module:factory` for your own model")
    elif r.model in PRESETS and r.model_shape is not None:
        # The job trains the preset whatever the shape says: a plan of the shape would promise another model, and
        # its degrees would be checked against heads and layers the job does not have.
        preset = PRESETS[r.model][r.model_size]
        add("model_shape", f"{r.model} trains its model_size preset ({r.model_size}: {preset.n_layer} layers, "
                           f"{preset.n_head} heads, width {preset.d_model}); model_shape describes a model of your "
                           f"own (model 'package.module:factory'): remove it, or choose another preset of "
                           f"{', '.join(preset_names(r.model))}")


def _init_problems(r: JobRequest, add: Add) -> None:
    if not r.init_from_run:
        return
    if r.resume_run:
        add("init_from_run", f"a request either continues run {r.resume_run} (resume_run) or starts a new run from "
                             f"run {r.init_from_run}'s weights (init_from_run): remove one")
    if any(canonical_name(k) == "init_from" for k in r.hyperparameters):
        add("init_from_run", "sets hyperparameters.init_from to that run's checkpoints: remove "
                             "hyperparameters.init_from (or init_from_run, to start from a folder of your own)")


def _data_problems(r: JobRequest, add: Add) -> None:
    if r.validation_dataset and dataset_kind(r.validation_dataset) != r.dataset_kind != "unknown":
        add("validation_dataset", "must live where dataset does (both S3, both FSx, or both local)")
    mode = r.effective_input_mode
    if r.dataset_kind == "fsx" and mode != "FSx":
        add("input_mode", f"{mode} reads from S3; an fsx: dataset needs input_mode FSx (or leave it null)")


def _instance_problems(r: JobRequest, add: Add) -> None:
    """One type (with fallbacks) or heterogeneous groups."""
    groups = r.instance_groups
    if r.instance is None and not groups:
        add("instance", "required: give instance.type (and count), or instance_groups")
    if r.instance is not None and groups:
        add("instance_groups", "give either instance or instance_groups, not both")
    if len(set(r.instance_types)) != len(r.instance_types):
        add("instance.fallbacks", "lists an instance type twice (the primary type is tried first anyway)")
    if len({g.name for g in groups}) != len(groups):
        add("instance_groups", "group names must be unique")
    if groups and not any(catalog.lookup(g.type).accelerated for g in groups):
        add("instance_groups", "no group has accelerators to train on; add a GPU or Trainium group")


def _budget_problems(r: JobRequest, specs: Specs, add: Add) -> None:
    if r.max_wait_hours is not None and not r.spot:
        add("max_wait_hours", "only applies to Spot training (set spot: true, or remove max_wait_hours)")
    if r.spot and r.max_wait_hours is not None and r.max_wait_hours < r.max_runtime_hours:
        add("max_wait_hours", f"must be >= max_runtime_hours ({r.max_runtime_hours:g}): with Spot, MaxWait covers "
                              "the runtime plus the time spent waiting for Spot capacity")
    if r.max_pending_hours is not None:
        for path, spec in specs:
            if not spec.accelerated:
                add("max_pending_hours", f"only for accelerated instances; {spec.instance_type} ({path}) is CPU")
    if r.retry.max_total_hours is not None and r.retry.max_total_hours < r.max_runtime_hours:
        add("retry.max_total_hours", f"is shorter than max_runtime_hours ({r.max_runtime_hours:g}): the run would "
                                     "end before one attempt could finish")
    if r.retry.capacity_wait_max_seconds < r.retry.capacity_wait_seconds:
        add("retry.capacity_wait_max_seconds", "must be >= retry.capacity_wait_seconds")
    if r.retry.api_error_wait_max_seconds < r.retry.api_error_wait_seconds:
        add("retry.api_error_wait_max_seconds", "must be >= retry.api_error_wait_seconds")


def _capacity_problems(r: JobRequest, add: Add) -> None:
    """Warm pools, training plans and Spot."""
    groups = r.instance_groups
    if r.warm_pool_minutes and groups:
        add("warm_pool_minutes", "warm pools (KeepAlivePeriodInSeconds) cannot be used with instance_groups")
    if r.training_plan is not None:
        if groups:
            add("training_plan", "a training plan reserves one instance type; use instance, not instance_groups")
        if r.spot:
            add("spot", "a training plan is reserved capacity; it cannot run on Spot")
        if r.instance is not None and r.instance.fallbacks:
            add("instance.fallbacks", "a training plan has one instance type; fallbacks would leave the plan")


def _strategy_problems(r: JobRequest, specs: Specs, add: Add) -> None:
    par = r.parallel
    if r.strategy is not Strategy.SMP:
        # tensor and pipeline degrees: the torch-native strategies' (jobs.request.parallelism); the rest is smp's or hsdp's.
        for problem in strategy_degree_problems(r.strategy.value, par.tensor_parallel_degree,
                                                par.pipeline_parallel_degree):
            add(problem.path, problem.message)
        own = {"context_parallel_degree": (), "hybrid_shard_degree": MODEL_PARALLEL}
        for k, users in own.items():
            if getattr(par, k) not in (0, 1) and r.strategy.value not in users:
                add(f"parallel.{k}", f"only the smp strategy{' and ' + ', '.join(users) if users else ''} use "
                                     f"{k} (strategy is {r.strategy.value!r})")
    if r.strategy is Strategy.SINGLE and r.instance is not None and r.instance.count != 1:
        add("instance.count", "the single strategy runs one process on one instance; use ddp or fsdp for more")
    if r.strategy is Strategy.SMP:
        _smp_problems(r, specs, add)
    elif r.strategy in (Strategy.DDP, Strategy.FSDP):
        for path, spec in specs:
            if spec.kind == "neuron":
                add(path, f"{r.strategy} in the training package runs on CUDA or CPU; {spec.instance_type} is "
                          "Trainium (Neuron) — pick a GPU instance")


def _smp_problems(r: JobRequest, specs: Specs, add: Add) -> None:
    par = r.parallel
    if r.instance_groups:
        add("instance_groups", "smp runs on one instance type; use instance")
    if par.pipeline_parallel_degree != 1:
        add("parallel.pipeline_parallel_degree", "SMP v2 has no pipeline parallelism (SMP v1 is archived); use 1")
    for path, spec in specs:
        if spec.kind != "gpu":
            add(path, f"smp needs NVIDIA GPU instances (the SMP v2 image is CUDA-only); {spec.instance_type} "
                      f"has {spec.kind.upper() if spec.kind == 'cpu' else 'Trainium'}")
            continue
        count = r.instance.count if r.instance else 1
        world = spec.accelerators * count
        model_degree = par.tensor_parallel_degree * par.context_parallel_degree
        if world % model_degree:
            add("parallel.tensor_parallel_degree",
                f"tensor x context degree {model_degree} does not divide the {world} GPUs of {count} x "
                f"{spec.instance_type} ({path})")
        elif par.hybrid_shard_degree and (world // model_degree) % par.hybrid_shard_degree:
            add("parallel.hybrid_shard_degree",
                f"{par.hybrid_shard_degree} does not divide the {world // model_degree} data-parallel ranks of "
                f"{count} x {spec.instance_type} ({path}) after tensor x context degree {model_degree}")
    if r.image is None and r.framework_version is not None and not re.fullmatch(r"\d+\.\d+\.\d+", r.framework_version):
        add("framework_version", "for smp, the SMP library's PyTorch version, e.g. 2.5.1")


def _api_limit_problems(r: JobRequest, add: Add) -> None:
    """Hyperparameters (with the platform's own) and metric definitions."""
    model_parallel = r.strategy in (Strategy.SMP, Strategy.AUTO) or r.strategy.value in MODEL_PARALLEL
    launcher_count = platform_hyperparameter_count(model_parallel=model_parallel, groups=bool(r.instance_groups))
    if len(r.hyperparameters) + launcher_count > MAX_HYPERPARAMETERS:
        add("hyperparameters", f"has {len(r.hyperparameters)} entries; with the platform's {launcher_count} the job "
                               f"would send {len(r.hyperparameters) + launcher_count}, over CreateTrainingJob's "
                               f"limit of {MAX_HYPERPARAMETERS}")
    seen = set(METRIC_NAMES)
    for i, m in enumerate(r.metrics):
        if m.name in seen:
            add(f"metrics[{i}].name", f"{m.name!r} is already defined (the training package's metrics: "
                                      f"{', '.join(METRIC_NAMES)})")
        seen.add(m.name)
        if len(m.regex) > MAX_REGEX_LENGTH:
            add(f"metrics[{i}].regex", f"must be at most {MAX_REGEX_LENGTH} characters")
        else:
            try:
                if re.compile(m.regex).groups < 1:
                    add(f"metrics[{i}].regex", "needs one capture group around the value")
            except re.error as exc:
                add(f"metrics[{i}].regex", f"is not a valid regular expression: {exc}")
