"""Checkpoints: when to write them, and `step-N/` folders of torch.distributed.checkpoint for every strategy.

Layout of `step-N/` (one format whether the run was single, ddp or fsdp):
  .metadata, __R_0.distcp  torch.distributed.checkpoint: rank R writes `__R_<n>.distcp` (n counts the writer's
                           threads, one by default), replicated tensors once; rank 0 also `.metadata` (the same
                           names on torch 2.8 and 2.13)
  COMPLETE.json            written last, atomically: every file's size ("files") and CRC-32 ("checksums"); a
                           step without it, or whose files do not have its sizes, is skipped on resume (a run
                           killed mid-write, a bad sync)
What the folder holds is `training.checkpoint.state`'s parts. DCP reshards on load, so a checkpoint written by N ranks
resumes on M, and a DDP one resumes into FSDP.

Whose a checkpoint is: the marker also records "run_id" (contract.container.ENV_RUN_ID, which the launcher
sets on every attempt of a run; null where it is unset: `trainctl local`, tests) and "fingerprint"
(training.job.fingerprint: the model, its shape, vocabulary size and master-weight dtype). On resume a step
whose recorded run id is another run's, or whose fingerprint differs from this run's, ends the run before
training (CHECKPOINT_UNREADABLE, naming both runs and what differs): a run must not continue another's
training as its own. A missing run id claims nothing: a step written without one (or by a marker from
before owners, "unknown owner") is adopted by any run with a line, so a run that took up the platform
mid-way is not stranded; a run without one resumes any step whose fingerprint matches, with a line. The
fingerprint is checked whatever the run ids.

Starting from another run's weights is explicit: `init_from` (a `step-N` folder, a checkpoint folder's
newest complete step, or a `model.safetensors`) loads the model's parameters alone (DCP with only the
"model" key, so any strategy reshards it; a safetensors file through `set_model_state_dict`, broadcast from
rank 0) when the run's own folder holds no complete checkpoint; the optimizer, data position, schedule and
RNG start fresh at step 0. Once the run has checkpoints of its own, `init_from` is ignored (one line).

Which attempt of a run may write here: the one with the newest epoch (training.checkpoint.fencing). Each attempt claims the
folder at its restore and records its epoch in every marker; before it writes a step, and before it marks one or
prunes, it reads the claim again, and an older attempt stops (SUPERSEDED) rather than overwrite or prune the newer one's.

Cadence: every `checkpoint_interval` steps, and every `checkpoint_minutes` since the last save started, while
the run goes on; once more when it ends (completed, early-stopped, stopped by a signal) unless that step is
saved. At a stop the save is written only if, by the longest earlier save, it ends before SageMaker's SIGKILL
(contract.container.STOP_KILL_AFTER_SECONDS after the signal); otherwise the run exits at once and the
previous checkpoint stands. Keeps the newest K complete ones.

Async saves (`async_checkpoint`) stage through `training.checkpoint.staging.PinnedStager`: the loop stalls
for the device->host copy into reused pinned buffers; the write overlaps the next steps. Each save logs its
stall and its total time; `age()` is the seconds since the newest complete checkpoint (`checkpoint_age_s`).

Checkpoints that never go bad:
- Only finite steps are saved. Every save takes the step's non-finite streak (training.metrics.meter, the max over the
  ranks): a step whose loss or gradient norm is NaN/Inf on any rank is not saved (one line says so), so the
  newest checkpoint is always a finite one. Pruning keeps the newest K at or below the step just written:
  steps above it are left from before a fallback (below) and never push a good one out.
- Checksums: zlib.crc32 (standard library). `python -m bench.checksum` (1 GiB in the page cache, on the 2-core
  development machine) read 2.9 GiB/s for crc32 = 0.34 s per GiB, adler32 2.6, sha1 1.5, sha256 1.4, blake2b 0.8,
  md5 0.6; xxhash's xxh3 6.2 and google-crc32c are dependencies the SageMaker image does not have. Each rank
  hashes the files it wrote, right after writing them (from the page cache; an async save hashes in a thread
  of its own, zlib releasing the GIL), and the marker gathers every rank's share. On resume the marker's files
  are shared out over all ranks by size, each hashes its share and the ranks agree: a 1 TB checkpoint on 64
  ranks is 16 GiB, about 5 s, per rank (slower where the disk reads slower than that). A multi-node run
  checks each file on the node of the rank it falls to. Markers without checksums (written before they
  existed) are accepted on their sizes.
- A step that fails verification or fails to load falls back to the previous complete step, with a line
  saying why. Loading it overwrites every part (model, optim, scheduler, data, scaler, loop, rng), so what a
  failed load wrote in place does not survive. When no step loads, CHECKPOINT_UNREADABLE carries torch's own
  causes (the per-rank errors inside DCP's CheckpointException), once each.
- Before the first step each node makes the folder, writes and removes a probe file, and checks its free
  space against the next save (the newest checkpoint's size, else the model's tensors and the optimizer's
  moments, times SPACE_MARGIN): a folder that fails ends the run as CHECKPOINT_UNWRITABLE before training, as
  does a disk full during a save (ENOSPC or EDQUOT anywhere in the error's chain). That checks the next save,
  not the whole run's keep_checkpoints + 1: a later full disk still ends with its own line.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import json
import os
import re
import shutil
import socket
import tempfile
import time
import warnings
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from contract.container import ENV_RUN_ID, FENCE_KEY, STOP_KILL_AFTER_SECONDS
from contract.errors import ConfigError, error_chain
from contract.failures import FailureCode
from contract.hyperparameters import TrainConfig
from training.checkpoint import fencing
from training.checkpoint.staging import PinnedStager
from training.environment import container
from training.metrics.logger import strict_json
from training.parallel.process_group import Dist
from training.resilience import watchdog
from training.resilience.outcome import TrainingFailure

MARKER = "COMPLETE.json"
CHECKSUM = "crc32"  # the marker's algorithm: zlib.crc32 of each file, 8 hex digits
_READ_CHUNK = 8 << 20  # bytes per read while hashing, into one reused buffer
_STEP_DIR = re.compile(r"^step-(\d+)$")
_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's FileSystemWriter: `__<rank>_<n>.distcp`
# The free-space check asks for the next save times this, plus a little for .metadata and the marker.
SPACE_MARGIN = 1.1
SPACE_EXTRA_BYTES = 16 << 20
# A full disk as torch's C++ writer reports it (inline_container.cc's "file write failed" says no more).
_DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|\[Errno 28\]|\berrno:? ?28\b", re.I)
# What ends a save for good, by errno: the disk full, or the folder no longer writable (a read-only remount after a
# disk error, a mount gone, permissions changed under the run).
_UNWRITABLE_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EROFS: "EROFS", errno.EACCES: "EACCES",
                      errno.EPERM: "EPERM"}
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


def _step_number(path: Path) -> int:
    return int(path.name.removeprefix("step-"))


def _folder_view(root: Path) -> dict[str, str | None]:
    """{step-N: why it is not complete here, or None} for every step folder of this host's checkpoint folder."""
    return {path.name: why_invalid(path) for _, path in step_dirs(root)}


