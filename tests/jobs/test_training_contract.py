"""jobs renders what the training package reads: its hyperparameter names, and values that survive the
in-container toolkit's decoding (json.loads each value, then `--key str(value)`; see training/config.py)."""

from __future__ import annotations

import json

import pytest

import training.config as training_config
from cli.container_emulator import script_args
from contract.hyperparameters import decode_hyperparameters
from jobs.naming import new_run_id
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request

from .conftest import REQUEST_EXAMPLES


def toolkit_args(hyperparameters: dict[str, str]) -> list[str]:
    """The training script's arguments as the platform's images build them from a job's HyperParameters:
    sagemaker-training's decoding and `mapping.to_cmd_args`, as `trainctl local`'s container emulator reproduces
    them (cli.container_emulator.script_args over contract.hyperparameters.decode_hyperparameters)."""
    return script_args(decode_hyperparameters(hyperparameters))


@pytest.mark.parametrize("path", REQUEST_EXAMPLES, ids=lambda p: p.name)
def test_rendered_examples_parse_in_the_training_config(path, platform):
    req = parse_request(json.loads(path.read_text()))
    create = render_create_training_job(req, platform, run_id=new_run_id(req.name), attempt=1)
    cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
    assert (cfg.strategy, cfg.model, cfg.model_size) == (req.resolved_strategy, req.model, req.model_size)
    assert cfg.checkpoint_interval == req.checkpoint_interval
    for key, value in req.hyperparameters.items():
        assert getattr(cfg, key) == value, key
    if req.strategy == "smp":
        assert cfg.mp_parameters == {"tensor_parallel_degree": req.parallel.tensor_parallel_degree,
                                     "hybrid_shard_degree": req.parallel.hybrid_shard_degree}


@pytest.mark.parametrize("parallel", [{}, {"tensor_parallel_degree": 8, "context_parallel_degree": 2}])
def test_smp_parameters_parse_in_the_training_config(parallel, platform):
    req = parse_request({"name": "smp", "strategy": "smp", "dataset": "s3://b-1/x/", "parallel": parallel,
                         "instance": {"type": "ml.p5.48xlarge", "count": 2}})
    create = render_create_training_job(req, platform, run_id="smp-1", attempt=1)
    cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
    assert cfg.mp_parameters == {"tensor_parallel_degree": 1, **parallel}
