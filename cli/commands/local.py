"""`trainctl local`: render a request for this machine and hand it to the container emulator (cli/container_emulator.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape

from cli.console import out
from cli.errors import UserError
from cli.platform_source import local_platform
from cli.request_file import LoadedRequest, load_request, validate_for_platform
from contract.container import (
    CHECKPOINT_MARKER,
    ENV_MLFLOW_TRACKING_URI,
    ENV_REQUEST,
    MLFLOW_LOCAL,
    MLFLOW_LOCAL_FORM,
    STATUS_FILE,
)
from contract.errors import ConfigError
from contract.hyperparameters import (
    TrainConfig,
    batch_layout,
    canonical_hyperparameters,
    decode_hyperparameters,
)

# Where `trainctl local` keeps a request's run when no --workdir is given; running again resumes it.
DEFAULT_WORKDIR_ROOT = Path(".trainctl") / "local"
# trainctl local's exit status when the run stopped before its last step (Ctrl-C, SIGTERM): not a success a script
# should go on from (`trainctl local r.json && next` stops there), nor a failure (run again to resume). 0: completed.
EXIT_STOPPED = 3


def data_channels(data: Path | None) -> dict[str, Path] | None:
    """--data DIR: DIR/train and DIR/validation when DIR has a train folder, else DIR itself as train."""
    if data is None:
        return None
    if data.exists() and not data.is_dir():
        raise UserError(f"--data {data}: is a file; --data takes a folder (the dataset's shards and meta.json, or "
                        "its train and validation folders)", f"pass the folder that holds it: --data {data.parent}")
    if not data.is_dir():
        raise UserError(f"--data {data}: no such directory",
                        "create it (python -m prepare.corpus --out DIR), or pass an existing folder")
    if (data / "train").is_dir():
        channels = {"train": data / "train"}
        if (data / "validation").is_dir():
            channels["validation"] = data / "validation"
        return channels
    return {"train": data}


def request_channels(create: dict[str, Any]) -> dict[str, Path] | None:
    """The channels of a request whose datasets are local folders (rendered as file:// URIs)."""
    channels = {}
    for channel in create.get("InputDataConfig") or []:
        uri = channel["DataSource"].get("S3DataSource", {}).get("S3Uri", "")
        if uri.startswith("file://"):
            channels[channel["ChannelName"]] = Path(uri.removeprefix("file://")).expanduser()
    return channels or None


def with_local_data(loaded: LoadedRequest, channels: dict[str, Path] | None) -> LoadedRequest:
    """--data's folders in place of the request's datasets, before the request is checked: a dataset this machine
    cannot read (fsx:, or s3:// through FSx) must not refuse a run that reads the local copy instead."""
    if not channels:
        return loaded
    changes: dict[str, Any] = {"dataset": channels["train"].resolve().as_uri(), "input_mode": None}
    # The request's validation set belongs to its own dataset: with another one (another tokenizer, another corpus)
    # its loss would mean nothing. --data's validation folder, or none.
    changes["validation_dataset"] = channels["validation"].resolve().as_uri() if "validation" in channels else None
    return dataclasses.replace(loaded, request=dataclasses.replace(loaded.request, **changes))


def render_for_local(loaded: LoadedRequest) -> dict[str, Any]:
    """The CreateTrainingJob request SageMaker would get, rendered against this machine's placeholder settings."""
    from cli.views.plan import PLAN_NONCE, plan_run_id
    from jobs.render.training_job import render_create_training_job

    request = loaded.request
    settings = local_platform(request.framework_version)
    validate_for_platform(loaded, settings)
    # A run id stable per request name, not a random one: the container gets it as TRAINING_RUN_ID, and the
    # training package resumes only checkpoints its own run wrote, so a second `trainctl local` must resume.
    return render_create_training_job(request, settings, run_id=plan_run_id(request.name), attempt=1,
                                      name_nonce=PLAN_NONCE)


def run_request_locally(loaded: LoadedRequest, *, workdir: Path | None, nproc: int | None, data: Path | None,
                        hosts: int = 1, run_local: Callable[..., int] | None = None, **emulation: Any) -> int:
    """Render, then run as `hosts` instances of `nproc` processes. `run_local` defaults to
    cli.container_emulator.run_local (imported here, not at the top: it brings torch, which the other commands do
    not need); `emulation` goes to it as it is (a test's checkpoint-sync settings)."""
    given = data_channels(data)
    if given and "validation" not in given and loaded.request.validation_dataset:
        out().print(escape(f"[local] --data {data} has no validation/ folder: this run validates on nothing (the "
                           f"request's validation_dataset belongs to its own data); add {data}/train and "
                           f"{data}/validation to have one"))
    create = render_for_local(with_local_data(loaded, given))
    values = canonical_hyperparameters(decode_hyperparameters(create.get("HyperParameters") or {}))
    if values.get("strategy") == "single":
        if nproc is not None and nproc > 1:
            raise UserError(f"--nproc {nproc} with strategy 'single': that strategy runs one process",
                            "drop --nproc, or set the request's strategy to ddp or fsdp")
        if hosts > 1:
            raise UserError(f"--hosts {hosts} with strategy 'single': that strategy runs one process on one "
                            "instance", "drop --hosts, or set the request's strategy to ddp or fsdp")
        processes = 1
    else:
        from cli.container_emulator import default_nproc

        processes = nproc or default_nproc()
    _check_parallelism(loaded, values, processes, hosts)
    _check_batch(values, processes * hosts)
    channels = given or request_channels(create)
    for name, path in (channels or {}).items():
        if not path.is_dir():
            raise UserError(f"the {name} data folder {path} does not exist",
                            "create it (python -m prepare.corpus --out DIR), or pass --data DIR")
        _check_channel(name, path)
    from cli.container_emulator import LocalRunError

    if run_local is None:
        from cli.container_emulator import run_local
    workdir = workdir or DEFAULT_WORKDIR_ROOT / loaded.request.name
    _check_workdir(workdir)
    try:
        return run_local(create, workdir=workdir, nproc=nproc, hosts=hosts, data_dirs=channels, **emulation)
    except LocalRunError as exc:  # e.g. a channel on S3 or FSx with no local folder given
        raise UserError(str(exc), "pass --data DIR with the dataset's local copy") from None


def _check_channel(name: str, path: Path) -> None:
    """A channel folder without its meta.json, or without the files its format holds samples in, refused before any
    process starts (the job would say it after its start-up, naming the work folder's link), with the preparer its
    files call for."""
    from contract.data_formats import SHARD_GLOBS, how_to_prepare

    where = f"{path} (relative to the current folder, {Path.cwd()})" if not path.is_absolute() else str(path)
    meta = path / "meta.json"
    if not meta.is_file():
        raise UserError(f"the {name} data folder {where} is not a channel: it has no meta.json", how_to_prepare(path))
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a malformed meta.json: the job's reader says why
        shards = SHARD_GLOBS.get(json.loads(meta.read_text()).get("format"))
        if shards and not any(path.glob(shards)):
            raise UserError(f"the {name} data folder {where} has a meta.json but no {shards} files: an empty split",
                            "write it again with its preparer (python -m prepare.corpus, prepare.text or "
                            "prepare.images), from more data")


def _check_parallelism(loaded: LoadedRequest, values: dict[str, Any], processes: int, hosts: int) -> None:
    """The degrees the job will run, against this machine's processes, before any process starts. They are read
    from the rendered hyperparameters: for `strategy: auto` that is the planner's pick, sized for the request's
    instances rather than for this machine, so checking the request's own `parallel` section would miss it."""
    from contract.parallel import MODEL_PARALLEL
    from jobs.request.parallelism import rendered_problems

    if values.get("strategy") not in MODEL_PARALLEL:
        return
    request = loaded.request
    problems = rendered_problems(values, request.model, request.model_size, hosts=hosts, per_host=processes)
    if not problems:
        return
    if request.strategy.value == "auto":
        raise _auto_degrees_error(request, values, processes, problems)
    raise UserError("; ".join(str(p) for p in problems),
                    f"pass --nproc (and --hosts) with process counts the degrees divide, or change {problems[0].path}")


def _check_batch(values: dict[str, Any], processes: int) -> None:
    """The batch sizes against this machine's processes, by the arithmetic the training package refuses them
    with at startup (contract.hyperparameters.batch_layout): the launcher checks the cloud cluster the same way."""
    from contract.parallel import LAYER_SPLITTING, batch_ranks

    grouped = values.get("micro_batch_per_group") is True and values.get("strategy") in LAYER_SPLITTING
    readers = batch_ranks(processes, values.get("tp_degree", 1), values.get("pp_degree", 1), grouped)
    try:
        batch_layout(readers, values.get("micro_batch_size", TrainConfig.micro_batch_size),
                     values.get("global_batch_size"), values.get("grad_accum"))
    except ConfigError as exc:
        raise UserError(f"on {processes} local processes, {exc}",
                        "pass --nproc with a process count that fits, or change hyperparameters.global_batch_size "
                        "or micro_batch_size") from None


def _auto_degrees_error(request: Any, values: dict[str, Any], processes: int, problems: list) -> UserError:
    """`strategy: auto` whose pick cannot run here: say what was picked, for which cluster, and what would run."""
    tensor, pipeline, shard = values.get("tp_degree", 1), values.get("pp_degree", 1), values.get("dp_shard", 0)
    cluster = f"{request.instance.count} x {request.instance.type}" if request.instance else "the instance groups"
    picked = (f"strategy 'auto' resolves to {values['strategy']} (tp_degree {tensor}, pp_degree {pipeline}, "
              f"dp_shard {shard}), the planner's pick for {cluster}")
    # tensor x pipeline x shard processes satisfy every world-size rule of jobs.request.parallelism.check_parallelism.
    needed = tensor * pipeline * max(shard, 1)
    return UserError(f"{picked}; it cannot run on {processes} local processes: "
                     + "; ".join(p.message for p in problems),
                     f"pass --nproc {needed}, or for this machine set strategy (e.g. fsdp) and `parallel` yourself")


def _check_workdir(workdir: Path) -> None:
    """The workdir and the folders the run writes must be folders (a rerun resumes from checkpoints/)."""
    for path in (workdir, workdir / "checkpoints"):
        if path.exists() and not path.is_dir():
            raise UserError(f"--workdir {workdir}: {path} is a file, not a folder",
                            "pass another --workdir, or remove the file")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--workdir {workdir}: cannot create it ({exc.strerror})", "pass another --workdir") from None
    try:  # an existing folder the run cannot write in (a read-only mount, a system folder such as /sys/kernel)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as exc:
        raise UserError(f"--workdir {workdir}: cannot write in it ({exc.strerror or exc})",
                        f"pass another --workdir, a folder you can write (the default is {DEFAULT_WORKDIR_ROOT}/"
                        "<request name>)") from None
    checkpoints = workdir / "checkpoints"
    if checkpoints.is_dir() and not os.access(checkpoints, os.R_OK | os.X_OK):
        raise UserError(f"the checkpoint folder {checkpoints} cannot be read",
                        "fix its permissions, or pass another --workdir")


def check_nproc(nproc: int | None, *, oversubscribe: bool, hosts: int = 1) -> None:
    """--nproc (times --hosts: every emulated instance runs here) above this machine's GPUs (or CPUs) is refused
    unless --oversubscribe says it is meant: each worker holds the model, its optimizer state and a data loader, so
    --nproc 1000 started some 200 workers and took 14 GB before anything failed."""
    if oversubscribe or (nproc is None and hosts == 1):
        return
    from cli.container_emulator import default_nproc, process_limit

    limit, what = process_limit()
    total = (nproc or default_nproc()) * hosts
    if total > limit:
        asked = f"--nproc {nproc or default_nproc()} x --hosts {hosts} = {total} processes" if hosts > 1 \
            else f"--nproc {total}"
        raise UserError(f"{asked}: this machine has {limit} {what}; more processes than {what} share them, "
                        "each with its own copy of the model and optimizer state (memory grows with every one)",
                        f"pass --nproc {limit // hosts or 1} or fewer{' per host' if hosts > 1 else ''}, or add "
                        f"--oversubscribe to start {total} anyway")


# What the training package needs on this machine: the `[train]` extra, which a `[cli]` install goes without.
TRAINING_MODULES = ("torch", "numpy", "safetensors")
TRAIN_INSTALL = "pip install 'sagemaker-training-platform[train]' (in a checkout: make setup)"


def check_training_modules() -> None:
    """Refuse to start without the training package's dependencies: the workers' ModuleNotFoundError came as
    torchrun's traceback, after the work folder was laid out."""
    missing = [name for name in TRAINING_MODULES if not _importable(name)]
    if missing:
        raise UserError(f"trainctl local runs the training package on this machine, and it needs {', '.join(missing)}, "
                        f"which this Python ({sys.executable}) does not have", TRAIN_INSTALL)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install, or a module blocked by an import hook
        return False


def run_local_command(request: Path, *, nproc: int | None, workdir: Path | None, data: Path | None,
                      oversubscribe: bool = False, hosts: int = 1, mlflow: str | None = None) -> int:
    """`trainctl local`: run the request here, print how it ended; returns the run's exit status. `mlflow`: the
    tracking server the run logs to (else $MLFLOW_TRACKING_URI, which the job's environment inherits)."""
    check_training_modules()
    check_nproc(nproc, oversubscribe=oversubscribe, hosts=hosts)
    loaded = load_request(request)
    workdir = workdir or DEFAULT_WORKDIR_ROOT / loaded.request.name
    started = time.time()
    tracking = mlflow_environment(mlflow, loaded.request)
    code = run_request_locally(loaded, workdir=workdir, nproc=nproc, data=data, hosts=hosts,
                               **({"extra_env": tracking} if tracking else {}))
    out().print(local_outcome(code, workdir, since=started, hosts=hosts))
    return EXIT_STOPPED if code == 0 and _ended(workdir, started, hosts).get("status") == "stopped" else code


def mlflow_environment(uri: str | None, request) -> dict[str, str]:
    """The job's MLflow variables for `--mlflow URI` (or an inherited $MLFLOW_TRACKING_URI): the server and the
    request's fields for the run's parameters, as the launcher renders them; {} without a server. A URI MLflow cannot
    take is refused here, before any process starts."""
    from jobs.render.training_job import request_params

    if uri is None:
        return {ENV_REQUEST: request_params(request)} if os.environ.get(ENV_MLFLOW_TRACKING_URI) else {}
    if not MLFLOW_LOCAL.fullmatch(uri):
        raise UserError(f"--mlflow {uri!r} is not a tracking server MLflow can log to",
                        f"give {MLFLOW_LOCAL_FORM} (e.g. http://127.0.0.1:5000 for `mlflow server`)")
    return {ENV_MLFLOW_TRACKING_URI: uri, ENV_REQUEST: request_params(request)}


def _killed_by(code: int) -> str | None:
    """The signal a status of 128 + N stands for (cli.container_emulator reports a killed worker so), or None."""
    try:
        return signal.Signals(code - 128).name if code > 128 else None
    except ValueError:
        return None


def _why(signal_name: str) -> str:
    if signal_name == "SIGKILL":  # what nothing but the kernel (or a second Ctrl-C) sends a training worker
        return ("; SIGKILL usually means this machine ran out of memory (the kernel's OOM killer): pass a smaller "
                "--nproc, or lower micro_batch_size or seq_len")
    return ""


def _ended(workdir: Path, since: float, hosts: int) -> dict:
    """The status file the training loop wrote in this run (since `since`), or {}."""
    from cli.container_emulator import instance_root

    path = instance_root(workdir, hosts) / "output" / "data" / STATUS_FILE
    with contextlib.suppress(OSError, json.JSONDecodeError):
        if path.stat().st_mtime >= since:
            return json.loads(path.read_text())
    return {}


def local_outcome(code: int, workdir: Path, *, since: float, hosts: int = 1) -> str:
    """One line on how a local run ended, from the status file the training loop writes (this run's only)."""
    from cli.container_emulator import KILLED_ON_SECOND_SIGNAL, checkpoint_store, instance_root

    status = _ended(workdir, since, hosts)
    root = instance_root(workdir, hosts)
    checkpoints = checkpoint_store(workdir, hosts)
    if code == KILLED_ON_SECOND_SIGNAL:
        return (f"[red]killed at your second interrupt[/], without the stop's checkpoint; a rerun with --workdir "
                f"{workdir} resumes from the newest complete one in {checkpoints}, if any")
    if code != 0:
        logs = root / "output" / "logs" if root == workdir else workdir / "algo-*" / "output" / "logs"
        if signal_name := _killed_by(code):
            return (f"[red]a process of the run was killed by {signal_name}[/] (status {code}){_why(signal_name)}; "
                    f"worker logs: {logs}")
        return f"[red]the run exited with status {code}[/]; worker logs: {logs}"
    if status.get("status") == "stopped" and not any(checkpoints.glob(f"step-*/{CHECKPOINT_MARKER}")):
        # Stopped before its first checkpoint was written (Ctrl-C just after the start): nothing to resume from.
        return (f"stopped at step {status.get('step')}, before any checkpoint was written: nothing to resume; run "
                "again to start over")
    if status.get("status") == "stopped":
        return (f"stopped at step {status.get('step')} with a checkpoint in {checkpoints}; "
                f"run again with --workdir {workdir} to resume")
    return (f"done at step {status.get('step', '?')}: model in {root / 'model'}, metrics in "
            f"{root / 'output' / 'data'}")
