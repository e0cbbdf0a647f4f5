"""Timestamps as the services and the platform's settings hand them over, read in one place: ISO 8601 text (a
trailing Z; no zone means UTC), datetimes (boto3's), epoch seconds or milliseconds (Step Functions' events); and
durations and counts as people read them, written in one place (trainctl, the notifications, the failure texts)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def duration(seconds: float | None) -> str:
    """`1h02m05s`, `4m`, `-` for unknown: the one way trainctl and the notification write a duration."""
    if seconds is None:
        return "-"
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"
    return f"{text}{secs:02d}s" if secs else text


def times(n: int) -> str:
    """A count as a person reads it: once, twice, 3 times."""
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


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
