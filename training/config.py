"""The run's `TrainConfig` (defined in `contract.hyperparameters`) from the script's `--key value` arguments.

The in-container toolkit (sagemaker-training, `mapping.to_cmd_args`) json-decodes each hyperparameter and
passes every non-`sagemaker_*` key to the script as `--key value`, keys sorted, values through `str()`:
an int arrives as `8`, a bool as `True`/`False`, a dict as `k1=v1,k2=v2` (sorted), a list as `[1, 2]`,
null as an empty string. `parse_args` accepts exactly that, plus `--key=value`, dashes for underscores,
and JSON for dicts; the contract's schema engine reads the text and checks every value. Paths come from
the SM_* variables (`training.environment`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from typing import Any

from contract.errors import ConfigError, Problem
from contract.hyperparameters import SmpParameters, TrainConfig, canonical_name, hyperparameter_fields
from contract.schema import coerce_text, parse_dataclass
from training.environment import data_mode, path_defaults

__all__ = ["ACCEPTED_HYPERPARAMETERS", "ConfigError", "TrainConfig", "data_mode", "from_environment",
           "parse_args", "parse_mp_parameters"]

ACCEPTED_HYPERPARAMETERS: frozenset[str] = frozenset(hyperparameter_fields())
_HINTS = typing.get_type_hints(TrainConfig)
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def parse_args(argv: list[str], env: typing.Mapping[str, str] | None = None) -> TrainConfig:
    """The config from `--key value` arguments (as the toolkit passes them) over the SM_* environment."""
    problems: list[Problem] = []
    typed = {name: coerce_text(_HINTS[name], text, name, problems, dict(_FIELDS[name].metadata))
             for name, text in _raw_values(argv).items()}
    _raise_if(problems)
    return from_environment(typed, os.environ if env is None else env)


def _raw_values(argv: list[str]) -> dict[str, str]:
    """Each key's text, keys checked: `--key value`, `--key=value`, and a bare `--key` for null."""
    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-"):
            raise ConfigError(f"unexpected argument {token!r}: hyperparameters arrive as --key value")
        if "=" in token:
            raw, value = token.split("=", 1)
            i += 1
        else:
            raw = token
            # The toolkit renders null as an empty value; a flag at the end or before the next key is "".
            has_value = i + 1 < len(argv) and not (argv[i + 1].startswith("--") and len(argv[i + 1]) > 2)
            value = argv[i + 1] if has_value else ""
            i += 2 if has_value else 1
        values[_known_key(raw)] = value
    return values


def _known_key(raw: str) -> str:
    name = canonical_name(raw)
    if name not in ACCEPTED_HYPERPARAMETERS:
        hint = difflib.get_close_matches(name, ACCEPTED_HYPERPARAMETERS, n=1)
        did = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(f"unknown hyperparameter '{name}'{did}; accepted: {', '.join(sorted(_FIELDS))}")
    return name


def from_environment(overrides: dict[str, Any], env: typing.Mapping[str, str]) -> TrainConfig:
    """Fill the path keys from SageMaker's variables (the container contract), then validate every value.

    `overrides` holds typed values (JSON-like); an empty path keeps the container's.
    """
    defaults = path_defaults(env)
    given = {k: v for k, v in overrides.items() if not (k in _path_keys() and v in ("", None))}
    problems: list[Problem] = []
    cfg = parse_dataclass(TrainConfig, {**defaults, **given}, "", problems)
    _raise_if(problems)
    return cfg


def _path_keys() -> tuple[str, ...]:
    return hyperparameter_fields("container")


def parse_mp_parameters(text: str | dict) -> dict[str, Any]:
    """SMP parameters from a dict, a JSON object, or the toolkit's `k=v,k=v` rendering of a dict."""
    problems: list[Problem] = []
    rules = dict(_FIELDS["mp_parameters"].metadata)
    raw = coerce_text(_HINTS["mp_parameters"], text, "mp_parameters", problems, rules)
    if isinstance(raw, dict):  # a dict given as such: its values may still be text (`"8"`, `"true"`)
        hints = typing.get_type_hints(SmpParameters)
        raw = {k: coerce_text(hints[k], v, f"mp_parameters.{k}", problems) if k in hints else v
               for k, v in raw.items()}
    _raise_if(problems)
    cfg = from_environment({"mp_parameters": raw}, {})
    return cfg.mp_parameters


def _raise_if(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError("; ".join(_sentence(p) for p in problems))


def _sentence(problem: Problem) -> str:
    """One problem as this package has always said it: `hyperparameter 'x' must be ...`, `... is 'v': use ...`."""
    name, message = problem.path, problem.message
    if message.startswith("unknown field"):
        section, _, key = name.rpartition(".")
        hint = message.removeprefix("unknown field").replace(f"'{section}.", "'")
        return f"{section or 'hyperparameters'} has an unknown key '{key}'{hint}"
    choice = re.fullmatch(r"(.+?) is not one of (.+?)(; did you mean .*)?", message)
    if choice:
        return f"hyperparameter '{name}' is {choice.group(1)}: use one of {choice.group(2)}{choice.group(3) or ''}"
    quoted = re.fullmatch(r"('.*?'): (.+)", message)  # a field's own check: "'value': what to use"
    if quoted:
        return f"hyperparameter '{name}' is {quoted.group(1)}: {quoted.group(2)}"
    if message.startswith("expected "):
        message = "must be " + message.removeprefix("expected ")
    if message.startswith("must"):
        return f"hyperparameter '{name}' {message}"
    return f"hyperparameter '{name}': {message}"
