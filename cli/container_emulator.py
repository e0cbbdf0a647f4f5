"""Run a rendered CreateTrainingJob request on this machine, the way SageMaker's PyTorch container would.

`run_local` lays out a SageMaker-like tree under the workdir, unpacks the same sourcedir.tar.gz that
the platform ships into `code/`, decodes the hyperparameters as the in-container toolkit does, sets the
SM_* environment, and starts `torchrun` (gloo on CPU, NCCL when there are GPUs):

    workdir/
      code/                       sourcedir.tar.gz unpacked (train.py + training/)
      input/config/               hyperparameters.json, resourceconfig.json, inputdataconfig.json
      input/data/<channel>        a link to the local folder of each channel
      model/                      SM_MODEL_DIR: model.safetensors + config.json at the end
      checkpoints/                the checkpoint dir (SageMaker's /opt/ml/checkpoints)
      output/data/                SM_OUTPUT_DATA_DIR: metrics.jsonl, training_status.json
      output/logs/                each worker's stdout and stderr (torchrun --log-dir; when not in a terminal)

Running it again with the same workdir resumes from the checkpoints there. The first SIGINT/SIGTERM
creates the stop file (`stop` in the workdir, contract.container.ENV_STOP_FILE), as the platform's
container entry does on SageMaker's SIGTERM: every worker sees it at its next step, they checkpoint and
exit 0, then torchrun exits 0. torchrun itself is never signalled (it runs in a session of its own, so
Ctrl-C does not reach it): it would give its workers a fixed 30 s before torch 2.12, then kill them
mid-save. A second signal kills the run. A failure the training package knows (a line in output/failure,
contract.failures) is printed as that one line and the run exits 2; torchrun's own ChildFailedError
traceback is not shown.

`hosts` > 1 runs the request as that many instances, the way SageMaker runs a multi-instance job: each instance
(`algo-1`, `algo-2`, ...) has its own tree, `workdir/<host>/`, laid out as above, with `SM_HOSTS`,
`SM_CURRENT_HOST` and `resourceconfig.json` as SageMaker writes them, and its own torchrun started the way the
toolkit starts it on a multi-node job (`--nnodes N --node_rank <its index in SM_HOSTS>`, rendezvous over loopback);
ranks of one instance share its folders and only those; a signal stops every instance (each its own stop file).
Its checkpoint folder syncs to the run's emulated S3 prefix, `workdir/s3/checkpoints/`, as CheckpointConfig does
(cli/checkpoint_sync.py): downloaded whole before its processes start, uploaded with a lag while they run, a last
upload when they end. That prefix, not an instance's folder, carries a run from one invocation to the next, as S3
carries it from one job to the next: a later run on the folder, on any number of instances (one too), starts from it.
This module imports nothing of `jobs`: it takes the rendered dict.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundles.sourcedir import build_archive_bytes
from cli.checkpoint_sync import CheckpointSync, SyncSettings
from contract.container import (
    ENV_CHECKPOINT_DIR,
    ENV_EPOCH,
    ENV_LOCAL_WORKDIR,
    ENV_METRICS_NAMESPACE,
    ENV_STOP_FILE,
    ENV_TENSORBOARD_DIR,
    FAILURE_FILE,
    channel_variable,
    fence_claim,
)
from contract.failures import parse_failure_line
from contract.hyperparameters import decode_hyperparameters

# run_local's status when the user's second Ctrl-C (or SIGTERM) killed the run: a shell's for an interrupt, so that
# trainctl never reads the SIGKILL it sent as the kernel's out-of-memory killer.
KILLED_ON_SECOND_SIGNAL = 128 + signal.SIGINT

# torchrun, minus the traceback it prints when a worker fails (the worker's own error is what to read). A worker
# killed by a signal exits it as a shell reports one, 128 + the signal, so that trainctl can name the signal
# (torchrun's own status is 1 for every failure: an out-of-memory SIGKILL read as an error exit).
_TORCHRUN = """import sys
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import main
try:
    main()
