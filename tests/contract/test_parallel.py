"""contract.parallel: the degrees' rules once, read by the launcher (request fields) and the training
package (hyperparameters). The two audiences' own tests are tests/jobs/request/test_parallelism.py and
tests/training/parallel/test_parallel_models.py; these check what they share."""

from __future__ import annotations

import pytest

from contract.parallel import (
    HYPERPARAMETERS,
    LAYER_SPLITTING,
    MODEL_PARALLEL,
    REQUEST,
    ParallelDims,
    layout_problems,
    microbatch_problems,
    parallel_hyperparameters,
    stages_per_rank,
    stages_problems,
)


def test_hsdp_shards_within_a_host_by_default():
    d = ParallelDims.resolve("hsdp", world=32, per_host=8)
    assert (d.replicate, d.shard, d.world) == (4, 8, 32)


@pytest.mark.parametrize("kw", [
    {"strategy": "tp", "tensor": 3},  # divides neither the world nor a host
    {"strategy": "tp", "tensor": 8, "per_host": 4, "hosts": 4},  # divides the world, not a host
    {"strategy": "hsdp", "shard": 3},
    {"strategy": "hybrid", "tensor": 2},
    {"strategy": "pp", "pipeline": 2, "microbatches": 1},
])
def test_one_rule_two_namings(kw):
    # The same problem for both audiences, on the same field: the request's path, the hyperparameter's name.
    kw = {"hosts": 1, "per_host": 4, **kw}
    [request] = layout_problems(**kw, a=REQUEST)
    [training] = layout_problems(**kw, a=HYPERPARAMETERS)
    names = {REQUEST.tensor: HYPERPARAMETERS.tensor, REQUEST.shard: HYPERPARAMETERS.shard,
             REQUEST.microbatches: HYPERPARAMETERS.microbatches, "strategy": "strategy"}
    assert names[request.path] == training.path
    assert request.path.startswith(("parallel.", "strategy")) and "parallel." not in training.message
    named = {HYPERPARAMETERS.tensor: HYPERPARAMETERS.tensor, HYPERPARAMETERS.shard: HYPERPARAMETERS.shard,
             HYPERPARAMETERS.microbatches: HYPERPARAMETERS.microbatches, "strategy": "tp_degree"}[training.path]
    assert named in training.message


def test_the_interleaved_schedule_holds_two_stages_per_rank():
    assert [stages_per_rank(s) for s in ("1f1b", "interleaved_1f1b", "gpipe")] == [1, 2, 1]
    [p] = layout_problems("pp", hosts=1, per_host=4, pipeline=4, n_layer=12, schedule="interleaved_1f1b")
    assert p.path == REQUEST.pipeline and "8 equal stages" in p.message
    assert layout_problems("pp", hosts=1, per_host=4, pipeline=4, n_layer=12) == []


@pytest.mark.parametrize("a", [REQUEST, HYPERPARAMETERS], ids=["request", "hyperparameters"])
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_1f1b", "gpipe"])
@pytest.mark.parametrize("given", [None, 1, 2, 3, 4])
def test_stages_a_rank_are_the_interleaved_schedules_choice(a, schedule, given):
    # Every schedule x every count, each audience naming its own field: the interleaved schedule holds the count
    # given (two by default, at least two), the others one; any other pairing is a problem naming the field.
    problems = stages_problems(schedule, given, a)
    interleaved = schedule == "interleaved_1f1b"
    runs = given is None or (given >= 2 if interleaved else given == 1)
    assert (problems == []) == runs
    if runs:
        assert stages_per_rank(schedule, given) == ((given or 2) if interleaved else 1)
    else:
        [p] = problems
        assert p.path == a.stages_per_rank and p.message.startswith(f"{a.name(a.stages_per_rank)}={given}")
        assert "interleaved_1f1b" in p.message
    # ... and layout_problems says the same of a pipeline that holds them.
    kw = dict(hosts=1, per_host=4, pipeline=2, n_layer=24, schedule=schedule, stages=given, a=a)
    assert [p.path for p in layout_problems("pp", **kw)] == [p.path for p in problems]


def test_a_stage_count_that_does_not_split_the_layers_names_the_stages_field():
    # 12 layers over 2 ranks x 4 stages: 8 stages do not split them; 3 a rank (6 stages) do.
    [p] = layout_problems("pp", hosts=1, per_host=2, pipeline=2, n_layer=12, schedule="interleaved_1f1b", stages=4)
    assert p.path == REQUEST.stages_per_rank and "12 layers do not split into 8 equal stages" in p.message
    assert "pipeline_stages_per_rank" in p.message
    assert layout_problems("pp", hosts=1, per_host=2, pipeline=2, n_layer=12, schedule="interleaved_1f1b",
                           stages=3) == []
    # The default count's problem stays on the pipeline degree, as before the field existed.
    [p] = layout_problems("pp", hosts=1, per_host=4, pipeline=4, n_layer=12, schedule="interleaved_1f1b")
    assert p.path == REQUEST.pipeline


