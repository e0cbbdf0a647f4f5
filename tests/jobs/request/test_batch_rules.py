"""global_batch_size, micro_batch_size and grad_accum against the cluster a request may run on.

The training package refuses at startup a global batch that micro_batch_size x world size x grad_accum cannot make
(contract.hyperparameters.batch_layout); the launcher refuses the same request before anything is paid for
(jobs.request.platform_rules.batch_problems), on instance.type and on every fallback type, with the fix in the message.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

import training.config as training_config
from contract.errors import ConfigError, RequestInvalid
from jobs import catalog
from jobs.platform import LocalPlatformSettings
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from jobs.request.platform_rules import batch_problems, request_clusters, validate_for_platform
from tests.jobs.test_training_contract import toolkit_args

DATASET = "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/"


def doc(strategy="ddp", instance_type="ml.p4d.24xlarge", count=1, fallbacks=(), parallel=None, size="125m",
        **hyperparameters) -> dict:
    d = {"name": f"batch-{strategy}", "strategy": strategy, "model": "gpt", "model_size": size, "dataset": DATASET,
         "instance": {"type": instance_type, "count": count, "fallbacks": list(fallbacks)},
         "hyperparameters": hyperparameters}
    if parallel:
        d["parallel"] = parallel
    return d


def problems(platform, d: dict) -> dict[str, str]:
    """{field: message} of what validation refuses ({} when accepted)."""
    try:
        validate_for_platform(parse_request(d), platform)
    except RequestInvalid as exc:
        return {p.path: p.message for p in exc.problems}
    return {}


GBS = "hyperparameters.global_batch_size"
ACCUM = "hyperparameters.grad_accum"


@pytest.mark.parametrize("d", [
    doc("ddp", "ml.p4d.24xlarge", 2, global_batch_size=256, micro_batch_size=8),  # 256 = 8 x 16 x 2
    doc("fsdp", "ml.g5.12xlarge", 3, global_batch_size=96, micro_batch_size=4),  # 96 = 4 x 12 x 2
    doc("tp", "ml.p4d.24xlarge", 2, parallel={"tensor_parallel_degree": 8}, size="1b", global_batch_size=64,
        micro_batch_size=2),  # tensor ranks pool micro-batches: 2 x 16 x 2
    doc("pp", "ml.g5.12xlarge", 2, parallel={"pipeline_parallel_degree": 2, "pipeline_microbatches": 8},
        size="1b", global_batch_size=128, micro_batch_size=4),  # 4 x 8 x 4
    doc("auto", "ml.g5.48xlarge", 2, size="1b", global_batch_size=64, micro_batch_size=2),  # 2 x 16 x 2
    doc("ddp", "ml.p4d.24xlarge", 1, fallbacks=["ml.g5.12xlarge"], global_batch_size=128, micro_batch_size=8),
    doc("single", "ml.g5.12xlarge", 1, global_batch_size=24, micro_batch_size=8),  # one process: 8 x 1 x 3
    doc("ddp", "ml.p4d.24xlarge", 2, global_batch_size=256, micro_batch_size=8, grad_accum=2),
    doc("ddp", "ml.p4d.24xlarge", 2, micro_batch_size=3, grad_accum=5),  # no global batch: nothing to split
], ids=["ddp", "fsdp", "tp", "pp", "auto", "fallback", "single", "grad-accum-agrees", "no-global-batch"])
def test_batches_the_training_package_runs_are_accepted(platform, d):
    assert problems(platform, d) == {}


@pytest.mark.parametrize(("d", "needs"), [
    (doc("ddp", "ml.p4d.24xlarge", 2, global_batch_size=200, micro_batch_size=8), "8 x 16 = 128"),
    (doc("fsdp", "ml.g5.12xlarge", 3, global_batch_size=64, micro_batch_size=4), "4 x 12 = 48"),
    (doc("tp", "ml.p4d.24xlarge", 2, parallel={"tensor_parallel_degree": 8}, size="1b", global_batch_size=16,
         micro_batch_size=2), "2 x 16 = 32"),  # not 2 x 2 data ranks: tensor ranks each read a micro-batch
    (doc("pp", "ml.g5.12xlarge", 2, parallel={"pipeline_parallel_degree": 2, "pipeline_microbatches": 8},
         size="1b", global_batch_size=48, micro_batch_size=4), "4 x 8 = 32"),
    (doc("auto", "ml.g5.48xlarge", 2, size="1b", global_batch_size=40, micro_batch_size=2), "2 x 16 = 32"),
    (doc("single", "ml.g5.12xlarge", 1, global_batch_size=12, micro_batch_size=8), "8 x 1 = 8"),
], ids=["ddp", "fsdp", "tp", "pp", "auto", "single"])
def test_batches_the_training_package_refuses_are_refused_naming_the_field(platform, d, needs):
    found = problems(platform, d)
    assert list(found) == [GBS]
    assert needs in found[GBS]
    assert f"{d['instance']['count']} x {d['instance']['type']}" in found[GBS] and "(instance.type;" in found[GBS]


def test_a_fallback_type_with_other_gpus_per_instance_is_checked_too(platform):
    ok_primary = doc("ddp", "ml.p4d.24xlarge", 3, fallbacks=["ml.g5.12xlarge"], global_batch_size=192,
                     micro_batch_size=8)  # p4d: 8 x 24 = 192 (accum 1); g5.12xlarge: 8 x 12 = 96 (accum 2)
    assert problems(platform, ok_primary) == {}
    bad_fallback = doc("ddp", "ml.g5.12xlarge", 3, fallbacks=["ml.p4d.24xlarge"], global_batch_size=96,
                       micro_batch_size=8)  # fine on 12 GPUs, smaller than one micro-batch per GPU on 24
    found = problems(platform, bad_fallback)
    assert list(found) == [GBS]
    message = found[GBS]
    assert message.startswith("96 is smaller than micro_batch_size x world size = 8 x 24 = 192 on 3 x "
                              "ml.p4d.24xlarge with 8 GPUs each (instance.fallbacks[0]; strategy ddp)")
    assert "instance.type" not in message  # the primary type takes it
    assert "use global_batch_size 192 (any multiple of 192 runs on every instance type" in message.lower()
    assert "micro_batch_size 4 to keep 96" in message


def test_the_message_says_why_and_the_nearest_values_that_run_everywhere(platform):
    found = problems(platform, doc("fsdp", "ml.p4d.24xlarge", 2, fallbacks=["ml.g5.12xlarge"],
                                   global_batch_size=200, micro_batch_size=8))
    message = found[GBS]
    assert message.startswith("200 is not a multiple of micro_batch_size x world size = 8 x 16 = 128 on 2 x "
                              "ml.p4d.24xlarge with 8 GPUs each (instance.type; strategy fsdp); not a multiple of "
                              "micro_batch_size x world size = 8 x 8 = 64 on 2 x ml.g5.12xlarge with 4 GPUs each "
                              "(instance.fallbacks[0]; strategy fsdp)")
    assert "every process counts" in message and "refuses this at startup" in message
    assert message.endswith("Use global_batch_size 128 or 256 (any multiple of 128 runs on every instance type the "
                            "request may use)")  # 200 / 16 GPUs is no whole number: no micro_batch_size keeps it


def test_the_field_is_named_as_the_request_spells_it(platform):
    found = problems(platform, doc("ddp", "ml.p4d.24xlarge", 1, **{"global-batch-size": 100}))
    assert list(found) == ["hyperparameters.global-batch-size"]
    assert found["hyperparameters.global-batch-size"].startswith("100 is not a multiple of micro_batch_size x "
                                                                 "world size = 8 x 8 = 64")


def test_grad_accum_that_disagrees_is_refused_with_the_value_that_agrees(platform):
    found = problems(platform, doc("ddp", "ml.p4d.24xlarge", 2, global_batch_size=256, micro_batch_size=8,
                                   grad_accum=4))
    assert list(found) == [ACCUM]
    assert found[ACCUM].startswith("4 disagrees with global_batch_size / (micro_batch_size x world size): "
                                   "256 / (8 x 16) = 2 on 2 x ml.p4d.24xlarge")
    assert found[ACCUM].endswith("Set grad_accum 2 or remove it (global_batch_size sets it)")
    # A fallback with other GPUs per instance needs another accumulation: only removing it runs on both.
    found = problems(platform, doc("ddp", "ml.p4d.24xlarge", 2, fallbacks=["ml.g5.12xlarge"],
                                   global_batch_size=256, micro_batch_size=8, grad_accum=2))
    assert "256 / (8 x 8) = 4 on 2 x ml.g5.12xlarge" in found[ACCUM]
    assert found[ACCUM].endswith("Remove it: global_batch_size sets it for each instance type")


def test_trainctl_local_is_left_to_its_process_count(platform):
    local = LocalPlatformSettings.of(platform)
    req = parse_request(doc("ddp", "ml.p4d.24xlarge", 1, global_batch_size=100))
    assert batch_problems(req, local) == []
    assert batch_problems(req, platform)


def test_a_deployed_platform_named_local_keeps_every_check(platform):
    # `local` is a valid name_prefix (platform_config); only trainctl local's own settings type turns checks off.
    named_local = dataclasses.replace(platform, name_prefix="local")
    d = doc("tp", "ml.p4d.24xlarge", 1, parallel={"tensor_parallel_degree": 16},
            global_batch_size=100)
    d["dataset"] = "./data/tokens/train"
    d["image"] = "999999999999.dkr.ecr.us-east-1.amazonaws.com/elsewhere/trainer:1"
    found = problems(named_local, d)
    assert set(found) == {"dataset", "parallel.tensor_parallel_degree", "hyperparameters.global_batch_size",
                          "image"}, found
    assert found == problems(platform, d)
    assert problems(LocalPlatformSettings.of(named_local), d) == {}


def test_a_parallel_degree_a_fallback_type_cannot_hold_is_refused(platform):
    # tensor 8 fits the 8 GPUs of a p4d, not the 4 of the g5.12xlarge a capacity retry would move to.
    found = problems(platform, doc("tp", "ml.p4d.24xlarge", 2, fallbacks=["ml.g5.12xlarge"], size="1b",
                                   parallel={"tensor_parallel_degree": 8}, micro_batch_size=2))
    assert "parallel.tensor_parallel_degree" in found
    assert found["parallel.tensor_parallel_degree"].endswith("(on instance.fallbacks[0], ml.g5.12xlarge)")


# ---- the launcher and the training package agree, on a grid ----------------------------------------------------

def training_refuses(req, platform) -> set[str]:
    """What the training package makes of each job the request may launch (instance.type, each fallback): the
    rendered hyperparameters as the toolkit passes them, over the world torchrun starts. The hyperparameter names
    it refuses ({} when every attempt would start)."""
    refused = set()
    for instance_type in req.instance_types:
        create = render_create_training_job(req, platform, run_id="batch-0a1b2c3d", attempt=1,
                                            instance_type=instance_type)
        values = {k: json.loads(v) for k, v in create["HyperParameters"].items()}
        rc = create["ResourceConfig"]
        per_host = max(1, catalog.lookup(rc["InstanceType"]).accelerators)
        world = rc["InstanceCount"] * per_host if values["sagemaker_torch_distributed_enabled"] else 1
        cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
        try:
            cfg.batch_layout(world)
        except ConfigError as exc:
            refused.add(str(exc).split("=", 1)[0])
    return refused


TYPES = [("ml.g5.2xlarge", ()), ("ml.g5.12xlarge", ()), ("ml.p4d.24xlarge", ()),
         ("ml.p4d.24xlarge", ("ml.g5.12xlarge",)), ("ml.g5.12xlarge", ("ml.g5.48xlarge", "ml.g5.2xlarge"))]
GRID = [
    (strategy, types, count, micro, total, accum)
    for strategy, types, count in itertools.product(("ddp", "fsdp", "single", "auto"), TYPES, (1, 2, 3))
    if not (strategy == "single" and (count > 1 or types[1]))
    for micro, total, accum in itertools.product((1, 3, 8), (None, 8, 24, 48, 96, 100, 192), (None, 1, 2))
]


def test_the_grid_is_wide_enough():
    assert len(GRID) > 1000


@pytest.mark.parametrize("chunk", range(4))
def test_the_request_rule_and_the_training_package_agree(platform, chunk):
    """Same numbers, two readings: every request on the grid is refused before launch exactly when the training
    package would refuse one of its attempts, naming the same hyperparameter."""
    seen = {"accepted": 0, "refused": 0}
    for strategy, (instance_type, fallbacks), count, micro, total, accum in GRID[chunk::4]:
        hps = {"micro_batch_size": micro, **({"global_batch_size": total} if total else {}),
               **({"grad_accum": accum} if accum else {})}
        req = parse_request(doc(strategy, instance_type, count, fallbacks, **hps))
        launcher = {p.path.removeprefix("hyperparameters.") for p in batch_problems(req, platform)}
        training = training_refuses(req, platform)
        case = (strategy, instance_type, fallbacks, count, hps)
        if training:
            # The launcher names the first thing training would say: an uneven global batch before grad_accum.
            assert launcher == ({"global_batch_size"} if "global_batch_size" in training else training), case
        else:
            assert launcher == set(), case
        seen["refused" if launcher else "accepted"] += 1
    assert min(seen.values()) > 50, seen


def test_clusters_are_every_type_an_attempt_may_use(platform):
    req = parse_request(doc("ddp", "ml.p4d.24xlarge", 2, fallbacks=["ml.g5.12xlarge", "ml.g5.2xlarge"]))
    assert [(c.path, c.world) for c in request_clusters(req)] == [
        ("instance.type", 16), ("instance.fallbacks[0]", 8), ("instance.fallbacks[1]", 2)]
    groups = parse_request({"name": "groups", "dataset": DATASET, "strategy": "ddp", "instance_groups": [
        {"name": "data", "type": "ml.c5.4xlarge", "count": 2}, {"name": "gpus", "type": "ml.g5.12xlarge", "count": 2}]})
    assert [(c.path, c.world) for c in request_clusters(groups)] == [("instance_groups", 8)]
