"""Field-level rules of the job request: each checks one field's value while it is parsed, so its problem is
reported even when another field is broken. Cross-field rules are in jobs.request.cross_rules."""

from __future__ import annotations

import difflib
import re

from jobs import catalog
from jobs.naming import RUN_ID, RUN_ID_MAX, RUN_NAME, RUN_NAME_MAX
from jobs.request.command_line import text_problem
from jobs.request.limits import (
    MAX_HYPERPARAMETER_JSON,
    MAX_IMAGE_URI,
    MAX_METRIC_NAME,
    MAX_S3_URI,
    MAX_TAG_KEY,
    MAX_TAG_VALUE,
)

_GROUP_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")
# The service model's S3Uri pattern, and what S3 itself refuses in a bucket name.
_S3_API = re.compile(r"(https|s3)://([^/]+)/?(.*)")
# A container image reference as ECR and Docker read it: lower-case registry and path, a tag or a digest.
IMAGE_URI = re.compile(r"(?P<registry>[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?)"
                       r"/(?P<repository>[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*)"
                       r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?")


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
    if not RUN_NAME.fullmatch(name) or len(name) > RUN_NAME_MAX:
        return (f"{name!r} must be 1-{RUN_NAME_MAX} letters, digits and dashes, starting and ending with a letter "
                "or digit (it becomes part of the SageMaker job name)")
    return None


def check_run_id(run_id: str) -> str | None:
    if not RUN_ID.fullmatch(run_id) or len(run_id) > RUN_ID_MAX:
        return (f"{run_id!r} is not a run id; give the run_id of the run to resume, as its execution's output and "
                "`trainctl status` show it: `<request name>-<16 random characters>`")
    return None


def check_dataset(uri: str) -> str | None:
    kind = dataset_kind(uri)
    if kind == "unknown":
        return (f"{uri!r} is not a dataset location; use s3://bucket/prefix/, fsx:/path/on/fsx, "
                "or a local folder (./data, /abs/path) for trainctl local")
    if kind == "s3":
        return _s3_problem(uri)
    if kind == "fsx" and not fsx_path(uri):
        return "an fsx: dataset needs a path, e.g. fsx:/datasets/c4"
    if kind == "fsx" and ".." in fsx_path(uri).split("/"):
        return f"{uri!r} climbs out of its folder with '..'; name the folder under the file system root"
    if kind == "fsx" and {"", "."} & set(fsx_path(uri).split("/")):
        return (f"{uri!r} has an empty or '.' path segment; name the folder plainly "
                f"(fsx:/{'/'.join(s for s in fsx_path(uri).split('/') if s not in ('', '.'))})")
    if kind == "fsx" and (len(fsx_path(uri)) > 4096 or any(ord(c) < 32 for c in uri)):
        return f"{uri[:60]!r}...: use a path of at most 4096 printable characters"
    if kind == "fsx" and (problem := text_problem(fsx_path(uri))):
        return f"the path {problem}"
    return None


def _s3_problem(uri: str) -> str | None:
    bucket = uri[len("s3://"):].partition("/")[0] if uri.startswith("s3://") else ""
    if bucket and not 3 <= len(bucket) <= 63:
        # The form is right; the name is not one S3 allows: say which part.
        return (f"{uri[:80]!r}: the bucket name {bucket[:70]!r} has {len(bucket)} characters; S3 bucket names have 3 "
                "to 63 (lower-case letters, digits, '.' and '-')")
    if not _S3_URI.fullmatch(uri) or any(ord(c) < 32 or ord(c) == 127 for c in uri):
        return f"{uri[:80]!r} is not a valid S3 URI (s3://bucket/prefix/)"
    if len(uri) > MAX_S3_URI:
        return f"is {len(uri)} characters; CreateTrainingJob takes S3 URIs of at most {MAX_S3_URI}"
    bucket, _, key = uri[len("s3://"):].partition("/")
    if ".." in bucket or ".-" in bucket or "-." in bucket or _IP_ADDRESS.fullmatch(bucket) \
            or bucket.startswith("xn--") or bucket.endswith("-s3alias"):
        return f"{bucket!r} is not a valid bucket name (no '..', '.-', '-.', IP addresses, xn-- or -s3alias)"
    if key and not key.endswith("/"):
        # A prefix without its slash also names its siblings: s3://b/data/c4 reads s3://b/data/c4-old/ too.
        return f"{uri[:80]!r} does not end with '/': as a prefix it also names its siblings ({key}-old/...); add the '/'"
    if "//" in key:
        # SageMaker refuses such keys at download time: "has an illegal char sub-sequence '//' in it".
        return f"{uri[:80]!r} has '//' in its key, which SageMaker refuses; remove the empty path segment"
    if key and (problem := text_problem(key)):
        return f"the key {problem}"
    return None


def image_parts(uri: str) -> tuple[str, str] | None:
    """(registry, repository) of `<registry>/<repository>[:tag][@sha256:digest]`; None when it is not one."""
    match = IMAGE_URI.fullmatch(uri)
    return (match["registry"], match["repository"]) if match else None


def check_image(uri: str) -> str | None:
    if len(uri) > MAX_IMAGE_URI or image_parts(uri) is None:
        return (f"{uri[:80]!r} is not an image URI: give `<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>` "
                f"(or @sha256:<digest>), at most {MAX_IMAGE_URI} characters")
    return None


def check_plain_text(text: str) -> str | None:
    """Free text that names a thing (framework_version)."""
    return text_problem(text)


def check_hyperparameter_text(text: str) -> str | None:
    """Free text that the renderer sends as a hyperparameter value (model, model_size): one plain word, within
    CreateTrainingJob's cap on a JSON-encoded value (its two quotes included)."""
    if len(text) + 2 > MAX_HYPERPARAMETER_JSON:
        return (f"is {len(text)} characters; it becomes a hyperparameter value, which CreateTrainingJob caps at "
                f"{MAX_HYPERPARAMETER_JSON} once JSON-encoded: shorten it")
    return text_problem(text)


def check_metric_name(name: str) -> str | None:
    if len(name) > MAX_METRIC_NAME or not re.fullmatch(r".+", name):
        return f"a metric name has 1-{MAX_METRIC_NAME} characters on one line"
    return text_problem(name)


def check_instance_type(instance_type: str) -> str | None:
    if catalog.lookup(instance_type) is not None:
        return None
    close = difflib.get_close_matches(instance_type, catalog.instance_types(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else "; see jobs.catalog for the supported types"
    return f"unknown instance type {instance_type!r}{hint}"


def check_instance_types(types: tuple[str, ...]) -> list[tuple[int, str]]:
    # Items the engine already refused (null, a number) arrive as None: their problem is reported once.
    return [(i, msg) for i, t in enumerate(types) if isinstance(t, str) and (msg := check_instance_type(t))]


def check_group_name(name: str) -> str | None:
    return None if _GROUP_NAME.fullmatch(name) else f"{name!r}: use 1-64 letters, digits, '-' or '_'"


def check_tags(tags: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for key, value in tags.items():
        if key.lower().startswith("aws:"):
            found.append((key, "keys starting with 'aws:' are reserved by AWS"))
        elif not 1 <= len(key) <= MAX_TAG_KEY or not _tag_text(key):
            found.append((key, f"keys are 1-{MAX_TAG_KEY} letters, digits, spaces and _ . : / = + - @"))
        elif len(value) > MAX_TAG_VALUE or not _tag_text(value):
            found.append((key, f"values are at most {MAX_TAG_VALUE} letters, digits, spaces and _ . : / = + - @"))
    return found


def _tag_text(text: str) -> bool:
    # The API's pattern is [\p{L}\p{Z}\p{N}_.:/=+\-@]*: letters, separators (spaces), numbers. Python's
    # isspace() also takes tabs and newlines, which are not separators: only \p{Z} (space-like) counts.
    return all(ch.isalnum() or ch in "_.:/=+-@" or (ch.isspace() and ch.isprintable()) or ch == " "
               for ch in text)
