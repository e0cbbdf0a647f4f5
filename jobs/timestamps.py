"""Timestamps as the services and the platform's settings hand them over, read in one place: ISO 8601 text (a
trailing Z; no zone means UTC), datetimes (boto3's), epoch seconds or milliseconds (Step Functions' events)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def utc_datetime(value: str | datetime) -> datetime:
    """`value` as a datetime with a zone (UTC when it names none); ValueError when it is not ISO 8601."""
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def to_epoch(value: Any) -> float | None:
    """Epoch seconds of any timestamp form above; None when there is none or it cannot be read."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return value / 1000 if value > 1e11 else float(value)
    if hasattr(value, "timestamp"):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return utc_datetime(value).timestamp()
        except ValueError:
            try:
                return to_epoch(float(value.strip()))
            except ValueError:
                return None
    return None
