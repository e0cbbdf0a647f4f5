"""The schema engine's core: parse JSON-like documents into frozen dataclasses, collecting every problem."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import json
import re
import types
import typing
from typing import Any

from contract.errors import Problem

MISSING = dataclasses.MISSING


def meta(doc: str, **rules: Any) -> dict[str, Any]:
    """Field metadata: `doc` for the reference table; rules: min, max, choices, pattern, max_length, check.

    Other keys are the owner's own annotations (e.g. `set_by` on hyperparameters) and are kept as given.
    """
    return {"doc": doc, **rules}


def is_enum(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, enum.Enum)


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object",
            type(None): "null"}.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, (list, dict)) else ""
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{kind} {shown}".strip()


@functools.cache
def field_types(cls: type) -> typing.Mapping[str, Any]:
    # Cached: the annotations are strings (`from __future__ import annotations`), and resolving them compiles
    # each one again on every call; a request parse asks for the same few dataclasses hundreds of times.
    return types.MappingProxyType(typing.get_type_hints(cls))


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def type_name(tp: Any) -> str:
    """How the reference table names a field's JSON type."""
    tp, optional = unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        name = "object"
    elif is_enum(tp):
        name = "string"
    elif origin is tuple:
        inner = typing.get_args(tp)[0]
        name = f"list of {'objects' if dataclasses.is_dataclass(inner) else type_name(inner) + 's'}"
    elif origin is dict:
        value = typing.get_args(tp)[1]
        name = "object of strings" if value is str else "object"
    else:
        name = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, str(tp))
    return f"{name} or null" if optional else name


def parse_value(tp: Any, value: Any, path: str, problems: list[Problem], rules: dict[str, Any]) -> Any:
    """Check one value against its annotated type and rules; return it normalized (or None on a problem)."""
    tp, optional = unwrap_optional(tp)
    if value is None:
        if not optional:
            problems.append(Problem(path, f"must not be null; expected {type_name(tp)}"))
        return None
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not _is(value, dict, "an object", path, problems):
            return None
        return parse_dataclass(tp, value, path, problems)
    if origin is tuple:
        return _parse_list(typing.get_args(tp)[0], value, path, problems, rules)
    if origin is dict:
        return _parse_object(typing.get_args(tp)[1], value, path, problems, rules)
    if is_enum(tp):
        return _parse_enum(tp, value, path, problems, tuple(rules.get("choices") or ()))
    value = _parse_scalar(tp, value, path, problems, rules)
    if value is None:
        return None
    choices = rules.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        problems.append(Problem(path, f"{value!r} is not one of {', '.join(map(str, choices))}{hint}"))
        return None
    if tp in (int, float) and not _check_range(value, path, problems, rules):
        return None
    return _run_check(value, path, problems, rules)


def _is(value: Any, kind: type, name: str, path: str, problems: list[Problem]) -> bool:
    if isinstance(value, kind):
        return True
    problems.append(Problem(path, f"expected {name}, got {_describe(value)}"))
    return False


def _parse_list(inner: Any, value: Any, path: str, problems: list[Problem], rules: dict[str, Any]) -> Any:
    if not _is(value, list, "a list", path, problems):
        return None
    items = tuple(parse_value(inner, v, join(path, i), problems, {}) for i, v in enumerate(value))
    if not _check_range(len(items), path, problems, rules, what="items"):
        return None
    return _run_check(items, path, problems, rules)


def _parse_object(value_type: Any, value: Any, path: str, problems: list[Problem], rules: dict[str, Any]) -> Any:
    if not _is(value, dict, "an object", path, problems):
        return None
    if dataclasses.is_dataclass(rules.get("keys")):
        # An open-looking object whose keys are a schema of their own: parse it, keep the keys given.
        parsed = parse_dataclass(rules["keys"], value, path, problems)
        return None if parsed is None else {k: v for k, v in to_jsonable(parsed).items() if v is not None}
    out = {}
    for key, item in value.items():
        if value_type is str and not isinstance(item, str):
            problems.append(Problem(join(path, key), f"expected a string, got {_describe(item)}"))
            continue
        out[key] = item
    if not _check_range(len(out), path, problems, rules, what="entries"):
        return None
    return _run_check(out, path, problems, rules)


def _parse_scalar(tp: Any, value: Any, path: str, problems: list[Problem], rules: dict[str, Any]) -> Any:
    """A bool, int, float or str, type-checked (bools are not numbers; NaN and infinities are refused)."""
    if tp is bool:
        return value if _is(value, bool, "true or false", path, problems) else None
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(Problem(path, f"expected an integer, got {_describe(value)}"))
            return None
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(Problem(path, f"expected a number, got {_describe(value)}"))
            return None
        if value != value or value in (float("inf"), float("-inf")):
            problems.append(Problem(path, "must be a finite number"))
            return None
        return float(value)
    if tp is str:
        if not _is(value, str, "a string", path, problems):
            return None
        if not value.strip():
            problems.append(Problem(path, "must not be empty"))
            return None
        return value if _check_text(value, path, problems, rules) else None
    return value


