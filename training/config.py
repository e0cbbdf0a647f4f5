"""One typed config for a training run, read from the SageMaker container contract.

The in-container toolkit (sagemaker-training, `mapping.to_cmd_args`) json-decodes each hyperparameter and
passes every non-`sagemaker_*` key to the script as `--key value`, keys sorted, values through `str()`:
an int arrives as `8`, a bool as `True`/`False`, a dict as `k1=v1,k2=v2` (sorted), a list as `[1, 2]`,
null as an empty string. `parse_args` accepts exactly that, plus `--key=value`, dashes for underscores,
and JSON for dicts. Paths come from SM_* variables (see `from_environment`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STRATEGIES = ("single", "ddp", "fsdp", "smp")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
DATA_MODES = ("auto", "channels", "synthetic")
BACKENDS = ("auto", "gloo", "nccl", "smddp")
LR_SCHEDULES = ("cosine", "constant")


class ConfigError(ValueError):
    """A mistake the user can fix; the entry point prints it as one line, without a traceback."""


@dataclass
class TrainConfig:
    # What to train and how to parallelize it (always sent by the launcher).
    strategy: str = "single"
    model: str = "gpt"  # gpt | vit | module:factory
    model_size: str = "tiny"
    checkpoint_interval: int = 100  # steps; 0 = only on stop and at the end
    # Data.
    data: str = "auto"  # auto: the channels when present; synthetic: generated batches
    seq_len: int | None = None  # decoder context; default from the model preset
    # Batch: global = micro x grad_accum x world size. Give global and micro, or micro and grad_accum.
    global_batch_size: int | None = None
    micro_batch_size: int = 8
    grad_accum: int | None = None
    max_steps: int = 100
    # Optimizer and schedule.
    optimizer: str = "adamw"
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    lr_schedule: str = "cosine"
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    # Numerics and speed.
    precision: str = "auto"  # auto: bf16 on a GPU that has it, fp32 on CPU
    compile: bool = False
    activation_checkpointing: bool = False
    dropout: float = 0.0
    fsdp_reshard_after_forward: bool = True
    backend: str = "auto"
    # Evaluation, logging, early stopping.
    eval_interval: int = 0  # steps; 0 = never
    eval_batches: int = 8  # global batches of the validation set per evaluation
    early_stopping_patience: int = 0  # evaluations without improvement; 0 = off
    log_interval: int = 10
    # Checkpoints.
    keep_checkpoints: int = 3
    async_checkpoint: bool = False
    seed: int = 1234
    # SageMaker model parallel (smp strategy): JSON object or the toolkit's k=v,k=v form.
    mp_parameters: dict[str, Any] = field(default_factory=dict)
    # Paths: SageMaker's environment by default; accepted as keys for local use.
    checkpoint_dir: str = ""
    model_dir: str = ""
    output_data_dir: str = ""
    train_dir: str = ""
    validation_dir: str = ""

    def __post_init__(self) -> None:
        _choice("strategy", self.strategy, STRATEGIES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("data", self.data, DATA_MODES)
        _choice("backend", self.backend, BACKENDS)
        _choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        for name in ("max_steps", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"hyperparameter '{name}' must be at least 1, got {getattr(self, name)}")
        for name in ("checkpoint_interval", "warmup_steps", "eval_interval", "early_stopping_patience",
                     "keep_checkpoints", "log_interval", "eval_batches"):
            if getattr(self, name) < 0:
                raise ConfigError(f"hyperparameter '{name}' must be 0 or more, got {getattr(self, name)}")
        for name in ("global_batch_size", "grad_accum", "seq_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"hyperparameter '{name}' must be at least 1, got {value}")
        if self.log_interval == 0:
            self.log_interval = 1
        if self.keep_checkpoints == 0:
            self.keep_checkpoints = 1
        if self.model not in ("gpt", "vit") and ":" not in self.model:
            raise ConfigError(
                f"hyperparameter 'model' is {self.model!r}: use gpt, vit, or 'package.module:factory'"
            )

    def batch_layout(self, world_size: int) -> tuple[int, int]:
        """(global batch, grad accumulation steps) for this world size; one clear error when they disagree."""
        per_step = self.micro_batch_size * world_size
        if self.global_batch_size is None:
            accum = self.grad_accum or 1
            return per_step * accum, accum
        if self.global_batch_size % per_step:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not a multiple of micro_batch_size x world size "
                f"= {self.micro_batch_size} x {world_size}: change global_batch_size or micro_batch_size"
            )
        accum = self.global_batch_size // per_step
        if self.grad_accum is not None and self.grad_accum != accum:
            raise ConfigError(
                f"grad_accum={self.grad_accum} disagrees with global_batch_size={self.global_batch_size} / "
                f"(micro_batch_size={self.micro_batch_size} x world size {world_size}) = {accum}: give one of them"
            )
        return self.global_batch_size, accum


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"hyperparameter '{name}' is {value!r}: use one of {', '.join(allowed)}")


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
ACCEPTED_HYPERPARAMETERS: frozenset[str] = frozenset(FIELDS)

# The SMP v2 core configuration keys (the `smp` distribution parameters of the SageMaker SDK).
SMP_PARAMETERS = {
    "hybrid_shard_degree": int,
    "tensor_parallel_degree": int,
    "expert_parallel_degree": int,
    "context_parallel_degree": int,
    "sm_activation_offloading": bool,
    "activation_loading_horizon": int,
    "fsdp_cache_flush_warnings": bool,
    "allow_empty_shards": bool,
    "random_seed": int,
}


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"hyperparameter '{name}' must be true or false, got {text!r}")


def parse_mp_parameters(text: str | dict) -> dict[str, Any]:
    """SMP parameters from a dict, a JSON object, or the toolkit's `k=v,k=v` rendering of a dict."""
    if isinstance(text, dict):
        raw = dict(text)
    elif not text.strip():
        raw = {}
    elif text.strip().startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"hyperparameter 'mp_parameters' is not valid JSON: {e}") from None
    else:
        raw = {}
        for pair in text.split(","):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ConfigError(f"hyperparameter 'mp_parameters': expected key=value, got {pair!r}")
            raw[key.strip()] = value.strip()
    parsed: dict[str, Any] = {}
    for key, value in raw.items():
        kind = SMP_PARAMETERS.get(key)
        if kind is None:
            hint = difflib.get_close_matches(key, SMP_PARAMETERS, n=1)
            did = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise ConfigError(f"mp_parameters has an unknown key '{key}'{did}; known: {', '.join(SMP_PARAMETERS)}")
        if kind is bool:
            parsed[key] = value if isinstance(value, bool) else _parse_bool(f"mp_parameters.{key}", str(value))
        else:
            try:
                parsed[key] = int(value)
            except (TypeError, ValueError):
                raise ConfigError(f"mp_parameters.{key} must be an integer, got {value!r}") from None
            if parsed[key] < 1:
                raise ConfigError(f"mp_parameters.{key} must be at least 1, got {parsed[key]}")
    return parsed


