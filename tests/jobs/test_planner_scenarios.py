"""Worked sizing scenarios, and inputs the planner cannot use answered with the field, the value and the fix."""

from __future__ import annotations

import itertools

import pytest

from contract.errors import RequestInvalid
from jobs.planning import PlanInputError, plan_request
from jobs.request.parse import parse_request

DATASET = "s3://bucket/data/"


def request(**fields):
    return parse_request({"name": "sizing", "dataset": DATASET, **fields})


def codes(result):
    return {w.code for w in result.warnings}


def test_resnet50_on_imagenet_on_one_p4d_is_data_parallel_near_8x():
    r = request(model="my.pkg:resnet50", instance={"type": "ml.p4d.24xlarge"}, input_mode="File",
                model_shape={"kind": "other", "params": 25_600_000, "flops_per_sample": 3 * 4.1e9},
                hyperparameters={"micro_batch_size": 256}, sizing={"dataset_samples": 1_281_167, "epochs": 90})
    result = plan_request(r)
    rec = result.recommendation
    assert rec.layout.strategy == "ddp" and rec.layout.gpus == 8 and rec.fits
    one_gpu = next(c for c in result.candidates if c.instance_type == "ml.p4d.24xlarge" and c.layout.gpus == 1)
    assert rec.throughput / one_gpu.throughput > 7.0  # near 8x
    assert "distribution_does_not_pay" not in codes(result)


def test_3b_vit_shards_within_the_node_and_replicates_across_nodes():
    shape = {"kind": "vit", "layers": 48, "hidden": 2304, "heads": 18, "image_size": 224, "patch_size": 14}
    r = request(model="my.pkg:vit3b", instance={"type": "ml.p4d.24xlarge", "count": 4}, model_shape=shape,
                hyperparameters={"micro_batch_size": 8, "global_batch_size": 4096})
    result = plan_request(r)
    single_replica = [c for c in result.candidates if c.layout.strategy == "ddp" and c.instance_type ==
                      "ml.p4d.24xlarge" and c.layout.nodes == 4]
    assert single_replica and not single_replica[0].fits  # 16 B x 3B of state does not fit 40 GB
    rec = result.recommendation
    assert (rec.layout.strategy, rec.layout.shard, rec.layout.replicate) == ("hsdp", 8, 4)


def test_70b_decoder_needs_tensor_within_nodes_and_pipeline_across():
    shape = {"kind": "decoder", "params": 70_000_000_000, "layers": 80, "hidden": 8192, "heads": 64,
             "seq_len": 4096, "vocab_size": 32000}
    one = plan_request(request(model="my.pkg:llama", instance={"type": "ml.p5.48xlarge"}, model_shape=shape,
                               hyperparameters={"micro_batch_size": 1}))
    assert "does_not_fit" in codes(one) and not one.recommendation.fits
    # The 32 ranks of a tensor x pipeline group pool one sample each: at the default 8 micro-batches a pipeline
    # step runs chunks of 4 (nothing fits); 32 micro-batches of one sample fit.
    four = plan_request(request(model="my.pkg:llama", instance={"type": "ml.p5.48xlarge", "count": 4},
                                model_shape=shape, hyperparameters={"micro_batch_size": 1},
                                parallel={"pipeline_microbatches": 32}))
    rec = four.recommendation
    # Tensor inside a node, pipeline across the 4 nodes. 32 micro-batches split only the 32 samples of a tensor x
    # pipeline group of 32 (one a rank): tensor 4 x pipeline 8 (two stages a node; 76 of 80 GiB) beats tensor 8 x
    # pipeline 4 (56 GiB) since the planner has tensor degrees under the node's width: 4-way all-reduces, and
    # 2,048-wide matmuls per GPU against 1,024-wide ones. (Tensor 4 x pipeline 4 with FSDP over the node's other half
    # was recommended before: its 16 samples do not split into 32 micro-batches, and the package refuses it.)
    assert rec.fits and rec.layout.tensor in (4, 8) and rec.layout.tensor * rec.layout.pipeline == 32
    assert rec.layout.problems(80, 64, rec.micro_batch, rec.per_group) == []
    from jobs.catalog import lookup
    from jobs.planning.candidates import evaluate
    from jobs.planning.layout import Layout, numerics

    tensor_8 = evaluate(four.model, numerics({"micro_batch_size": 1}), lookup("ml.p5.48xlarge"),
                        Layout(4, 8, tensor=8, pipeline=4, microbatches=32, schedule=rec.layout.schedule),
                        None, False)
    assert tensor_8.fits and tensor_8.throughput < rec.throughput


