"""Batches off the critical path: a torch DataLoader whose worker processes read, decode and augment micro-batches
ahead of the step, keyed by the exact-resume sampler.

The loop's GlobalBatchSampler stays the one source of the data position (what a checkpoint stores, global, so a
resume on another world size starts at the same sample). The loader runs a copy of it, taken at the position the
run starts from (after a restore), ahead by the workers' prefetch; the loop advances its own copy as it takes each
step's batches and checks that the two agree, so a checkpoint never records batches that were prefetched but not
trained on. Every key is (epoch, the micro-batch's sample indices) and every worker's output a pure function of
its key (augmentation is seeded per (seed, epoch, sample): training.data.tar_shards), so which worker decoded a batch,
and how far ahead, changes nothing: a stop and resume with workers gives the same weights as a straight run.

Why a plain DataLoader and not torchdata's StatefulDataLoader or MosaicML streaming: both bring their own
position (the loader's, or the stream's) that would have to agree with the sampler's, which already resumes
exactly on any world size; here the loader needs no state at all.

On the device (with workers): batches come back pinned (the DataLoader's pin thread, on CUDA only), and each step
hands out the batches it copied one step ahead: as it returns step N's, it queues step N+1's host-to-device copy
(non_blocking, from pinned memory) on a side CUDA stream, which runs while the GPU computes step N (the pattern of
NVIDIA apex's ImageNet example's data_prefetcher; the default stream would run the copy between the steps'
kernels). Before step N+1 uses them the compute stream waits for the copy, and record_stream tells the caching
allocator that stream uses them. The sampler is advanced only when a step takes its batches, so the prefetched
step is never counted as seen. On the CPU the same order runs with no stream (the copy is the tensor itself).
With data_workers=0 the batch is built on the training thread, as before, and copied when it is taken.

Validation batches (`eval_batches`) go through the same workers and checks, in the fixed order.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from contract.data_formats import auto_workers
from contract.errors import ConfigError
from training.data.sampler import GlobalBatchSampler
from training.data.tar_shards import to_float_images
from training.resilience.stragglers import StepTiming

# Micro-batches each worker keeps ready (DataLoader's prefetch_factor): at least two steps' worth over all workers.
MIN_PREFETCH = 2


def resolve_workers(requested: int | None, dataset) -> int:
    """data_workers: as given, or auto (contract.data_formats.auto_workers, the rule the planner's input check
    assumes): worker processes for formats that decode, none for memory-mapped slices, where a worker's
    inter-process copy costs more than the read. Generated data has no format: no workers."""
    if requested is not None:
        return requested
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_rank = cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return auto_workers(getattr(dataset, "data_format", ""), per_rank)


# Fork where the platform has it (Linux: the container, and tests): a worker starts in milliseconds and shares the
# memory-mapped shards and the sample index copy-on-write, where spawn/forkserver would re-import torch and pickle
# the dataset (a memory-mapped token set pickles as a full copy). Workers touch no CUDA and no process group, so
# the parent's threads (gloo's, the watchdog's) are not needed in them. Under mp.spawn (the tests' ranks) the
# inherited default would be spawn: seconds per worker.
_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


class _MicroBatches(Dataset):
    """A key (epoch, indices) -> the micro-batch's (inputs, targets), built in a worker."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __getitem__(self, key: tuple[int, tuple[int, ...]]):
        epoch, indices = key
        try:
            return ((epoch, *indices), *_read(self.dataset, list(indices), epoch))
        except ConfigError as e:
            # Sent back as a value: the DataLoader would re-raise it wrapped in the worker's traceback text, and a
            # user's data mistake is one line (the failure file's), named by the dataset.
            return (None, e)


def _read(dataset, indices: list[int], epoch: int) -> tuple[torch.Tensor, ...]:
    """A micro-batch as the loader moves it: images as uint8 where the format has them (`raw_batch`), a quarter
    of float32's bytes through the workers' shared memory, the pinned buffer and the host-to-device copy."""
    raw = getattr(dataset, "raw_batch", None)
    return raw(indices, epoch) if raw is not None else dataset.batch(indices, epoch)


def _on_device(batch, device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device, non_blocking=True) for t in batch)


