"""Helpers for the tests of jobs of several instances (`trainctl local --hosts N`, cli/container_emulator.py):
tests/training/test_many_hosts.py (run on every tested torch) and tests/cli/test_local_hosts.py (the pinned one)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

from tests.training.helpers import LOCAL_HPS, create_request
from training.checkpoint.markers import why_invalid

HPS = {**LOCAL_HPS, "max_steps": 8, "checkpoint_interval": 2, "keep_checkpoints": 2, "eval_interval": 0}


def two_hosts(hps: dict) -> dict:
    request = create_request(hps)
    request["ResourceConfig"]["InstanceCount"] = 2
    return request


def complete_steps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("step-*") if why_invalid(p) is None)


def rank_files(step: Path) -> set[str]:
    return {p.name for p in step.glob("__*.distcp")}


def reached(metrics: Path, step: int) -> bool:
    return metrics.exists() and any(json.loads(line).get("step", 0) >= step
                                    for line in metrics.read_text().splitlines() if line.strip())


def when(condition, action, done: threading.Event) -> threading.Thread:
    """Run `action` once `condition()` holds (polled), unless `done` is set first or two minutes pass."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not done.is_set():
            if condition():
                action()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def stop_this_process() -> None:
    """SIGTERM to this process: trainctl local's, a stop of every instance (as SageMaker's reaches each one)."""
    os.kill(os.getpid(), signal.SIGTERM)


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (torchrun starts its workers in sessions of their own)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += parents.get(found[-1], [])
    return found


def kill(pids: list[int]) -> None:
    """SIGKILL: an instance lost, or a process the kernel ended, with no chance to write a word."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
