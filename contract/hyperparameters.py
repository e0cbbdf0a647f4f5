"""The training package's hyperparameters: one description that the package parses, the launcher validates
requests against, the planner reads, and the reference table documents.

Each field says its JSON type, default, range or choices, one line of meaning, and who sets it (`set_by`):
  - "user": a request's `hyperparameters` (and `trainctl local`) may set it;
  - "request": the launcher sets it from the request field of the same name (strategy, model...);
  - "platform": the launcher sets it from other request fields (mp_parameters, from `parallel`);
  - "container": a path the SageMaker container provides through SM_* variables (contract.container).
To add a hyperparameter, add a field here and read it in `training/`; validation, docs and the
request's JSON Schema follow.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.data_formats import AUTO_MAX_WORKERS
from contract.errors import ConfigError
from contract.models import FACTORY_PATTERN, REFERENCE_MODELS
from contract.schema import meta


class Strategy(enum.StrEnum):
    """How a run is parallelized. `auto` is a request's: the planner replaces it before launch."""

    SINGLE = "single"
    DDP = "ddp"
    FSDP = "fsdp"  # FSDP2 over every rank
    HSDP = "hsdp"  # FSDP2 sharded within a group (a node), replicated across groups
    TP = "tp"  # tensor parallel (with FSDP2 on the data dimension)
    PP = "pp"  # pipeline parallel (with FSDP2 on the data dimension)
    HYBRID = "hybrid"  # pipeline x tensor x data (3D)
    SMP = "smp"  # SageMaker model parallel v2, only inside its own image
    AUTO = "auto"


# What the training package runs; a request may ask for these or `auto`.
TRAINING_STRATEGIES = ("single", "ddp", "fsdp", "hsdp", "tp", "pp", "hybrid", "smp")
REQUEST_STRATEGIES = (*TRAINING_STRATEGIES, Strategy.AUTO.value)
INTERLEAVED = "interleaved_1f1b"  # the schedule that loops several model stages a rank over the pipeline's ranks
PIPELINE_SCHEDULES = ("1f1b", INTERLEAVED, "gpipe")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
DATA_MODES = ("auto", "channels", "synthetic")
BACKENDS = ("auto", "gloo", "nccl", "smddp")
LR_SCHEDULES = ("cosine", "constant")
# How FSDP accumulates gradients over micro-batches (training.parallel.strategies.fsdp.gradient_sync).
FSDP_ACCUMULATION = ("sharded", "unsharded")
CHECKPOINTING_POLICIES = ("full", "selective")  # training.models.speedups says what each keeps
# Tokens per chunk of the package's cross-entropy (training.loss says why this many); 0 computes it whole.
LOSS_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class SmpParameters:
    """SMP v2's core configuration keys (the SageMaker SDK's `smp` distribution parameters)."""

    hybrid_shard_degree: int | None = field(default=None, metadata=meta("GPUs parameters are sharded over", min=1))
    tensor_parallel_degree: int | None = field(default=None, metadata=meta("GPUs a layer is split over", min=1))
    expert_parallel_degree: int | None = field(default=None, metadata=meta("GPUs experts are split over", min=1))
    context_parallel_degree: int | None = field(default=None, metadata=meta("GPUs a sequence is split over", min=1))
    sm_activation_offloading: bool | None = field(default=None, metadata=meta("offload activations to the CPU"))
    activation_loading_horizon: int | None = field(default=None, metadata=meta("layers loaded ahead", min=1))
    fsdp_cache_flush_warnings: bool | None = field(default=None, metadata=meta("warn on allocator cache flushes"))
    allow_empty_shards: bool | None = field(default=None, metadata=meta("allow ranks without a shard"))
    random_seed: int | None = field(default=None, metadata=meta("SMP's own seed", min=1))


def _check_model(model: str) -> str | None:
    if model in REFERENCE_MODELS or re.fullmatch(FACTORY_PATTERN, model):
        return None
    return f"{model!r}: use {', '.join(REFERENCE_MODELS)}, or 'package.module:factory' for your own model"


# A URI's scheme (`s3://`, `file://`): init_from takes a path inside the container, never a URI. A plain pattern
# (no flags) so the request's JSON Schema refuses the same values (its `not_pattern` annotation).
URI_SCHEME = r"^[A-Za-z][A-Za-z0-9+.-]*://"


