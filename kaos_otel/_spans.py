"""Span lifecycle built on handles: begin/success/failure, context manager and decorator.

A begun span is current until it ends. Ending never uses a context token created elsewhere: the
handle remembers the context that was current when it began and, where its own context is still
current, puts that one back. Ending out of order, or from another task or thread, therefore never
corrupts the current context.

A span ended where it was begun and current stays the parent of the work started under it that
runs on (a task, a thread, a pool job, work a decorated generator starts: their context is a
copy), as OpenTelemetry's own spans do; the log records there carry it too. A span ended
elsewhere (in another task or thread, in a ``Context.run`` copy) or out of order (before a span
begun after it) stays current in the execution context that began it, as no other one can change
that one's context: kaos-otel's own spans there skip it and take the nearest span not left
current as parent, and the enclosing ``with`` block restores its context all the same; another
library's spans and log records there take it as parent until that task or thread begins its next
span or leaves the context. On a pool thread that is the next job the thread runs, unless the job
runs in its own context (:func:`kaos_otel.context.submit_in_context`,
``run_in_executor_in_context``). Tasks and jobs started in that context keep it as parent, before
or after it ended: their context is a copy, which cannot tell. Begin the span with ``with`` or the
decorator in such code, or end it where it began.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
)
from opentelemetry.util.types import AttributeValue

from kaos_otel import catalog
from kaos_otel._content import ContentPolicy, safe_str, to_attribute_value, to_attributes
from kaos_otel._internal_log import internal_error
from kaos_otel.catalog import Outcome

_MARK_KEY = otel_context.create_key("kaos_otel.span_mark")
_END_LOCK = threading.Lock()
ERROR_OUTCOMES = frozenset({Outcome.ERROR, Outcome.MAX_STEPS})
"""Outcomes of an operation that failed: ERROR status, and ``error.type`` on the convention's metrics."""
_OVERRIDDEN_BY_EXCEPTION = frozenset({None, Outcome.SUCCESS, Outcome.DEGRADED})
OUTCOME_VALUE: dict[Outcome, str] = {member: member.value for member in Outcome}
"""Each outcome's value: a lookup here costs a fraction of the enum's ``value`` property."""
_OUTCOME_VALUES = frozenset(OUTCOME_VALUE.values())
"""Every outcome's value (``Outcome`` is a ``StrEnum``)."""

F = TypeVar("F", bound=Callable[..., Any])
EndCallback = Callable[["SpanHandle", float], None]


_BEGUN_HERE: contextvars.ContextVar[None] = contextvars.ContextVar("kaos_otel_begun_here", default=None)
"""Set where a span is made current: its token tells that execution context (an asyncio task's,
a thread's, one ``Context.run``) from every other, copies of it included."""


class _SpanMark:
    """What a span's context tells about the span: whether it has ended, whether it was left
    current where it began (``left_current``: ended elsewhere, or before a span begun after it
    there), and the context to fall back to then (``previous``; ``previous_made_here``: its span
    was made current in the same execution context as this one).

    The context holds this mark rather than the handle, so that a handle and its context do not
    reference each other: an ended span is freed at once instead of waiting, with everything it
    holds, for the garbage collector. Only a span left current in a task or thread that then
    finishes waits for it: its mark names that execution context, which holds the span.
    """

    __slots__ = ("_begun_here", "ended", "left_current", "previous", "previous_made_here", "span")

    def __init__(self, span: Span, previous: Context, ended: bool = False) -> None:
        self.span = span
        self.previous = previous
        self.previous_made_here = False
        self.ended = ended
        self.left_current = False
        self._begun_here: contextvars.Token[None] | None = None

    def runs_where_made_current(self) -> bool:
        """Whether the code running now runs in the execution context the span was made current
        in, not in another one or a copy of it (``False`` for a span never made current)."""
        token = self._begun_here
        if token is None:
            return False
        try:
            _BEGUN_HERE.reset(token)  # ValueError in any other context: that one is not changed
        except (ValueError, RuntimeError):  # RuntimeError: another thread's check used it just now
            return False
        self._begun_here = _BEGUN_HERE.set(None)  # the next check needs a token of its own
        return True

    def note_end(self, context_current: bool) -> None:
        """Record how the span ended: left current where it was made current, unless it ended
        there with its context current (``context_current``: its context is current here); then
        where it was is no longer needed."""
        token = self._begun_here
        if token is not None and context_current:
            try:  # as runs_where_made_current(), with no token for a next check: none follows
                _BEGUN_HERE.reset(token)
                token = None
            except (ValueError, RuntimeError):  # ended with its context current elsewhere
                pass
        self.left_current = token is not None
        if token is None:
            self._begun_here = None

    def previous_where_made_current(self) -> Context:
        """What a walk past this span reaches where it was made current: past the spans left
        current there that it was begun on."""
        ctx, link = self.previous, self
        while link.previous_made_here and (behind := _left_current_mark(ctx)) is not None:
            ctx, link = behind.previous, behind
        return ctx


