"""Rules a parsed request must obey on one deployed platform: its allowed instance types, training plans,
FSx file system, dataset bucket, container images and environment allow-list. `validate_for_platform` raises
RequestInvalid naming every problem's field."""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

from contract.errors import ConfigError, Problem, RequestInvalid
from contract.hyperparameters import (
    Strategy,
    TrainConfig,
    batch_layout,
    canonical_hyperparameters,
    canonical_name,
    nearest_global_batches,
)
from contract.parallel import LAYER_SPLITTING, MODEL_PARALLEL, batch_ranks
from jobs import catalog
from jobs.naming import PLATFORM_TAGS, TEAM_SEPARATOR, platform_prefix, tag_key
from jobs.planning.auto_strategy import plan_for_request
from jobs.platform import LocalPlatformSettings, PlatformSettings
from jobs.request.environment_rules import environment_problems, secret_scope_problem
from jobs.request.field_rules import dataset_kind, fsx_path
from jobs.request.image_rules import image_problem, image_source_problem, starts_through_platform_entry
from jobs.request.parallelism import request_problems
from jobs.request.schema import JobRequest


def validate_for_platform(request: JobRequest, platform: PlatformSettings) -> None:
    """Raise RequestInvalid for what the platform cannot run: types, plans, FSx, images."""
    found: list[Problem] = []
    found += _instance_type_problems(request, platform)
    found += _training_plan_problems(request, platform)
    found += _dataset_problems(request, platform)
    found += _readable_problems(request, platform)
    found += _tag_problems(request, platform)
    found += _parallelism_problems(request, platform)
    found += batch_problems(request, platform)
    if request.image is None and (problem := image_problem(request, platform)):
        found.append(Problem(*problem))
    found += _image_source_problems(request, platform)
    found += _environment_problems(request, platform)
    if found:
        raise RequestInvalid(found)


def is_local_platform(platform: PlatformSettings) -> bool:
    """`trainctl local`'s placeholder settings (their type marks them; a deployed platform named `local` is not)."""
    return isinstance(platform, LocalPlatformSettings)


def _instance_type_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    allowed = set(platform.allowed_instance_types)
    if not allowed:
        return []
    typed = [("instance.type" if i == 0 else f"instance.fallbacks[{i - 1}]", t)
             for i, t in enumerate(request.instance_types)]
    typed += [(f"instance_groups[{i}].type", g.type) for i, g in enumerate(request.instance_groups)]
    return [Problem(path, f"{t} is not allowed on this platform; allowed: {', '.join(sorted(allowed))}")
            for path, t in typed if t not in allowed]


def _training_plan_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    if request.training_plan is None:
        return []
    plan = platform.training_plans.get(request.training_plan)
    if plan is None:
        known = ", ".join(sorted(platform.training_plans)) or "none"
        return [Problem("training_plan", f"{request.training_plan!r} is not one of the platform's training plans "
                                         f"({known})")]
    found = []
    if request.instance is not None:
        if request.instance.type != plan.instance_type:
            found.append(Problem("instance.type", f"{request.instance.type} does not match training plan "
                                                  f"{plan.name!r}, which reserves {plan.instance_type}"))
        if request.instance.count > plan.instance_count:
            found.append(Problem("instance.count", f"{request.instance.count} is more than training plan "
                                                   f"{plan.name!r} reserves ({plan.instance_count})"))
    return found


def _environment_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """Variable names (and secrets' names) from the allow-list; secrets only where the platform's entry reads them."""
    found = [Problem(f"{section}.{name}", message) for section, names in
             (("environment", request.environment), ("secrets", request.secrets))
             for name, message in environment_problems(names, platform.environment_patterns)]
    if request.secrets and not starts_through_platform_entry(request, platform, request.training_instance_type):
        found.append(Problem("secrets", "are read by the platform's container entry, which only its PyTorch images "
                                        "start through (not a request's own image, not the smp image); leave image "
                                        "out, or read the secret with boto3 in your own code"))
    if not is_local_platform(platform):
        found += [Problem(f"secrets.{name}", message) for name, arn in request.secrets.items()
                  if (message := secret_scope_problem(arn, platform))]
    return found


def _image_source_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """A request's image from the platform's allowed repositories; `trainctl local` pulls no image."""
    if request.image is None or is_local_platform(platform):
        return []
    problem = image_source_problem(request.image, platform)
    return [Problem("image", problem)] if problem else []


