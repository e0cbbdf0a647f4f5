"""The job request: defaults, every kind of problem named by its field path, the cross-field rules."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from contract.errors import Problem, RequestInvalid
from contract.metrics import MAX_METRIC_DEFINITIONS, METRIC_NAMES
from contract.schema import reference_rows
from jobs.platform import TrainingPlan
from jobs.request.limits import MAX_ENVIRONMENT
from jobs.request.parse import JobRequest, parse_request, validate_for_platform
from tests.jobs.conftest import REQUEST_EXAMPLES

BASE = {
    "name": "gpt-small",
    "dataset": "s3://datasets-bucket/tokens/train/",
    "instance": {"type": "ml.g5.12xlarge"},
}


def request(**overrides) -> dict:
    doc = copy.deepcopy(BASE)
    doc.update(overrides)
    return doc


def problems_of(doc: dict) -> dict[str, str]:
    with pytest.raises(RequestInvalid) as info:
        parse_request(doc)
    return {p.path: p.message for p in info.value.problems}


def test_examples_are_valid_and_cover_the_strategies_spot_and_fsx(platform):
    assert len(REQUEST_EXAMPLES) >= 5
    parsed = {path.name: parse_request(json.loads(path.read_text())) for path in REQUEST_EXAMPLES}
    for req in parsed.values():
        if req.dataset_kind != "local":
            validate_for_platform(req, platform)
    strategies = {r.strategy for r in parsed.values()}
    assert {"ddp", "fsdp", "smp"} <= strategies
    assert any(r.spot and r.instance.fallbacks for r in parsed.values())
    assert any(r.effective_input_mode == "FSx" for r in parsed.values())
    local = parsed["local-fsdp.json"]
    assert (local.strategy, local.model, local.model_size, local.checkpoint_interval) == ("fsdp", "gpt", "tiny", 50)
    assert local.hyperparameters["max_steps"] == 120 and local.dataset_kind == "local"


def test_defaults_are_the_documented_safe_ones():
    r = parse_request(request())
    assert r.strategy == "ddp" and r.instance.count == 1 and r.instance.fallbacks == ()
    assert r.spot is False and r.effective_max_wait_hours is None
    assert r.max_runtime_hours == 24 and r.effective_max_total_hours == 72
    assert r.effective_input_mode == "FastFile"
    assert r.retry.max_attempts == 8 and r.retry.interruptions_before_on_demand == 3
    assert r.profiler is False and r.infra_check is False and r.network_isolation is False
    assert r.warm_pool_minutes is None  # the platform's default applies


def test_round_trips_through_its_dict_form():
    doc = json.loads(next(p for p in REQUEST_EXAMPLES if p.name == "spot-fallbacks.json").read_text())
    r = parse_request(doc)
    again = parse_request(json.loads(json.dumps(r.to_dict())))
    assert again == r
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.name = "other"  # type: ignore[misc]


def test_unknown_fields_suggest_the_right_one():
    found = problems_of(request(instance_type="ml.p4d.24xlarge", hyperparameter={}, retry={"max_attempt": 3},
                                instance={"type": "ml.g5.12xlarge", "cuont": 2}))
    assert found["instance_type"] == "unknown field; did you mean 'instance.type'?"
    assert found["hyperparameter"] == "unknown field; did you mean 'hyperparameters'?"
    assert found["retry.max_attempt"] == "unknown field; did you mean 'retry.max_attempts'?"
    assert found["instance.cuont"] == "unknown field; did you mean 'instance.count'?"


def test_every_problem_is_reported_at_once_with_its_path():
    doc = {
        "name": "bad_name!",
        "strategy": "smpp",
        "dataset": "bucket/prefix",
        "instance": {"type": "ml.p4d.24xlarg", "count": 0, "fallbacks": ["ml.g5.12xlarge", "ml.g9.xlarge"]},
        "spot": "yes",
        "max_runtime_hours": 1000,
        "hyperparameters": {"strategy": "ddp", "lrr": 0.1},
        "environment": {"1BAD": "x", "OK": 3},
        "tags": {"aws:owner": "me"},
    }
    with pytest.raises(RequestInvalid) as info:
        parse_request(doc)
    exc = info.value
    found = {p.path: p.message for p in exc.problems}
    assert set(found) == {
        "name", "strategy", "dataset", "instance.type", "instance.count", "instance.fallbacks[1]", "spot",
        "max_runtime_hours", "hyperparameters.strategy", "hyperparameters.lrr", "environment.OK", "environment.1BAD",
        "tags.aws:owner",
    }, found
    assert "did you mean 'smp'?" in found["strategy"]
    assert "did you mean 'ml.p4d.24xlarge'?" in found["instance.type"]
    assert found["instance.count"] == "must be at least 1, got 0"
    assert found["spot"] == "expected true or false, got string 'yes'"
    assert found["max_runtime_hours"] == "must be at most 672, got 1000.0"
    assert "use the request field 'strategy'" in found["hyperparameters.strategy"]
    assert "did you mean 'lr'?" in found["hyperparameters.lrr"]
    assert "reserved by AWS" in found["tags.aws:owner"]
    # str(exc) is one `path: message` line per problem; the class name is the contract's.
    assert str(exc).splitlines() == [str(p) for p in exc.problems]
    assert type(exc).__name__ == "RequestInvalid" and isinstance(exc, Exception)
    assert pickle.loads(pickle.dumps(exc)).problems == exc.problems


@pytest.mark.parametrize(("value", "message"), [
    (True, "expected an integer, got boolean True"),
    ("2", "expected an integer, got string '2'"),
    (2.5, "expected an integer, got number 2.5"),
    (None, "must not be null; expected integer"),
])
def test_wrong_types_are_named(value, message):
    assert problems_of(request(instance={"type": "ml.g5.12xlarge", "count": value})) == {"instance.count": message}


def test_not_an_object():
    with pytest.raises(RequestInvalid, match="a job request is a JSON object"):
        parse_request(["name"])  # type: ignore[arg-type]
    assert problems_of({"dataset": "s3://b/p"})["name"].startswith("required field is missing")


@pytest.mark.parametrize(("overrides", "path", "fragment"), [
    # MaxWait >= MaxRuntime, and only with Spot.
    ({"max_wait_hours": 30}, "max_wait_hours", "only applies to Spot"),
    ({"spot": True, "max_runtime_hours": 10, "max_wait_hours": 5}, "max_wait_hours", "must be >= max_runtime_hours"),
    # Warm pool not with instance groups.
    ({"instance": None, "warm_pool_minutes": 10,
      "instance_groups": [{"name": "gpu", "type": "ml.g5.12xlarge"}]}, "warm_pool_minutes", "instance_groups"),
    ({"warm_pool_minutes": 361}, "warm_pool_minutes", "at most 360"),
    # SMP needs NVIDIA GPUs and degrees that divide them.
    ({"strategy": "smp", "instance": {"type": "ml.c5.4xlarge"}}, "instance.type", "smp needs NVIDIA GPU"),
    ({"strategy": "smp", "instance": {"type": "ml.trn1.32xlarge"}}, "instance.type", "Trainium"),
    ({"strategy": "smp", "parallel": {"tensor_parallel_degree": 3}}, "parallel.tensor_parallel_degree",
     "does not divide the 4 GPUs"),
    ({"strategy": "smp", "instance": {"type": "ml.p4d.24xlarge", "count": 2},
      "parallel": {"tensor_parallel_degree": 4, "hybrid_shard_degree": 3}}, "parallel.hybrid_shard_degree",
     "does not divide the 4 data-parallel ranks"),
    ({"strategy": "smp", "parallel": {"pipeline_parallel_degree": 2}}, "parallel.pipeline_parallel_degree",
     "no pipeline parallelism"),
    ({"strategy": "fsdp", "parallel": {"tensor_parallel_degree": 2}}, "parallel.tensor_parallel_degree",
     "only the smp strategy"),
    ({"strategy": "single", "instance": {"type": "ml.g5.12xlarge", "count": 2}}, "instance.count", "single"),
    ({"strategy": "ddp", "instance": {"type": "ml.trn1.32xlarge"}}, "instance.type", "Trainium"),
    # API limits and ranges.
    ({"max_pending_hours": 0.25}, "max_pending_hours", "at least 0.5"),
    ({"max_pending_hours": 1, "instance": {"type": "ml.c5.4xlarge"}}, "max_pending_hours", "accelerated"),
    ({"retry": {"max_attempts": 31}}, "retry.max_attempts", "at most 30"),
    ({"retry": {"max_total_hours": 2}}, "retry.max_total_hours", "shorter than max_runtime_hours"),
    ({"retry": {"capacity_wait_seconds": 100, "capacity_wait_max_seconds": 10}},
     "retry.capacity_wait_max_seconds", ">= retry.capacity_wait_seconds"),
    ({"instance": None, "instance_groups": [{"name": f"g{i}", "type": "ml.g5.xlarge"} for i in range(6)]},
     "instance_groups", "at most 5 items"),
    ({"instance": None, "instance_groups": [{"name": "a", "type": "ml.c5.xlarge"}]}, "instance_groups",
     "no group has accelerators"),
    ({"instance_groups": [{"name": "a", "type": "ml.g5.xlarge"}]}, "instance_groups", "not both"),
    ({"instance": None}, "instance", "give instance.type"),
    # 50 is the API's limit; the platform writes 4 tags of its own and keeps one for a team's cost allocation tag.
    ({"tags": {f"k{i}": "v" for i in range(46)}}, "tags", "at most 45 entries"),
    # 100 is the API's limit; the platform adds TORCH_ELASTIC_SHUTDOWN_TIMEOUT, TRAINING_RUN_ID and, with
    # secrets, TRAINING_SECRET_ARNS.
    ({"environment": {f"K{i}": "v" for i in range(100)}}, "environment", f"at most {MAX_ENVIRONMENT} entries"),
    ({"metrics": [{"name": f"m{i}", "regex": "m=(\\d+)"} for i in range(30)]}, "metrics", f"at most {MAX_METRIC_DEFINITIONS - len(METRIC_NAMES)} items"),
    ({"metrics": [{"name": "train_loss", "regex": "loss=(\\d+)"}]}, "metrics[0].name", "already defined"),
    ({"metrics": [{"name": "acc", "regex": "acc=\\d+"}]}, "metrics[0].regex", "capture group"),
    ({"hyperparameters": {"lr": "x" * 2600}}, "hyperparameters.lr", "2500"),
    ({"hyperparameters": {"sagemaker_program": "x.py"}}, "hyperparameters.sagemaker_program", "set by the platform"),
    ({"init_from_run": "gpt-" + "a" * 16, "resume_run": "gpt-" + "b" * 16}, "init_from_run", "remove one"),
    ({"init_from_run": "gpt-" + "a" * 16, "hyperparameters": {"init_from": "/opt/ml/input/data/x"}},
     "init_from_run", "remove hyperparameters.init_from"),
    ({"init_from_run": "not a run"}, "init_from_run", "run id"),
    ({"training_plan": "p5", "spot": True}, "spot", "cannot run on Spot"),
    ({"training_plan": "p5", "instance": {"type": "ml.p5.48xlarge", "fallbacks": ["ml.p4d.24xlarge"]}},
     "instance.fallbacks", "one instance type"),
    ({"instance": {"type": "ml.g5.12xlarge", "fallbacks": ["ml.g5.12xlarge"]}}, "instance.fallbacks", "twice"),
    ({"dataset": "fsx:/data", "input_mode": "FastFile"}, "input_mode", "needs input_mode FSx"),
    ({"dataset": "fsx:"}, "dataset", "needs a path"),
    ({"dataset": "s3://Bad_Bucket/x"}, "dataset", "not a valid S3 URI"),
    ({"validation_dataset": "fsx:/validation"}, "validation_dataset", "must live where dataset does"),
    ({"name": "x" * 41}, "name", "1-40 letters"),
])
def test_cross_field_rules(overrides, path, fragment):
    found = problems_of(request(**overrides))
    assert path in found, found
    assert fragment in found[path], found[path]


def test_hyperparameter_count_includes_the_platforms_own(monkeypatch):
    import jobs.request.hyperparameter_rules as rules

    many = {f"k{i}": 1 for i in range(90)}
    assert set(problems_of(request(hyperparameters=many))) == {f"hyperparameters.k{i}" for i in range(90)}
    # were the training package to accept that many keys, the API's limit would still hold
    monkeypatch.setattr(rules, "SETTABLE_HYPERPARAMETERS", rules.SETTABLE_HYPERPARAMETERS | set(many))
    found = problems_of(request(hyperparameters=many))
    assert set(found) == {"hyperparameters"}
    assert "would send 101, over CreateTrainingJob's limit of 100" in found["hyperparameters"]


def test_platform_rules(platform):
    def problems(doc, settings=platform):
        with pytest.raises(RequestInvalid) as info:
            validate_for_platform(parse_request(doc), settings)
        return {p.path: p.message for p in info.value.problems}

    assert "not allowed on this platform" in problems(request(instance={"type": "ml.p3.2xlarge"}))["instance.type"]
    assert "not one of the platform's training plans (p5-reserved)" in problems(
        request(training_plan="nope"))["training_plan"]
    found = problems(request(training_plan="p5-reserved", instance={"type": "ml.p4d.24xlarge", "count": 8}))
    assert "does not match training plan 'p5-reserved', which reserves ml.p5.48xlarge" in found["instance.type"]
    assert "more than training plan" in found["instance.count"]
    no_fsx = dataclasses.replace(platform, fsx=None)
    assert "no FSx" in problems(request(dataset="fsx:/datasets/x"), no_fsx)["dataset"]
    found = problems(request(input_mode="FSx", dataset="s3://other-bucket/x/"))
    assert "is not linked to the file system" in found["dataset"]
    assert "trainctl local" in problems(request(dataset="./data"))["dataset"]
    assert "no pytorch image for version 9.9.9" in problems(request(framework_version="9.9.9"))["framework_version"]
    assert "CPU" in problems(request(instance={"type": "ml.c5.4xlarge"}),
                             dataclasses.replace(platform, images={"pytorch": {"2.8.0": {"gpu": "x"}}}))["image"]
    # an image override needs no table entry, but must come from a repository the platform allows
    validate_for_platform(parse_request(request(framework_version="9.9.9", image="my.registry/train:1")), platform)
    assert "not from a repository this platform allows" in problems(request(image="my/image:1"))["image"]
    plans = {"p5": TrainingPlan("p5", "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5", "ml.p5.48xlarge", 2)}
    validate_for_platform(parse_request(request(training_plan="p5", instance={"type": "ml.p5.48xlarge", "count": 2})),
                          dataclasses.replace(platform, training_plans=plans))


def test_problem_str():
    assert str(Problem("instance.count", "must be at least 1")) == "instance.count: must be at least 1"
    assert str(RequestInvalid([Problem("a", "x"), Problem("b.c", "y")])) == "a: x\nb.c: y"


def test_reference_table_covers_every_field():
    rows = reference_rows(JobRequest)
    paths = [r[0] for r in rows]
    for expected in ("name", "instance.type", "instance.fallbacks", "retry.max_attempts",
                     "instance_groups[].type", "parallel.tensor_parallel_degree", "metrics[].regex"):
        assert expected in paths
    assert all(r[3] for r in rows), [r[0] for r in rows if not r[3]]
    assert dict((r[0], r[2]) for r in rows)["retry.max_attempts"] == "8"


def test_reference_markdown_lists_every_field_and_the_policy():
    from jobs.reference import markdown

    text = markdown()
    for path, *_ in reference_rows(JobRequest):
        assert f"| `{path}` |" in text, path
    assert "## Retry policy" in text and "retry.interruptions_before_on_demand" in text


def test_model_and_size_are_checked():
    assert problems_of(request(model="gpt", model_size="125M")) == {
        "model_size": "gpt has no preset '125M'; did you mean '125m'? presets: tiny, small, 125m, 350m, 1b, 7b"}
    assert "package.module:factory" in problems_of(request(model="bert"))["model"]
    assert parse_request(request(model="my_pkg.models:build", model_size="whatever")).model == "my_pkg.models:build"


def test_hyperparameters_follow_the_training_packages_set_by():
    assert problems_of(request(hyperparameters={"model-size": "1b"})) == {
        "hyperparameters.model-size": "is set by the platform; use the request field 'model_size' instead (got '1b')"}
    assert problems_of(request(hyperparameters={"mp_parameters": {}})) == {
        "hyperparameters.mp_parameters": "is set by the platform (the launcher and the in-container toolkit); remove "
                                         "it (got {})"}
    # the container's paths are SageMaker's (trainctl local sets them through SM_* variables, not these keys)
    assert "SageMaker's path inside the container" in problems_of(
        request(hyperparameters={"checkpoint_dir": "/tmp/ckpt"}))["hyperparameters.checkpoint_dir"]
    accepted = parse_request(request(hyperparameters={"lr": 0.001, "max-steps": 5, "init_from": "/opt/ml/input/x"}))
    assert accepted.hyperparameters == {"lr": 0.001, "max-steps": 5, "init_from": "/opt/ml/input/x"}


def test_model_presets_are_the_contracts():
    from contract.models import PRESETS

    for model, presets in PRESETS.items():
        for size in presets:
            assert parse_request(request(model=model, model_size=size)).model_size == size
    assert "presets: tiny, base, large, huge" in problems_of(request(model="vit", model_size="small"))["model_size"]
