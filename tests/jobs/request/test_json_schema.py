"""The request's JSON Schema comes from the same schema as the parser: the examples pass it, bad requests fail."""

from __future__ import annotations

import copy
import json

import pytest
from jsonschema import Draft202012Validator

from contract.errors import RequestInvalid
from jobs.platform import settings_json_schema
from jobs.request.parse import parse_request, request_json_schema
from tests.jobs.conftest import EXAMPLES, PLATFORM_FILE, REQUEST_EXAMPLES, ROOT

GOOD = {"name": "gpt-small", "dataset": "s3://datasets-bucket/tokens/", "instance": {"type": "ml.g5.12xlarge"}}


@pytest.fixture(scope="module")
def request_validator() -> Draft202012Validator:
    schema = request_json_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def test_the_schema_describes_the_request(request_validator):
    schema = request_validator.schema
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["required"] == ["name", "dataset"] and schema["additionalProperties"] is False
    assert schema["properties"]["strategy"]["enum"] == ["single", "ddp", "fsdp", "hsdp", "tp", "pp", "hybrid", "smp", "auto"]
    assert schema["properties"]["strategy"]["default"] == "ddp"
    assert schema["properties"]["instance"]["anyOf"][0]["properties"]["count"]["minimum"] == 1


@pytest.mark.parametrize("path", REQUEST_EXAMPLES, ids=lambda p: p.name)
def test_every_example_request_passes_the_schema(request_validator, path):
    document = json.loads(path.read_text())
    assert [e.message for e in request_validator.iter_errors(document)] == []


@pytest.mark.parametrize("path", [EXAMPLES / "platform-settings.json", PLATFORM_FILE,
                                  ROOT / "tests/launcher/platform_settings.json"], ids=lambda p: str(p.relative_to(ROOT)))
def test_platform_settings_documents_pass_the_settings_schema(path):
    schema = settings_json_schema()
    Draft202012Validator.check_schema(schema)
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(json.loads(path.read_text()))]
    assert errors == []


def _with(**changes) -> dict:
    doc = copy.deepcopy(GOOD)
    for key, value in changes.items():
        doc[key] = value
    return doc


@pytest.mark.parametrize("document", [
    {"dataset": "s3://datasets-bucket/tokens/", "instance": {"type": "ml.g5.12xlarge"}},  # no name
    _with(strategy="smpp"),
    _with(instance={"type": "ml.g5.12xlarge", "count": 0}),
    _with(instance_type="ml.g5.12xlarge"),  # unknown field
    _with(spot="yes"),
    _with(environment={"OK": 3}),
    _with(max_runtime_hours=1000),
    _with(instance_groups=[{"name": f"g{i}", "type": "ml.g5.xlarge"} for i in range(6)]),
    _with(retry={"max_attempt": 3}),
    _with(input_mode="Pipe"),
    # what reaches the toolkit's shell, the platform's keys and variables, image URIs and secret ARNs
    _with(hyperparameters={"init_from": "/opt/ml/x$(id)"}),
    _with(hyperparameters={"lr;id": 0.1}),
    _with(hyperparameters={"checkpoint_dir": "/opt/ml/checkpoints"}),
    _with(hyperparameters={"seed": [1]}),
    _with(model_size="big model"),
    _with(environment={"LD_PRELOAD": "/tmp/x.so"}),
    _with(environment={"PYTHONPATH": "/tmp"}),
    _with(environment={"NCCL_DEBUG": "WARN; id"}),
    _with(image="ubuntu latest"),
    _with(secrets={"WANDB_API_KEY": "the-key-itself"}),
], ids=["no-name", "strategy", "count", "unknown-field", "spot-type", "env-value", "runtime", "groups", "retry-key",
        "input-mode", "hp-shell-value", "hp-shell-key", "hp-platform-key", "hp-list", "model-size-space", "ld-preload",
        "pythonpath", "env-shell-value", "image-form", "secret-not-an-arn"])
def test_bad_requests_fail_the_schema_and_the_parser(request_validator, document):
    assert list(request_validator.iter_errors(document)), "the schema accepted it"
    with pytest.raises(RequestInvalid):
        parse_request(document)


def test_the_schema_accepts_what_the_parser_accepts_of_the_new_rules(request_validator):
    document = _with(hyperparameters={"init_from": "/opt/ml/input/data/train/step-10", "lr": 0.001, "compile": True},
                     environment={"NCCL_SOCKET_IFNAME": "^lo,docker0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                     secrets={"WANDB_API_KEY": "arn:aws:secretsmanager:us-east-1:123456789012:secret:wandb"},
                     image="123456789012.dkr.ecr.us-east-1.amazonaws.com/team-a/trainer:1", model_size="small")
    assert [e.message for e in request_validator.iter_errors(document)] == []
    parse_request(document)


def test_bad_settings_fail_the_settings_schema():
    validator = Draft202012Validator(settings_json_schema())
    document = json.loads(PLATFORM_FILE.read_text())
    assert list(validator.iter_errors({**document, "subnet_ids": "subnet-1"}))
    assert list(validator.iter_errors({**document, "training_plans": {"p": {"arn": "x", "instance_type": "y"}}}))
    assert list(validator.iter_errors({**document, "regoin": "us-east-1"}))
