"""Checkpoints: when to write them, and `step-N/` folders of torch.distributed.checkpoint for every strategy.

Layout of `step-N/` (one format whether the run was single, ddp or fsdp):
  .metadata, __R_0.distcp  torch.distributed.checkpoint: every rank writes its part, replicated tensors once
  COMPLETE.json            written last, atomically, with every file's size: a step without it, or whose
                           files do not match it, is skipped on resume (a run killed mid-write, a bad sync)
What the folder holds is `training.state`'s parts. DCP reshards on load, so a checkpoint written by N ranks
resumes on M, and a DDP one resumes into FSDP.

Cadence: every `checkpoint_interval` steps while the run goes on, and once more when it ends (completed,
early-stopped or stopped by a signal) unless that step is already saved. Keeps the newest K complete ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import warnings
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.stateful import Stateful

from contract.hyperparameters import TrainConfig
from training.distributed import Dist

MARKER = "COMPLETE.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# DCP warns that it assumes one process when there is no process group: that is the `single` strategy, on
# purpose. Silenced process-wide (an async save warns from its own thread) and around each call (for
# callers that reset the filters, such as pytest).
_ONE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
warnings.filterwarnings("ignore", message=_ONE_PROCESS_WARNING)


@contextlib.contextmanager
def _quiet_in_one_process():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ONE_PROCESS_WARNING)
        yield


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every `step-N` folder, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def why_invalid(path: Path) -> str | None:
    """None when the step is complete; otherwise the reason it cannot be resumed from."""
    marker = path / MARKER
    if not marker.exists():
        return "no completion marker (interrupted while writing)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable marker ({e})"
    for name, size in files.items():
        f = path / name
        if not f.exists():
            return f"missing {name}"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, the marker says {size}"
    return None


def read_checkpoint(path: str | Path) -> dict:
    """A whole checkpoint as nested dicts, in this one process (inspection and tests; not for resuming)."""
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(path), f"{tmp}/state.pt")
        return torch.load(f"{tmp}/state.pt", map_location="cpu", weights_only=False)


class CheckpointManager:
    """Owns the checkpoint folder: restore on start, save on cadence and at the end. Collective throughout."""

    def __init__(self, cfg: TrainConfig, dist: Dist, parts: dict[str, Stateful]) -> None:
        self.root = Path(cfg.checkpoint_dir)
        self.dist, self.parts = dist, parts
        self.interval, self.keep = cfg.checkpoint_interval, cfg.effective_keep_checkpoints
        self.async_save = cfg.async_checkpoint
        self.saved_at = -1
        self._pending: tuple[Future, Path, int] | None = None
        # The background save runs collectives while the loop runs its own: they need a group of their own.
        self._async_group = (torch_dist.new_group(backend="gloo")
                             if self.async_save and torch_dist.is_initialized() else None)

    # ---- resuming -----------------------------------------------------------------------------------
    def restore(self) -> Path | None:
        """Load the newest complete checkpoint into the parts, in place; None when there is none."""
        path = self.latest()
        if path is None:
            return None
        with _quiet_in_one_process():
            dcp.load(dict(self.parts), checkpoint_id=str(path))
        self.saved_at = int(path.name.removeprefix("step-"))
        if self.dist.is_main:
            print(f"[checkpoint] resumed from {path} at step {path.name.removeprefix('step-')}", flush=True)
        return path

    def latest(self) -> Path | None:
        """The newest complete step, chosen on rank 0 and agreed by all; partial or corrupt ones skipped."""
        chosen = None
        if self.dist.is_main:
            for _, path in step_dirs(self.root):
                reason = why_invalid(path)
                if reason is None:
                    chosen = str(path)
                    break
                print(f"[checkpoint] skipping {path.name}: {reason}", flush=True)
        chosen = self.dist.broadcast_object(chosen)
        return Path(chosen) if chosen else None

    # ---- cadence ------------------------------------------------------------------------------------
    def save_if_due(self, step: int, running: bool) -> bool:
        """Every `interval` steps while the run goes on (the end has its own save)."""
        if not (self.interval and running and step % self.interval == 0):
            return False
        self.save(step)
        return True

    def save_final(self, step: int) -> None:
        """When the run ends for any reason: a rerun then resumes, or sees the job is done."""
        if step > 0 and self.saved_at != step:
            self.save(step)
        self.wait()

    # ---- writing ------------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        """Write step-N. Collective: every rank calls it at the same step."""
        self.wait()  # an earlier async save must be complete (and marked) before the next one starts
        path = self.root / f"step-{step}"
        if self.dist.local_rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():  # a leftover of an attempt that died at this step
                shutil.rmtree(path)
        self.dist.barrier()
        self.saved_at = step
        with _quiet_in_one_process():
            if self.async_save:
                future = dcp.async_save(dict(self.parts), checkpoint_id=str(path), process_group=self._async_group)
                self._pending = (future, path, step)
                return path
            dcp.save(dict(self.parts), checkpoint_id=str(path))
        self._mark_complete(path, step)
        return path

    def wait(self) -> None:
        """Complete a pending async save: wait for its writes, then mark it. Collective."""
        if self._pending is not None:
            future, path, step = self._pending
            self._pending = None
            future.result()
            self._mark_complete(path, step)

    def _mark_complete(self, path: Path, step: int) -> None:
        self.dist.barrier()
        # Multi-node: each node sees its own ranks' files; the union is what a complete step holds.
        listings = self.dist.all_gather_object(_listing(path) if path.exists() else {})
        files = {name: size for listing in listings for name, size in listing.items()}
        if self.dist.local_rank == 0:
            _write_atomic(path / MARKER, json.dumps({"step": step, "files": files}, indent=1))
            self._prune()
        self.dist.barrier()

    def _prune(self) -> None:
        complete = [(s, p) for s, p in step_dirs(self.root) if why_invalid(p) is None]
        newest = complete[0][0] if complete else -1
        keep = {p for _, p in complete[: self.keep]}
        for s, p in step_dirs(self.root):
            if p not in keep and s <= newest:
                shutil.rmtree(p, ignore_errors=True)


def _listing(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != MARKER}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
