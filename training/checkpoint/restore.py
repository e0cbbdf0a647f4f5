"""Resuming: the newest step complete on every host, this run's own, that verifies and loads; older ones when
it does not.

A step that fails verification or fails to load falls back to the previous complete step, with a line
saying why. Loading it overwrites every part (model, optim, scheduler, data, scaler, loop, rng), so what a
failed load wrote in place does not survive. When no step loads, CHECKPOINT_UNREADABLE carries torch's own
causes (the per-rank errors inside DCP's CheckpointException), once each.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from contract.failures import FailureCode
from training.checkpoint import fencing
from training.checkpoint.disk import SPACE_EXTRA_BYTES, SPACE_MARGIN, folder_problem, global_bytes, moments
from training.checkpoint.markers import (
    CHECKSUM,
    MARKER,
    MarkedStep,
    file_checksum,
    first_few,
    folder_view,
    partial_reason,
    share,
    step_dirs,
    step_number,
)
from training.checkpoint.ownership import check_owner
from training.checkpoint.storage import CheckpointStorage, quiet_in_one_process
from training.parallel.process_group import Dist
from training.resilience.outcome import TrainingFailure


class Restore:
    """One restore of `storage`'s folder: check it can take the next save, find the complete steps, verify and
    load the newest that is this run's. Collective throughout."""

    def __init__(self, storage: CheckpointStorage, init_from: str | None = None) -> None:
        self.storage, self.init_from = storage, init_from  # init_from: only named in the resume line
        self.root, self.dist, self.parts, self.owner = storage.root, storage.dist, storage.parts, storage.owner
        self.host, self.epoch = storage.host, storage.epoch

    def run(self) -> Path | None:
        """Check the folder can take the next save, then load the newest complete step that is this run's,
        verifies and loads into the parts, in place, falling back to older ones. None when there is none (then
        the model's weights come from `init_from` when it is set: training.checkpoint.init_from). Collective."""
        steps = self._complete_steps()
        self._check_folder(steps[0].sizes if steps else None)
        self.storage.complete = {step_number(Path(step.path)) for step in steps}
        failed: list[tuple[str, str]] = []  # (step-N, why it could not be resumed)
        for step in steps:
            path = Path(step.path)
            adopted = check_owner(step, self.owner, self.root)
            why, verified = self._verify(step)
            why = why or self._load(path)
            if why is None:
                self._resumed(path, failed, verified, adopted)
                return path
            failed.append((path.name, why))
            self.storage.complete.discard(step_number(path))
        if failed:
            raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE, unreadable_message(self.root, failed))
        return None

    def _complete_steps(self) -> list[MarkedStep]:
        """Every step complete in every host's folder, newest first (partial ones newer than the newest complete
        one are named in a line, with the hosts they are partial on), agreed by all. Each host's first rank looks
        at its own folder: a step whose files reached the job's S3 prefix from one host but not another is
        partial everywhere (every host downloads the same prefix), and on a folder shared by every host (FSx)
        the views are equal."""
        view = folder_view(self.root) if self.dist.local_rank == 0 else None
        views = [(host, seen) for host, seen in self.dist.all_gather_object((self.host, view)) if seen is not None]
        found: list[MarkedStep] = []
        if self.dist.is_main:
            for _, path in step_dirs(self.root):
                reasons = {host: seen.get(path.name, "absent") for host, seen in views}
                partial = {host: why for host, why in reasons.items() if why is not None}
                if not partial:
                    marker = json.loads((path / MARKER).read_text())
                    checksums = marker.get("checksums") if marker.get("checksum") == CHECKSUM else None
                    owned = "run_id" in marker or "fingerprint" in marker
                    owner = {"run_id": marker.get("run_id"), "fingerprint": marker.get("fingerprint")} if owned else None
                    found.append(MarkedStep(str(path), marker["files"], checksums, owner))
                elif not found:
                    print(f"[checkpoint] skipping {path.name}: {partial_reason(partial, len(views))}", flush=True)
        return self.dist.broadcast_object(found)

    def _verify(self, step: MarkedStep) -> tuple[str | None, str]:
        """(why the step's files do not match their marker's checksums, or None; a note for the resume line).
        The files are shared out over the ranks by size; the ranks agree. Collective."""
        if step.checksums is None:
            return None, "sizes checked: its marker has no checksums"
        began, path = time.time(), Path(step.path)
        bad = []
        for name in share(step.sizes, self.dist.rank, self.dist.world_size):
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
            return f"failed verification ({first_few(bad, 3)})", ""
        seconds = self.dist.max_float(time.time() - began)
        return None, f"{len(step.checksums)} checksums verified in {seconds:.2f} s over {self.dist.world_size} rank(s)"

    def _load(self, path: Path, parts: list[str] | None = None) -> str | None:
        """None when the step (its `parts`, default all) loaded on every rank; otherwise why, every rank's
        causes once each. Collective."""
        return load_parts(self.dist, self.parts, path, parts)

    def _resumed(self, path: Path, failed: list[tuple[str, str]], verified: str, adopted: str | None) -> None:
        if not self.dist.is_main:
            return
        for name, why in failed:
            print(f"[checkpoint] {name} {why}: resuming from {path.name}", flush=True)
        if adopted:
            print(adopted, flush=True)
        print(f"[checkpoint] resumed from {path} at step {step_number(path)} ({verified})", flush=True)
        if self.init_from:
            print(f"[checkpoint] init_from={self.init_from} ignored: the run resumes its own checkpoint", flush=True)

    def _check_folder(self, newest_sizes: dict[str, int] | None) -> None:
        """Each node's folder exists, takes a file, and has room for the next save; otherwise every rank fails
        with the first problem, before training. Collective."""
        total = sum(newest_sizes.values()) if newest_sizes else self._state_bytes()
        basis = "the newest checkpoint's size" if newest_sizes else "the model's tensors and optimizer moments"
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", self.dist.world_size) or self.dist.world_size)
        # Each rank writes about its 1/world of a checkpoint (DCP spreads replicated tensors over the ranks).
        share = total * min(ranks_here, self.dist.world_size) / self.dist.world_size
        self.storage.next_save_bytes = int(share * SPACE_MARGIN) + SPACE_EXTRA_BYTES
        problem = None
        if self.dist.local_rank == 0:
            unwritable = folder_problem(self.root, self.storage.next_save_bytes, basis)
            claimed_by_newer = None if unwritable else fencing.claim(self.root, self.epoch, self.owner.name)
            problem = ((FailureCode.CHECKPOINT_UNWRITABLE, unwritable) if unwritable else
                       (FailureCode.SUPERSEDED, claimed_by_newer) if claimed_by_newer else None)
        self.storage.agree(problem)

    def _state_bytes(self) -> int:
        """A checkpoint's bytes before one exists: every tensor of the model once by name (DCP writes a replica
        once; a DTensor at its global size), and the optimizer's moments of each trainable one. Reading the
        optimizer's own state is no option: DCP would initialize it with a step. Collective."""
        model = getattr(self.parts.get("model"), "model", None)
        if model is None:
            return 0
        kept = moments(getattr(self.parts.get("optim"), "optimizer", None))
        mine = {name: global_bytes(p) * (1 + (kept if p.requires_grad else 0))
                for name, p in model.named_parameters()}
        mine.update({name: global_bytes(b) for name, b in model.named_buffers()})
        merged: dict[str, int] = {}
        for sizes in self.dist.all_gather_object(mine):  # pipeline stages hold different names
            merged.update(sizes)
        return sum(merged.values())


