"""trainctl's cache files (the price table, the platform's measured runs): where they live and how one is replaced.

~/.cache/trainctl/NAME ($XDG_CACHE_HOME/trainctl when set). A file is written whole beside itself and renamed over
the old one, so a reader never sees half of it (an interrupted write leaves the previous file).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_file(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainctl" / name


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically; OSError when it cannot (each caller says what goes on without it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
