"""Each compat operation is written once, as a coroutine that makes its native calls through
a ``call`` it is given, and becomes both the original's blocking function and its ``async_``
twin:

- blocking: ``call`` runs the native method to completion (it releases the GIL while it
  waits) and the coroutine never suspends, so :func:`run_now` drives it to its end without an
  event loop;
- ``async_``: ``call`` starts the native method on tq's runtime and awaits it (``tq._aio``),
  so the event loop runs meanwhile and cancelling the coroutine cancels the native operation.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable, Coroutine, Tuple

from tq import _aio

Call = Callable[..., Awaitable[Any]]


async def now(method: Callable[..., Any], *args: Any) -> Any:
    """Runs ``method(*args)`` to completion."""
    return method(*args)


async def later(method: Callable[..., Any], *args: Any) -> Any:
    """Starts ``method(*args, done=...)`` on tq's runtime and awaits its result."""
    return await _aio.run(lambda done: method(*args, done=done))


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """The result of a coroutine whose every ``call`` is :func:`now` (it never suspends)."""
    try:
        coro.send(None)
    except StopIteration as finished:
        return finished.value
    coro.close()
    raise RuntimeError("a blocking tq.compat call tried to suspend")  # a bug in tq.compat


def both(op: Callable[..., Coroutine[Any, Any, Any]]) -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """``(blocking, async_)`` functions of ``op(call, *args, **kwargs)``, with its docstring
    and its signature minus ``call``. For methods, ``op(self, call, ...)``."""
    sig = inspect.signature(op)
    params = list(sig.parameters.values())
    at = 1 if params and params[0].name == "self" else 0
    public = sig.replace(parameters=params[:at] + params[at + 1 :])

    if at:

        @functools.wraps(op)
        def blocking(self: Any, *args: Any, **kwargs: Any) -> Any:
            return run_now(op(self, now, *args, **kwargs))

        @functools.wraps(op)
        async def asynchronous(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await op(self, later, *args, **kwargs)

    else:

        @functools.wraps(op)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            return run_now(op(now, *args, **kwargs))

        @functools.wraps(op)
        async def asynchronous(*args: Any, **kwargs: Any) -> Any:
            return await op(later, *args, **kwargs)

    name = op.__name__.lstrip("_")
    for fn, fn_name in ((blocking, name), (asynchronous, "async_" + name)):
        fn.__signature__ = public  # type: ignore[attr-defined]
        fn.__name__ = fn_name
        fn.__qualname__ = op.__qualname__.rsplit(".", 1)[0] + "." + fn_name if at else fn_name
        del fn.__wrapped__  # type: ignore[attr-defined]  # help() shows the public signature
    asynchronous.__doc__ = f"``{name}`` as a coroutine (cancelling it cancels the operation).\n\n{op.__doc__ or ''}"
    return blocking, asynchronous
