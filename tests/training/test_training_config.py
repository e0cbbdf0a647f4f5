"""The hyperparameter contract with the launcher, metric lines, SMP parameters, and the plain SMP error."""

from __future__ import annotations

import json
import re

import pytest

from cli.container_emulator import script_args
from contract.errors import ConfigError
from contract.hyperparameters import TrainConfig, decode_hyperparameters
from contract.metrics import METRIC_NAMES, format_metrics
from training.config import ACCEPTED_HYPERPARAMETERS, parse_args, parse_mp_parameters
from training.train import main

ENV = {"SM_MODEL_DIR": "/m", "SM_OUTPUT_DATA_DIR": "/o", "SM_CHANNEL_TRAIN": "/data/train"}


def launcher_args(values: dict) -> list[str]:
    """What the script receives: SDK-v2 JSON encoding, then the toolkit's decoding into --key value."""
    return script_args(decode_hyperparameters({k: json.dumps(v) for k, v in values.items()}))


def test_launcher_keys_arrive_typed():
    cfg = parse_args(launcher_args({
        "sagemaker_program": "train.py", "strategy": "fsdp", "model": "gpt", "model_size": "125m",
        "checkpoint_interval": 50, "max_steps": 1000, "lr": 0.0006, "compile": True, "activation_checkpointing": False,
        "global_batch_size": 64, "async_checkpoint": True, "seq_len": None,
    }), env=ENV)
    assert (cfg.strategy, cfg.model_size, cfg.checkpoint_interval, cfg.max_steps) == ("fsdp", "125m", 50, 1000)
    assert cfg.lr == 0.0006 and cfg.compile is True and cfg.activation_checkpointing is False
    assert cfg.async_checkpoint is True and cfg.seq_len is None and cfg.global_batch_size == 64
    assert (cfg.model_dir, cfg.output_data_dir, cfg.train_dir) == ("/m", "/o", "/data/train")
    assert cfg.checkpoint_dir == "/opt/ml/checkpoints"


def test_dashes_equals_and_checkpoint_dir_from_the_environment():
    cfg = parse_args(["--max-steps=7", "--micro-batch-size", "2"], env={"TRAINING_CHECKPOINT_DIR": "/ck"})
    assert (cfg.max_steps, cfg.micro_batch_size, cfg.checkpoint_dir) == (7, 2, "/ck")


def test_unknown_key_names_it_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown hyperparameter 'max_step' \(did you mean 'max_steps'\?\)"):
        parse_args(["--max_step", "3"], env={})


@pytest.mark.parametrize(("argv", "message"), [
    (["--max_steps", "ten"], "'max_steps' must be an integer"),
    (["--compile", "maybe"], "'compile' must be true or false"),
    (["--strategy", "zero3"], "'strategy' is 'zero3': use one of single, ddp, fsdp, hsdp, tp, pp, hybrid, smp"),
    (["--micro_batch_size", "0"], "'micro_batch_size' must be at least 1"),
])
def test_bad_values_are_one_clear_message(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_args(argv, env={})


def test_accepted_hyperparameters_cover_the_launcher_keys():
    assert {"strategy", "model", "model_size", "checkpoint_interval", "mp_parameters", "max_steps",
            "global_batch_size", "micro_batch_size", "lr", "warmup_steps", "eval_interval", "precision",
            "grad_accum", "compile", "activation_checkpointing", "seq_len", "seed", "keep_checkpoints",
            "early_stopping_patience", "async_checkpoint"} <= ACCEPTED_HYPERPARAMETERS
    assert frozenset(vars(TrainConfig())) == ACCEPTED_HYPERPARAMETERS


def test_batch_layout():
    assert TrainConfig(micro_batch_size=4, global_batch_size=32).batch_layout(2) == (32, 4)
    assert TrainConfig(micro_batch_size=4, grad_accum=3).batch_layout(2) == (24, 3)
    with pytest.raises(ConfigError, match="not a multiple"):
        TrainConfig(micro_batch_size=4, global_batch_size=30).batch_layout(2)


def test_mp_parameters_in_both_renderings():
    as_toolkit_passes = launcher_args({"mp_parameters": {"tensor_parallel_degree": 2, "hybrid_shard_degree": 4}})
    assert as_toolkit_passes == ["--mp_parameters", "hybrid_shard_degree=4,tensor_parallel_degree=2"]
    cfg = parse_args(as_toolkit_passes, env={})
    assert cfg.mp_parameters == {"tensor_parallel_degree": 2, "hybrid_shard_degree": 4}
    assert parse_mp_parameters('{"sm_activation_offloading": true, "hybrid_shard_degree": 8}') == {
        "sm_activation_offloading": True, "hybrid_shard_degree": 8}
    with pytest.raises(ConfigError, match="did you mean 'tensor_parallel_degree'"):
        parse_mp_parameters("tensor_paralel_degree=2")
    with pytest.raises(ConfigError, match="must be an integer"):
        parse_mp_parameters({"hybrid_shard_degree": "many"})


def test_smp_outside_its_image_is_a_plain_error_naming_the_image(capsys, tmp_path):
    code = main(["--strategy", "smp", "--data", "synthetic", "--checkpoint_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: strategy 'smp' needs SageMaker model parallelism v2")
    assert "658645717510.dkr.ecr.<region>.amazonaws.com/smdistributed-modelparallel" in err
    assert "Traceback" not in err


def test_missing_train_channel_says_how_to_fix(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("SM_CHANNEL_TRAIN", raising=False)
    assert main(["--checkpoint_dir", str(tmp_path)]) == 2
    assert "data=synthetic" in capsys.readouterr().err


def launcher_regex(name: str) -> re.Pattern:
    return re.compile(rf"\[metrics\].*?\b{name}=([-+0-9.eE]+|nan|inf)")


def test_metric_lines_parse_with_the_launcher_regexes():
    record = {"step": 120, "train_loss": 2.31414, "lr": 0.0003, "tokens_per_sec": 12345.64,
              "step_time_ms": 85.21, "mfu": 0.4123, "epoch": 0.5, "grad_norm": 1.5e-5, "loss_scale": 65536.0}
    line = format_metrics(record)
    assert line.startswith("[metrics] step=120 epoch=0.5000 train_loss=2.3141 lr=0.0003 ")
    for name, value in record.items():
        assert float(launcher_regex(name).search(line).group(1)) == pytest.approx(value, rel=1e-3)
    assert launcher_regex("val_loss").search(format_metrics({"step": 1, "val_loss": float("nan")})).group(1) == "nan"
    assert set(record) <= set(METRIC_NAMES)
    with pytest.raises(ValueError, match="unknown metric"):
        format_metrics({"accuracy": 1.0})


def test_several_instances_without_torchrun_is_a_clear_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SM_HOSTS", '["algo-1", "algo-2"]')
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["--data", "synthetic", "--checkpoint_dir", str(tmp_path)]) == 2
    assert "2 instances (algo-1, algo-2) but was started without torchrun" in capsys.readouterr().err


def test_local_run_refuses_a_channel_it_cannot_mount(tmp_path):
    from cli.container_emulator import LocalRunError, run_local

    request = {"HyperParameters": {"strategy": '"ddp"'},
               "InputDataConfig": [{"ChannelName": "train", "DataSource": {
                   "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/train/"}}}]}
    with pytest.raises(LocalRunError, match=r"channel 'train' reads s3://bucket/train/.*data_dirs\['train'\]"):
        run_local(request, workdir=tmp_path, nproc=1)