def load_parts(dist: Dist, stateful: dict[str, Stateful], path: Path, parts: list[str] | None = None) -> str | None:
    """None when the step (its `parts`, default all) loaded on every rank; otherwise why, every rank's
    causes once each. Collective."""
    causes: list[str] = []
    try:
        with quiet_in_one_process():
            dcp.load({k: v for k, v in stateful.items() if parts is None or k in parts}, checkpoint_id=str(path))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException, each rank's error inside
        causes = error_causes(e)
    return load_failure(dist, causes)


def load_failure(dist: Dist, causes: list[str]) -> str | None:
    """Every rank's causes, once each, as the reason a load failed; None when no rank had one. A part's own
    load_state_dict can fail on one rank alone: every rank must fall back together. Collective."""
    causes = list(dict.fromkeys(c for rank_causes in dist.all_gather_object(causes) for c in rank_causes))
    return f"failed to load ({'; '.join(causes)})" if causes else None


def error_causes(error: BaseException, limit: int = 300) -> list[str]:
    """The messages under an error, once each: DCP's CheckpointException keeps each rank's
    (exception, traceback) in `.failures`, and its own text only names the ranks."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        found = [c for f in failures.values() for c in error_causes(f[0] if isinstance(f, tuple) else f, limit)]
        return list(dict.fromkeys(found))
    text = " ".join(str(error).split())
    if len(text) > limit:
        text = text[:limit] + "..."
    return [f"{type(error).__name__}: {text}" if text else type(error).__name__]

def unreadable_message(root: Path, failed: list[tuple[str, str]]) -> str:
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
