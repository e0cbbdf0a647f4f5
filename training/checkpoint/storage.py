"""One checkpoint folder's writes: a `step-N` folder written (synchronously or in the background), marked
complete, and the older ones pruned, by the attempt that still owns the folder.

Async saves (`async_checkpoint`) stage through `training.checkpoint.staging.PinnedStager`: the loop stalls
for the device->host copy into reused pinned buffers; the write overlaps the next steps. Each save logs its
stall and its total time; `age()` is the seconds since the newest complete checkpoint (`checkpoint_age_s`).

Only finite steps are saved. Every save takes the step's non-finite streak (training.metrics.meter, the max over the
ranks): a step whose loss or gradient norm is NaN/Inf on any rank is not saved (one line says so), so the
newest checkpoint is always a finite one. Pruning keeps the newest K at or below the step just written:
steps above it are left from before a fallback (below) and never push a good one out.

Which attempt of a run may write here: the one with the newest epoch (training.checkpoint.fencing). Each attempt claims the
folder at its restore and records its epoch in every marker; before it writes a step, and before it marks one or
prunes, it reads the claim again, and an older attempt stops (SUPERSEDED) rather than overwrite or prune the newer one's.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch.distributed as torch_dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from contract.container import FENCE_KEY
from contract.failures import FailureCode
from contract.hyperparameters import TrainConfig
from training.checkpoint import fencing
from training.checkpoint.cadence import Cadence
from training.checkpoint.disk import folder_fix, host_budget, os_error, unwritable_is_a_failure
from training.checkpoint.markers import (
    CHECKSUM,
    MARKER,
    hash_when_written,
    hash_written_here,
    remove_step,
    step_dirs,
    write_atomic,
)
from training.checkpoint.ownership import Owner
from training.checkpoint.staging import PinnedStager
from training.environment import container
from training.metrics.logger import strict_json
from training.parallel.process_group import Dist
from training.resilience.outcome import TrainingFailure

# DCP warns that it assumes one process when there is no process group: that is the `single` strategy, on
# purpose. Silenced process-wide (an async save warns from its own thread) and around each call (for
# callers that reset the filters, such as pytest).
_ONE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"

# Tests only: a stop-time save sleeps this long before it is marked complete (a writer slower than torchrun's
# old 30 s grace, without writing gigabytes).
ENV_TEST_STOP_SAVE_DELAY = "TRAINING_TEST_STOP_SAVE_DELAY_S"
warnings.filterwarnings("ignore", message=_ONE_PROCESS_WARNING)


@contextlib.contextmanager
def quiet_in_one_process():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ONE_PROCESS_WARNING)
        yield


class CheckpointStorage:
    """The checkpoint folder as this attempt writes it: `write` a step (async through pinned staging, or at once),
    `wait` for a pending one, mark it complete with every rank's sizes and checksums, prune to the newest K steps
    complete on every host. Collective throughout; records each save's times in the run's `Cadence`."""

    def __init__(self, cfg: TrainConfig, dist: Dist, parts: dict[str, Stateful], owner: Owner,
                 global_batch: int | None, cadence: Cadence) -> None:
        self.root = Path(cfg.checkpoint_dir)
        self.global_batch = global_batch  # recorded in each marker: a resume keeps it (recorded_global_batch)
        self.dist, self.parts, self.owner, self.cadence = dist, parts, owner, cadence
        self.keep = cfg.effective_keep_checkpoints
        self.async_save = cfg.async_checkpoint
        # An async save: its write-then-hash future (this rank's {file: (size, crc)}), folder, step, start.
        self.pending: tuple[Future, Path, int, float] | None = None
        self.stopping = False  # the stop-time save (the tests' injected delay applies to it alone)
        self._stager = PinnedStager(budget_bytes=host_budget()) if self.async_save else None
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-hash") if self.async_save else None
        # The background save runs collectives while the loop runs its own: they need a group of their own.
        self._async_group = (torch_dist.new_group(backend="gloo")
                             if self.async_save and torch_dist.is_initialized() else None)
        self.next_save_bytes: int | None = None  # this node's share of the next save (the restore's check)
        # The steps complete on every host: those the restore found complete everywhere, and those this run marked.
        # Pruning decides by it, never by this host's folder: with an instance's own folder (SageMaker's checkpoint
        # sync) no host holds another's files, so no step ever looks complete in one folder.
        self.complete: set[int] = set()
        self.host = container(os.environ).current_host
        self.epoch = fencing.current_epoch()  # this attempt's: it claims the folder, and a newer one stops it

    def write(self, step: int) -> Path:
        """Write step-N (a pending async save completed first); marked complete at once, or by `wait` for an async
        one. Collective: every rank calls it at the same step."""
        self.wait()  # an earlier async save must be complete (and marked) before the next one starts
        path = self.root / f"step-{step}"
        problem = None
        if self.dist.local_rank == 0:
            if claimed_by_newer := fencing.superseded(self.root, self.epoch, self.owner.name):
                problem = (FailureCode.SUPERSEDED, claimed_by_newer)
            else:
                try:
                    with self.unwritable_is_a_failure(path):
                        self.root.mkdir(parents=True, exist_ok=True)
                        if path.exists():  # a leftover of an attempt that died at this step, or one that failed to load
                            remove_step(path)
                except TrainingFailure as e:
                    problem = (e.code, str(e))
        self.agree(problem)  # a barrier that carries the folder's fate: one host's error must not hang the others
        began = time.time()
        self.cadence.began(step, began)
        with quiet_in_one_process(), self.unwritable_is_a_failure(path):
            if self._stager is not None:
                state = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in self.parts.items()}
                written = self._stager.save(state, str(path), process_group=self._async_group)
                hashed = self._hasher.submit(hash_when_written, written, path, self.dist)
                self.pending = (hashed, path, step, began)
                self._log(step, stall=time.time() - began, total=None)
                return path
            dcp.save(dict(self.parts), checkpoint_id=str(path))
        self._finish(path, step, began, stall=time.time() - began, hashed=None)
        return path

    def wait(self) -> None:
        """Complete a pending async save: wait for its writes and this rank's checksums, then mark it. Collective."""
        if self.pending is not None:
            hashed, path, step, began = self.pending
            self.pending = None
            with self.unwritable_is_a_failure(path):
                mine = hashed.result()
            self._finish(path, step, began, stall=None, hashed=mine)

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
        if self._hasher is not None:
            self._hasher.shutdown()

    def _finish(self, path: Path, step: int, began: float, stall: float | None,
                hashed: dict[str, tuple[int, str]] | None) -> None:
        delay = float(os.environ.get(ENV_TEST_STOP_SAVE_DELAY, "0") or 0)
        if delay and self.stopping:
            time.sleep(delay)
        self._mark_complete(path, step, hashed)
        total = time.time() - began
        self.cadence.completed(total)
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
            hashed = hash_written_here(path, self.dist) if path.exists() else {}
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
                with self.unwritable_is_a_failure(path):
                    write_atomic(path / MARKER, strict_json(marker, indent=1))
                if not self.stopping:  # a stop's save prunes nothing (see _prune)
                    self._prune(step)
            except TrainingFailure as e:
                problem = (e.code, str(e))
            except OSError as e:
                problem = (FailureCode.CHECKPOINT_UNWRITABLE,
                           f"the completion marker of {path} cannot be written ({os_error(e)}): {folder_fix()}")
        self.agree(problem)  # a barrier that carries the marker's fate: one rank's error must not hang the others
        self.complete.add(step)

    def agree(self, problem: tuple[FailureCode, str] | None) -> None:
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
                remove_step(p)

    def unwritable_is_a_failure(self, path: Path):
        """A disk full, or a folder no longer writable, while writing `path`: one line naming it (disk.py)."""
        return unwritable_is_a_failure(self.root, path, self.next_save_bytes)
