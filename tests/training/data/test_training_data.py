"""The sampler's shards and position, the token format, and the stdlib corpus."""

from __future__ import annotations

import json

import numpy as np

from prepare.corpus import prepare
from training.data.datasets import TokenDataset
from training.data.sampler import GlobalBatchSampler


def test_ranks_split_each_global_batch_without_overlap():
    ranks = [GlobalBatchSampler(40, 8, r, 2, seed=3) for r in range(2)]
    single = GlobalBatchSampler(40, 8, 0, 1, seed=3)
    for _ in range(7):  # crosses the epoch boundary (5 batches per epoch)
        a, b = (s.next_indices() for s in ranks)
        assert len(a) == len(b) == 4 and not set(a) & set(b)
        assert a + b == single.next_indices()


def test_position_resumes_without_repeating_or_skipping():
    straight = GlobalBatchSampler(40, 8, 0, 1, seed=3)
    seen = [straight.next_indices() for _ in range(9)]
    first = GlobalBatchSampler(40, 8, 0, 1, seed=3)
    for _ in range(3):
        first.next_indices()
    resumed = GlobalBatchSampler(40, 8, 0, 1, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert [resumed.next_indices() for _ in range(6)] == seen[3:]
    # Resumed on 2 ranks: the same global batches, split between them.
    halves = [GlobalBatchSampler(40, 8, r, 2, seed=3) for r in range(2)]
    for h in halves:
        h.load_state_dict(first.state_dict())
    assert halves[0].next_indices() + halves[1].next_indices() == seen[3]
    # Each epoch is a permutation: every sample once.
    assert sorted(sum(seen[:5], [])) == list(range(40))


def test_prepare_writes_the_stdlib_as_byte_tokens(tmp_path):
    counts = prepare(tmp_path, val_fraction=0.2, max_bytes=60_000, shard_bytes=20_000)
    assert counts["train"] > 30_000 and counts["validation"] > 5_000
    meta = json.loads((tmp_path / "train" / "meta.json").read_text())
    assert meta["vocab_size"] == 256 and meta["format"] == "tokens"
    assert len(list((tmp_path / "train").glob("shard-*.bin"))) >= 2
    tokens = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted((tmp_path / "train").glob("*.bin"))])
    assert len(tokens) == counts["train"] and tokens.max() < 256
    assert b"def " in tokens.astype(np.uint8).tobytes()  # real Python source
    ds = TokenDataset(tmp_path / "train", seq_len=64)
    x, y = ds.batch([0, 5])
    assert x.shape == y.shape == (2, 64) and bool((x[:, 1:] == y[:, :-1]).all())
