"""`trainctl local`'s engine end to end: a hand-written CreateTrainingJob request, 2 processes under a real
torchrun, SIGTERM mid-run (checkpoint, clean stop), then a second run that resumes and ends on the same
weights as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from cli.local import run_local
from tests.training.helpers import LOCAL_HPS, SEQ, weights

pytestmark = pytest.mark.slow


def create_request(hps: dict) -> dict:
    encoded = {"sagemaker_program": "train.py", "sagemaker_submit_directory": "s3://bucket/code/sourcedir.tar.gz",
               "sagemaker_region": "us-east-1", "sagemaker_torch_distributed_enabled": True,
               "sagemaker_instance_type": "ml.g5.12xlarge", **hps}
    return {
        "TrainingJobName": "local-demo-1",
        "AlgorithmSpecification": {"TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312",
                                   "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/training",
        "HyperParameters": {k: json.dumps(v) for k, v in encoded.items()},
        "InputDataConfig": [
            {"ChannelName": name, "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://bucket/{name}/"}}}
            for name in ("train", "validation")
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output/"},
        "ResourceConfig": {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
        "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints/local-demo/"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Environment": {"LOCAL_TEST_MARKER": "1"},
    }


def sigterm_self_at_step(metrics: Path, step: int, done: threading.Event, sent: list[float]) -> threading.Thread:
    """Like SageMaker stopping the job: SIGTERM to the process running the container once `step` is logged."""

    def watch() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not done.is_set():
            if metrics.exists() and any(json.loads(line).get("step", 0) >= step
                                        for line in metrics.read_text().splitlines() if line.strip()):
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# The stop-time save is made this slow (training.checkpoint's test hook): longer than the 30 s that torchrun
# before 2.12 gives its workers after a signal it forwards. The stop reaches the workers, not torchrun.
SLOW_STOP_SAVE_S = 35


def test_interrupted_local_run_resumes_to_the_uninterrupted_weights(tmp_path, corpus, two_rank_runs, capfd):
    # Only the stop's own save (checkpoint cadence does not change the weights): it is the slow one.
    request = create_request({**LOCAL_HPS, "checkpoint_interval": 0})
    data = {"train": corpus / "train", "validation": corpus / "validation"}
    work = tmp_path / "work"

    done, sent = threading.Event(), []
    watcher = sigterm_self_at_step(work / "output" / "data" / "metrics.jsonl", step=3, done=done, sent=sent)
    code = run_local(request, workdir=work, nproc=2, data_dirs=data,
                     extra_env={"TRAINING_TEST_STOP_SAVE_DELAY_S": str(SLOW_STOP_SAVE_S)})
    done.set()
    watcher.join(timeout=1)
    assert code == 0 and sent
    took = time.monotonic() - sent[0]
    assert SLOW_STOP_SAVE_S < took < 60  # the slow save finished; still well inside SageMaker's 120 s
    console = capfd.readouterr()
    assert "SignalException" not in console.err + console.out and "Traceback" not in console.err + console.out
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "stopped" and 3 <= status["step"] < LOCAL_HPS["max_steps"]
    stopped_at = work / "checkpoints" / f"step-{status['step']}"
    assert (stopped_at / "COMPLETE.json").exists() and (stopped_at / ".metadata").exists()
    assert not (work / "model" / "model.safetensors").exists()
    logs = "\n".join(p.read_text() for p in (work / "output" / "logs").rglob("*.log"))
    assert f"[train] stopped at step {status['step']}" in logs  # the workers' own clean exit
    # The SageMaker-like layout the script saw.
    assert json.loads((work / "input" / "config" / "hyperparameters.json").read_text())["max_steps"] == "40"
    assert (work / "input" / "data" / "train").resolve() == (corpus / "train").resolve()
    assert (work / "code" / "train.py").exists() and (work / "code" / "training" / "loop.py").exists()

    assert run_local(request, workdir=work, nproc=2, data_dirs=data) == 0
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status == {**status, "status": "completed", "step": LOCAL_HPS["max_steps"]}
    logs = "\n".join(p.read_text() for p in (work / "output" / "logs").rglob("*.log"))
    assert f"resumed from {stopped_at}" in logs
    resumed, reference = weights(work), weights(two_rank_runs / "local_reference")
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    metrics = [json.loads(line) for line in (work / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train_loss"] for m in metrics if "train_loss" in m]
    assert losses[-1] < losses[0]


def hsdp_request(tmp_path: Path, corpus: Path) -> Path:
    """examples/local-hsdp.json on the test corpus, short: 4 processes = 2 replicas x 2 shards."""
    request = json.loads((Path(__file__).resolve().parents[2] / "examples" / "local-hsdp.json").read_text())
    request.update(dataset=str(corpus / "train"), validation_dataset=str(corpus / "validation"), checkpoint_interval=100)
    request["hyperparameters"].update(max_steps=40, seq_len=SEQ, micro_batch_size=1, eval_interval=0, log_interval=1)
    path = tmp_path / "hsdp.json"
    path.write_text(json.dumps(request))
    return path


def test_an_hsdp_request_runs_through_trainctl_local_stops_and_resumes(tmp_path, corpus):
    """The whole `trainctl local` path for a torch-native strategy: the request's `parallel` section is
    validated against --nproc, rendered into the mesh hyperparameters, trained on 4 processes, stopped by
    SIGTERM, resumed, and it ends on the weights of an uninterrupted run."""
    from cli.local_runner import run_request_locally
    from cli.request_file import load_request

    loaded = load_request(hsdp_request(tmp_path, corpus))
    reference, work = tmp_path / "reference", tmp_path / "work"
    assert run_request_locally(loaded, workdir=reference, nproc=4, data=None) == 0

    done, sent = threading.Event(), []
    watcher = sigterm_self_at_step(work / "output" / "data" / "metrics.jsonl", step=3, done=done, sent=sent)
    assert run_request_locally(loaded, workdir=work, nproc=4, data=None) == 0
    done.set()
    watcher.join(timeout=1)
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert sent and status["status"] == "stopped" and 3 <= status["step"] < 40
    hps = json.loads((work / "input" / "config" / "hyperparameters.json").read_text())
    assert (hps["strategy"], hps["dp_shard"]) == ('"hsdp"', "2")

    assert run_request_locally(loaded, workdir=work, nproc=4, data=None) == 0
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 40
    resumed, uninterrupted = weights(work), weights(reference)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
