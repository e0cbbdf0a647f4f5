"""How a run ended: the exported model (unless stopped), the status file, and the `Result` tests read; and how
it fails: `TrainingFailure`, whose one line (contract.failures) goes to the failure file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from contract.failures import FailureCode, failure_line
from contract.hyperparameters import TrainConfig
from training.checkpoint.state import LoopState
from training.environment import DataMissing, status_path, write_failure  # noqa: F401 (write_failure: moved beside failure_path, the watchdog writes it too)
from training.export import save_model
from training.metrics.logger import strict_json
from training.parallel.process_group import Dist
from training.resilience.heartbeat import Heartbeat


@dataclass
class Result:
    status: str  # completed | early_stopped | stopped
    step: int
    best_val_loss: float
    model_path: Path | None = None


def finish(cfg: TrainConfig, dist: Dist, model, export_config: dict, state: LoopState, *,
           heartbeat: Heartbeat | None = None, stragglers: list[dict] = ()) -> Result:
    """Export the model (not when stopped: the run is not done; `heartbeat` knows the export as a phase) and write
    the status file, with the ranks named as persistently slow (`stragglers`). Collective."""
    model_path = None
    if state.status != "stopped":
        model_path = save_model(model, dist, cfg.model_dir, {**export_config, "step": state.step}, heartbeat)
    if dist.is_main:
        path = status_path(cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {"status": state.status, "step": state.step, "best_val_loss": state.best_val_loss,
                   "stragglers": list(stragglers)}  # the ranks named as persistently slow
        path.write_text(strict_json(summary) + "\n")
        print(f"[train] {state.status} at step {state.step}", flush=True)
    return Result(state.status, state.step, state.best_val_loss, model_path)


def known_failure(error: Exception) -> FailureCode:
    """The failure code of an error the package knows: a TrainingFailure's own, a ConfigError's (DataMissing:
    data_missing; any other: config_invalid)."""
    if isinstance(error, TrainingFailure):
        return error.code
    return FailureCode.DATA_MISSING if isinstance(error, DataMissing) else FailureCode.CONFIG_INVALID


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
