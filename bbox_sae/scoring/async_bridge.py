"""The score stage is synchronous; remote scoring is many requests in flight at once. This runs
them on a private event loop and hands their results back one by one, in order.

No task outlives the loop: a task still pending when the loop closes is destroyed mid-await, and
says so in tracebacks ("Task was destroyed but it is pending!", "Event loop is closed") after the
one-line error that stopped the run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

# How long cancelled tasks get to finish. Ours end at their next await; the bound is for a
# library that would not, so that giving up never hangs.
CLEANUP_S = 10.0


def results_in_order(jobs: Iterable[Coroutine[object, object, T]], close: Callable[[], Awaitable[None]]) -> Iterator[T]:
    """Every job is in flight at once; results are yielded in the jobs' order, and the first
    failure anywhere is raised at once (not when its turn comes). Stopping early cancels the
    rest and every task they started; `close` then runs on the same loop (e.g. to close clients
    bound to it)."""
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
        if not failed.done():
            failed.cancel()
        elif not failed.cancelled():
            failed.exception()  # retrieved, so asyncio does not warn when we stopped early
        loop.run_until_complete(_cancel_all_but_me(CLEANUP_S))
        loop.run_until_complete(close())
        loop.close()


async def _cancel_all_but_me(timeout_s: float) -> None:
    """Cancel every other task of the loop and wait (at most `timeout_s`) until they have ended."""
    me = asyncio.current_task()
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pending := [t for t in asyncio.all_tasks() if t is not me]:
        for task in pending:
            task.cancel()
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return
        await asyncio.wait(pending, timeout=left)
        for task in pending:
            if task.done() and not task.cancelled():
                task.exception()  # a second failure after the first one raised: no "never retrieved" warning


async def gather_or_cancel(jobs: Iterable[Coroutine[object, object, T]]) -> list[T]:
    """The jobs' results, in order, as `asyncio.gather`; but the first failure (or a
    cancellation) cancels the other jobs and waits for them to end before it is raised, where
    `gather` would leave them running."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        raise
