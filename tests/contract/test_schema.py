"""The one schema engine: text forms, enums narrowed by choices, objects keyed by a schema, JSON Schema."""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field

import jsonschema
import pytest

from contract.errors import Problem
from contract.hyperparameters import SmpParameters, TrainConfig
from contract.schema import coerce_text, json_schema, meta, parse_dataclass, parse_value, reference_rows


class Color(enum.StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    size: int = field(default=1, metadata=meta("a size", min=1, max=10))


@dataclass(frozen=True)
class Doc:
    name: str = field(metadata=meta("a name", pattern=r"[a-z]+", max_length=8))
    color: Color = field(default=Color.RED, metadata=meta("a color", choices=("red", "green")))
    ratio: float | None = field(default=None, metadata=meta("a ratio", min=0, max=1))
    flags: tuple[bool, ...] = field(default=(), metadata=meta("flags", max=2))
    inner: Inner = field(default_factory=Inner, metadata=meta("a section"))
    smp: dict[str, typing.Any] = field(default_factory=dict, metadata=meta("open keys", keys=SmpParameters))


def parse(data):
    problems: list[Problem] = []
    return parse_dataclass(Doc, data, "", problems), {p.path: p.message for p in problems}


def test_a_good_document_parses_to_typed_values():
    doc, problems = parse({"name": "abc", "color": "green", "ratio": 0.5, "flags": [True], "inner": {"size": 3},
                           "smp": {"tensor_parallel_degree": 2}})
    assert not problems
    assert doc.color is Color.GREEN and doc.flags == (True,) and doc.inner.size == 3
    assert doc.smp == {"tensor_parallel_degree": 2}


def test_every_problem_names_its_path():
    _, problems = parse({"name": "ABC", "color": "blue", "ratio": float("nan"), "flags": [1, True, False],
                         "inner": {"size": 11}, "smp": {"tensor_paralel_degree": 2}, "extra": 1})
    assert problems["name"] == "'ABC' does not match [a-z]+"
    assert problems["color"].startswith("'blue' is not one of red, green")  # the enum narrowed by choices
    assert problems["ratio"] == "must be a finite number"
    assert problems["flags[0]"] == "expected true or false, got integer 1"
    assert problems["inner.size"] == "must be at most 10, got 11"
    assert "did you mean 'smp.tensor_parallel_degree'" in problems["smp.tensor_paralel_degree"]
    assert problems["extra"].startswith("unknown field")
    assert len(parse({"name": "a" * 9})[1]) == 1  # max_length


def test_a_missing_field_keeps_its_doc_whole():
    _, problems = parse({})
    assert problems["name"] == "required field is missing (a name)"


@pytest.mark.parametrize(("tp", "text", "expected"), [
    (bool, "True", True), (bool, "off", False), (int, "8", 8), (int, "8.0", 8), (float, "3e-4", 3e-4),
    (int | None, "", None), (int | None, "null", None), (tuple[str, ...], '["a", "b"]', ["a", "b"]),
    (dict[str, str], '{"a": "b"}', {"a": "b"}), (dict[str, str], "a=b,c=d", {"a": "b", "c": "d"}),
    (str, "fsdp", "fsdp"),
])
def test_text_forms(tp, text, expected):
    problems: list[Problem] = []
    assert coerce_text(tp, text, "k", problems) == expected
    assert not problems


@pytest.mark.parametrize(("tp", "text", "message"), [
    (bool, "maybe", "expected true or false, got 'maybe'"),
    (int, "many", "expected an integer, got 'many'"),
    (dict[str, str], '{"a": ', "is not valid JSON"),
    (dict[str, str], "a", "expected a JSON object or key=value pairs, got 'a'"),
])
def test_bad_text_forms_say_what_was_expected(tp, text, message):
    problems: list[Problem] = []
    assert coerce_text(tp, text, "k", problems) is None
    assert problems and problems[0].path == "k" and message in problems[0].message


def test_key_value_text_takes_each_keys_type():
    """The toolkit renders a dict hyperparameter as k=v,k=v: every value arrives as text."""
    rules = dict(next(f for f in dataclasses.fields(TrainConfig) if f.name == "mp_parameters").metadata)
    problems: list[Problem] = []
    value = coerce_text(dict[str, typing.Any], "sm_activation_offloading=True,hybrid_shard_degree=4",
                        "mp_parameters", problems, rules)
    assert parse_value(dict[str, typing.Any], value, "mp_parameters", problems, rules) == {
        "sm_activation_offloading": True, "hybrid_shard_degree": 4}
    assert not problems


def test_json_schema_agrees_with_the_parser_on_shape_and_range():
    schema = json_schema(Doc, title="doc")
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    good = {"name": "abc", "color": "green", "ratio": 0.5, "flags": [True], "inner": {"size": 3}}
    assert not list(validator.iter_errors(good)) and not parse(good)[1]
    for bad in ({"name": "abc", "color": "blue"}, {"name": "abc", "ratio": 2}, {"name": "abc", "flags": [1, 1, 1]},
                {"name": "ABC"}, {"name": "abc", "inner": {"size": 0}}, {"name": "abc", "unknown": 1}, {}):
        assert list(validator.iter_errors(bad)), bad
        assert parse(bad)[1], bad


def test_reference_rows_flatten_sections_and_show_rules():
    rows = {path: (kind, default, doc) for path, kind, default, doc in reference_rows(Doc)}
    assert rows["color"] == ("string", '"red"', "a color (one of red, green)")
    assert rows["inner.size"] == ("integer", "1", "a size (min 1; max 10)")
    assert rows["ratio"][0] == "number or null"
