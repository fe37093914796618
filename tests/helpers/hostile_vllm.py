"""FakeVLLM servers that lie or die, for the hostile-input tests of remote scoring.

- `LyingVLLM`: answers every request with numbers or tokens that are not those of the prompt
  sent: another prompt of the same length, or every log-prob replaced by one value; it may name
  echoed tokens by id, as vLLM's `return_tokens_as_token_ids` does.
- `DyingVLLM`: answers as FakeVLLM until `die_after` requests, then fails every request the
  same way for good: a FakeVLLM fault ("503", "drop", "slow", "malformed") or "html", a 200 whose
  body is a proxy's HTML error page.
"""

from __future__ import annotations

from aiohttp import web

from helpers.fake_vllm import Backend, FakeVLLM

DEATHS = ["503", "drop", "slow", "malformed", "html"]
HTML_PAGE = "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1></body></html>"


class LyingVLLM(FakeVLLM):
    def __init__(self, backend: Backend, *, other_prompt: bool = False, logprob: float | None = None, ids_as_tokens: bool = False):
        super().__init__(backend)
        self.other_prompt, self.logprob, self.ids_as_tokens = other_prompt, logprob, ids_as_tokens

    def _answer(self, body: dict, fault: str | None) -> dict:
        if self.other_prompt:
            # The start token kept, every other token the next id: a prompt of the same length.
            first, *rest = body["prompt"]
            body = {**body, "prompt": [first, *(i + 1 for i in rest)]}
        answer = super()._answer(body, fault)
        choice = answer["choices"][0]
        if self.logprob is not None:
            self._replace_logprobs(choice)
        if self.ids_as_tokens and choice["logprobs"]:
            self._name_tokens_by_id(choice["logprobs"], body["prompt"])
        return answer

    @staticmethod
    def _name_tokens_by_id(logprobs: dict, prompt: list[int]) -> None:
        """As vLLM does it: each prompt token 'token_id:<id>', and text_offset tiling those strings."""
        tokens = [f"token_id:{i}" for i in prompt] + logprobs["tokens"][len(prompt) :]
        logprobs["tokens"], logprobs["text_offset"] = tokens, [sum(map(len, tokens[:j])) for j in range(len(tokens))]

    def _replace_logprobs(self, choice: dict) -> None:
        if choice["logprobs"]:
            choice["logprobs"]["token_logprobs"] = [None if v is None else self.logprob for v in choice["logprobs"]["token_logprobs"]]
        for entry in choice["prompt_logprobs"] or []:
            for scored in (entry or {}).values():
                scored["logprob"] = self.logprob


class DyingVLLM(FakeVLLM):
    def __init__(self, backend: Backend, death: str, die_after: int, **kwargs):
        super().__init__(backend, **kwargs)
        assert death in DEATHS, death
        self.death, self.die_after = death, die_after

    def _fault(self) -> str | None:
        # `requests` already holds this one.
        return self.death if len(self.requests) > self.die_after else super()._fault()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        if self.death == "html" and len(self.requests) >= self.die_after:
            self.requests.append(await request.json())
            return web.Response(text=HTML_PAGE, content_type="text/html")
        return await super()._completions(request)
