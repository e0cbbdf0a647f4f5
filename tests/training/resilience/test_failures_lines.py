"""Failures the training package knows end the run with one line in the failure file (contract.failures)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from contract.failures import OUT_OF_MEMORY_ADVICE, FailureCode, parse_failure_line
from tests.training.helpers import config
from training.loop import train
from training.parallel.process_group import setup
from training.resilience.outcome import TrainingFailure
from training.resilience.stop import StopFlag
from training.train import main


def nan_model(cfg, data_meta: dict):
    """A bring-your-own model whose logits are NaN from the first step (a diverged run)."""
    vocab = int(data_meta.get("vocab_size", 256))

    class Diverged(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out = nn.Embedding(vocab, 8), nn.Linear(8, vocab)

        def forward(self, x):
            return self.out(self.emb(x)) * float("nan")

    return Diverged()


def oom_model(cfg, data_meta: dict):
    """A model whose forward runs out of device memory (the error CUDA raises, on any device)."""

    class Hungry(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(1, 1)

        def forward(self, x):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    return Hungry()


def test_bad_hyperparameter_writes_one_config_line_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "output" / "data"))
    assert main(["--data", "synthetic", "--lr", "-1", "--checkpoint_dir", str(tmp_path)]) == 2
    code, message = parse_failure_line((tmp_path / "output" / "failure").read_text())
    assert code is FailureCode.CONFIG_INVALID and "lr" in message
    assert "Traceback" not in capsys.readouterr().err


def test_missing_channel_is_data_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "output" / "data"))
    monkeypatch.delenv("SM_CHANNEL_TRAIN", raising=False)
    assert main(["--checkpoint_dir", str(tmp_path)]) == 2
    code, message = parse_failure_line((tmp_path / "output" / "failure").read_text())
    assert code is FailureCode.DATA_MISSING and "train" in message


def test_nonfinite_loss_fails_after_patience_steps(tmp_path, corpus):
    cfg = config(tmp_path, corpus, model="tests.training.resilience.test_failures_lines:nan_model", max_steps=20,
                 nonfinite_patience=3, log_interval=1, checkpoint_interval=2)
    with pytest.raises(TrainingFailure) as failed:
        train(cfg, setup(cfg), StopFlag())
    assert failed.value.code is FailureCode.NON_FINITE and "3 steps in a row by step 3" in str(failed.value)
    assert not (tmp_path / "checkpoints" / "step-4").exists()  # the diverged run never became a checkpoint


def test_out_of_memory_names_the_micro_batch_and_what_to_lower(tmp_path, corpus):
    cfg = config(tmp_path, corpus, model="tests.training.resilience.test_failures_lines:oom_model", micro_batch_size=2)
    with pytest.raises(TrainingFailure) as failed:
        train(cfg, setup(cfg), StopFlag())
    assert failed.value.code is FailureCode.OUT_OF_MEMORY
    assert "micro-batch of 2 x 16 tokens" in str(failed.value) and str(failed.value).endswith(OUT_OF_MEMORY_ADVICE)


def test_a_model_changed_since_the_checkpoint_is_checkpoint_unreadable(tmp_path, corpus):
    cfg = config(tmp_path, corpus, max_steps=2, checkpoint_interval=2)
    train(cfg, setup(cfg), StopFlag())
    changed = config(tmp_path, corpus, max_steps=4, model_size="small")
    with pytest.raises(TrainingFailure) as failed:
        train(changed, setup(changed), StopFlag())
    assert failed.value.code is FailureCode.CHECKPOINT_UNREADABLE
    assert "step-2" in str(failed.value) and "settings it was written with" in str(failed.value)
