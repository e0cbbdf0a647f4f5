"""The instance catalog agrees with the API's instance types; the planner's picks follow memory."""

from __future__ import annotations

import boto3
import pytest

from jobs import catalog
from jobs.planning.auto_strategy import plan


def test_catalog_types_are_training_instance_types_of_the_api():
    shape = boto3.client("sagemaker", region_name="us-east-1").meta.service_model.operation_model(
        "CreateTrainingJob").input_shape.members["ResourceConfig"].members["InstanceType"]
    assert set(catalog.CATALOG) <= set(shape.enum)
    for family in ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "g5", "g6", "g6e", "trn1", "trn1n", "c5", "m5"):
        assert any(s.family == family for s in catalog.CATALOG.values()), family


@pytest.mark.parametrize(("instance_type", "kind", "accelerators", "memory", "efa"), [
    ("ml.p4d.24xlarge", "gpu", 8, 40, True),
    ("ml.p4de.24xlarge", "gpu", 8, 80, True),
    ("ml.p5.48xlarge", "gpu", 8, 80, True),
    ("ml.p5en.48xlarge", "gpu", 8, 141, True),
    ("ml.g5.12xlarge", "gpu", 4, 24, True),
    ("ml.g5.2xlarge", "gpu", 1, 24, False),
    ("ml.g6e.48xlarge", "gpu", 8, 48, True),
    ("ml.trn1.32xlarge", "neuron", 16, 32, True),
    ("ml.c5.18xlarge", "cpu", 0, 0, False),
])
def test_published_specs(instance_type, kind, accelerators, memory, efa):
    s = catalog.lookup(instance_type)
    assert (s.kind, s.accelerators, s.accelerator_memory_gib, s.efa) == (kind, accelerators, memory, efa)
    assert s.accelerated is (kind != "cpu")


def test_catalog_is_consistent():
    for s in catalog.CATALOG.values():
        assert (s.accelerators > 0) is s.accelerated, s
        assert (s.accelerator_memory_gib > 0) is s.accelerated, s
        assert s.vcpus > 0 and s.memory_gib > 0
    assert catalog.lookup("ml.nope") is None


@pytest.mark.parametrize(("model", "size", "instance_type", "count", "hps", "strategy"), [
    ("gpt", "125m", "ml.g5.12xlarge", 1, {}, "ddp"),   # ~1.9 GiB of state: a replica per 24 GiB A10G
    # fsdp's ~34 GiB overflow 24 GiB; 2 stages hold half the layers each, on chunks of 8 x 2 / 4 samples.
    ("gpt", "1b", "ml.g5.12xlarge", 2, {}, "pp"),
    ("gpt", "350m", "ml.g5.12xlarge", 2, {}, "fsdp"),  # fits sharded, and splits no layers it need not split
    ("gpt", "1b", "ml.p4de.24xlarge", 1, {}, "ddp"),   # fits an 80 GiB A100 with room to spare
    # A tensor group pools its ranks' micro-batches, so tp saves no activation memory per GPU, and it gathers the
    # pooled batch's logits whole for the loss: at micro-batch 8 nothing fits two p5 (fsdp ~169 GiB, tp ~243,
    # hybrid ~135), and pp is the one needing the least (~102).
    ("gpt", "7b", "ml.p5.48xlarge", 2, {}, "pp"),
    # With activation checkpointing FSDP2's one gathered bf16 block leaves room: fsdp fits 40 GiB A100s (~30 GiB).
    ("gpt", "7b", "ml.p4d.24xlarge", 4, {"activation_checkpointing": True}, "fsdp"),
    ("gpt", "tiny", "ml.g5.2xlarge", 1, {}, "single"),
    ("gpt", "7b", "ml.c5.4xlarge", 1, {}, "ddp"),
    ("my.pkg:build", "big", "ml.p4d.24xlarge", 1, {}, "fsdp"),
])
def test_planner(model, size, instance_type, count, hps, strategy):
    assert plan(model, size, instance_type, count, hyperparameters=hps).strategy == strategy


def test_planner_figures_are_present_where_the_planner_needs_them():
    for s in catalog.CATALOG.values():
        if s.kind == "gpu":
            assert s.gpu.peak_tflops > 0 and s.gpu.memory_gbps > 0 and s.gpu.link_gbps > 0, s
            assert s.network_gbits > 0, s
        assert s.runnable is (s.kind != "neuron")
    assert catalog.lookup("ml.p5.48xlarge").gpu.peak_tflops > catalog.lookup("ml.p4d.24xlarge").gpu.peak_tflops
