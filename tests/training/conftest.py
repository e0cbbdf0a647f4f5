"""Fixtures for the training tests: a tiny token corpus and the 2-rank runs, spawned once per test run (shared by
pytest-xdist's workers through a file lock, as tests/conftest.py's synth is)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from tests.training.helpers import ADAMW, config, local_reference_run, spawn, write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two train shards holding 16 windows of 16 tokens: a 4-sample global batch ends an epoch every
    4 steps, so an 8-step run crosses an epoch and a stop at step 3 is mid-epoch. Structured streams, so
    the loss can fall."""
    root = tmp_path_factory.mktemp("corpus")
    write_corpus(root)
    return root


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Folders of runs made by 2 ranks with AdamW: fsdp_straight (8 steps) and fsdp_resumed (stopped at step 3,
    mid-epoch, then resumed); fsdp_async (async checkpoints every 2 steps, stopped at 5, resumed);
    local_reference, the uninterrupted twin of the job test_training_local runs; fsdp_meta_init, initialized
    after sharding on the meta device (lr 0: the export is the initialization). Every layout against one
    process, with SGD: test_conformance.

    Three files use them; under `--dist loadfile` they often land on both workers, which each spawned them. The
    first worker to ask makes them in the run's shared folder (with a corpus of its own there: write_corpus is
    seeded, so every worker's corpus holds the same tokens); the other waits for it and reads them."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    root = shared / "two_ranks"
    with FileLock(str(shared / "two_ranks.lock")):
        if not (root / "complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            _spawn_two_rank_runs(root, write_corpus(root / "corpus"))
            (root / "complete").touch()
    return root


def _spawn_two_rank_runs(root: Path, corpus: Path) -> None:
    runs = []
    straight = vars(config(root / "fsdp_straight", corpus, strategy="fsdp", micro_batch_size=2, **ADAMW))
    resumed = vars(config(root / "fsdp_resumed", corpus, strategy="fsdp", micro_batch_size=2, **ADAMW))
    runs += [(straight, None), (resumed, 3), (resumed, None)]
    asynchronous = vars(config(root / "fsdp_async", corpus, strategy="fsdp", micro_batch_size=2,
                               **{**ADAMW, "checkpoint_interval": 2, "async_checkpoint": True}))
    runs += [(asynchronous, 5), (asynchronous, None)]
    runs.append((local_reference_run(root / "local_reference", corpus), None))
    runs.append(({**vars(config(root / "fsdp_meta_init", corpus, strategy="fsdp", max_steps=1, lr=0.0)),
                  "meta_init_min_params": 0}, None))
    spawn(2, runs)
