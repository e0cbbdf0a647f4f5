"""trainctl schema: the job request's JSON Schema, valid draft 2020-12, and the examples pass it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.cli.conftest import run

EXAMPLES = Path(__file__).parents[2] / "examples"


@pytest.fixture(scope="module")
def schema() -> dict:
    result = run("schema")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stdout is the document alone


def test_schema_is_a_valid_draft_2020_12_schema(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert {"name", "dataset"} <= set(schema["required"])


def test_the_local_example_validates(schema):
    jsonschema.Draft202012Validator(schema).validate(json.loads((EXAMPLES / "local-fsdp.json").read_text()))


def test_every_example_request_validates(schema):
    validator = jsonschema.Draft202012Validator(schema)
    requests = sorted(p for p in EXAMPLES.glob("*.json") if p.name != "platform-settings.json")
    assert requests
    for path in requests:
        errors = [e.message for e in validator.iter_errors(json.loads(path.read_text()))]
        assert not errors, f"{path.name}: {errors}"


def test_schema_catches_a_misspelled_field(schema):
    request = json.loads((EXAMPLES / "local-fsdp.json").read_text())
    request["strateg"] = "ddp"
    assert not jsonschema.Draft202012Validator(schema).is_valid(request)
