"""CloudWatch Logs retention from a day count (config.LOG_RETENTION_DAYS already checked it)."""

from __future__ import annotations

from aws_cdk import aws_logs as logs

from platform_constructs.config import LOG_RETENTION_DAYS

# jsii enums carry names, not day counts; RetentionDays lists the periods in the same order as the API.
_BY_DAYS = dict(zip(LOG_RETENTION_DAYS, [m for m in logs.RetentionDays if m.value != "INFINITE"], strict=True))


def retention(days: int) -> logs.RetentionDays:
    return _BY_DAYS[days]
