"""A vLLM-shaped completions server for tests: real HTTP on 127.0.0.1, numbers from the local scorer.

`POST /v1/completions` answers prompt scoring the way vLLM documents it: `prompt` is a string
or a list of token ids; with `echo` and `logprobs`, choices[0].logprobs holds `tokens` (each
id decoded on its own), `token_logprobs` (null first), `text_offset` (running sum of the token
strings' lengths) and `top_logprobs`; with `prompt_logprobs`, choices[0].prompt_logprobs is a
list of {token id: {logprob, rank, decoded_token}} (null first); `max_tokens` 1 appends one
greedy token. Log-probs come from HFScorer's own window code, so they equal the local path.

The server runs on its own event loop in a background thread. Faults are scripted per request
(`faults`, consumed in order, or `always`); it records each request, when it arrived, and the
most requests it had in flight at once.
"""

from __future__ import annotations

import asyncio
import time

import torch
from aiohttp import web

from bbox_sae.scoring.base import Window
from bbox_sae.scoring.hf import HFScorer, _Job
from helpers.loopback_server import LoopbackServer

FAULTS = {"429", "503", "400", "drop", "slow", "malformed", "drop_first", "wrong_id", "floor"}


class Backend:
    """A tiny model behind one or more replicas."""

    def __init__(self, model, tokenizer):
        self.tokenizer = tokenizer
        self.scorer = HFScorer("fake", model, tokenizer, batch_size=1)

    def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """log P(ids[i] | ids[:i]) for i >= 1, computed exactly as HFScorer computes one window."""
        with torch.inference_mode():
            return self.scorer._run_batch([_Job(0, ids, Window(0, len(ids), 1))])[0][0].tolist()

    def greedy(self, ids: list[int]) -> tuple[int, float]:
        with torch.inference_mode():
            hidden = self.scorer._body(input_ids=torch.tensor([ids])).last_hidden_state[0, -1:]
            token = int(self.scorer._head(hidden).argmax(-1)[0])
            return token, float(self.scorer._target_logprobs(hidden, torch.tensor([token]))[0][0])


class FakeVLLM(LoopbackServer):
    def __init__(self, backend: Backend, served_model: str = "tiny", api_key: str | None = None, delay_s: float = 0.0):
        super().__init__()
        self.backend = backend
        self.served_model = served_model
        self.api_key = api_key
        self.delay_s = delay_s
        self.slow_s = 5.0
        self.retry_after = "1"
        self.faults: list[str] = []
        self.always: str | None = None
        self.requests: list[dict] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0

    def _fault(self) -> str | None:
        if self.always:
            return self.always
        return self.faults.pop(0) if self.faults else None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.arrivals.append(time.monotonic())
        fault = self._fault()
        assert fault is None or fault in FAULTS, fault
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.slow_s if fault == "slow" else self.delay_s)
            if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": {"message": "invalid api key"}}, status=401)
            if body.get("model") != self.served_model:
                return web.json_response({"error": {"message": f"The model `{body.get('model')}` does not exist."}}, status=404)
            if fault == "429":
                return web.json_response({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": self.retry_after})
            if fault == "503":
                return web.json_response({"error": {"message": "overloaded"}}, status=503)
            if fault == "400":
                return web.json_response({"error": {"message": "Only no echo is supported"}}, status=400)
            if fault == "drop":
                request.transport.close()
                return web.Response()
            if fault == "malformed":
                return web.Response(text='{"choices": [{"text": "trunc', content_type="application/json")
            return web.json_response(self._answer(body, fault))
        finally:
            self.in_flight -= 1

    def _answer(self, body: dict, fault: str | None) -> dict:
        tok = self.backend.tokenizer
        prompt = body["prompt"]
        if isinstance(prompt, str):
            ids = tok(prompt, add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
        else:
            ids = list(prompt)
        lps: list[float | None] = [None, *self.backend.prompt_logprobs(ids)]
        if fault == "floor":
            # vLLM's stand-in for -inf
            lps = [None] + [-9999.0] * (len(ids) - 1)
        generated = [self.backend.greedy(ids)] if body.get("max_tokens", 16) else []
        gen_ids = [g for g, _ in generated]
        choice: dict = {"index": 0, "finish_reason": "length", "logprobs": None, "prompt_logprobs": None}
        echo = bool(body.get("echo"))
        shown_ids = ids + gen_ids if echo else gen_ids
        shown_lps = lps + [lp for _, lp in generated] if echo else [lp for _, lp in generated]
        choice["text"] = (tok.decode(ids) if echo else "") + tok.decode(gen_ids)
        if body.get("logprobs") is not None:
            strings = [tok.decode([i]) for i in shown_ids]
            if fault == "drop_first":
                strings, shown_lps = strings[1:], shown_lps[1:]
            offsets, at = [], 0
            for s in strings:
                offsets.append(at)
                at += len(s)
            choice["logprobs"] = {
                "tokens": strings,
                "token_logprobs": shown_lps,
                "text_offset": offsets,
                "top_logprobs": [None if lp is None else {s: lp} for s, lp in zip(strings, shown_lps)],
            }
        if body.get("prompt_logprobs") is not None:
            keyed = [i + 1 if fault == "wrong_id" else i for i in ids]
            choice["prompt_logprobs"] = [None] + [
                {str(k): {"logprob": lp, "rank": None, "decoded_token": tok.decode([i])}} for i, k, lp in zip(ids[1:], keyed[1:], lps[1:])
            ]
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(gen_ids), "total_tokens": len(ids) + len(gen_ids)}
        return {"id": f"cmpl-{len(self.requests)}", "object": "text_completion", "created": 0, "model": self.served_model, "choices": [choice], "usage": usage}

    def routes(self, app) -> None:
        app.router.add_post("/v1/completions", self._completions)

    @property
    def url(self) -> str:
        return self.root + ""
