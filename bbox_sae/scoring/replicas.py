"""The replicas of one completions endpoint: which one takes the next request.

Requests go to the least busy replica with a free slot (at most `concurrency` in flight each),
round-robin on ties; a replica that failed transiently rests, longer after each failure in a
row, while any other is up. A request sent again goes before those not sent yet, so that a
server failing every request is given up on after one request's retries, not after every
request of the shard has had its first try.

No asyncio lock or condition: the event loop runs one task at a time, so choosing a replica and
counting its slot happen without a suspension in between, and giving a slot back never awaits.
A request cancelled while it gives its slot back (its document failed, the run was stopped)
would otherwise leave the slot taken for good, and the requests waiting for one would never end.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import openai


def api_base(endpoint: str) -> str:
    """The client's base URL for an endpoint given as the server root, `.../v1` or the full
    `.../v1/completions` URL (the client appends `/completions` itself)."""
    base = endpoint.rstrip("/")
    if base.endswith("/completions"):
        return base.removesuffix("/completions")
    return base if base.endswith("/v1") else base + "/v1"


@dataclass
class Replica:
    base_url: str
    client: openai.AsyncOpenAI | None = None  # one per `Replicas.open`: its connections belong to one event loop
    in_flight: int = 0
    failures_in_row: int = 0
    down_until: float = 0.0  # event-loop time

    @property
    def url(self) -> str:
        return self.base_url + "/completions"


class Replicas:
    def __init__(self, endpoints: list[str], concurrency: int, backoff_base_s: float, backoff_max_s: float):
        self.replicas = [Replica(api_base(u)) for u in endpoints]
        self.concurrency = concurrency
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self._next = 0
        self._waiting: deque[asyncio.Future] = deque()  # requests waiting for a slot, woken one per freed slot, retries first

    def open(self, api_key: str | None, timeout_s: float) -> None:
        """Fresh clients and counts, for one event loop."""
        self._waiting.clear()
        for r in self.replicas:
            r.in_flight, r.failures_in_row, r.down_until = 0, 0, 0.0
            # An explicit key (never the client's OPENAI_API_KEY fallback, which would send a
            # user's OpenAI key to this server); max_retries=0: retries are ours, per replica.
            r.client = openai.AsyncOpenAI(base_url=r.base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=timeout_s)

    async def close(self) -> None:
        clients = [r.client for r in self.replicas if r.client is not None]
        for r in self.replicas:
            r.client = None
        await asyncio.gather(*(c.close() for c in clients))

    async def acquire(self, avoid: Replica | None) -> Replica:
        """The least busy replica with a free slot, skipping replicas resting after a failure
        while any other is up; ties go round-robin, away from `avoid` (the replica that just
        failed this request)."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            chosen = self._least_busy(now, avoid)
            if chosen is not None:
                chosen.in_flight += 1
                return chosen
            resting = [r.down_until - now for r in self.replicas if r.down_until > now]
            woken = loop.create_future()
            (self._waiting.append if avoid is None else self._waiting.appendleft)(woken)
            try:
                # Wake when a slot frees or a resting replica is back. asyncio.wait, not wait_for:
                # on Python 3.11 wait_for can swallow a cancellation that meets a wake-up.
                await asyncio.wait([woken], timeout=min(resting) if resting else None)
            except asyncio.CancelledError:
                if woken.done():
                    self._wake_one()  # the slot this request was woken for goes to the next
                raise
            finally:
                woken.cancel()

    def _least_busy(self, now: float, avoid: Replica | None) -> Replica | None:
        pool = [r for r in self.replicas if r.down_until <= now] or self.replicas
        free = [r for r in pool if r.in_flight < self.concurrency]
        if not free:
            return None
        n = len(self.replicas)
        rank = {id(r): (r is avoid, r.in_flight, (i - self._next) % n) for i, r in enumerate(self.replicas)}
        chosen = min(free, key=lambda r: rank[id(r)])
        self._next = (self.replicas.index(chosen) + 1) % n
        return chosen

    def release(self, replica: Replica, ok: bool | None) -> None:
        """`ok` False (a transient failure) rests the replica, longer after each failure in a row;
        None (the request was refused, or cancelled) leaves its record as it was."""
        replica.in_flight -= 1
        if ok:
            replica.failures_in_row, replica.down_until = 0, 0.0
        elif ok is False:
            replica.failures_in_row += 1
            rest = min(self.backoff_max_s, self.backoff_base_s * 2 ** (replica.failures_in_row - 1))
            replica.down_until = asyncio.get_running_loop().time() + rest
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            woken = self._waiting.popleft()
            if not woken.done():  # one that timed out or was cancelled is skipped
                woken.set_result(None)
                return
