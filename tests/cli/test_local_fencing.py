"""Two attempts of one run on one checkpoint folder: two real `trainctl local` processes, the second started while the
first still trains (a resume the launcher did not know was not needed, a job it lost track of). Each invocation is a
newer epoch (cli.container_emulator.next_epoch); the newer claims the folder at its start, and the older stops
before it writes again, naming both epochs (training.checkpoint.fencing), so the newer one's checkpoints stay intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.container import FENCE_FILE, FENCE_KEY
from contract.failures import FailureCode, parse_failure_line
from tests.training.helpers import write_corpus
from training.checkpoint.markers import MARKER, why_invalid
from training.resilience.heartbeat import ENV_TEST_SLOW

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def request(tmp_path: Path, corpus: Path) -> Path:
    path = tmp_path / "request.json"
    path.write_text(json.dumps({
        "name": "fenced", "strategy": "single", "model": "gpt", "model_size": "tiny",
        "dataset": str(corpus / "train"), "validation_dataset": str(corpus / "validation"),
        "instance": {"type": "ml.c5.2xlarge", "count": 1}, "checkpoint_interval": 10,
        "hyperparameters": {"max_steps": 60, "seq_len": 16, "micro_batch_size": 4, "eval_interval": 0,
                            "log_interval": 10, "keep_checkpoints": 2}}))
    return path


def trainctl_local(request_file: Path, workdir: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "local", str(request_file), "--workdir", str(workdir)],
                            cwd=REPO, env={**os.environ, "COLUMNS": "300", **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def markers(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads((p / MARKER).read_text()) for p in folder.glob("step-*") if why_invalid(p) is None}


def test_the_older_of_two_attempts_stops_before_writing_and_the_newer_ones_checkpoints_stay(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    spec = request(tmp_path, corpus)
    first, second = tmp_path / "first", tmp_path / "second"
    folder = first / "checkpoints"
    second.mkdir()
    (second / "checkpoints").symlink_to(folder, target_is_directory=True)  # one checkpoint folder, two work folders

    # The first attempt is slowed (a quarter second a step) so that the second overtakes it mid-run.
    older, newer = trainctl_local(spec, first, **{ENV_TEST_SLOW: "*:0.25"}), None
    try:
        deadline = time.monotonic() + 120
        while not markers(folder) and time.monotonic() < deadline and older.poll() is None:
            time.sleep(0.1)
        assert markers(folder), "the first attempt wrote no checkpoint"
        newer = trainctl_local(spec, second)
        newer_out, _ = newer.communicate(timeout=300)
        older_out, _ = older.communicate(timeout=300)
    finally:
        for proc in (older, newer):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert newer.returncode == 0, newer_out[-3000:]
    assert "done at step 60" in newer_out
    assert older.returncode == 2, older_out[-3000:]
    code, message = parse_failure_line((first / "output" / "failure").read_text())
    assert code is FailureCode.SUPERSEDED
    assert f"attempt of epoch 1 found its checkpoint folder {folder} claimed by epoch 2" in message, message
    assert json.loads((folder / FENCE_FILE).read_text()) == {FENCE_KEY: 2}
    # The newer attempt's steps are whole and its own; the older one wrote none after the claim.
    kept = markers(folder)
    assert sorted(kept) == ["step-50", "step-60"] and {m[FENCE_KEY] for m in kept.values()} == {2}
    older_status = json.loads((first / "output" / "data" / "training_status.json").read_text()) \
        if (first / "output" / "data" / "training_status.json").exists() else {}
    assert older_status.get("status") != "completed"
    assert (tmp_path / "first" / "checkpoints.epoch").read_text().strip() == "2"  # the count beside the folder
