"""An aiohttp server on 127.0.0.1 (ephemeral port) in a background thread, for protocol tests."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class LoopbackServer:
    """Subclasses add their routes in `routes()`; `with Server(...) as srv:` serves at `srv.root`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.root = ""

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def _start(self) -> str:
        app = web.Application()
        self.routes(app)
        # handler_cancellation: a request the client gave up on (timeout) stops sleeping and
        # leaves the in-flight count, so shutdown does not wait for it.
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def __enter__(self):
        self._thread.start()
        self.root = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
