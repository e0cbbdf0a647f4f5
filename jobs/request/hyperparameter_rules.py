"""Who sets which hyperparameter, and the rule a request's `hyperparameters` obey.

The training package's hyperparameters come from `contract.hyperparameters.TrainConfig`, each with its
`set_by`: a request may set the "user" ones only. The "request" ones come from request fields of the same
name, the "platform" ones from other request fields, and the "container" paths are SageMaker's (the training
package reads them from SM_* variables; `trainctl local` sets those variables, not these keys). The
`sagemaker_*` keys belong to the in-container toolkit, written by the renderer (jobs.render.training_job).

Every key the platform owns (PLATFORM_OWNED, and any `sagemaker_*` key: the toolkit reads keys it knows
and additional framework parameters under that prefix) is refused under any spelling that could reach the
container as that key or be taken for it: case, `-` for `_`, leading dashes, surrounding whitespace and
Unicode compatibility forms (NFKC: a fullwidth `ｃheckpoint_dir` is `checkpoint_dir`). A path key that a request
could set would move checkpoints off the synced folder, and before this rule its value reached the
toolkit's shell command as it was (`/opt/ml/checkpoints$(id)`). Keys and values that do reach the command line
follow jobs.request.command_line.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import sys
import unicodedata
from typing import Any

from contract.errors import Problem
from contract.hyperparameters import TrainConfig, canonical_name, hyperparameter_fields
from contract.schema.core import field_types, parse_value
from contract.schema.json_schema import value_schema
from jobs.request.command_line import SAFE_KEY, SAFE_TEXT, TOOLKIT_PREFIX, unsafe_characters, value_problem
from jobs.request.limits import MAX_HYPERPARAMETER_JSON

# What a request's `hyperparameters` may set.
SETTABLE_HYPERPARAMETERS = frozenset(hyperparameter_fields("user"))
# SageMaker's paths inside the container: the training package reads them from SM_* variables.
CONTAINER_HYPERPARAMETERS = hyperparameter_fields("container")
# Set from the request fields of the same name (strategy, model, model_size, checkpoint_interval).
SCRIPT_HYPERPARAMETERS = hyperparameter_fields("request")
# The toolkit's keys, on every job.
LAUNCHER_HYPERPARAMETERS = (
    "sagemaker_program", "sagemaker_submit_directory", "sagemaker_region", "sagemaker_job_name",
    "sagemaker_container_log_level", "sagemaker_torch_distributed_enabled", "sagemaker_instance_type",
)
# Only on smp jobs: the platform-set hyperparameters (mp_parameters, from `parallel`) and the toolkit's switch.
SMP_HYPERPARAMETERS = (*hyperparameter_fields("platform"), "sagemaker_distributed_dataparallel_enabled")
# Only on heterogeneous clusters.
GROUP_HYPERPARAMETERS = ("sagemaker_distribution_instance_groups",)
# Every key the platform writes or SageMaker provides: never a request's, under any spelling (owner_problem).
PLATFORM_OWNED = frozenset(SCRIPT_HYPERPARAMETERS + CONTAINER_HYPERPARAMETERS + LAUNCHER_HYPERPARAMETERS
                           + SMP_HYPERPARAMETERS + GROUP_HYPERPARAMETERS)


def platform_hyperparameter_count(model_parallel: bool, groups: bool) -> int:
    """At most how many hyperparameters the renderer adds to a request's own (model_parallel: smp's or the
    torch-native degrees, counted together as an upper bound)."""
    return len(LAUNCHER_HYPERPARAMETERS) + len(SCRIPT_HYPERPARAMETERS) \
        + (len(SMP_HYPERPARAMETERS) if model_parallel else 0) \
        + (len(GROUP_HYPERPARAMETERS) if groups else 0)


# The training package's own description of each hyperparameter: its type and rules (range, choices, checks).
_TYPES = field_types(TrainConfig)
_RULES = {f.name: f.metadata for f in dataclasses.fields(TrainConfig)}
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def _value_problem(name: str, value: Any) -> str | None:
    """What the training package would refuse in `value` (its type, range, choices; NaN and infinities)."""
    if name not in _TYPES:  # settable, but not described (a test widening the settable set)
        return None
    problems: list[Problem] = []
    parse_value(_TYPES[name], value, "", problems, dict(_RULES[name]))
    return "; ".join(p.message for p in problems) or None


def normalized_key(key: str) -> str:
    """The key a spelling stands for: NFKC, trimmed, lower case, leading dashes dropped, `-` as `_`."""
    return canonical_name(unicodedata.normalize("NFKC", key).strip().lower())


def owner_problem(key: str, value: Any) -> str | None:
    """Why a request may not set `key` because the platform owns it (any spelling); None when it may."""
    name = normalized_key(key)
    if name in SCRIPT_HYPERPARAMETERS:
        return f"is set by the platform; use the request field {name!r} instead (got {value!r})"
    if name in CONTAINER_HYPERPARAMETERS:
        return (f"is SageMaker's path inside the container, which the platform sets (SM_* variables, "
                f"CheckpointConfig); remove it (got {value!r})")
    if name in PLATFORM_OWNED or name.startswith(TOOLKIT_PREFIX):
        return f"is set by the platform (the launcher and the in-container toolkit); remove it (got {value!r})"
    return None


def check_hyperparameters(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for every hyperparameter a request may not send as given."""
    found = []
    spellings: dict[str, str] = {}
    for key, value in values.items():
        if message := owner_problem(key, value) or _key_problem(key):
            found.append((key, message))
        # `lr` and `--lr`, `model_size` and `model-size`: the toolkit and argparse read them as one key.
        elif (first := spellings.setdefault(canonical_name(key), key)) != key:
            found.append((key, f"is the same hyperparameter as {first!r}; keep one spelling"))
        elif message := _settable_problem(key, value):
            found.append((key, message))
    return found


