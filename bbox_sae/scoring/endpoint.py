"""Remote scorer: OpenAI-compatible completions endpoints that echo prompt log-probs (vLLM).

Windows are planned with the local tokenizer exactly as HFScorer plans them, so a document
gets the same tokens, start token and sliding windows as on the local path. Each window is
sent through the `openai` client's `completions.create` as its token ids (`prompt_format:
tokens`, which vLLM accepts) or as its text (`text`, for servers that only take strings), with
`echo` and `max_tokens` 0 so the server scores the prompt and generates nothing; with
`prompt_logprobs` vLLM's extension (passed in `extra_body`) is read instead. Which failures are
retried is decided by `bbox_sae.retry`, the policy labeling uses too.

A server answer is used only when it provably scored the tokens we sent:
- echo: one entry per prompt token plus exactly `max_tokens` generated ones, the first entry
  without a log-prob, and `text_offset` tiling the echoed token strings; in text mode the
  echoed strings must also spell the window's text with our token boundaries;
- prompt_logprobs: one entry per prompt token, each naming the very token id we planned.
Anything else raises EndpointError naming the document: wrong numbers are never returned.
(llama-cpp-python's server fails these checks: see tests/test_llamacpp.py.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import openai

from bbox_sae.errors import ConfigError, EndpointError
from bbox_sae.retry import REQUEST_ERRORS, MalformedReply, backoff_delay, classify
from bbox_sae.scoring.base import TokenScores, Window, plan_windows
from bbox_sae.scoring.hf import start_token_id, tokenize_with_offsets

log = logging.getLogger(__name__)

# vLLM clamps -inf log-probs to this so they survive JSON; we undo it.
VLLM_LOGPROB_FLOOR = -9999.0


def api_base(endpoint: str) -> str:
    """The client's base URL for an endpoint given as the server root, `.../v1` or the full
    `.../v1/completions` URL (the client appends `/completions` itself)."""
    base = endpoint.rstrip("/")
    if base.endswith("/completions"):
        return base.removesuffix("/completions")
    return base if base.endswith("/v1") else base + "/v1"


@dataclass
class _Replica:
    base_url: str
    client: openai.AsyncOpenAI | None = None  # one per `score` call: its connections belong to that call's event loop
    in_flight: int = 0
    failures_in_row: int = 0
    down_until: float = 0.0  # event-loop time

    @property
    def url(self) -> str:
        return self.base_url + "/completions"


class EndpointScorer:
    """Scores documents on one or more replicas of a completions endpoint.

    `retries` counts re-sent requests (after 429/5xx, timeouts, dropped connections or
    malformed JSON); `failures` counts requests given up on or answers rejected (each raises
    EndpointError).
    """

    def __init__(
        self,
        name: str,
        endpoints: list[str],
        tokenizer,
        *,
        served_model: str | None = None,
        start_token: str | None = None,
        window: int = 1024,
        stride: int = 512,
        api_key: str | None = None,
        concurrency: int = 4,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 60.0,
        prompt_logprobs: bool = False,
        prompt_format: str = "tokens",
        max_tokens: int = 0,
        seed: int | None = None,
    ):
        if not endpoints:
            raise ConfigError(f"model '{name}': no endpoints")
        if prompt_format not in ("tokens", "text"):
            raise ConfigError(f"model '{name}': prompt_format must be 'tokens' or 'text', got '{prompt_format}'")
        if not 1 <= stride < window:
            raise ConfigError(f"model '{name}': need 1 <= stride < window, got stride={stride}, window={window}")
        self.name = name
        self.tokenizer = tokenizer
        # Whole documents are tokenized before windowing; the length warning would be noise.
        tokenizer.model_max_length = 10**12
        self.start_id = start_token_id(tokenizer, start_token)
        self.start_text = tokenizer.decode([self.start_id])
        self.served_model = served_model or name
        self.window = window
        self.stride = stride
        self.api_key = api_key
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.prompt_logprobs = prompt_logprobs
        self.prompt_format = prompt_format
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self.retries = 0
        self.failures = 0
        self.replicas = [_Replica(api_base(u)) for u in endpoints]
        self._next = 0
        self._slots: asyncio.Condition | None = None

    @classmethod
    def from_config(cls, model_cfg, cfg) -> "EndpointScorer":
        from transformers import AutoTokenizer

        api_key = None
        if model_cfg.api_key_env:
            api_key = os.environ.get(model_cfg.api_key_env)
            if not api_key:
                raise ConfigError(f"model '{model_cfg.name}': environment variable {model_cfg.api_key_env} (api_key_env) is not set")
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer)
        except OSError as err:
            raise ConfigError(f"model '{model_cfg.name}': cannot load tokenizer '{model_cfg.tokenizer}': {str(err).splitlines()[0]}") from None
        return cls(
            model_cfg.name,
            model_cfg.endpoints,
            tokenizer,
            served_model=model_cfg.served_model,
            start_token=model_cfg.start_token,
            window=model_cfg.window,
            stride=model_cfg.stride,
            api_key=api_key,
            concurrency=model_cfg.concurrency,
            timeout_s=model_cfg.timeout_s,
            max_retries=model_cfg.max_retries,
            backoff_base_s=model_cfg.backoff_base_s,
            backoff_max_s=model_cfg.backoff_max_s,
            prompt_logprobs=model_cfg.prompt_logprobs,
            prompt_format=model_cfg.prompt_format,
            max_tokens=model_cfg.max_tokens,
            seed=cfg.seed,
        )

    # -- the sync interface the score stage uses ------------------------------------------------

    def score(self, documents: Iterable[tuple[str, str]]) -> Iterator[TokenScores]:
        """Every window of every document is in flight at once (within the concurrency limits);
        results are yielded in document order, and the first failure anywhere is raised at once."""
        docs = list(documents)
        loop = asyncio.new_event_loop()
        tasks: list[asyncio.Task] = []
        failed = loop.create_future()

        def note_failure(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None and not failed.done():
                failed.set_exception(task.exception())

        try:
            self._slots = asyncio.Condition()
            for r in self.replicas:
                r.in_flight, r.failures_in_row, r.down_until = 0, 0, 0.0
                # An explicit key (never the client's OPENAI_API_KEY fallback, which would send a
                # user's OpenAI key to this server); max_retries=0: retries are ours, per replica.
                r.client = openai.AsyncOpenAI(
                    base_url=r.base_url, api_key=self.api_key or "EMPTY", max_retries=0, timeout=self.timeout_s
                )
            for doc_id, text in docs:
                task = loop.create_task(self._score_doc(doc_id, text))
                task.add_done_callback(note_failure)
                tasks.append(task)
            for task in tasks:
                loop.run_until_complete(asyncio.wait([task, failed], return_when=asyncio.FIRST_COMPLETED))
                if failed.done():
                    failed.result()
                yield task.result()
        finally:
            for task in tasks:
                task.cancel()
            if not failed.done():
                failed.cancel()
            elif not failed.cancelled():
                failed.exception()  # retrieved, so asyncio does not warn when we stopped early
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(self._close_clients())
            loop.close()

    async def _close_clients(self) -> None:
        clients = [r.client for r in self.replicas if r.client is not None]
        for r in self.replicas:
            r.client = None
        await asyncio.gather(*(c.close() for c in clients))

    # -- documents and windows ------------------------------------------------------------------

    async def _score_doc(self, doc_id: str, text: str) -> TokenScores:
        ids, offsets = tokenize_with_offsets(self.tokenizer, text)
        input_ids = [self.start_id, *ids.tolist()]
        windows = plan_windows(len(ids), self.window, self.stride)
        parts = await asyncio.gather(*(self._score_window(doc_id, text, input_ids, offsets, w) for w in windows))
        lp = np.concatenate(parts) if parts else np.zeros(0)
        if len(lp) != len(ids):
            raise EndpointError(f"model '{self.name}': document '{doc_id}': scored {len(lp)} of {len(ids)} tokens")
        return TokenScores(doc_id, offsets, lp, ids)

    def _window_text(self, text: str, offsets: np.ndarray, w: Window) -> tuple[str, int]:
        """The window's prompt string and where its document part starts in the document."""
        first, last = max(w.begin, 1) - 1, w.end - 2
        c0, c1 = int(offsets[first, 0]), int(offsets[first : last + 1, 1].max())
        prefix = self.start_text if w.begin == 0 else ""
        return prefix + text[c0:c1], c0

    def _request(self, prompt: str | list[int]) -> dict:
        """Arguments of `completions.create`: echo the prompt, generate `max_tokens` (0 or 1)."""
        extra: dict = {}
        if self.prompt_logprobs:
            extra["prompt_logprobs"] = 0  # vLLM's extension, outside the OpenAI schema
        if self.prompt_format == "text":
            # vLLM would otherwise prepend BOS to a text prompt; we send the start token ourselves.
            extra["add_special_tokens"] = False
        return {
            "model": self.served_model,
            "prompt": prompt,
            "echo": True,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "logprobs": openai.omit if self.prompt_logprobs else 1,
            "extra_body": extra or None,
        }

    async def _score_window(self, doc_id: str, text: str, input_ids: list[int], offsets: np.ndarray, w: Window) -> np.ndarray:
        sent = input_ids[w.begin : w.end]
        if self.prompt_format == "text":
            first = max(w.begin, 1) - 1
            if first and offsets[first, 0] < offsets[first - 1, 1]:
                raise EndpointError(
                    f"model '{self.name}': document '{doc_id}': window at token {w.begin} starts inside a character, "
                    "which a text prompt cannot express; use prompt_format: tokens"
                )
            prompt, c0 = self._window_text(text, offsets, w)
        else:
            prompt = sent
        choice = await self._post(doc_id, self._request(prompt))
        where = f"model '{self.name}': document '{doc_id}', tokens {w.begin}-{w.end - 1}"
        try:
            if self.prompt_logprobs:
                lps = _prompt_logprob_entries(choice, sent)
            else:
                tokens, lps = _echo_entries(choice, len(sent), self.max_tokens)
                if self.prompt_format == "text":
                    doc_first = 1 if w.begin == 0 else 0
                    _check_text(tokens[doc_first:], text, c0, offsets[max(w.begin, 1) - 1 : w.end - 1, 1])
            targets = lps[w.first_target - w.begin :]
            missing = [w.first_target + i for i, v in enumerate(targets) if v is None]
            if missing:
                raise _Misaligned(f"no log-prob for token position(s) {missing[:5]}")
        except _Misaligned as err:
            self.failures += 1
            raise EndpointError(f"{where}: the server's answer cannot be aligned with the local tokenizer: {err}") from None
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as err:
            self.failures += 1
            raise EndpointError(f"{where}: unexpected response shape ({type(err).__name__}: {err})") from None
        out = np.asarray(targets, dtype=np.float64)
        out[out <= VLLM_LOGPROB_FLOOR] = -np.inf
        return out

    # -- requests: replicas, concurrency, retries -----------------------------------------------

    async def _acquire(self, avoid: _Replica | None) -> _Replica:
        """The least busy replica with a free slot, skipping replicas resting after a failure
        while any other is up; ties go round-robin, away from `avoid` (the replica that just
        failed this request)."""
        assert self._slots is not None
        async with self._slots:
            while True:
                now = asyncio.get_running_loop().time()
                pool = [r for r in self.replicas if r.down_until <= now] or self.replicas
                free = [r for r in pool if r.in_flight < self.concurrency]
                if free:
                    n = len(self.replicas)
                    rank = {id(r): (r is avoid, r.in_flight, (i - self._next) % n) for i, r in enumerate(self.replicas)}
                    chosen = min(free, key=lambda r: rank[id(r)])
                    self._next = (self.replicas.index(chosen) + 1) % n
                    chosen.in_flight += 1
                    return chosen
                resting = [r.down_until - now for r in self.replicas if r.down_until > now]
                try:
                    # wake when a slot frees or a resting replica is back
                    await asyncio.wait_for(self._slots.wait(), timeout=min(resting) if resting else None)
                except TimeoutError:
                    pass

    async def _release(self, replica: _Replica, ok: bool | None) -> None:
        """`ok` False (a transient failure) rests the replica, longer after each failure in a row."""
        assert self._slots is not None
        async with self._slots:
            replica.in_flight -= 1
            if ok:
                replica.failures_in_row, replica.down_until = 0, 0.0
            elif ok is False:
                replica.failures_in_row += 1
                rest = min(self.backoff_max_s, self.backoff_base_s * 2 ** (replica.failures_in_row - 1))
                replica.down_until = asyncio.get_running_loop().time() + rest
            self._slots.notify()

    async def _attempt(self, replica: _Replica, request: dict):
        """One request to one replica; the first choice of its answer."""
        assert replica.client is not None
        # The client's timeout bounds each read; this bounds the whole answer.
        async with asyncio.timeout(self.timeout_s):
            response = await replica.client.completions.create(**request)
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:
            raise MalformedReply(f"malformed response (no choices): {str(response)[:200]}")
        return choices[0]

    async def _post(self, doc_id: str, request: dict):
        replica = None
        for attempt in range(self.max_retries + 1):
            replica = await self._acquire(avoid=replica)
            ok = None
            try:
                choice = await self._attempt(replica, request)
                ok = True
                return choice
            except REQUEST_ERRORS as err:
                failure = classify(err, self.timeout_s)
                if failure.action != "retry":
                    self.failures += 1
                    raise EndpointError(
                        f"model '{self.name}': document '{doc_id}': {replica.url} refused the request: {failure.description}"
                    ) from None
                ok, last = False, failure.description
            finally:
                await self._release(replica, ok)
            if attempt == self.max_retries:
                break
            self.retries += 1
            wait = backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s, self.rng.random(), failure.retry_after_s)
            log.info("model '%s': document '%s': %s: %s; retrying in %.2f s", self.name, doc_id, replica.url, last, wait)
            await asyncio.sleep(wait)
        self.failures += 1
        raise EndpointError(
            f"model '{self.name}': document '{doc_id}': gave up after {self.max_retries + 1} attempt(s); "
            f"last error from {replica.url}: {last}"
        )


