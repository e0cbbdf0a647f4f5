"""Fixtures for the training tests: a tiny token corpus and the 2-rank runs, spawned once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.training.helpers import ADAMW, SEQ, SGD, config, local_reference_run, spawn, write_tokens


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two train shards holding 16 windows of 16 tokens: a 4-sample global batch ends an epoch every
    4 steps, so an 8-step run crosses an epoch and a stop at step 3 is mid-epoch. Structured streams, so
    the loss can fall."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)

    def stream(n: int) -> np.ndarray:
        starts = rng.integers(0, 64, n // 8 + 1)
        return np.concatenate([(s + np.arange(8)) % 64 for s in starts])[:n]

    write_tokens(root / "train", [stream(SEQ * 10 + 1), stream(SEQ * 6 + 1)])
    write_tokens(root / "validation", [stream(SEQ * 16 + 1)])
    return root


@pytest.fixture(scope="session")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    """Folders of runs made by 2 ranks: ddp_sgd, fsdp_sgd (2 x micro 2), *_sgd_accum (2 x micro 1 x
    accumulation 2), and for ddp and fsdp with AdamW a
    straight 8-step run and a run stopped at step 3 (mid-epoch) then resumed (`*_resumed`); and
    fsdp_async (async checkpoints every 2 steps,
    stopped at 5, resumed); local_reference, the uninterrupted twin of the job test_training_local runs; fsdp_meta_init,
    initialized after sharding on the meta device (lr 0: the export is the initialization)."""
    root = tmp_path_factory.mktemp("two_ranks")
    runs = []
    for strategy in ("ddp", "fsdp"):
        runs.append((vars(config(root / f"{strategy}_sgd", corpus, strategy=strategy, micro_batch_size=2, **SGD)), None))
        runs.append((vars(config(root / f"{strategy}_sgd_accum", corpus, strategy=strategy, micro_batch_size=1,
                                 grad_accum=2, **SGD)), None))
        straight = vars(config(root / f"{strategy}_straight", corpus, strategy=strategy, micro_batch_size=2, **ADAMW))
        resumed = vars(config(root / f"{strategy}_resumed", corpus, strategy=strategy, micro_batch_size=2, **ADAMW))
        runs += [(straight, None), (resumed, 3), (resumed, None)]
    asynchronous = vars(config(root / "fsdp_async", corpus, strategy="fsdp", micro_batch_size=2,
                               **{**ADAMW, "checkpoint_interval": 2, "async_checkpoint": True}))
    runs += [(asynchronous, 5), (asynchronous, None)]
    runs.append((local_reference_run(root / "local_reference", corpus), None))
    runs.append(({**vars(config(root / "fsdp_meta_init", corpus, strategy="fsdp", max_steps=1, lr=0.0)),
                  "meta_init_min_params": 0}, None))
    spawn(2, runs)
    return root
