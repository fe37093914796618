"""Remote scorer: OpenAI-compatible completions endpoints that echo prompt log-probs (vLLM).

Windows are planned with the local tokenizer exactly as HFScorer plans them, so a document
gets the same tokens, start token and sliding windows as on the local path. Each window is
sent through the `openai` client's `completions.create` as its token ids (`prompt_format:
tokens`, which vLLM accepts) or as its text (`text`, for servers that only take strings), with
`echo` and `max_tokens` 0 so the server scores the prompt and generates nothing; with
`prompt_logprobs` vLLM's extension (passed in `extra_body`) is read instead.

A server answer is used only when it provably scored the tokens we sent (`replies`) and its
log-probs are <= 0 (`base.LOGPROB_RULE`); anything else raises EndpointError naming the document
and window: wrong numbers are never returned.
(llama-cpp-python's server fails these checks: see tests/test_llamacpp.py.) Which replica
takes a request is `replicas`' call, which failures are retried `bbox_sae.retry`'s, the policy
labeling uses too; `async_bridge` runs the requests for the synchronous score stage.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Iterable, Iterator

import numpy as np
import openai

from bbox_sae.config import Config, ModelConfig
from bbox_sae.errors import ConfigError, EndpointError
from bbox_sae.retry import REQUEST_ERRORS, MalformedReply, classify, retrying
from bbox_sae.scoring.async_bridge import gather_or_cancel, results_in_order
from bbox_sae.scoring.base import LOGPROB_RULE, TokenScores, Window, largest_positive, plan_windows
from bbox_sae.scoring.hf import start_token_id, tokenize_with_offsets
from bbox_sae.scoring.replicas import Replica, Replicas
from bbox_sae.scoring.replies import Misaligned, check_text, check_tokens, echo_entries, prompt_logprob_entries

log = logging.getLogger(__name__)

# vLLM clamps -inf log-probs to this so they survive JSON; we undo it.
VLLM_LOGPROB_FLOOR = -9999.0


class EndpointScorer:
    """Scores documents on one or more replicas of a completions endpoint, as `model` (a
    `source: endpoint` model of the config) says.

    `retries` counts re-sent requests (after 429/5xx, timeouts, dropped connections or
    malformed JSON); `failures` counts requests given up on or answers rejected (each raises
    EndpointError).
    """

    def __init__(self, model: ModelConfig, tokenizer, *, api_key: str | None = None, seed: int | None = None):
        if not model.endpoints:
            raise ConfigError(f"model '{model.name}': no endpoints")
        self.cfg = model
        self.name = model.name
        self.tokenizer = tokenizer
        # Whole documents are tokenized before windowing; the length warning would be noise.
        tokenizer.model_max_length = 10**12
        self.start_id = start_token_id(tokenizer, model.start_token)
        self.start_text = tokenizer.decode([self.start_id])
        self._decoded: dict[int, str] = {}
        self.api_key = api_key
        self.rng = random.Random(seed)
        self.retries = 0
        self.failures = 0
        self.replicas = Replicas(model.endpoints, model.concurrency, model.backoff_base_s, model.backoff_max_s)

    @classmethod
    def from_config(cls, model_cfg: ModelConfig, cfg: Config) -> EndpointScorer:
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
        return cls(model_cfg, tokenizer, api_key=api_key, seed=cfg.seed)

    def score(self, documents: Iterable[tuple[str, str]]) -> Iterator[TokenScores]:
        """Every window of every document is in flight at once (within the concurrency limits);
        results are yielded in document order, and the first failure anywhere is raised at once."""
        self.replicas.open(self.api_key, self.cfg.timeout_s)
        yield from results_in_order((self._score_doc(doc_id, text) for doc_id, text in documents), close=self.replicas.close)

    # -- documents and windows ------------------------------------------------------------------

    async def _score_doc(self, doc_id: str, text: str) -> TokenScores:
        ids, offsets = tokenize_with_offsets(self.tokenizer, text)
        input_ids = [self.start_id, *ids.tolist()]
        windows = plan_windows(len(ids), self.cfg.window, self.cfg.stride)
        # One window given up on fails the document: its other windows are cancelled, not left running.
        parts = await gather_or_cancel(self._score_window(doc_id, text, input_ids, offsets, w) for w in windows)
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
        if self.cfg.prompt_logprobs:
            extra["prompt_logprobs"] = 0  # vLLM's extension, outside the OpenAI schema
        if self.cfg.prompt_format == "text":
            # vLLM would otherwise prepend BOS to a text prompt; we send the start token ourselves.
            extra["add_special_tokens"] = False
        return {
            "model": self.cfg.served_model or self.name,
            "prompt": prompt,
            "echo": True,
            "max_tokens": self.cfg.max_tokens,
            "temperature": 0.0,
            "logprobs": openai.omit if self.cfg.prompt_logprobs else 1,
            "extra_body": extra or None,
        }

    async def _score_window(self, doc_id: str, text: str, input_ids: list[int], offsets: np.ndarray, w: Window) -> np.ndarray:
        sent = input_ids[w.begin : w.end]
        prompt, c0 = self._prompt(doc_id, text, offsets, sent, w)
        choice = await self._post(doc_id, self._request(prompt))
        where = f"model '{self.name}': document '{doc_id}', tokens {w.begin}-{w.end - 1}"
        try:
            out = self._target_logprobs(choice, sent, text, c0, offsets, w)
        except Misaligned as err:
            self.failures += 1
            raise EndpointError(f"{where}: the server's answer cannot be aligned with the local tokenizer: {err}") from None
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as err:
            self.failures += 1
            raise EndpointError(f"{where}: unexpected response shape ({type(err).__name__}: {err})") from None
        at = largest_positive(out)
        if at is not None:
            self.failures += 1
            raise EndpointError(
                f"{where}: log-prob {out[at]:.4g} > 0 at token position {w.first_target + at}; {LOGPROB_RULE}, so the server's numbers cannot be used"
            )
        return out

    def _prompt(self, doc_id: str, text: str, offsets: np.ndarray, sent: list[int], w: Window) -> tuple[str | list[int], int]:
        """What is sent for the window: its token ids, or its text and where that starts in the document."""
        if self.cfg.prompt_format != "text":
            return sent, 0
        first = max(w.begin, 1) - 1
        if first and offsets[first, 0] < offsets[first - 1, 1]:
            raise EndpointError(
                f"model '{self.name}': document '{doc_id}': window at token {w.begin} starts inside a character, "
                "which a text prompt cannot express; use prompt_format: tokens"
            )
        return self._window_text(text, offsets, w)

    def _target_logprobs(self, choice, sent: list[int], text: str, c0: int, offsets: np.ndarray, w: Window) -> np.ndarray:
        """The log-probs of the window's targets, from an answer that provably scored `sent`; Misaligned if it did not."""
        if self.cfg.prompt_logprobs:
            lps = prompt_logprob_entries(choice, sent)
        else:
            tokens, lps = echo_entries(choice, len(sent), self.cfg.max_tokens)
            if self.cfg.prompt_format == "text":
                doc_first = 1 if w.begin == 0 else 0
                check_text(tokens[doc_first:], text, c0, offsets[max(w.begin, 1) - 1 : w.end - 1, 1])
            else:
                check_tokens(tokens, sent, self._token_strings(sent))
        targets = lps[w.first_target - w.begin :]
        missing = [w.first_target + i for i, v in enumerate(targets) if v is None]
        if missing:
            raise Misaligned(f"no log-prob for token position(s) {missing[:5]}")
        out = np.asarray(targets, dtype=np.float64)
        out[out <= VLLM_LOGPROB_FLOOR] = -np.inf
        return out

    def _token_strings(self, ids: list[int]) -> list[str]:
        """Each token id decoded on its own (cached: a vocabulary's worth at most)."""
        new = list({i for i in ids if i not in self._decoded})
        self._decoded.update(zip(new, self.tokenizer.batch_decode([[i] for i in new])))
        return [self._decoded[i] for i in ids]

    # -- requests: one attempt per replica, retried as bbox_sae.retry says ------------------------

    async def _post(self, doc_id: str, request: dict):
        replica: Replica | None = None

        def on_retry(state) -> None:
            self.retries += 1
            failure = classify(state.outcome.exception(), self.cfg.timeout_s)
            log.info("model '%s': document '%s': %s: %s; retrying in %.2f s", self.name, doc_id, replica.url, failure.description, state.upcoming_sleep)

        attempts = retrying(self.cfg, self.rng, on_retry)
        try:
            async for attempt in attempts:
                with attempt:
                    # Away from the replica that just failed this request, if another has a slot.
                    replica = await self.replicas.acquire(avoid=replica)
                    return await self._attempt(replica, doc_id, request)
        except REQUEST_ERRORS as err:
            self.failures += 1
            raise EndpointError(
                f"model '{self.name}': document '{doc_id}': gave up after {attempts.statistics['attempt_number']} attempt(s); "
                f"last error from {replica.url}: {classify(err, self.cfg.timeout_s).description}"
            ) from None

    async def _attempt(self, replica: Replica, doc_id: str, request: dict):
        """One request to one replica; the first choice of its answer. A transient failure is
        raised as it is (to be retried) and rests the replica; any other is an EndpointError."""
        assert replica.client is not None
        ok = None
        try:
            # The client's timeout bounds each read; this bounds the whole answer.
            async with asyncio.timeout(self.cfg.timeout_s):
                response = await replica.client.completions.create(**request)
            choices = getattr(response, "choices", None)
            if not isinstance(choices, list) or not choices:
                raise MalformedReply(f"malformed response (no choices): {str(response)[:200]}")
            ok = True
            return choices[0]
        except REQUEST_ERRORS as err:
            failure = classify(err, self.cfg.timeout_s)
            if failure.action != "retry":
                self.failures += 1
                raise EndpointError(f"model '{self.name}': document '{doc_id}': {replica.url} refused the request: {failure.description}") from None
            ok = False
            raise
        finally:
            self.replicas.release(replica, ok)