def _readable_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """S3 datasets the execution role can read: the dataset bucket, under dataset_prefix (a team's, with teams),
    through FSx too. What the file system does not link at all, _dataset_problems says in its terms."""
    if platform.dataset_prefix is None or is_local_platform(platform):
        return []
    readable = f"s3://{platform.dataset_bucket}/{platform.dataset_prefix.lstrip('/')}"
    fsx = request.effective_input_mode == "FSx" and platform.fsx is not None
    return [Problem(path, f"{uri!r} is outside what the training jobs may read; put the data under {readable}")
            for path, uri in (("dataset", request.dataset), ("validation_dataset", request.validation_dataset))
            if uri is not None and dataset_kind(uri) == "s3" and platform.dataset_key(uri) is None
            and not (fsx and platform.fsx_directory(uri) is None)]


def _tag_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """The platform's own tags (`<name_prefix>:run-id`, ..., a team's cost allocation tag) are written by the
    launcher, never by a request. Keys compare as a person reads them (case and Unicode forms folded: `MLTRAIN:Team`,
    a full-width `ｍltrain:team`), so no spelling passes for the platform's in a cost report or a console."""
    own = tag_fold(tag_key(platform.name_prefix, ""))
    team = {tag_fold(key): key for key in platform.job_tags}
    # The whole platform's namespace: its own keys, and every team's (`<platform>--<team>:...`).
    root = tag_fold(platform_prefix(platform.name_prefix))
    namespace = (tag_fold(tag_key(root, "")), f"{root}{TEAM_SEPARATOR}")
    found = []
    for key in request.tags:
        if tag_fold(key).startswith(own):
            found.append(Problem(f"tags.{key}", f"keys starting with {own!r} are the platform's own (it writes "
                                                f"{', '.join(own + t for t in PLATFORM_TAGS)}); rename the tag"))
        elif tag_fold(key) not in team and tag_fold(key).startswith(namespace):
            found.append(Problem(f"tags.{key}", f"keys starting with {namespace[0]!r} or {namespace[1]!r} are the "
                                                "platform's and its teams' (their run ids, cost tags); rename the tag"))
        elif (theirs := team.get(tag_fold(key))) is not None:
            found.append(Problem(f"tags.{key}", f"{key!r} is the platform's {theirs!r}: it tags every job of this team "
                                                f"with its cost allocation tag ({theirs}={platform.job_tags[theirs]}); "
                                                "rename the tag"))
    return found


def tag_fold(key: str) -> str:
    """A tag key as compared with the platform's: Unicode compatibility forms and case folded."""
    return unicodedata.normalize("NFKC", key).casefold()


def _dataset_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    found = []
    for path, uri in (("dataset", request.dataset), ("validation_dataset", request.validation_dataset)):
        if uri is None:
            continue
        kind = dataset_kind(uri)
        if (kind == "fsx" or request.effective_input_mode == "FSx") and platform.fsx is None:
            found.append(Problem(path, _no_fsx_message(platform)))
        elif kind == "fsx" and not _under(fsx_path(uri), linked := platform.fsx.linked_path.strip("/")):
            found.append(Problem(path, f"{uri!r} is outside the folder the file system links to the dataset bucket "
                                       f"(fsx:/{linked}/); name a folder under it"))
        elif request.effective_input_mode == "FSx" and kind == "s3":
            bucket = uri[len("s3://"):].split("/", 1)[0]
            prefix = platform.fsx.linked_prefix or platform.dataset_prefix or ""
            linked = f"s3://{platform.dataset_bucket}/{prefix.lstrip('/')}"
            if bucket != platform.dataset_bucket:
                found.append(Problem(path, f"input_mode FSx reads the dataset bucket {platform.dataset_bucket!r} "
                                           f"through FSx; {bucket!r} is not linked to the file system"))
            elif platform.fsx_directory(uri) is None:
                found.append(Problem(path, f"{uri!r} is outside what the file system links ({linked} appears as "
                                           f"/{platform.fsx.linked_path.strip('/')}); put the data under {linked}"))
        if kind == "local" and not is_local_platform(platform):
            found.append(Problem(path, f"{uri!r} is a local folder: it only runs with `trainctl local`; upload it "
                                       "to S3 or FSx"))
    return found


def _under(path: str, folder: str) -> bool:
    """Whether the normalised `path` is `folder` or lies below it (every folder when `folder` is the root)."""
    return not folder or path == folder or path.startswith(f"{folder}/")


