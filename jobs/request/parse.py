"""The job request's entry points: read a document into a `JobRequest`, check it against a platform, and
describe it as a JSON Schema.

`parse_request(data)` checks everything that does not depend on the deployed platform (types, ranges,
unknown fields, cross-field rules from the CreateTrainingJob API) and returns a frozen `JobRequest`.
`validate_for_platform(request, platform)` adds the rules that do (allowed instance types, training
plans, FSx, images). Both raise `RequestInvalid` with one problem per line, each naming its field.

Where things live: the schema in jobs.request.schema, field-level rules in jobs.request.field_rules,
cross-field rules in jobs.request.cross_rules, platform rules in jobs.request.platform_rules, limits in jobs.request.limits.
The names below are re-exported so that callers need only this module.
"""

from __future__ import annotations

import re
from typing import Any

from contract.errors import Problem, RequestInvalid
from contract.schema import json_schema, parse_dataclass
from jobs.request.command_line import SAFE_TEXT
from jobs.request.cross_rules import cross_field_problems
from jobs.request.environment_rules import ENV_NAME, ENV_VALUE, REFUSED, SECRET_ARN
from jobs.request.field_rules import IMAGE_URI, dataset_kind, fsx_path
from jobs.request.hyperparameter_rules import hyperparameters_json_schema
from jobs.request.limits import MAX_REQUEST_BYTES, MAX_REQUEST_DEPTH, PLATFORM_ENVIRONMENT
from jobs.request.platform_rules import validate_for_platform
from jobs.request.schema import JobRequest

__all__ = ["PLATFORM_ENVIRONMENT", "JobRequest", "RequestInvalid", "dataset_kind", "fsx_path", "parse_request",
           "request_json_schema", "validate_for_platform"]

# Fields people put at the top level that live in a section, for "did you mean".
_ELSEWHERE = {
    "instance_type": "instance.type", "instance_count": "instance.count", "fallbacks": "instance.fallbacks",
    "fallback_instance_types": "instance.fallbacks", "volume_gb": "instance.volume_gb",
    "volume_size_gb": "instance.volume_gb", "max_attempts": "retry.max_attempts",
    "tensor_parallel_degree": "parallel.tensor_parallel_degree", "hybrid_shard_degree": "parallel.hybrid_shard_degree",
    "pipeline_parallel_degree": "parallel.pipeline_parallel_degree", "use_spot": "spot", "spot_instances": "spot",
    "max_run": "max_runtime_hours", "max_wait": "max_wait_hours", "hyperparams": "hyperparameters",
    "env": "environment", "image_uri": "image", "keep_alive_minutes": "warm_pool_minutes",
}


def parse_request(data: dict[str, Any]) -> JobRequest:
    """Validate a job request document; raise RequestInvalid naming every problem."""
    if not isinstance(data, dict):
        raise RequestInvalid([Problem("", f"a job request is a JSON object, got {type(data).__name__}")])
    if problem := _shape_problem(data):
        raise RequestInvalid([problem])
    problems: list[Problem] = []
    request = parse_dataclass(JobRequest, data, "", problems, elsewhere=_ELSEWHERE)
    if request is not None:
        problems.extend(cross_field_problems(request))
    if problems:
        raise RequestInvalid(problems)
    return request


def _shape_problem(data: dict[str, Any]) -> Problem | None:
    """Bound nesting and size before any code walks the document (recursion, json.dumps, the schema engine)."""
    stack, seen = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        if depth > MAX_REQUEST_DEPTH:
            return Problem("", f"a job request nests at most {MAX_REQUEST_DEPTH} levels deep; flatten the deepest "
                               "value (hyperparameters take JSON values, not deep structures)")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            seen += 1
            stack.append((child, depth + 1))
        # A rough size: the strings and keys it holds (exact JSON size needs the encoder, which recurses).
        seen += len(value) if isinstance(value, str) else 0
        if isinstance(value, dict):
            seen += sum(len(str(k)) for k in value)
        if seen > MAX_REQUEST_BYTES:
            return Problem("", f"a job request is at most {MAX_REQUEST_BYTES // 1024} KiB (Step Functions' limit "
                               "on an execution's input); shorten it")
    return None


def request_json_schema() -> dict[str, Any]:
    """The job request as a JSON Schema (draft 2020-12), for editors and the console's input box.

    It catches shapes, types, ranges and choices, and the character rules that a pattern can say (what reaches
    the toolkit's command line, variable names, image URIs, secret ARNs); `hyperparameters` lists every
    hyperparameter a request may set, as jobs.request.hyperparameter_rules does. The allow-lists that depend on the
    platform and cross-field rules need code, so `parse_request` and `validate_for_platform` stay the authority.
    """
    schema = json_schema(JobRequest, title="Job request",
                         description="A training run for the SageMaker training platform's launcher (trainctl "
                                     "submit).")
    props = schema["properties"]
    safe = _anchored(SAFE_TEXT.pattern)
    props["hyperparameters"].update(hyperparameters_json_schema())
    names = {"pattern": _anchored(ENV_NAME.pattern), "not": {"pattern": _refused_names_pattern()}}
    props["environment"].update({"propertyNames": names, "additionalProperties": {
        "type": "string", "pattern": _anchored(ENV_VALUE.pattern)}})
    props["secrets"].update({"propertyNames": names, "additionalProperties": {
        "type": "string", "pattern": _anchored(SECRET_ARN.pattern)}})
    for name in ("model", "model_size", "framework_version"):
        _string_schema(props[name])["pattern"] = safe
    _string_schema(props["image"])["pattern"] = _anchored(re.sub(r"\?P<\w+>", "", IMAGE_URI.pattern))
    return schema


def _anchored(pattern: str) -> str:
    return f"^(?:{pattern})$"


def _refused_names_pattern() -> str:
    """REFUSED's patterns as one regex (upper case: JSON Schema patterns have no case flag)."""
    return "^(?:" + "|".join(re.escape(p).replace("\\*", ".*") for p, _ in REFUSED) + ")$"


def _string_schema(prop: dict[str, Any]) -> dict[str, Any]:
    """The string branch of a property (optional fields are `anyOf: [string, null]`)."""
    return next((b for b in prop.get("anyOf", []) if b.get("type") == "string"), prop)
