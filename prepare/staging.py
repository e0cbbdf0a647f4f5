"""Output folders written whole or not at all: a preparer writes each split into a partial folder beside its place
(`.train.partial`) and moves it into place once every split is written, so an interruption (Ctrl-C) or an error
leaves the output as it was, and a rerun replaces a split rather than mixing two."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
INTERRUPTED = 130  # a shell's status for an interrupt


class StagedFolder:
    """`final`'s contents, written in `path` (beside it) until `publish`."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.path = final.with_name(f".{final.name}.partial")
        shutil.rmtree(self.path, ignore_errors=True)  # an interrupted run's leftovers
        self.path.mkdir(parents=True)

    def publish(self) -> None:
        shutil.rmtree(self.final, ignore_errors=True)
        self.path.rename(self.final)

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def written_whole(folders: list[StagedFolder], write: Callable[[], T]) -> T:
    """`write()`'s result once every folder is in place; on any exception (KeyboardInterrupt too) none is, and the
    partial ones are gone."""
    try:
        result = write()
    except BaseException:
        for folder in folders:
            folder.discard()
        raise
    for folder in folders:
        folder.publish()
    return result


def interrupted(out: Path) -> int:
    """What a preparer's main says and returns on Ctrl-C."""
    print(f"interrupted: {out} is as it was (the partial splits were removed); run the command again", file=sys.stderr)
    return INTERRUPTED
