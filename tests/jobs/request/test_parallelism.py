"""The launcher's checks of a request's `parallel` section, and the rank map `trainctl plan` prints."""

from __future__ import annotations

import pytest

from contract.parallel import parallel_hyperparameters
from jobs.request.parallelism import check_parallelism, describe_layout, mesh_layout


def fields(problems) -> list[str]:
    return [p.path for p in problems]


@pytest.mark.parametrize("strategy, kw", [
    ("hsdp", {}), ("tp", {"tensor": 8}), ("pp", {"pipeline": 4, "n_layer": 32}),
    ("hybrid", {"tensor": 8, "pipeline": 2, "n_layer": 32, "n_head": 32, "micro_batch_size": 2}),
])
def test_good_layouts_pass(strategy, kw):
    assert check_parallelism(strategy, hosts=4, per_host=8, **kw) == []


def test_degrees_that_do_not_divide_the_world_name_the_field():
    [p] = check_parallelism("tp", hosts=1, per_host=6, tensor=4)
    assert p.path == "parallel.tensor_parallel_degree" and "does not divide the 6 GPUs" in p.message


def test_tensor_groups_may_not_span_instances():
    [p] = check_parallelism("tp", hosts=3, per_host=4, tensor=3)  # 12 GPUs: 3 divides the world, not a host
    assert p.path == "parallel.tensor_parallel_degree" and "span instances" in p.message


def test_the_model_must_split_evenly():
    problems = check_parallelism("hybrid", hosts=2, per_host=8, tensor=4, pipeline=2, n_layer=6, n_head=6,
                                 schedule="interleaved_1f1b")
    assert fields(problems) == ["parallel.tensor_parallel_degree", "parallel.pipeline_parallel_degree"]
    assert "6 attention heads" in problems[0].message and "4 equal stages" in problems[1].message


def test_a_pipeline_needs_at_least_as_many_micro_batches_as_stages():
    [p] = check_parallelism("pp", hosts=1, per_host=8, pipeline=4, microbatches=2)
    assert p.path == "parallel.pipeline_microbatches" and "fewer than the 4 pipeline stages" in p.message
    [p] = check_parallelism("pp", hosts=1, per_host=8, pipeline=2, microbatches=3, micro_batch_size=1)
    assert p.path == "parallel.pipeline_microbatches" and "does not divide the 2 samples" in p.message


def test_strategy_and_degrees_must_agree():
    assert fields(check_parallelism("hsdp", hosts=2, per_host=8, tensor=2)) == ["strategy"]
    assert fields(check_parallelism("pp", hosts=2, per_host=8)) == ["strategy"]
    assert fields(check_parallelism("hybrid", hosts=2, per_host=8, tensor=2)) == ["strategy"]
    [p] = check_parallelism("fsdp", hosts=2, per_host=8, pipeline=2)
    assert p.path == "parallel.pipeline_parallel_degree" and "strategy 'fsdp'" in p.message
    assert check_parallelism("smp", hosts=2, per_host=8, tensor=4) == []  # SMP's own rules apply there


def test_shard_degree_must_divide_the_data_ranks():
    [p] = check_parallelism("hsdp", hosts=2, per_host=8, shard=3)
    assert p.path == "parallel.hybrid_shard_degree"


def test_layout_keeps_tensor_groups_on_one_host():
    hosts = ["algo-1", "algo-2"]
    rows = mesh_layout("hybrid", hosts, 4, tensor=2, pipeline=2)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["pipeline"], r["replica"], r["shard"]), set()).add(r["host"])
    assert all(len(h) == 1 for h in groups.values())
    # Pipeline stages are the outermost dimension: stage 0 on the first host, stage 1 on the second.
    assert {r["host"] for r in rows if r["pipeline"] == 0} == {"algo-1"}
    lines = describe_layout("hybrid", hosts, 4, tensor=2, pipeline=2)
    assert lines[0].endswith("2 x 1 x 2 x 2") and lines[1].startswith("algo-1: r0=pp0/dp0.0/tp0, r1=pp0/dp0.0/tp1")