def _check_init_from(path: str) -> str | None:
    # Only the form: the launcher checks requests with this rule where the container's files do not exist; the
    # training package says whether the path is there when it uses it.
    if re.match(URI_SCHEME, path):
        return (f"{path!r}: give a path inside the container (a channel's or a file system's folder), not a URI: "
                "a checkpoint step folder `.../step-N`, a checkpoint folder, or a `model.safetensors` file")
    return None


def _hp(doc: str, set_by: str = "user", **rules: Any) -> dict[str, Any]:
    return meta(doc, set_by=set_by, **rules)


# The share of a step spent waiting for data above which a run is input bound, unless a request sets
# input_bound_share: the training package logs it, the run's summary says it, the dashboard draws it.
INPUT_BOUND_SHARE = 0.1


@dataclass(frozen=True)
class TrainConfig:
    # What to train and how to parallelize it (always sent by the launcher).
    strategy: str = field(default="single", metadata=_hp(
        "parallelism the package applies", "request", choices=TRAINING_STRATEGIES))
    model: str = field(default="gpt", metadata=_hp(
        "gpt, vit, or `package.module:factory`", "request", check=_check_model))
    model_size: str = field(default="tiny", metadata=_hp("the reference model's preset", "request"))
    checkpoint_interval: int = field(default=100, metadata=_hp(
        "steps between checkpoints; 0 = only on stop and at the end", "request", min=0))
    # Data.
    data: str = field(default="auto", metadata=_hp(
        "auto: the channels when present; synthetic: generated batches", choices=DATA_MODES))
    seq_len: int | None = field(default=None, metadata=_hp(
        "decoder context length (null: the model preset's)", min=1))
    data_workers: int | None = field(default=None, metadata=_hp(
        "loader worker processes per rank that read, decode and augment batches ahead of the step (0: on the "
        f"training thread; null: auto, min({AUTO_MAX_WORKERS}, CPUs per rank - 1) for encoded images (webdataset), "
        "0 for memory-mapped tokens and arrays)", min=0))
    input_bound_share: float = field(default=INPUT_BOUND_SHARE, metadata=_hp(
        "the share of a step spent waiting for its batch above which rank 0 logs 'input bound' with the rates",
        min=0, max=1))
    # Batch: global = micro x grad_accum x world size. Give global and micro, or micro and grad_accum.
    global_batch_size: int | None = field(default=None, metadata=_hp(
        "samples per optimizer step over all ranks (null: micro x grad_accum x world size)", min=1))
    micro_batch_size: int = field(default=8, metadata=_hp("samples per rank per forward pass", min=1))
    grad_accum: int | None = field(default=None, metadata=_hp(
        "micro-batches per optimizer step (null: from global_batch_size, else 1)", min=1))
    max_steps: int = field(default=100, metadata=_hp("optimizer steps to train", min=1))
    # Optimizer and schedule.
    optimizer: str = field(default="adamw", metadata=_hp("optimizer", choices=OPTIMIZERS))
    lr: float = field(default=3e-4, metadata=_hp("peak learning rate", min=0))
    min_lr_ratio: float = field(default=0.1, metadata=_hp("final learning rate as a fraction of lr", min=0, max=1))
    lr_schedule: str = field(default="cosine", metadata=_hp("after warmup", choices=LR_SCHEDULES))
    warmup_steps: int = field(default=10, metadata=_hp("linear warmup steps", min=0))
    weight_decay: float = field(default=0.1, metadata=_hp("AdamW weight decay", min=0))
    beta1: float = field(default=0.9, metadata=_hp("AdamW beta1 (SGD momentum)", min=0, max=1))
    beta2: float = field(default=0.95, metadata=_hp("AdamW beta2", min=0, max=1))
    grad_clip: float = field(default=1.0, metadata=_hp("gradient-norm clipping; 0 disables it", min=0))
    # Numerics and speed.
    precision: str = field(default="auto", metadata=_hp(
        "auto: bf16 on a GPU that has it, fp32 on CPU", choices=PRECISIONS))
    compile: bool = field(default=False, metadata=_hp("torch.compile each block"))
    activation_checkpointing: bool = field(default=False, metadata=_hp("recompute block activations"))
    activation_checkpointing_policy: str = field(default="full", metadata=_hp(
        "what activation_checkpointing recomputes: full (a block's whole forward) or selective (keeps attention's "
        "and every other matmul's outputs, recomputes the norms, activations and the matmuls between)",
        choices=CHECKPOINTING_POLICIES))
    activation_checkpointing_every: int = field(default=1, metadata=_hp(
        "with activation_checkpointing, checkpoint every this many blocks (torchtitan's layer-wise selective "
        "checkpointing): 1 every block, 2 every second one (the 1st, 3rd, ...); the others keep all their "
        "activations and recompute nothing", min=1))
    loss_chunk_tokens: int = field(default=LOSS_CHUNK_TOKENS, metadata=_hp(
        "the cross-entropy in chunks of this many tokens (a classifier's: samples), each chunk's fp32 log-softmax recomputed in backward, "
        "so one chunk's fp32 temporaries are alive at a time beside the logits and their gradient (0: the whole "
        "micro-batch at once, its fp32 logits and log-softmax kept: vocabulary x 8 bytes a token more); with "
        "compile, outside a pipeline, the loss is compiled whole (fused, it keeps no fp32 copy)", min=0))
    micro_batch_per_group: bool = field(default=False, metadata=_hp(
        "tp, pp, hybrid: micro_batch_size is each batch group's (the tensor and pipeline ranks of one group read the "
        "same samples) rather than each rank's (pooled by the group), so global_batch_size may be as small as the "
        "data-parallel size (GPUs / (tp_degree x pp_degree)) instead of the GPU count"))
    dropout: float = field(default=0.0, metadata=_hp("dropout of the reference models", min=0, max=1))
    fsdp_reshard_after_forward: bool = field(default=True, metadata=_hp(
        "FSDP: free gathered parameters after forward (less memory, one more all-gather)"))
    fsdp_accumulation: str = field(default="sharded", metadata=_hp(
        "FSDP with grad_accum: sharded reduce-scatters every micro-batch (a shard of the gradients, torchtitan's "
        "way); unsharded once per step (less communication, a whole model's gradients per rank)",
        choices=FSDP_ACCUMULATION))
    backend: str = field(default="auto", metadata=_hp(
        "process-group backend (auto: nccl on GPUs, gloo on CPU)", choices=BACKENDS))
    # Evaluation, logging, early stopping.
    eval_interval: int = field(default=0, metadata=_hp("steps between evaluations; 0 = never", min=0))
    eval_batches: int = field(default=8, metadata=_hp("validation global batches per evaluation", min=0))
    early_stopping_patience: int = field(default=0, metadata=_hp(
        "evaluations without improvement before stopping; 0 = off", min=0))
    log_interval: int = field(default=10, metadata=_hp("steps between metric lines (0 is taken as 1)", min=0))
    # Checkpoints.
    keep_checkpoints: int = field(default=3, metadata=_hp("complete checkpoints kept (0 is taken as 1)", min=0))
    async_checkpoint: bool = field(default=False, metadata=_hp("save checkpoints in the background"))
    seed: int = field(default=1234, metadata=_hp("seed of initialization, data order and dropout"))
    init_from: str | None = field(default=None, metadata=_hp(
        "start from these weights (a checkpoint's `step-N` folder, a checkpoint folder: its newest complete step, "
        "or a `model.safetensors`) at step 0 with a fresh optimizer; ignored once the run has checkpoints of its "
        "own", check=_check_init_from, not_pattern=URI_SCHEME))
    # Torch-native model parallelism (hsdp, tp, pp, hybrid): set by the launcher from the request's `parallel`.
    tp_degree: int = field(default=1, metadata=_hp("ranks a layer's tensors are split over", "platform", min=1))
    pp_degree: int = field(default=1, metadata=_hp("pipeline stages", "platform", min=1))
    dp_shard: int = field(default=0, metadata=_hp(
        "ranks parameters are sharded over (0: all data-parallel ranks; hsdp: the GPUs of one node)",
        "platform", min=0))
    pp_microbatches: int | None = field(default=None, metadata=_hp(
        "micro-batches per pipeline step (null: 2 x stages)", "platform", min=1))
    pp_schedule: str = field(default="1f1b", metadata=_hp(
        "pipeline schedule", "platform", choices=PIPELINE_SCHEDULES))
    pp_stages_per_rank: int | None = field(default=None, metadata=_hp(
        "model stages each pipeline rank holds (interleaved_1f1b: 2 or more, null: 2; the others: 1)", "platform",
        min=1))
    # torch.profiler on demand (training.metrics.profiling): traces beside the TensorBoard event files.
    profile_from: int = field(default=0, metadata=_hp(
        "profile the steps from this one on with torch.profiler (CPU and CUDA activities, memory, shapes, stacks; "
        "a Chrome/TensorBoard trace per rank, and a CUDA memory snapshot on a GPU), beside the TensorBoard event files; "
        "0: no profile", min=0))
    profile_steps: int = field(default=2, metadata=_hp("how many steps profile_from profiles", min=1, max=100))
    profile_ranks: str = field(default="0", metadata=_hp(
        "which ranks profile_from profiles: `all`, or global ranks separated by commas (0,8)",
        pattern=r"all|\d+(,\d+)*"))
    # Failures the package reports itself (one line in contract.container.FAILURE_FILE).
    nonfinite_patience: int = field(default=3, metadata=_hp(
        "consecutive steps the loss or gradient norm may be NaN/Inf before the job fails", min=1))
    checkpoint_minutes: float = field(default=0.0, metadata=_hp(
        "also checkpoint when this many minutes passed since the last one; 0 = steps only; left out of a "
        "request, the launcher sets each attempt's from the planner (Young/Daly, before a training plan's end)",
        min=0))
    # Hangs and stragglers (training.resilience.watchdog, training.resilience.stragglers). A hung collective otherwise holds the whole
    # cluster until the process group's timeout; a slow rank slows every rank silently.
    hang_timeout_factor: float = field(default=10.0, metadata=_hp(
        "a step may take this many times the run's mean step time before the watchdog ends the run as hung "
        "(every rank's stacks in the log, one failure line naming the rank that stopped)", min=1))
    hang_timeout_min_seconds: float = field(default=300.0, metadata=_hp(
        "the shortest a step may take before the watchdog ends the run as hung (the floor under "
        "hang_timeout_factor x the mean step time); 0 turns the watchdog off", min=0))
    hang_timeout_startup_seconds: float = field(default=900.0, metadata=_hp(
        "what the watchdog allows what is not a timed step: the startup through the first step (model build, "
        "checkpoint restore, compile), a checkpoint save, an evaluation, the final export; the process group's "
        "collective timeout is set above it", min=1))
    straggler_margin: float = field(default=0.2, metadata=_hp(
        "a rank is slow in a log interval when its own delays (time before the step boundary, waiting for its "
        "batch) exceed the median rank's by this fraction of the median step time", min=0))
    straggler_patience: int = field(default=3, metadata=_hp(
        "log intervals in a row a rank must be slow before it is named as a straggler", min=1))
    # SageMaker model parallel (smp strategy): JSON object or the toolkit's k=v,k=v form.
    mp_parameters: dict[str, Any] = field(default_factory=dict, metadata=_hp(
        "SMP v2 configuration (smp strategy)", "platform", keys=SmpParameters))
    # Paths: SageMaker's environment by default; the package also takes them as arguments (tests, bench), never from
    # a request (jobs.request.hyperparameter_rules refuses them: a path moved off /opt/ml/checkpoints is not synced).
    checkpoint_dir: str = field(default="", metadata=_hp("checkpoint folder", "container"))
    model_dir: str = field(default="", metadata=_hp("final model folder", "container"))
    output_data_dir: str = field(default="", metadata=_hp("metrics and status folder", "container"))
    train_dir: str = field(default="", metadata=_hp("train channel folder", "container"))
    validation_dir: str = field(default="", metadata=_hp("validation channel folder", "container"))

    def batch_layout(self, world_size: int) -> tuple[int, int]:
        """(global batch, grad accumulation steps) for this world size; one clear problem when they disagree
        (`batch_layout` below: the launcher checks requests with the same function)."""
        return batch_layout(world_size, self.micro_batch_size, self.global_batch_size, self.grad_accum)

    @property
    def effective_log_interval(self) -> int:
        return max(1, self.log_interval)

    @property
    def effective_keep_checkpoints(self) -> int:
        return max(1, self.keep_checkpoints)


