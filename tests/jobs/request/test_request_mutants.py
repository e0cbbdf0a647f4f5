"""Generated requests: hundreds of mutants of every example go through the state machine's Prepare step.

Prepare must answer each with RequestInvalid or a CreateTrainingJob request that botocore accepts (with the
service model's enums, maxima and patterns) and that obeys the service rules botocore does not check.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contract.errors import RequestInvalid
from jobs import handler
from jobs.request.limits import MAX_HYPERPARAMETER_JSON
from tests.jobs.conftest import REQUEST_EXAMPLES, assert_valid_create_request, load_platform


def nested(depth: int) -> list:
    """A list nested `depth` deep, built without recursion (json.loads itself recurses)."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


EXAMPLES = [json.loads(p.read_text()) for p in REQUEST_EXAMPLES if not p.name.startswith("local-")]
# Every instance type allowed, so that mutants reach the renderer rather than stopping at the platform's list.
PLATFORM = dataclasses.replace(load_platform(), allowed_instance_types=[])
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")

# Values that have broken one rule or another: deep nesting, non-finite numbers, control characters, '//' and
# '..' in paths, platform-owned names, very long text.
NASTY = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**63), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.text(alphabet="\x00\t\n\x7f /.:-_a\u2028", max_size=20),
    st.sampled_from([
        "s3://mltrain-datasets-123456789012-us-east-1/datasets//c4/", "s3://a..b/x/", "s3://192.168.0.1/x/",
        "fsx:/datasets/../../etc", "fsx:///datasets/c4", "s3://mltrain-datasets-123456789012-us-east-1/" + "k" * 1100,
        "x" * 3000, "ml.p4d.24xlarge", "model-size", "checkpoint-interval", "mp-parameters", "--lr",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "mltrain:run-id", "aws:x", "a\nb", "1e400", "NaN",
    ]),
    st.builds(nested, st.integers(20, 1000)),
    st.dictionaries(st.sampled_from(["lr", "model-size", "checkpoint_interval", "mp_parameters", "seq_len",
                                     "micro-batch-size", "optimizer", "x" * 300, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                                     "mltrain:attempt", "Name"]),
                    st.one_of(st.integers(-5, 10**7), st.floats(), st.text(max_size=10), st.just("y" * 2600)),
                    max_size=4),
)


def _paths(value, path=()):
    """Every place in a document a mutant can go: each value, and a new key in each object."""
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*path, key))
        yield (*path, "__new__")
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, (*path, i))


@st.composite
def mutants(draw):
    doc = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if key == "__new__":
            key = draw(st.sampled_from(["hyperparameters", "environment", "tags", "image", "metrics", "lr",
                                        "validation_dataset", "checkpoint_interval", "model-size"]))
        parent[key] = draw(NASTY)
    return doc


def service_rule_problems(create: dict) -> list[str]:
    """The CreateTrainingJob rules SageMaker enforces that botocore's model does not express."""
    found = []
    uris = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in create["InputDataConfig"] if "S3DataSource" in c["DataSource"]]
    uris += [create["CheckpointConfig"]["S3Uri"], create["OutputDataConfig"]["S3OutputPath"]]
    for uri in uris:
        bucket, _, key = uri.split("://", 1)[1].partition("/")
        if len(uri) > 1024 or "//" in key or not _BUCKET.fullmatch(bucket) or ".." in bucket:
            found.append(f"S3 URI {uri[:80]!r}")
    for c in create["InputDataConfig"]:
        fs = c["DataSource"].get("FileSystemDataSource")
        if fs and ".." in fs["DirectoryPath"].split("/"):
            found.append(f"DirectoryPath {fs['DirectoryPath']!r} climbs out")
    if len(create["AlgorithmSpecification"]["TrainingImage"]) > 255:
        found.append("TrainingImage longer than 255")
    for key, value in create["HyperParameters"].items():
        if len(value) > MAX_HYPERPARAMETER_JSON or _non_finite_token(value):
            found.append(f"hyperparameter {key}")
    for m in create["AlgorithmSpecification"]["MetricDefinitions"]:
        if not 1 <= len(m["Name"]) <= 255:
            found.append(f"metric name {m['Name'][:40]!r}")
    for tag in create["Tags"]:
        if any(not ch.isprintable() for ch in tag["Key"] + tag["Value"]):
            found.append(f"tag {tag['Key']!r} has control characters")
    if len({t["Key"] for t in create["Tags"]}) != len(create["Tags"]):
        found.append("a tag key twice")
    return found


