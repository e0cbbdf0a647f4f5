"""The process group, this rank's place in it, and the stop flag that SIGTERM raises.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without them the run is one
process and no process group is created (the `single` strategy on a laptop).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from datetime import timedelta

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
        if not dist.is_initialized():
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control_group)
        return bool(t.item())


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
    next step boundary (one tiny all-reduce), write a checkpoint and exit 0.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
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
        self.signum = signum

    @property
    def raised(self) -> bool:
        return self.signum is not None