def batch_layout(world_size: int, micro_batch_size: int, global_batch_size: int | None = None,
                 grad_accum: int | None = None) -> tuple[int, int]:
    """(global batch, grad accumulation steps) of a run over `world_size` processes; ConfigError when the three
    batch hyperparameters cannot hold together there.

    One optimizer step = micro_batch_size x world size x grad accumulation samples, for every strategy: each rank
    reads its own micro-batch, and tensor/pipeline groups pool their ranks' micro-batches (training.step) rather
    than share one, so every rank counts. The training package calls this at startup (TrainConfig.batch_layout)
    and the launcher before launch (jobs.request.platform_rules), so a request is refused by the same arithmetic.
    """
    per_step = micro_batch_size * world_size
    if global_batch_size is None:
        accum = grad_accum or 1
        return per_step * accum, accum
    if global_batch_size % per_step:
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not a multiple of micro_batch_size x world size "
            f"= {micro_batch_size} x {world_size}: change global_batch_size or micro_batch_size")
    accum = global_batch_size // per_step
    if grad_accum is not None and grad_accum != accum:
        raise ConfigError(
            f"grad_accum={grad_accum} disagrees with global_batch_size={global_batch_size} / "
            f"(micro_batch_size={micro_batch_size} x world size {world_size}) = {accum}: give one of them")
    return global_batch_size, accum


