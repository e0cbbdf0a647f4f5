"""torch.profiler on demand: the steps profile_from .. profile_from + profile_steps - 1 on the ranks profile_ranks names,
with CPU (and CUDA, on a GPU) activities, memory, shapes and stacks, written as one Chrome trace per rank
(`trace-rank<R>-steps<N>-<M>.json`, which chrome://tracing, Perfetto and TensorBoard's profiler plugin open) into the
run's profile folder: beside the TensorBoard event files when the launcher names their folder (synced to the run's S3
prefix on SageMaker), else the output data folder. On a GPU, a CUDA memory snapshot of the same steps as well
(`memory-rank<R>-steps<N>-<M>.pickle`, for pytorch.org/memory_viz).
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from contract.container import ENV_TENSORBOARD_DIR
from contract.hyperparameters import TrainConfig

_SNAPSHOT_ENTRIES = 100_000  # allocations the CUDA memory history keeps


def profile_folder(cfg: TrainConfig, env: typing.Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env[ENV_TENSORBOARD_DIR]) if env.get(ENV_TENSORBOARD_DIR) else Path(cfg.output_data_dir)


def profiles_rank(ranks: str, rank: int) -> bool:
    return ranks == "all" or rank in {int(r) for r in ranks.split(",")}


class StepProfiler:
    """Call `before(step)` before each step runs and `after(step)` once it ran (steps counted from 1)."""

    def __init__(self, first: int, steps: int, rank: int, folder: Path, device: torch.device) -> None:
        self.first, self.last, self.rank, self.folder, self.device = first, first + steps - 1, rank, folder, device
        self.profiler: profile | None = None
        self.range: record_function | None = None  # the running step's range: `train step N` in the trace
        self.written: list[Path] = []

    @classmethod
    def for_run(cls, cfg: TrainConfig, rank: int, device: torch.device) -> StepProfiler | None:
        if not cfg.profile_from or not profiles_rank(cfg.profile_ranks, rank):
            return None
        return cls(cfg.profile_from, cfg.profile_steps, rank, profile_folder(cfg), device)

    @property
    def _cuda(self) -> bool:
        return self.device.type == "cuda"

    def before(self, step: int) -> None:
        if step == self.first and self.profiler is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
            if self._cuda:
                torch.cuda.memory._record_memory_history(max_entries=_SNAPSHOT_ENTRIES)
            self.profiler = profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=True)
            self.profiler.__enter__()
        if self.profiler is not None:
            self.range = record_function(f"train step {step}")
            self.range.__enter__()

    def after(self, step: int) -> None:
        if self.profiler is None:
            return
        self._end_range()
        if step >= self.last:
            self.close()

    def _end_range(self) -> None:
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None

    def close(self) -> None:
        """End the profile (the run ended or stopped before its last step: what was recorded is written)."""
        if self.profiler is None:
            return
        self._end_range()
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"rank{self.rank}-steps{self.first}-{self.last}"
        trace = self.folder / f"trace-{name}.json"
        profiler.export_chrome_trace(str(trace))
        self.written.append(trace)
        if self._cuda:
            snapshot = self.folder / f"memory-{name}.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.written.append(snapshot)
        print(f"[profile] steps {self.first}-{self.last} of rank {self.rank}: "
              f"{', '.join(str(p) for p in self.written)}", flush=True)