class _Misaligned(Exception):
    pass


def _echo_entries(choice, n_sent: int, max_tokens: int) -> tuple[list[str], list[float | None]]:
    """Token strings and log-probs of the prompt positions of an `echo` answer."""
    lp = choice.logprobs
    if lp is None:
        raise _Misaligned("no `logprobs` in the answer (does the server support echo with logprobs?)")
    tokens, logprobs, offsets = lp.tokens, lp.token_logprobs, lp.text_offset
    if not len(tokens) == len(logprobs) == len(offsets):
        raise _Misaligned(f"{len(tokens)} tokens, {len(logprobs)} token_logprobs and {len(offsets)} text_offsets")
    if len(tokens) != n_sent + max_tokens:
        raise _Misaligned(
            f"{len(tokens)} echoed entries for a prompt of {n_sent} tokens with max_tokens={max_tokens} "
            f"(expected {n_sent + max_tokens}): the server tokenized differently or does not echo every prompt token"
        )
    if logprobs[0] is not None:
        raise _Misaligned("the first echoed token has a log-prob, so it is not the first token sent")
    for j in range(n_sent - 1):
        if offsets[j + 1] != offsets[j] + len(tokens[j]):
            raise _Misaligned(f"text_offset does not tile the echoed tokens at entry {j} ({offsets[j]} + {len(tokens[j])} != {offsets[j + 1]})")
    return tokens[:n_sent], logprobs[:n_sent]


