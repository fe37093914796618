"""The score stage is synchronous; remote scoring is many requests in flight at once. This runs
them on a private event loop and hands their results back one by one, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def results_in_order(jobs: Iterable[Coroutine[object, object, T]], close: Callable[[], Awaitable[None]]) -> Iterator[T]:
    """Every job is in flight at once; results are yielded in the jobs' order, and the first
    failure anywhere is raised at once (not when its turn comes). Stopping early cancels the
    rest; `close` then runs on the same loop (e.g. to close clients bound to it)."""
    loop = asyncio.new_event_loop()
    tasks: list[asyncio.Task] = []
    failed = loop.create_future()

    def note_failure(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and not failed.done():
            failed.set_exception(task.exception())

    try:
        for job in jobs:
            task = loop.create_task(job)
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
        loop.run_until_complete(close())
        loop.close()
