"""The dataset's meta.json for `trainctl plan`'s input check (jobs.planning.input_check): its `format` says what
the loader decodes. The prepare tools in training/ write it beside the shards.

Read from S3 when the plan already talks to AWS (the deployed platform's settings: not with `--platform FILE`,
which promises no AWS call). An FSx path cannot be read from here, and a local folder is never planned (`trainctl
plan` refuses a local dataset: it runs only under `trainctl local`). Where it cannot be read the plan goes on and
says why (the request's sizing.data_format is the way to tell it then): a plan never fails for want of its input
check.
"""
from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from jobs.request.field_rules import dataset_kind

META = "meta.json"
MAX_META_BYTES = 1 << 16  # the prepare tools write a few hundred bytes; a larger object is not one of theirs


def dataset_meta(dataset: str, aws: Any | None) -> dict[str, Any] | str | None:
    """The meta.json as a dict; a str saying why it could not be read; None where nothing was tried (FSx, a local
    folder, or S3 without `aws`)."""
    if dataset_kind(dataset) == "s3" and aws is not None:
        bucket, _, prefix = dataset.removeprefix("s3://").partition("/")
        key = f"{prefix.rstrip('/')}/{META}" if prefix.strip("/") else META
        where = f"s3://{bucket}/{key}"
        try:
            body = aws.client("s3").get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{MAX_META_BYTES - 1}")["Body"]
            return _parsed(body.read(), where)
        except ClientError as exc:
            return f"cannot read {where}: {exc.response.get('Error', {}).get('Code', 'error')}"
        except BotoCoreError as exc:  # no credentials, no network
            return f"cannot read {where}: {exc}"
    return None


def _parsed(data: bytes, where: str) -> dict[str, Any] | str:
    try:
        meta = json.loads(data)
    except ValueError:
        return f"{where} is not JSON"
    return meta if isinstance(meta, dict) else f"{where} holds a JSON {type(meta).__name__}, not an object"
