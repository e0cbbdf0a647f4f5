"""The loader's order of work, on the CPU with real forked DataLoader workers: each step takes the batches fetched
one step ahead (on CUDA their copy to the device runs on a side stream meanwhile: not run here, no GPU), the
checkpointed position never counts the prefetched step, a drift between the two positions is refused, and
validation batches go through the same workers in their fixed order with the same loss as on the training thread.
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
import torch

from contract.data_formats import WEBDATASET, auto_workers
from contract.errors import ConfigError
from tests.training.data.test_real_formats import jpeg_shards, metrics_of_dir, vit_run  # noqa: F401 (a fixture)
from tests.training.helpers import config
from training.data.datasets import TokenDataset
from training.data.loader import BatchSource, eval_batches, resolve_workers
from training.data.sampler import GlobalBatchSampler
from training.data.tar_shards import TarImageDataset

pytestmark = pytest.mark.slow


class Traced:
    """Sample i -> (i, the process that read it): which process read what, in which order."""

    data_format = "traced"

    def __init__(self, n: int, broken: int | None = None) -> None:
        self.n, self.broken = n, broken

    def __len__(self) -> int:
        return self.n

    def batch(self, indices: list[int], epoch: int = 0):
        if self.broken in indices:
            raise ConfigError(f"sample {self.broken} is broken: rewrite it")
        return torch.tensor(indices) + 1000 * epoch, torch.full((len(indices),), os.getpid())


def test_each_step_takes_what_was_fetched_ahead_and_the_position_counts_only_what_was_taken():
    data = Traced(40)
    sampler = GlobalBatchSampler(len(data), 8, 0, 1, seed=3)
    mirror = GlobalBatchSampler(len(data), 8, 0, 1, seed=3)  # what the steps should get, in order
    source = BatchSource(data, sampler, 4, torch.device("cpu"), workers=2)
    try:
        for step in range(1, 8):  # crosses from epoch 0 (5 steps) into epoch 1
            batches = source.next()
            expected = mirror.next_indices()
            x = torch.cat([b[0] for b in batches])
            assert x.tolist() == [i + 1000 * mirror.epoch for i in expected]
            assert all((b[1] != os.getpid()).all() for b in batches)  # read in the workers
            # The next step is already fetched, yet the checkpointed position is this step's.
            assert sampler.state_dict() == mirror.state_dict()
            following = GlobalBatchSampler(len(data), 8, 0, 1, seed=3)
            following.load_state_dict(mirror.state_dict())
            nxt = following.next_indices()
            assert source._ahead.keys == [[following.epoch, *nxt[:4]], [following.epoch, *nxt[4:]]], step
    finally:
        source.close()


def test_a_drift_between_the_positions_is_refused_naming_both():
    data = Traced(40)
    sampler = GlobalBatchSampler(len(data), 8, 0, 1, seed=3)
    source = BatchSource(data, sampler, 8, torch.device("cpu"), workers=1)
    try:
        source.next()
        sampler.next_indices()  # the loop's position moves without taking the fetched batch
        with pytest.raises(RuntimeError, match=r"the loader delivered epochs and samples \[\[0, .*\]\], the "
                                               r"sampler expected \[\[0, "):
            source.next()
    finally:
        source.close()


def test_validation_batches_come_from_the_workers_in_their_fixed_order():
    data = Traced(30)
    keys = [(0, list(range(i, i + 3))) for i in range(0, 24, 3)]
    inline = list(eval_batches(data, keys, torch.device("cpu"), 0))
    pooled = list(eval_batches(data, keys, torch.device("cpu"), 2))
    assert [x.tolist() for x, _ in pooled] == [x.tolist() for x, _ in inline] == [k[1] for k in keys]
    assert all((pid == os.getpid()).all() for _, pid in inline)
    assert all((pid != os.getpid()).all() for _, pid in pooled)
    assert list(eval_batches(data, [], torch.device("cpu"), 2)) == []
    with pytest.raises(ConfigError, match="sample 7 is broken: rewrite it"):  # one line, not a worker's traceback
        list(eval_batches(Traced(30, broken=7), keys, torch.device("cpu"), 2))


def test_data_workers_auto_is_the_contracts_rule_the_planner_assumes(jpeg_shards, tmp_path):  # noqa: F811
    meta = json.loads((jpeg_shards / "train" / "meta.json").read_text())
    cpus = len(os.sched_getaffinity(0))
    assert resolve_workers(None, TarImageDataset(jpeg_shards / "train", meta)) == auto_workers(WEBDATASET, cpus)
    (tmp_path / "meta.json").write_text(json.dumps({"format": "tokens", "dtype": "uint16", "vocab_size": 9}))
    np.arange(64, dtype=np.uint16).tofile(tmp_path / "shard-00000.bin")
    assert resolve_workers(None, TokenDataset(tmp_path, 8)) == 0
    assert resolve_workers(3, TokenDataset(tmp_path, 8)) == 3


def test_the_validation_loss_is_the_same_with_and_without_workers(jpeg_shards, tmp_path, monkeypatch):  # noqa: F811
    """A tiny ViT on the JPEG shards, evaluated every 2 steps on 2 global batches of the validation channel: the
    same weights give the same validation loss, read by 2 workers or on the training thread (bit for bit)."""
    from training import evaluation
    from training.loop import train
    from training.parallel.process_group import setup
    from training.resilience.stop import StopFlag

    used = []  # the workers each evaluation read with (the real eval_batches runs)
    monkeypatch.setattr(evaluation, "eval_batches", lambda *a: used.append(a[3]) or eval_batches(*a))
    losses = {}
    for workers in (0, 2):
        root = tmp_path / f"w{workers}"
        values = vit_run(root, jpeg_shards, validation_dir=str(jpeg_shards / "validation"), eval_interval=2,
                         eval_batches=2, max_steps=4, data_workers=workers)
        cfg = config(root, jpeg_shards, **values)
        train(cfg, setup(cfg), StopFlag())
        losses[workers] = [r["val_loss"] for r in metrics_of_dir(root / "output") if "val_loss" in r]
    assert len(losses[0]) == 2 and losses[2] == losses[0], losses
    assert used == [0, 0, 2, 2]


class Stuck:
    """Every read hangs (a stalled network mount, a decoder in a loop)."""

    data_format = "stuck"

    def __len__(self) -> int:
        return 8

    def batch(self, indices: list[int], epoch: int = 0):
        time.sleep(3600)


def _rank_with_a_stuck_worker(report) -> None:
    """A rank whose loader's one worker hangs in a read: it reports the worker's pid, then waits for its batch."""
    source = BatchSource(Stuck(), GlobalBatchSampler(8, 2, 0, 1, seed=0), 2, torch.device("cpu"), workers=1)
    source._start()
    report.send([w.pid for w in source._loader._workers])
    next(source._loader)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_a_loader_worker_stuck_in_a_read_ends_with_its_rank(tmp_path):
    """A rank killed outright (SIGKILL: the OOM killer, or leave()'s os._exit after a failure) runs no shutdown, and
    the DataLoader's own check of its parent runs only between batches: a worker stuck in a read outlived its rank by
    minutes, holding the instance's memory and its file handles. The kernel now ends it with its rank."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    rank = context.Process(target=_rank_with_a_stuck_worker, args=(send,))
    rank.start()
    worker = None
    try:
        [worker] = receive.recv()
        assert _alive(worker)
        time.sleep(0.5)  # the worker is inside its read
        os.kill(rank.pid, signal.SIGKILL)
        rank.join(30)
        deadline = time.monotonic() + 60  # a bound on a kernel signal's delivery, not a measurement
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        if rank.is_alive():
            rank.kill()
        if worker is not None and _alive(worker):  # the test failed: leave no process behind
            os.kill(worker, signal.SIGKILL)