LLAMA_70B_SHAPE = {"kind": "decoder", "params": 70_000_000_000, "layers": 80, "hidden": 8192, "heads": 64,
                   "seq_len": 4096, "vocab_size": 32000}
ON_8_P5 = dict(model="my.pkg:llama", instance={"type": "ml.p5.48xlarge", "count": 8}, model_shape=LLAMA_70B_SHAPE,
               hyperparameters={"micro_batch_size": 1})


def test_a_70b_pipeline_holds_many_stages_a_rank_to_shrink_its_bubble():
    # A 70B over 8 p5s at the default micro-batches (twice the stages). Before stages a rank were the planner's
    # choice, the best was 16 1F1B stages around 32 micro-batches, idling (16 - 1) / (32 + 16 - 1) = 32% of every
    # step. Now: a pipeline of 8 ranks, a node each (tensor 8 inside it), every rank holding 10 one-layer stages,
    # idling 7 / (10 x 16 + 7) = 4%, with the request fields that run it. Its 20 hops a micro-batch each way carry
    # 1/8 of the activation from each rank (the package keeps the sequence split across a stage boundary; sending
    # the whole of it from every tensor rank, as it did, this layout took 6.6 s a step and lost to the 1F1B one).
    result = plan_request(request(**ON_8_P5))
    rec = result.recommendation
    lay = rec.layout
    assert rec.fits and lay.schedule == "interleaved_1f1b" and lay.stages_per_rank > 2
    assert rec.bubble == pytest.approx((lay.pipeline - 1) / (lay.stages_per_rank * lay.microbatches
                                                             + lay.pipeline - 1)) and rec.bubble < 0.1
    parallel = rec.to_dict()["request"]["parallel"]
    assert parallel["pipeline_stages_per_rank"] == lay.stages_per_rank
    assert parallel["pipeline_schedule"] == "interleaved_1f1b"
    one_f_one_b = max((c for c in result.every_layout if c.fits and c.layout.pipeline > 1
                       and c.layout.schedule == "1f1b"), key=lambda c: c.throughput)
    assert one_f_one_b.bubble == pytest.approx(15 / 47) and one_f_one_b.step_time_s > rec.step_time_s
    assert "pipeline_bubble" not in codes(result)
    # Inside one p5 (NVLink between stages) a 32-layer, 8192-wide decoder is best interleaved too: tensor 2 x
    # pipeline 4 holding 8 one-layer stages a rank, 3 / (8 x 8 + 3) = 4.5% idle.
    one_node = plan_request(request(model="my.pkg:m", instance={"type": "ml.p5.48xlarge", "count": 1},
                                    model_shape={**LLAMA_70B_SHAPE, "params": None, "layers": 32},
                                    hyperparameters={"micro_batch_size": 1}))
    lay = one_node.recommendation.layout
    assert (lay.tensor, lay.pipeline, lay.schedule, lay.stages_per_rank) == (2, 4, "interleaved_1f1b", 8)
    assert one_node.recommendation.bubble == pytest.approx(3 / 67)


def test_a_recommended_pipeline_that_idles_over_a_fifth_is_told_the_micro_batches_that_shrink_it():
    # The same 70B's best 1F1B layout (16 stages around 32 micro-batches, idling 32%) as the recommendation: the
    # planner takes the micro-batch count as given, so the warning names it with the bubble four times as many would
    # leave.
    import dataclasses
    import datetime as dt

    from jobs.planning.warnings import add_warnings

    req = request(**ON_8_P5)
    result = plan_request(req)
    idle = max((c for c in result.every_layout if c.fits and c.layout.schedule == "1f1b" and c.layout.pipeline > 1),
               key=lambda c: c.throughput)
    assert (idle.layout.pipeline, idle.layout.microbatches) == (16, 32)
    told = dataclasses.replace(result, recommendation=idle, auto=None, warnings=[])
    add_warnings(told, req, None, dt.datetime.now(dt.UTC))
    [warning] = [w for w in told.warnings if w.code == "pipeline_bubble"]
    assert "idles 32%" in warning.message and "128 micro-batches would idle 10%" in warning.message
    assert "parallel.pipeline_microbatches" in warning.message


