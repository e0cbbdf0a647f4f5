"""Async checkpoint staging through pinned host memory, reused between saves.

`PinnedStager.save(state, path)` copies the state dict's tensors device->host into page-locked CPU buffers
(allocated on the first save, reused by every later one while shapes do not change), waits for the copy, then
hands the CPU copy to `torch.distributed.checkpoint.async_save`, which writes it from a background thread. The
training loop stalls only for the device->host copy; the disk write overlaps the following steps.

- DTensors (FSDP2): only the local shard is copied; the staged value is a DTensor with the same spec (mesh,
  placements, global shape) around the CPU shard, which is what DCP's planner needs to write a resharding
  checkpoint (the same thing torch's own stagers produce).
- One save in flight: `save` first waits for the previous one (its buffers are about to be overwritten).
- A host-memory budget: a state larger than `budget_bytes` is not staged; it is written synchronously with
  `dcp.save` (returns a completed future) instead of pinning more RAM than the instance can spare.
- Backends. "torch": torch's own pinned, storage-cached stager (`DefaultStager(StagingOptions(...))`, torch >=
  2.9), staging synchronously like ours. "own": the code below, which needs only `torch.empty(pin_memory=True)`,
  a side CUDA stream and DCP's `FileSystemWriter` (torch 2.4 .. 2.8 included), and is the default ("auto"):
  on torch 2.11 + H100 the "torch" backend raised KeyError(<class 'type'>) in StateDictStager on its second
  (cached) save of a CUDA state dict, see bench/checkpoint.py's report.
  CPU-only torch (or no GPU): buffers are plain CPU tensors, i.e. a reused CPU clone.

The package's Checkpointer should keep one PinnedStager per run and call, in place of `dcp.async_save`:
    future = self.stager.save({"model": model_sd, "optim": optim_sd}, str(path), process_group=self._async_group)
and `self.stager.close()` at the end of training (after `wait()`).
"""

from __future__ import annotations

import inspect
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

try:  # torch >= 2.4 (every torch with FSDP2)
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    DTensor = None

try:  # torch >= 2.9: a pinned, storage-cached stager of its own
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
except ImportError:
    DefaultStager = StagingOptions = None

_ASYNC_STAGER_ARG = "async_stager" in inspect.signature(dcp.async_save).parameters


def torch_stager_available() -> bool:
    return DefaultStager is not None and _ASYNC_STAGER_ARG


def state_bytes(state: Any) -> int:
    """Bytes of tensor data this rank would stage (local shards of DTensors)."""
    total = 0
    for t in _leaves(state):
        t = _local(t)
        total += t.numel() * t.element_size()
    return total


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if DTensor is not None and isinstance(t, DTensor) else t


def _leaves(obj: Any):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)


def _can_pin() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        torch.empty(1, pin_memory=True)
        return True
    except RuntimeError:
        return False


class _PrestagedWriter(FileSystemWriter):
    """A FileSystemWriter whose staging step is a no-op: the state dict it gets is already our CPU copy.

    async_save stages through the storage writer when it is an AsyncStager (FileSystemWriter is one since
    torch 2.4); without this it would copy our buffers once more."""

    def stage(self, state_dict):  # noqa: D401
        return state_dict


def _done(value=None) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class PinnedStager:
    def __init__(self, budget_bytes: int | None = None, backend: str = "auto") -> None:
        if backend == "auto":  # torch 2.11's DefaultStager fails on its 2nd (cached) save of CUDA state
            backend = "own"
        if backend == "torch" and not torch_stager_available():
            raise RuntimeError("this torch has no DefaultStager/async_stager: use backend='own'")
        self.backend = backend
        self.budget_bytes = budget_bytes
        self.pinned = _can_pin()
        self._buffers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (cpu buffer, staged value)
        self._stream = None
        self._future: Future | None = None
        self._torch_stager = None
        if backend == "torch":
            self._torch_stager = DefaultStager(StagingOptions(
                use_pinned_memory=self.pinned, use_shared_memory=False, use_async_staging=False,
                use_non_blocking_copy=self.pinned))
        self.last_staged_sync = False  # True when the last save fell back to a synchronous write

    # ---- staging (own backend) ----------------------------------------------------------------------
    def stage(self, state: Any) -> Any:
        """A CPU copy of `state` in reused (pinned when possible) buffers; returns when the copy is complete."""
        on_cuda = self.pinned and any(_local(t).is_cuda for t in _leaves(state))
        if on_cuda:
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())  # the copy sees every pending update
            with torch.cuda.stream(self._stream):
                out = self._copy(state, "")
            self._stream.synchronize()
        else:
            out = self._copy(state, "")
        return out

    def _copy(self, obj: Any, key: str) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._copy_tensor(obj, key)
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{key}/{k}") for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, f"{key}/{i}") for i, v in enumerate(obj))
        return obj  # ints, floats, strings (param_groups' hyperparameters)

    def _copy_tensor(self, t: torch.Tensor, key: str) -> torch.Tensor:
        src = _local(t).detach()
        hit = self._buffers.get(key)
        if hit is None or hit[0].shape != src.shape or hit[0].dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=self.pinned and src.is_cuda)
            staged = buf
            if DTensor is not None and isinstance(t, DTensor):  # a DTensor: the same global metadata around the CPU shard
                staged = DTensor(buf, t._spec, requires_grad=False)
            hit = self._buffers[key] = (buf, staged)
        hit[0].copy_(src, non_blocking=hit[0].is_pinned())
        return hit[1]

    # ---- saving -------------------------------------------------------------------------------------
    def save(self, state: Any, checkpoint_id: str, process_group=None) -> Future:
        """Stage `state` and start writing it; returns the write's future (done at once on the fallback)."""
        self.wait()
        if self.budget_bytes is not None and state_bytes(state) > self.budget_bytes:
            self.last_staged_sync = True
            dcp.save(state, checkpoint_id=checkpoint_id, process_group=process_group)
            return _done()
        self.last_staged_sync = False
        if self.backend == "torch":
            result = dcp.async_save(state, checkpoint_id=checkpoint_id, process_group=process_group,
                                    async_stager=self._torch_stager)
        else:
            staged = self.stage(state)
            result = dcp.async_save(staged, checkpoint_id=checkpoint_id, process_group=process_group,
                                    storage_writer=_PrestagedWriter(checkpoint_id))
        # torch >= 2.9 returns AsyncSaveResponse when staging itself is asynchronous; we stage synchronously.
        self._future = getattr(result, "upload_completion", result)
        return self._future

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk; re-raises its error."""
        if self._future is not None:
            future, self._future = self._future, None
            future.result()

    def close(self) -> None:
        self.wait()
        self._buffers.clear()
        if self._torch_stager is not None:
            self._torch_stager.close()
            self._torch_stager = None
