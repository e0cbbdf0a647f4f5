"""`trainctl --version`: the version of the installed distribution, as pyproject.toml sets it."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

DISTRIBUTION = "sagemaker-training-platform"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def package_version() -> str:
    """The installed distribution's metadata (pip writes pyproject.toml's [project] version there); in a checkout
    run without installing it (python -m cli), pyproject.toml itself."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        with PYPROJECT.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown (not installed, and no pyproject.toml beside it)"
