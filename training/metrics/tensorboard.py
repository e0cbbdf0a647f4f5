"""TensorBoard event files of the run's metrics, written by rank 0: every record the metrics logger logs (loss,
learning rate, grad norm, throughput, MFU, data wait, checkpoint stall and age, the slowest rank's step time against
the median, validation loss) as one scalar each, tagged by its metric name (contract.metrics) at its step; and each
rank's own step time every log interval (contract.metrics.RANK_STEP_TIME_MS, a chart per rank).

Where: the folder the launcher names (contract.container.ENV_TENSORBOARD_DIR: SageMaker's TensorBoardOutputConfig
path, synced to the run's S3 prefix during training; `trainctl local`'s work folder), when the request's
`tensorboard` is on. torch.utils.tensorboard writes the files; it needs the `tensorboard` package (the PyTorch
training images have it). Without it the run says so once and trains on.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

from contract.container import ENV_TENSORBOARD_DIR
from contract.metrics import STEP
from training.metrics.logger import numbers


class TensorBoardWriter:
    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = directory
        # Flushed every 30 s (its default is 120): what a failed or killed job leaves is at most that much behind.
        self.writer = SummaryWriter(log_dir=str(directory), flush_secs=30)

    @classmethod
    def from_environment(cls, env: typing.Mapping[str, str] | None = None, *, is_main: bool) -> TensorBoardWriter | None:
        """The writer for the folder the launcher names, on rank 0; None elsewhere or where tensorboard is missing."""
        env = os.environ if env is None else env
        folder = env.get(ENV_TENSORBOARD_DIR)
        if not (folder and is_main):
            return None
        try:
            return cls(Path(folder))
        except ImportError:  # torch.utils.tensorboard raises it when the tensorboard package is absent
            print(f"[tensorboard] {ENV_TENSORBOARD_DIR}={folder} but the tensorboard package is not installed in "
                  "this image: no event files (pip install tensorboard, or set the request's tensorboard to false)",
                  flush=True)
            return None

    def write(self, record: dict) -> None:
        """Each number of a metrics record, at the record's step."""
        step = record.get(STEP)
        if step is None:
            return
        for name, value in numbers(record).items():
            self.writer.add_scalar(name, value, int(step))

    def write_ranks(self, step: int, name: str, values: list[float]) -> None:
        """One scalar per rank, `<name>/rank_<r>`: TensorBoard groups them under `name`, a chart each."""
        for rank, value in enumerate(values):
            self.writer.add_scalar(f"{name}/rank_{rank}", value, int(step))

    def close(self) -> None:
        self.writer.close()