def _convert(name: str, text: str) -> Any:
    hint = typing.get_type_hints(TrainConfig)[name]
    optional = False
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, args[0]
    if optional and text.strip().lower() in ("", "none", "null"):
        return None
    if typing.get_origin(hint) is dict:
        return parse_mp_parameters(text)
    if hint is bool:
        return _parse_bool(name, text)
    if hint in (int, float):
        try:
            number = float(text)
            if hint is int:
                if not number.is_integer():
                    raise ValueError
                return int(number)
            return number
        except ValueError:
            raise ConfigError(f"hyperparameter '{name}' must be {'an integer' if hint is int else 'a number'}, "
                              f"got {text!r}") from None
    return text


def _key(raw: str) -> str:
    name = raw.lstrip("-").replace("-", "_")
    if name not in FIELDS:
        hint = difflib.get_close_matches(name, FIELDS, n=1)
        did = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(f"unknown hyperparameter '{name}'{did}; accepted: {', '.join(sorted(FIELDS))}")
    return name


def parse_args(argv: list[str], env: typing.Mapping[str, str] | None = None) -> TrainConfig:
    """The config from `--key value` arguments (as the toolkit passes them) over the SM_* environment."""
    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            raise ConfigError(f"unexpected argument {token!r}: hyperparameters arrive as --key value")
        if "=" in token:
            raw, value = token.split("=", 1)
            i += 1
        else:
            raw = token
            # The toolkit renders null as an empty value; a flag at the end or before the next key is "".
            has_value = i + 1 < len(argv) and not (argv[i + 1].startswith("--") and len(argv[i + 1]) > 2)
            value = argv[i + 1] if has_value else ""
            i += 2 if has_value else 1
        values[_key(raw)] = value
    typed = {name: _convert(name, text) for name, text in values.items()}
    return from_environment(typed, os.environ if env is None else env)


def from_environment(overrides: dict[str, Any], env: typing.Mapping[str, str]) -> TrainConfig:
    """Fill the path keys from SageMaker's variables (the container contract), then validate."""
    defaults = {
        "checkpoint_dir": env.get("TRAINING_CHECKPOINT_DIR", "/opt/ml/checkpoints"),
        "model_dir": env.get("SM_MODEL_DIR", "/opt/ml/model"),
        "output_data_dir": env.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"),
        "train_dir": env.get("SM_CHANNEL_TRAIN", ""),
        "validation_dir": env.get("SM_CHANNEL_VALIDATION", ""),
    }
    merged = {**defaults, **{k: v for k, v in overrides.items() if not (k in defaults and v in ("", None))}}
    try:
        return TrainConfig(**merged)
    except TypeError as e:  # only reachable from Python callers passing a wrong key
        raise ConfigError(str(e)) from None


def data_mode(cfg: TrainConfig) -> str:
    """`synthetic` or `channels`: a channel that holds a file named `synthetic` asks for generated data."""
    if cfg.data == "channels" and not cfg.train_dir:
        raise ConfigError("data=channels but there is no train channel (SM_CHANNEL_TRAIN): add a 'train' input channel")
    if cfg.data != "auto":
        return cfg.data
    if not cfg.train_dir:
        raise ConfigError(
            "no train channel (SM_CHANNEL_TRAIN is not set): add a 'train' input channel, "
            "or set the hyperparameter data=synthetic for a smoke test"
        )
    if (Path(cfg.train_dir) / "synthetic").exists():
        return "synthetic"
    return "channels"


def as_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


@dataclass(frozen=True)
class Container:
    """Where this process runs, from the SageMaker container's variables (defaults: one local host)."""

    hosts: tuple[str, ...]
    current_host: str
    num_gpus: int


def container(env: typing.Mapping[str, str]) -> Container:
    try:
        hosts = tuple(json.loads(env.get("SM_HOSTS", '["localhost"]')))
        num_gpus = int(env.get("SM_NUM_GPUS", "0") or 0)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"SM_HOSTS / SM_NUM_GPUS are malformed ({e}): they are set by the SageMaker container") from None
    return Container(hosts=hosts, current_host=env.get("SM_CURRENT_HOST", hosts[0] if hosts else "localhost"),
                     num_gpus=num_gpus)
