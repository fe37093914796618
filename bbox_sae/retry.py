"""Retry timing shared by the HTTP clients (labeling's chat endpoint, remote scoring)."""

from __future__ import annotations

import email.utils
import time
from typing import Mapping

# HTTP statuses worth retrying besides any 5xx: timeout, conflict, rate limit.
RETRY_STATUS = frozenset({408, 409, 429})


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUS or status >= 500


def backoff_delay(retry: int, base_s: float, max_s: float, jitter: float, retry_after_s: float | None) -> float:
    """Wait before retry number `retry` (0-based): exponential, jittered to 50-100% so parallel
    failures spread out, and never shorter than the server's Retry-After."""
    delay = min(max_s, base_s * 2**retry) * (0.5 + 0.5 * jitter)
    return max(delay, retry_after_s or 0.0)


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