def _no_fsx_message(platform: PlatformSettings) -> str:
    if is_local_platform(platform):
        # `trainctl local` mounts neither FSx nor S3: suggesting an s3:// dataset would send the user to another refusal.
        return ("`trainctl local` cannot mount FSx for Lustre: pass a local copy of the data with --data DIR "
                "(DIR/train and DIR/validation), or set the dataset to a local folder")
    return "this platform has no FSx for Lustre file system; use an s3:// dataset"


def _parallelism_problems(request: JobRequest, platform: PlatformSettings) -> list[Problem]:
    """The torch-native degrees against the cluster: GPUs per instance and instances, on instance.type and on each
    fallback type (a capacity retry keeps the degrees and the count). `trainctl local` checks them against its
    process count instead (it knows --nproc only when it runs)."""
    if is_local_platform(platform) or request.instance is None or request.strategy.value not in MODEL_PARALLEL:
        return []
    found: list[Problem] = []
    for i, instance_type in enumerate(request.instance_types):
        spec = catalog.lookup(instance_type)
        for problem in request_problems(request, hosts=request.instance.count,
                                        per_host=max(1, spec.accelerators if spec else 1)):
            if i == 0:
                found.append(problem)
            elif not any(p.path == problem.path and p.message.startswith(problem.message) for p in found):
                found.append(Problem(problem.path, f"{problem.message} (on instance.fallbacks[{i - 1}], "
                                                   f"{instance_type})"))
    return found


@dataclass(frozen=True)
class Cluster:
    """One cluster a request may run on: where the request names it, what it is, and its training processes."""

    path: str  # instance.type, instance.fallbacks[i], instance_groups
    label: str  # "2 x ml.p4d.24xlarge with 8 GPUs each"
    world: int  # processes that read micro-batches (torchrun: one per GPU, one on a CPU instance)
    strategy: str  # what the job runs there (auto: the planner's pick for that type)


def request_clusters(request: JobRequest) -> list[Cluster]:
    """Every cluster an attempt of this request may run on: instance.type, then each fallback type (a capacity
    retry moves to it with the same count), or the heterogeneous cluster's training groups (those the toolkit
    starts torchrun on: the accelerated ones). A type the training package cannot run (Trainium) or does not know
    is left out: other rules refuse it."""
    clusters = []
    if request.instance is not None:
        count = request.instance.count
        for i, instance_type in enumerate(request.instance_types):
            spec = catalog.lookup(instance_type)
            if spec is None or not spec.runnable:
                continue
            path = "instance.type" if i == 0 else f"instance.fallbacks[{i - 1}]"
            strategy = request.strategy_on(instance_type).value
            label = f"{count} x {instance_type} with {_per_instance(spec)}"
            readers = _readers(request, instance_type, strategy, _world(strategy, count, spec))
            clusters.append(Cluster(path, label, readers, strategy))
    elif request.instance_groups:
        groups = [(g, catalog.lookup(g.type)) for g in request.instance_groups]
        training = [(g, spec) for g, spec in groups if spec is not None and spec.accelerated]
        if training and all(spec.runnable for _, spec in training):
            strategy = request.strategy_on(None).value
            world = 1 if strategy == Strategy.SINGLE else sum(g.count * spec.accelerators for g, spec in training)
            label = " + ".join(f"{g.count} x {g.type} with {_per_instance(spec)}" for g, spec in training)
            clusters.append(Cluster("instance_groups", label, world, strategy))
    return clusters


def _readers(request: JobRequest, instance_type: str, strategy: str, processes: int) -> int:
    """The processes that read their own micro-batches: all of them, or with hyperparameters.micro_batch_per_group
    one per batch group of a tp, pp or hybrid layout (contract.parallel.batch_ranks): the request's degrees, or
    for `auto` the planner's pick on `instance_type`, which the renderer sends."""
    hps = canonical_hyperparameters(request.hyperparameters)
    if hps.get("micro_batch_per_group") is not True or strategy not in LAYER_SPLITTING:
        return processes
    if request.strategy is Strategy.AUTO:
        chosen = plan_for_request(request, instance_type).parallel
        tensor, pipeline = chosen.get("tp_degree", 1), chosen.get("pp_degree", 1)
    elif request.parallel is not None:
        tensor, pipeline = request.parallel.tensor_parallel_degree, request.parallel.pipeline_parallel_degree
    else:
        return processes
    return batch_ranks(processes, tensor, pipeline, per_group=True)


