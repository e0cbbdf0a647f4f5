"""Who sets which hyperparameter, and the rule a request's `hyperparameters` obey.

The training package's hyperparameters come from `contract.hyperparameters.TrainConfig`, each with its
`set_by`: a request may set the "user" ones and the "container" paths (accepted, as `trainctl local`
uses them); the "request" ones come from request fields of the same name and the "platform" ones from
other request fields. The `sagemaker_*` keys below belong to the in-container toolkit, written by the
renderer (jobs.render).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from contract.hyperparameters import canonical_name, hyperparameter_fields
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


def platform_hyperparameter_count(smp: bool, groups: bool) -> int:
    """How many hyperparameters the renderer adds to a request's own."""
    return len(LAUNCHER_HYPERPARAMETERS) + len(SCRIPT_HYPERPARAMETERS) + (len(SMP_HYPERPARAMETERS) if smp else 0) \
        + (len(GROUP_HYPERPARAMETERS) if groups else 0)


def check_hyperparameters(values: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for every hyperparameter a request may not send as given."""
    found = []
    platform_set = LAUNCHER_HYPERPARAMETERS + SMP_HYPERPARAMETERS + GROUP_HYPERPARAMETERS
    for key, value in values.items():
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
    return found