def _partial(partial: dict[str, str], hosts: int) -> str:
    """Why a step is not complete: the reason, once when every host gives it; else each host's, and on how many of
    the hosts it is complete (a step one host holds whole and another does not)."""
    reasons = set(partial.values())
    if len(partial) == hosts and len(reasons) == 1:
        return reasons.pop()
    return "; ".join(f"on {host}: {why}" for host, why in sorted(partial.items())) + \
        f" (complete on {hosts - len(partial)} of {hosts} hosts)"


def _remove_step(path: Path) -> None:
    """Remove a step folder, its completion marker first: a step half removed never looks complete (a resume on
    this folder, or another host removing the same folder on a shared one)."""
    with contextlib.suppress(OSError):
        (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every `step-N` folder, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def why_invalid(path: Path) -> str | None:
    """None when the step is complete (its marker's files all there, at their sizes); otherwise the reason
    it cannot be resumed from. Cheap: checksums are `CheckpointManager`'s, collectively."""
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


def recorded_global_batch(root: Path) -> int | None:
    """The global batch the newest complete step in `root` was trained with, from its marker; None without one (a
    fresh run, or a marker from before it was recorded)."""
    for _, path in step_dirs(root):
        if why_invalid(path) is None:
            value = json.loads((path / MARKER).read_text()).get("global_batch")
            return value if isinstance(value, int) else None
    return None


def file_checksum(path: Path) -> str:
    """The CRC-32 of a file as 8 hex digits (zlib.crc32: the module docstring has its cost)."""
    value, buf = 0, bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            value = zlib.crc32(view[:n], value)
    return f"{value:08x}"


def read_checkpoint(path: str | Path) -> dict:
    """A whole checkpoint as nested dicts, in this one process (inspection and tests; not for resuming)."""
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(str(path), f"{tmp}/state.pt")
        return torch.load(f"{tmp}/state.pt", map_location="cpu", weights_only=False)


class _Step(NamedTuple):
    """A complete step as its marker describes it; `checksums` None for a marker from before them, `owner`
    ({"run_id", "fingerprint"}) None for a marker from before owners."""

    path: str
    sizes: dict[str, int]
    checksums: dict[str, str] | None
    owner: dict | None = None


@dataclass(frozen=True)
class Owner:
    """The run that writes checkpoints here: its id (None: unset, claims nothing) and what its weights mean
    (training.job.fingerprint; None: not checked, e.g. a benchmark without a job)."""

    run_id: str | None
    fingerprint: dict | None = None

    @property
    def name(self) -> str:
        return f"run {self.run_id!r}" if self.run_id else f"a run without a run id ({ENV_RUN_ID} unset)"


def current_run_id() -> str | None:
    """The launcher's run id (contract.container.ENV_RUN_ID), or None where it is unset (local runs, tests)."""
    return os.environ.get(ENV_RUN_ID) or None


class CheckpointManager:
    """Owns the checkpoint folder: restore on start, save on cadence and at the end. Collective throughout."""

    def __init__(self, cfg: TrainConfig, dist: Dist, parts: dict[str, Stateful], owner: Owner | None = None,
                 global_batch: int | None = None) -> None:
        self.root = Path(cfg.checkpoint_dir)
        self.global_batch = global_batch  # recorded in each marker: a resume keeps it (recorded_global_batch)
        self.dist, self.parts = dist, parts
        self.owner = owner or Owner(current_run_id())
        self.init_from = cfg.init_from
        self.interval, self.keep = cfg.checkpoint_interval, cfg.effective_keep_checkpoints
        self.every_s = cfg.checkpoint_minutes * 60
        self.async_save = cfg.async_checkpoint
        self.saved_at = -1
        self.totals: list[float] = []  # each finished save's seconds, start to marker: the stop-time estimate
        self._started = self._complete_at = time.time()  # nothing at risk before the first step
        # An async save: its write-then-hash future (this rank's {file: (size, crc)}), folder, step, start.
        self._pending: tuple[Future, Path, int, float] | None = None
        self._stopping = False  # the stop-time save (the tests' injected delay applies to it alone)
        self._stager = PinnedStager(budget_bytes=_host_budget()) if self.async_save else None
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-hash") if self.async_save else None
        # The background save runs collectives while the loop runs its own: they need a group of their own.
        self._async_group = (torch_dist.new_group(backend="gloo")
                             if self.async_save and torch_dist.is_initialized() else None)
        self._next_save_bytes: int | None = None  # this node's share of the next save (the restore's check)
        # The steps complete on every host: those the restore found complete everywhere, and those this run marked.
        # Pruning decides by it, never by this host's folder: with an instance's own folder (SageMaker's checkpoint
        # sync) no host holds another's files, so no step ever looks complete in one folder.
        self.complete: set[int] = set()
        self.host = container(os.environ).current_host
        self.epoch = fencing.current_epoch()  # this attempt's: it claims the folder, and a newer one stops it

    # ---- resuming -----------------------------------------------------------------------------------
    @watchdog.phased("the checkpoint restore")  # a large restore gets its own long allowance, apart from startup
    def restore(self) -> Path | None:
        """Check the folder can take the next save, then load the newest complete step that is this run's,
        verifies and loads into the parts, in place, falling back to older ones. None when there is none:
        then the model's weights come from `init_from` when it is set. Collective."""
        steps = self._complete_steps()
        self._check_folder(steps[0].sizes if steps else None)
        self.complete = {_step_number(Path(step.path)) for step in steps}
        failed: list[tuple[str, str]] = []  # (step-N, why it could not be resumed)
        for step in steps:
            path = Path(step.path)
            adopted = self._check_owner(step)
            why, verified = self._verify(step)
            why = why or self._load(path)
            if why is None:
                self._resumed(path, failed, verified, adopted)
                return path
            failed.append((path.name, why))
            self.complete.discard(_step_number(path))
        if failed:
            raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE, _unreadable(self.root, failed))
        if self.init_from:
            self._start_from(self.init_from)
        return None

    def _check_owner(self, step: _Step) -> str | None:
        """Raise when the step is another run's or another model's; otherwise the line to say when this run
        adopts a step whose owner it cannot confirm (None when it can). Every rank sees the same step."""
        mine, name = self.owner, Path(step.path).name
        if step.owner is None:
            return (f"[checkpoint] {name} has an unknown owner (its marker predates run ids and fingerprints): "
                    f"{mine.name} resumes it")
        theirs = Owner(step.owner.get("run_id"), step.owner.get("fingerprint"))
        other_run = bool(theirs.run_id and mine.run_id and theirs.run_id != mine.run_id)
        differences = (_differences(theirs.fingerprint, mine.fingerprint)
                       if theirs.fingerprint is not None and mine.fingerprint is not None else [])
        if other_run or differences:
            raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE,
                                  _foreign(self.root, step.path, theirs, mine, other_run, differences))
        if theirs.run_id == mine.run_id:
            return None
        if theirs.run_id is None:
            return f"[checkpoint] {name} was written by {theirs.name}: {mine.name} adopts it"
        return f"[checkpoint] {name} was written by {theirs.name}; {mine.name} resumes it"

    def _complete_steps(self) -> list[_Step]:
        """Every step complete in every host's folder, newest first (partial ones newer than the newest complete
        one are named in a line, with the hosts they are partial on), agreed by all. Each host's first rank looks
        at its own folder: a step whose files reached the job's S3 prefix from one host but not another is
        partial everywhere (every host downloads the same prefix), and on a folder shared by every host (FSx)
        the views are equal."""
        view = _folder_view(self.root) if self.dist.local_rank == 0 else None
        views = [(host, seen) for host, seen in self.dist.all_gather_object((self.host, view)) if seen is not None]
        found: list[_Step] = []
        if self.dist.is_main:
            for _, path in step_dirs(self.root):
                reasons = {host: seen.get(path.name, "absent") for host, seen in views}
                partial = {host: why for host, why in reasons.items() if why is not None}
                if not partial:
                    marker = json.loads((path / MARKER).read_text())
                    checksums = marker.get("checksums") if marker.get("checksum") == CHECKSUM else None
                    owned = "run_id" in marker or "fingerprint" in marker
                    owner = {"run_id": marker.get("run_id"), "fingerprint": marker.get("fingerprint")} if owned else None
                    found.append(_Step(str(path), marker["files"], checksums, owner))
                elif not found:
                    print(f"[checkpoint] skipping {path.name}: {_partial(partial, len(views))}", flush=True)
        return self.dist.broadcast_object(found)

    def _verify(self, step: _Step) -> tuple[str | None, str]:
        """(why the step's files do not match their marker's checksums, or None; a note for the resume line).
        The files are shared out over the ranks by size; the ranks agree. Collective."""
        if step.checksums is None:
            return None, "sizes checked: its marker has no checksums"
        began, path = time.time(), Path(step.path)
        bad = []
        for name in _share(step.sizes, self.dist.rank, self.dist.world_size):
            expected = step.checksums.get(name)
            if expected is None:
                continue
            try:
                got = file_checksum(path / name)
            except OSError as e:
                bad.append(f"{name}: {e.strerror or e}")
                continue
            if got != expected:
                bad.append(f"{name}: crc32 {got} on disk, the marker says {expected}")
        bad = sorted(b for share in self.dist.all_gather_object(bad) for b in share)
        if bad:
            return f"failed verification ({_first(bad, 3)})", ""
        seconds = self.dist.max_float(time.time() - began)
        return None, f"{len(step.checksums)} checksums verified in {seconds:.2f} s over {self.dist.world_size} rank(s)"

    def _load(self, path: Path, parts: list[str] | None = None) -> str | None:
        """None when the step (its `parts`, default all) loaded on every rank; otherwise why, every rank's
        causes once each. Collective."""
        causes: list[str] = []
        try:
            with _quiet_in_one_process():
                dcp.load({k: v for k, v in self.parts.items() if parts is None or k in parts}, checkpoint_id=str(path))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # DCP's CheckpointException is a BaseException, each rank's error inside
            causes = _causes(e)
        return self._load_failure(causes)

    def _load_failure(self, causes: list[str]) -> str | None:
        """Every rank's causes, once each, as the reason a load failed; None when no rank had one. A part's own
        load_state_dict can fail on one rank alone: every rank must fall back together. Collective."""
        causes = list(dict.fromkeys(c for rank_causes in self.dist.all_gather_object(causes) for c in rank_causes))
        return f"failed to load ({'; '.join(causes)})" if causes else None

    def _resumed(self, path: Path, failed: list[tuple[str, str]], verified: str, adopted: str | None) -> None:
        self.saved_at = int(path.name.removeprefix("step-"))
        if not self.dist.is_main:
            return
        for name, why in failed:
            print(f"[checkpoint] {name} {why}: resuming from {path.name}", flush=True)
        if adopted:
            print(adopted, flush=True)
        print(f"[checkpoint] resumed from {path} at step {self.saved_at} ({verified})", flush=True)
        if self.init_from:
            print(f"[checkpoint] init_from={self.init_from} ignored: the run resumes its own checkpoint", flush=True)

    # ---- starting from another run's weights (init_from) -----------------------------------------------
    def _start_from(self, given: str) -> None:
        """Load the model's parameters alone from `given` (see the module docstring); ConfigError, on every
        rank, for a path that holds no usable weights or whose tensors do not fit this model. Collective."""
        found = self.dist.broadcast_object(_init_source(given) if self.dist.is_main else None)
        if isinstance(found, str):
            raise ConfigError(found)
        kind, path, shapes, about = found
        model = self.parts["model"]
        if kind == "safetensors" and getattr(model.model, "pipeline_group", None) is not None:
            raise ConfigError(f"init_from={given}: a safetensors file cannot start a pipeline (pp, hybrid) run here: "
                              "give a checkpoint's step-N folder instead (it reshards into the stages)")
        self._check_fits(given, shapes)
        why = self._load(Path(path), parts=["model"]) if kind == "dcp" else self._load_full(path)
        if why:
            raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE,
                                  f"init_from={given} {why}: give an intact checkpoint or model file, or unset init_from")
        if self.dist.is_main:
            print(f"[checkpoint] started from the weights of {path} ({about}, {len(shapes)} tensors); the optimizer, "
                  "data position, learning-rate schedule and RNG start fresh at step 0", flush=True)

    def _check_fits(self, given: str, shapes: dict[str, list[int]]) -> None:
        """Every tensor of this model is in the source at the same (global) shape, and the source has no other
        model tensors; otherwise ConfigError naming the first few, on every rank. Collective."""
        mine = {k: list(v.shape) for k, v in self.parts["model"].state_dict().items()}
        problems = [f"tensor {k!r} is not there" if k not in shapes else
                    f"tensor {k!r} is {shapes[k]} there and {shape} in this model"
                    for k, shape in mine.items() if shapes.get(k) != shape]
        everyone = {k for keys in self.dist.all_gather_object(sorted(mine)) for k in keys}
        problems += [f"tensor {k!r} there is not in this model" for k in sorted(set(shapes) - everyone)]
        problems = sorted({p for rank_problems in self.dist.all_gather_object(problems) for p in rank_problems})
        if problems:
            raise ConfigError(f"init_from={given} does not fit this model: {_first(problems, 3)}: start from "
                              "weights of the same model and shape (model, model_size, seq_len, the data's "
                              "vocabulary), or unset init_from")

    def _load_full(self, path: str) -> str | None:
        """Set the model from a full state dict in a safetensors file, read on rank 0 and broadcast (every
        strategy but pipelines shards it on set). None when every rank set it; otherwise why. Collective."""
        causes: list[str] = []
        try:
            state = _read_safetensors(path) if self.dist.is_main else {}
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=torch_dist.is_initialized())
            set_model_state_dict(self.parts["model"].model, state, options=options)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:
            causes = _causes(e)
        return self._load_failure(causes)

    def _check_folder(self, newest_sizes: dict[str, int] | None) -> None:
        """Each node's folder exists, takes a file, and has room for the next save; otherwise every rank fails
        with the first problem, before training. Collective."""
        total = sum(newest_sizes.values()) if newest_sizes else self._state_bytes()
        basis = "the newest checkpoint's size" if newest_sizes else "the model's tensors and optimizer moments"
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", self.dist.world_size) or self.dist.world_size)
        # Each rank writes about its 1/world of a checkpoint (DCP spreads replicated tensors over the ranks).
        share = total * min(ranks_here, self.dist.world_size) / self.dist.world_size
        self._next_save_bytes = int(share * SPACE_MARGIN) + SPACE_EXTRA_BYTES
        problem = None
        if self.dist.local_rank == 0:
            unwritable = _folder_problem(self.root, self._next_save_bytes, basis)
            claimed_by_newer = None if unwritable else fencing.claim(self.root, self.epoch, self.owner.name)
            problem = ((FailureCode.CHECKPOINT_UNWRITABLE, unwritable) if unwritable else
                       (FailureCode.SUPERSEDED, claimed_by_newer) if claimed_by_newer else None)
        self._agree(problem)

    def _state_bytes(self) -> int:
        """A checkpoint's bytes before one exists: every tensor of the model once by name (DCP writes a replica
        once; a DTensor at its global size), and the optimizer's moments of each trainable one. Reading the
        optimizer's own state is no option: DCP would initialize it with a step. Collective."""
        model = getattr(self.parts.get("model"), "model", None)
        if model is None:
            return 0
        moments = _moments(getattr(self.parts.get("optim"), "optimizer", None))
        mine = {name: _global_bytes(p) * (1 + (moments if p.requires_grad else 0))
                for name, p in model.named_parameters()}
        mine.update({name: _global_bytes(b) for name, b in model.named_buffers()})
        merged: dict[str, int] = {}
        for sizes in self.dist.all_gather_object(mine):  # pipeline stages hold different names
            merged.update(sizes)
        return sum(merged.values())

    # ---- cadence ------------------------------------------------------------------------------------
    def time_due(self) -> bool:
        """This rank's clock says `checkpoint_minutes` passed since the last save began (the loop agrees it
        over the ranks with the stop flag, in one all-reduce)."""
        return bool(self.every_s) and time.time() - self._started >= self.every_s

    def due(self, step: int, running: bool, time_due: bool = False) -> bool:
        """Every `interval` steps, or when the time cadence is due, while the run goes on."""
        by_steps = bool(self.interval) and step % self.interval == 0
        return running and step > 0 and self.saved_at != step and (by_steps or time_due)

    @watchdog.phased("the end's checkpoint save")
    def save_final(self, step: int, nonfinite: int = 0) -> None:
        """When the run ends for any reason: a rerun then resumes, or sees the job is done."""
        if step > 0 and self.saved_at != step:
            self.save(step, nonfinite)
        self._close()

    def _close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
        if self._hasher is not None:
            self._hasher.shutdown()

    @watchdog.phased("the stop's checkpoint save")
    def save_at_stop(self, step: int, seconds_since_signal: float, nonfinite: int = 0) -> bool:
        """The save of a stop, if it can end before SIGKILL; else say so and keep the previous checkpoint.
        Rank 0 decides (each rank timed its own saves). Returns whether it saved."""
        if nonfinite:  # the same on every rank (the max over them): nothing to time
            self.save_final(step, nonfinite)
            return False
        fits, message = True, ""
        if self.dist.is_main and self.totals and self.saved_at != step:
            left = STOP_KILL_AFTER_SECONDS - STOP_EXIT_SECONDS - seconds_since_signal
            needed = max(self.totals) * STOP_SAVE_SAFETY
            fits = needed <= left
            message = (f"[checkpoint] stop at step {step}: a save takes about {needed:.0f} s and {left:.0f} s are "
                       f"left before SIGKILL: exiting now; the previous checkpoint ({self._newest()}) stands")
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

    def _newest(self) -> str:
        return f"step-{self.saved_at}" if self.saved_at >= 0 else "no checkpoint"

    # ---- writing ------------------------------------------------------------------------------------
    @watchdog.phased("a checkpoint save")  # not a training step: the hang watchdog's long allowance
    def save(self, step: int, nonfinite: int = 0) -> Path | None:
        """Write step-N; None when not written: `nonfinite` (the step's non-finite streak, the max over the
        ranks, from training.metrics.meter) above 0 means a loss or gradient norm is NaN/Inf, and such a model never
        becomes the newest checkpoint. Collective: every rank calls it at the same step."""
        if nonfinite:
            if self.dist.is_main:
                print(f"[checkpoint] step-{step} not saved: the loss or gradient norm is NaN/Inf there ({nonfinite} "
                      f"step(s) in a row on some rank); the newest checkpoint stays {self._newest()}", flush=True)
            return None
        self.wait()  # an earlier async save must be complete (and marked) before the next one starts
        path = self.root / f"step-{step}"
        problem = None
        if self.dist.local_rank == 0:
            if claimed_by_newer := fencing.superseded(self.root, self.epoch, self.owner.name):
                problem = (FailureCode.SUPERSEDED, claimed_by_newer)
            else:
                try:
                    with self._unwritable_is_a_failure(path):
                        self.root.mkdir(parents=True, exist_ok=True)
                        if path.exists():  # a leftover of an attempt that died at this step, or one that failed to load
                            _remove_step(path)
                except TrainingFailure as e:
                    problem = (e.code, str(e))
        self._agree(problem)  # a barrier that carries the folder's fate: one host's error must not hang the others
        self.saved_at, began = step, time.time()
        self._started = began
        with _quiet_in_one_process(), self._unwritable_is_a_failure(path):
            if self._stager is not None:
                state = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in self.parts.items()}
                written = self._stager.save(state, str(path), process_group=self._async_group)
                hashed = self._hasher.submit(_hash_when_written, written, path, self.dist)
                self._pending = (hashed, path, step, began)
                self._log(step, stall=time.time() - began, total=None)
                return path
            dcp.save(dict(self.parts), checkpoint_id=str(path))
        self._finish(path, step, began, stall=time.time() - began, hashed=None)
        return path

    def wait(self) -> None:
        """Complete a pending async save: wait for its writes and this rank's checksums, then mark it. Collective."""
        if self._pending is not None:
            hashed, path, step, began = self._pending
            self._pending = None
            with self._unwritable_is_a_failure(path):
                mine = hashed.result()
            self._finish(path, step, began, stall=None, hashed=mine)

    def _finish(self, path: Path, step: int, began: float, stall: float | None,
                hashed: dict[str, tuple[int, str]] | None) -> None:
        delay = float(os.environ.get(ENV_TEST_STOP_SAVE_DELAY, "0") or 0)
        if delay and self._stopping:
            time.sleep(delay)
        self._mark_complete(path, step, hashed)
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

    def _mark_complete(self, path: Path, step: int, hashed: dict[str, tuple[int, str]] | None) -> None:
        """Gather every rank's sizes and checksums into the marker (each node's first rank writes its own), and
        prune. `hashed`: this rank's share, already hashed by an async save. Collective."""
        self.dist.barrier()  # every rank's files (and rank 0's .metadata) are written
        if hashed is None:
            hashed = _hash_written_here(path, self.dist) if path.exists() else {}
        # Multi-node: each node sees its own ranks' files; the union is what a complete step holds.
        files = {name: entry for share in self.dist.all_gather_object(hashed) for name, entry in share.items()}
        problem = None
        if self.dist.local_rank == 0:
            marker = {"step": step, "files": {name: size for name, (size, _) in sorted(files.items())},
                      "checksum": CHECKSUM, "checksums": {name: crc for name, (_, crc) in sorted(files.items())},
                      "run_id": self.owner.run_id, "fingerprint": self.owner.fingerprint,
                      "global_batch": self.global_batch, FENCE_KEY: self.epoch}
            try:
                if claimed_by_newer := fencing.superseded(self.root, self.epoch, self.owner.name):
                    raise TrainingFailure(FailureCode.SUPERSEDED, claimed_by_newer)  # neither marked nor pruned
                with self._unwritable_is_a_failure(path):
                    _write_atomic(path / MARKER, strict_json(marker, indent=1))
                if not self._stopping:  # a stop's save prunes nothing (see _prune)
                    self._prune(step)
            except TrainingFailure as e:
                problem = (e.code, str(e))
            except OSError as e:
                problem = (FailureCode.CHECKPOINT_UNWRITABLE,
                           f"the completion marker of {path} cannot be written ({_os_error(e)}): {_FOLDER_FIX}")
        self._agree(problem)  # a barrier that carries the marker's fate: one rank's error must not hang the others
        self.complete.add(step)

    def _agree(self, problem: tuple[FailureCode, str] | None) -> None:
        """Every rank raises the first problem any rank (each host's first) found, or none does. Collective."""
        if problems := [p for p in self.dist.all_gather_object(problem) if p]:
            raise TrainingFailure(*problems[0])

    def _prune(self, step: int) -> None:
        """Keep the newest K steps complete on every host (`self.complete`) at or below `step`, the one just
        written (always kept: only finite steps are saved), and remove this host's copy of every other step at
        or below it (partial leftovers too). Newer steps are left: a run that fell back to an older step wrote
        below them, and those failed to load; they are not counted as the newest (a retry tries and skips them
        again). A stop's save prunes nothing: SageMaker's last upload after a stop may be cut short, and the
        deletions it propagates would take the previous complete step from S3 along with the new one's tail."""
        keep = set(sorted((s for s in self.complete | {step} if s <= step), reverse=True)[: self.keep])
        for s, p in step_dirs(self.root):
            if s not in keep and s <= step:
                _remove_step(p)

    @contextlib.contextmanager
    def _unwritable_is_a_failure(self, path: Path):
        """A disk full (or over quota), or a folder that is no longer writable, while writing `path` ends the run
        with a line naming it and the folder (a traceback otherwise)."""
        try:
            yield
        except (KeyboardInterrupt, SystemExit, TrainingFailure):
            raise
        except BaseException as e:
            name = _unwritable(e) or (_write_failed(e) and self._short_of_space() and "ENOSPC")
            if not name:
                raise
            raise TrainingFailure(FailureCode.CHECKPOINT_UNWRITABLE, _full_message(name, self.root, path)) from None

    def _short_of_space(self) -> bool:
        """The folder has less room than the next save needs (torch's C++ writer's failures name no errno)."""
        needed = self._next_save_bytes or SPACE_EXTRA_BYTES
        with contextlib.suppress(OSError):
            return shutil.disk_usage(self.root).free < needed
        return False


