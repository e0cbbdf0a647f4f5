"""Where trainctl writes for people (stdout); errors go to cli.errors.stderr."""

from __future__ import annotations

from rich.console import Console


def out() -> Console:
    """stdout for people. Made per call so that it sizes itself to the terminal (or COLUMNS) of this run."""
    return Console(soft_wrap=True, highlight=False)
