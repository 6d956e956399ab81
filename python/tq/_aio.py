"""Awaiting native operations: the bridge between tq's tokio runtime and asyncio.

A native operation started with a ``done`` callback runs on the client's runtime and calls
``done(ok, value)`` from one of the runtime's threads when it ends. :func:`run` hands that
result to the event loop with ``call_soon_threadsafe``, so the coroutine resumes on its own
loop; cancelling the coroutine cancels the operation (``Task.cancel``). Nothing here uses a
thread pool: the event loop's thread only starts operations and receives results.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable


def _settle(future: "asyncio.Future[Any]", ok: bool, value: Any) -> None:
    if future.done():  # cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def run(start: Callable[[Callable[[bool, Any], None]], Any]) -> Any:
    """Starts a native operation (``start(done)`` answers its ``Task``) and awaits its result."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def done(ok: bool, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(_settle, future, ok, value)
        except RuntimeError:  # the loop closed before the operation ended: nobody waits
            pass

    task = start(done)
    try:
        return await future
    except asyncio.CancelledError:
        task.cancel()
        raise
