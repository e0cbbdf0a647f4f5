"""The job request: the small JSON document an engineer writes, its defaults, and every rule it must obey.

`parse_request(data)` checks everything that does not depend on the deployed platform (types, ranges,
unknown fields, cross-field rules from the CreateTrainingJob API) and returns a frozen `JobRequest`.
`validate_for_platform(request, platform)` adds the rules that do (allowed instance types, training
plans, FSx, images). Both raise `RequestInvalid` with one problem per line, each naming its field.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from contract.errors import Problem, RequestInvalid
from contract.metrics import MAX_METRIC_DEFINITIONS, MAX_REGEX_LENGTH, METRIC_NAMES
from contract.schema import meta, parse_dataclass, to_jsonable
from jobs import catalog
from jobs.platform import PlatformSettings

STRATEGIES = ("single", "ddp", "fsdp", "smp", "auto")
INPUT_MODES = ("File", "FastFile", "FSx")

# CreateTrainingJob limits (botocore's service model, REFERENCE.md).
MAX_HYPERPARAMETERS = 100
# The API allows 100 variables; the renderer adds PLATFORM_ENVIRONMENT's.
PLATFORM_ENVIRONMENT = {
    # The toolkit builds the torchrun command itself, so its --shutdown_timeout cannot be passed: torchrun reads
    # this instead. SageMaker sends SIGKILL 120 s after SIGTERM; torchrun's default grace is 30 s, too short
    # for the workers to agree on a step and write the checkpoint.
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110",
}
MAX_ENVIRONMENT = 100 - len(PLATFORM_ENVIRONMENT)
MAX_TAGS = 50
MAX_RUNTIME_HOURS = 28 * 24
MAX_PENDING_HOURS = (1800 / 3600, 2419200 / 3600)
MAX_WARM_POOL_MINUTES = 21600 // 60
MAX_INSTANCE_GROUPS = 5

# The training package's own hyperparameters (`training.config.ACCEPTED_HYPERPARAMETERS`, which jobs may
# not import: a test checks that the two agree), less those the launcher sets from request fields.
TRAINING_HYPERPARAMETERS = frozenset({
    "activation_checkpointing", "async_checkpoint", "backend", "beta1", "beta2", "checkpoint_dir",
    "checkpoint_interval", "compile", "data", "dropout", "early_stopping_patience", "eval_batches",
    "eval_interval", "fsdp_reshard_after_forward", "global_batch_size", "grad_accum", "grad_clip",
    "keep_checkpoints", "log_interval", "lr", "lr_schedule", "max_steps", "micro_batch_size", "min_lr_ratio",
    "model", "model_dir", "model_size", "mp_parameters", "optimizer", "output_data_dir", "precision", "seed",
    "seq_len", "strategy", "train_dir", "validation_dir", "warmup_steps", "weight_decay",
})

# The training package's model presets (training.models.PRESETS; a test checks that they agree).
MODEL_PRESETS = {"gpt": ("tiny", "small", "125m", "350m", "1b", "7b"), "vit": ("tiny", "base", "large", "huge")}

# Hyperparameters and tags the renderer writes itself; a request may not set them.
LAUNCHER_HYPERPARAMETERS = (
    "sagemaker_program", "sagemaker_submit_directory", "sagemaker_region", "sagemaker_job_name",
    "sagemaker_container_log_level", "sagemaker_torch_distributed_enabled", "sagemaker_instance_type",
)
SMP_HYPERPARAMETERS = ("mp_parameters", "sagemaker_distributed_dataparallel_enabled")
GROUP_HYPERPARAMETERS = ("sagemaker_distribution_instance_groups",)
SCRIPT_HYPERPARAMETERS = ("strategy", "model", "model_size", "checkpoint_interval")
PLATFORM_TAGS = ("run-id", "attempt", "request", "strategy")

_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
_NAME_MAX = 40  # leaves room for "<prefix>-" and "-<hash>-a<N>" inside SageMaker's 63 characters
_ENV_KEY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_GROUP_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?")


# ---- field-level rules (run while parsing, so they are reported even when another field is broken) ----

def _check_name(name: str) -> str | None:
    if not _NAME.fullmatch(name) or len(name) > _NAME_MAX:
        return (f"{name!r} must be 1-{_NAME_MAX} letters, digits and dashes, starting and ending with a letter "
                "or digit (it becomes part of the SageMaker job name)")
    return None


def _check_dataset(uri: str) -> str | None:
    kind = dataset_kind(uri)
    if kind == "unknown":
        return (f"{uri!r} is not a dataset location; use s3://bucket/prefix/, fsx:/path/on/fsx, "
                "or a local folder (./data, /abs/path) for trainctl local")
    if kind == "s3" and not _S3_URI.fullmatch(uri):
        return f"{uri!r} is not a valid S3 URI (s3://bucket/prefix/)"
    if kind == "fsx" and not fsx_path(uri):
        return "an fsx: dataset needs a path, e.g. fsx:/datasets/c4"
    return None


def _check_instance_type(instance_type: str) -> str | None:
    if catalog.lookup(instance_type) is not None:
        return None
    close = difflib.get_close_matches(instance_type, catalog.instance_types(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; see jobs.catalog for the supported types"
    return f"unknown instance type {instance_type!r}{hint}"


def _check_instance_types(types: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(i, msg) for i, t in enumerate(types) if (msg := _check_instance_type(t))]


def _check_group_name(name: str) -> str | None:
    return None if _GROUP_NAME.fullmatch(name) else f"{name!r}: use 1-64 letters, digits, '-' or '_'"


def _check_environment(env: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for key, value in env.items():
        if not _ENV_KEY.fullmatch(key) or len(key) > 512:
            found.append((key, "names must match [a-zA-Z_][a-zA-Z0-9_]* (at most 512 characters)"))
        elif len(value) > 512:
            found.append((key, "values must be at most 512 characters"))
    return found


def _check_tags(tags: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for key, value in tags.items():
        if key.lower().startswith("aws:"):
            found.append((key, "keys starting with 'aws:' are reserved by AWS"))
        elif not 1 <= len(key) <= 128 or not _tag_text(key):
            found.append((key, "keys are 1-128 letters, digits, spaces and _ . : / = + - @"))
        elif len(value) > 256 or not _tag_text(value):
            found.append((key, "values are at most 256 letters, digits, spaces and _ . : / = + - @"))
    return found


def _check_hyperparameters(values: dict[str, Any]) -> list[tuple[str, str]]:
    found = []
    for key, value in values.items():
        if key in SCRIPT_HYPERPARAMETERS:
            found.append((key, f"is set by the platform; use the request field {key!r}"))
        elif key in LAUNCHER_HYPERPARAMETERS + SMP_HYPERPARAMETERS + GROUP_HYPERPARAMETERS:
            found.append((key, "is set by the platform; remove it"))
        elif key.replace("-", "_") not in TRAINING_HYPERPARAMETERS:
            settable = sorted(TRAINING_HYPERPARAMETERS - set(SCRIPT_HYPERPARAMETERS + SMP_HYPERPARAMETERS))
            close = difflib.get_close_matches(key.replace("-", "_"), settable, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(settable)}"
            found.append((key, f"the training package has no hyperparameter {key!r}; {hint}"))
        elif value is None:
            found.append((key, "must not be null; remove the key to use the training default"))
        elif len(json.dumps(value)) > 2500:
            found.append((key, "is longer than 2500 characters once JSON-encoded (CreateTrainingJob's limit)"))
    return found


def _tag_text(text: str) -> bool:
    # The API's pattern is [\p{L}\p{Z}\p{N}_.:/=+\-@]*: letters, separators (spaces), numbers.
    return all(ch.isalnum() or ch.isspace() or ch in "_.:/=+-@" for ch in text)


def dataset_kind(uri: str) -> str:
    if uri.startswith("s3://"):
        return "s3"
    if uri.startswith("fsx:"):
        return "fsx"
    if uri.startswith(("/", "./", "../", "~", "file://")):
        return "local"
    return "unknown"


def fsx_path(uri: str) -> str:
    """`fsx:/datasets/c4` or `fsx:///datasets/c4` -> `datasets/c4` (relative to the file system root)."""
    return uri[len("fsx:"):].lstrip("/").rstrip("/")



@dataclass(frozen=True)
class InstanceConfig:
    type: str = field(metadata=meta("ML instance type, e.g. ml.p4d.24xlarge (see the instance catalog)",
                                    check=_check_instance_type))
    count: int = field(default=1, metadata=meta("number of instances", min=1, max=256))
    fallbacks: tuple[str, ...] = field(default=(), metadata=meta(
        "instance types to try, in order, after a capacity shortage on `type`", max=5, check=_check_instance_types))
    volume_gb: int = field(default=100, metadata=meta(
        "EBS volume per instance, GB (types with local NVMe use the instance store instead)", min=1, max=16384))


@dataclass(frozen=True)
class InstanceGroup:
    name: str = field(metadata=meta("group name (letters, digits, `-`, `_`)", check=_check_group_name))
    type: str = field(metadata=meta("ML instance type of the group", check=_check_instance_type))
    count: int = field(default=1, metadata=meta("instances in the group", min=1, max=256))


@dataclass(frozen=True)
class Parallelism:
    tensor_parallel_degree: int = field(default=1, metadata=meta("GPUs a layer's tensors are split over (smp)", min=1))
    pipeline_parallel_degree: int = field(default=1, metadata=meta(
        "pipeline stages; SMP v2 has no pipeline parallelism, so only 1 runs today", min=1))
    context_parallel_degree: int = field(default=1, metadata=meta("GPUs a sequence is split over (smp)", min=1))
    hybrid_shard_degree: int = field(default=0, metadata=meta(
        "GPUs parameters are sharded over (smp; 0 = all data-parallel GPUs)", min=0))


@dataclass(frozen=True)
class MetricSpec:
    name: str = field(metadata=meta("CloudWatch metric name"))
    regex: str = field(metadata=meta("regex with one group that captures the value from the log"))


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = field(default=8, metadata=meta(
        "most CreateTrainingJob attempts in one run, API errors included", min=1, max=30))
    max_total_hours: float | None = field(default=None, metadata=meta(
        "wall-clock budget for the whole run, waits included (null: 3 x max_runtime_hours)", min=0.01, max=2016))
    capacity_wait_seconds: int = field(default=300, metadata=meta(
        "first wait after a capacity shortage; doubles each time", min=0, max=86400))
    capacity_wait_max_seconds: int = field(default=3600, metadata=meta(
        "longest wait after a capacity shortage", min=0, max=86400))
    interruptions_before_on_demand: int | None = field(default=3, metadata=meta(
        "Spot interruptions after which the run goes on demand (null: stay on Spot)", min=1, max=30))
    interruption_wait_seconds: int = field(default=60, metadata=meta(
        "wait before resuming after a Spot interruption", min=0, max=86400))
    internal_error_wait_seconds: int = field(default=120, metadata=meta(
        "wait before retrying a SageMaker internal error", min=0, max=86400))
    internal_error_max_retries: int = field(default=3, metadata=meta(
        "internal-error retries in one run", min=0, max=30))
    api_error_wait_seconds: int = field(default=60, metadata=meta(
        "first wait after a quota (ResourceLimitExceeded) or throttling error; doubles each time", min=0, max=86400))
    api_error_wait_max_seconds: int = field(default=900, metadata=meta(
        "longest wait after a quota or throttling error", min=0, max=86400))
    api_error_max_retries: int = field(default=5, metadata=meta(
        "quota/throttling retries in a row before the run gives up", min=0, max=30))


@dataclass(frozen=True)
class JobRequest:
    name: str = field(metadata=meta(
        f"run name: letters, digits and dashes, at most {_NAME_MAX} characters; names the training jobs",
        check=_check_name))
    dataset: str = field(metadata=meta(
        "training data: `s3://bucket/prefix/`, `fsx:/path/on/the/file/system`, or a local folder (trainctl local)",
        check=_check_dataset))
    instance: InstanceConfig | None = field(default=None, metadata=meta(
        "instance type, count, fallbacks, volume (required unless instance_groups is given)"))
    strategy: str = field(default="ddp", metadata=meta(
        "parallelism: single, ddp, fsdp, smp (SageMaker model parallel v2), auto (planner picks)", choices=STRATEGIES))
    model: str = field(default="gpt", metadata=meta("gpt, vit, or `package.module:factory`"))
    model_size: str = field(default="small", metadata=meta("model preset: tiny, small, 125m, 350m, 1b, 7b (gpt)..."))
    validation_dataset: str | None = field(default=None, metadata=meta(
        "validation data, same forms as dataset (channel `validation`)", check=_check_dataset))
    input_mode: str | None = field(default=None, metadata=meta(
        "File, FastFile (S3) or FSx (null: FastFile for S3, FSx for fsx: paths)", choices=INPUT_MODES))
    spot: bool = field(default=False, metadata=meta("managed Spot training; interrupted attempts resume from checkpoints"))
    max_runtime_hours: float = field(default=24.0, metadata=meta(
        "MaxRuntimeInSeconds of each attempt, hours", min=0.01, max=MAX_RUNTIME_HOURS))
    max_wait_hours: float | None = field(default=None, metadata=meta(
        "Spot only: MaxWaitTimeInSeconds, >= max_runtime_hours (null: 2 x max_runtime_hours, capped at 28 days)",
        min=0.01, max=MAX_RUNTIME_HOURS))
    max_pending_hours: float | None = field(default=None, metadata=meta(
        "accelerated instances only: give up an attempt that waits this long for capacity",
        min=MAX_PENDING_HOURS[0], max=MAX_PENDING_HOURS[1]))
    checkpoint_interval: int = field(default=500, metadata=meta("training steps between checkpoints", min=1))
    hyperparameters: dict[str, Any] = field(default_factory=dict, metadata=meta(
        "passed to the training script as `--key value` (JSON-encoded)", check=_check_hyperparameters))
    environment: dict[str, str] = field(default_factory=dict, metadata=meta(
        "environment variables of the training container", max=MAX_ENVIRONMENT, check=_check_environment))
    framework_version: str | None = field(default=None, metadata=meta(
        "PyTorch (or SMP, for smp) version of the AWS image (null: the platform's default)"))
    image: str | None = field(default=None, metadata=meta("container image URI, overrides framework_version"))
    warm_pool_minutes: int | None = field(default=None, metadata=meta(
        "keep instances warm this long after the job (null: the platform's default)", min=0, max=MAX_WARM_POOL_MINUTES))
    training_plan: str | None = field(default=None, metadata=meta(
        "name of a SageMaker training plan the platform knows; its instance type must match"))
    instance_groups: tuple[InstanceGroup, ...] = field(default=(), metadata=meta(
        "heterogeneous cluster instead of `instance` (at most 5 groups)", max=MAX_INSTANCE_GROUPS))
    parallel: Parallelism = field(default_factory=Parallelism, metadata=meta("model-parallel degrees (smp)"))
    profiler: bool = field(default=False, metadata=meta("SageMaker system profiler (CPU/GPU/network monitoring)"))
    infra_check: bool = field(default=False, metadata=meta("hardware and network health checks before training"))
    network_isolation: bool = field(default=False, metadata=meta(
        "no network from the container; the code arrives as an input channel"))
    inter_container_encryption: bool = field(default=False, metadata=meta(
        "encrypt traffic between instances (slows collectives; traffic already stays in the private VPC)"))
    tags: dict[str, str] = field(default_factory=dict, metadata=meta(
        f"tags on the training jobs (the platform adds {len(PLATFORM_TAGS)} of its own)", max=MAX_TAGS - len(PLATFORM_TAGS),
        check=_check_tags))
    metrics: tuple[MetricSpec, ...] = field(default=(), metadata=meta(
        "extra metric definitions on top of the training package's own",
        max=MAX_METRIC_DEFINITIONS - len(METRIC_NAMES)))
    retry: RetryPolicy = field(default_factory=RetryPolicy, metadata=meta("the state machine's retry policy"))

    # ---- derived facts the renderer and the policy share ----

    @property
    def dataset_kind(self) -> str:
        return dataset_kind(self.dataset)

    @property
    def effective_input_mode(self) -> str:
        if self.input_mode:
            return self.input_mode
        return "FSx" if self.dataset_kind == "fsx" else "FastFile"

    @property
    def instance_types(self) -> tuple[str, ...]:
        """Primary type then fallbacks, in the order capacity shortages walk through them."""
        if self.instance is None:
            return ()
        return (self.instance.type, *self.instance.fallbacks)

    @property
    def resolved_strategy(self) -> str:
        """The strategy the training package runs: `auto` asks the planner (jobs.planner)."""
        if self.strategy != "auto":
            return self.strategy
        from jobs.planner import plan

        count = self.instance.count if self.instance else 1
        return plan(self.model, self.model_size, self.training_instance_type, count).strategy

    @property
    def training_instance_type(self) -> str:
        """The type the container image and torchrun are chosen for: instance.type, or the first
        accelerated instance group (heterogeneous clusters run one image everywhere)."""
        if self.instance is not None:
            return self.instance.type
        for g in self.instance_groups:
            spec = catalog.lookup(g.type)
            if spec and spec.accelerated:
                return g.type
        return self.instance_groups[0].type if self.instance_groups else ""

    @property
    def effective_max_wait_hours(self) -> float | None:
        if not self.spot:
            return None
        if self.max_wait_hours is not None:
            return self.max_wait_hours
        return min(2 * self.max_runtime_hours, MAX_RUNTIME_HOURS)

    @property
    def effective_max_total_hours(self) -> float:
        return self.retry.max_total_hours or 3 * self.max_runtime_hours

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)


# Fields people put at the top level that live in a section, for "did you mean".
_ELSEWHERE = {
    "instance_type": "instance.type", "instance_count": "instance.count", "fallbacks": "instance.fallbacks",
    "fallback_instance_types": "instance.fallbacks", "volume_gb": "instance.volume_gb",
    "volume_size_gb": "instance.volume_gb", "max_attempts": "retry.max_attempts",
    "tensor_parallel_degree": "parallel.tensor_parallel_degree", "hybrid_shard_degree": "parallel.hybrid_shard_degree",
    "pipeline_parallel_degree": "parallel.pipeline_parallel_degree", "use_spot": "spot", "spot_instances": "spot",
    "max_run": "max_runtime_hours", "max_wait": "max_wait_hours", "hyperparams": "hyperparameters",
    "env": "environment", "image_uri": "image", "keep_alive_minutes": "warm_pool_minutes",
}


def parse_request(data: dict[str, Any]) -> JobRequest:
    """Validate a job request document; raise RequestInvalid naming every problem."""
    if not isinstance(data, dict):
        raise RequestInvalid([Problem("", f"a job request is a JSON object, got {type(data).__name__}")])
    problems: list[Problem] = []
    request = parse_dataclass(JobRequest, data, "", problems, elsewhere=_ELSEWHERE)
    if request is not None:
        problems.extend(_cross_field_problems(request))
    if problems:
        raise RequestInvalid(problems)
    return request


def _cross_field_problems(r: JobRequest) -> list[Problem]:
    p: list[Problem] = []
    add = lambda path, message: p.append(Problem(path, message))  # noqa: E731

    # Model.
    if r.model in MODEL_PRESETS and r.model_size not in MODEL_PRESETS[r.model]:
        close = difflib.get_close_matches(r.model_size, MODEL_PRESETS[r.model], n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        add("model_size", f"{r.model} has no preset {r.model_size!r}; {hint}presets: {', '.join(MODEL_PRESETS[r.model])}")
    elif r.model not in MODEL_PRESETS and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", r.model):
        add("model", f"{r.model!r}: use gpt, vit, or `package.module:factory` for your own model")

    # Data.
    if r.validation_dataset and dataset_kind(r.validation_dataset) != r.dataset_kind != "unknown":
        add("validation_dataset", "must live where dataset does (both S3, both FSx, or both local)")
    mode = r.effective_input_mode
    if r.dataset_kind == "fsx" and mode != "FSx":
        add("input_mode", f"{mode} reads from S3; an fsx: dataset needs input_mode FSx (or leave it null)")

    # Instances: one type (with fallbacks) or heterogeneous groups.
    groups = r.instance_groups
    if r.instance is None and not groups:
        add("instance", "required: give instance.type (and count), or instance_groups")
    if r.instance is not None and groups:
        add("instance_groups", "give either instance or instance_groups, not both")
    specs = [("instance.type" if i == 0 else f"instance.fallbacks[{i - 1}]", catalog.lookup(t))
             for i, t in enumerate(r.instance_types)]
    specs += [(f"instance_groups[{i}].type", catalog.lookup(g.type)) for i, g in enumerate(groups)]
    if len(set(r.instance_types)) != len(r.instance_types):
        add("instance.fallbacks", "lists an instance type twice (the primary type is tried first anyway)")
    if len({g.name for g in groups}) != len(groups):
        add("instance_groups", "group names must be unique")
    if groups and not any(catalog.lookup(g.type).accelerated for g in groups):
        add("instance_groups", "no group has accelerators to train on; add a GPU or Trainium group")

    # Budgets.
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

    # Warm pools, training plans and Spot.
    if r.warm_pool_minutes and groups:
        add("warm_pool_minutes", "warm pools (KeepAlivePeriodInSeconds) cannot be used with instance_groups")
    if r.training_plan is not None:
        if groups:
            add("training_plan", "a training plan reserves one instance type; use instance, not instance_groups")
        if r.spot:
            add("spot", "a training plan is reserved capacity; it cannot run on Spot")
        if r.instance is not None and r.instance.fallbacks:
            add("instance.fallbacks", "a training plan has one instance type; fallbacks would leave the plan")

    # Strategy.
    _strategy_problems(r, specs, add)

    # API limits: hyperparameters, environment, tags, metrics.
    launcher_count = len(LAUNCHER_HYPERPARAMETERS) + len(SCRIPT_HYPERPARAMETERS) + (
        len(SMP_HYPERPARAMETERS) if r.strategy == "smp" else 0) + (len(GROUP_HYPERPARAMETERS) if groups else 0)
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
    return p


def _strategy_problems(r: JobRequest, specs: list[tuple[str, catalog.InstanceSpec]], add) -> None:
    par = r.parallel
    degrees = {k: getattr(par, k) for k in ("tensor_parallel_degree", "pipeline_parallel_degree",
                                            "context_parallel_degree")}
    if r.strategy != "smp":
        for k, v in {**degrees, "hybrid_shard_degree": par.hybrid_shard_degree}.items():
            if v not in (0, 1):
                add(f"parallel.{k}", f"only the smp strategy uses model-parallel degrees (strategy is {r.strategy!r})")
    if r.strategy == "single" and r.instance is not None and r.instance.count != 1:
        add("instance.count", "the single strategy runs one process on one instance; use ddp or fsdp for more")
    if r.strategy == "smp":
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
    elif r.strategy in ("ddp", "fsdp"):
        for path, spec in specs:
            if spec.kind == "neuron":
                add(path, f"{r.strategy} in the training package runs on CUDA or CPU; {spec.instance_type} is "
                          "Trainium (Neuron) — pick a GPU instance")


# ---- rules that need the deployed platform ----

def validate_for_platform(request: JobRequest, platform: PlatformSettings) -> None:
    """Raise RequestInvalid for what the platform cannot run: types, plans, FSx, images."""
    p: list[Problem] = []
    add = lambda path, message: p.append(Problem(path, message))  # noqa: E731
    allowed = set(platform.allowed_instance_types)
    typed = [("instance.type" if i == 0 else f"instance.fallbacks[{i - 1}]", t)
             for i, t in enumerate(request.instance_types)]
    typed += [(f"instance_groups[{i}].type", g.type) for i, g in enumerate(request.instance_groups)]
    if allowed:
        for path, t in typed:
            if t not in allowed:
                add(path, f"{t} is not allowed on this platform; allowed: {', '.join(sorted(allowed))}")

    if request.training_plan is not None:
        plan = platform.training_plans.get(request.training_plan)
        if plan is None:
            known = ", ".join(sorted(platform.training_plans)) or "none"
            add("training_plan", f"{request.training_plan!r} is not one of the platform's training plans ({known})")
        elif request.instance is not None:
            if request.instance.type != plan.instance_type:
                add("instance.type", f"{request.instance.type} does not match training plan {plan.name!r}, which "
                                     f"reserves {plan.instance_type}")
            if request.instance.count > plan.instance_count:
                add("instance.count", f"{request.instance.count} is more than training plan {plan.name!r} "
                                      f"reserves ({plan.instance_count})")

    for path, uri in (("dataset", request.dataset), ("validation_dataset", request.validation_dataset)):
        if uri is None:
            continue
        kind = dataset_kind(uri)
        if (kind == "fsx" or request.effective_input_mode == "FSx") and platform.fsx is None:
            add(path, "this platform has no FSx for Lustre file system; use an s3:// dataset")
        elif request.effective_input_mode == "FSx" and kind == "s3":
            bucket = uri[len("s3://"):].split("/", 1)[0]
            if bucket != platform.dataset_bucket:
                add(path, f"input_mode FSx reads the dataset bucket {platform.dataset_bucket!r} through FSx; "
                          f"{bucket!r} is not linked to the file system")
        if kind == "local" and not is_local_platform(platform):
            add(path, f"{uri!r} is a local folder: it only runs with `trainctl local`; upload it to S3 or FSx")

    if request.image is None:
        from jobs.images import image_problem

        problem = image_problem(request, platform)
        if problem:
            add(*problem)
    if p:
        raise RequestInvalid(p)


def is_local_platform(platform: PlatformSettings) -> bool:
    """`trainctl local` renders with settings whose name_prefix is `local` (no AWS behind them)."""
    return platform.name_prefix == "local" or getattr(platform, "local", False)