def _key_problem(key: str) -> str | None:
    if SAFE_KEY.fullmatch(key):
        return None
    return (f"{key!r} becomes `--{key}` on the toolkit's shell command line; keys are letters, digits, '_' and "
            f"'-' (refused: {unsafe_characters(key) or 'an empty key'})")


def _settable_problem(key: str, value: Any) -> str | None:
    # Not canonical_name here: `--lr` would be sent as `----lr`.
    name = key.replace("-", "_")
    if name not in SETTABLE_HYPERPARAMETERS:
        settable = sorted(SETTABLE_HYPERPARAMETERS)
        close = difflib.get_close_matches(name, settable, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(settable)}"
        return f"the training package has no hyperparameter {key!r}; {hint}"
    if value is None:
        return "must not be null; remove the key to use the training default"
    if len(json.dumps(value)) > MAX_HYPERPARAMETER_JSON:
        return f"is longer than {MAX_HYPERPARAMETER_JSON} characters once JSON-encoded (CreateTrainingJob's limit)"
    if message := value_problem(value):
        return f"{message} (it reaches the toolkit's shell command line as `--{key} <value>`)"
    if message := _value_problem(name, value):
        return f"{message} (the training package's {name})"
    return None


def spellings(name: str) -> tuple[str, ...]:
    """Every key a request may write `name` as: each `_` as `_` or `-` (`_settable_problem` reads `-` as `_`)."""
    parts = name.split("_")
    return tuple(parts[0] + "".join(sep + part for sep, part in zip(joins, parts[1:], strict=True))
                 for joins in itertools.product("_-", repeat=len(parts) - 1))


def hyperparameters_json_schema() -> dict[str, Any]:
    """A request's `hyperparameters` as JSON Schema, from the same table `check_hyperparameters` reads: every
    settable name in each spelling, with its type, range and choices; any other key refused (the platform's and
    unknown ones, as the rules refuse them); one spelling per name. Not in it: a number over 2,500 digits."""
    patterns, one_spelling = {}, {}
    for name in sorted(SETTABLE_HYPERPARAMETERS):
        pattern = "^" + name.replace("_", "[_-]") + "$"
        patterns[pattern] = _settable_value_schema(name)
        # A dashed spelling present: no other spelling of the name (the canonical one included).
        for spelling in spellings(name)[1:]:
            one_spelling[spelling] = {"propertyNames": {"anyOf": [{"const": spelling}, {"not": {"pattern": pattern}}]}}
    return {"type": "object", "patternProperties": patterns, "additionalProperties": False,
            "dependentSchemas": one_spelling}


def _settable_value_schema(name: str) -> dict[str, Any]:
    rules = _RULES[name]
    # nullable=False: a null value is refused (remove the key to get the default).
    out = value_schema(_TYPES[name], rules, nullable=False)
    if out.get("type") == "string" and "enum" not in out:
        # value_problem's rule: one shell word, and CreateTrainingJob's length once JSON-encoded (SAFE_TEXT holds
        # no character JSON escapes, so the encoding adds only the two quotes).
        own = out.get("pattern")  # the field's own pattern (profile_ranks'), beside the shell word's
        out.update(pattern=f"^(?:{SAFE_TEXT.pattern})$", maxLength=MAX_HYPERPARAMETER_JSON - 2)
        if own:
            out["allOf"] = [{"pattern": own}]
    if out.get("type") == "number" and "maximum" not in out:
        out["maximum"] = sys.float_info.max  # value_problem refuses infinities
    out["description"] = rules["doc"]
    if _DEFAULTS[name] not in (None, dataclasses.MISSING):
        out["default"] = _DEFAULTS[name]
    return out
