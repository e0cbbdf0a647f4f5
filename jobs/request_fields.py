"""Field-level rules of the job request: each checks one field's value while it is parsed, so its problem is
reported even when another field is broken. Cross-field rules are in jobs.request_rules."""

from __future__ import annotations

import difflib
import re

from jobs import catalog
from jobs.api_limits import MAX_ENVIRONMENT_TEXT

NAME_MAX = 40  # leaves room for "<prefix>-" and "-<hash>-a<N>" inside SageMaker's 63 characters
_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
_ENV_KEY = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_GROUP_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?")


def dataset_kind(uri: str) -> str:
    """"s3", "fsx", "local" (a folder, for `trainctl local`) or "unknown"."""
    if uri.startswith("s3://"):
        return "s3"
    if uri.startswith("fsx:"):
        return "fsx"
    if uri.startswith(("/", "./", "../", "~", "file://")):
        return "local"
    return "unknown"


def fsx_path(uri: str) -> str:
    """`fsx:/datasets/c4` or `fsx:///datasets/c4` -> `datasets/c4` (relative to the file system root)."""
    return uri[len("fsx:"):].lstrip("/").rstrip("/")


def check_name(name: str) -> str | None:
    if not _NAME.fullmatch(name) or len(name) > NAME_MAX:
        return (f"{name!r} must be 1-{NAME_MAX} letters, digits and dashes, starting and ending with a letter "
                "or digit (it becomes part of the SageMaker job name)")
    return None


def check_dataset(uri: str) -> str | None:
    kind = dataset_kind(uri)
    if kind == "unknown":
        return (f"{uri!r} is not a dataset location; use s3://bucket/prefix/, fsx:/path/on/fsx, "
                "or a local folder (./data, /abs/path) for trainctl local")
    if kind == "s3" and not _S3_URI.fullmatch(uri):
        return f"{uri!r} is not a valid S3 URI (s3://bucket/prefix/)"
    if kind == "fsx" and not fsx_path(uri):
        return "an fsx: dataset needs a path, e.g. fsx:/datasets/c4"
    return None


def check_instance_type(instance_type: str) -> str | None:
    if catalog.lookup(instance_type) is not None:
        return None
    close = difflib.get_close_matches(instance_type, catalog.instance_types(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; see jobs.catalog for the supported types"
    return f"unknown instance type {instance_type!r}{hint}"


def check_instance_types(types: tuple[str, ...]) -> list[tuple[int, str]]:
    return [(i, msg) for i, t in enumerate(types) if (msg := check_instance_type(t))]


def check_group_name(name: str) -> str | None:
    return None if _GROUP_NAME.fullmatch(name) else f"{name!r}: use 1-64 letters, digits, '-' or '_'"


def check_environment(env: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for key, value in env.items():
        if not _ENV_KEY.fullmatch(key) or len(key) > MAX_ENVIRONMENT_TEXT:
            found.append((key, f"names must match [a-zA-Z_][a-zA-Z0-9_]* (at most {MAX_ENVIRONMENT_TEXT} characters)"))
        elif len(value) > MAX_ENVIRONMENT_TEXT:
            found.append((key, f"values must be at most {MAX_ENVIRONMENT_TEXT} characters"))
    return found


def check_tags(tags: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for key, value in tags.items():
        if key.lower().startswith("aws:"):
            found.append((key, "keys starting with 'aws:' are reserved by AWS"))
        elif not 1 <= len(key) <= 128 or not _tag_text(key):
            found.append((key, "keys are 1-128 letters, digits, spaces and _ . : / = + - @"))
        elif len(value) > 256 or not _tag_text(value):
            found.append((key, "values are at most 256 letters, digits, spaces and _ . : / = + - @"))
    return found


def _tag_text(text: str) -> bool:
    # The API's pattern is [\p{L}\p{Z}\p{N}_.:/=+\-@]*: letters, separators (spaces), numbers.
    return all(ch.isalnum() or ch.isspace() or ch in "_.:/=+-@" for ch in text)
