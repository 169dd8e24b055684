"""Quota periods: the kinds a quota counts over, and where each period starts and ends (UTC calendar)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

Period = Literal["day", "week", "month", "none"]
PERIODS: tuple[str, ...] = get_args(Period)


def period_start(period: str, now: datetime, created_at: datetime) -> datetime:
    """Start of the quota period that contains `now` (UTC calendar: day, ISO week from Monday, month)."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return created_at


def next_period_start(period: str, start: datetime) -> datetime | None:
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    if period == "month":
        return (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return None