except ChildFailedError as exc:
    exitcode = exc.get_first_failure()[1].exitcode
    sys.exit(128 - exitcode if exitcode < 0 else 1)
"""

HOST = "algo-1"
S3_CHECKPOINTS = Path("s3") / "checkpoints"  # a multi-instance run's emulated CheckpointConfig.S3Uri, in the workdir


@dataclass(frozen=True)
class Instance:
    """One emulated instance of a job: its name, the job's instances (SM_HOSTS), and the rendezvous port."""

    name: str = HOST
    hosts: tuple[str, ...] = (HOST,)
    port: int = 0  # the master's port (the toolkit's 7777 on SageMaker); 0 picks a free one

    @property
    def node_rank(self) -> int:
        return self.hosts.index(self.name)


def host_names(count: int) -> tuple[str, ...]:
    """SageMaker's instance names: algo-1, algo-2, ..."""
    return tuple(f"algo-{i + 1}" for i in range(count))


class LocalRunError(ValueError):
    """A request this machine cannot run as given; the message names the field and the fix."""


def script_args(hyperparameters: dict[str, Any]) -> list[str]:
    """`--key value` for every non-`sagemaker_*` key, as sagemaker-training's `mapping.to_cmd_args`:
    keys sorted, dicts as `k=v,k=v` (sorted), None as an empty string, anything else through str()."""
    args = []
    for key in sorted(k for k in hyperparameters if not k.startswith("sagemaker_")):
        value = hyperparameters[key]
        if hasattr(value, "items"):
            value = ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        args += [f"--{key}" if len(key) > 1 else f"-{key}", "" if value is None else str(value)]
    return args


def default_nproc() -> int:
    """Processes per run when --nproc is not given: one per GPU, else one."""
    return _gpu_count() or 1


def process_limit() -> tuple[int, str]:
    """The most processes `trainctl local` starts unless told to oversubscribe, and what bounds it: one per GPU
    (NCCL gives each rank its own), else one per CPU this process may run on."""
    gpus = _gpu_count()
    if gpus:
        return gpus, "GPUs"
    try:
        return len(os.sched_getaffinity(0)), "CPUs"
    except AttributeError:  # macOS has no affinity
        return os.cpu_count() or 1, "CPUs"


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link_channels(request: dict, data_dirs: dict[str, Path], data_root: Path) -> dict[str, Path]:
    channels: dict[str, Path] = {}
    for channel in request.get("InputDataConfig") or []:
        name = channel["ChannelName"]
        source = channel.get("DataSource", {})
        uri = source.get("S3DataSource", {}).get("S3Uri", "")
        if name in data_dirs:
            channels[name] = Path(data_dirs[name])
        elif uri.startswith("file://"):
            channels[name] = Path(uri.removeprefix("file://")).expanduser()
        elif name == "code":  # the network-isolation code channel: the source dir is unpacked locally
            continue
        else:
            where = uri or source.get("FileSystemDataSource", {}).get("DirectoryPath", "?")
            raise LocalRunError(f"InputDataConfig channel '{name}' reads {where}, which this machine cannot "
                                f"mount: pass a local folder for it (data_dirs['{name}'] / --data DIR)")
    for name, path in data_dirs.items():
        channels.setdefault(name, Path(path))
    data_root.mkdir(parents=True, exist_ok=True)
    for name, path in channels.items():
        if not path.is_dir():
            raise LocalRunError(f"the '{name}' channel folder {path} does not exist: create it "
                                "(python -m prepare.corpus --out DIR) or point the channel elsewhere")
        link = data_root / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(path.resolve(), target_is_directory=True)
    return {name: data_root / name for name in channels}


def _unpack_code(code_dir: Path) -> None:
    if code_dir.exists():
        import shutil

        shutil.rmtree(code_dir)
    code_dir.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(build_archive_bytes()), mode="r:gz") as tar:
        tar.extractall(code_dir, filter="data")