class SpanHandle:
    """An open span and what is needed to end it correctly, once.

    It offers the span methods agent code uses (``set_attribute``, ``add_event``...) and ends
    through :meth:`success`, :meth:`failure` or a ``with`` block.
    """

    __slots__ = (
        "_context",
        "_error_type",
        "_mark",
        "_on_end",
        "_outcome",
        "_policy",
        "_started",
        "span",
    )

    def __init__(
        self,
        span: Span,
        parent_context: Context,
        policy: ContentPolicy,
        on_end: EndCallback | None = None,
        previous: Context | None = None,
    ) -> None:
        self.span = span
        self._mark = _SpanMark(span, parent_context if previous is None else previous)
        self._context = otel_context.set_value(
            _MARK_KEY, self._mark, trace.set_span_in_context(span, parent_context)
        )
        self._policy = policy
        self._on_end = on_end
        self._outcome: Outcome | None = None
        self._error_type: str | None = None
        self._started = time.perf_counter()

    # --- span-like surface ----------------------------------------------------------------
    @property
    def context(self) -> Context:
        """The context in which this span is the current span."""
        return self._context

    @property
    def is_ended(self) -> bool:
        """Whether the span has ended."""
        return self._mark.ended

    @property
    def elapsed_s(self) -> float:
        """Seconds since the span began (the clock its duration metrics use)."""
        return time.perf_counter() - self._started

    @property
    def outcome(self) -> Outcome | None:
        """The outcome set so far (``None`` until set or ended)."""
        return self._outcome

    @property
    def error_type(self) -> str | None:
        """The ``error.type`` recorded, if any."""
        return self._error_type

    def set_attribute(self, key: str, value: object) -> None:
        """Set one attribute; any value is accepted (non-primitives are stringified, sizes capped).

        Like the others below, it converts nothing for a span the sampler did not record."""
        if value is not None and self.span.is_recording():
            self.span.set_attribute(key, to_attribute_value(value, self._policy))

    def set_attributes(self, attributes: Mapping[str, object]) -> None:
        """Set several attributes (``None`` values are skipped)."""
        if self.span.is_recording():
            self.span.set_attributes(to_attributes(attributes, self._policy))

    def add_event(self, name: str, attributes: Mapping[str, object] | None = None) -> None:
        """Add an event to the span."""
        if self.span.is_recording():
            self.span.add_event(name, to_attributes(attributes, self._policy))

    def set_content(self, key: str, value: object) -> None:
        """Set a content attribute (prompt, response, arguments...) only when capture is on."""
        if self._policy.capture_on_spans and value is not None:
            self.set_attribute(key, value)

    def set_outcome(self, outcome: Outcome | str, error_type: str | None = None) -> None:
        """Record how the operation ended when it was not by an exception (e.g. ``max_steps``); a
        value naming no outcome (in any case) is logged and the outcome so far kept. A later call
        replaces an earlier one, its ``error.type`` too (a failed attempt's, once a retry succeeds)."""
        named = outcome_named("set_outcome", outcome)
        if named is None:
            return
        self._outcome = named
        if error_type is not None:
            self._error_type = error_type if type(error_type) is str else safe_str(error_type)
        else:
            self._error_type = named.value if named in ERROR_OUTCOMES else None

    def record_exception(self, exc: BaseException) -> None:
        """Record an ``exception`` event (the message only with content capture on)."""
        if self.span.is_recording():  # the stack trace costs far more than the span
            self.span.add_event("exception", self._policy.exception_attributes(exc))

    # --- ending -----------------------------------------------------------------------------
    def success(self) -> None:
        """End the span; its outcome is ``success`` unless :meth:`set_outcome` said otherwise."""
        if not self._claim_end():
            return
        if self._outcome is None:
            self._outcome = Outcome.SUCCESS
        self._end()

    def failure(self, exc: BaseException) -> None:
        """End the span as failed by ``exc``: exception event, ``error.type`` and ERROR status (a
        cancellation, ``asyncio.CancelledError``, a generator closed early or the process
        stopping, ends ``canceled`` with its ``error.type``, no exception event and the status left
        unset, as OpenTelemetry's ``use_span`` records no exception that is not an ``Exception``)."""
        if not self._claim_end():
            return
        # an exception class given for an exception stands for it (the class of a class is "type")
        kind = exc if isinstance(exc, type) else type(exc)
        canceled = issubclass(kind, asyncio.CancelledError | GeneratorExit | KeyboardInterrupt | SystemExit)
        named = kind.__qualname__
        if self._outcome in _OVERRIDDEN_BY_EXCEPTION:
            # An exception ending the operation outranks success or an earlier degradation.
            self._outcome = Outcome.CANCELED if canceled else Outcome.ERROR
            self._error_type = named
        elif self._error_type is None:
            self._error_type = named
        if not canceled and isinstance(exc, BaseException):
            try:
                self.record_exception(exc)
            except Exception as internal:
                internal_error("recording an exception", internal)
        self._end()

    def _claim_end(self) -> bool:
        """Mark the span as ending; ``False`` if another call, on any thread, already did."""
        mark = self._mark
        with _END_LOCK:
            if mark.ended:
                return False
            mark.ended = True
            return True

    def _end(self) -> None:
        span = self.span
        try:
            outcome = self._outcome or Outcome.SUCCESS
            if self._on_end is not None or outcome is not Outcome.SUCCESS:
                span.set_attribute(catalog.KAOS_OUTCOME, OUTCOME_VALUE[outcome])
            if self._error_type is not None:
                span.set_attribute(catalog.ERROR_TYPE, self._error_type)
            if outcome in ERROR_OUTCOMES:
                span.set_status(Status(StatusCode.ERROR, self._error_type or OUTCOME_VALUE[outcome]))
            if self._on_end is not None:
                self._on_end(self, time.perf_counter() - self._started)
        except Exception as exc:
            internal_error("ending a span", exc)
        finally:
            try:
                span.end()  # runs the span processors' on_end: the application's own ones too
            except Exception as exc:
                internal_error("ending a span", exc)
            finally:
                self._restore_context()

    def _restore_context(self) -> None:
        """If this span's context is current here (directly, or under spans left current here),
        restore the one current when it began, past the spans left current here."""
        mark = self._mark
        current = otel_context.get_current()
        if current is self._context or live_context(current) is self._context:
            otel_context.attach(live_context(mark.previous))
            mark.note_end(context_current=True)
        else:
            mark.note_end(context_current=False)
        if mark.previous_made_here:
            # a walk past this span, from now on, in one step: a consumer whose spans its workers
            # end would hold a chain of them otherwise (none to walk past, nearly always)
            behind = mark.previous.get(_MARK_KEY)
            if isinstance(behind, _SpanMark) and behind.left_current:
                mark.previous = mark.previous_where_made_current()
            mark.previous_made_here = False

    # --- context manager ----------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.success()
        else:
            self.failure(exc)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def outcome_named(where: str, value: object) -> Outcome | None:
    """``value`` as an outcome: a member, or its value in any case, spaces around it; else
    ``None``, logged as an internal error of ``where`` (counted as another outcome, it would be a
    wrong number)."""
    if isinstance(value, Outcome):
        return value
    text = safe_str(value).strip().lower()
    if text in _OUTCOME_VALUES:
        return Outcome(text)
    internal_error(where, ValueError(f"not an outcome: {text[:80]!r}"))
    return None


