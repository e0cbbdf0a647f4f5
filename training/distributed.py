"""The process group, this rank's place in it, and the stop flag that SIGTERM raises.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without them the run is one
process and no process group is created (the `single` strategy on a laptop).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from contract.container import ENV_NUM_GPUS
from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from training.environment import container


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    # CPU collectives for control messages (the stop flag, checkpoint file lists): they must not wait on
    # the GPU stream, so on NCCL runs they go through a gloo group.
    control_group: dist.ProcessGroup | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier(group=self.control_group)

    def all_gather_object(self, obj):
        if not dist.is_initialized():
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.control_group)
        return out

    def broadcast_object(self, obj):
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    def mesh(self):
        """A one-dimensional device mesh over every rank (the data-parallel dimension)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.device.type, (self.world_size,))

    def any_true(self, flag: bool) -> bool:
        return self.agree(flag)[0]

    def agree(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag true on any rank, in one tiny all-reduce (the loop's per-step control message)."""
        if not dist.is_initialized():
            return tuple(bool(f) for f in flags)
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control_group)
        return tuple(bool(v) for v in t.tolist())

    def max_float(self, value: float) -> float:
        return max(self.all_gather_object(float(value)))


def setup(cfg: TrainConfig) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    where = container(os.environ)
    if len(where.hosts) > 1 and "WORLD_SIZE" not in os.environ:
        raise ConfigError(
            f"this job has {len(where.hosts)} instances ({', '.join(where.hosts)}) but was started without torchrun: "
            "use strategy ddp, fsdp or smp (the launcher then sets sagemaker_torch_distributed_enabled)"
        )
    if where.num_gpus and not use_cuda:
        raise ConfigError(f"{ENV_NUM_GPUS}={where.num_gpus} but this PyTorch cannot use a GPU: use a GPU training image")
    if cfg.strategy == "single" and world > 1:
        raise ConfigError(f"strategy 'single' runs one process, but {world} were started: use ddp or fsdp")
    if world == 1 and cfg.strategy == "single":
        return Dist(rank=0, world_size=1, local_rank=0, device=device)
    if "MASTER_ADDR" not in os.environ:
        # One process without a launcher: a one-member group so ddp/fsdp code paths still run.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = cfg.backend
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if backend == "smddp":
        try:  # Registers the "smddp" backend; only in SageMaker framework images up to PyTorch 2.2.
            import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401
        except ImportError:
            raise ConfigError(
                "backend 'smddp' needs the SageMaker distributed data parallel library, which only SageMaker's "
                "PyTorch images up to 2.2 ship: use backend=auto (NCCL) instead"
            ) from None
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=timedelta(minutes=30),
                                device_id=device if use_cuda else None)
    control = dist.new_group(backend="gloo") if backend != "gloo" else None
    return Dist(rank=rank, world_size=world, local_rank=local_rank, device=device, control_group=control)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StopFlag:
    """SIGTERM (SageMaker stop, Spot reclaim) and SIGINT (Ctrl-C) set a flag; the loop checks it once per step.

    SageMaker sends SIGKILL 120 s after SIGTERM, so the handler does no work itself: the ranks agree at the
    next step boundary (one tiny all-reduce), write a checkpoint if it fits in the time left, and exit 0.
    The signal reaches the ranks themselves (the supervisor in train.py, or `trainctl local`, sends it to
    each worker), never torchrun, whose own grace (a fixed 30 s before torch 2.12) would cut a long save.
    `raised_at` is when the first signal arrived (wall clock): the checkpoint manager measures the time
    left against it.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.raised_at: float | None = None
        self._previous = {}

    def install(self) -> StopFlag:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        self.raise_(signum)

    def raise_(self, signum: int, at: float | None = None) -> None:
        """Record a stop (a signal, or one caught before this flag existed); the first one's time stands."""
        if self.signum is None:
            self.signum, self.raised_at = signum, time.time() if at is None else at

    @property
    def raised(self) -> bool:
        return self.signum is not None

    def seconds_since(self) -> float:
        return 0.0 if self.raised_at is None else max(0.0, time.time() - self.raised_at)


# ---- the supervisor: torchrun started here, the stop sent to the workers ---------------------------------
# The sagemaker-training toolkit's torchrun port; the supervisor starts torchrun as the toolkit would.
TORCHRUN_MASTER_PORT = 7777
# A worker not yet started when the stop came still gets it: the supervisor looks again this often.
_STOP_RESEND_SECONDS = 0.5


def should_supervise(cfg: TrainConfig, env=None) -> bool:
    """A multi-process strategy started as a plain process (not under torchrun): start torchrun here."""
    env = os.environ if env is None else env
    return cfg.strategy in ("ddp", "fsdp") and "LOCAL_RANK" not in env and "TORCHELASTIC_RUN_ID" not in env


def torchrun_command(entry: str, args: list[str], env=None) -> list[str]:
    """torchrun over this host's GPUs (one process on a CPU host), node rank from SM_HOSTS/SM_CURRENT_HOST:
    the command the toolkit's torch_distributed runner builds."""
    import sys

    where = container(os.environ if env is None else env)
    hosts = list(where.hosts) or ["localhost"]
    node_rank = hosts.index(where.current_host) if where.current_host in hosts else 0
    master = hosts[0] if len(hosts) > 1 else "127.0.0.1"
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(hosts)),
            "--nproc_per_node", str(max(1, where.num_gpus)), "--node_rank", str(node_rank),
            "--master_addr", master, "--master_port", str(TORCHRUN_MASTER_PORT), entry, *args]


def supervise(entry, args: list[str], stop: StopFlag) -> int:
    """Run torchrun in its own session; on a stop, SIGTERM each worker (not torchrun) and wait: the ranks
    save and exit 0, then torchrun exits 0. Returns torchrun's exit code."""
    import subprocess

    proc = subprocess.Popen(torchrun_command(str(entry), args), start_new_session=True)
    signalled: set[int] = set()
    while True:
        try:
            return proc.wait(timeout=_STOP_RESEND_SECONDS)
        except subprocess.TimeoutExpired:
            if stop.raised:
                signal_workers(proc.pid, str(entry), signalled)


def signal_workers(launcher_pid: int, entry: str, already: set[int]) -> None:
    """SIGTERM each worker of a torchrun (its children running `entry`) not signalled yet."""
    for pid in child_pids(launcher_pid):
        if pid in already or entry not in _cmdline(pid):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        already.add(pid)


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid`, from /proc (Linux: the container)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (field 2) may hold spaces and parentheses: the parent pid follows the last ')'.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            children.append(int(stat.parent.name))
    return children


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
