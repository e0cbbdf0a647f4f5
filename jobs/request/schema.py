"""The job request's schema: the small JSON document an engineer writes, its fields, defaults and ranges.

Each dataclass is read by the one schema engine (contract.schema): field types, `min`/`max`, `choices`
and the field-level rules of jobs.request.field_rules. The same definitions give README's reference table
(jobs.reference) and the request's JSON Schema (jobs.request.parse.request_json_schema). Rules across fields
are in jobs.request.cross_rules, rules that need the deployed platform in jobs.request.platform_rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.hyperparameters import PIPELINE_SCHEDULES, REQUEST_STRATEGIES, Strategy
from contract.metrics import MAX_METRIC_DEFINITIONS, METRIC_NAMES
from contract.models import preset_names
from contract.schema import meta, to_jsonable
from jobs import catalog
from jobs.naming import MAX_JOB_TAGS, PLATFORM_TAGS, RUN_NAME_MAX
from jobs.planning.auto_strategy import plan_for_request
from jobs.request.environment_rules import check_environment, check_secrets
from jobs.request.field_rules import (
    check_dataset,
    check_group_name,
    check_hyperparameter_text,
    check_image,
    check_instance_type,
    check_instance_types,
    check_metric_name,
    check_name,
    check_plain_text,
    check_run_id,
    check_tags,
    dataset_kind,
)
from jobs.request.hyperparameter_rules import check_hyperparameters
from jobs.request.limits import (
    MAX_CHECKPOINT_INTERVAL,
    MAX_ENVIRONMENT,
    MAX_INSTANCE_GROUPS,
    MAX_PENDING_HOURS,
    MAX_RUNTIME_HOURS,
    MAX_TAGS,
    MAX_WARM_POOL_MINUTES,
)
from jobs.request.sizing import ModelShape, Sizing

INPUT_MODES = ("File", "FastFile", "FSx")
# When to use each strategy a request may name (contract.hyperparameters.REQUEST_STRATEGIES): the `strategy`
# field's documentation, so README's reference and the JSON Schema say it; a test checks every one is here.
STRATEGY_USES = {
    "single": "one process on one GPU or CPU, for small models and debugging",
    "ddp": "the model, its gradients and optimizer state fit one GPU (a copy per GPU, gradients all-reduced)",
    "fsdp": "they do not fit one GPU (FSDP2 shards them over every GPU)",
    "hsdp": "several nodes, and the state fits one node (FSDP2 within each node, replicas across nodes)",
    "tp": "one layer's weights or activations crowd a GPU (each layer split over a node's GPUs, FSDP2 across nodes)",
    "pp": "the layers do not fit one node (stages across nodes, FSDP2 within a stage)",
    "hybrid": "the largest models (pipeline stages across nodes x tensor parallel within a node)",
    "smp": "SageMaker model parallel v2, in its own image (its degrees from `parallel`)",
    "auto": "the planner picks among the others but smp and sends its degrees (`trainctl plan` shows the pick; "
            "leave the tensor and pipeline degrees at 1)",
}


@dataclass(frozen=True)
class InstanceConfig:
    type: str = field(metadata=meta("ML instance type, e.g. ml.p4d.24xlarge (see the instance catalog)",
                                    check=check_instance_type))
    count: int = field(default=1, metadata=meta("number of instances", min=1, max=256))
    fallbacks: tuple[str, ...] = field(default=(), metadata=meta(
        "instance types to try, in order, after a capacity shortage on `type`", max=5, check=check_instance_types))
    volume_gb: int = field(default=100, metadata=meta(
        "EBS volume per instance, GB (types with local NVMe use the instance store instead)", min=1, max=16384))


@dataclass(frozen=True)
class InstanceGroup:
    name: str = field(metadata=meta("group name (letters, digits, `-`, `_`)", check=check_group_name))
    type: str = field(metadata=meta("ML instance type of the group", check=check_instance_type))
    count: int = field(default=1, metadata=meta("instances in the group", min=1, max=256))


@dataclass(frozen=True)
class Parallelism:
    tensor_parallel_degree: int = field(default=1, metadata=meta(
        "GPUs a layer's tensors are split over (tp, hybrid, smp; 1 with auto, which picks its own)", min=1))
    pipeline_parallel_degree: int = field(default=1, metadata=meta(
        "pipeline stages (pp, hybrid; 1 with auto, which picks its own, and with smp, which has none)", min=1))
    context_parallel_degree: int = field(default=1, metadata=meta("GPUs a sequence is split over (smp)", min=1))
    hybrid_shard_degree: int = field(default=0, metadata=meta(
        "GPUs parameters are sharded over (smp, hsdp, tp, pp, hybrid; 0 = all data-parallel GPUs, for hsdp the GPUs of "
        "one node)",
        min=0))
    pipeline_microbatches: int | None = field(default=None, metadata=meta(
        "micro-batches per pipeline step (pp, hybrid; at least the stage count; null: 2 x stages)", min=1))
    pipeline_schedule: str = field(default="1f1b", metadata=meta(
        "pipeline schedule (pp, hybrid)", choices=PIPELINE_SCHEDULES))
    pipeline_stages_per_rank: int | None = field(default=None, metadata=meta(
        "model stages each pipeline rank holds (interleaved_1f1b: 2 or more, a smaller bubble for more point-to-point "
        "hops; null: 2; the other schedules: 1)", min=1))


@dataclass(frozen=True)
class MetricSpec:
    name: str = field(metadata=meta("CloudWatch metric name", check=check_metric_name))
    regex: str = field(metadata=meta("regex with one group that captures the value from the log"))


@dataclass(frozen=True)
class RetrySettings:
    """The request's `retry` section: its knobs for jobs.retry.policy (which decides)."""

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
    hardware_max_retries: int = field(default=2, metadata=meta(
        "new attempts after a hardware or network fault (unhealthy instance, ECC, NCCL/EFA), with infra_check on",
        min=0, max=30))
    api_error_wait_seconds: int = field(default=60, metadata=meta(
        "first wait after a quota (ResourceLimitExceeded) or throttling error; doubles each time", min=0, max=86400))
    api_error_wait_max_seconds: int = field(default=900, metadata=meta(
        "longest wait after a quota or throttling error", min=0, max=86400))
    api_error_max_retries: int = field(default=5, metadata=meta(
        "quota/throttling errors of CreateTrainingJob in a row before the run gives up (a job that runs but cannot "
        "be looked up is waited on as long as it can run, never stopped for it)", min=0, max=30))


