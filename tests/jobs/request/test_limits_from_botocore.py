"""CreateTrainingJob's limits in jobs/request/limits.py are read against botocore's service model (the model the
service's own SDKs validate with): a constant that drifts from it fails here, and every free-text field of the
request that becomes a hyperparameter value is refused, naming the field, past the model's cap."""

from __future__ import annotations

import json

import botocore.session
import pytest

from contract.errors import RequestInvalid
from jobs.request import limits
from jobs.request.parse import parse_request
from tests.jobs.conftest import EXAMPLES

INPUT = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob").input_shape


def _max(*path: str) -> int:
    shape = INPUT
    for step in path:
        shape = {"[]": "member", "{key}": "key", "{value}": "value"}.get(step) and getattr(
            shape, {"[]": "member", "{key}": "key", "{value}": "value"}[step]) or shape.members[step]
    return shape.metadata["max"]


@pytest.mark.parametrize(("constant", "path"), [
    ("MAX_HYPERPARAMETERS", ("HyperParameters",)),
    ("MAX_HYPERPARAMETER_JSON", ("HyperParameters", "{value}")),
    ("MAX_ENVIRONMENT_VARIABLES", ("Environment",)),
    ("MAX_ENVIRONMENT_TEXT", ("Environment", "{key}")),
    ("MAX_ENVIRONMENT_TEXT", ("Environment", "{value}")),
    ("MAX_TAGS", ("Tags",)),
    ("MAX_TAG_KEY", ("Tags", "[]", "Key")),
    ("MAX_TAG_VALUE", ("Tags", "[]", "Value")),
    ("MAX_INSTANCE_GROUPS", ("ResourceConfig", "InstanceGroups")),
    ("MAX_S3_URI", ("OutputDataConfig", "S3OutputPath")),
    ("MAX_IMAGE_URI", ("AlgorithmSpecification", "TrainingImage")),
    ("MAX_METRIC_NAME", ("AlgorithmSpecification", "MetricDefinitions", "[]", "Name")),
])
def test_each_limit_is_the_service_models(constant, path):
    assert getattr(limits, constant) == _max(*path), (constant, path)


def _request(**changes) -> dict:
    return {**json.loads((EXAMPLES / "ddp-gpt-125m.json").read_text()), **changes}


@pytest.mark.parametrize("field", ["model", "model_size"])
def test_a_field_that_becomes_a_hyperparameter_value_is_capped_as_one(field):
    """model and model_size reach HyperParameters JSON-encoded (2 quotes): the longest accepted value fits."""
    cap = _max("HyperParameters", "{value}") - 2
    base = "my_pkg.models:build" if field == "model" else "size"
    fits = base + "x" * (cap - len(base))
    with pytest.raises(RequestInvalid) as refused:
        parse_request(_request(**{field: fits + "x"}))
    assert [p.path for p in refused.value.problems] == [field], refused.value.problems
    assert f"{_max('HyperParameters', '{value}')}" in refused.value.problems[0].message
    custom = {"model": "my_pkg.models:build", "model_shape": None}  # a preset name would be refused as unknown
    parse_request(_request(**{**custom, field: fits}))
