"""Entry script: `sagemaker_program` names it. Runs as `python -m training.train`, as `training/train.py`,
and as the copy `train.py` that the source dir holds at its root next to the `training/` package.

Exit codes: 0 when the run completed, stopped early, or was stopped by SIGTERM/SIGINT after writing its
checkpoint; 2 for a configuration mistake (one line on stderr naming the field).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as the file training/train.py (not the source dir's root copy): make `import training` work.
    _here = Path(__file__).resolve().parent
    if _here.name == "training" and (_here / "__init__.py").exists():
        sys.path.insert(0, str(_here.parent))

from contract.errors import ConfigError  # noqa: E402
from training.config import parse_args  # noqa: E402
from training.distributed import StopFlag, setup, teardown  # noqa: E402


def main(argv: list[str] | None = None, *, stop_at: int | None = None) -> int:
    stop = StopFlag().install()  # first: a SIGTERM while torch imports must still stop cleanly
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
        if cfg.strategy == "smp":  # fail before any process group exists, with the image to use
            from training.strategies.smp import import_smp

            import_smp()
        dist = setup(cfg)
        try:
            from training.loop import train

            train(cfg, dist, stop, stop_at=stop_at)
        finally:
            teardown()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        stop.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