def resumed_batch_layout(world_size: int, micro_batch_size: int, global_batch_size: int | None,
                         grad_accum: int | None, recorded: int | None) -> tuple[int, int, str | None]:
    """(global batch, grad accumulation steps, a line saying what changed or None) of a run that resumes checkpoints
    written with a global batch of `recorded` samples (None: a fresh run, or checkpoints that did not record it).

    A run's global batch is what its request says: an explicit global_batch_size, or micro x world x accumulation
    where the run began. Resumed on another world size (fewer instances, a fallback type with fewer GPUs) the second
    would silently become another batch, so accumulation absorbs the change: grad_accum = recorded / (micro x world),
    or a ConfigError naming the numbers when that is not whole. An explicit global_batch_size always wins (the data
    position carries over in samples)."""
    layout = batch_layout(world_size, micro_batch_size, global_batch_size, grad_accum)
    if recorded is None or global_batch_size is not None or layout[0] == recorded:
        return (*layout, None)
    per_step = micro_batch_size * world_size
    if recorded % per_step:
        divisors = [m for m in range(1, micro_batch_size + 1) if recorded % (m * world_size) == 0]
        fix = f"micro_batch_size={divisors[-1]}" if divisors else "another process count"
        raise ConfigError(
            f"the run's checkpoints were written with a global batch of {recorded} samples; on {world_size} ranks "
            f"with micro_batch_size={micro_batch_size} that needs grad_accum = {recorded} / ({micro_batch_size} x "
            f"{world_size}), which is not whole: use {fix} to keep the run's batch, or set global_batch_size to "
            "change it on purpose")
    accum = recorded // per_step
    return recorded, accum, (f"[train] keeping the run's global batch of {recorded} samples on {world_size} ranks: "
                             f"grad_accum {layout[1]} -> {accum} (micro {micro_batch_size} x {world_size} ranks x "
                             f"{accum}; the checkpoints were written on another world size)")


