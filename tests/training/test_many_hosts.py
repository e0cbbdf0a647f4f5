"""A job of several instances, as SageMaker runs one, emulated here by `trainctl local --hosts N`
(cli/container_emulator.py): each instance its own folders and torchrun, its checkpoint folder synced to one S3
prefix as CheckpointConfig syncs it (cli/checkpoint_sync.py). 2 instances x 1 process: the fewest processes that
are two hosts. What these check depends on the torch (the transports' errors when a peer goes): they run on every
tested torch; the emulator's other scenarios (pruning across instances, a cut upload, fewer instances, a shared
folder, the layouts, the first instance lost) are tests/cli/test_local_hosts.py's, on the pinned one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from cli.container_emulator import run_local
from contract.failures import FailureCode, parse_failure_line
from tests.training.helpers import create_request
from tests.training.instances import (
    HPS,
    descendants,
    kill,
    reached,
    two_hosts,
    when,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(corpus) -> dict[str, Path]:
    return {"train": corpus / "train", "validation": corpus / "validation"}


# The watchdog's floor at 3 s: it polls for its peers' alert every 0.3 s, and waits at most 2.9 s for their answers.
FAULTS = {**HPS, "max_steps": 400, "checkpoint_interval": 0, "hang_timeout_min_seconds": 3,
          "hang_timeout_startup_seconds": 60}
# From the kill to the end of every process: a hang detector (the verdict takes a few seconds; without it the
# survivors waited for the dead peer until the process group's 10-minute timeout or the hang watchdog's allowance).
END_BOUND_S = 60


@pytest.mark.parametrize("lost", ["algo-2"])
def test_losing_an_instance_ends_the_run_with_one_line_naming_it(tmp_path, data, capfd, lost):
    """Every process of one instance killed at once: its ranks stop answering the alert, the survivors end within the
    bound, and the line is `host_lost` naming that instance (a fresh, health-checked instance is the retry).
    tests/cli/test_local_hosts.py loses algo-1, whose torchrun holds the job's store, too."""
    work, procs = tmp_path / "work", {}
    done, killed = threading.Event(), []
    metrics = work / "algo-1" / "output" / "data" / "metrics.jsonl"
    watcher = when(lambda: reached(metrics, 3), lambda: (kill(descendants(procs[lost].pid)),
                                                         killed.append(time.monotonic())), done)
    code = run_local(two_hosts(FAULTS), workdir=work, nproc=1, hosts=2, data_dirs=data, on_start=procs.update)
    ended = time.monotonic()
    done.set()
    watcher.join(timeout=1)
    err = capfd.readouterr().err
    assert killed and code == 2, err[-3000:]
    assert ended - killed[0] < END_BOUND_S
    survivor = "algo-1" if lost == "algo-2" else "algo-2"
    line = (work / survivor / "output" / "failure").read_text().strip()
    failed, message = parse_failure_line(line)
    assert failed is FailureCode.HOST_LOST, line
    assert message.startswith(f"host {lost} ") and " was lost: " in message, message
    assert f"error: {line}" in err  # trainctl local prints it
    assert not (work / lost / "output" / "failure").exists()  # the lost instance wrote nothing


def test_a_process_killed_on_a_live_instance_is_named_by_the_survivor(tmp_path, data, capfd):
    """One of an instance's two processes SIGKILLed (the kernel's out-of-memory killer's way): its survivor names
    that rank as `process_lost` on a live host, which the launcher does not retry blindly."""
    work, procs = tmp_path / "work", {}
    done, killed = threading.Event(), []

    def rank_1() -> list[int]:
        workers = [pid for pid in descendants(procs["algo-1"].pid)
                   if "LOCAL_RANK=1" in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")]
        return workers[:1]

    watcher = when(lambda: reached(work / "output" / "data" / "metrics.jsonl", 3),
                   lambda: (kill(rank_1()), killed.append(time.monotonic())), done)
    code = run_local(create_request(FAULTS), workdir=work, nproc=2, data_dirs=data, on_start=procs.update)
    done.set()
    watcher.join(timeout=1)
    assert killed and code == 2
    line = (work / "output" / "failure").read_text().strip()
    failed, message = parse_failure_line(line)
    assert failed is FailureCode.PROCESS_LOST, line
    assert message.startswith("rank 1 on host algo-1 ended without a failure line while the other ranks of its host")


