"""Where trainctl writes for people (stdout); errors go to cli.errors.stderr."""

from __future__ import annotations

import os

from rich.console import Console

# Written to a file or a pipe (CI logs, `| less -S`), tables keep their rows whole rather than fold at rich's
# 80-column default; a terminal, or COLUMNS, still sets the width.
PIPE_WIDTH = 160


def out() -> Console:
    """stdout for people. Made per call so that it sizes itself to the terminal (or COLUMNS) of this run."""
    console = Console(soft_wrap=True, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console