def _prompt_logprob_entries(choice, sent: list[int]) -> list[float | None]:
    """vLLM's prompt_logprobs (a field the client keeps as parsed JSON): one entry per prompt
    token, a dict keyed by token id."""
    entries = getattr(choice, "prompt_logprobs", None)
    if not isinstance(entries, list):
        raise _Misaligned("no `prompt_logprobs` in the answer (is the server vLLM?)")
    if len(entries) != len(sent):
        raise _Misaligned(f"{len(entries)} prompt_logprobs entries for a prompt of {len(sent)} tokens")
    if entries[0] is not None:
        raise _Misaligned("the first prompt token has a log-prob, so it is not the first token sent")
    out: list[float | None] = [None]
    for j in range(1, len(sent)):
        entry = (entries[j] or {}).get(str(sent[j]))
        if entry is None:
            raise _Misaligned(f"prompt token {j} is not token id {sent[j]} (got ids {sorted(entries[j] or {})[:5]})")
        out.append(entry["logprob"] if isinstance(entry, dict) else entry)
    return out


def _check_text(tokens: list[str], text: str, c0: int, ends: np.ndarray) -> None:
    """Text prompts are tokenized by the server: its echoed tokens must spell the window's text
    with our token boundaries. Tokens sharing an end (the byte pieces of one character) are
    compared as a group; a group the server could not render (empty, or with U+FFFD, as byte
    pieces decoded one by one come out) is taken on trust, since the token count matched."""
    at = c0
    j = 0
    while j < len(tokens):
        k = j + 1
        while k < len(tokens) and ends[k] == ends[j]:
            k += 1
        got, want = "".join(tokens[j:k]), text[at : ends[j]]
        if got != want and got and "\ufffd" not in got:
            raise _Misaligned(f"token {j} is {got!r} on the server but {want!r} locally (characters {at}-{int(ends[j])})")
        at, j = int(ends[j]), k
