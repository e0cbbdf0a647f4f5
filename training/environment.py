"""The SageMaker container as this package reads it: hosts, GPUs, channels and folders (SM_* variables).

Every variable name and default path comes from `contract.container`; this is the one module that reads them.
"""

from __future__ import annotations

import json
import os
import typing
from dataclasses import dataclass
from pathlib import Path

from contract import container as sm
from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig

# The marker file a channel may hold to ask for generated data (`trainctl local`'s smoke tests).
SYNTHETIC_MARKER = "synthetic"  # a file of this name in the train channel asks for generated data


class DataMissing(ConfigError):
    """A channel the run needs is absent or holds no data (a configuration error: exit 2, its own code)."""


@dataclass(frozen=True)
class Container:
    """Where this process runs, from the SageMaker container's variables (defaults: one local host)."""

    hosts: tuple[str, ...]
    current_host: str
    num_gpus: int


def container(env: typing.Mapping[str, str]) -> Container:
    try:
        hosts = tuple(json.loads(env.get(sm.ENV_HOSTS, '["localhost"]')))
        num_gpus = int(env.get(sm.ENV_NUM_GPUS, "0") or 0)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{sm.ENV_HOSTS} / {sm.ENV_NUM_GPUS} are malformed ({e}): they are set by the SageMaker "
                          "container") from None
    current = env.get(sm.ENV_CURRENT_HOST, hosts[0] if hosts else "localhost")
    return Container(hosts=hosts, current_host=current, num_gpus=num_gpus)


def stop_file_path(env: typing.Mapping[str, str]) -> Path | None:
    """The file whose appearance means "stop": where the variable puts it (`trainctl local`, tests), else
    the container entry's in a SageMaker container (the toolkit sets SM_HOSTS), else none: a plain process
    on a workstation stops on its own signals only and never reads a stray file in /tmp."""
    if env.get(sm.ENV_STOP_FILE):
        return Path(env[sm.ENV_STOP_FILE])
    return Path(sm.STOP_FILE) if sm.ENV_HOSTS in env else None


def checkpoint_folder_fix(folder: str, env: typing.Mapping[str, str] | None = None) -> str:
    """How the one who started this job points it at another checkpoint `folder` (e.g. "an empty folder"): under
    trainctl local, another --workdir; on SageMaker the folder is the run's own (its S3 prefix, the platform's):
    a new run; a plain process on a workstation, the checkpoint_dir hyperparameter."""
    env = os.environ if env is None else env
    if workdir := env.get(sm.ENV_LOCAL_WORKDIR):
        return (f"run trainctl local with another --workdir for {folder} (this one keeps its checkpoints in "
                f"{workdir}/checkpoints)")
    if sm.ENV_HOSTS in env:
        return (f"the checkpoint folder is the run's own (its S3 prefix): for {folder}, submit the request as a new "
                "run (trainctl submit)")
    return f"point checkpoint_dir at {folder}"


def path_defaults(env: typing.Mapping[str, str]) -> dict[str, str]:
    """The path hyperparameters as the container sets them; a channel that is absent is left out."""
    paths = {
        "checkpoint_dir": env.get(sm.ENV_CHECKPOINT_DIR, sm.CHECKPOINT_DIR),
        "model_dir": env.get(sm.ENV_MODEL_DIR, sm.MODEL_DIR),
        "output_data_dir": env.get(sm.ENV_OUTPUT_DATA_DIR, sm.OUTPUT_DATA_DIR),
        "train_dir": env.get(sm.channel_variable(sm.TRAIN_CHANNEL), ""),
        "validation_dir": env.get(sm.channel_variable(sm.VALIDATION_CHANNEL), ""),
    }
    return {name: value for name, value in paths.items() if value}


def data_mode(cfg: TrainConfig) -> str:
    """`synthetic` or `channels`: a channel that holds a file named `synthetic` asks for generated data."""
    variable = sm.channel_variable(sm.TRAIN_CHANNEL)
    if cfg.data == "channels" and not cfg.train_dir:
        raise DataMissing(f"data=channels but there is no train channel ({variable}): "
                          f"add a '{sm.TRAIN_CHANNEL}' input channel")
    if cfg.data != "auto":
        return cfg.data
    if not cfg.train_dir:
        raise DataMissing(
            f"no train channel ({variable} is not set): add a '{sm.TRAIN_CHANNEL}' input channel, "
            "or set the hyperparameter data=synthetic for a smoke test"
        )
    if (Path(cfg.train_dir) / SYNTHETIC_MARKER).exists():
        return "synthetic"
    return "channels"


def status_path(cfg: TrainConfig) -> Path:
    return Path(cfg.output_data_dir) / sm.STATUS_FILE


def failure_path(env: typing.Mapping[str, str] | None = None) -> Path:
    """Where the one failure line goes: contract.container.FAILURE_FILE in the container, where
    SM_OUTPUT_DATA_DIR is /opt/ml/output/data; beside the output data dir wherever that is moved
    (`trainctl local`'s workdir/output, a test's folder)."""
    env = os.environ if env is None else env
    data_dir = env.get(sm.ENV_OUTPUT_DATA_DIR)
    if not data_dir:
        return Path(sm.FAILURE_FILE)
    return Path(data_dir).parent / Path(sm.FAILURE_FILE).name


def write_failure(line: str, path: Path | None = None) -> Path | None:
    """Write the failure line once per host: the first rank's line stands (the others usually repeat it,
    or fail later because of it). Never raises: the exit code still tells SageMaker the job failed."""
    path = path or failure_path()
    try:
        if path != Path(sm.FAILURE_FILE):  # /opt/ml/output exists in the container; never made elsewhere
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return None
    with os.fdopen(fd, "w") as f:
        f.write(line + "\n")
    return path