def _hash_when_written(written: Future, path: Path, dist: Dist) -> dict[str, tuple[int, str]]:
    """An async save's thread: wait for the write (its error re-raised), then hash this rank's files."""
    written.result()
    return _hash_written_here(path, dist)


def _hash_written_here(path: Path, dist: Dist) -> dict[str, tuple[int, str]]:
    """{file: (size, crc32)} of the step's files this rank wrote (`__<rank>_<n>.distcp`); each node's first
    rank also takes every other file it sees (rank 0's .metadata, any name a torch adds)."""
    hashed = {}
    for p in sorted(path.iterdir()):
        if not p.is_file() or p.name == MARKER:
            continue
        m = _RANK_FILE.match(p.name)
        writer = int(m.group(1)) if m and int(m.group(1)) < dist.world_size else None
        if writer == dist.rank or (writer is None and dist.local_rank == 0):
            hashed[p.name] = (p.stat().st_size, file_checksum(p))
    return hashed


def _share(sizes: dict[str, int], rank: int, world: int) -> list[str]:
    """The files `rank` verifies: the largest first, each to the least loaded rank (the same on every rank)."""
    loads = [(0, r) for r in range(world)]
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        load, r = heapq.heappop(loads)
        if r == rank:
            mine.append(name)
        heapq.heappush(loads, (load + sizes[name], r))
    return mine


