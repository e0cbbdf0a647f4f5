"""The process group and this rank's place in it (the stop flag: training.resilience.stop).

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without them the run is one
process and no process group is created (the `single` strategy on a laptop).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
import time
import typing
import warnings
import weakref
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from contract.container import ENV_NUM_GPUS
from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from training.environment import container
from training.resilience.watchdog import process_group_timeout

# Modules the run imports whose functions take `group.WORLD` as a default argument, which Python evaluates at
# import: imported after the default group exists, they would hold it, and its threads, to the end of the process
# (the abort `teardown` prevents), so they are imported before it (torch 2.8 and 2.13: ShardedGradScaler, which
# training.precision builds on, and the autograd collectives). teardown names a group that still outlives it.
_WORLD_DEFAULT_MODULES = ("torch.distributed.fsdp.sharded_grad_scaler", "torch.distributed.nn")


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    # CPU collectives for control messages (the stop flag, checkpoint file lists): they must not wait on
    # the GPU stream, so on NCCL runs they go through a gloo group.
    control_group: dist.ProcessGroup | None = None
    backend: str = "gloo"

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

    def agree(self, *flags: bool, waited=None) -> tuple[bool, ...]:
        """Each flag true on any rank, in one tiny all-reduce (the loop's per-step control message). `waited` is
        told the seconds this rank waited there (the straggler timing's `waited_at_boundary`)."""
        if not dist.is_initialized():
            return tuple(bool(f) for f in flags)
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        began = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control_group)
        if waited is not None:  # the straggler check's measure: the rank that arrives last waits least here
            waited(time.perf_counter() - began)
        return tuple(bool(v) for v in t.tolist())

    def max_float(self, value: float) -> float:
        return max(self.all_gather_object(float(value)))

    def gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's `values` (the same length on each), in one small all_gather on the control group."""
        t = torch.tensor(values, dtype=torch.float64)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.control_group)
        return [o.tolist() for o in out]


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
    for module in _WORLD_DEFAULT_MODULES:  # before the group exists (see the constant)
        importlib.import_module(module)
    # Not torch's 30 minutes: just above the hang watchdog's longest allowance (training.resilience.watchdog), which fires
    # first with the stacks and the rank that stopped. The control group too (new_group takes torch's default).
    timeout = timedelta(seconds=process_group_timeout(cfg))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world, device_id=device if use_cuda else None,
                                timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    return Dist(rank=rank, world_size=world, local_rank=local_rank, device=device, control_group=control,
                backend=backend)


def default_store():
    """The process group's store (the watchdog's channel while the main thread waits in a collective)."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # a torch without it: the watchdog then judges from this rank alone
        return None


def teardown() -> None:
    """Leave the process group, and end its backends' threads while the interpreter still runs.

    Why the second half: a gloo worker thread lets go of a finished collective's tensors only after the caller
    has its result. When the caller has already dropped such a tensor, freeing it needs the GIL; if the main
    thread has meanwhile begun interpreter finalization (it gets there milliseconds after the last collective),
    CPython ends that thread inside a C++ destructor: "terminate called without an active exception", SIGABRT,
    and torchrun exits 1 for a run that completed. `destroy_process_group` does not stop gloo's threads (gloo's
    shutdown does nothing); a backend's destructor joins them, once the last reference to its group is gone.
    So every reference is dropped here (the caller holds none: training.train calls this once the run's frame is
    gone), and a group that survives is reported (a torch that keeps groups somewhere new: the clean-exit test
    fails on that line)."""
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _world

    groups = [weakref.ref(group) for group in _world.pg_map]  # torch's list of the groups it made
    dist.destroy_process_group()
    _release_groups()
    alive = sum(ref() is not None for ref in groups)
    if alive:
        print(f"[train] warning: {alive} of {len(groups)} process groups outlive teardown (still referenced): "
              "their threads may abort the process at exit", file=sys.stderr, flush=True)


def leave(code: int) -> typing.NoReturn:
    """End the process of an entry script whose run is over and whose outcome is written (the status file, or the
    failure line): the device's queued work finished, the standard streams flushed, then
    `os._exit(code)`, with no process group destroyed and no interpreter finalization.

    Why not `teardown`: destroying a gloo group can deadlock. A gloo worker thread drops a finished collective's
    work object under its queue's mutex; when Python has already let go of that work's tensors, freeing them needs
    the GIL. The group's destructor, called with the GIL held, takes the same mutex: each waits for the other, and
    the process never exits (seen twice on torch 2.13: `~ProcessGroupGloo` against an `AsyncAllgatherWork`), which on
    SageMaker bills until MaxRuntime. No order of calls rules that out while the destructor runs, and nothing is
    left that needs it: every collective of the run returned on every rank (the last one is the export's, or the
    agreement on the failure), and the kernel closes the sockets (their sent data still delivered) and frees the
    device. A CUDA device's queue is drained first, so no peer waits on a collective still queued here."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _release_groups() -> None:
    """Drop what still holds the destroyed groups, so each backend's destructor runs now rather than in the
    interpreter's finalization."""
    # A sharded model, its optimizer and the checkpoint manager hold groups inside reference cycles.
    gc.collect()
    # Device meshes keep the groups they made (`_pg_registry`, in newer torch: 2.13, not 2.8), and DTensor's
    # caches keep meshes past the model: empty the registries of the meshes still alive.
    from torch.distributed.device_mesh import DeviceMesh

    with warnings.catch_warnings():  # isinstance on torch's deprecated module aliases warns
        warnings.simplefilter("ignore", FutureWarning)
        meshes = [o for o in gc.get_objects() if isinstance(o, DeviceMesh)]
    for mesh in meshes:
        registry = getattr(mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