def test_a_global_batch_that_splits_over_no_layout_is_an_error_naming_it():
    # 100 samples over 24 GPUs: no data-parallel layout splits them evenly, and the tensor and pipeline layouts
    # that read one micro-batch per batch group cannot run this 3-head, 12-layer model's 100 samples either. This
    # was a traceback (min() of no candidates).
    shape = {"kind": "decoder", "layers": 12, "hidden": 384, "heads": 3, "seq_len": 2048, "vocab_size": 32000}
    with pytest.raises(PlanInputError) as e:
        plan_request(request(model="my.pkg:m", model_shape=shape, instance={"type": "ml.p5.48xlarge", "count": 3},
                             hyperparameters={"micro_batch_size": 7, "global_batch_size": 100}))
    assert e.value.field == "hyperparameters.global_batch_size" and "multiple of 24" in e.value.fix


@pytest.mark.parametrize("strategy", ["auto", "ddp", "tp", "pp", "hybrid"])
def test_odd_batches_and_clusters_plan_or_name_the_field_never_a_traceback(strategy):
    # Global batches of 1 and 100, micro-batches of 1 and 7, on 1 and 3 instances of 8 GPUs and 4 of one GPU, with
    # and without a pipeline micro-batch count: each plans, or is a PlanInputError naming what to change (28 of 400
    # such random requests raised ValueError before).
    shape = {"kind": "decoder", "layers": 12, "hidden": 512, "heads": 8, "seq_len": 1024, "vocab_size": 32000}
    for gbs, micro, (instance_type, count), parallel in itertools.product(
            (None, 1, 100), (1, 7), (("ml.p5.48xlarge", 1), ("ml.p5.48xlarge", 3), ("ml.g5.xlarge", 4)),
            (None, {"pipeline_microbatches": 3})):
        hps = {"micro_batch_size": micro, **({"global_batch_size": gbs} if gbs else {})}
        try:
            req = request(model="my.pkg:m", model_shape=shape, strategy=strategy,
                          instance={"type": instance_type, "count": count}, hyperparameters=hps,
                          **({"parallel": parallel} if parallel else {}))
        except RequestInvalid:
            continue  # the request's own rules refuse it before any plan
        try:
            plan_request(req).to_dict()
        except PlanInputError as e:
            assert e.field and e.fix


def test_100m_model_with_a_small_batch_on_several_nodes_does_not_pay():
    shape = {"kind": "decoder", "layers": 12, "hidden": 768, "heads": 12, "seq_len": 256, "vocab_size": 8192}
    result = plan_request(request(model="my.pkg:small", instance={"type": "ml.p4d.24xlarge", "count": 4},
                                  model_shape=shape, hyperparameters={"micro_batch_size": 1}))
    assert "distribution_does_not_pay" in codes(result)


def test_a_deadline_the_cluster_cannot_meet():
    result = plan_request(request(model="gpt", model_size="1b", instance={"type": "ml.p4d.24xlarge", "count": 2},
                                  sizing={"dataset_tokens": 300_000_000_000, "deadline_hours": 24, "max_gpus": 16}))
    assert "deadline_unreachable" in codes(result)
    assert result.recommendation.hours > 24


def test_max_gpus_one_asks_for_one_gpu():
    result = plan_request(request(model="gpt", model_size="125m", instance={"type": "ml.p4d.24xlarge", "count": 2},
                                  sizing={"max_gpus": 1}))
    assert result.recommendation.layout.strategy == "single" and result.recommendation.layout.gpus == 1
    assert all(c.layout.gpus == 1 for c in result.candidates)


def test_json_has_the_documented_keys():
    doc = plan_request(request(model="gpt", model_size="350m", instance={"type": "ml.p5.48xlarge"},
                               spot=True, sizing={"dataset_tokens": 10**10})).to_dict()
    assert set(doc) >= {"recommendation", "candidates", "warnings"}
    keys = {"strategy", "degrees", "instance_type", "instance_count", "gpus", "memory_per_gpu_gib", "fits",
            "step_time_s", "throughput", "throughput_unit", "scaling_efficiency", "hours", "cost_usd", "spot",
            "checkpoint_minutes"}
    assert keys <= set(doc["recommendation"]) and all(keys <= set(c) for c in doc["candidates"])
    assert doc["recommendation"]["spot"] is True and doc["recommendation"]["throughput_unit"] == "tokens/s"