def test_the_launcher_sends_stages_a_rank_only_when_given():
    assert "pp_stages_per_rank" not in parallel_hyperparameters("pp", pipeline=2, schedule="interleaved_1f1b")
    assert parallel_hyperparameters("pp", pipeline=2, schedule="interleaved_1f1b", stages=4)["pp_stages_per_rank"] == 4
    assert parallel_hyperparameters("fsdp", stages=4) == {}


def test_micro_batches_default_to_twice_the_stages_and_split_the_pooled_batch():
    assert microbatch_problems(None, 4, 1, 2) == []  # 8 micro-batches of the 8 pooled samples
    [p] = microbatch_problems(None, 4, 1, 1)  # 8 micro-batches of 4 pooled samples
    assert p.path == REQUEST.microbatches and "does not divide the 4 samples" in p.message


def test_ranks_fill_the_mesh_tensor_innermost():
    d = ParallelDims(pp=2, replicate=1, shard=2, tp=2)
    coords = [d.coordinates(r) for r in range(d.world)]
    assert [c["tensor"] for c in coords[:4]] == [0, 1, 0, 1] and coords[4]["pipeline"] == 1
    assert {tuple(c.values()) for c in coords} == {(p, 0, s, t) for p in range(2) for s in range(2) for t in range(2)}


def test_the_interleaved_schedule_needs_micro_batches_its_rounds_divide():
    # torch's ScheduleInterleaved1F1B: rounds = m // stages, and m % rounds must be 0 (10 over 4 stages: 2 rounds).
    assert microbatch_problems(10, 4, 1, None, schedule="interleaved_1f1b") == []
    [p] = microbatch_problems(9, 4, 1, None, schedule="interleaved_1f1b")  # 2 rounds do not divide 9
    assert p.path == REQUEST.microbatches and "2 rounds" in p.message
    assert microbatch_problems(9, 4, 1, None) == []  # 1F1B takes any count from the stage count up
    [p] = microbatch_problems(9, 4, 1, None, HYPERPARAMETERS, "interleaved_1f1b")
    assert p.path == "pp_microbatches" and p.message.startswith("pp_microbatches=9")


def test_a_grouped_batch_is_read_once_per_batch_group():
    from contract.parallel import batch_ranks

    assert batch_ranks(16, 8, 1) == 16 and batch_ranks(16, 8, 1, per_group=True) == 2
    assert batch_ranks(16, 2, 4, per_group=True) == 2
    # A pipeline step then splits the group's own micro-batch, not the pooled one: 4 chunks of 4 samples.
    assert microbatch_problems(4, 2, 2, 4, per_group=True) == []
    [p] = microbatch_problems(8, 2, 2, 4, per_group=True)
    assert "does not divide the 4 samples a pipeline step gets (micro_batch_size 4 per batch group)" in p.message


# Every strategy name a request may give, over worlds of one to several hosts, with the degrees each needs.
NAMED = [("single", {}), ("ddp", {}), ("fsdp", {}), ("hsdp", {}), ("tp", {"tensor": 2}), ("pp", {"pipeline": 2}),
         ("hybrid", {"tensor": 2, "pipeline": 2})]


@pytest.mark.parametrize("strategy,degrees", NAMED)
@pytest.mark.parametrize("hosts,per_host", [(1, 1), (1, 4), (2, 1), (2, 4), (4, 8)])
def test_the_degrees_a_strategy_names_derive_it_back(strategy, degrees, hosts, per_host):
    # The strategy is read from the degrees (ParallelDims.strategy), never stated beside them: a name resolves to
    # degrees that derive the same name, except where the layout degenerates into a simpler one, and then into
    # exactly that one (hsdp on one host shards over it all: fsdp; on hosts of one GPU it shards nothing: ddp;
    # every strategy on one rank is single).
    world = hosts * per_host
    if layout_problems(strategy, hosts=hosts, per_host=per_host, **degrees) or (strategy == "single" and world > 1):
        return
    dims = ParallelDims.resolve(strategy, world, per_host, **degrees)
    assert dims.world == (1 if strategy == "single" else world)
    expected = {("hsdp", True, False): "fsdp", ("hsdp", False, True): "ddp"}.get(
        (strategy, hosts == 1, per_host == 1), strategy)
    assert dims.strategy == ("single" if world == 1 else expected)
    assert dims.splits_layers == (dims.strategy in LAYER_SPLITTING)
    assert dims.builds_mesh == (dims.strategy in MODEL_PARALLEL)


@pytest.mark.parametrize("shape", [(pp, r, s, t) for pp in (1, 2) for r in (1, 3) for s in (1, 2) for t in (1, 4)])
def test_every_shape_derives_one_strategy_whose_name_resolves_to_it(shape):
    # Round trip the other way: any degrees have a strategy, and that name with the degrees a request can give
    # (tensor, pipeline, the shard degree) resolves to the same shape on its world (hosts of tp x shard GPUs).
    dims = ParallelDims(*shape)
    per_host = dims.tp * dims.shard
    again = ParallelDims.resolve(dims.strategy, dims.world, per_host, tensor=dims.tp, pipeline=dims.pp,
                                 shard=dims.shard if dims.builds_mesh else 0)
    assert again == dims
