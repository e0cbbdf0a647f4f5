"""Reading a job request file: JSON errors and validation problems become one message each."""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.errors import UserError


@dataclass(frozen=True)
class LoadedRequest:
    path: Path
    # The document as the user wrote it: what `submit` sends as the execution input.
    document: dict[str, Any]
    # jobs.request.parse.JobRequest: the parsed, validated request with its defaults filled in.
    request: Any


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path`; a missing file or malformed JSON is a UserError naming the place."""
    try:
        # utf-8-sig: Windows editors (Notepad, PowerShell's Out-File) start the file with a byte-order mark, which
        # json refuses as "Expecting value"; it carries no meaning, so it is skipped.
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{what} path is a directory, not a file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {what} file {path}: {exc}") from None
    if not text.strip():
        start = " (examples/ has requests to start from, e.g. examples/local-fsdp.json)" if "request" in what else ""
        raise UserError(f"{path} is empty: a {what} is a JSON object", f"write its fields into it{start}")
    try:
        data = _StrictKeysDecoder().decode(text)
    except DuplicateKey as exc:
        raise UserError(f"{path}: line {exc.line}: key {json.dumps(exc.key)} appears twice in one object (first on line "
                        f"{exc.first_line}); JSON would keep only the last value",
                        f"remove one of the two {json.dumps(exc.key)} keys") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}",
                        "check for a missing comma or quote, or a trailing comma") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a {what} must be a JSON object, got {type(data).__name__}")
    return data


class DuplicateKey(ValueError):
    def __init__(self, key: str, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r} on line {line}")
        self.key, self.line, self.first_line = key, line, first_line


class _StrictKeysDecoder(json.JSONDecoder):
    """json's decoder, refusing an object that names a key twice (json.loads would silently keep the last:
    `"spot": true, ..., "spot": false` would launch on demand without a word).

    object_pairs_hook alone would see the pairs but not where they are; the pure-Python scanner calls
    `parse_object` with the object's position, so the error can name the line of each occurrence.
    """

    def __init__(self) -> None:
        super().__init__(object_pairs_hook=list)
        self.parse_object = self._parse_object
        self.scan_once = json.scanner.py_make_scanner(self)

    def _parse_object(self, s_and_end: tuple[str, int], strict: bool, scan_once: Any, object_hook: Any,
                      object_pairs_hook: Any, memo: Any = None) -> tuple[dict[str, Any], int]:
        pairs, end = json.decoder.JSONObject(s_and_end, strict, scan_once, None, list, memo)
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            text, start = s_and_end
            seen: dict[str, int] = {}
            for key, position in _key_positions(text, start, strict, scan_once):
                line = text.count("\n", 0, position) + 1
                if key in seen:
                    raise DuplicateKey(key, line, seen[key])
                seen[key] = line
        return dict(pairs), end


def _key_positions(text: str, index: int, strict: bool, scan_once: Any) -> list[tuple[str, int]]:
    """Each key of the (valid) object whose `{` is just before `index`, with the offset of its quote."""
    found = []
    index = _skip_space(text, index)
    while text[index] == '"':
        key, after = json.decoder.scanstring(text, index + 1, strict)
        found.append((key, index))
        value_start = _skip_space(text, _skip_space(text, after) + 1)  # past the colon
        _, index = scan_once(text, value_start)
        index = _skip_space(text, index)
        if text[index] != ",":
            break
        index = _skip_space(text, index + 1)
    return found


def _skip_space(text: str, index: int) -> int:
    return json.decoder.WHITESPACE.match(text, index).end()


def load_request(path: Path) -> LoadedRequest:
    """Read and validate a job request (no AWS call). Raises UserError listing every problem."""
    return parse_loaded(path, read_json_object(path, "job request"))


def parse_loaded(path: Path, document: dict[str, Any]) -> LoadedRequest:
    """Validate a job request document read from `path` (perhaps with a field set by trainctl since)."""
    from contract.errors import RequestInvalid
    from jobs.request.parse import parse_request

    try:
        request = parse_request(document)
    except RequestInvalid as exc:
        raise UserError(f"{path} is not a valid job request:\n{_indent(str(exc))}",
                        "fix the fields named above (see the request reference in README.md)") from None
    return LoadedRequest(path=path, document=document, request=request)


def validate_for_platform(loaded: LoadedRequest, platform: Any) -> None:
    """The platform-dependent rules (allowed instance types, training plans, FSx), as one UserError."""
    from contract.errors import RequestInvalid
    from jobs.request.parse import validate_for_platform as _validate

    try:
        _validate(loaded.request, platform)
    except RequestInvalid as exc:
        raise UserError(f"{loaded.path} does not fit this platform:\n{_indent(str(exc))}",
                        "fix the fields named above, or ask the platform team to allow them") from None


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())
