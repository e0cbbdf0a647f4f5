"""Datasets read from channel directories, and the sampler whose position makes a resume exact.

Formats (written by `training.prepare`, or by hand; each channel directory has a meta.json):
  tokens: {"format": "tokens", "dtype": "uint16", "vocab_size": V} and `*.bin` shards of raw token ids.
          A sample is a window of seq_len + 1 tokens inside one shard (windows step by seq_len).
  images: {"format": "images", "num_classes": K, "image_size": S, "channels": C} and pairs of
          `images-NNNNN.npy` (uint8, N x S x S x C) and `labels-NNNNN.npy` (int, N), memory-mapped.

The sampler shuffles all samples once per epoch with a generator seeded by (seed, epoch), cuts the epoch
into global batches, and gives rank r the r-th slice of each. Its position (epoch, batch) is global, so
a checkpoint taken on N ranks resumes on M ranks at the same sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig
from training.environment import DataMissing, data_mode

SYNTHETIC_SAMPLES = 1 << 20


def read_meta(directory: str | Path) -> dict:
    path = Path(directory) / "meta.json"
    if not path.exists():
        raise DataMissing(f"{directory} has no meta.json: write the channel with `python -m training.prepare`")
    return json.loads(path.read_text())


class TokenDataset:
    def __init__(self, directory: str | Path, seq_len: int) -> None:
        meta = read_meta(directory)
        if meta.get("format") != "tokens":
            raise ConfigError(f"{directory}/meta.json has format {meta.get('format')!r}; the decoder needs tokens")
        shards = sorted(Path(directory).glob("*.bin"))
        if not shards:
            raise DataMissing(f"{directory} holds no *.bin token shards")
        dtype = np.dtype(meta.get("dtype", "uint16"))
        self.shards = [np.memmap(p, dtype=dtype, mode="r") for p in shards]
        self.seq_len = seq_len
        index = [
            np.stack([np.full(n, i), np.arange(n) * seq_len], axis=1)
            for i, s in enumerate(self.shards)
            if (n := (len(s) - 1) // seq_len) > 0
        ]
        if not index:
            raise ConfigError(f"{directory}: no shard holds seq_len + 1 = {seq_len + 1} tokens; lower seq_len")
        self.index = np.concatenate(index)

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.shards[s][o : o + self.seq_len + 1] for s, o in self.index[indices]]
        window = torch.from_numpy(np.stack(rows).astype(np.int64))
        return window[:, :-1], window[:, 1:]


class ImageDataset:
    def __init__(self, directory: str | Path) -> None:
        meta = read_meta(directory)
        if meta.get("format") != "images":
            raise ConfigError(f"{directory}/meta.json has format {meta.get('format')!r}; the ViT needs images")
        pairs = sorted(Path(directory).glob("images-*.npy"))
        if not pairs:
            raise DataMissing(f"{directory} holds no images-*.npy shards")
        self.images = [np.load(p, mmap_mode="r") for p in pairs]
        self.labels = [np.load(p.with_name(p.name.replace("images-", "labels-")), mmap_mode="r") for p in pairs]
        self.index = np.concatenate([np.stack([np.full(len(x), i), np.arange(len(x))], 1)
                                     for i, x in enumerate(self.images)])

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = self.index[indices]
        x = np.stack([self.images[s][o] for s, o in pairs])
        y = np.array([self.labels[s][o] for s, o in pairs], dtype=np.int64)
        return _to_float_images(torch.from_numpy(x)), torch.from_numpy(y)


def _to_float_images(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)


class SyntheticTokens:
    """Arithmetic sequences modulo the vocabulary: learnable, so a smoke test shows the loss fall."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def __len__(self) -> int:
        return SYNTHETIC_SAMPLES

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for i in indices:
            g = torch.Generator().manual_seed(self.seed * 7919 + int(i))
            start, step = torch.randint(0, self.vocab_size, (2,), generator=g).tolist()
            rows.append((start + (step % 7 + 1) * torch.arange(self.seq_len + 1)) % self.vocab_size)
        window = torch.stack(rows)
        return window[:, :-1], window[:, 1:]


