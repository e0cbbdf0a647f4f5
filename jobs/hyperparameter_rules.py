"""Who sets which hyperparameter, and the rule a request's `hyperparameters` obey.

The training package's hyperparameters come from `contract.hyperparameters.TrainConfig`, each with its
`set_by`: a request may set the "user" ones and the "container" paths (accepted, as `trainctl local`
uses them); the "request" ones come from request fields of the same name and the "platform" ones from
other request fields. The `sagemaker_*` keys below belong to the in-container toolkit, written by the
renderer (jobs.render).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any

from contract.errors import Problem
from contract.hyperparameters import TrainConfig, canonical_name, hyperparameter_fields
from contract.schema.core import field_types, parse_value
from jobs.api_limits import MAX_HYPERPARAMETER_JSON

# What a request's `hyperparameters` may set.
SETTABLE_HYPERPARAMETERS = frozenset(hyperparameter_fields("user") + hyperparameter_fields("container"))
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


def platform_hyperparameter_count(model_parallel: bool, groups: bool) -> int:
    """At most how many hyperparameters the renderer adds to a request's own (model_parallel: smp's or the
    torch-native degrees, counted together as an upper bound)."""
    return len(LAUNCHER_HYPERPARAMETERS) + len(SCRIPT_HYPERPARAMETERS) \
        + (len(SMP_HYPERPARAMETERS) if model_parallel else 0) \
        + (len(GROUP_HYPERPARAMETERS) if groups else 0)


# The training package's own description of each hyperparameter: its type and rules (range, choices, checks).
_TYPES = field_types(TrainConfig)
_RULES = {f.name: f.metadata for f in dataclasses.fields(TrainConfig)}


def _value_problem(name: str, value: Any) -> str | None:
    """What the training package would refuse in `value` (its type, range, choices; NaN and infinities)."""
    if name not in _TYPES:  # settable, but not described (a test widening the settable set)
        return None
    problems: list[Problem] = []
    parse_value(_TYPES[name], value, "", problems, dict(_RULES[name]))
    return "; ".join(p.message for p in problems) or None


def check_hyperparameters(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for every hyperparameter a request may not send as given."""
    found = []
    platform_set = LAUNCHER_HYPERPARAMETERS + SMP_HYPERPARAMETERS + GROUP_HYPERPARAMETERS
    spellings: dict[str, str] = {}
    for key, value in values.items():
        # `lr` and `--lr`, `model_size` and `model-size`: the toolkit and argparse read them as one key.
        if (first := spellings.setdefault(canonical_name(key), key)) != key:
            found.append((key, f"is the same hyperparameter as {first!r}; keep one spelling"))
            continue
        # `model-size` reaches the training package as model_size: refuse it like model_size.
        name = canonical_name(key)
        if name in SCRIPT_HYPERPARAMETERS:
            found.append((key, f"is set by the platform; use the request field {name!r}"))
        elif name in platform_set:
            found.append((key, "is set by the platform; remove it"))
        # Not canonical_name here: `--lr` would be sent as `----lr`.
        elif key.replace("-", "_") not in SETTABLE_HYPERPARAMETERS:
            settable = sorted(SETTABLE_HYPERPARAMETERS)
            close = difflib.get_close_matches(key.replace("-", "_"), settable, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(settable)}"
            found.append((key, f"the training package has no hyperparameter {key!r}; {hint}"))
        elif value is None:
            found.append((key, "must not be null; remove the key to use the training default"))
        elif len(json.dumps(value)) > MAX_HYPERPARAMETER_JSON:
            found.append((key, f"is longer than {MAX_HYPERPARAMETER_JSON} characters once JSON-encoded "
                               "(CreateTrainingJob's limit)"))
        elif message := _value_problem(key.replace("-", "_"), value):
            found.append((key, f"{message} (the training package's {key.replace('-', '_')})"))
    return found
