"""The one schema engine: JSON-like documents into frozen dataclasses, collecting every problem.

A dataclass is the schema: each field's type annotation says what JSON value it takes, and
`field(metadata=meta(...))` adds `doc`, `min`, `max`, `choices`, `pattern`, `max_length` and `check`.
One definition gives the parser, the error messages (each naming the field path), the text form
(`coerce_text`: CDK `-c` values, the training container's `--key value` arguments), the JSON Schema
(`json_schema`) and the README's reference tables (`reference_rows`). The job request, the platform
settings, the platform config and the training hyperparameters are all read by it.

Standard library only: it runs in the launcher Lambda and inside the training container.
"""

from contract.schema.core import (
    join,
    meta,
    parse_dataclass,
    parse_value,
    reference_rows,
    to_jsonable,
    type_name,
)
from contract.schema.json_schema import json_schema
from contract.schema.text import coerce_text

__all__ = ["coerce_text", "join", "json_schema", "meta", "parse_dataclass", "parse_value", "reference_rows",
           "to_jsonable", "type_name"]
