"""The OpenAI-compatible asker: one concurrency limit, our retry policy (`bbox_sae.retry`), an answer cache on disk."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import openai

from bbox_sae.artifacts import atomic_write_json
from bbox_sae.config import LabelConfig
from bbox_sae.errors import EndpointError
from bbox_sae.labeling.messages import PROMPT_VERSION
from bbox_sae.retry import REQUEST_ERRORS, MalformedReply, classify, retrying

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass
class Stats:
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0  # tokens of replies that did not say what they cost, at their request's estimate
    budget_refused: int = 0  # requests not sent because label.max_tokens_total was spent
    malformed_usage: int = 0  # replies whose token counts were not counts (charged at the estimate; their labels stand)
    missing_usage: int = 0  # replies with no token counts at all (charged at the estimate)
    labels_answered: int = 0  # latents whose label request got an answer (from the cache too)
    labels_failed: int = 0  # latents whose label request failed (not for the budget): their offline label is kept
    labels_cut: int = 0  # LLM labels longer than messages.MAX_LABEL_CHARS, cut to it (their label_reason says so)
    label_errors: dict[str, int] = field(default_factory=dict)  # why those failed -> how many

    @property
    def tokens(self) -> int:
        """What label.max_tokens_total is charged: the counts replies gave, and the estimates of those that gave none."""
        return self.prompt_tokens + self.completion_tokens + self.estimated_tokens


class RequestFailed(Exception):
    """A request that failed for good; its message becomes the feature's `label_reason`."""


class BudgetSpent(RequestFailed):
    """label.max_tokens_total is spent: no further request is sent (answers in the cache still count)."""


def cache_key(kind: str, model: str, messages: list[dict]) -> str:
    payload = {"kind": kind, "model": model, "prompt_version": PROMPT_VERSION, "messages": messages}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _reply_text(response: object) -> str:
    try:
        content = response.choices[0].message.content  # type: ignore[attr-defined]
    except (AttributeError, IndexError, TypeError):
        raise MalformedReply("response has no choices") from None
    if not isinstance(content, str):
        raise MalformedReply("response has no text content")
    return content


# A request's cost before its reply says it: its prompt at 3 UTF-8 bytes a token (English runs
# nearer 4, so this errs high), a few tokens a message, and room for the reply (a label or a
# judgement is a short JSON object).
_BYTES_PER_TOKEN = 3
_TOKENS_PER_MESSAGE = 4
_REPLY_TOKENS = 100


