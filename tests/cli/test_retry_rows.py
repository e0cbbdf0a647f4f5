"""`trainctl plan` shows the retry policy the run will get: every setting of the request's `retry`, with its value."""

from __future__ import annotations

import dataclasses

from cli.views.plan import retry_rows
from jobs.request.parse import parse_request
from jobs.request.schema import RetrySettings


def test_every_retry_setting_is_shown_with_its_value():
    # A distinct value per setting, within its bounds, none a substring of another's.
    small, large = iter((11, 13, 17, 19, 23, 29)), iter((1801, 8001, 8009, 8039, 8053, 8059, 8069))
    values = {f.name: next(small) if f.metadata["max"] <= 30 else next(large) for f in dataclasses.fields(RetrySettings)}
    request = parse_request({"name": "r", "dataset": "s3://b-1/x/", "spot": True, "max_runtime_hours": 100,
                             "instance": {"type": "ml.p4d.24xlarge", "fallbacks": ["ml.p5.48xlarge"]},
                             "retry": values})
    shown = " ".join(f"{name} {text}" for name, text in retry_rows(request))
    missing = [name for name, value in values.items() if f"{value}" not in shown]
    assert missing == [], f"retry settings trainctl plan does not show: {missing}"
