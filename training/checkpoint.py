"""Checkpoints under the checkpoint dir as `step-N/`, valid only once their completion marker is written.

Layout of `step-N/`:
  model_optim.pt       replicated strategies (single, ddp): written once, by rank 0
  .metadata, __*.distcp  sharded strategies (fsdp, smp): torch.distributed.checkpoint, every rank its part
  trainer_state.pt     step, data position, scheduler, grad scaler, early stopping, every rank's RNG
  COMPLETE.json        written last, atomically, with every file's size: a step without it, or whose
                       files do not match it, is skipped on resume (a run killed mid-write, a bad sync)

A sharded checkpoint resumes on any number of ranks (DCP reshards on load), and also into a replicated
model; a replicated one loads into a sharded model as a full state dict.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from training.distributed import Dist

MARKER = "COMPLETE.json"
REPLICATED_FILE = "model_optim.pt"
TRAINER_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


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


class Checkpointer:
    def __init__(self, root: str | Path, dist: Dist, sharded: bool, keep: int, async_save: bool = False) -> None:
        self.root = Path(root)
        self.dist = dist
        self.sharded = sharded
        self.keep = keep
        self.async_save = async_save and sharded
        self._pending: tuple[Future, Path, dict] | None = None
        # The background save runs collectives while the loop runs its own: they need a group of their own.
        self._async_group = torch_dist.new_group(backend="gloo") if self.async_save else None

    # ---- saving -------------------------------------------------------------------------------------
    def save(self, step: int, model, optimizer, trainer_state: dict) -> Path:
        """Write step-N. Collective: every rank calls it at the same step."""
        self.wait()  # an earlier async save must be complete (and marked) before the next one starts
        path = self.root / f"step-{step}"
        if self.dist.local_rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if path.exists():  # a leftover of an attempt that died at this step
                shutil.rmtree(path)
        self.dist.barrier()
        rngs = self.dist.all_gather_object(rng_state())
        extra = {**trainer_state, "rng": rngs, "world_size": self.dist.world_size,
                 "format": "dcp" if self.sharded else "torch"}
        model_sd, optim_sd = get_state_dict(model, optimizer)
        if self.sharded:
            state = {"model": model_sd, "optim": optim_sd}
            if self.async_save:
                future = dcp.async_save(state, checkpoint_id=str(path), process_group=self._async_group)
                self._pending = (future, path, extra)
                return path
            dcp.save(state, checkpoint_id=str(path))
        elif self.dist.is_main:
            path.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model_sd, "optim": optim_sd}, path / REPLICATED_FILE)
        self._finish(path, extra)
        return path

    def wait(self) -> None:
        """Complete a pending async save: wait for its writes, then mark it. Collective."""
        if self._pending is not None:
            future, path, extra = self._pending
            self._pending = None
            future.result()
            self._finish(path, extra)

    def _finish(self, path: Path, extra: dict) -> None:
        if self.dist.is_main:
            path.mkdir(parents=True, exist_ok=True)
            torch.save(extra, path / TRAINER_FILE)
        self.dist.barrier()
        # Multi-node: each node sees its own ranks' files; the union is what a complete step holds.
        listings = self.dist.all_gather_object(_listing(path) if path.exists() else {})
        files = {name: size for listing in listings for name, size in listing.items()}
        if self.dist.local_rank == 0:
            _write_atomic(path / MARKER, json.dumps({"step": extra["step"], "files": files}, indent=1))
            self._prune()
        self.dist.barrier()

    def _prune(self) -> None:
        complete = [(s, p) for s, p in step_dirs(self.root) if why_invalid(p) is None]
        newest = complete[0][0] if complete else -1
        keep = {p for _, p in complete[: self.keep]}
        for s, p in step_dirs(self.root):
            if p not in keep and s <= newest:
                shutil.rmtree(p, ignore_errors=True)

    # ---- resuming -----------------------------------------------------------------------------------
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

    def load(self, path: Path, model, optimizer) -> dict:
        """Restore model and optimizer in place; return the trainer state with this rank's RNG applied."""
        extra = torch.load(path / TRAINER_FILE, map_location="cpu", weights_only=False)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        if extra["format"] == "dcp":
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=str(path))
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        else:
            full = torch.load(path / REPLICATED_FILE, map_location="cpu", weights_only=True)
            options = StateDictOptions(full_state_dict=self.sharded)
            set_state_dict(model, optimizer, model_state_dict=full["model"], optim_state_dict=full["optim"],
                           options=options)
        if extra["world_size"] == self.dist.world_size:
            set_rng_state(extra["rng"][self.dist.rank])
        else:  # a different world: per-rank streams cannot carry over; derive fresh ones from the step
            torch.manual_seed(extra["step"] * 1009 + self.dist.rank)
        return extra


def _listing(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != MARKER}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
