"""One retry policy for the HTTP clients (labeling's chat endpoint, remote scoring): which
failures are worth another attempt, how each is described, and how long to wait; `retrying`
runs it with tenacity.

Not the openai client's own `max_retries` (both clients set it to 0): it would hide retries from
our counters, could not move a scoring request to another replica, and does not retry a
malformed reply."""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import openai
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

# Besides 5xx: statuses that say "try again later" rather than "this request is wrong".
RETRY_STATUS = frozenset({408, 409, 429})
# A wrong key, model or URL: every other request to that endpoint would fail the same way.
FATAL_STATUS = frozenset({401, 403, 404})


class MalformedReply(Exception):
    """The endpoint answered, but not in the shape asked for (retryable: a server under load
    may truncate a body, and sampling may fix a reply)."""


@dataclass(frozen=True)
class Failure:
    """What to do about a failed request: `retry` it later, `fail` it alone (the request is
    wrong), or stop everything (`fatal`: no request to that endpoint can succeed)."""

    action: Literal["retry", "fail", "fatal"]
    description: str  # one line, for logs and error messages
    retry_after_s: float | None = None  # the server's Retry-After, if it sent one


# Everything `classify` knows how to judge: catch these around a request, let anything else propagate.
REQUEST_ERRORS = (openai.APIError, TimeoutError, json.JSONDecodeError, UnicodeDecodeError, MalformedReply)


def classify(err: BaseException, timeout_s: float | None = None) -> Failure:
    """Classify an exception from an `openai` client call (including the JSON decoder's, which
    the client passes through), our own deadline's TimeoutError, or MalformedReply;
    `timeout_s` is named in the description of a timeout."""
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        detail = err.body.get("message") if isinstance(err.body, dict) else None
        detail = " ".join(str(detail if detail is not None else err.response.text).split())[:300]
        description = f"HTTP {status}" + (f": {detail}" if detail else "")
        if status in FATAL_STATUS:
            return Failure("fatal", description)
        if status in RETRY_STATUS or status >= 500:
            return Failure("retry", description, retry_after_seconds(err.response.headers))
        return Failure("fail", description)
    if isinstance(err, (openai.APITimeoutError, TimeoutError)):
        within = f": no answer within {timeout_s:g} s" if timeout_s is not None else ""
        return Failure("retry", f"timed out{within}")
    if isinstance(err, openai.APIConnectionError):
        cause = err.__cause__
        return Failure("retry", f"connection failed: {type(cause).__name__}: {cause}" if cause else "connection failed")
    if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)):
        # The client hands a truncated JSON body on as the decoder's error.
        return Failure("retry", f"malformed JSON ({err})")
    if isinstance(err, MalformedReply):
        return Failure("retry", str(err))
    # e.g. a body the client could not parse into its response type: asking again will not help.
    return Failure("fail", f"{type(err).__name__}: {err}")


class RetrySettings(Protocol):
    """The retry fields of a config section (label, or an endpoint model)."""

    max_retries: int
    backoff_base_s: float
    backoff_max_s: float


def retrying(
    settings: RetrySettings, rng: random.Random, on_retry: Callable[[RetryCallState], None], sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> AsyncRetrying:
    """Attempts of one request (`async for attempt in retrying(...): with attempt: ...`): what
    `classify` calls transient is tried again, up to `max_retries` times, after `backoff_delay`
    (`on_retry` runs just before each wait, which is `upcoming_sleep`, spent in `sleep`); anything
    else, and the last failure, is raised as it is. Build one per request: its state is not shared."""

    def wait(state: RetryCallState) -> float:
        # Ours, not tenacity's wait_random_exponential: that one draws from the global `random`
        # and has no way to wait at least the server's Retry-After.
        failure = classify(state.outcome.exception())
        return backoff_delay(state.attempt_number - 1, settings.backoff_base_s, settings.backoff_max_s, rng.random(), failure.retry_after_s)

    return AsyncRetrying(
        retry=retry_if_exception(lambda err: isinstance(err, REQUEST_ERRORS) and classify(err).action == "retry"),
        stop=stop_after_attempt(settings.max_retries + 1),
        wait=wait,
        before_sleep=on_retry,
        sleep=sleep,
        reraise=True,
    )


def backoff_delay(retry: int, base_s: float, max_s: float, jitter: float, retry_after_s: float | None) -> float:
    """Wait before retry number `retry` (0-based): exponential, jittered to 50-100% so parallel
    failures spread out, and never shorter than the server's Retry-After up to `max_s`: a server
    asking for a day (`Retry-After: 86400`) or for ever (`inf`) is not waited on for that long."""
    delay = min(max_s, base_s * 2**retry) * (0.5 + 0.5 * jitter)
    return max(delay, min(retry_after_s or 0.0, max_s))


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return None if math.isnan(seconds) else max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