class SyntheticImages:
    """Noise images whose label is the brightest channel-quadrant: learnable, deterministic per index."""

    def __init__(self, image_size: int, channels: int, num_classes: int, seed: int) -> None:
        self.shape = (image_size, image_size, channels)
        self.num_classes, self.seed = num_classes, seed

    def __len__(self) -> int:
        return SYNTHETIC_SAMPLES

    def batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for i in indices:
            g = torch.Generator().manual_seed(self.seed * 7919 + int(i))
            label = int(torch.randint(0, self.num_classes, (1,), generator=g))
            x = torch.randint(0, 128, self.shape, generator=g, dtype=torch.uint8)
            x.view(-1)[label :: self.num_classes] += 127  # a class-dependent stripe pattern
            xs.append(x)
            ys.append(label)
        return _to_float_images(torch.stack(xs)), torch.tensor(ys)


class GlobalBatchSampler:
    """Deterministic global batches; rank r reads the r-th slice. `state_dict` is the data position."""

    def __init__(self, num_samples: int, global_batch: int, rank: int, world_size: int, seed: int) -> None:
        if num_samples < global_batch:
            raise ConfigError(f"the dataset has {num_samples} samples, fewer than one global batch "
                              f"({global_batch}): lower global_batch_size or add data")
        self.num_samples, self.global_batch = num_samples, global_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.batch = 0, 0
        self._perm: torch.Tensor | None = None

    @property
    def batches_per_epoch(self) -> int:
        return self.num_samples // self.global_batch

    def _permutation(self) -> torch.Tensor:
        if self._perm is None:
            g = torch.Generator().manual_seed(self.seed + 1_000_003 * self.epoch)
            self._perm = torch.randperm(self.num_samples, generator=g)
        return self._perm

    def next_indices(self) -> list[int]:
        """This rank's sample indices of the next global batch; advances the position."""
        if self.batch >= self.batches_per_epoch:
            self.epoch, self.batch, self._perm = self.epoch + 1, 0, None
        start = self.batch * self.global_batch
        per_rank = self.global_batch // self.world_size
        chunk = self._permutation()[start + self.rank * per_rank : start + (self.rank + 1) * per_rank]
        self.batch += 1
        return chunk.tolist()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "global_batch": self.global_batch,
                "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        if state["global_batch"] != self.global_batch or state["num_samples"] != self.num_samples:
            # Same samples, different cut: keep the epoch and resume at the first unseen sample's batch.
            seen = state["batch"] * state["global_batch"]
            self.epoch, self.batch = state["epoch"], seen // self.global_batch
        else:
            self.epoch, self.batch = state["epoch"], state["batch"]
        self._perm = None


def epoch_fraction(sampler: GlobalBatchSampler) -> float:
    return sampler.epoch + sampler.batch / max(1, sampler.batches_per_epoch)


def validation_indices(num_samples: int, global_batch: int, rank: int, world_size: int, n_batches: int):
    """Fixed (unshuffled) validation batches, rank slices, so every evaluation sees the same samples."""
    n_batches = min(n_batches, num_samples // global_batch)
    per_rank = global_batch // world_size
    for b in range(n_batches):
        start = b * global_batch + rank * per_rank
        yield list(range(start, start + per_rank))


def make_datasets(cfg: TrainConfig, kind: str, model, seq_len: int):
    """(train set, validation set or None) for the model's data kind: the channels, or generated data."""
    if data_mode(cfg) == "synthetic":
        if kind == "images":
            c = model.c
            make = lambda seed: SyntheticImages(c.image_size, c.channels, c.num_classes, seed)  # noqa: E731
        else:
            vocab = getattr(getattr(model, "c", None), "vocab_size", 256)
            make = lambda seed: SyntheticTokens(vocab, seq_len, seed)  # noqa: E731
        return make(cfg.seed), make(cfg.seed + 1)
    load = (lambda d: ImageDataset(d)) if kind == "images" else (lambda d: TokenDataset(d, seq_len))
    return load(cfg.train_dir), (load(cfg.validation_dir) if cfg.validation_dir else None)


def micro_batches(dataset, indices: list[int], micro: int, device: torch.device) -> list[tuple]:
    """This rank's share of a global batch as (inputs, targets) micro-batches on the device."""
    return [tuple(t.to(device, non_blocking=True) for t in dataset.batch(indices[i : i + micro]))
            for i in range(0, len(indices), micro)]