def prepare_layout(request: dict, workdir: Path, nproc: int, data_dirs: dict[str, Path] | None,
                   extra_env: dict | None, instance: Instance | None = None) -> tuple[list[str], dict[str, str], Path]:
    """One instance's SageMaker-like tree, command line and environment; no process is started."""
    instance = instance or Instance()
    workdir = Path(workdir).resolve()
    config_dir = workdir / "input" / "config"
    model_dir, output_dir, ckpt_dir = workdir / "model", workdir / "output", workdir / "checkpoints"
    for d in (config_dir, model_dir, output_dir / "data", ckpt_dir):
        d.mkdir(parents=True, exist_ok=True)
    channels = _link_channels(request, dict(data_dirs or {}), workdir / "input" / "data")
    _unpack_code(workdir / "code")

    encoded = request.get("HyperParameters") or {}
    hps = decode_hyperparameters(encoded)
    program = hps.get("sagemaker_program", "train.py")
    if not (workdir / "code" / program).exists():
        raise LocalRunError(f"HyperParameters.sagemaker_program is {program!r}, which the source dir does not "
                            "hold: the platform's entry script is train.py")
    resource = {"current_host": instance.name, "hosts": list(instance.hosts),
                "current_group_name": "homogeneousCluster",
                "current_instance_type": request.get("ResourceConfig", {}).get("InstanceType", "local"),
                "network_interface_name": "lo"}
    (config_dir / "hyperparameters.json").write_text(json.dumps(encoded, indent=1))
    (config_dir / "resourceconfig.json").write_text(json.dumps(resource, indent=1))
    (config_dir / "inputdataconfig.json").write_text(json.dumps(
        {c["ChannelName"]: {"TrainingInputMode": c.get("InputMode", "File")} for c in request.get("InputDataConfig") or []},
        indent=1))

    gpus = _gpu_count()
    user_hps = {k: v for k, v in hps.items() if not k.startswith("sagemaker_")}
    env = {**os.environ, **{str(k): str(v) for k, v in (request.get("Environment") or {}).items()}}
    # A local run sends nothing to the team's CloudWatch namespace the renderer names: it has no job role, and its
    # figures would mix with the team's real jobs' (its metrics stay in the work folder's metrics.jsonl).
    env.pop(ENV_METRICS_NAMESPACE, None)
    env[ENV_LOCAL_WORKDIR] = str(workdir)  # the job's fixes name --workdir, the knob a local user has
    if env.get(ENV_TENSORBOARD_DIR):  # the request's tensorboard on: the event files in the work folder
        env[ENV_TENSORBOARD_DIR] = str(output_dir / "tensorboard")
    env.update({
        "SM_MODEL_DIR": str(model_dir),
        "SM_OUTPUT_DIR": str(output_dir),
        "SM_OUTPUT_DATA_DIR": str(output_dir / "data"),
        "SM_INPUT_DIR": str(workdir / "input"),
        "SM_INPUT_CONFIG_DIR": str(config_dir),
        "SM_MODULE_DIR": str(workdir / "code"),
        "SM_HOSTS": json.dumps(list(instance.hosts)),
        "SM_CURRENT_HOST": instance.name,
        "SM_CURRENT_INSTANCE_TYPE": resource["current_instance_type"],
        "SM_NUM_GPUS": str(gpus),
        "SM_NUM_CPUS": str(os.cpu_count() or 1),
        "SM_CHANNELS": json.dumps(sorted(channels)),
        "SM_HPS": json.dumps(user_hps, sort_keys=True),
        "SM_USER_ARGS": json.dumps(script_args(hps)),
        "SM_RESOURCE_CONFIG": json.dumps(resource),
        ENV_CHECKPOINT_DIR: str(ckpt_dir),
        "PYTHONUNBUFFERED": "1",
    })
    for name, path in channels.items():
        env[channel_variable(name)] = str(path)
    for key, value in user_hps.items():
        env[f"SM_HP_{key.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    # The request's own model/factory modules (bring-your-own model) stay importable from where it runs.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir / "code"), os.getcwd(), env.get("PYTHONPATH")) if p)
    env.update({str(k): str(v) for k, v in (extra_env or {}).items()})

    cmd = _launch_command(hps, str(workdir / "code" / program), nproc, output_dir / "logs", instance)
    return cmd + script_args(hps), env, workdir


def _launch_command(hps: dict[str, Any], entry: str, nproc: int, log_dir: Path,
                    instance: Instance | None = None) -> list[str]:
    """The entry script run as the toolkit would: torchrun (on a multi-instance job with the node's rank), or a
    plain process when torchrun is off."""
    if hps.get("sagemaker_torch_distributed_enabled") is False or hps.get("strategy") == "single":
        return [sys.executable, entry]
    instance = instance or Instance()
    cmd = [sys.executable, "-c", _TORCHRUN, "--nnodes", str(len(instance.hosts)), "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(instance.port or _free_port())]
    if len(instance.hosts) > 1:
        cmd += ["--node_rank", str(instance.node_rank)]
    if not sys.stderr.isatty():
        # Not a terminal (CI, a pipe): keep each worker's output under output/logs as well. In a terminal the
        # workers write to it directly, so rank 0 can draw its progress bar.
        cmd += ["--log_dir", str(log_dir), "--tee", "3"]
    return [*cmd, entry]


def per_instance(workdir: Path, hosts: int) -> bool:
    """Whether the work folder holds a tree per instance and the emulated S3 prefix: a run of several instances, or
    any run on a folder where one ran (its checkpoints are in that prefix, as a job's are in S3)."""
    return hosts > 1 or (Path(workdir) / S3_CHECKPOINTS).is_dir()


def instance_root(workdir: Path, hosts: int = 1) -> Path:
    """The tree of the instance whose first rank is rank 0 (the model, the status file, the metrics)."""
    return Path(workdir) / host_names(hosts)[0] if per_instance(workdir, hosts) else Path(workdir)


def checkpoint_store(workdir: Path, hosts: int = 1) -> Path:
    """Where a run's checkpoints outlive it: the emulated S3 prefix, or the one instance's own folder."""
    return Path(workdir) / S3_CHECKPOINTS if per_instance(workdir, hosts) else Path(workdir) / "checkpoints"


def next_epoch(store: Path) -> int:
    """The epoch of a new invocation on the checkpoint folder `store`: one more than the last invocation's, or than
    the epoch that claimed the folder (contract.container.FENCE_FILE), whichever is newer. The count lives beside the
    folder (where a link to it leads: two work folders sharing one checkpoint folder count together) and is taken
    under a lock, so two invocations started at once get two epochs."""
    import fcntl

    folder = Path(store).resolve()
    counter = folder.with_name(folder.name + ".epoch")
    counter.parent.mkdir(parents=True, exist_ok=True)
    with open(counter, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        f.seek(0)
        text = f.read().strip()
        epoch = max(int(text) if text.isdigit() else 0, fence_claim(folder) or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(f"{epoch}\n")
    return epoch


def run_local(create_request: dict, *, workdir: Path, nproc: int | None = None, hosts: int = 1,
              data_dirs: dict[str, Path] | None = None, extra_env: dict | None = None,
              sync: SyncSettings | None = None, host_order: tuple[str, ...] | None = None,
              on_start: Callable[[dict[str, subprocess.Popen]], None] | None = None) -> int:
    """Run the request here as `hosts` instances of `nproc` processes; return the exit code (0 also for a clean
    stop on SIGINT/SIGTERM; 2 with one line on stderr for a failure the training package recognised; 128 + the
    signal when a process was killed by one). `sync`: the emulated checkpoint sync of a multi-instance run;
    `host_order`: SM_HOSTS in another order than algo-1, algo-2, ... (SageMaker gives no order: the first host holds
    rank 0 and the rendezvous); `on_start` sees each instance's process once all have started (a test ends one as a
    lost instance ends)."""
    hps = decode_hyperparameters(create_request.get("HyperParameters") or {})
    distributed = not (hps.get("sagemaker_torch_distributed_enabled") is False or hps.get("strategy") == "single")
    if hosts > 1 and not distributed:
        raise LocalRunError(f"{hosts} instances need torchrun, which strategy {hps.get('strategy')!r} does not use: "
                            "choose ddp, fsdp or a model-parallel strategy, or run one instance")
    nproc = (nproc or default_nproc()) if distributed else 1
    workdir = Path(workdir).resolve()
    # A new attempt of the run, as the launcher's each: an epoch newer than any before on these checkpoints.
    extra_env = {ENV_EPOCH: str(next_epoch(checkpoint_store(workdir, hosts))), **(extra_env or {})}
    names, port, separate = host_order or host_names(hosts), _free_port(), per_instance(workdir, hosts)
    if sorted(names) != sorted(host_names(hosts)):
        raise LocalRunError(f"host_order {list(names)} is not an order of {list(host_names(hosts))}")
    launches: dict[str, tuple[list[str], dict[str, str], Path]] = {}
    for name in names:
        root = workdir / name if separate else workdir
        stop_file = root / "stop"  # each instance's container entry turns its own SIGTERM into its own file
        launches[name] = prepare_layout(create_request, root, nproc, data_dirs,
                                        {ENV_STOP_FILE: str(stop_file), **extra_env},
                                        Instance(name, names, port))
        for stale in (_failure_file(root), stop_file):  # an earlier run's: a failure line is written only if absent
            stale.unlink(missing_ok=True)
    syncs = [CheckpointSync(root / "checkpoints", workdir / S3_CHECKPOINTS, name, sync)
             for name, (_, _, root) in launches.items()] if separate else []
    for each in syncs:  # before any process starts, as SageMaker downloads before the training image runs
        each.download()
    procs = {name: subprocess.Popen(cmd, cwd=root / "code", env=env, start_new_session=True)
             for name, (cmd, env, root) in launches.items()}
    for each in syncs:
        each.start()
    try:
        if on_start is not None:
            on_start(procs)
        stop_files = [root / "stop" for _, _, root in launches.values()]
        codes, killed = _wait_stopping_on_signal(list(procs.values()), lambda: _stopping(stop_files, syncs))
    finally:
        for each in syncs:
            each.finish()
    if killed:  # the user's second signal killed it (not the kernel): a shell's status for an interrupt
        return KILLED_ON_SECOND_SIGNAL
    # A process itself killed (torchrun, or the one process of strategy single): as a shell says.
    codes = [128 - code if code < 0 else code for code in codes]
    code = next((c for c in codes if c != 0), 0)
    lines = [line for _, _, root in launches.values() if parse_failure_line(line := _failure_line(root))]
    if code != 0 and lines:
        for line in dict.fromkeys(lines):  # each instance writes its own; most say the same
            print(f"error: {line}", file=sys.stderr, flush=True)
        return 2
    return code


def _failure_file(root: Path) -> Path:
    return root / "output" / Path(FAILURE_FILE).name


def _failure_line(root: Path) -> str:
    path = _failure_file(root)
    return path.read_text().strip() if path.exists() else ""


def _stopping(stop_files: list[Path], syncs: list[CheckpointSync]) -> None:
    """A stop reaches every instance, as SageMaker's SIGTERM does: each one's stop file, and its sync hears of it."""
    for stop_file in stop_files:
        stop_file.touch()
    for each in syncs:
        each.stopping()


def _wait_stopping_on_signal(procs: list[subprocess.Popen], stop: Callable[[], None]) -> tuple[list[int], bool]:
    """Wait for every process; the first SIGINT/SIGTERM stops the run (`stop`), the second kills it. Returns the
    statuses and whether a second signal killed them."""
    signals: list[int] = []

    def on_signal(signum, frame) -> None:
        signals.append(signum)
        if len(signals) == 1:
            stop()
            print("\n[local] stopping: the workers checkpoint at their next step (signal again to kill)",
                  file=sys.stderr, flush=True)
        else:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    except ValueError:  # not the main thread: the caller owns the signals
        previous = {}
    try:
        return [proc.wait() for proc in procs], len(signals) > 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