def live_context(ctx: Context) -> Context:
    """``ctx``, or if its current span was left current in the execution context running now
    (ended elsewhere, or out of order), the nearest ancestor's that was not.

    The ended spans walked past are pointed at that ancestor (path compression): a later walk
    takes one step, and the spans between them are no longer reachable from a context that
    stays current (a consumer task whose spans other tasks end).
    """
    first = ctx.get(_MARK_KEY)
    if not (isinstance(first, _SpanMark) and first.left_current):  # nearly always: at once
        return ctx
    walked: list[_SpanMark] = []
    # only where it was made current: a task or a pool job started under it keeps it as parent,
    # as OpenTelemetry's own spans do
    mark = _left_current_mark(ctx)
    while mark is not None and mark.runs_where_made_current():
        walked.append(mark)
        ctx = mark.previous
        mark = _left_current_mark(ctx)
    for ended in walked:
        ended.previous = ctx
        ended.previous_made_here = False  # not known of the ancestor: no further walk from it
    return ctx


def _past_partials(fn: object) -> object:
    """What ``fn`` calls when it is a ``functools.partial`` (of a partial...), else ``fn``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _span_name_of(fn: object) -> str:
    """The name a span of ``fn`` takes: its qualified name, a partial's function's, an object's type's."""
    fn = _past_partials(fn)
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _called_function(fn: object) -> object:
    """The function calling ``fn`` runs, which tells its kind (coroutine, generator...): past
    partials, a function or method itself, else its type's ``__call__`` (an object's, or a class's
    metaclass's), which :mod:`inspect` does not look at."""
    fn = _past_partials(fn)
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return fn
    call = inspect.getattr_static(type(fn), "__call__", None)
    return call if inspect.isfunction(call) else fn


