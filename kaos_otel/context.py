"""Keep the current span across threads and executors, without patching anything process-wide.

``asyncio.create_task`` and ``asyncio.to_thread`` already copy the current context; a thread
pool's ``submit`` and ``loop.run_in_executor`` do not. These helpers do, for the one call. The
span current when the work was handed on stays its parent once it has ended, as OpenTelemetry's
own spans do.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar, TypeVarTuple, Unpack

P = ParamSpec("P")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def submit_in_context(executor: Executor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
    """``executor.submit`` that runs ``fn`` in a copy of the caller's context (spans, baggage)."""
    context = contextvars.copy_context()
    return executor.submit(context.run, fn, *args, **kwargs)  # type: ignore[arg-type]


def run_in_executor_in_context(
    executor: Executor | None,
    fn: Callable[[Unpack[Ts]], T],
    *args: Unpack[Ts],  # noqa: UP044 (``*Ts`` would not evaluate before Python 3.12: inspect, typeguard)
) -> asyncio.Future[T]:
    """``loop.run_in_executor`` that runs ``fn`` in a copy of the caller's context."""
    context = contextvars.copy_context()
    return asyncio.get_running_loop().run_in_executor(executor, context.run, fn, *args)


def wrap_in_context(fn: Callable[P, T]) -> Callable[P, T]:
    """Bind ``fn`` to the current context, to hand to a thread or callback API.

    Each call runs in its own copy of the context as it was when ``fn`` was bound, so calls may
    run at the same time, nest, and leave nothing behind for the next one.
    """
    context = contextvars.copy_context()

    def bound(*args: P.args, **kwargs: P.kwargs) -> T:
        return context.copy().run(fn, *args, **kwargs)

    return bound


def create_background_task(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """``asyncio.create_task`` for work a request leaves running after it answers: its spans are
    children of the current span, even after that span ends (the task runs in a copy of the
    current context, as ``asyncio.create_task`` runs any task; the name says what it is for)."""
    return asyncio.create_task(coro, name=name)
