"""Whether the checkpoint folder can take the next save, and a disk that fills or turns read-only mid-run.

Before the first step each node makes the folder, writes and removes a probe file, and checks its free
space against the next save (the newest checkpoint's size, else the model's tensors and the optimizer's
moments, times SPACE_MARGIN): a folder that fails ends the run as CHECKPOINT_UNWRITABLE before training, as
does a disk full during a save (ENOSPC or EDQUOT anywhere in the error's chain). That checks the next save,
not the whole run's keep_checkpoints + 1: a later full disk still ends with its own line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
from pathlib import Path

import torch

from contract.errors import error_chain
from contract.failures import FailureCode
from training.environment import checkpoint_folder_fix
from training.resilience.outcome import TrainingFailure

# The free-space check asks for the next save times this, plus a little for .metadata and the marker.
SPACE_MARGIN = 1.1

SPACE_EXTRA_BYTES = 16 << 20

# A full disk as torch's C++ writer reports it (inline_container.cc's "file write failed" says no more).
_DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|\[Errno 28\]|\berrno:? ?28\b", re.I)

# What ends a save for good, by errno: the disk full, or the folder no longer writable (a read-only remount after a
# disk error, a mount gone, permissions changed under the run).
_UNWRITABLE_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EDQUOT: "EDQUOT", errno.EROFS: "EROFS", errno.EACCES: "EACCES",
                      errno.EPERM: "EPERM"}

def folder_fix() -> str:
    return f"{checkpoint_folder_fix('a folder this job can write')}, or fix the folder's permissions or mount"



def folder_problem(root: Path, needed: int, basis: str) -> str | None:
    """Why `root` cannot take the next save (made when missing, a probe file written and removed), or None."""
    if root.exists() and not root.is_dir():
        return f"the checkpoint folder {root} is a file: remove it, or {checkpoint_folder_fix('another folder')}"
    probe = root / f".write-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
        probe.unlink()
    except OSError as e:
        return f"the checkpoint folder {root} is not writable ({os_error(e)}): {folder_fix()}"
    free = shutil.disk_usage(root).free
    if free < needed:
        return (f"the checkpoint folder {root} has {human_bytes(free)} free ({free} bytes) and the next checkpoint needs "
                f"about {human_bytes(needed)} ({needed} bytes: {basis}, x{SPACE_MARGIN} + {human_bytes(SPACE_EXTRA_BYTES)}): "
                "give the instance a larger volume (instance.volume_gb), lower keep_checkpoints, or free space there")
    return None

def full_message(name: str, root: Path, path: Path) -> str:
    if name not in ("ENOSPC", "EDQUOT"):
        what = {"EROFS": "the file system became read-only"}.get(name, "permission denied")
        return (f"the checkpoint folder {root} is no longer writable: {what} ({name}) while writing checkpoint "
                f"{path.name}: {folder_fix()} (a read-only remount follows a disk error: the instance's volume, or "
                "the file system's health)")
    free = ""
    with contextlib.suppress(OSError):
        free = f", {human_bytes(shutil.disk_usage(root).free)} free now"
    what = "no space left on device" if name == "ENOSPC" else "disk quota exceeded"
    return (f"{what} ({name}) while writing checkpoint {path.name} in {root}{free}: give the instance a larger "
            f"volume (instance.volume_gb), lower keep_checkpoints, or {checkpoint_folder_fix('a larger disk')}")


@contextlib.contextmanager
def unwritable_is_a_failure(root: Path, path: Path, next_save_bytes: int | None):
    """A disk full (or over quota), or a folder that is no longer writable, while writing `path` ends the run
    with a line naming it and the folder (a traceback otherwise)."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, TrainingFailure):
        raise
    except BaseException as e:
        name = unwritable(e) or (write_failed(e) and short_of_space(root, next_save_bytes) and "ENOSPC")
        if not name:
            raise
        raise TrainingFailure(FailureCode.CHECKPOINT_UNWRITABLE, full_message(name, root, path)) from None


def short_of_space(root: Path, next_save_bytes: int | None) -> bool:
    """The folder has less room than the next save needs (torch's C++ writer's failures name no errno)."""
    needed = next_save_bytes or SPACE_EXTRA_BYTES
    with contextlib.suppress(OSError):
        return shutil.disk_usage(root).free < needed
    return False


def unwritable(error: BaseException) -> str | None:
    """The errno name ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM") when an error, its cause or context, or a
    rank's failure inside a DCP CheckpointException says the disk is full or the folder cannot be written; None
    otherwise."""
    for e in error_chain(error):
        if isinstance(e, OSError) and e.errno in _UNWRITABLE_ERRNOS:
            return _UNWRITABLE_ERRNOS[e.errno]
        if not isinstance(getattr(e, "failures", None), dict) and _DISK_FULL_TEXT.search(str(e)):
            return "EDQUOT" if "quota" in str(e).lower() else "ENOSPC"
    return None

def write_failed(error: BaseException) -> bool:
    """torch's C++ writer failed a write (inline_container.cc: "file write failed", "unexpected pos")."""
    text = str(error)
    return "file write failed" in text or "unexpected pos" in text

def os_error(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"{name}: {e.strerror}" if name and e.strerror else str(e)

def human_bytes(n: float) -> str:
    if n < 1024:
        return f"{n:.0f} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"

def global_bytes(t: torch.Tensor) -> int:
    """A tensor's bytes in a checkpoint: a DTensor's global shape, not this rank's shard."""
    return t.numel() * t.element_size()  # DTensor.numel() is the global count

def moments(optimizer: torch.optim.Optimizer | None) -> int:
    """Per-parameter state tensors an optimizer keeps: Adam-style (betas) two, SGD with momentum one."""
    if optimizer is None:
        return 0
    if "betas" in optimizer.defaults:
        return 2
    return 1 if optimizer.defaults.get("momentum") else 0

def host_budget() -> int | None:
    """Pinned staging may take a quarter of this host's memory, shared by its ranks; beyond, saves are
    written synchronously (slower, but no memory pressure next to the data loaders)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return total // 4 // max(1, ranks_here)
