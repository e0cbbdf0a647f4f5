"""A run that ends well exits 0, every time: 2 ranks under a real torchrun, run to completion or to a clean stop
(the stop file), over the strategies' different groups, and no rank aborts on its way out ("terminate called
without an active exception", SIGABRT, which torchrun turns into exit 1 and SageMaker into a failed job).

The abort was a race (a gloo thread freeing a tensor after the interpreter began to finalize: see
training.distributed.teardown), a few runs in 200, so these runs alone would rarely catch its return. What does
every time is teardown's warning: a process group that outlives teardown keeps the threads that abort."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from contract.container import ENV_STOP_FILE
from tests.training.helpers import free_port

pytestmark = pytest.mark.slow

# (name, strategy arguments, stop after this step or None to complete).
RUNS = [
    ("fsdp-complete", ["--strategy", "fsdp"], None),
    ("fsdp-stop", ["--strategy", "fsdp"], 2),
    ("fsdp-async-complete", ["--strategy", "fsdp", "--async_checkpoint", "true", "--checkpoint_interval", "1"], None),
    ("ddp-async-stop", ["--strategy", "ddp", "--async_checkpoint", "true", "--checkpoint_interval", "1"], 2),
    ("tp-complete", ["--strategy", "tp", "--tp_degree", "2"], None),
    ("pp-stop", ["--strategy", "pp", "--pp_degree", "2"], 2),
]


def stop_after(metrics: Path, step: int, stop_file: Path, done: threading.Event) -> threading.Thread:
    """Create the stop file once `step` is in the metrics file (what `trainctl local` does on Ctrl-C)."""

    def watch() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not done.is_set():
            if metrics.exists() and any(json.loads(line).get("step", 0) >= step
                                        for line in metrics.read_text().splitlines() if line.strip()):
                stop_file.touch()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(("args", "stop_at"), [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_a_run_that_ends_well_exits_0_without_an_abort(tmp_path, args, stop_at):
    stop_file = tmp_path / "stop"
    env = {**os.environ, ENV_STOP_FILE: str(stop_file), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "training.train",
           "--model", "gpt", "--model_size", "tiny", "--data", "synthetic", "--micro_batch_size", "2",
           "--max_steps", "200" if stop_at else "3", "--log_interval", "1", "--checkpoint_dir", str(tmp_path / "ck"),
           "--model_dir", str(tmp_path / "model"), "--output_data_dir", str(tmp_path / "output"), *args]
    done = threading.Event()
    if stop_at:
        stop_after(tmp_path / "output" / "metrics.jsonl", stop_at, stop_file, done)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240,
                              cwd=Path(__file__).resolve().parents[2])
    finally:
        done.set()
    log = proc.stdout + proc.stderr
    assert "terminate called" not in log and "Fatal Python error" not in log, log[-4000:]
    assert "outlive teardown" not in log, log[-4000:]
    assert proc.returncode == 0, log[-4000:]
    status = json.loads((tmp_path / "output" / "training_status.json").read_text())
    assert status["status"] == ("stopped" if stop_at else "completed")
