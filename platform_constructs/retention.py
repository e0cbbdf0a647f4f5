"""CloudWatch Logs retention from a day count, for callers that hold days (cdk.json) rather than the enum."""

from __future__ import annotations

from aws_cdk import aws_logs as logs

# The periods CloudWatch Logs accepts, in RetentionDays' order (jsii enums carry names, not day counts).
RETENTION_PERIODS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
                     2922, 3288, 3653)
_BY_DAYS = dict(zip(RETENTION_PERIODS, [m for m in logs.RetentionDays if m.value != "INFINITE"], strict=True))


def retention(days: int) -> logs.RetentionDays:
    if days not in _BY_DAYS:
        raise ValueError(f"log retention of {days} days: use one of CloudWatch Logs' periods "
                         f"{', '.join(map(str, RETENTION_PERIODS))}")
    return _BY_DAYS[days]
