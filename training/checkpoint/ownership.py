"""Whose a checkpoint is, and whether this run may resume it.

Whose a checkpoint is: the marker also records "run_id" (contract.container.ENV_RUN_ID, which the launcher
sets on every attempt of a run; null where it is unset: `trainctl local`, tests) and "fingerprint"
(training.job.fingerprint: the model, its shape, vocabulary size and master-weight dtype). On resume a step
whose recorded run id is another run's, or whose fingerprint differs from this run's, ends the run before
training (CHECKPOINT_UNREADABLE, naming both runs and what differs): a run must not continue another's
training as its own. A missing run id claims nothing: a step written without one (or by a marker from
before owners, "unknown owner") is adopted by any run with a line, so a run that took up the platform
mid-way is not stranded; a run without one resumes any step whose fingerprint matches, with a line. The
fingerprint is checked whatever the run ids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from contract.container import ENV_RUN_ID
from contract.failures import FailureCode
from training.checkpoint.markers import MarkedStep, first_few
from training.environment import checkpoint_folder_fix
from training.resilience.outcome import TrainingFailure


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


def check_owner(step: MarkedStep, mine: Owner, root: Path) -> str | None:
    """Raise when the step is another run's or another model's; otherwise the line to say when this run
    adopts a step whose owner it cannot confirm (None when it can). Every rank sees the same step."""
    name = Path(step.path).name
    if step.owner is None:
        return (f"[checkpoint] {name} has an unknown owner (its marker predates run ids and fingerprints): "
                f"{mine.name} resumes it")
    theirs = Owner(step.owner.get("run_id"), step.owner.get("fingerprint"))
    other_run = bool(theirs.run_id and mine.run_id and theirs.run_id != mine.run_id)
    differ = (differences(theirs.fingerprint, mine.fingerprint)
              if theirs.fingerprint is not None and mine.fingerprint is not None else [])
    if other_run or differ:
        raise TrainingFailure(FailureCode.CHECKPOINT_UNREADABLE,
                              foreign_message(root, step.path, theirs, mine, other_run, differ))
    if theirs.run_id == mine.run_id:
        return None
    if theirs.run_id is None:
        return f"[checkpoint] {name} was written by {theirs.name}: {mine.name} adopts it"
    return f"[checkpoint] {name} was written by {theirs.name}; {mine.name} resumes it"


def foreign_message(root: Path, path: str, theirs: Owner, mine: Owner, other_run: bool, differences: list[str]) -> str:
    """Why a step is not this run's to resume, naming both runs, what differs, and the fix."""
    why = ["it is another run's"] if other_run else []
    if differences:
        why.append(f"its model differs from this run's ({first_few(differences, 4)})")
    if other_run:
        own = checkpoint_folder_fix("this run's own folder (an empty one to start afresh)")
        fix = f"{own}, or start from that checkpoint's weights explicitly with init_from={path}"
    else:
        fix = ("run with the model settings it was written with (model, model_size, seq_len, the data's vocabulary), "
               f"or {checkpoint_folder_fix('an empty folder')} (init_from starts from weights of the same shape only)")
    return (f"{mine.name} cannot resume the checkpoint {Path(path).name} in {root}, written by {theirs.name}: "
            f"{'; '.join(why)}: {fix}")

def differences(theirs: dict, mine: dict) -> list[str]:
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
