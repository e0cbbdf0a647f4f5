"""Every parallel layout the training package runs is a planner candidate: tensor degrees under a node's width,
pipelines beside data parallelism (fewer stages than nodes, several stages per node), the interleaved schedule;
the table shows each strategy's best few; and what `trainctl plan` shows renders to a request the launcher's rules
accept and the training package builds the same mesh from."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

import training.config as training_config
from jobs import catalog
from jobs.planning import plan_request
from jobs.planning.candidates import SHOWN_PER_STRATEGY, best, evaluate, layouts, shown
from jobs.planning.layout import Layout, numerics
from jobs.planning.memory import memory_per_gpu
from jobs.planning.shape import PlanInputError, model_facts
from jobs.planning.timing import step_time
from jobs.render.training_job import render_create_training_job
from jobs.request.parallelism import check_parallelism, request_problems
from jobs.request.parse import parse_request
from jobs.request.platform_rules import validate_for_platform
from training.parallel.mesh import checked_dims

from .test_training_contract import toolkit_args

DATASET = "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/"
GPT_7B = model_facts("gpt", "7b")  # 32 layers, 32 heads


def shapes(lays) -> set[tuple]:
    return {(lay.strategy, lay.tensor, lay.pipeline, lay.shard, lay.schedule) for lay in lays}


def test_tensor_degrees_under_the_node_width_shard_the_rest():
    lays = [lay for lay in layouts(GPT_7B, 4, 8) if lay.strategy == "tp"]
    assert [(lay.tensor, lay.shard) for lay in lays] == [(2, 16), (4, 8), (8, 4)]


def test_pipelines_beside_data_parallelism_and_several_stages_per_node():
    lays = layouts(GPT_7B, 4, 8)
    # Fewer stages than nodes: 2 stages of 2 nodes each, FSDP over a stage's 16 ranks (8 with tensor 2).
    assert {("pp", 1, 2, 16, "1f1b"), ("hybrid", 2, 2, 8, "1f1b")} <= shapes(lays)
    # More stages than nodes: 2 per node (4 ranks each), 4 per node with tensor 2 (2 ranks each).
    assert {("pp", 1, 8, 4, "1f1b"), ("hybrid", 2, 16, 1, "1f1b")} <= shapes(lays)
    # The interleaved schedule where the layers split into 2 stages per rank: 32 layers hold 16 x 2, not 32 x 2.
    assert ("pp", 1, 16, 2, "interleaved_1f1b") in shapes(lays)
    assert ("pp", 1, 32, 1, "interleaved_1f1b") not in shapes(lays) and ("pp", 1, 32, 1, "1f1b") in shapes(lays)
    for lay in lays:
        stage = lay.gpus // lay.pipeline  # consecutive ranks: whole nodes or a part of one, never two parts
        assert stage % lay.gpus_per_node == 0 or lay.gpus_per_node % stage == 0, lay
        assert lay.replicate * lay.shard * lay.tensor * lay.pipeline == lay.gpus, lay


def test_one_node_gets_pipelines_too():
    assert {("pp", 1, 2, 4, "1f1b"), ("pp", 1, 8, 1, "1f1b"), ("hybrid", 4, 2, 1, "1f1b")} <= shapes(layouts(GPT_7B, 1, 8))


def test_the_interleaved_bubble_is_torchs():
    n = numerics({"micro_batch_size": 1, "global_batch_size": 64})
    spec = catalog.lookup("ml.p4de.24xlarge")
    for schedule, v in (("1f1b", 1), ("interleaved_1f1b", 2)):
        lay = Layout(8, 8, tensor=8, pipeline=8, microbatches=64, schedule=schedule)
        # (p - 1) / (v m + p - 1): 7/71 for 1F1B, 7/135 interleaved (torch's ScheduleInterleaved1F1B, v = 2)
        assert step_time(GPT_7B, n, spec, lay).bubble == pytest.approx(7 / (v * 64 + 7))


def test_the_interleaved_schedule_is_offered_at_every_stage_count_that_splits_the_layers():
    # gpt 7b's 32 layers over 4 nodes: a pipeline of 4 ranks holds 2, 4 or 8 stages a rank (8, 16, 32 stages), one of
    # 16 ranks holds 2 (not 3: 48 stages do not split 32 layers); the default, 2, is the layout without a count.
    lays = [lay for lay in layouts(GPT_7B, 4, 8) if lay.schedule == "interleaved_1f1b" and lay.tensor == 1]
    per_rank = {p: sorted({lay.stages_per_rank for lay in lays if lay.pipeline == p}) for p in (4, 16)}
    assert per_rank == {4: [2, 4, 8], 16: [2]}
    assert all(GPT_7B.layers % (lay.pipeline * lay.stages_per_rank) == 0 for lay in lays)
    assert {lay.virtual for lay in lays if lay.stages_per_rank == 2} == {0}
    deep = next(lay for lay in lays if lay.pipeline == 4 and lay.stages_per_rank == 8)
    assert deep.request_fields()["parallel"]["pipeline_stages_per_rank"] == 8
    assert deep.hyperparameters()["pp_stages_per_rank"] == 8


def test_more_stages_a_rank_trade_the_bubble_for_point_to_point_hops():
    # The same pipeline at 2, 4 and 8 stages a rank: the bubble (p - 1) / (v m + p - 1) falls, the hops between
    # stages (two a stage held, per micro-batch) grow with v, and the first rank keeps fewer micro-batches in flight.
    n = numerics({"micro_batch_size": 1, "global_batch_size": 64})
    spec = catalog.lookup("ml.p5.48xlarge")
    times, mems = {}, {}
    for v in (2, 4, 8):
        lay = Layout(4, 8, shard=8, pipeline=4, microbatches=8, schedule="interleaved_1f1b",
                     virtual=0 if v == 2 else v)
        times[v], mems[v] = step_time(GPT_7B, n, spec, lay), memory_per_gpu(GPT_7B, n, lay).activations
        assert times[v].bubble == pytest.approx(3 / (v * 8 + 3))
    assert times[2].exposed_comm < times[4].exposed_comm < times[8].exposed_comm
    assert times[2].compute > times[4].compute > times[8].compute  # the compute slots include the bubble
    assert mems[2] > mems[4] > mems[8]


def test_a_stage_boundary_carries_a_sequence_shard_from_every_rank():
    # Two p5s, a stage each, tensor 8 inside: each of a stage's 8 ranks sends its peer 1/8 of the activation (the
    # package keeps the sequence split across the boundary), all 8 through the node's NIC at once, twice (forward
    # and backward) per forward pass of each stage a rank holds, fill and drain included. The package waits for
    # them; Megatron's stack runs them beside its compute, so only what does not hide, and the contention, shows.
    from jobs.planning.calibration import MEGATRON
    from jobs.planning.timing import PACKAGE, _exposed, collective

    n = numerics({"micro_batch_size": 1, "global_batch_size": 8})
    spec = catalog.lookup("ml.p5.48xlarge")
    lay = Layout(2, 8, tensor=8, pipeline=2, microbatches=4)
    overlapped = {g: dataclasses.replace(PACKAGE[g], p2p_overlap=MEGATRON["hopper"].p2p_overlap) for g in PACKAGE}
    full = 2 * n.forward(lay).micro_batch * GPT_7B.tokens * GPT_7B.hidden  # bf16
    hops = 2 * lay.stages_per_rank * (lay.microbatches + (lay.pipeline - 1)) * collective(
        "ag", 2 * full / 8, spec, 1, 2, 8)
    waited, hidden = step_time(GPT_7B, n, spec, lay), step_time(GPT_7B, n, spec, lay, overlapped)
    assert waited.exposed_comm - hidden.exposed_comm == pytest.approx(hops - _exposed(hops, waited.compute))
    assert hidden.exposed_comm < waited.exposed_comm


def test_gpipe_holds_every_micro_batch_and_interleaving_a_little_more_than_1f1b():
    n = numerics({"micro_batch_size": 4})
    mem = {s: memory_per_gpu(GPT_7B, n, Layout(2, 8, shard=8, pipeline=2, microbatches=8, schedule=s)).activations
           for s in ("1f1b", "interleaved_1f1b", "gpipe")}
    # The blocks' activations scale with the micro-batches in flight on the first stage: 1F1B 2 (one per stage),
    # interleaved 2 x (1 + (p - 1) / (p v)) = 2.5, GPipe all 8; the loss and the head's input do not.
    assert mem["gpipe"] - mem["1f1b"] == pytest.approx(12 * (mem["interleaved_1f1b"] - mem["1f1b"]))
    assert mem["interleaved_1f1b"] > mem["1f1b"]


def test_the_table_shows_each_strategys_best_few_and_keeps_the_best():
    n = numerics({"micro_batch_size": 2})
    spec = catalog.lookup("ml.p4d.24xlarge")
    cands = [evaluate(GPT_7B, n, spec, lay, None, False) for lay in layouts(GPT_7B, 4, 8)]
    table = shown(cands)
    strategies = {c.layout.strategy for c in cands}
    assert len(cands) > 30 and len(table) <= SHOWN_PER_STRATEGY * len(strategies)
    assert best(table) is best(cands) and best(cands) is not None
    # A strategy none of whose layouts fits still shows its least hungry one.
    ddp = [c for c in cands if c.layout.strategy == "ddp"]
    assert not any(c.fits for c in ddp) and ddp[0] in table


SCENARIOS = [
    ("7b", "ml.p4d.24xlarge", 4, {"micro_batch_size": 2}),
    ("7b", "ml.g5.12xlarge", 4, {"micro_batch_size": 8, "activation_checkpointing": True}),
    ("1b", "ml.p4d.24xlarge", 1, {"micro_batch_size": 4}),
]


@pytest.mark.parametrize(("size", "instance_type", "count", "hps"), SCENARIOS)
def test_every_layout_the_plan_shows_renders_to_a_request_the_rules_accept(platform, size, instance_type, count, hps):
    base = {"name": "layout", "model": "gpt", "model_size": size, "dataset": DATASET,
            "instance": {"type": instance_type, "count": count}, "hyperparameters": hps}
    result = plan_request(parse_request({**base, "strategy": "fsdp"}))
    per_host = catalog.lookup(instance_type).accelerators
    mine = [c for c in result.candidates if (c.instance_type, c.layout.nodes) == (instance_type, count)]
    # Every one the plan shows runs as shown (candidates.runnable): none the package would refuse.
    assert all(not c.layout.problems(result.model.layers, result.model.heads, c.micro_batch, c.per_group) for c in mine)
    assert len({c.layout.strategy for c in mine}) >= 4
    for c in mine:
        fields = c.to_dict()["request"]
        req = parse_request({**base, **fields})
        validate_for_platform(req, platform)
        create = render_create_training_job(req, platform, run_id="layout-0a1b2c3d", attempt=1)
        values = {k: json.loads(v) for k, v in create["HyperParameters"].items()}
        assert values["strategy"] == c.layout.strategy
        cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
        # The package derives the same degrees, so the same strategy, from what the candidate renders.
        assert checked_dims(cfg, count * per_host, per_host) == c.layout.dims, fields
        assert cfg.pp_schedule == c.layout.schedule or c.layout.pipeline == 1


@pytest.mark.parametrize(("strategy", "count", "runs_as"), [("hsdp", 1, "fsdp"), ("hsdp", 2, "hsdp"), ("ddp", 1, "ddp")])
def test_the_table_keeps_the_layout_a_request_names_as_its_degrees_run_it(strategy, count, runs_as):
    # hsdp on one node shards over the node: the degrees are fsdp's, so the fsdp row is the request's own layout
    # (matched by degrees, not by name); kept in the table even where it is neither the best nor auto's pick.
    req = parse_request({"name": "layout", "model": "gpt", "model_size": "1b", "dataset": DATASET, "strategy": strategy,
                         "instance": {"type": "ml.p4d.24xlarge", "count": count}})
    from jobs.planning.candidates import requested_layouts

    result = plan_request(req)
    mine = [c for c in result.candidates if (c.instance_type, c.layout.nodes) == ("ml.p4d.24xlarge", count)]
    [named] = requested_layouts(mine, req)
    assert named.layout.strategy == runs_as and named in result.candidates


def test_a_layout_the_package_refuses_says_so_through_the_same_rule():
    # 16 micro-batches of a 2-stage pipeline's 4 pooled samples: the request rules refuse it with the field to change
    # (and the plan shows no such layout: the next test).
    lay = Layout(2, 8, shard=8, pipeline=2, microbatches=16)
    [p] = lay.problems(32, 32, 2)
    assert p.path == "parallel.pipeline_microbatches" and "does not divide the 4 samples" in p.message
    assert check_parallelism("pp", hosts=2, per_host=8, pipeline=2, microbatches=16, micro_batch_size=2) == [p]


PROMISE_SHAPES = {
    "gpt 7b": {"model": "gpt", "model_size": "7b"},
    "70b": {"model": "my.pkg:llama", "model_shape": {"kind": "decoder", "params": 70_000_000_000, "layers": 80,
                                                     "hidden": 8192, "heads": 64, "seq_len": 4096,
                                                     "vocab_size": 32000}},
    "125m": {"model": "my.pkg:small", "model_shape": {"kind": "decoder", "layers": 12, "hidden": 768, "heads": 12,
                                                      "seq_len": 1024, "vocab_size": 8192}},
}


@pytest.mark.parametrize("shape", PROMISE_SHAPES)
def test_no_layout_the_plan_offers_is_one_the_launcher_refuses(shape):
    # Every layout of the requested shape (`every_layout`, what --json lists), across instance counts, micro-batch
    # sizes, a given micro-batch count and schedule: its request fields, with the candidate's micro-batch, pass the
    # launcher's check (jobs.request.parallelism.request_problems). Before candidates.runnable, 586 of 1,674 such
    # layouts in this matrix carried a pipeline micro-batch count that does not divide the samples it splits.
    checked = deeper = 0
    for (instance_type, count), micro, parallel in itertools.product(
            (("ml.p5.48xlarge", 1), ("ml.p5.48xlarge", 4), ("ml.g5.12xlarge", 2)), (1, 2, 3),
            (None, {"pipeline_microbatches": 16}, {"pipeline_schedule": "interleaved_1f1b"})):
        base = {"name": "promise", "dataset": DATASET, "strategy": "auto", **PROMISE_SHAPES[shape],
                "instance": {"type": instance_type, "count": count}, "hyperparameters": {"micro_batch_size": micro}}
        result = plan_request(parse_request({**base, **({"parallel": parallel} if parallel else {})}))
        for c in result.every_layout:
            fields = c.to_dict()["request"]
            req = parse_request({**base, "strategy": fields["strategy"].value,
                                 "parallel": {**(parallel or {}), **fields.get("parallel", {})},
                                 "hyperparameters": {**base["hyperparameters"], **fields.get("hyperparameters", {}),
                                                     "micro_batch_size": c.micro_batch}})
            assert request_problems(req, c.layout.nodes, c.layout.gpus_per_node) == [], (c.layout, fields)
            checked += 1
            deeper += c.layout.stages_per_rank > 2
    assert checked > 100 and deeper > 0


def test_selective_checkpointing_costs_between_none_and_full():
    # Memory: the blocks keep r.h + 8a.h per token (training.models.speedups keeps attention's and the 1st and 3rd
    # matmuls' outputs; tests/training/models/test_selective_checkpointing.py measures it), against 2r.h + 15a.h without
    # checkpointing and r.h with full. Time: the elementwise passes and 5/12 of the matmuls again, not the whole
    # forward.
    spec = catalog.lookup("ml.p4de.24xlarge")
    lay = Layout(1, 8, shard=8)
    policies = {"none": {}, "full": {"activation_checkpointing": True},
                "selective": {"activation_checkpointing": True, "activation_checkpointing_policy": "selective"}}
    n = {k: numerics({"micro_batch_size": 4, **v}) for k, v in policies.items()}
    mem = {k: memory_per_gpu(GPT_7B, v, lay).activations for k, v in n.items()}
    time = {k: step_time(GPT_7B, v, spec, lay).compute for k, v in n.items()}
    assert mem["full"] < mem["selective"] < mem["none"] and time["none"] < time["selective"] < time["full"]
    h, tokens, layers = GPT_7B.hidden, 4 * GPT_7B.tokens, GPT_7B.layers
    # bf16 under FSDP: a = r = 2; the difference to full is the 8a.h each block keeps beyond its input.
    assert mem["selective"] - mem["full"] == pytest.approx(tokens * layers * 8 * 2 * h)
    # The 7b forward is compute bound: selective's extra is near 5/12 of full's.
    assert (time["selective"] - time["none"]) / (time["full"] - time["none"]) == pytest.approx(5 / 12, abs=0.05)
    # Without activation_checkpointing the policy changes nothing.
    off = numerics({"micro_batch_size": 4, "activation_checkpointing_policy": "selective"})
    assert memory_per_gpu(GPT_7B, off, lay).activations == mem["none"]


def test_checkpointing_every_second_block_costs_half_of_everything_s_recompute():
    # activation_checkpointing_every 2 (torchtitan's layer-wise selective checkpointing): 16 of gpt 7b's 32 blocks
    # recompute, the other 16 keep all their activations.
    spec = catalog.lookup("ml.p4de.24xlarge")
    lay = Layout(1, 8, shard=8)
    n = {every: numerics({"micro_batch_size": 4, "activation_checkpointing": every > 0,
                          "activation_checkpointing_every": max(every, 1)}) for every in (0, 1, 2)}
    time = {k: step_time(GPT_7B, v, spec, lay).compute for k, v in n.items()}
    mem = {k: memory_per_gpu(GPT_7B, v, lay).activations for k, v in n.items()}
    assert time[2] - time[0] == pytest.approx((time[1] - time[0]) / 2, rel=1e-9)
    h, tokens, layers = GPT_7B.hidden, 4 * GPT_7B.tokens, GPT_7B.layers
    per_block = (2 * 2 + 15 * 2) * h  # bf16 under FSDP: 2r.h + 15a.h a token
    assert mem[2] - mem[1] == pytest.approx(tokens * layers / 2 * (per_block - 2 * h))
    with pytest.raises(PlanInputError, match="activation_checkpointing_every"):
        numerics({"activation_checkpointing": True, "activation_checkpointing_every": 0})


def grouped_request(per_group: bool | None, **fields):
    hps = {"micro_batch_size": 1, "global_batch_size": 2}
    if per_group is not None:
        hps["micro_batch_per_group"] = per_group
    return parse_request({"name": "grouped", "model": "gpt", "model_size": "7b", "dataset": DATASET,
                          "instance": {"type": "ml.p4d.24xlarge", "count": 2}, "hyperparameters": hps, **fields})


TP8 = {"strategy": "tp", "parallel": {"tensor_parallel_degree": 8}}


def test_a_global_batch_smaller_than_the_gpus_runs_one_micro_batch_per_batch_group(platform):
    # 16 GPUs as tensor 8 x data 2: a global batch of 2 is one sample per batch group.
    req = grouped_request(True, **TP8)
    validate_for_platform(req, platform)
    create = render_create_training_job(req, platform, run_id="grouped-0a1b2c3d", attempt=1)
    cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
    assert cfg.micro_batch_per_group and cfg.batch_layout(16 // 8) == (2, 1)
    # Without it every rank reads its own micro-batch: 2 samples do not split over 16 ranks, and the rule says so.
    from contract.errors import RequestInvalid

    with pytest.raises(RequestInvalid) as info:
        validate_for_platform(grouped_request(None, **TP8), platform)
    assert [p.path for p in info.value.problems] == ["hyperparameters.global_batch_size"]


def test_the_planner_offers_grouped_batches_where_pooled_ones_cannot_split():
    result = plan_request(grouped_request(None))
    mine = [c for c in result.candidates if (c.instance_type, c.layout.nodes) == ("ml.p4d.24xlarge", 2)]
    # Data-parallel layouts need 16 samples; tensor and pipeline layouts run on 2 with a grouped batch.
    assert mine and all(c.layout.strategy in ("tp", "pp", "hybrid") and c.per_group for c in mine)
    for c in mine:
        assert c.step_samples == 2 and c.layout.data_parallel <= 2  # 1 batch group: 2 micro-batches accumulate
        assert c.to_dict()["request"]["hyperparameters"] == {"micro_batch_per_group": True}
    assert result.recommendation in mine


def test_auto_runs_a_grouped_batch_only_when_the_request_asks_for_it():
    # auto renders degrees, not micro_batch_per_group: a grouped candidate would be refused by the training
    # package's batch arithmetic without it.
    result = plan_request(grouped_request(None, strategy="auto"))
    assert result.auto is None or not result.auto.per_group
    grouped = [c for c in result.candidates if c.per_group]
    assert grouped and "micro_batch_per_group" in result.scope.refusal(grouped[0])
    asked = grouped_request(True, strategy="auto")
    pick = plan_request(asked).auto
    assert pick is not None and pick.per_group and pick.step_samples == 2


def test_auto_with_a_grouped_batch_renders_and_the_package_takes_it(platform):
    # The request rules count the planner's batch groups (its pick's degrees), as the training package will.
    req = grouped_request(True, strategy="auto")
    validate_for_platform(req, platform)
    create = render_create_training_job(req, platform, run_id="grouped-0a1b2c3d", attempt=1)
    cfg = training_config.parse_args(toolkit_args(create["HyperParameters"]), env={})
    data = 16 // (cfg.tp_degree * cfg.pp_degree)
    assert cfg.micro_batch_per_group and cfg.strategy in ("tp", "pp", "hybrid") and cfg.batch_layout(data)[0] == 2


def test_fsdp_by_tensor_parallel_is_a_candidate_for_a_70b_on_32_p5_with_the_request_that_runs_it():
    # Tensor 8 inside each node, FSDP over the 32 nodes: in the plan's every_layout (its table shows each strategy's
    # best two), with the request fields that run exactly those degrees.
    req = parse_request({"name": "l70", "model": "my.pkg:llama", "dataset": DATASET, "strategy": "fsdp",
                         "instance": {"type": "ml.p5.48xlarge", "count": 32},
                         "model_shape": {"kind": "decoder", "layers": 80, "hidden": 8192, "heads": 64,
                                         "seq_len": 8192, "vocab_size": 128256},
                         "hyperparameters": {"micro_batch_size": 1, "activation_checkpointing": True}})
    doc = plan_request(req).to_dict()
    [two_d] = [c for c in doc["every_layout"] if c["degrees"] == {"replicate": 1, "shard": 32, "tensor": 8,
                                                                   "pipeline": 1}]
    assert two_d["strategy"] == "tp" and two_d["fits"]
    assert two_d["request"] == {"strategy": "tp", "parallel": {"tensor_parallel_degree": 8}}
    assert len(doc["every_layout"]) > len([c for c in doc["candidates"] if c["instance_count"] == 32
                                           and c["instance_type"] == "ml.p5.48xlarge"])