def _span_kind(kind: object) -> SpanKind:
    """``kind`` as a :class:`SpanKind`: a member's name in any case (``"client"``) names it,
    anything else is logged and taken as ``INTERNAL``."""
    if isinstance(kind, str) and kind.strip().upper() in SpanKind.__members__:
        return SpanKind[kind.strip().upper()]
    internal_error("span kind", TypeError(f"not a span kind: {safe_str(kind)[:80]!r}"))
    return SpanKind.INTERNAL


def _usable_links(links: object) -> list[Link]:
    """The links to give the tracer: a span context becomes a link, anything else that is not a
    link is logged and left out."""
    if not isinstance(links, Iterable) or isinstance(links, str | bytes | Mapping):
        internal_error("span links", TypeError(f"not links: a {type(links).__qualname__}"))
        return []
    usable: list[Link] = []
    for link in links:
        if isinstance(link, Link):
            usable.append(link)
        elif isinstance(link, SpanContext):
            usable.append(Link(link))
        else:
            internal_error("span links", TypeError(f"not a link: a {type(link).__qualname__}"))
    return usable


def _parent_context(parent: object, current: Context) -> Context:
    """The context a ``parent`` that is not a :class:`Context` stands for: a handle's context, a
    span's own; anything else is logged and ``current`` used."""
    if isinstance(parent, SpanHandle):
        return parent.context
    if isinstance(parent, Span):
        return trace.set_span_in_context(parent)
    internal_error("span parent", TypeError(f"not a context: a {type(parent).__qualname__}"))
    return current


def _left_current_mark(ctx: Context) -> _SpanMark | None:
    """The mark of ``ctx``'s current span if that span was left current (ended elsewhere, or out
    of order); ``None`` when another library's span begun under it is current."""
    mark = ctx.get(_MARK_KEY)
    if isinstance(mark, _SpanMark) and mark.left_current and trace.get_current_span(ctx) is mark.span:
        return mark
    return None