@pytest.mark.parametrize(("fields", "field"), [
    ({"model": "my.pkg:m", "instance": {"type": "ml.p4d.24xlarge"}}, "model_shape"),
    ({"model": "my.pkg:m", "instance": {"type": "ml.p4d.24xlarge"},
      "model_shape": {"kind": "decoder", "params": 1000, "layers": 32, "hidden": 4096, "heads": 32}},
     "model_shape.params"),
    ({"model": "my.pkg:m", "instance": {"type": "ml.p4d.24xlarge"},
      "model_shape": {"kind": "decoder", "layers": 4, "hidden": 100, "heads": 3}}, "model_shape.heads"),
    ({"model": "my.pkg:m", "instance": {"type": "ml.p4d.24xlarge"}, "model_shape": {"kind": "other"}},
     "model_shape.params"),
])
def test_inputs_the_planner_cannot_use_name_the_field(fields, field):
    with pytest.raises(PlanInputError) as info:
        plan_request(request(**fields))
    assert info.value.field == field and field in str(info.value)


def test_trainium_and_unknown_types_are_refused_with_the_field():
    import dataclasses

    base = request(instance={"type": "ml.p4d.24xlarge"})
    for instance_type in ("ml.trn1.32xlarge", "ml.p9.nope"):  # request validation refuses both first, too
        with pytest.raises(PlanInputError, match="instance.type"):
            plan_request(dataclasses.replace(base, instance=dataclasses.replace(base.instance, type=instance_type)))


def test_zero_instances_and_zero_gpus_are_refused_with_the_field():
    from jobs.catalog import lookup
    from jobs.planning.plan import requested_shape

    with pytest.raises(PlanInputError, match="instance.count"):
        requested_shape(lookup("ml.p4d.24xlarge"), 0, None)
    with pytest.raises(PlanInputError, match="sizing.max_gpus"):
        requested_shape(lookup("ml.p4d.24xlarge"), 1, type("S", (), {"max_gpus": 0})())


def test_a_request_that_names_its_stages_a_rank_gets_that_layout_and_auto_keeps_to_it():
    # The table keeps the layout a request names, at the stages a rank it names (5: 80 layers in 40 stages of 2);
    # strategy auto, told a count, runs pipelines only at that count, and says so of the others.
    named = plan_request(request(**{**ON_8_P5, "strategy": "hybrid", "parallel": {
        "tensor_parallel_degree": 8, "pipeline_parallel_degree": 8, "pipeline_schedule": "interleaved_1f1b",
        "pipeline_stages_per_rank": 5, "pipeline_microbatches": 16}}))
    [kept] = [c for c in named.candidates if c.layout.nodes == 8 and c.instance_type == "ml.p5.48xlarge"
              and (c.layout.tensor, c.layout.pipeline, c.layout.stages_per_rank) == (8, 8, 5)]
    assert kept.to_dict()["request"]["parallel"]["pipeline_stages_per_rank"] == 5

    from jobs.planning.auto import auto_scope
    from jobs.planning.layout import numerics

    told = request(model="gpt", model_size="7b", strategy="auto", instance={"type": "ml.p5.48xlarge", "count": 4},
                   hyperparameters={"micro_batch_size": 1},
                   parallel={"pipeline_schedule": "interleaved_1f1b", "pipeline_stages_per_rank": 4})
    result = plan_request(told)
    scope = auto_scope("gpt", result.model, numerics(told.hyperparameters), True, told.parallel)
    interleaved = [c for c in result.every_layout if c.layout.schedule == "interleaved_1f1b" and c.layout.pipeline > 1]
    assert {c.layout.stages_per_rank for c in interleaved} >= {2, 4}
    for c in interleaved:
        why = scope.refusal(c)
        if c.layout.stages_per_rank != 4:
            assert why is not None and "pipeline_stages_per_rank is 4" in why
        else:
            assert why is None or "pipeline_stages_per_rank" not in why
    pick = result.auto
    assert pick.layout.pipeline == 1 or pick.layout.stages_per_rank == 4
