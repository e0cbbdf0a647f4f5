"""Checkpoints know whose they are (training.checkpoint.ownership, init_from): a run refuses another run's checkpoint or another
model's, adopts one whose owner is unknown with a line, and starts from other weights only when told to
(`init_from`: weights alone, at step 0, with a fresh optimizer), resharding them into any strategy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from contract.container import ENV_RUN_ID, METRICS_FILE
from contract.errors import ConfigError
from contract.failures import FailureCode, parse_failure_line
from tests.training.helpers import config, spawn, weights
from training.checkpoint.markers import MARKER, read_checkpoint
from training.loop import train
from training.parallel.process_group import setup
from training.resilience.outcome import TrainingFailure
from training.resilience.stop import StopFlag
from training.train import main

# Run a: 4 steps, step-2 and step-4 kept, its model exported.
RUN_A = dict(max_steps=4, checkpoint_interval=2, keep_checkpoints=5)
# A run whose first step starts from the loaded weights and leaves them unchanged: its export is what it loaded.
STILL = dict(lr=0.0, max_steps=1, checkpoint_interval=0)


def run(cfg, run_id: str | None, monkeypatch: pytest.MonkeyPatch):
    if run_id is None:
        monkeypatch.delenv(ENV_RUN_ID, raising=False)
    else:
        monkeypatch.setenv(ENV_RUN_ID, run_id)
    return train(cfg, setup(cfg), StopFlag())


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, corpus) -> Path:
    root = tmp_path_factory.mktemp("run_a")
    with pytest.MonkeyPatch.context() as monkeypatch:
        run(config(root, corpus, **RUN_A), "a", monkeypatch)
    return root


def copy_checkpoints(run_a: Path, root: Path) -> Path:
    shutil.copytree(run_a / "checkpoints", root / "checkpoints")
    return root / "checkpoints"


def marker(step: Path) -> dict:
    return json.loads((step / MARKER).read_text())


def test_markers_record_the_run_and_the_model(run_a):
    recorded = marker(run_a / "checkpoints" / "step-4")
    assert recorded["run_id"] == "a"
    assert recorded["fingerprint"] == {
        "model": "gpt", "vocab_size": 64, "master_dtype": "float32",
        "shape": {"architecture": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 64}}


def test_another_runs_checkpoint_is_refused_before_any_step(run_a, tmp_path, corpus, monkeypatch):
    copy_checkpoints(run_a, tmp_path)
    with pytest.raises(TrainingFailure) as failed:
        run(config(tmp_path, corpus, max_steps=6), "b", monkeypatch)
    message = str(failed.value)
    assert failed.value.code is FailureCode.CHECKPOINT_UNREADABLE
    assert message.startswith(f"run 'b' cannot resume the checkpoint step-4 in {tmp_path / 'checkpoints'}, "
                              "written by run 'a': it is another run's"), message
    assert "point checkpoint_dir at this run's own folder" in message
    assert f"init_from={tmp_path / 'checkpoints' / 'step-4'}" in message
    assert not (tmp_path / "output" / METRICS_FILE).exists()  # no step ran


def test_another_models_checkpoint_is_refused_naming_what_differs(run_a, tmp_path, corpus, monkeypatch):
    copy_checkpoints(run_a, tmp_path)
    with pytest.raises(TrainingFailure) as failed:
        run(config(tmp_path, corpus, model_size="small"), "a", monkeypatch)
    message = str(failed.value)
    assert "run 'a' cannot resume" in message and "written by run 'a': its model differs" in message, message
    assert "shape.n_layer: 2 in the checkpoint, 6 in this run" in message
    assert "shape.d_model: 32 in the checkpoint, 384 in this run" in message
    assert not (tmp_path / "output" / METRICS_FILE).exists()


@pytest.mark.parametrize("old", ["no owner fields", "no run id"])
def test_a_checkpoint_without_an_owner_is_adopted_with_a_line(old, run_a, tmp_path, corpus, monkeypatch, capsys):
    checkpoints = copy_checkpoints(run_a, tmp_path)
    for step in checkpoints.iterdir():
        recorded = marker(step)
        if old == "no owner fields":
            del recorded["run_id"], recorded["fingerprint"]
        else:
            recorded["run_id"] = None
        (step / MARKER).write_text(json.dumps(recorded))
    result = run(config(tmp_path, corpus, **{**RUN_A, "max_steps": 6}), "b", monkeypatch)
    out = capsys.readouterr().out
    said = "has an unknown owner" if old == "no owner fields" else "was written by a run without a run id"
    assert f"[checkpoint] step-4 {said}" in out and "run 'b'" in out, out
    assert "resumed from" in out and result.step == 6
    assert marker(checkpoints / "step-6")["run_id"] == "b"


def test_a_run_without_a_run_id_resumes_its_own_folder(tmp_path, corpus, monkeypatch, capsys):
    cfg = config(tmp_path, corpus, max_steps=2, checkpoint_interval=1)
    run(cfg, None, monkeypatch)
    assert marker(tmp_path / "checkpoints" / "step-2")["run_id"] is None
    result = run(config(tmp_path, corpus, max_steps=3, checkpoint_interval=1), None, monkeypatch)
    assert result.step == 3 and "resumed from" in capsys.readouterr().out


def init_sources(run_a: Path) -> dict[str, Path]:
    return {"step folder": run_a / "checkpoints" / "step-4", "checkpoint folder": run_a / "checkpoints",
            "model.safetensors": run_a / "model" / "model.safetensors"}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("source", ["step folder", "checkpoint folder", "model.safetensors"])
def test_init_from_loads_weights_alone_and_starts_at_step_0(source, run_a, tmp_path, corpus, monkeypatch, capsys):
    given = init_sources(run_a)[source]
    result = run(config(tmp_path, corpus, init_from=str(given), **STILL), "b", monkeypatch)
    assert "[checkpoint] started from the weights of" in capsys.readouterr().out
    assert result.step == 1
    assert_same_weights(weights(tmp_path), weights(run_a))  # lr 0: the first step started from a's weights
    own = read_checkpoint(tmp_path / "checkpoints" / "step-1")
    assert own["loop"]["step"] == 1 and own["scheduler"]["last_epoch"] == 1
    counts = {v.item() for k, v in own["optim"].items() if k.endswith(".step")}
    assert counts == {1.0}  # AdamW's step count: its moments are this run's, not a's (4 steps)
    assert marker(tmp_path / "checkpoints" / "step-1")["run_id"] == "b"
    if source == "step folder":  # once the run has checkpoints of its own, init_from is ignored
        result = run(config(tmp_path, corpus, init_from=str(given), **{**STILL, "max_steps": 2}), "b", monkeypatch)
        out = capsys.readouterr().out
        assert f"init_from={given} ignored: the run resumes its own checkpoint" in out
        assert "started from the weights" not in out and result.step == 2


def test_init_from_reshards_into_two_ranks(run_a, tmp_path, corpus, monkeypatch):
    sources = init_sources(run_a)
    runs = {"fsdp_from_step": ("fsdp", sources["step folder"]),
            "fsdp_from_safetensors": ("fsdp", sources["model.safetensors"]),
            "ddp_from_safetensors": ("ddp", sources["model.safetensors"])}
    monkeypatch.setenv(ENV_RUN_ID, "b")
    spawn(2, [(vars(config(tmp_path / name, corpus, strategy=strategy, micro_batch_size=2, init_from=str(given),
                           **STILL)), None) for name, (strategy, given) in runs.items()])
    for name in runs:
        assert_same_weights(weights(tmp_path / name), weights(run_a))


@pytest.mark.parametrize("source", ["step folder", "model.safetensors"])
def test_init_from_a_model_of_another_shape_names_the_tensor(source, run_a, tmp_path, corpus, monkeypatch):
    given = init_sources(run_a)[source]
    with pytest.raises(ConfigError) as failed:
        run(config(tmp_path, corpus, init_from=str(given), seq_len=8, **STILL), "b", monkeypatch)
    assert "tensor 'pos.weight' is [16, 32] there and [8, 32] in this model" in str(failed.value)


def test_init_from_a_missing_path_is_a_config_error(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "output" / "data"))
    missing = tmp_path / "nowhere" / "step-9"
    args = {"data": "channels", "seq_len": 16, "max_steps": 1, "train_dir": corpus / "train",
            "checkpoint_dir": tmp_path / "checkpoints", "model_dir": tmp_path / "model", "init_from": missing}
    assert main([token for k, v in args.items() for token in (f"--{k}", str(v))]) == 2
    code, message = parse_failure_line((tmp_path / "output" / "failure").read_text())
    assert code is FailureCode.CONFIG_INVALID
    assert message.startswith(f"init_from={missing} does not exist"), message
    assert "Traceback" not in capsys.readouterr().err
