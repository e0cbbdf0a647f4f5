"""Reading a job request file: JSON errors and validation problems become one message each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.errors import UserError


@dataclass(frozen=True)
class LoadedRequest:
    path: Path
    # The document as the user wrote it: what `submit` sends as the execution input.
    document: dict[str, Any]
    # jobs.request.JobRequest: the parsed, validated request with its defaults filled in.
    request: Any


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path`; a missing file or malformed JSON is a UserError naming the place."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{what} path is a directory, not a file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} file {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}",
                        "check for a missing comma or quote, or a trailing comma") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a {what} must be a JSON object, got {type(data).__name__}")
    return data


def load_request(path: Path) -> LoadedRequest:
    """Read and validate a job request (no AWS call). Raises UserError listing every problem."""
    from contract.errors import RequestInvalid
    from jobs.request import parse_request

    document = read_json_object(path, "job request")
    try:
        request = parse_request(document)
    except RequestInvalid as exc:
        raise UserError(f"{path} is not a valid job request:\n{_indent(str(exc))}",
                        "fix the fields named above (see the request reference in README.md)") from None
    return LoadedRequest(path=path, document=document, request=request)


def validate_for_platform(loaded: LoadedRequest, platform: Any) -> None:
    """The platform-dependent rules (allowed instance types, training plans, FSx), as one UserError."""
    from contract.errors import RequestInvalid
    from jobs.request import validate_for_platform as _validate

    try:
        _validate(loaded.request, platform)
    except RequestInvalid as exc:
        raise UserError(f"{loaded.path} does not fit this platform:\n{_indent(str(exc))}",
                        "fix the fields named above, or ask the platform team to allow them") from None


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
