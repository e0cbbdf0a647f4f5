"""`sourcedir.tar.gz`: what `sagemaker_submit_directory` points at, built so the same code gives the same bytes.

Build-time code: the CDK app (platform_constructs.source_bundle) and `trainctl local` pack with it; the
runtime package it packs knows nothing of it.

The archive holds `train.py` at its root (a copy of training/train.py, the `sagemaker_program`) and the
`training/` and `contract/` packages beside it, so `import training...` works from /opt/ml/code. Entries are sorted, owner,
times and modes are fixed and the gzip header carries no name or time: the CDK asset hash then changes
only when the code does, and an unchanged package is never re-uploaded or redeployed.

No requirements.txt: the toolkit would pip-install it at start, which fails on private subnets without a
NAT, and everything the package needs is in the PyTorch training images (see export.py for safetensors).
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The runtime packages the source dir carries: the training package and the one module it imports.
PACKAGES = ("training", "contract")
ENTRY_SCRIPT = "training/train.py"
ARCHIVE_NAME = "sourcedir.tar.gz"
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


def source_files(root: Path = ROOT) -> dict[str, Path]:
    """Archive name -> file on disk, for every file the archive holds."""
    files = {"train.py": root / ENTRY_SCRIPT}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or _SKIP_DIRS & set(rel.parts) or path.suffix in _SKIP_SUFFIXES:
                continue
            files[rel.as_posix()] = path
    return files


def build_archive_bytes(root: Path = ROOT) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in sorted(source_files(root).items()):
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


def build_sourcedir(dest: Path) -> Path:
    """Write `dest/sourcedir.tar.gz` (or `dest` itself when it names a .tar.gz) and return its path.

    An existing file with the same bytes is left untouched, so its modification time does not change.
    """
    dest = Path(dest)
    target = dest if dest.name.endswith(".tar.gz") else dest / ARCHIVE_NAME
    data = build_archive_bytes()
    if target.exists() and target.read_bytes() == data:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target