@dataclass(frozen=True)
class JobRequest:
    name: str = field(metadata=meta(
        f"run name: letters, digits and dashes, at most {RUN_NAME_MAX} characters; names the training jobs",
        check=check_name))
    dataset: str = field(metadata=meta(
        "training data: `s3://bucket/prefix/`, `fsx:/path/on/the/file/system`, or a local folder (trainctl local)",
        check=check_dataset))
    instance: InstanceConfig | None = field(default=None, metadata=meta(
        "instance type, count, fallbacks, volume (required unless instance_groups is given)"))
    strategy: Strategy = field(default=Strategy.DDP, metadata=meta(
        "how the run is parallelized, and when to use each: "
        + "; ".join(f"{name}: {use}" for name, use in STRATEGY_USES.items()),
        choices=REQUEST_STRATEGIES))
    model: str = field(default="gpt", metadata=meta("gpt, vit, or `package.module:factory`",
                                                    check=check_hyperparameter_text))
    model_size: str = field(default="small", metadata=meta(
        f"model preset: {', '.join(preset_names('gpt'))} (gpt)...", check=check_hyperparameter_text))
    validation_dataset: str | None = field(default=None, metadata=meta(
        "validation data, same forms as dataset (channel `validation`)", check=check_dataset))
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
    checkpoint_interval: int = field(default=500, metadata=meta(
        "training steps between checkpoints", min=1, max=MAX_CHECKPOINT_INTERVAL))
    hyperparameters: dict[str, Any] = field(default_factory=dict, metadata=meta(
        "the training package's hyperparameters, passed as `--key value` on the toolkit's shell command line: numbers, "
        "true/false, or strings of letters, digits and . _ : / = + , @ % -; the platform's own keys (paths, "
        "strategy, model, sagemaker_*...) are refused", check=check_hyperparameters))
    environment: dict[str, str] = field(default_factory=dict, metadata=meta(
        "environment variables of the training container: NCCL_*, FI_*, TORCH_*, PYTORCH_*, CUDA_*, HF_*, WANDB_* "
        "and the like (jobs.request.environment_rules, plus the platform's environment_patterns); no credentials: use "
        "secrets", max=MAX_ENVIRONMENT, check=check_environment))
    secrets: dict[str, str] = field(default_factory=dict, metadata=meta(
        "environment variables read from AWS Secrets Manager when the container starts: NAME -> the secret's ARN "
        "(the value never enters the execution's input or history; the platform's PyTorch images only)",
        check=check_secrets))
    framework_version: str | None = field(default=None, metadata=meta(
        "PyTorch (or SMP, for smp) version of the AWS image (null: the platform's default)", check=check_plain_text))
    image: str | None = field(default=None, metadata=meta(
        "container image URI, overrides framework_version; from the platform's AWS registries or its "
        "allowed_image_repositories", check=check_image))
    warm_pool_minutes: int | None = field(default=None, metadata=meta(
        "keep instances warm this long after the job (null: the platform's default)", min=0, max=MAX_WARM_POOL_MINUTES))
    training_plan: str | None = field(default=None, metadata=meta(
        "name of a SageMaker training plan the platform knows; its instance type must match"))
    instance_groups: tuple[InstanceGroup, ...] = field(default=(), metadata=meta(
        "heterogeneous cluster instead of `instance` (at most 5 groups)", max=MAX_INSTANCE_GROUPS))
    parallel: Parallelism = field(default_factory=Parallelism, metadata=meta(
        "model-parallel degrees (hsdp, tp, pp, hybrid, smp)"))
    profiler: bool = field(default=False, metadata=meta("SageMaker system profiler (CPU/GPU/network monitoring)"))
    tensorboard: bool = field(default=True, metadata=meta(
        "TensorBoard event files of every metric (rank 0), synced to the run's S3 prefix during training "
        "(`trainctl show RUN` says where and how to open them); under trainctl local, in the work folder"))
    infra_check: bool = field(default=False, metadata=meta("hardware and network health checks before training"))
    network_isolation: bool = field(default=False, metadata=meta(
        "no network from the container; the code arrives as an input channel"))
    inter_container_encryption: bool = field(default=False, metadata=meta(
        "encrypt traffic between instances (slows collectives; traffic already stays in the private VPC)"))
    tags: dict[str, str] = field(default_factory=dict, metadata=meta(
        f"tags on the training jobs (the platform adds {len(PLATFORM_TAGS)} of its own, and a team's cost "
        "allocation tag)", max=MAX_TAGS - len(PLATFORM_TAGS) - MAX_JOB_TAGS, check=check_tags))
    metrics: tuple[MetricSpec, ...] = field(default=(), metadata=meta(
        "extra metric definitions on top of the training package's own",
        max=MAX_METRIC_DEFINITIONS - len(METRIC_NAMES)))
    retry: RetrySettings = field(default_factory=RetrySettings, metadata=meta("the state machine's retry policy"))
    resume_run: str | None = field(default=None, metadata=meta(
        "the run id of a run that ended (max runtime, attempts or time spent, stopped): continue it on its "
        "checkpoints, under its id, attempt numbers following on (`trainctl resume RUN`); model and model_size must "
        "be the run's, while hyperparameters.max_steps, the instances and `retry` may change", check=check_run_id))
    init_from_run: str | None = field(default=None, metadata=meta(
        "the run id of a run of this platform to start from (fine-tuning, a longer schedule): its newest complete "
        "checkpoint's weights, at step 0, under a new run id with a fresh optimizer, data order and schedule; its "
        "checkpoints arrive as the `init` input channel (hyperparameters.init_from points there). The same model "
        "and model_size as that run; on this machine (`trainctl local`) give hyperparameters.init_from a folder",
        check=check_run_id))
    model_shape: ModelShape | None = field(default=None, metadata=meta(
        "the planner's view of a model without a preset (presets fill it in themselves)"))
    sizing: Sizing | None = field(default=None, metadata=meta(
        "what the planner sizes the run for: data, epochs, deadline, budget, GPUs"))

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
    def resolved_strategy(self) -> Strategy:
        """The strategy the training package runs on the request's own instances."""
        return self.strategy_on(None)

    def strategy_on(self, instance_type: str | None) -> Strategy:
        """The strategy the training package runs on `instance_type` (None: the request's own instances): the
        request's, or for `auto` the planner's pick for that type (jobs.planning.auto_strategy; jobs.render.training_job sends its degrees)."""
        if self.strategy is not Strategy.AUTO:
            return self.strategy
        return Strategy(plan_for_request(self, instance_type).strategy)

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
        return self.spot_max_wait_hours if self.spot else None

    @property
    def spot_max_wait_hours(self) -> float:
        """MaxWait of an attempt on Spot: max_wait_hours, or twice the runtime (at most the API's 28 days)."""
        if self.max_wait_hours is not None:
            return self.max_wait_hours
        return min(2 * self.max_runtime_hours, MAX_RUNTIME_HOURS)

    @property
    def effective_max_total_hours(self) -> float:
        return self.retry.max_total_hours or 3 * self.max_runtime_hours

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)