class SpanFactory:
    """Creates handle-based spans for one tracer and content policy."""

    def __init__(self, tracer: Tracer, policy: ContentPolicy) -> None:
        self._tracer = tracer
        self._policy = policy

    @property
    def policy(self) -> ContentPolicy:
        """The content policy spans are recorded under."""
        return self._policy

    def start(
        self,
        name: str,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, object] | None = None,
    ) -> SpanHandle:
        """Start a span under the current context without making it current."""
        parent_context = live_context(otel_context.get_current())
        return self._start(name, kind, attributes, None, parent_context, None, SpanHandle, None)

    def _start(
        self,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, object] | None,
        links: Sequence[Link] | None,
        parent_context: Context,
        on_end: EndCallback | None,
        handle_type: type[SpanHandle],
        previous: Context | None,
    ) -> SpanHandle:
        """Start a span under ``parent_context``.

        Should the tracer raise (a span processor's ``on_start``), the handle holds a non-recording
        span in the parent's place, so the caller's code and its children carry on.
        """
        if type(kind) is not SpanKind:
            kind = _span_kind(kind)
        if links is not None:
            links = _usable_links(links)
        try:
            span = self._tracer.start_span(
                name,
                context=parent_context,
                kind=kind,
                attributes=to_attributes(attributes, self._policy) if attributes is not None else None,
                links=links,
            )
        except Exception as exc:
            internal_error("starting a span", exc)
            span = NonRecordingSpan(trace.get_current_span(parent_context).get_span_context())
        return handle_type(span, parent_context, self._policy, on_end, previous)

    def begin(
        self,
        name: str,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, object] | None = None,
        links: Sequence[Link] | None = None,
        parent: Context | None = None,
        on_end: EndCallback | None = None,
        handle_type: type[SpanHandle] = SpanHandle,
    ) -> SpanHandle:
        """Start a span and make it current until it ends, then restore the context current now."""
        previous = live_context(otel_context.get_current())
        if parent is None:
            parent_context = previous
        elif isinstance(parent, Context):
            parent_context = parent
        else:
            parent_context = _parent_context(parent, previous)
        handle = self._start(name, kind, attributes, links, parent_context, on_end, handle_type, previous)
        behind = previous.get(_MARK_KEY)
        mark = handle._mark
        mark.previous_made_here = isinstance(behind, _SpanMark) and behind.runs_where_made_current()
        otel_context.attach(handle._context)
        mark._begun_here = _BEGUN_HERE.set(None)  # made current in the execution context running now
        return handle

    def traced(
        self,
        name: str | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Callable[[F], F]:
        """Decorate a sync, async, generator or async-generator function with a span."""

        def decorate(fn: F) -> F:
            if isinstance(fn, (staticmethod, classmethod)):
                # above @staticmethod / @classmethod: trace the function, keep the descriptor
                return cast(F, type(fn)(decorate(fn.__func__)))
            span_name = name or _span_name_of(fn)
            called = _called_function(fn)
            if inspect.isasyncgenfunction(called):
                return cast(F, self._wrap_async_generator(fn, span_name, kind, attributes))
            if inspect.isgeneratorfunction(called):
                return cast(F, self._wrap_generator(fn, span_name, kind, attributes))
            if inspect.iscoroutinefunction(called):

                @functools.wraps(fn)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    with self.begin(span_name, kind=kind, attributes=attributes):
                        return await fn(*args, **kwargs)

                return cast(F, async_wrapper)

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with self.begin(span_name, kind=kind, attributes=attributes):
                    return fn(*args, **kwargs)

            return cast(F, wrapper)

        return decorate

    def _wrap_generator(
        self,
        fn: Callable[..., Generator[Any, Any, Any]],
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, AttributeValue] | None,
    ) -> Callable[..., Generator[Any, Any, Any]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            generator = fn(*args, **kwargs)  # first: arguments it refuses start no span
            handle = self.start(name, kind=kind, attributes=attributes)
            to_send: Any = None
            to_throw: BaseException | None = None
            # the generator's own context between steps: a span it opened before a yield is
            # current again when it resumes
            inside = handle.context
            try:
                while True:
                    token = otel_context.attach(inside)
                    try:
                        item = generator.throw(to_throw) if to_throw is not None else generator.send(to_send)
                    finally:
                        inside = otel_context.get_current()
                        otel_context.detach(token)
                    to_throw = None
                    try:
                        to_send = yield item
                    except GeneratorExit:
                        # closed early: its cleanup (finally blocks) still runs inside its span
                        token = otel_context.attach(inside)
                        try:
                            generator.close()
                        finally:
                            otel_context.detach(token)
                        raise
                    except BaseException as exc:
                        to_throw = exc
            except StopIteration as stop:
                handle.success()
                return stop.value
            except BaseException as exc:
                handle.failure(exc)
                raise

        return wrapper

    def _wrap_async_generator(
        self,
        fn: Callable[..., AsyncGenerator[Any, Any]],
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, AttributeValue] | None,
    ) -> Callable[..., AsyncGenerator[Any, Any]]:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            generator = fn(*args, **kwargs)  # first: arguments it refuses start no span
            handle = self.start(name, kind=kind, attributes=attributes)
            to_send: Any = None
            to_throw: BaseException | None = None
            inside = handle.context  # as in _wrap_generator
            try:
                while True:
                    token = otel_context.attach(inside)
                    try:
                        if to_throw is not None:
                            item = await generator.athrow(to_throw)
                        else:
                            item = await generator.asend(to_send)
                    finally:
                        inside = otel_context.get_current()
                        otel_context.detach(token)
                    to_throw = None
                    try:
                        to_send = yield item
                    except GeneratorExit:
                        token = otel_context.attach(inside)
                        try:
                            await generator.aclose()
                        finally:
                            otel_context.detach(token)
                        raise
                    except BaseException as exc:
                        to_throw = exc
            except StopAsyncIteration:
                handle.success()
            except BaseException as exc:
                handle.failure(exc)
                raise

        return wrapper


