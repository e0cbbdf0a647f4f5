"""What makes a `step-N` folder a complete checkpoint: its completion marker, the files' sizes and checksums.

Layout of `step-N/` (one format whether the run was single, ddp or fsdp):
  .metadata, __R_0.distcp  torch.distributed.checkpoint: rank R writes `__R_<n>.distcp` (n counts the writer's
                           threads, one by default), replicated tensors once; rank 0 also `.metadata` (the same
                           names on torch 2.8 and 2.13)
  COMPLETE.json            written last, atomically: every file's size ("files") and CRC-32 ("checksums"); a
                           step without it, or whose files do not have its sizes, is skipped on resume (a run
                           killed mid-write, a bad sync)
What the folder holds is `training.checkpoint.state`'s parts. DCP reshards on load, so a checkpoint written by N ranks
resumes on M, and a DDP one resumes into FSDP.

Checksums: zlib.crc32 (standard library). `python -m bench.checksum` (1 GiB in the page cache, on the 2-core
development machine) read 2.9 GiB/s for crc32 = 0.34 s per GiB, adler32 2.6, sha1 1.5, sha256 1.4, blake2b 0.8,
md5 0.6; xxhash's xxh3 6.2 and google-crc32c are dependencies the SageMaker image does not have. Each rank
hashes the files it wrote, right after writing them (from the page cache; an async save hashes in a thread
of its own, zlib releasing the GIL), and the marker gathers every rank's share. On resume the marker's files
are shared out over all ranks by size, each hashes its share and the ranks agree: a 1 TB checkpoint on 64
ranks is 16 GiB, about 5 s, per rank (slower where the disk reads slower than that). A multi-node run
checks each file on the node of the rank it falls to. Markers without checksums (written before they
existed) are accepted on their sizes.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import re
import shutil
import socket
import tempfile
import zlib
from concurrent.futures import Future
from pathlib import Path
from typing import NamedTuple

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from contract.container import CHECKPOINT_MARKER
from training.parallel.process_group import Dist

MARKER = CHECKPOINT_MARKER

CHECKSUM = "crc32"  # the marker's algorithm: zlib.crc32 of each file, 8 hex digits

_READ_CHUNK = 8 << 20  # bytes per read while hashing, into one reused buffer

STEP_DIR = re.compile(r"^step-(\d+)$")

_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's FileSystemWriter: `__<rank>_<n>.distcp`


def step_number(path: Path) -> int:
    return int(path.name.removeprefix("step-"))

def folder_view(root: Path) -> dict[str, str | None]:
    """{step-N: why it is not complete here, or None} for every step folder of this host's checkpoint folder."""
    return {path.name: why_invalid(path) for _, path in step_dirs(root)}

def partial_reason(partial: dict[str, str], hosts: int) -> str:
    """Why a step is not complete: the reason, once when every host gives it; else each host's, and on how many of
    the hosts it is complete (a step one host holds whole and another does not)."""
    reasons = set(partial.values())
    if len(partial) == hosts and len(reasons) == 1:
        return reasons.pop()
    return "; ".join(f"on {host}: {why}" for host, why in sorted(partial.items())) + \
        f" (complete on {hosts - len(partial)} of {hosts} hosts)"

def remove_step(path: Path) -> None:
    """Remove a step folder, its completion marker first: a step half removed never looks complete (a resume on
    this folder, or another host removing the same folder on a shared one)."""
    with contextlib.suppress(OSError):
        (path / MARKER).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)

def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Every `step-N` folder, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
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


class MarkedStep(NamedTuple):
    """A complete step as its marker describes it; `checksums` None for a marker from before them, `owner`
    ({"run_id", "fingerprint"}) None for a marker from before owners."""

    path: str
    sizes: dict[str, int]
    checksums: dict[str, str] | None
    owner: dict | None = None


def hash_when_written(written: Future, path: Path, dist: Dist) -> dict[str, tuple[int, str]]:
    """An async save's thread: wait for the write (its error re-raised), then hash this rank's files."""
    written.result()
    return hash_written_here(path, dist)

def hash_written_here(path: Path, dist: Dist) -> dict[str, tuple[int, str]]:
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

def share(sizes: dict[str, int], rank: int, world: int) -> list[str]:
    """The files `rank` verifies: the largest first, each to the least loaded rank (the same on every rank)."""
    loads = [(0, r) for r in range(world)]
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        load, r = heapq.heappop(loads)
        if r == rank:
            mine.append(name)
        heapq.heappush(loads, (load + sizes[name], r))
    return mine

def write_atomic(path: Path, text: str) -> None:
    # Named for this host and process: on a folder every host shares (FSx), each host's first rank writes the
    # same marker, and one temporary name would be renamed away under the other.
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

def first_few(items: list[str], n: int) -> str:
    """The first `n` items joined for a one-line message, and how many more there are."""
    more = f" and {len(items) - n} more" if len(items) > n else ""
    return "; ".join(items[:n]) + more