def _non_finite_token(value: str) -> bool:
    """Whether a rendered value holds a NaN or Infinity token, which the toolkit's json.loads would turn into a
    float. The same letters inside a string are no such token: a request named "NaN" gives the job name
    "mltrain-NaN-..." in sagemaker_job_name, which a search for the text flagged (and hypothesis then replayed
    from tests.jobs.hypothesis/ on every run)."""
    tokens: list[str] = []
    json.loads(value, parse_constant=tokens.append)
    return bool(tokens)


def _prepare(doc: dict) -> dict | None:
    try:
        return handler.prepare({"state_shape": handler.STATE_SHAPE, "request": doc, "execution": {"name": "fuzz"}})
    except RequestInvalid as exc:
        assert exc.problems and all(str(p) for p in exc.problems)
        return None


def test_every_example_is_accepted_unmutated(monkeypatch):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    for doc in EXAMPLES:
        state = _prepare(doc)
        assert state is not None, doc["name"]
        assert_valid_create_request(state["launch"]["create"])
        assert service_rule_problems(state["launch"]["create"]) == []


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(doc=mutants())
@example(doc={**EXAMPLES[0], "name": "NaN"})  # valid, and its job name holds the text NaN
@example(doc={**EXAMPLES[0], "name": "Infinity-run"})
def test_mutants_are_refused_or_render_what_the_service_accepts(doc, monkeypatch):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    state = _prepare(doc)  # anything but RequestInvalid escapes and fails the test
    if state is None:
        return
    create = state["launch"]["create"]
    assert_valid_create_request(create)
    assert service_rule_problems(create) == [], json.dumps(doc)[:2000]


@pytest.mark.parametrize(("change", "field"), [
    ({"hyperparameters": {"lr": math.nan}}, "hyperparameters.lr"),
    ({"hyperparameters": {"lr": math.inf}}, "hyperparameters.lr"),
    ({"hyperparameters": {"optimizer": "adam"}}, "hyperparameters.optimizer"),
    ({"hyperparameters": {"micro_batch_size": 0}}, "hyperparameters.micro_batch_size"),
    ({"hyperparameters": {"model-size": "7b"}}, "hyperparameters.model-size"),
    ({"hyperparameters": {"checkpoint-interval": 5}}, "hyperparameters.checkpoint-interval"),
    ({"hyperparameters": {"mp-parameters": {"tensor_parallel_degree": 8}}}, "hyperparameters.mp-parameters"),
    ({"hyperparameters": {"lr": 1e-3, "--lr": 2e-3}}, "hyperparameters.--lr"),
    ({"environment": {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}}, "environment.TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
    ({"environment": {"A": "x\x00y"}}, "environment.A"),
    ({"tags": {"mltrain:run-id": "mine"}}, "tags.mltrain:run-id"),
    ({"tags": {"team": "ml\nops"}}, "tags.team"),
    ({"checkpoint_interval": 2**40}, "checkpoint_interval"),
    ({"dataset": "s3://mltrain-datasets-123456789012-us-east-1/datasets//c4/"}, "dataset"),
    ({"dataset": "s3://my..bucket/datasets/c4/"}, "dataset"),
    ({"dataset": "s3://mltrain-datasets-123456789012-us-east-1/" + "k" * 1100}, "dataset"),
    ({"dataset": "fsx:/datasets/../../etc"}, "dataset"),
    ({"image": "1" * 300}, "image"),
    ({"metrics": [{"name": "n" * 300, "regex": "n=(\\d+)"}]}, "metrics[0].name"),
    ({"hyperparameters": {"data": nested(1000)}}, ""),
])
def test_each_rule_names_its_field(change, field, monkeypatch):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    doc = {**EXAMPLES[0], **change}
    with pytest.raises(RequestInvalid) as caught:
        handler.prepare({"state_shape": handler.STATE_SHAPE, "request": doc, "execution": {"name": "one"}})
    assert field in {p.path for p in caught.value.problems}, str(caught.value)
