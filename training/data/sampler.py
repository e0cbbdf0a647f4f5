"""Which samples each rank reads: deterministic global batches cut into rank slices, resumable exactly (the
sampler's `state_dict` is the data position a checkpoint keeps), and the fixed validation batches.

The sampler shuffles all samples once per epoch with a generator seeded by (seed, epoch), cuts the epoch
into global batches, and gives rank r the r-th slice of each. Its position (epoch, batch) is global, so
a checkpoint taken on N ranks resumes on M ranks at the same sample.
"""

from __future__ import annotations

import torch

from contract.errors import ConfigError


class GlobalBatchSampler:
    """Deterministic global batches; rank r reads the r-th slice. `state_dict` is the data position."""

    def __init__(self, num_samples: int, global_batch: int, rank: int, world_size: int, seed: int,
                 source: str = "the dataset") -> None:
        if num_samples < global_batch:
            raise ConfigError(f"{source} has {num_samples} samples, fewer than one global batch "
                              f"({global_batch}): lower global_batch_size or micro_batch_size, or add data")
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