def _first(items: list[str], n: int) -> str:
    """The first `n` items joined for a one-line message, and how many more there are."""
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return "; ".join(items[:n]) + more


def _causes(error: BaseException, limit: int = 300) -> list[str]:
    """The messages under an error, once each: DCP's CheckpointException keeps each rank's
    (exception, traceback) in `.failures`, and its own text only names the ranks."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        found = [c for f in failures.values() for c in _causes(f[0] if isinstance(f, tuple) else f, limit)]
        return list(dict.fromkeys(found))
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[:limit] + "..."
    return [f"{type(error).__name__}: {text}" if text else type(error).__name__]


def _unreadable(root: Path, failed: list[tuple[str, str]]) -> str:
    said: set[str] = set()
    parts = []
    for name, why in failed:
        parts.append(f"{name} {why}" if why not in said else f"{name} likewise")
        said.add(why)
    if all(why.startswith("failed verification") for _, why in failed):
        fix = ("their files changed after they were written (a damaged disk or copy): put back an intact copy of "
               "the folder, or start from an empty checkpoint folder")
    else:
        fix = ("the model, model_size, optimizer or strategy differs from the run that wrote them, or their files are "
               "damaged; run with the settings it was written with, or start from an empty checkpoint folder")
    return f"no checkpoint in {root} can be resumed: {'; '.join(parts)}: {fix}"


def _foreign(root: Path, path: str, theirs: Owner, mine: Owner, other_run: bool, differences: list[str]) -> str:
    """Why a step is not this run's to resume, naming both runs, what differs, and the fix."""
    why = ["it is another run's"] if other_run else []
    if differences:
        why.append(f"its model differs from this run's ({_first(differences, 4)})")
    if other_run:
        fix = (f"point checkpoint_dir at this run's own folder (an empty one to start afresh), or start from that "
               f"checkpoint's weights explicitly with init_from={path}")
    else:
        fix = ("run with the model settings it was written with (model, model_size, seq_len, the data's vocabulary), "
               "or point checkpoint_dir at an empty folder (init_from starts from weights of the same shape only)")
    return (f"{mine.name} cannot resume the checkpoint {Path(path).name} in {root}, written by {theirs.name}: "
            f"{'; '.join(why)}: {fix}")