def estimate_tokens(messages: list[dict]) -> int:
    prompt = sum(len(str(m.get("content", "")).encode()) for m in messages)
    return -(-prompt // _BYTES_PER_TOKEN) + _TOKENS_PER_MESSAGE * len(messages) + _REPLY_TOKENS


def _token_counts(usage: object) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a reply's `usage`, None when they are not both counts: a
    server's bookkeeping is no reason to lose the answer it came with."""
    counts = []
    for name in ("prompt_tokens", "completion_tokens"):
        value = getattr(usage, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
        counts.append(value)
    return counts[0], counts[1]


def _read_cache(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["content"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None


def open_client(cfg: LabelConfig, api_key: str | None) -> openai.AsyncOpenAI:
    # max_retries=0: the client's own retries would hide 429/5xx from our policy and its counters.
    return openai.AsyncOpenAI(base_url=cfg.base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=cfg.timeout_s)


class Asker:
    """Sends chat requests under one concurrency limit, with our retry policy and the answer cache."""

    def __init__(self, client: openai.AsyncOpenAI, cfg: LabelConfig, cache_dir: Path, stats: Stats, rng: random.Random):
        self.client, self.cfg, self.cache_dir, self.stats, self.rng = client, cfg, cache_dir, stats, rng
        self._slots = asyncio.Semaphore(cfg.concurrency)
        self._budget = asyncio.Condition()
        self._reserved = 0  # the estimates of the requests in flight

    async def ask(self, kind: str, messages: list[dict], parse: Callable[[str], T]) -> T:
        path = self.cache_dir / f"{cache_key(kind, self.cfg.model, messages)}.json"
        cached = _read_cache(path)
        if cached is not None:
            try:
                value = parse(cached)
            except MalformedReply:
                pass  # written by another parser version: ask again
            else:
                self.stats.cache_hits += 1
                return value
        attempts = retrying(self.cfg, self.rng, on_retry=lambda state: self._before_retry(kind, state))
        try:
            async for attempt in attempts:
                with attempt:
                    content = await self._send(kind, messages)
                    value = parse(content)
        except REQUEST_ERRORS as err:
            failure = classify(err, self.cfg.timeout_s)
            if failure.action == "fatal":
                raise EndpointError(
                    f"{self.cfg.base_url}: {failure.description} for model '{self.cfg.model}'; check label.base_url, label.model and ${self.cfg.api_key_env}"
                ) from None
            self.stats.failures += 1
            tries = attempts.statistics["attempt_number"]
            raise RequestFailed(f"{kind} request failed after {tries} attempt(s): {failure.description}") from None
        atomic_write_json(path, {"kind": kind, "model": self.cfg.model, "prompt_version": PROMPT_VERSION, "content": content})
        return value

    def _before_retry(self, kind: str, state) -> None:
        """Count the retry, and say what is waited for: a stage that sleeps without a word looks hung."""
        self.stats.retries += 1
        failure = classify(state.outcome.exception(), self.cfg.timeout_s)
        wait, asked = state.upcoming_sleep, failure.retry_after_s
        capped = ""
        if asked is not None and asked > wait:
            capped = f" (the server's Retry-After asked for {asked:g} s; label.backoff_max_s={self.cfg.backoff_max_s:g} caps it)"
        log.log(
            logging.WARNING if wait >= 1 or capped else logging.INFO,
            "%s: %s request: %s; waiting %.1f s before attempt %d of %d%s",
            self.cfg.base_url,
            kind,
            failure.description,
            wait,
            state.attempt_number + 1,
            self.cfg.max_retries + 1,
            capped,
        )

    async def _reserve(self, kind: str, estimate: int) -> None:
        """Wait until this request fits the budget, counting the requests in flight at their
        estimate (with label.concurrency=4, a budget of 250 let 550 tokens go out), or refuse it:
        nothing is sent once the tokens spent and reserved reach label.max_tokens_total."""
        budget = self.cfg.max_tokens_total
        async with self._budget:
            while self.stats.tokens + self._reserved >= budget:
                if not self._reserved:
                    self.stats.budget_refused += 1
                    raise BudgetSpent(f"{kind} request not sent: token budget spent ({self.stats.tokens} of label.max_tokens_total={budget})")
                await self._budget.wait()  # those in flight may cost less than their estimate
            self._reserved += estimate

    async def _release(self, estimate: int) -> None:
        async with self._budget:
            self._reserved -= estimate
            self._budget.notify_all()

    async def _send(self, kind: str, messages: list[dict]) -> str:
        extra: dict = {}
        if self.cfg.json_mode:
            extra["response_format"] = {"type": "json_object"}
        if self.cfg.temperature is not None:
            extra["temperature"] = self.cfg.temperature
        budgeted = self.cfg.max_tokens_total is not None
        estimate = estimate_tokens(messages)
        async with self._slots:
            # Reserved with the slot held: requests waiting for a slot see the tokens of those before them.
            if budgeted:
                await self._reserve(kind, estimate)
            try:
                self.stats.requests += 1
                # The client's timeout bounds each read; this bounds the whole reply (one that drips a
                # byte a second never trips a read timeout).
                async with asyncio.timeout(self.cfg.timeout_s):
                    response = await self.client.chat.completions.create(model=self.cfg.model, messages=messages, **extra)
                self._charge(getattr(response, "usage", None), estimate)
            finally:
                if budgeted:
                    await self._release(estimate)
        return _reply_text(response)

    def _charge(self, usage: object, estimate: int) -> None:
        """Count a reply's tokens; one that does not say them is charged its request's estimate
        (replies without `usage` left label.max_tokens_total unenforced)."""
        counts = None if usage is None else _token_counts(usage)
        if counts is not None:
            self.stats.prompt_tokens += counts[0]
            self.stats.completion_tokens += counts[1]
            return
        self.stats.estimated_tokens += estimate
        if usage is None:
            if not self.stats.missing_usage:
                log.warning("%s: a reply has no usage (token counts); counted at its request's estimate (labels.json: estimated_tokens)", self.cfg.base_url)
            self.stats.missing_usage += 1
            return
        if not self.stats.malformed_usage:
            log.warning(
                "%s: a reply's usage is not token counts (%r); counted at its request's estimate (labels.json: malformed_usage, estimated_tokens)",
                self.cfg.base_url,
                usage,
            )
        self.stats.malformed_usage += 1
