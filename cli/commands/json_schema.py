"""`trainctl schema`: the job request's JSON Schema (draft 2020-12), for editors and other tools.

The schema catches shape and range mistakes; `trainctl plan` (the request parser) stays the authority.
"""

from __future__ import annotations

import json
from typing import Any

import typer


def request_json_schema() -> dict[str, Any]:
    """The one place trainctl gets the schema from: the launcher's own (jobs.request.parse), so the two never differ."""
    from jobs.request.parse import request_json_schema

    return request_json_schema()


def print_request_schema() -> None:
    # Plain print, not rich: the output is a document for other programs.
    typer.echo(json.dumps(request_json_schema(), indent=2))