_SCOPE_ENTERED: contextvars.ContextVar[None] = contextvars.ContextVar("kaos_otel_scope_entered", default=None)
"""Set on entering a :class:`SpanScope` another entry of which is open: the token tells the
execution context of the entry."""

_SCOPE_LOCK = threading.Lock()


class SpanScope:
    """What ``with otel.span(...)`` enters: the span begins on entering and ends on leaving.

    A scope kept and entered again, nested or by several tasks or threads at once, begins a span
    per entry, and leaving ends the latest entry made in the execution context that leaves; left
    from a context no entry was made in (a generator closed by another task), the oldest entry.
    """

    __slots__ = ("_attributes", "_entered", "_factory", "_kind", "_links", "_name", "_parent", "_tokens")

    def __init__(
        self,
        factory: SpanFactory | None,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, object] | None,
        links: Sequence[Link] | None,
        parent: Context | None,
    ) -> None:
        self._factory = factory
        self._name = name
        self._kind = kind
        self._attributes = attributes
        self._links = links
        self._parent = parent
        self._entered: list[SpanHandle] = []
        self._tokens: dict[SpanHandle, contextvars.Token[None]] | None = None
        """The execution context of each entry made while another was open (made under the lock)."""

    def __enter__(self) -> SpanHandle:
        if self._factory is None:
            return NOOP_HANDLE
        handle = self._factory.begin(
            self._name, kind=self._kind, attributes=self._attributes, links=self._links, parent=self._parent
        )
        entered = self._entered
        entered.append(handle)
        if len(entered) > 1:  # another entry is open: this one's context must be told apart
            with _SCOPE_LOCK:
                if self._tokens is None:
                    self._tokens = {}
                self._tokens[handle] = _SCOPE_ENTERED.set(None)
        return handle

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        entered = self._entered
        try:
            if len(entered) == 1 and not self._tokens:
                # the one entry, first in the list (another thread's may be appended meanwhile)
                handle = entered.pop(0)
            elif not entered:  # left more often than entered, or disabled
                return
            else:
                with _SCOPE_LOCK:
                    handle = self._entered_here(entered)
                    entered.remove(handle)
                    if self._tokens is not None:
                        self._tokens.pop(handle, None)
        except (IndexError, ValueError):  # another thread left the last entry meanwhile
            return
        if exc is None:  # as SpanHandle.__exit__, one call fewer on every block
            handle.success()
        else:
            handle.failure(exc)

    def _entered_here(self, entered: list[SpanHandle]) -> SpanHandle:
        """The latest entry made in the execution context running now; else the oldest entry
        made while no other was open (its context was not noted), else the oldest."""
        tokens = self._tokens or {}
        alone: SpanHandle | None = None
        for handle in reversed(entered):
            token = tokens.get(handle)
            if token is None:
                alone = handle
                continue
            try:
                _SCOPE_ENTERED.reset(token)  # ValueError in any other context
            except ValueError:
                continue
            return handle
        return alone if alone is not None else entered[0]  # IndexError when none is left

    async def __aenter__(self) -> SpanHandle:
        return self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(exc_type, exc, tb)


class NoopSpanHandle(SpanHandle):
    """The handle every call returns when telemetry is disabled: it records nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        self.span = trace.INVALID_SPAN
        self._context = Context()
        self._mark = _SpanMark(self.span, self._context, ended=True)
        self._outcome = None
        self._error_type = None
        self._on_end = None

    @property
    def elapsed_s(self) -> float:
        """``0.0``: the shared no-op handle did not begin anything."""
        return 0.0

    def set_attribute(self, key: str, value: object) -> None:
        """Do nothing."""

    def set_attributes(self, attributes: Mapping[str, object]) -> None:
        """Do nothing."""

    def add_event(self, name: str, attributes: Mapping[str, object] | None = None) -> None:
        """Do nothing."""

    def set_content(self, key: str, value: object) -> None:
        """Do nothing."""

    def set_outcome(self, outcome: Outcome | str, error_type: str | None = None) -> None:
        """Do nothing."""

    def record_exception(self, exc: BaseException) -> None:
        """Do nothing."""


NOOP_HANDLE = NoopSpanHandle()
