"""Entry script: `sagemaker_program` names it. Runs as `python -m training.train`, as `training/train.py`,
and as the copy `train.py` that the source dir holds at its root next to the `training/` package.

Each process trains (training.loop): one per GPU under torchrun (the toolkit's, or `trainctl local`'s),
or a single process for `single`. A stop reaches it as the stop file or a signal (training.parallel.process_group).

Exit codes: 0 when the run completed, stopped early, or was stopped by SIGTERM/SIGINT; 2 for a configuration
mistake; 1 for the other failures it knows. Every known failure also writes ONE line to the failure file
(contract.failures, training.environment.failure_path): SageMaker's FailureReason.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
import typing
from pathlib import Path

# A stop can arrive while torch imports (seconds): record it now, hand it to the StopFlag once it exists.
_EARLY_STOP: list[tuple[int, float]] = []
if __name__ == "__main__":
    for _sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_sig, lambda signum, frame: _EARLY_STOP.append((signum, time.time())))

if not __package__:
    # Run as the file training/train.py (not the source dir's root copy): make `import training` work.
    _here = Path(__file__).resolve().parent
    if _here.name == "training" and (_here / "__init__.py").exists():
        sys.path.insert(0, str(_here.parent))

from contract.errors import ConfigError  # noqa: E402
from contract.failures import FailureCode, failure_line  # noqa: E402
from training.config import parse_args  # noqa: E402
from training.environment import write_failure  # noqa: E402
from training.parallel.process_group import leave, setup, teardown  # noqa: E402
from training.resilience.outcome import TrainingFailure, known_failure  # noqa: E402
from training.resilience.stop import StopFlag  # noqa: E402


def main(argv: list[str] | None = None, *, stop_at: int | None = None) -> int:
    """The run in this process, which goes on afterwards (a test's): its process groups are torn down."""
    stop = _stop_flag()
    try:
        return _run(sys.argv[1:] if argv is None else argv, stop, stop_at)
    finally:
        # Here, not inside _run: once it returned, neither its frame nor a caught error's traceback holds the
        # model, whose groups must all go for teardown to end their threads (training.parallel.process_group.teardown).
        teardown()
        stop.uninstall()


def entry() -> typing.NoReturn:
    """The entry script's run: once its outcome is written the process ends at once, its exit code that outcome's
    (training.parallel.process_group.leave: tearing the groups down can deadlock, and the process has nothing left to do). An
    error the package does not know is printed with its traceback, as Python would, and ends it with 1."""
    try:
        code = _run(sys.argv[1:], _stop_flag(), None)
    except BaseException:  # noqa: BLE001 (whatever it is, the process must still end)
        traceback.print_exc()
        code = 1
    leave(code)


def _stop_flag() -> StopFlag:
    stop = StopFlag.for_environment().install()
    for signum, at in _EARLY_STOP:
        stop.raise_(signum, at)
    return stop


def _run(args: list[str], stop: StopFlag, stop_at: int | None) -> int:
    try:
        cfg = parse_args(args)
        if cfg.strategy == "smp":  # fail before any process group exists, with the image to use
            from training.parallel.strategies.smp import import_smp

            import_smp()
        dist = setup(cfg)
        from training.loop import train

        train(cfg, dist, stop, stop_at=stop_at)
    except ConfigError as e:
        return _fail(known_failure(e), str(e), 2)
    except TrainingFailure as e:
        return _fail(e.code, str(e), e.exit_code)
    return 0


def _fail(code: FailureCode, message: str, exit_code: int) -> int:
    """One line on stderr (the log) and in the failure file; no traceback for an error the package knows."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    write_failure(failure_line(code, message))
    return exit_code


if __name__ == "__main__":
    entry()
