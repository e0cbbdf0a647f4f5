"""The request's JSON Schema carries the hyperparameter table (names in every spelling, types, ranges, choices)
and accepts exactly the `hyperparameters` that jobs.request.hyperparameter_rules accepts, over a matrix built from the
same table: each settable hyperparameter's default and bounds, one step past each bound, wrong types, null, its
dashed spellings alone and beside the canonical one; then the platform's keys, unknown keys and the values the
command line refuses."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from contract.hyperparameters import TrainConfig
from contract.schema.core import field_types, unwrap_optional
from jobs.request.hyperparameter_rules import SETTABLE_HYPERPARAMETERS, check_hyperparameters, spellings
from jobs.request.limits import MAX_HYPERPARAMETER_JSON
from jobs.request.parse import parse_request, request_json_schema

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
TYPES = {name: unwrap_optional(tp)[0] for name, tp in field_types(TrainConfig).items()}
WRONG_TYPE = {int: ["7", True, 1.5, [1]], float: ["0.5", False, {"a": 1}], bool: [1, "true", 0.0], str: [3, True]}


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = request_json_schema()["properties"]["hyperparameters"]
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _good_value(name: str) -> Any:
    rules, tp = FIELDS[name].metadata, TYPES[name]
    if rules.get("choices"):
        return rules["choices"][-1]
    if tp is str and rules.get("pattern"):  # its own form (profile_ranks): its default has it
        return FIELDS[name].default
    if tp is str:
        return "/opt/ml/input/data/init/step-10"
    default = FIELDS[name].default
    return rules.get("min", 1) if default is None else default


def _cases_for(name: str) -> list[dict[str, Any]]:
    """Good and bad `hyperparameters` for one name, from its rules (not from the schema under test)."""
    rules, tp, good = FIELDS[name].metadata, TYPES[name], _good_value(name)
    cases = [{name: good}, {name: None}, *({name: bad} for bad in WRONG_TYPE[tp])]
    cases += [{spelling: good} for spelling in spellings(name)[1:]]
    cases += [{name: good, spelling: good} for spelling in spellings(name)[1:]]
    cases += [{name.upper(): good}, {"--" + name: good}, {name + "_x": good}]
    step = 1 if tp is int else 1e-9
    for bound, past in (("min", -step), ("max", step)):
        if rules.get(bound) is not None:
            cases += [{name: tp(rules[bound])}, {name: rules[bound] + past}]
    if rules.get("choices") or rules.get("pattern"):
        cases += [{name: good.upper()}, {name: good + "x"}]
    if tp is float:
        # Not JSON, but Python's json reads `Infinity`; NaN is left out: no schema keyword can refuse it (every
        # comparison with NaN is false), and the rules do (value_problem).
        cases += [{name: math.inf}, {name: -math.inf}]
    return cases


# The longest string value the rules allow: CreateTrainingJob's limit on the JSON-encoded value, less its quotes.
LONGEST = "x" * (MAX_HYPERPARAMETER_JSON - 2)
NAMED_CASES = [
    {"max_steps": 100.0},  # an integral float is an integer to both
    {"checkpoint_dir": "/opt/ml/checkpoints"}, {"Checkpoint-Dir": "/x"}, {"model_size": "small"}, {"strategy": "ddp"},
    {"sagemaker_program": "x.py"}, {"mp_parameters": "a=1"}, {"tp_degree": 2}, {"foo": 1}, {"lr;id": 0.1}, {"": 1},
    {"init_from": "s3://bucket/step-1"}, {"init_from": "S3://bucket/step-1"}, {"init_from": "file://x"},
    {"init_from": "/opt/ml/x$(id)"}, {"init_from": ""}, {"init_from": "a b"}, {"init_from": LONGEST},
    {"init_from": LONGEST + "x"}, {"init_from": "/x/step-1", "init-from": "/x/step-1"}, {"seed": -5}, {"seed": 10**30},
    {"lr": 0}, {"lr": 1e308}, {"lr": 0.001, "compile": True, "max-steps": 20, "hang-timeout_min-seconds": 30.0},
]
MATRIX = [case for name in sorted(SETTABLE_HYPERPARAMETERS) for case in _cases_for(name)] + NAMED_CASES


def test_the_matrix_holds_both_outcomes_for_every_hyperparameter():
    # A matrix of only good or only bad cases would let a schema that accepts (or refuses) everything pass.
    for name in SETTABLE_HYPERPARAMETERS:
        outcomes = {not check_hyperparameters(case) for case in _cases_for(name)}
        assert outcomes == {True, False}, name
    assert not check_hyperparameters({"init_from": LONGEST}) and check_hyperparameters({"init_from": LONGEST + "x"})


@pytest.mark.parametrize("case", MATRIX, ids=[repr(c)[:60] for c in MATRIX])
def test_the_schema_accepts_what_the_rules_accept(validator, case):
    rules = check_hyperparameters(case)
    schema = [e.message for e in validator.iter_errors(case)]
    assert (not rules) == (not schema), f"rules: {rules}; schema: {schema}"


def test_every_settable_hyperparameter_is_described_with_its_type_range_and_choices(validator):
    patterns = validator.schema["patternProperties"]
    assert validator.schema["additionalProperties"] is False
    assert len(patterns) == len(SETTABLE_HYPERPARAMETERS)
    assert patterns["^max[_-]steps$"] == {"type": "integer", "minimum": 1, "description": "optimizer steps to train",
                                          "default": 100}
    assert patterns["^precision$"]["enum"] == list(FIELDS["precision"].metadata["choices"])
    assert patterns["^beta1$"]["maximum"] == 1 and patterns["^beta1$"]["minimum"] == 0
    assert patterns["^seq[_-]len$"]["type"] == "integer"  # Optional in the table, but null is refused


def test_spellings_are_every_mix_of_underscore_and_dash():
    assert spellings("lr") == ("lr",)
    assert set(spellings("min_lr_ratio")) == {"min_lr_ratio", "min_lr-ratio", "min-lr_ratio", "min-lr-ratio"}


def test_a_whole_request_carries_the_hyperparameter_schema():
    validator = Draft202012Validator(request_json_schema())
    request = {"name": "gpt-small", "dataset": "s3://datasets-bucket/tokens/", "instance": {"type": "ml.g5.12xlarge"}}
    good = {**request, "hyperparameters": {"max-steps": 20, "precision": "bf16"}}
    assert not list(validator.iter_errors(good))
    parse_request(good)
    assert list(validator.iter_errors({**request, "hyperparameters": {"precision": "bf32"}}))