def _differences(theirs: dict, mine: dict) -> list[str]:
    """'key: X in the checkpoint, Y in this run' for each fingerprint entry that differs (nested keys dotted)."""
    a, b = dict(_flat(theirs)), dict(_flat(mine))
    absent = "absent"
    return [f"{k}: {a.get(k, absent)} in the checkpoint, {b.get(k, absent)} in this run"
            for k in sorted(a.keys() | b.keys()) if a.get(k, absent) != b.get(k, absent)]


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


_INIT_FIX = "give a checkpoint's step-N folder, a checkpoint folder, or a model.safetensors file"


def _init_source(given: str) -> tuple[str, str, dict[str, list[int]], str] | str:
    """(kind "dcp" or "safetensors", path, {tensor: shape} of the model there, what it is for the log line) for
    an `init_from` value; or why it cannot be used (the ConfigError's text). Reads headers only."""
    path = Path(given)
    if not path.exists():
        return f"init_from={given} does not exist (on rank 0's host): {_INIT_FIX} that this job can read"
    if path.is_dir() and not (path / MARKER).exists() and not _STEP_DIR.match(path.name):
        if (path / "model.safetensors").is_file() and not step_dirs(path):
            path = path / "model.safetensors"  # an exported model folder
        else:
            newest = next((p for _, p in step_dirs(path) if why_invalid(p) is None), None)
            if newest is None:
                return f"init_from={given} holds no complete checkpoint (no step-N folder with its {MARKER}): {_INIT_FIX}"
            path = newest
    if path.is_dir():
        if (why := why_invalid(path)) is not None:
            return f"init_from={given} is not a complete checkpoint ({why}): {_INIT_FIX}"
        shapes = _dcp_model_shapes(path)
        if isinstance(shapes, str):
            return f"init_from={given}: {shapes}: {_INIT_FIX}"
        marker = json.loads((path / MARKER).read_text())
        writer = Owner(marker.get("run_id")).name if marker.get("run_id") else "a run without a run id"
        return "dcp", str(path), shapes, f"{path.name} of {writer}"
    shapes = _safetensors_shapes(path)
    if isinstance(shapes, str):
        return f"init_from={given}: {shapes}: {_INIT_FIX}"
    return "safetensors", str(path), shapes, "a safetensors file"


