"""JSON Schema (draft 2020-12) of a schema dataclass, for editors and the Step Functions console's input."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from contract.schema.core import MISSING, enum_values, field_types, is_enum, to_jsonable, unwrap_optional


def json_schema(cls: type, title: str = "", description: str = "") -> dict[str, Any]:
    """A JSON Schema of a schema dataclass. Rules that need code (`check`, cross-field rules) are not in it:
    the schema catches shape and range mistakes in an editor; the parser stays the authority."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **_object_schema(cls)}
    if title:
        schema["title"] = title
    if description:
        schema["description"] = description
    return schema


def _object_schema(cls: type) -> dict[str, Any]:
    hints = field_types(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        prop = _value_schema(hints[f.name], dict(f.metadata))
        if f.metadata.get("doc"):
            prop["description"] = f.metadata["doc"]
        if f.default is not MISSING:
            prop["default"] = to_jsonable(f.default)
        elif f.default_factory is not MISSING:
            made = f.default_factory()
            if not dataclasses.is_dataclass(made):
                prop["default"] = to_jsonable(made)
        else:
            required.append(f.name)
        properties[f.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def value_schema(tp: Any, rules: dict[str, Any], nullable: bool = True) -> dict[str, Any]:
    """The JSON Schema of one value of type `tp` under a field's rules (min, max, choices, pattern, max_length,
    and `not_pattern`: a pattern the value must not match). `nullable=False` drops the null an Optional allows,
    for documents that refuse null where the dataclass default is None (a request's hyperparameters)."""
    if not nullable:
        tp = unwrap_optional(tp)[0]
    return _value_schema(tp, rules)


def _value_schema(tp: Any, rules: dict[str, Any]) -> dict[str, Any]:
    tp, optional = unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        out = _object_schema(tp)
    elif origin is tuple:
        out = {"type": "array", "items": _value_schema(typing.get_args(tp)[0], {})}
        out.update(_bounds(rules, "minItems", "maxItems"))
    elif origin is dict:
        value_type = typing.get_args(tp)[1]
        out = {"type": "object"}
        if value_type is str:
            out["additionalProperties"] = {"type": "string"}
        out.update(_bounds(rules, "minProperties", "maxProperties"))
    elif is_enum(tp):
        out = {"type": "string", "enum": [getattr(c, "value", c) for c in rules.get("choices") or enum_values(tp)]}
    else:
        json_type = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp)
        out = {"type": json_type} if json_type else {}
        if tp in (int, float):
            out.update(_bounds(rules, "minimum", "maximum"))
        if tp is str:
            out["minLength"] = 1
            if rules.get("max_length") is not None:
                out["maxLength"] = rules["max_length"]
            if rules.get("pattern") is not None:
                out["pattern"] = f"^(?:{rules['pattern']})$"
            if rules.get("not_pattern") is not None:
                out["not"] = {"pattern": rules["not_pattern"]}
        if rules.get("choices"):
            out["enum"] = list(rules["choices"])
    if optional:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _bounds(rules: dict[str, Any], low_key: str, high_key: str) -> dict[str, Any]:
    out = {}
    if rules.get("min") is not None:
        out[low_key] = rules["min"]
    if rules.get("max") is not None:
        out[high_key] = rules["max"]
    return out
