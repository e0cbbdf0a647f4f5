"""One-process runs of the loop: early stopping, metric lines, checkpoint validity, ViT, export, options."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.training.helpers import config, max_diff, weights
from training.checkpoint.markers import MARKER
from training.export import _write_safetensors
from training.loop import train
from training.parallel.process_group import setup
from training.resilience.stop import StopFlag


def run(cfg, stop_at=None):
    return train(cfg, setup(cfg), StopFlag(), stop_at=stop_at)


def test_early_stopping_stops_and_metric_lines_parse(tmp_path, corpus, capsys):
    # A learning rate far too high makes the validation loss climb: patience 2 must stop the run.
    cfg = config(tmp_path, corpus, optimizer="sgd", lr=200.0, lr_schedule="constant", warmup_steps=0,
                 grad_clip=0.0, max_steps=30, eval_interval=1, eval_batches=2, early_stopping_patience=2)
    result = run(cfg)
    out = capsys.readouterr().out
    assert result.status == "early_stopped" and result.step < 30
    assert "early stopping at step" in out
    assert json.loads((tmp_path / "output" / "training_status.json").read_text())["status"] == "early_stopped"
    # The exported model is the early-stopped one.
    assert json.loads((tmp_path / "model" / "config.json").read_text())["step"] == result.step
    train_lines = [line for line in out.splitlines() if line.startswith("[metrics]") and "train_loss=" in line]
    assert len(train_lines) == result.step
    for name in ("step", "epoch", "train_loss", "lr", "tokens_per_sec", "step_time_ms"):
        regex = re.compile(rf"\[metrics\].*?\b{name}=([-+0-9.eE]+|nan|inf)")
        assert all(regex.search(line) for line in train_lines), name
    val = [float(m.group(1)) for line in out.splitlines()
           if (m := re.search(r"\[metrics\].*?\bval_loss=([-+0-9.eE]+|nan|inf)", line))]
    assert len(val) == result.step
    records = [json.loads(line) for line in (tmp_path / "output" / "metrics.jsonl").read_text().splitlines()]
    # The file is strict JSON: a non-finite loss is null there, nan or inf on the line CloudWatch reads.
    filed = [math.nan if r["val_loss"] is None else r["val_loss"] for r in records if "val_loss" in r]
    assert filed == pytest.approx([v if math.isfinite(v) else math.nan for v in val], rel=1e-3, nan_ok=True)


def test_partial_and_corrupt_newest_checkpoints_are_skipped(tmp_path, corpus, capsys):
    cfg = config(tmp_path, corpus, checkpoint_interval=2, max_steps=6, keep_checkpoints=2)
    run(cfg, stop_at=4)
    ck = tmp_path / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step-2", "step-4"]  # keep_checkpoints=2
    # step-6: killed mid-write (no marker). step-8: marked, but a file was truncated after (a bad sync).
    shutil.copytree(ck / "step-4", ck / "step-6")
    (ck / "step-6" / MARKER).unlink()
    shutil.copytree(ck / "step-4", ck / "step-8")
    data_file = max((ck / "step-8").glob("*.distcp"), key=lambda p: p.stat().st_size)  # the tensors
    with open(data_file, "r+b") as f:
        f.truncate(100)
    capsys.readouterr()
    result = run(cfg)
    out = capsys.readouterr().out
    assert f"skipping step-8: {data_file.name} has 100 bytes" in out
    assert "skipping step-6: no completion marker" in out
    assert "resumed from" in out and out.split("resumed from", 1)[1].split()[0].endswith("step-4")
    assert result.step == 6
    # The straight run gives the same weights: the resume really continued from step 4.
    straight = config(tmp_path / "straight", corpus, max_steps=6)
    run(straight)
    assert max_diff(weights(tmp_path), weights(tmp_path / "straight")) == 0.0
    # Run again when done: nothing more to train (a retried job that had finished); a raised max_steps goes on.
    lines = (tmp_path / "output" / "metrics.jsonl").read_text().count("\n")
    assert run(cfg).step == 6 and (tmp_path / "output" / "metrics.jsonl").read_text().count("\n") == lines
    assert run(config(tmp_path, corpus, checkpoint_interval=2, max_steps=7, keep_checkpoints=2)).step == 7


def test_activation_checkpointing_gives_the_same_weights(tmp_path, corpus):
    run(config(tmp_path / "plain", corpus, max_steps=3))
    run(config(tmp_path / "ac", corpus, max_steps=3, activation_checkpointing=True))
    assert max_diff(weights(tmp_path / "plain"), weights(tmp_path / "ac")) == 0.0


def test_vit_trains_on_image_shards(tmp_path):
    data = tmp_path / "images"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(data / f"images-{i:05d}.npy", rng.integers(0, 256, (12, 16, 16, 3), dtype=np.uint8))
        np.save(data / f"labels-{i:05d}.npy", rng.integers(0, 5, 12))
    (data / "meta.json").write_text(json.dumps({"format": "images", "num_classes": 5, "image_size": 16,
                                                 "channels": 3}))
    cfg = config(tmp_path, tmp_path, model="vit", train_dir=str(data), validation_dir=str(data), max_steps=3,
                 eval_interval=3, log_interval=1)
    assert run(cfg).status == "completed"
    exported = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert exported["head.weight"].shape == (5, 32)
    assert json.loads((tmp_path / "model" / "config.json").read_text())["image_size"] == 16
    records = (tmp_path / "output" / "metrics.jsonl").read_text()
    assert "samples_per_sec" in records and "val_loss" in records


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_tracks_fp32(tmp_path, corpus, precision):
    # Measured here: bf16 autocast ends within ~2e-2 of fp32 (REFERENCE.md); fp16 is closer.
    run(config(tmp_path / "fp32", corpus, max_steps=4, precision="fp32"))
    run(config(tmp_path / precision, corpus, max_steps=4, precision=precision))
    diff = max_diff(weights(tmp_path / "fp32"), weights(tmp_path / precision))
    assert 0 < diff < 2e-2  # not zero: the low precision really ran
    last = json.loads((tmp_path / precision / "output" / "metrics.jsonl").read_text().splitlines()[-1])
    assert ("loss_scale" in last) == (precision == "fp16")


def test_safetensors_fallback_writer_is_read_by_the_library(tmp_path):
    state = {"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.int64), "c": torch.randn(2).bfloat16(),
             "scalar": torch.tensor(1.5)}
    _write_safetensors(state, tmp_path / "m.safetensors", {"format": "pt"})
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_bring_your_own_model_by_module_and_factory(tmp_path, corpus):
    cfg = config(tmp_path, corpus, model="tests.training.helpers:bigram_model", max_steps=8, lr=3e-2,
                 lr_schedule="constant", warmup_steps=0)
    assert run(cfg).status == "completed"
    assert set(weights(tmp_path)) == {"0.weight", "1.weight", "1.bias"}
    losses = [json.loads(line)["train_loss"] for line in (tmp_path / "output" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]


def test_unloadable_model_factory_is_one_clear_error(tmp_path, corpus):
    from contract.errors import ConfigError

    with pytest.raises(ConfigError, match="'package.module:factory'"):
        run(config(tmp_path, corpus, model="no_such_module:factory"))


@pytest.mark.parametrize("workers", [0, 1])
def test_a_resume_with_dropout_is_exact_with_and_without_loader_workers(tmp_path, corpus, workers):
    """Dropout draws from torch's global generator, which the checkpoint restores; a loader over workers drew its
    base seed from the same generator when its iterator was made (at the first step of a straight run, after the
    restore of a resumed one), so with workers and dropout the resumed run's masks were one draw off: losses
    differed from the first resumed step (either alone was exact). Evaluations make loaders too."""
    values = dict(dropout=0.3, data_workers=workers, max_steps=6, eval_interval=2, eval_batches=1)
    straight = run(config(tmp_path / "straight", corpus, **values))
    cfg = config(tmp_path / "resumed", corpus, checkpoint_interval=0, **values)
    assert run(cfg, stop_at=3).status == "stopped"
    resumed = run(cfg)
    assert (straight.status, resumed.status, resumed.step) == ("completed", "completed", 6)
    assert max_diff(weights(tmp_path / "resumed"), weights(tmp_path / "straight")) == 0.0


def _strict(text: str):
    def refuse(word: str):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_every_json_file_a_run_writes_is_strict_json(tmp_path, corpus):
    """A run without evaluations wrote its best validation loss as a bare `Infinity` into training_status.json,
    and a NaN metric as `NaN` into metrics.jsonl: JSON has no such words, and strict readers refuse the file."""
    from training.metrics.logger import strict_json

    run(config(tmp_path, corpus, eval_interval=0, checkpoint_interval=2, max_steps=4))
    status = _strict((tmp_path / "output" / "training_status.json").read_text())
    assert status["best_val_loss"] is None and status["status"] == "completed"
    for line in (tmp_path / "output" / "metrics.jsonl").read_text().splitlines():
        _strict(line)
    for marker in (tmp_path / "checkpoints").glob(f"step-*/{MARKER}"):
        _strict(marker.read_text())
    assert _strict(strict_json({"train_loss": float("nan"), "rows": [float("-inf"), 1.5]})) == \
        {"train_loss": None, "rows": [None, 1.5]}
