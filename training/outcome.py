"""How a run ended: the exported model (unless stopped), the status file, and the `Result` tests read; and how
it fails: `TrainingFailure`, whose one line (contract.failures) goes to the failure file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from contract.container import FAILURE_FILE
from contract.failures import FailureCode, failure_line
from contract.hyperparameters import TrainConfig
from training.distributed import Dist
from training.environment import failure_path, status_path
from training.export import save_model
from training.state import LoopState


@dataclass
class Result:
    status: str  # completed | early_stopped | stopped
    step: int
    best_val_loss: float
    model_path: Path | None = None


def finish(cfg: TrainConfig, dist: Dist, model, export_config: dict, state: LoopState) -> Result:
    """Export the model (not when stopped: the run is not done) and write the status file. Collective."""
    model_path = None
    if state.status != "stopped":
        model_path = save_model(model, dist, cfg.model_dir, {**export_config, "step": state.step})
    if dist.is_main:
        path = status_path(cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {"status": state.status, "step": state.step, "best_val_loss": state.best_val_loss}
        path.write_text(json.dumps(summary) + "\n")
        print(f"[train] {state.status} at step {state.step}", flush=True)
    return Result(state.status, state.step, state.best_val_loss, model_path)


class TrainingFailure(Exception):
    """An error this package understands: its code and one line naming the value and the fix.
    `exit_code` 1 (as an uncaught error would); configuration problems stay ConfigError (exit 2)."""

    exit_code = 1

    def __init__(self, code: FailureCode, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def line(self) -> str:
        return failure_line(self.code, str(self))


def write_failure(line: str, path: Path | None = None) -> Path | None:
    """Write the failure line once per host: the first rank's line stands (the others usually repeat it,
    or fail later because of it). Never raises: the exit code still tells SageMaker the job failed."""
    path = path or failure_path()
    try:
        if path != Path(FAILURE_FILE):  # /opt/ml/output exists in the container; never made elsewhere
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return None
    with os.fdopen(fd, "w") as f:
        f.write(line + "\n")
    return path