def _as_model_input(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    x, *rest = batch
    if x.dtype == torch.uint8:  # images from `raw_batch`: converted where they are used (the GPU, in a kernel)
        x = to_float_images(x)
    return (x, *rest)


class _Ahead:
    """One step's micro-batches, their keys, and their copy to the device started on the side stream (if any)."""

    def __init__(self, keys: list[list[int]], batches: list[tuple], device: torch.device, stream) -> None:
        self.keys = keys
        if stream is None:
            self.batches = [_on_device(b, device) for b in batches]
            return
        with torch.cuda.stream(stream):
            self.batches = [_on_device(b, device) for b in batches]

    def take(self, stream) -> list[tuple]:
        """The batches, safe to use on the current stream: it waits for their copy first."""
        if stream is not None:
            current = torch.cuda.current_stream(stream.device)
            current.wait_stream(stream)
            for batch in self.batches:
                for t in batch:
                    t.record_stream(current)  # allocated on the side stream, used (and freed) on this one
        return [_as_model_input(b) for b in self.batches]


class _Keys(Sampler):
    """The loader's copy of the sampler, run forever: each global batch's rank slice cut into micro-batch keys."""

    def __init__(self, sampler: GlobalBatchSampler, micro: int) -> None:
        self.sampler, self.micro = sampler, micro

    def __iter__(self):
        while True:
            indices = self.sampler.next_indices()
            for i in range(0, len(indices), self.micro):
                yield self.sampler.epoch, tuple(indices[i : i + self.micro])


def _worker_init(_: int) -> None:
    # One thread per worker: the workers together are the data pipeline's parallelism; torch's intra-op pool
    # in each would oversubscribe the cores the training step uses.
    torch.set_num_threads(1)
    _end_with_the_rank()


# prctl(PR_SET_PDEATHSIG): the kernel signals this process when the thread that forked it ends (Linux only).
_PR_SET_PDEATHSIG = 1


def _end_with_the_rank() -> None:
    """A worker ends when its rank does, however the rank ends: the DataLoader's own check (the parent's pid, every
    5 s) runs only between batches, so a worker stuck in a read or a decode outlived its rank by minutes, and a rank
    that ends with os._exit (training.parallel.process_group.leave) or a SIGKILL runs no shutdown. The rank's main thread
    forks the workers (the first step, each evaluation) and lives as long as the rank."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the DataLoader's own check only
        return
    if os.getppid() != parent:  # the rank ended before the request took hold
        os._exit(0)


class BatchSource:
    """Each step's micro-batches on the device, and how long the loop waited for them (`data_wait_s`)."""

    def __init__(self, dataset, sampler: GlobalBatchSampler, micro: int, device: torch.device, workers: int,
                 timing: StepTiming | None = None) -> None:
        self.timing = timing  # the straggler timing, told each wait (rank-local: what the straggler check compares)
        self.dataset, self.sampler, self.micro, self.device = dataset, sampler, micro, device
        self.workers = workers
        self.data_wait_s = 0.0
        self._loader = None
        self._ahead: _Ahead | None = None
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" and workers else None
        self._per_step = math.ceil(sampler.global_batch // sampler.world_size / micro)

    def _start(self) -> None:
        ahead = GlobalBatchSampler(self.sampler.num_samples, self.sampler.global_batch, self.sampler.rank,
                                   self.sampler.world_size, self.sampler.seed)
        ahead.epoch, ahead.batch = self.sampler.epoch, self.sampler.batch
        self._loader = iter(_loader(self.dataset, _Keys(ahead, self.micro), self.device, self.workers,
                                    max(MIN_PREFETCH, math.ceil(2 * self._per_step / self.workers))))

    def _fetch(self) -> _Ahead:
        """The next step's micro-batches from the workers, their copy to the device started."""
        keys, batches = [], []
        for _ in range(self._per_step):
            key, *batch = next(self._loader)
            if key is None:
                raise batch[0]
            keys.append([int(k) for k in key])
            batches.append(batch)
        return _Ahead(keys, batches, self.device, self._stream)

    def next(self) -> list[tuple]:
        """This rank's share of the next global batch as (inputs, targets) micro-batches on the device."""
        began = time.perf_counter()
        if self.workers and self._loader is None:
            self._start()  # after the restore: the loader's copy starts where this step's indices come from
        indices = self.sampler.next_indices()  # the checkpointed position: advanced only by what is trained on
        epoch = self.sampler.epoch
        chunks = [indices[i : i + self.micro] for i in range(0, len(indices), self.micro)]
        if self.workers == 0:
            batches = [_as_model_input(_on_device(_read(self.dataset, c, epoch), self.device)) for c in chunks]
        else:
            current = self._ahead or self._fetch()
            expected = [[epoch, *chunk] for chunk in chunks]
            if current.keys != expected:  # the two copies of the position never drift apart
                raise RuntimeError(f"the loader delivered epochs and samples {current.keys}, the sampler expected "
                                   f"{expected}")
            batches = current.take(self._stream)
            self._ahead = self._fetch()  # the next step's copy runs while this step computes
        self.data_wait_s = time.perf_counter() - began
        if self.timing is not None:
            self.timing.waited_for_data(self.data_wait_s)
        return batches

    def close(self) -> None:
        """Stop the workers: the last reference to the iterator gone, it shuts them down and joins them."""
        self._loader = self._ahead = None


def _loader(dataset, keys, device: torch.device, workers: int, prefetch: int) -> DataLoader:
    # A generator of its own: an iterator over workers draws its base seed from the generator it is given, else from
    # torch's global one, whose next draws are dropout's. A resumed run makes its iterator after the restore, an
    # uninterrupted one at its first step: a draw from the global generator would put dropout one draw apart. The
    # workers need no seed of their own: every batch is a pure function of its key.
    return DataLoader(_MicroBatches(dataset), sampler=keys, batch_size=None, num_workers=workers,
                      pin_memory=device.type == "cuda", prefetch_factor=prefetch, worker_init_fn=_worker_init,
                      multiprocessing_context=_CONTEXT, generator=torch.Generator())


def eval_batches(dataset, keys: list[tuple[int, list[int]]], device: torch.device, workers: int):
    """(inputs, targets) on the device for each (epoch, sample indices) key, in order: validation's fixed batches,
    read by `workers` processes (the training loader's kind) or, with 0, on this thread."""
    if workers == 0:
        for epoch, indices in keys:
            yield _as_model_input(_on_device(_read(dataset, list(indices), epoch), device))
        return
    keyed = [(epoch, tuple(indices)) for epoch, indices in keys]
    if not keyed:
        return
    loader = _loader(dataset, keyed, device, min(workers, len(keyed)), MIN_PREFETCH)
    for (epoch, indices), (key, *batch) in zip(keyed, loader, strict=True):
        if key is None:
            raise batch[0]
        if [int(k) for k in key] != [epoch, *indices]:
            raise RuntimeError(f"the validation loader delivered {list(key)}, expected {[epoch, *indices]}")
        yield _as_model_input(_on_device(batch, device))
