"""Text forms of values: CDK `-c key=value` overrides and the training container's `--key value` arguments."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from contract.errors import Problem
from contract.schema.core import field_types, join, shorten, unwrap_optional

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def coerce_text(tp: Any, text: Any, path: str, problems: list[Problem], rules: dict[str, Any] | None = None) -> Any:
    """Turn the text form of a value into its JSON value for `parse_value`; non-strings pass through.

    Booleans: true/false, 1/0, yes/no, on/off (the toolkit sends Python's `True`). Numbers: their
    decimal text. Null: an empty string, `none` or `null` where the field is optional. Lists and objects:
    JSON; an object also in the toolkit's `k=v,k2=v2` rendering of a dict.
    """
    if not isinstance(text, str):
        return text
    tp, optional = unwrap_optional(tp)
    stripped = text.strip()
    if optional and stripped.lower() in ("", "none", "null"):
        return None
    origin = typing.get_origin(tp)
    if tp is bool:
        lowered = stripped.lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        problems.append(Problem(path, f"expected true or false, got {shorten(text)!r}"))
        return None
    if tp in (int, float):
        try:
            number = float(stripped)
        except ValueError:
            problems.append(Problem(path, f"expected {'an integer' if tp is int else 'a number'}, got {shorten(text)!r}"))
            return None
        return int(number) if tp is int and number.is_integer() else number
    if origin in (tuple, dict) or dataclasses.is_dataclass(tp):
        if origin is dict and stripped and not stripped.startswith("{"):
            value = _key_value_pairs(stripped, path, problems)
        else:
            try:
                value = json.loads(stripped) if stripped else ({} if origin is dict else [])
            except json.JSONDecodeError as exc:
                problems.append(Problem(path, f"is not valid JSON ({exc.msg} at character {exc.pos})"))
                return None
        keys = (rules or {}).get("keys")
        if isinstance(value, dict) and dataclasses.is_dataclass(keys):
            # `k=v` pairs carry every value as text: read each one as its key's type.
            hints = field_types(keys)
            value = {k: coerce_text(hints[k], v, join(path, k), problems) if k in hints else v
                     for k, v in value.items()}
        return value
    return text


def _key_value_pairs(text: str, path: str, problems: list[Problem]) -> dict[str, str] | None:
    out = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if not sep:
            problems.append(Problem(path, f"expected a JSON object or key=value pairs, got {shorten(pair)!r}"))
            return None
        out[key.strip()] = value.strip()
    return out