def nearest_global_batches(global_batch_size: int, step: int) -> tuple[int, ...]:
    """The valid global batch sizes nearest `global_batch_size` when they must be multiples of `step`: the multiple
    below (when there is one) and the one above; just itself when it already is one."""
    below = global_batch_size // step * step
    if below == global_batch_size:
        return (global_batch_size,)
    return tuple(v for v in (below, below + step) if v >= step)


def hyperparameter_fields(set_by: str | None = None) -> tuple[str, ...]:
    """The hyperparameter names, all of them or those one party sets."""
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if set_by in (None, f.metadata["set_by"]))


def canonical_name(key: str) -> str:
    """`model-size`, `--model_size` and `model_size` are one key: the toolkit and argparse treat them alike."""
    return key.lstrip("-").replace("-", "_")


def canonical_hyperparameters(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The values under their canonical names (a request may spell a key with dashes; the job gets it as written)."""
    return {canonical_name(k): v for k, v in (values or {}).items()}


def encode_hyperparameters(values: Mapping[str, Any]) -> dict[str, str]:
    """What a CreateTrainingJob's HyperParameters carry: every value JSON-encoded, as SDK v2 does (the in-container
    toolkit json-decodes them). Strict JSON: a NaN or infinity (the request rules refuse them) fails here rather than
    reach the container as a bare NaN token."""
    return {k: json.dumps(v, allow_nan=False) for k, v in values.items()}


def decode_hyperparameters(encoded: Mapping[str, Any]) -> dict[str, Any]:
    """A job's HyperParameters as the launcher meant them, decoded as the toolkit decodes them: a value that is not
    JSON (a job this platform did not render) stays a string."""
    decoded = {}
    for key, value in encoded.items():
        try:
            decoded[key] = json.loads(value)
        except (TypeError, ValueError):
            decoded[key] = value
    return decoded