def _dcp_model_shapes(path: Path) -> dict[str, list[int]] | str:
    """{parameter: global shape} of the "model" part of a DCP checkpoint, from its .metadata; or why not."""
    try:
        entries = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:
        return f"its .metadata cannot be read ({_causes(e)[0]})"
    shapes = {k.removeprefix("model."): list(m.size) for k, m in entries.items()
              if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    return shapes or "it holds no model tensors"


def _safetensors_shapes(path: Path) -> dict[str, list[int]] | str:
    """{tensor: shape} from a safetensors file's header; or why not."""
    try:
        from safetensors import safe_open
    except ImportError:
        return "reading a safetensors file needs the safetensors package, which this image lacks"
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except Exception as e:
        return f"not a readable safetensors file ({_causes(e)[0]})"


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path, device="cpu")


_FOLDER_FIX = "point checkpoint_dir at a folder this job can write, or fix the folder's permissions or mount"


def _folder_problem(root: Path, needed: int, basis: str) -> str | None:
    """Why `root` cannot take the next save (made when missing, a probe file written and removed), or None."""
    if root.exists() and not root.is_dir():
        return f"the checkpoint folder {root} is a file: remove it, or point checkpoint_dir elsewhere"
    probe = root / f".write-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
        probe.unlink()
    except OSError as e:
        return f"the checkpoint folder {root} is not writable ({_os_error(e)}): {_FOLDER_FIX}"
    free = shutil.disk_usage(root).free
    if free < needed:
        return (f"the checkpoint folder {root} has {_bytes(free)} free ({free} bytes) and the next checkpoint needs "
                f"about {_bytes(needed)} ({needed} bytes: {basis}, x{SPACE_MARGIN} + {_bytes(SPACE_EXTRA_BYTES)}): "
                "give the instance a larger volume (instance.volume_gb), lower keep_checkpoints, or free space there")
    return None


