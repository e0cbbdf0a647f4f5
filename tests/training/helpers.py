"""Helpers for the training tests: tiny configs, spawning ranks, reading the exported weights."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from training.config import from_environment

SEQ = 16


def write_tokens(directory: Path, shards: list[np.ndarray], vocab: int = 64) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i, tokens in enumerate(shards):
        tokens.astype(np.uint16).tofile(directory / f"shard-{i:05d}.bin")
    (directory / "meta.json").write_text(json.dumps({"format": "tokens", "dtype": "uint16", "vocab_size": vocab}))
    return directory


def write_corpus(root: Path) -> Path:
    """The tests' token corpus (the `corpus` fixture): train/ holds 16 windows of SEQ tokens in two shards,
    validation/ 16; arithmetic runs of 8 tokens from random starts, so the loss can fall."""
    rng = np.random.default_rng(0)

    def stream(n: int) -> np.ndarray:
        starts = rng.integers(0, 64, n // 8 + 1)
        return np.concatenate([(s + np.arange(8)) % 64 for s in starts])[:n]

    write_tokens(root / "train", [stream(SEQ * 10 + 1), stream(SEQ * 6 + 1)])
    write_tokens(root / "validation", [stream(SEQ * 16 + 1)])
    return root


def config(root: Path, corpus: Path, **overrides):
    """A tiny decoder run writing under `root` (checkpoints/, model/, output/)."""
    values = dict(
        strategy="single", model="gpt", model_size="tiny", data="channels", seq_len=SEQ,
        train_dir=str(corpus / "train"), validation_dir=str(corpus / "validation"),
        checkpoint_dir=str(root / "checkpoints"), model_dir=str(root / "model"),
        output_data_dir=str(root / "output"), micro_batch_size=4, max_steps=6, warmup_steps=2,
        checkpoint_interval=0, log_interval=1, seed=7,
    )
    values.update(overrides)
    return from_environment(values, {})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Ranks start from a fork server that imported torch and the package once (one server per pytest worker): a
# spawned rank imports them again, about 2 s of CPU each, and the suite starts dozens of ranks. The server is
# forked before any torch op or process group (no threads to copy). A forked server's environment and standard
# streams are its own, frozen when it started: each rank takes the starting process's, as spawn would give them
# (the streams appended to, so pytest's capture of this test sees the ranks' lines).
multiprocessing.set_forkserver_preload(["torch", "torch.distributed.checkpoint", "training.loop",
                                        "tests.training.workers"])


def start_ranks(fn, args: tuple, nprocs: int, join: bool = True):
    """torch.multiprocessing.spawn's call (fn(rank, *args) in `nprocs` processes), from the fork server."""
    return mp.start_processes(_as_if_spawned, args=(fn, dict(os.environ), os.getpid(), args), nprocs=nprocs,
                              join=join, start_method="forkserver")


def _as_if_spawned(rank: int, fn, environment: dict[str, str], parent: int, args: tuple) -> None:
    os.environ.clear()
    os.environ.update(environment)
    for fd in (1, 2):
        try:
            stream = os.open(f"/proc/{parent}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:  # a socket cannot be reopened by path: the rank keeps the server's stream
            continue
        os.dup2(stream, fd)
        os.close(stream)
    fn(rank, *args)


def spawn(world: int, runs: list) -> None:
    from tests.training.workers import run_scenarios

    start_ranks(run_scenarios, (world, free_port(), runs), world)


def weights(root: Path) -> dict[str, torch.Tensor]:
    return load_file(str(root / "model" / "model.safetensors"))


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


# Runs on 2 ranks, all in one spawn (starting processes is the expensive part here).
SGD = dict(optimizer="sgd", lr=0.5, weight_decay=0.0, grad_clip=0.0, lr_schedule="constant", warmup_steps=0)
ADAMW = dict(optimizer="adamw", lr=3e-3, max_steps=8, checkpoint_interval=0, keep_checkpoints=5)


# The job that test_training_local runs through `trainctl local`'s engine (hyperparameters as the launcher
# renders them), and its uninterrupted twin in the 2-rank spawn.
LOCAL_HPS = {"strategy": "fsdp", "model": "gpt", "model_size": "tiny", "checkpoint_interval": 4, "max_steps": 40,
             "micro_batch_size": 2, "seq_len": SEQ, "log_interval": 1, "lr": 0.003, "eval_interval": 10, "seed": 5}


def local_reference_run(root: Path, corpus: Path) -> dict:
    from cli.container_emulator import script_args

    env = {"SM_CHANNEL_TRAIN": str(corpus / "train"), "SM_CHANNEL_VALIDATION": str(corpus / "validation"),
           "SM_MODEL_DIR": str(root / "model"), "SM_OUTPUT_DATA_DIR": str(root / "output"),
           "TRAINING_CHECKPOINT_DIR": str(root / "checkpoints")}
    return {"argv": script_args(LOCAL_HPS), "env": env}


def bigram_model(cfg, data_meta: dict):
    """A bring-your-own model (`model=tests.training.helpers:bigram_model`): no blocks, no init_weights."""
    from torch import nn

    vocab = int(data_meta.get("vocab_size", 256))
    return nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab))


def create_request(hps: dict) -> dict:
    """A CreateTrainingJob request as the renderer sends it, by hand, for `trainctl local`'s engine."""
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


def sigterm_at_step(metrics: Path, step: int, done: threading.Event, sent: list[float],
                    pid: int | None = None) -> threading.Thread:
    """Like SageMaker stopping the job: SIGTERM to `pid` (default: this process, as the one running the
    container) once `step` is in the metrics file; the monotonic time it was sent goes into `sent`."""

    def watch() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not done.is_set():
            if metrics.exists() and any(json.loads(line).get("step", 0) >= step
                                        for line in metrics.read_text().splitlines() if line.strip()):
                sent.append(time.monotonic())
                os.kill(os.getpid() if pid is None else pid, signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
