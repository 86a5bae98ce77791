"""Keep the current span across threads and executors, without patching anything process-wide.

``asyncio.create_task`` and ``asyncio.to_thread`` already copy the current context; a thread
pool's ``submit`` and ``loop.run_in_executor`` do not. These helpers do, for the one call. The
span current when the work was handed on stays its parent once it has ended, as OpenTelemetry's
own spans do. To a process pool, which cannot take a context along, the call carries the trace
context as W3C headers instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, TypeVarTuple, Unpack, cast

from opentelemetry import context as context_api

from kaos_otel.propagation import extract_incoming, inject_headers

P = ParamSpec("P")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class _InTraceOf(Generic[T]):
    """``fn`` called in the trace of the W3C ``headers`` it was handed with: what crosses to a
    process pool's worker (picklable when ``fn`` is)."""

    fn: Callable[..., T]
    headers: dict[str, str]

    def __call__(self, /, *args: Any, **kwargs: Any) -> T:
        token = context_api.attach(extract_incoming(self.headers).parent)
        try:
            return self.fn(*args, **kwargs)
        finally:
            context_api.detach(token)


def _in_callers_context(executor: Executor | None, fn: F) -> F:
    """``fn`` bound to the caller's context: a copy of it, or for a process pool its trace context
    (either called as ``fn`` is)."""
    if isinstance(executor, ProcessPoolExecutor):
        return cast(F, _InTraceOf(fn, dict(inject_headers())))
    return cast(F, functools.partial(contextvars.copy_context().run, fn))


def submit_in_context(
    executor: Executor, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> Future[T]:
    """``executor.submit`` that runs ``fn`` in a copy of the caller's context (spans, baggage); in a
    process pool's worker, in the caller's trace (``fn``'s spans are children of the current span
    when the worker has telemetry of its own: a manager made in the pool's initializer)."""
    return executor.submit(_in_callers_context(executor, fn), *args, **kwargs)


def run_in_executor_in_context(
    executor: Executor | None,
    fn: Callable[[Unpack[Ts]], T],
    *args: Unpack[Ts],  # noqa: UP044 (``*Ts`` would not evaluate before Python 3.12: inspect, typeguard)
) -> asyncio.Future[T]:
    """``loop.run_in_executor`` that runs ``fn`` in a copy of the caller's context (in a process
    pool's worker: in the caller's trace, as :func:`submit_in_context` says)."""
    return asyncio.get_running_loop().run_in_executor(executor, _in_callers_context(executor, fn), *args)


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