def _per_instance(spec: catalog.InstanceSpec) -> str:
    return f"{spec.accelerators} GPU{'s' if spec.accelerators > 1 else ''} each" if spec.accelerators \
        else "no GPU (1 process each)"


def _world(strategy: str, count: int, spec: catalog.InstanceSpec) -> int:
    """Training processes: `single` runs one plain process; every other strategy runs torchrun on each instance
    with one process per GPU (the toolkit starts one on a CPU instance). Every process reads its own micro-batch,
    tensor and pipeline ranks too (their groups pool them), so auto's degrees do not change this."""
    return 1 if strategy == Strategy.SINGLE else count * max(1, spec.accelerators)


def batch_problems(request: JobRequest, platform: PlatformSettings | None = None) -> list[Problem]:
    """global_batch_size, micro_batch_size and grad_accum against every cluster the request may run on, with the
    training package's own arithmetic (contract.hyperparameters.batch_layout): what it would refuse at startup,
    after the instances were paid for. `trainctl local` is left out: its process count is --nproc, known only when
    it runs."""
    if platform is not None and is_local_platform(platform):
        return []
    keys = {canonical_name(k): k for k in request.hyperparameters}
    values = {name: request.hyperparameters[key] for name, key in keys.items()}
    micro = values.get("micro_batch_size", TrainConfig.micro_batch_size)
    total = values.get("global_batch_size")
    accum = values.get("grad_accum")
    if not all(_count(v) for v in (micro, total)) or (accum is not None and not _count(accum)):
        return []  # no global batch (nothing to split), or a value other rules refuse
    clusters = request_clusters(request)
    found = []
    uneven = []
    for c in clusters:
        try:
            batch_layout(c.world, micro, total)
        except ConfigError:
            uneven.append(c)
    if uneven:
        found.append(Problem(_field(keys, "global_batch_size"), _uneven_message(total, micro, uneven, clusters)))
    elif accum is not None:
        steps = {c: total // (micro * c.world) for c in clusters}
        wrong = [c for c in clusters if steps[c] != accum]
        if wrong:
            found.append(Problem(_field(keys, "grad_accum"), _accum_message(total, micro, accum, steps, wrong)))
    return found


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _field(keys: dict[str, str], name: str) -> str:
    return f"hyperparameters.{keys.get(name, name)}"


def _where(c: Cluster) -> str:
    how = "strategy single runs 1 process" if c.strategy == Strategy.SINGLE else f"strategy {c.strategy}"
    return f"{c.label} ({c.path}; {how})"


def _uneven_message(total: int, micro: int, uneven: list[Cluster], clusters: list[Cluster]) -> str:
    needs = "; ".join(
        f"{'smaller than' if total < micro * c.world else 'not a multiple of'} micro_batch_size x world size = "
        f"{micro} x {c.world} = {micro * c.world} on {_where(c)}" for c in uneven)
    step = math.lcm(*(micro * c.world for c in clusters))
    nearest = " or ".join(str(v) for v in nearest_global_batches(total, step))
    every = "on every instance type the request may use" if len(clusters) > 1 else "there"
    fix = f"use global_batch_size {nearest} (any multiple of {step} runs {every})"
    worlds = math.lcm(*(c.world for c in clusters))
    if total % worlds == 0:
        # micro_batch_size m fits every cluster when m x lcm(worlds) divides the global batch.
        fitting = [m for m in range(min(micro, total // worlds), 0, -1) if (total // worlds) % m == 0]
        fix += f", or micro_batch_size {fitting[0]} to keep {total}"
    return (f"{total} is {needs}. One optimizer step is micro_batch_size x world size x grad_accum samples (tensor "
            f"and pipeline ranks pool their micro-batches, so every process counts): the training package refuses "
            f"this at startup. {fix[0].upper()}{fix[1:]}")


def _accum_message(total: int, micro: int, accum: int, steps: dict, wrong: list[Cluster]) -> str:
    found = "; ".join(f"{total} / ({micro} x {c.world}) = {steps[c]} on {_where(c)}" for c in wrong)
    if len(set(steps.values())) == 1:
        fix = f"set grad_accum {next(iter(steps.values()))} or remove it (global_batch_size sets it)"
    else:
        fix = "remove it: global_batch_size sets it for each instance type"
    return (f"{accum} disagrees with global_batch_size / (micro_batch_size x world size): {found}; the training "
            f"package refuses this at startup. {fix[0].upper()}{fix[1:]}")
