"""Checkpoints: when to write them, and `step-N/` folders of torch.distributed.checkpoint for every strategy.

Layout of `step-N/` (one format whether the run was single, ddp or fsdp):
  .metadata, __R_0.distcp  torch.distributed.checkpoint: every rank writes its part, replicated tensors once
  COMPLETE.json            written last, atomically, with every file's size: a step without it, or whose
                           files do not match it, is skipped on resume (a run killed mid-write, a bad sync)
What the folder holds is `training.state`'s parts. DCP reshards on load, so a checkpoint written by N ranks
resumes on M, and a DDP one resumes into FSDP.

Cadence: every `checkpoint_interval` steps, and every `checkpoint_minutes` since the last save started, while
the run goes on; once more when it ends (completed, early-stopped, stopped by a signal) unless that step is
saved. At a stop the save is written only if, by the longest earlier save, it ends before SageMaker's SIGKILL
(contract.container.STOP_KILL_AFTER_SECONDS after the signal); otherwise the run exits at once and the
previous checkpoint stands. Keeps the newest K complete ones.

Async saves (`async_checkpoint`) stage through `training.checkpoint_staging.PinnedStager`: the loop stalls
for the device->host copy into reused pinned buffers; the write overlaps the next steps. Each save logs its
stall and its total time; `age()` is the seconds since the newest complete checkpoint (`checkpoint_age_s`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import warnings
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.stateful import Stateful

from contract.container import STOP_KILL_AFTER_SECONDS
from contract.failures import FailureCode
from contract.hyperparameters import TrainConfig
from training.checkpoint_staging import PinnedStager
from training.distributed import Dist
from training.outcome import TrainingFailure

MARKER = "COMPLETE.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# DCP warns that it assumes one process when there is no process group: that is the `single` strategy, on
# purpose. Silenced process-wide (an async save warns from its own thread) and around each call (for
# callers that reset the filters, such as pytest).
_ONE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
# After the stop-time save: the ranks still export nothing but write the status file and leave the process
# group; 10 s of the 120 s is kept for that. A save is predicted to take this much longer than the longest
# earlier one (page cache, a busier disk at shutdown).
STOP_EXIT_SECONDS = 10.0
STOP_SAVE_SAFETY = 1.25
# Tests only: a stop-time save sleeps this long before it is marked complete (a writer slower than torchrun's
# old 30 s grace, without writing gigabytes).
ENV_TEST_STOP_SAVE_DELAY = "TRAINING_TEST_STOP_SAVE_DELAY_S"
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
        self.every_s = cfg.checkpoint_minutes * 60
        self.async_save = cfg.async_checkpoint
        self.saved_at = -1
        self.totals: list[float] = []  # each finished save's seconds, start to marker: the stop-time estimate
        self._started = self._complete_at = time.time()  # nothing at risk before the first step
        self._pending: tuple[Future, Path, int, float] | None = None
        self._stopping = False  # the stop-time save (the tests' injected delay applies to it alone)
        self._stager = PinnedStager(budget_bytes=_host_budget()) if self.async_save else None
        # The background save runs collectives while the loop runs its own: they need a group of their own.
        self._async_group = (torch_dist.new_group(backend="gloo")
                             if self.async_save and torch_dist.is_initialized() else None)

    # ---- resuming -----------------------------------------------------------------------------------
    def restore(self) -> Path | None:
        """Load the newest complete checkpoint into the parts, in place; None when there is none."""
        path = self.latest()
        if path is None:
            return None
        try:
            with _quiet_in_one_process():
                dcp.load(dict(self.parts), checkpoint_id=str(path))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # DCP's CheckpointException is a BaseException, each rank's traceback inside
            raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE, _unreadable(path, e)) from None
        self.saved_at = int(path.name.removeprefix("step-"))
        if self.dist.is_main:
            print(f"[checkpoint] resumed from {path} at step {path.name.removeprefix('step-')}", flush=True)
        return path

    def latest(self) -> Path | None:
        """The newest complete step, chosen on rank 0 and agreed by all; partial or corrupt ones skipped."""
        chosen = None
        if self.dist.is_main:
            if self.root.exists() and not self.root.is_dir():
                raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE, f"the checkpoint folder {self.root} is "
                                      "a file: remove it, or point checkpoint_dir elsewhere")
            for _, path in step_dirs(self.root):
                reason = why_invalid(path)
                if reason is None:
                    chosen = str(path)
                    break
                print(f"[checkpoint] skipping {path.name}: {reason}", flush=True)
        chosen = self.dist.broadcast_object(chosen)
        return Path(chosen) if chosen else None

    # ---- cadence ------------------------------------------------------------------------------------
    def time_due(self) -> bool:
        """This rank's clock says `checkpoint_minutes` passed since the last save began (the loop agrees it
        over the ranks with the stop flag, in one all-reduce)."""
        return bool(self.every_s) and time.time() - self._started >= self.every_s

    def due(self, step: int, running: bool, time_due: bool = False) -> bool:
        """Every `interval` steps, or when the time cadence is due, while the run goes on."""
        by_steps = bool(self.interval) and step % self.interval == 0
        return running and step > 0 and self.saved_at != step and (by_steps or time_due)

    def save_if_due(self, step: int, running: bool, time_due: bool = False) -> bool:
        if not self.due(step, running, time_due):
            return False
        self.save(step)
        return True

    def save_final(self, step: int) -> None:
        """When the run ends for any reason: a rerun then resumes, or sees the job is done."""
        if step > 0 and self.saved_at != step:
            self.save(step)
        self._close()

    def _close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()

    def save_at_stop(self, step: int, seconds_since_signal: float) -> bool:
        """The save of a stop, if it can end before SIGKILL; else say so and keep the previous checkpoint.
        Rank 0 decides (each rank timed its own saves). Returns whether it saved."""
        fits, message = True, ""
        if self.dist.is_main and self.totals and self.saved_at != step:
            left = STOP_KILL_AFTER_SECONDS - STOP_EXIT_SECONDS - seconds_since_signal
            needed = max(self.totals) * STOP_SAVE_SAFETY
            fits = needed <= left
            previous = f"step-{self.saved_at}" if self.saved_at >= 0 else "no checkpoint"
            message = (f"[checkpoint] stop at step {step}: a save takes about {needed:.0f} s and {left:.0f} s are "
                       f"left before SIGKILL: exiting now; the previous checkpoint ({previous}) stands")
        if not self.dist.broadcast_object(fits):
            if message:
                print(message, flush=True)
            self._close()  # an async save already under way completes: it is the newest one
            return False
        self._stopping = True
        self.save_final(step)
        return True

    def age(self) -> float:
        """Seconds since the newest complete checkpoint (since the start before the first)."""
        return time.time() - self._complete_at

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
        self.saved_at, began = step, time.time()
        self._started = began
        with _quiet_in_one_process():
            if self._stager is not None:
                state = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in self.parts.items()}
                future = self._stager.save(state, str(path), process_group=self._async_group)
                self._pending = (future, path, step, began)
                self._log(step, stall=time.time() - began, total=None)
                return path
            dcp.save(dict(self.parts), checkpoint_id=str(path))
        self._finish(path, step, began, stall=time.time() - began)
        return path

    def wait(self) -> None:
        """Complete a pending async save: wait for its writes, then mark it. Collective."""
        if self._pending is not None:
            future, path, step, began = self._pending
            self._pending = None
            future.result()
            self._finish(path, step, began, stall=None)

    def _finish(self, path: Path, step: int, began: float, stall: float | None) -> None:
        delay = float(os.environ.get(ENV_TEST_STOP_SAVE_DELAY, "0") or 0)
        if delay and self._stopping:
            time.sleep(delay)
        self._mark_complete(path, step)
        total = time.time() - began
        self.totals.append(total)
        self._complete_at = time.time()
        self._log(step, stall=stall, total=total)

    def _log(self, step: int, stall: float | None, total: float | None) -> None:
        if not self.dist.is_main:
            return
        parts = [f"stall {stall:.2f} s" if stall is not None else "", f"total {total:.2f} s" if total is not None
                 else "writing in the background"]
        print(f"[checkpoint] step-{step}: " + ", ".join(p for p in parts if p), flush=True)

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


def _unreadable(path: Path, error: Exception) -> str:
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    if len(first) > 300:
        first = first[:300] + "..."
    return (f"checkpoint {path} cannot be loaded into this run ({type(error).__name__}: {first}): the model, "
            "model_size, optimizer or strategy differs from the run that wrote it, or its files are damaged; "
            "run with the settings it was written with, or start from an empty checkpoint folder")


def _host_budget() -> int | None:
    """Pinned staging may take a quarter of this host's memory, shared by its ranks; beyond, saves are
    written synchronously (slower, but no memory pressure next to the data loaders)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return total // 4 // max(1, ranks_here)


def _listing(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != MARKER}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