def _parse_enum(tp: type[enum.Enum], value: Any, path: str, problems: list[Problem],
                choices: tuple[Any, ...] = ()) -> Any:
    """A member of `tp` by its value; `choices` narrows the members a field accepts."""
    allowed = list(choices) or [m.value for m in tp]
    if isinstance(value, tp) and value.value in allowed:
        return value
    if value in allowed and not isinstance(value, bool):
        return tp(value)
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    problems.append(Problem(path, f"{value!r} is not one of {', '.join(map(str, allowed))}{hint}"))
    return None


def _check_text(value: str, path: str, problems: list[Problem], rules: dict[str, Any]) -> bool:
    longest, pattern = rules.get("max_length"), rules.get("pattern")
    if longest is not None and len(value) > longest:
        problems.append(Problem(path, f"must be at most {longest} characters, has {len(value)}"))
        return False
    if pattern is not None and not re.fullmatch(pattern, value):
        problems.append(Problem(path, f"{shorten(value)!r} does not match {pattern}"))
        return False
    return True


def shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_check(value: Any, path: str, problems: list[Problem], rules: dict[str, Any]) -> Any:
    """A field's own rule (`check` in its metadata): returns None, a message, or [(sub-key, message)]."""
    check = rules.get("check")
    found = check(value) if check else None
    if not found:
        return value
    for key, message in [(None, found)] if isinstance(found, str) else found:
        problems.append(Problem(path if key is None else join(path, key), message))
    return None


def _check_range(value: float, path: str, problems: list[Problem], rules: dict[str, Any], what: str = "") -> bool:
    """min/max on a number, or on a count of `what` (items, entries) when `what` is given."""
    lo, hi = rules.get("min"), rules.get("max")
    if lo is not None and value < lo:
        problems.append(Problem(path, f"must have at least {lo} {what}, has {value}" if what
                                else f"must be at least {lo}, got {value}"))
        return False
    if hi is not None and value > hi:
        problems.append(Problem(path, f"must have at most {hi} {what}, has {value}" if what
                                else f"must be at most {hi}, got {value}"))
        return False
    return True


def parse_dataclass(cls: type, data: dict[str, Any], path: str, problems: list[Problem],
                    elsewhere: dict[str, str] | None = None) -> Any:
    """Read `data` into `cls`, appending a Problem per unknown field, missing field or bad value.

    `elsewhere` maps field names that live at another path (e.g. "instance_type" -> "instance.type")
    so that a misplaced field gets a useful "did you mean".
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = field_types(cls)
    for key in data:
        if key in fields:
            continue
        if not isinstance(key, str):
            problems.append(Problem(path, f"field names must be strings, got {key!r}"))
            continue
        close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
        if elsewhere and key in elsewhere:
            hint = f"; did you mean {elsewhere[key]!r}?"
        elif close:
            hint = f"; did you mean {join(path, close[0])!r}?"
        elif elsewhere and (near := difflib.get_close_matches(key, list(elsewhere), n=1, cutoff=0.75)):
            hint = f"; did you mean {elsewhere[near[0]]!r}?"
        else:
            hint = f"; known fields: {', '.join(fields)}"
        problems.append(Problem(join(path, key), f"unknown field{hint}"))
    values = {}
    ok = True
    for name, f in fields.items():
        sub = join(path, name)
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                doc = f.metadata.get("doc")
                problems.append(Problem(sub, "required field is missing" + (f" ({doc})" if doc else "")))
                ok = False
            continue
        before = len(problems)
        value = parse_value(hints[name], data[name], sub, problems, dict(f.metadata))
        if len(problems) > before:
            ok = False
            continue
        values[name] = value
    if not ok:
        return None
    return cls(**values)


def to_jsonable(obj: Any) -> Any:
    """A dataclass tree as plain JSON values (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj


def _json_default(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(to_jsonable(value))


def reference_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(field path, JSON type, default, meaning) for every field, nested sections flattened."""
    rows = []
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        path = join(prefix, f.name)
        tp = hints[f.name]
        if f.default is not MISSING:
            default = _json_default(f.default)
        elif f.default_factory is not MISSING:
            made = f.default_factory()
            default = "see below" if dataclasses.is_dataclass(made) else _json_default(made)
        else:
            default = "required"
        doc = f.metadata.get("doc", "")
        rules = [f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}"
                 for k, v in f.metadata.items() if k in ("min", "max")]
        choices = f.metadata.get("choices") or enum_values(unwrap_optional(tp)[0])
        choices = [getattr(c, "value", c) for c in choices]
        if choices:
            rules.append("one of " + ", ".join(map(str, choices)))
        if rules:
            doc = f"{doc} ({'; '.join(rules)})"
        rows.append((path, type_name(tp), default, doc))
        inner, _ = unwrap_optional(tp)
        if typing.get_origin(inner) is tuple:
            inner = typing.get_args(inner)[0]
            path = f"{path}[]"
        if dataclasses.is_dataclass(inner):
            rows.extend(reference_rows(inner, path))
    return rows


def enum_values(tp: Any) -> tuple[Any, ...]:
    return tuple(m.value for m in tp) if is_enum(tp) else ()


