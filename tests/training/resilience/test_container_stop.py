"""SageMaker's stop through the platform's container entry, on the torch of the environment (CI runs this file on
the pinned torch and on the default image's, 2.8.0, whose torchrun gives a fixed 30 s after a signal).

What runs is what the container would run, as far as it exists here: the entry shell of jobs.render.container_entry,
as rendered into ContainerEntrypoint (but for the stop file's path), in the working folder where it finds a stand-in for the image's
start_with_right_hostname.sh. The stand-in, like the image's script and the toolkit under it, runs the
toolkit's torch_distributed command (torchrun over the entry script, 2 processes) as a child, without exec,
forwarding no signal. SIGTERM goes to the entry shell only, as SageMaker sends it to PID 1. torchrun's grace
after a signal is cut to TORCHRUN_GRACE_S (TORCH_ELASTIC_SHUTDOWN_TIMEOUT: torch 2.12+ reads it, and on 2.8 the
tests/training/resilience/torchrun_grace shim makes torchrun read it), and the stop-time save is made slower than that grace:
were torchrun signalled, it would kill the ranks mid-save. (It proves what a 35 s save against 2.8's fixed 30 s
proved, in seconds.)

The edge: the image's own script (its hostname shim, its CUDA compat step) and SageMaker's process launch
are not here.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from cli.container_emulator import prepare_layout, run_local
from contract.container import ENV_HOSTS, ENV_STOP_FILE, STOP_FILE
from jobs.render.container_entry import IMAGE_START, container_entrypoint
from tests.training.helpers import LOCAL_HPS, create_request, sigterm_at_step, weights
from training.checkpoint.storage import ENV_TEST_STOP_SAVE_DELAY
from training.environment import stop_file_path

pytestmark = pytest.mark.slow

# torchrun's grace after a signal, and a stop-time save 3 s longer (the SIGKILL would land mid-save), well inside
# SageMaker's 120 s.
TORCHRUN_GRACE_S = 3
SLOW_STOP_SAVE_S = TORCHRUN_GRACE_S + 3
TORCHRUN_FIXED_GRACE_S = 30  # torch.distributed.elastic's before 2.12
GRACE_SHIM = Path(__file__).parent / "torchrun_grace"


def grace_env() -> dict[str, str]:
    """The environment that gives torchrun TORCHRUN_GRACE_S after a signal, on every tested torch."""
    return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(TORCHRUN_GRACE_S),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(GRACE_SHIM), os.environ.get("PYTHONPATH")]))}


def container(tmp_path: Path, work: Path, data: dict, stop_file: Path) -> tuple[list[str], dict, Path]:
    """The rendered entry, its environment, and the folder it starts in (holding the image's stand-in)."""
    request = create_request({**LOCAL_HPS, "checkpoint_interval": 0})  # only the stop's own save
    cmd, env, code_dir = prepare_layout(request, work, 2, data,
                                        {ENV_STOP_FILE: str(stop_file), ENV_TEST_STOP_SAVE_DELAY: SLOW_STOP_SAVE_S})
    image_root = tmp_path / "image"
    image_root.mkdir()
    script = IMAGE_START.split()[1]
    (image_root / script).write_text(
        '[ "$1" = train ] || exit 64\n'  # the image's script starts the toolkit only for `train`
        f"cd {shlex.quote(str(code_dir / 'code'))}\n"
        f"{shlex.join(cmd)}\n")  # a child, no exec, no trap: the signal stops at PID 1
    # The rendered entry with one change: the stop file of this test rather than /tmp's, which a test run in
    # parallel with SM_HOSTS set would read.
    entry = [part.replace(STOP_FILE, str(stop_file)) for part in container_entrypoint()]
    assert entry != container_entrypoint()
    env = {**env, **grace_env()}
    return entry, env, image_root


def test_sagemakers_sigterm_to_the_container_entry_stops_the_ranks_after_a_slow_save(tmp_path, corpus,
                                                                                     two_rank_runs):
    data = {"train": corpus / "train", "validation": corpus / "validation"}
    work, stop_file = tmp_path / "work", tmp_path / "stop"
    entrypoint, env, image_root = container(tmp_path, work, data, stop_file)
    log = tmp_path / "container.log"
    with log.open("w") as out:
        shell = subprocess.Popen(entrypoint, cwd=image_root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        done, sent = threading.Event(), []
        watcher = sigterm_at_step(work / "output" / "data" / "metrics.jsonl", 3, done, sent, pid=shell.pid)
        code = shell.wait(timeout=300)
        done.set()
        watcher.join(timeout=1)
    took = time.monotonic() - sent[0]
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert SLOW_STOP_SAVE_S < took < 90, output[-3000:]  # the save finished, inside SageMaker's 120 s
    assert "[container] SIGTERM" in output and stop_file.exists()
    assert f"[torchrun-grace] {TORCHRUN_GRACE_S} s" in output  # the short grace was torchrun's
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "stopped" and 3 <= status["step"] < LOCAL_HPS["max_steps"]
    assert (work / "checkpoints" / f"step-{status['step']}" / "COMPLETE.json").exists()
    assert "Traceback" not in output and "SignalException" not in output  # torchrun was never signalled

    # The next attempt resumes there and ends on the weights of the run that was never stopped.
    assert run_local(create_request(LOCAL_HPS), workdir=work, nproc=2, data_dirs=data) == 0
    resumed, reference = weights(work), weights(two_rank_runs / "local_reference")
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)


# A worker that ignores SIGTERM: only torchrun's SIGKILL, after its grace, ends it.
STUBBORN_WORKER = """\
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).touch()
time.sleep(120)
"""


def test_signalled_torchrun_kills_its_workers_after_the_short_grace(tmp_path):
    """The stop test above is as strong as this: torchrun, signalled, SIGKILLs a worker TORCHRUN_GRACE_S later
    (not 30 s), so a save slower than that would have been cut had the entry signalled torchrun."""
    worker, ready = tmp_path / "worker.py", tmp_path / "ready"
    worker.write_text(STUBBORN_WORKER)
    torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                                 str(worker), str(ready)], env={**os.environ, **grace_env()}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not ready.exists() and torchrun.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), torchrun.communicate(timeout=30)[0][-3000:]
    sent = time.monotonic()
    torchrun.send_signal(signal.SIGTERM)
    output = torchrun.communicate(timeout=120)[0]
    took = time.monotonic() - sent
    # At least the grace, and less than the fixed 30 s of torchrun before 2.12: the only bound that tells the two
    # apart, so a loaded machine's slower reaction cannot fail it.
    assert TORCHRUN_GRACE_S <= took < TORCHRUN_FIXED_GRACE_S, output[-3000:]
    assert f"[torchrun-grace] {TORCHRUN_GRACE_S} s" in output


def test_the_container_entry_passes_the_image_scripts_exit_status_through(tmp_path):
    """A job that fails must fail: the entry exits with the status of what it started, signal or not."""
    image_root = tmp_path / "image"
    image_root.mkdir()
    (image_root / IMAGE_START.split()[1]).write_text('[ "$1" = train ] && exit 7\n')
    assert subprocess.run(container_entrypoint(), cwd=image_root, timeout=30).returncode == 7


def test_a_sagemaker_container_polls_the_entrys_stop_file_and_a_workstation_none():
    assert stop_file_path({ENV_HOSTS: '["algo-1"]'}) == Path(STOP_FILE)
    assert stop_file_path({}) is None  # a plain process never reads a stray /tmp file
    assert stop_file_path({ENV_STOP_FILE: "/x/stop", ENV_HOSTS: "[]"}) == Path("/x/stop")
