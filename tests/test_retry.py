"""bbox_sae.retry: one classification of failed requests for labeling and remote scoring,
judged on the errors the real `openai` client raises against a local server."""

import asyncio
import random
from types import SimpleNamespace

import httpx
import openai
import pytest

from bbox_sae.retry import FATAL_STATUS, REQUEST_ERRORS, RETRY_STATUS, MalformedReply, classify, retrying
from helpers.fake_openai import FakeOpenAI, Reply

STATUSES = [400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504]


def failures(server_url: str, n: int, timeout_s: float = 5.0) -> list[BaseException]:
    async def one(client):
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except REQUEST_ERRORS as err:
            return err
        raise AssertionError("the request should have failed")

    async def run():
        async with openai.AsyncOpenAI(base_url=server_url, api_key="k", max_retries=0, timeout=timeout_s) as client:
            return [await one(client) for _ in range(n)]

    return asyncio.run(run())


def test_every_status_is_retried_failed_or_fatal_as_the_policy_says():
    with FakeOpenAI(lambda body, i: Reply(status=STATUSES[i], headers={"Retry-After": "7"})) as srv:
        errors = failures(srv.base_url, len(STATUSES))
    for status, err in zip(STATUSES, errors):
        f = classify(err)
        expected = "fatal" if status in FATAL_STATUS else "retry" if status in RETRY_STATUS or status >= 500 else "fail"
        assert f.action == expected, status
        assert f.description == f"HTTP {status}: scripted {status}"
        assert f.retry_after_s == (7.0 if expected == "retry" else None)


def test_a_timeout_is_retried_and_names_the_limit():
    with FakeOpenAI(lambda body, i: Reply(content="late", delay_s=2.0)) as srv:
        (err,) = failures(srv.base_url, 1, timeout_s=0.2)
    f = classify(err, timeout_s=0.2)
    assert f.action == "retry" and f.description == "timed out: no answer within 0.2 s"
    assert classify(err).description == "timed out"


def attempts_made(errors: list[BaseException], waits: list[float], max_retries: int = 2, backoff_max_s: float = 0.0) -> int:
    """Runs a request that raises `errors` in turn, then succeeds; returns how many attempts it took.
    Each wait is announced (`on_retry`), then slept (recorded, not waited: `waits`); the two agree."""
    settings = SimpleNamespace(max_retries=max_retries, backoff_base_s=0.0, backoff_max_s=backoff_max_s)
    announced: list[float] = []
    slept_s: list[float] = []

    async def slept(seconds: float) -> None:
        slept_s.append(seconds)

    async def run():
        calls = 0
        async for attempt in retrying(settings, random.Random(0), lambda state: announced.append(state.upcoming_sleep), sleep=slept):
            with attempt:
                calls += 1
                if errors:
                    raise errors.pop(0)
        return calls

    try:
        return asyncio.run(run())
    finally:
        assert slept_s == announced
        waits.extend(slept_s)


def test_retrying_retries_transient_failures_and_waits_out_retry_after():
    rate_limited = openai.RateLimitError(
        "slow down", response=httpx.Response(429, headers={"retry-after": "5"}, request=httpx.Request("POST", "http://x")), body=None
    )
    waits: list[float] = []
    assert attempts_made([rate_limited, MalformedReply("truncated")], waits, backoff_max_s=10.0) == 3
    assert waits == [5.0, 0.0]  # backoff is 0 here: only Retry-After (under the 10 s cap) explains the wait
    waits.clear()
    assert attempts_made([rate_limited], waits, backoff_max_s=2.0) == 2
    assert waits == [2.0]  # the cap holds for Retry-After too


def test_retrying_gives_up_after_max_retries_and_raises_anything_else_at_once():
    waits: list[float] = []
    with pytest.raises(MalformedReply, match="third"):
        attempts_made([MalformedReply("first"), MalformedReply("second"), MalformedReply("third")], waits)
    assert len(waits) == 2
    refused = openai.BadRequestError("bad", response=httpx.Response(400, request=httpx.Request("POST", "http://x")), body=None)
    for err in (refused, ValueError("a bug, not the server")):
        waits.clear()
        with pytest.raises(type(err)):
            attempts_made([err], waits)
        assert waits == []