def test_hyperparameters_for_the_renderer():
    assert parallel_hyperparameters("pp", pipeline=2, microbatches=8, schedule="gpipe") == {
        "tp_degree": 1, "pp_degree": 2, "dp_shard": 0, "pp_schedule": "gpipe", "pp_microbatches": 8}
    assert parallel_hyperparameters("fsdp") == {}


def _shaped(heads: int, tensor: int, model: str = "my.pkg:llama") -> dict:
    return {"name": "shaped", "model": model, "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/x/",
            "strategy": "tp", "instance": {"type": "ml.p4d.24xlarge", "count": 2},
            "parallel": {"tensor_parallel_degree": tensor},
            "model_shape": {"kind": "decoder", "layers": 126, "hidden": 128 * heads, "heads": heads}}


def test_a_model_of_ones_own_is_checked_against_its_own_shape(platform):
    from contract.errors import RequestInvalid
    from jobs.request.parse import parse_request, validate_for_platform

    # A 405B-like shape: 128 heads split 8 ways; the same degree on a 6-head shape is refused on its own heads.
    validate_for_platform(parse_request(_shaped(heads=128, tensor=8)), platform)
    with pytest.raises(RequestInvalid) as info:
        validate_for_platform(parse_request(_shaped(heads=6, tensor=4)), platform)
    assert [p.path for p in info.value.problems] == ["parallel.tensor_parallel_degree"]
    assert "does not divide the model's 6 attention heads" in info.value.problems[0].message


def test_a_reference_model_trains_its_preset_so_a_shape_beside_it_is_refused():
    from contract.errors import RequestInvalid
    from jobs.request.parse import parse_request

    with pytest.raises(RequestInvalid) as info:
        parse_request(_shaped(heads=128, tensor=8, model="gpt"))
    [problem] = [p for p in info.value.problems if p.path == "model_shape"]
    assert "gpt trains its model_size preset (small: 6 layers, 6 heads" in problem.message
    assert "package.module:factory" in problem.message


def _interleaved(stages: int | None, schedule: str = "interleaved_1f1b", layers: int = 80) -> dict:
    parallel = {"pipeline_parallel_degree": 8, "pipeline_schedule": schedule, "pipeline_microbatches": 16}
    if stages is not None:
        parallel["pipeline_stages_per_rank"] = stages
    return {"name": "interleaved", "model": "my.pkg:llama", "strategy": "pp",
            "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/x/",
            "instance": {"type": "ml.p4d.24xlarge", "count": 8}, "parallel": parallel,
            "model_shape": {"kind": "decoder", "layers": layers, "hidden": 8192, "heads": 64},
            "hyperparameters": {"micro_batch_size": 2}}


@pytest.mark.parametrize("fields, path, words", [
    (_interleaved(4, "1f1b"), "parallel.pipeline_stages_per_rank", "needs the interleaved_1f1b schedule"),
    (_interleaved(1), "parallel.pipeline_stages_per_rank", "loops at least 2 stages a rank"),
    # 80 layers over 8 ranks x 3 stages: 24 stages do not split them.
    (_interleaved(3), "parallel.pipeline_stages_per_rank", "80 layers do not split into 24 equal stages"),
], ids=["1f1b", "one", "uneven"])
def test_stages_a_rank_the_request_cannot_run_are_refused_naming_the_field(platform, fields, path, words):
    from contract.errors import RequestInvalid
    from jobs.request.parse import parse_request, validate_for_platform

    with pytest.raises(RequestInvalid) as info:
        validate_for_platform(parse_request(fields), platform)
    [problem] = info.value.problems
    assert problem.path == path and words in problem.message


def test_stages_a_rank_reach_the_job_as_the_package_reads_them(platform):
    from jobs.request.parallelism import request_hyperparameters, request_problems
    from jobs.request.parse import parse_request, validate_for_platform

    request = parse_request(_interleaved(10))  # 80 layers over 8 ranks x 10 stages: one layer a stage
    validate_for_platform(request, platform)
    hps = request_hyperparameters(request)
    assert (hps["pp_schedule"], hps["pp_stages_per_rank"]) == ("interleaved_1f1b", 10)
    assert "pp_stages_per_rank" not in request_hyperparameters(parse_request(_interleaved(None)))
    assert request_problems(request, hosts=8, per_host=8) == []
