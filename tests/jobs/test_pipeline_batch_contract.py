"""The planner's samples per optimizer step are the training package's, for pipelines and tensor groups.

One request, two readings: the planner's candidate for the layout the job renders, and what the training package
makes of the rendered hyperparameters on the same cluster (TrainConfig.batch_layout over the world size, the mesh,
and training.parallel.strategies.pp's micro-batch count). A tensor/pipeline group pools its ranks' micro-batches
(training.step.share_batch), and a pipeline step splits the pooled batch into pp_microbatches chunks.
"""

from __future__ import annotations

import json

import pytest

import training.config as training_config
from jobs import catalog
from jobs.planning import plan_request
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from jobs.request.platform_rules import validate_for_platform
from training.parallel.mesh import checked_dims
from training.parallel.strategies.pp import pipeline_microbatches

from .test_training_contract import toolkit_args

DATASET = "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/"


def job(strategy: str, size: str, instance_type: str, count: int, parallel: dict, **hyperparameters):
    return parse_request({"name": f"batch-{strategy}", "strategy": strategy, "model": "gpt", "model_size": size,
                          "dataset": DATASET, "instance": {"type": instance_type, "count": count},
                          "parallel": parallel, "hyperparameters": hyperparameters})


CASES = {
    # No global batch: micro x world x 1. The old planner counted micro x pp_microbatches x data ranks (2x this).
    "pp": job("pp", "1b", "ml.g5.12xlarge", 2, {"pipeline_parallel_degree": 2}, micro_batch_size=4),
    "pp-global": job("pp", "1b", "ml.g5.12xlarge", 2, {"pipeline_parallel_degree": 2, "pipeline_microbatches": 8},
                     micro_batch_size=4, global_batch_size=128),
    "hybrid-accum": job("hybrid", "7b", "ml.g5.48xlarge", 2,
                        {"tensor_parallel_degree": 8, "pipeline_parallel_degree": 2}, micro_batch_size=1, grad_accum=2),
    "tp-global": job("tp", "1b", "ml.p4d.24xlarge", 2, {"tensor_parallel_degree": 8}, micro_batch_size=2,
                     global_batch_size=64),
    "auto-pp": job("auto", "7b", "ml.g5.12xlarge", 4, {}, micro_batch_size=2, activation_checkpointing=True),
}


def planned(req, values: dict):
    """The planner's candidate for the layout the job renders (auto: its pick)."""
    result = plan_request(req)
    if req.strategy.value == "auto":
        return result.auto
    count = req.instance.count
    return next(c for c in result.candidates
                if (c.instance_type, c.layout.nodes, c.layout.strategy) == (req.instance.type, count, values["strategy"])
                and (c.layout.tensor, c.layout.pipeline) == (values["tp_degree"], values["pp_degree"]))


@pytest.mark.parametrize("name", CASES)
def test_the_planners_step_is_the_training_packages(platform, name):
    req = CASES[name]
    validate_for_platform(req, platform)
    create = render_create_training_job(req, platform, run_id="batch-0a1b2c3d", attempt=1)
    values = {k: json.loads(v) for k, v in create["HyperParameters"].items()}
    per_host = catalog.lookup(req.instance.type).accelerators
    world = req.instance.count * per_host
    # The training package's reading of the rendered job.
    cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
    global_batch, accum = cfg.batch_layout(world)
    degrees = checked_dims(cfg, world, per_host)
    chunks = pipeline_microbatches(cfg, degrees) if degrees.pp > 1 else 1
    pooled = cfg.micro_batch_size * degrees.pp * degrees.tp  # one micro-batch of the batch group
    # The planner's.
    cand = planned(req, values)
    assert (cand.layout.pipeline, cand.layout.tensor) == (degrees.pp, degrees.tp)
    assert cand.micro_batch == cfg.micro_batch_size
    assert cand.step_samples == global_batch == cfg.micro_batch_size * world * accum
    assert cand.layout.chunks() == chunks
    assert cand.layout.forward_batch(cand.micro_batch) == pooled / chunks
    assert cand.to_dict()["samples_per_step"] == global_batch
