"""SageMaker's checkpoint sync (CheckpointConfig) between one instance's checkpoint folder and the run's S3 prefix,
on this machine: the prefix is a folder (`trainctl local --hosts N` keeps it under the work folder's `s3/`).

What SageMaker documents ("Checkpoints in Amazon SageMaker AI") and this copies:
- at the start, the whole prefix is downloaded into the instance's (empty) checkpoint folder; files that reach the
  prefix after that are not copied in;
- during training, new and changed files are uploaded, with a lag; a file deleted in the folder is deleted from
  the prefix too (only files this instance downloaded or uploaded: it knows no others);
- at the end of the job a last upload runs; on a stop or a Spot reclaim it may be cut short (`cut_at_stop`: an
  instance whose uploads end when the stop comes, as they would if it were terminated then).

With several instances each has its own folder syncing to the one prefix, so an instance sees only its own ranks'
new files until the next job starts. Uploads go through a temporary name and a rename, so the prefix never holds
a half-copied file, and two instances that upload the same key (each writes the step's completion marker) leave
one whole copy. A file is uploaded once it is unchanged between two looks: a file still being written waits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

_UPLOADING = ".uploading-"  # a copy in flight in the prefix: never downloaded, never counted


@dataclass(frozen=True)
class SyncSettings:
    """How the emulated sync behaves: `lag_s` between looks at the folder; `cut_at_stop`, the instances whose sync
    ends when a stop comes (nothing written after it reaches S3); the others upload everything at the end, a stop
    that the upload outlives."""

    lag_s: float = 0.5
    cut_at_stop: tuple[str, ...] = ()


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of every file under `root` but copies in flight."""
    found = {}
    if not root.is_dir():
        return found
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(_UPLOADING):
                continue
            path = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):  # deleted while we looked
                stat = path.stat()
                found[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return found


def _copy_whole(source: Path, target: Path) -> bool:
    """Copy through a temporary name and rename (the target is whole or absent); False when the source went."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{_UPLOADING}{os.getpid()}-{threading.get_ident()}-{target.name}")
    try:
        shutil.copyfile(source, partial)
    except FileNotFoundError:
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, target)
    return True


def _remove_empty_folders(root: Path, relative: str) -> None:
    folder = (root / relative).parent
    while folder != root and folder.is_dir():
        try:
            folder.rmdir()
        except OSError:  # not empty
            return
        folder = folder.parent


class CheckpointSync:
    """One instance's sync: `download()` before its processes start, `start()` the uploads while they run,
    `finish()` the last upload when they have exited."""

    def __init__(self, local: Path, prefix: Path, host: str, settings: SyncSettings | None = None) -> None:
        self.local, self.prefix, self.host = Path(local), Path(prefix), host
        self.settings = settings or SyncSettings()
        self.known: dict[str, tuple[int, int]] = {}  # what the prefix holds from this instance: (size, mtime) here
        self._seen: dict[str, tuple[int, int]] = {}  # the previous look: a file must be unchanged since
        self._stop = threading.Event()
        self._cut = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def download(self) -> int:
        """A fresh instance: its folder emptied, then the whole prefix copied in. Returns the files copied."""
        if self.local.exists():
            shutil.rmtree(self.local)
        self.local.mkdir(parents=True)
        self.prefix.mkdir(parents=True, exist_ok=True)
        for relative in _files(self.prefix):
            if _copy_whole(self.prefix / relative, self.local / relative):
                self.known[relative] = _files_one(self.local / relative)
        return len(self.known)

    def start(self) -> CheckpointSync:
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-sync-{self.host}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.settings.lag_s):
            self.sync_once()

    def stopping(self) -> None:
        """A stop came: an instance in `cut_at_stop` uploads and deletes nothing more."""
        if self.host in self.settings.cut_at_stop:
            with self._lock:
                self._cut = True

    def sync_once(self, *, settled: bool = False) -> int:
        """Propagate deletions, then upload new and changed files: those unchanged since the last look, or every
        one when `settled` (the processes have exited). Returns the files uploaded."""
        with self._lock:
            if self._cut:
                return 0
            now = _files(self.local)
            for relative in [r for r in self.known if r not in now]:
                (self.prefix / relative).unlink(missing_ok=True)
                _remove_empty_folders(self.prefix, relative)
                del self.known[relative]
            uploaded = 0
            for relative, stamp in sorted(now.items()):
                changed = self.known.get(relative) != stamp
                steady = settled or self._seen.get(relative) == stamp
                if not (changed and steady):
                    continue
                if _copy_whole(self.local / relative, self.prefix / relative):
                    self.known[relative] = stamp
                    uploaded += 1
                else:  # pruned between the look and the copy: leave no folder the copy made for it
                    _remove_empty_folders(self.prefix, relative)
            self._seen = now
            return uploaded

    def finish(self) -> int:
        """Stop the uploads, then the job's last upload (none where a stop cut the sync)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.sync_once(settled=True)


def _files_one(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns
