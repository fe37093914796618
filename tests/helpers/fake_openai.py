"""A small OpenAI-compatible chat server for tests: real HTTP on 127.0.0.1, scripted replies.

The server runs an aiohttp app on its own event loop in a background thread, so the code under
test can use the real `openai` client with its own `asyncio.run`. A `responder(body, index)`
decides each reply (content, HTTP status, headers, delay); the server records every request,
when it arrived, and the most requests it ever had in flight at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from helpers.loopback_server import LoopbackServer


@dataclass
class Reply:
    content: str | None = None  # the assistant message (any text, so malformed answers are possible)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # sleep before answering (past the client's timeout to force one)
    prompt_tokens: int = 10
    completion_tokens: int = 5
    usage: dict | None = None  # sent as the reply's `usage` instead of the counts above (malformed ones too)
    omit_usage: bool = False  # a reply with no `usage` object at all
    drip_s: float = 0.0  # headers at once, then the body one byte every drip_s seconds (a reply that never ends)


Responder = Callable[[dict, int], Reply]


def user_text(body: dict) -> str:
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")


class FakeOpenAI(LoopbackServer):
    def __init__(self, responder: Responder):
        super().__init__()
        self.responder = responder
        self.requests: list[dict] = []
        self.authorizations: list[str | None] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        index = len(self.requests)
        self.requests.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        self.arrivals.append(time.monotonic())
        reply = self.responder(body, index)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(reply.delay_s)
        finally:
            self.in_flight -= 1
        if reply.status != 200:
            error = {"error": {"message": f"scripted {reply.status}", "type": "test", "code": reply.status}}
            return web.json_response(error, status=reply.status, headers=reply.headers)
        payload = {
            "id": f"chatcmpl-{index}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}],
            "usage": reply.usage
            if reply.usage is not None
            else {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
        if reply.omit_usage:
            del payload["usage"]
        if reply.drip_s:
            return await self._drip(request, json.dumps(payload).encode(), reply)
        return web.json_response(payload, headers=reply.headers)

    async def _drip(self, request: web.Request, body: bytes, reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": str(len(body)), **reply.headers})
        await response.prepare(request)
        self.in_flight += 1
        try:
            for i in range(len(body)):
                await response.write(body[i : i + 1])
                await asyncio.sleep(reply.drip_s)
        finally:
            self.in_flight -= 1
        await response.write_eof()
        return response

    def routes(self, app) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    @property
    def base_url(self) -> str:
        return self.root + "/v1"


def json_reply(obj: object, **kwargs) -> Reply:
    return Reply(content=json.dumps(obj), **kwargs)
