"""Which attempt of a run may write its checkpoint folder: the one with the newest epoch.

Every attempt of a run gets an epoch that grows with each attempt (contract.container.ENV_EPOCH: the launcher sets
it; `trainctl local` counts its own invocations in the checkpoint folder, cli/container_emulator.py). At its start an
attempt claims the folder by writing its epoch into FENCE there, unless a newer one already did. Before it writes a
step, and before it marks one complete or prunes, it reads FENCE again: a newer epoch there means another attempt of
the run (one the launcher lost track of, or a second resume) has taken over, and this one stops without writing, so
the newer attempt's checkpoints are never overwritten or pruned from under it. The epoch is also recorded in every
completion marker.

Where this reaches: a folder both attempts see, as a shared file system (FSx) or one machine's folder. On SageMaker's
own checkpoint folder an instance sees S3 only as it was when its job started (the sync downloads once): a job
started later claims S3 in a FENCE the earlier job never sees, so there the launcher's lease keeps a second job from
starting at all. An attempt without an epoch (a run started by hand, tests) claims nothing and is never fenced.
"""

from __future__ import annotations

import json
import os
import socket
import typing
from pathlib import Path

from contract.container import ENV_EPOCH, FENCE_KEY, fence_claim
from contract.container import FENCE_FILE as FENCE


def current_epoch(env: typing.Mapping[str, str] | None = None) -> int | None:
    """This attempt's epoch (contract.container.ENV_EPOCH), or None where it is unset or not a whole number."""
    value = (os.environ if env is None else env).get(ENV_EPOCH, "")
    return int(value) if value.isdigit() else None


def superseded(root: Path, mine: int | None, run: str) -> str | None:
    """Why this attempt must not write in `root` (a newer epoch claimed it), or None."""
    theirs = fence_claim(root) if mine is not None else None
    if theirs is None or theirs <= mine:
        return None
    return (f"{run}'s attempt of epoch {mine} found its checkpoint folder {root} claimed by epoch {theirs}: a newer "
            "attempt of the run writes there now, so this one stops without writing (it would overwrite or prune the "
            "newer one's checkpoints). If no newer attempt runs, the launcher lost track of this job: `trainctl "
            "runs` lists the run's attempts")


def claim(root: Path, mine: int | None, run: str) -> str | None:
    """Claim `root` for epoch `mine` (written whole: a temporary file of this host and process, then a rename), or
    say why not (`superseded`). An attempt without an epoch claims nothing."""
    if mine is None:
        return None
    if why := superseded(root, mine, run):
        return why
    if fence_claim(root) == mine:
        return None
    tmp = root / f"{FENCE}.{socket.gethostname()}-{os.getpid()}.tmp"
    tmp.write_text(json.dumps({FENCE_KEY: mine}) + "\n")
    os.replace(tmp, root / FENCE)
    return None