def _full_message(name: str, root: Path, path: Path) -> str:
    if name not in ("ENOSPC", "EDQUOT"):
        what = {"EROFS": "the file system became read-only"}.get(name, "permission denied")
        return (f"the checkpoint folder {root} is no longer writable: {what} ({name}) while writing checkpoint "
                f"{path.name}: {_FOLDER_FIX} (a read-only remount follows a disk error: the instance's volume, or "
                "the file system's health)")
    free = ""
    with contextlib.suppress(OSError):
        free = f", {_bytes(shutil.disk_usage(root).free)} free now"
    what = "no space left on device" if name == "ENOSPC" else "disk quota exceeded"
    return (f"{what} ({name}) while writing checkpoint {path.name} in {root}{free}: give the instance a larger "
            "volume (instance.volume_gb), lower keep_checkpoints, or point checkpoint_dir at a larger disk")


def _unwritable(error: BaseException) -> str | None:
    """The errno name ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM") when an error, its cause or context, or a
    rank's failure inside a DCP CheckpointException says the disk is full or the folder cannot be written; None
    otherwise."""
    for e in error_chain(error):
        if isinstance(e, OSError) and e.errno in _UNWRITABLE_ERRNOS:
            return _UNWRITABLE_ERRNOS[e.errno]
        if not isinstance(getattr(e, "failures", None), dict) and _DISK_FULL_TEXT.search(str(e)):
            return "EDQUOT" if "quota" in str(e).lower() else "ENOSPC"
    return None


def _write_failed(error: BaseException) -> bool:
    """torch's C++ writer failed a write (inline_container.cc: "file write failed", "unexpected pos")."""
    text = str(error)
    return "file write failed" in text or "unexpected pos" in text


def _os_error(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"{name}: {e.strerror}" if name and e.strerror else str(e)


def _bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def _global_bytes(t: torch.Tensor) -> int:
    """A tensor's bytes in a checkpoint: a DTensor's global shape, not this rank's shard."""
    return t.numel() * t.element_size()  # DTensor.numel() is the global count


def _moments(optimizer: torch.optim.Optimizer | None) -> int:
    """Per-parameter state tensors an optimizer keeps: Adam-style (betas) two, SGD with momentum one."""
    if optimizer is None:
        return 0
    if "betas" in optimizer.defaults:
        return 2
    return 1 if optimizer.defaults.get("momentum") else 0


def _host_budget() -> int | None:
    """Pinned staging may take a quarter of this host's memory, shared by its ranks; beyond, saves are
    written synchronously (slower, but no memory pressure next to the data loaders)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return total // 4 // max(1, ranks_here)


def _write_atomic(path: Path, text: str) -> None:
    # Named for this host and process: on a folder every host shares (FSx), each host's first rank writes the
    # same marker, and one temporary name would be renamed away under the other.
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
