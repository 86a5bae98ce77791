"""Content safety: what may be recorded, secret redaction and size caps.

What counts as a secret lives in :mod:`kaos_otel._secrets`.

Content (prompts, responses, tool arguments, memory text, exception messages) is only recorded
when capture is on. Redaction and the size cap apply to every string the pipeline exports,
whether or not content capture is on, in one place: the exporters of
:mod:`kaos_otel.exporters.pipeline` (span and event names, status descriptions, span, event and
link attributes, log bodies, attributes and event names), on the export thread. On the request's
thread only oversized strings are cut (:meth:`ContentPolicy.bound_size`) and metric label values
are checked once per distinct value (:class:`~kaos_otel._metrics.LabelBounds`).
"""

from __future__ import annotations

import json
import math
import re
import traceback
from collections import deque
from collections.abc import Collection, Mapping, Sequence, Set, ValuesView
from dataclasses import dataclass, field
from itertools import islice
from types import MappingProxyType
from typing import TypeGuard, TypeVar, cast

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.util.types import AnyValue, AttributeValue

from kaos_otel._config import (
    DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    ContentCapture,
    _capture_content,
    content_from_env,
)
from kaos_otel._internal_log import internal_error
from kaos_otel._secrets import (
    REDACTED,
    SECRET_KEY_NAME,
    Redactor,
    default_redactor,
    key_names_a_secret,
    names_a_secret,
    secret_arguments,
)

__all__ = ["REDACTED", "ContentPolicy", "Redactor", "default_redactor"]

CACHED_TEXT_LENGTH = 256
"""Strings up to this length have their cleaned form remembered (:attr:`ContentPolicy._redacted`)."""
CACHED_TEXTS = 4096
"""At most this many remembered strings (about 1 MB at most) before the cache starts over."""
_COPYABLE_MAPPINGS = (BoundedAttributes, MappingProxyType)
"""The SDK's attribute mappings (a span's ``attributes`` is a read-only proxy of one): their
``copy()`` is a plain ``dict``."""
_MAX_STRUCTURE_ITEMS = 256
_MAX_STRUCTURE_DEPTH = 8
"""A structured log attribute (mapping or list) larger or deeper than this is exported as its
JSON text, redacted and capped like any string."""
_NAME_LIKE = re.compile(r"[\w.-]{1,64}")
"""What a pair's first item looks like when it is a name (a header's, a variable's), not text."""
REDACTION_MARGIN = 256
"""Characters past the size cap still scanned, so that a secret the cap cuts through is masked."""
_SURROGATE = re.compile("[\ud800-\udfff]")
"""A surrogate code point: Python text may hold one (bytes decoded with ``surrogateescape``, a
lone ``\\ud83d`` escape in JSON), UTF-8 cannot."""


def sdk_value_limit(cap: int) -> int:
    """The SDK's attribute value limit where no variable sets one: past the cap by the redaction
    margin and one more character, so that the export layer still sees a secret the cap cuts
    through (the SDK cuts without masking), and knows a value of that length was cut."""
    return cap + REDACTION_MARGIN + 1


_Key = TypeVar("_Key")
_Value = TypeVar("_Value")


def remember(cache: dict[_Key, _Value], key: _Key, value: _Value) -> _Value:
    """Keep ``value`` under ``key`` in a bounded cache (emptied once it holds :data:`CACHED_TEXTS`
    entries; the next lookups refill it) and return it."""
    if len(cache) >= CACHED_TEXTS:
        cache.clear()
    cache[key] = value
    return value


def cap_text(text: str, limit: int, marker: str | None = None) -> str:
    """Cut ``text`` to ``limit`` characters, ending in ``marker`` (by default, how much was cut)
    where the limit leaves room."""
    if len(text) <= limit:
        return text
    if marker is None:
        marker = _truncated(text, limit)
    if len(marker) >= limit:
        return text[:limit]
    return text[: limit - len(marker)] + marker


def _encodable(text: str) -> str:
    """``text`` with each surrogate replaced by U+FFFD: OTLP strings are UTF-8, and the exporter
    drops an attribute holding one (logging an error with its traceback for every span)."""
    if text.isascii() or _SURROGATE.search(text) is None:  # isascii() reads a flag: no scan
        return text
    return _SURROGATE.sub("\ufffd", text)


def _truncated(text: str, limit: int) -> str:
    """The end of ``text`` cut to ``limit``: how many characters it had past the limit."""
    return f"...[truncated {len(text) - limit} chars]"


@dataclass(frozen=True, slots=True)
class ContentPolicy:
    """Decides what content is recorded and how every exported string is cleaned."""

    capture: ContentCapture = ContentCapture.NO_CONTENT
    redactor: Redactor = default_redactor
    max_value_length: int = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    """Cap on attribute values (the settings' attribute limit)."""
    secret_keys: re.Pattern[str] = field(default=SECRET_KEY_NAME)
    max_text_length: int = DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT
    """Cap on the other strings: span and event names, status descriptions, log bodies. No
    ``OTEL_*`` variable limits these, so the attribute limit does not either."""
    _redacted: dict[str, str] = field(default_factory=dict, init=False, compare=False, repr=False)
    """Recent short strings and their redacted form: span names, routes, model and agent names
    repeat on nearly every span, and the redactor costs microseconds per call."""
    _secret_named: dict[str, bool] = field(default_factory=dict, init=False, compare=False, repr=False)
    """Recent keys and whether :meth:`is_secret_named` holds for them (a few keys repeat on
    every span)."""
    _cleaned_keys: dict[str, str] = field(default_factory=dict, init=False, compare=False, repr=False)
    """Recent attribute keys and their cleaned form (a key holding a credential is masked)."""
    _cleaned_items: dict[tuple[str, str], tuple[str, str]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """Recent attributes with a short text value, and their cleaned key and value: most of a
    span's attributes (operation, model, agent and tool names, outcomes) repeat on every span."""

    def __post_init__(self) -> None:
        # a mode given as text or as a bool (as ``capture_content`` takes it) is read as the
        # variable is: in any case, ``true``/``false``; an unknown one captures nothing (warned once)
        if not isinstance(self.capture, ContentCapture):
            object.__setattr__(self, "capture", _capture_content(self.capture, {}))

    @property
    def capture_on_spans(self) -> bool:
        """Content may be set on spans."""
        return self.capture.on_spans

    def clean_text(self, text: str, limit: int | None = None, marker: str | None = None) -> str:
        """Redact secrets, then cap the size to ``limit`` (default :attr:`max_text_length`); only
        the part that can be kept is scanned. A cut text ends in ``marker`` (by default, how much
        was cut)."""
        if limit is None:
            limit = self.max_text_length
        if len(text) <= CACHED_TEXT_LENGTH:
            redacted = self._redacted.get(text)
            if redacted is None:
                redacted = remember(self._redacted, text, _encodable(self.redactor(text)))
            return redacted if len(redacted) <= limit else cap_text(redacted, limit, marker)
        return _encodable(self._clean_text(text, limit, marker))

    def _clean_text(self, text: str, limit: int, marker: str | None) -> str:
        scanned = limit + REDACTION_MARGIN
        if len(text) <= scanned:
            return cap_text(self.redactor(text), limit, marker)
        # A 10 MB exception message or log body would otherwise be scanned whole, on the
        # request's thread, for about a second per megabyte.
        if marker is None:
            marker = _truncated(text, limit)
        redacted = self.redactor(text[:scanned])
        # The scan's end may cut a secret, which is then not matched, and masking may have
        # shortened what comes before it: nothing from the scan's last REDACTION_MARGIN is kept,
        # unless a mask covers it.
        last_mask = redacted.rfind(REDACTED)
        covered = last_mask + len(REDACTED) if last_mask >= 0 else 0
        safe = max(covered, len(redacted) - REDACTION_MARGIN)
        if len(marker) >= limit:
            return redacted[: max(0, min(limit, safe))]
        return redacted[: max(0, min(limit - len(marker), safe))] + marker

    def bound_size(self, text: str, limit: int | None = None) -> str:
        """``text`` as it is if within the cap (``limit``, default :attr:`max_text_length`), else
        cleaned now (only its kept part is scanned).

        For text held until export (exception messages, log bodies): redaction runs on the
        export thread, but a huge string must not sit whole in the queue meanwhile.
        """
        if limit is None:
            limit = self.max_text_length
        return text if len(text) <= limit else self.clean_text(text, limit)

    def clean_attribute(self, key: str, value: AttributeValue) -> AttributeValue:
        """Clean one exported attribute value (secret-named keys are masked whole).

        Log records may carry structured values (mappings, mixed lists, bytes): they are cleaned
        item by item, under the key that holds each item.
        """
        if isinstance(value, str):
            return self._clean_text_attribute(key, value)
        if isinstance(value, int | float):  # before the slower abstract checks below; bools too
            if isinstance(value, bool) or not self.is_secret_named(key):
                return value
            return REDACTED  # a PIN, a numeric password
        if isinstance(value, Sequence) and value and isinstance(value[0], str):
            if self.is_secret_named(key):  # e.g. http.request.header.authorization
                return tuple(REDACTED for _ in value)
            return _masked_arguments(value, [self._clean_value_text(str(item)) for item in value])
        if isinstance(value, bytes):
            return self._clean_bytes(key, value)
        if isinstance(value, Sequence | Mapping) and value and self.is_secret_named(key):
            return REDACTED  # a PIN as digits, a credentials mapping
        if isinstance(value, Sequence) and all(isinstance(item, int | float) for item in value):
            return value  # numbers only
        return self._clean_structured(key, value, 0)  # type: ignore[return-value]

    def _clean_text_attribute(self, key: str, value: str) -> str:
        return REDACTED if value and self.is_secret_named(key) else self._clean_value_text(value)

    def _clean_value_text(self, text: str) -> str:
        """A text attribute value cleaned and capped; one the SDK cut (at :func:`sdk_value_limit`)
        ends in a marker that does not claim to know how much was cut. JSON text within the cap
        that masking takes past it is cut inside its structure, so it stays JSON."""
        limit = self.max_value_length
        if len(text) <= limit:
            cleaned = self.clean_text(text, limit)
            if len(cleaned) == limit and text[:1] in _JSON_OPENERS and cleaned != text:
                return self._refit_masked_json(text, limit, cleaned)
            return cleaned
        cut_by_sdk = len(text) == sdk_value_limit(limit)
        return self.clean_text(text, limit, _CUT_SHORT if cut_by_sdk else None)

    def _refit_masked_json(self, text: str, limit: int, cleaned: str) -> str:
        """``text`` (within ``limit``) masked, and cut inside its structure if masking took it past
        the limit (``cleaned`` is what cutting it as text gave: the answer for text not JSON)."""
        masked = _encodable(self.redactor(text))
        if len(masked) <= limit:
            return masked
        try:
            document = json.loads(masked)
        except ValueError:
            return cleaned
        return _BoundedWalk(self).json_text(document, 0)

    def _clean_bytes(self, key: str, value: bytes) -> AttributeValue:
        """Bytes as they are, unless secret-named or holding text with a secret (then that text,
        cleaned)."""
        if value and self.is_secret_named(key):
            return REDACTED
        limit = self.max_value_length
        text = _text_of(value, limit)  # what is kept and the margin past it: a secret the cut goes through
        if self.redactor(text) == text:
            return value[:limit]
        return self.clean_text(text, limit)

    def _clean_structured(self, key: str, value: object, depth: int) -> object:
        if value is None:
            return None
        if isinstance(value, str | int | float | bytes):
            return self.clean_attribute(key, value)
        if isinstance(value, Mapping | list | tuple):
            if value and self.is_secret_named(key):  # an item holding credentials: masked whole
                return REDACTED
            if depth >= _MAX_STRUCTURE_DEPTH or len(value) > _MAX_STRUCTURE_ITEMS:
                # as JSON text the walk writes (NaN as text, keys naming a secret masked), cleaned
                return self.clean_text(_BoundedWalk(self).json_text(value, 0), self.max_value_length)
            if isinstance(value, Mapping):
                return {
                    self._clean_key(str(k)): self._clean_structured(_name_of_key(k), v, depth + 1)
                    for k, v in value.items()
                }
            items: list[object] = []
            for item in value:
                if self._is_secret_pair(item):  # an item of a list of pairs: headers, environment entries
                    items.append([self._clean_structured(key, item[0], depth + 2), REDACTED])
                else:
                    items.append(self._clean_structured(key, item, depth + 1))
            if all(isinstance(item, str) for item in value):  # `log.info(sys.argv)`: as an attribute's
                return list(_masked_arguments(value, cast(list[str], items)))
            return items
        return self.clean_text(safe_str(value), self.max_value_length)

    def clean_body(self, body: AnyValue) -> AnyValue:
        """A log record's body: text cleaned as text is; a structure (mapping, sequence, bytes) as
        an attribute value is, keys included (a secret-named key's value is masked whole)."""
        if isinstance(body, str):
            return self.clean_text(body)
        if isinstance(body, Mapping | list | tuple | bytes):
            return self._clean_structured("", body, 0)  # type: ignore[return-value]
        return body

    def is_secret_named(self, key: str) -> bool:
        """Whether ``key`` (an attribute's, a mapping key inside a value, a pair's name) names a
        secret, so that its whole value is masked: :attr:`secret_keys` finds it, or its last name
        ends in a secret's name (:func:`~kaos_otel._secrets.key_names_a_secret`: ``SECRET_KEY_BASE``,
        ``MYSQL_PWD``; not ``password_attempts``)."""
        secret = self._secret_named.get(key)
        if secret is None:
            secret = self.secret_keys.search(key) is not None or key_names_a_secret(key)
            remember(self._secret_named, key, secret)
        return secret

    def _is_secret_pair(self, item: object) -> TypeGuard[list[object] | tuple[object, ...]]:
        """Whether ``item`` (of a list) is a (name, value) pair whose name is a key's name that
        names a secret, and whose value is not empty."""
        if not isinstance(item, list | tuple) or len(item) != 2 or _is_empty(item[1]):
            return False
        name = item[0]
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        return (
            isinstance(name, str)
            and _NAME_LIKE.fullmatch(name) is not None
            and (self.is_secret_named(name) or names_a_secret(name))  # as the key of key=value text
        )

    def clean_attributes(self, attributes: Mapping[str, AttributeValue] | None) -> dict[str, AttributeValue]:
        """Clean every value of an attribute mapping."""
        if not attributes:
            return {}
        if isinstance(attributes, _COPYABLE_MAPPINGS):
            # a plain dict, read at C speed: iterating the SDK's locked mapping through its views
            # cost about 1.5 us per attribute on the export thread
            attributes = attributes.copy()
        keys, items = self._cleaned_keys, self._cleaned_items
        cleaned: dict[str, AttributeValue] = {}
        for key, value in attributes.items():
            if type(value) is str and len(value) <= CACHED_TEXT_LENGTH:
                # one lookup for the key and the value (a third of the export thread's cleaning
                # time per span went to cleaning them apart)
                item = (key, value)
                known = items.get(item) or remember(items, item, self._clean_item(key, value))
                cleaned[known[0]] = known[1]
            else:
                cleaned[keys.get(key) or self._clean_key(key)] = self.clean_attribute(key, value)
        return cleaned

    def _clean_item(self, key: str, value: str) -> tuple[str, str]:
        """An attribute with a text value: its cleaned key and value."""
        return self._cleaned_keys.get(key) or self._clean_key(key), self._clean_text_attribute(key, value)

    def redact_resource(self, attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
        """Resource attributes with secrets masked, sizes kept: the SDK caps no resource value."""
        return {
            self.redactor(key): self._redact_resource_value(key, value) for key, value in attributes.items()
        }

    def _redact_resource_value(self, key: str, value: AttributeValue) -> AttributeValue:
        if isinstance(value, str):
            return REDACTED if value and self.is_secret_named(key) else self.redactor(value)
        if isinstance(value, Sequence) and value and isinstance(value[0], str):  # process.command_args
            return _masked_arguments(value, [self.redactor(str(item)) for item in value])
        return value

    def _clean_key(self, key: str) -> str:
        """An attribute key with secrets masked (a cache keyed by a credential, say); keys repeat,
        so each is scanned once while it stays in :attr:`_cleaned_keys`."""
        return remember(self._cleaned_keys, key, _encodable(self.redactor(key)))

    def exception_attributes(self, exc: BaseException) -> dict[str, AttributeValue]:
        """``exception.*`` attributes; the message only when content capture is on (otherwise no
        ``exception.message``, and the stack trace keeps its frames and the exception type, without
        the message)."""
        exc_type = type(exc)
        attributes: dict[str, AttributeValue] = {"exception.type": _qualified_name(exc_type)}
        if self.capture.enabled:
            attributes["exception.message"] = self.bound_size(safe_str(exc), self.max_value_length)
            stack = "".join(traceback.format_exception(exc_type, exc, exc.__traceback__))
        else:
            stack = _stack_without_messages(exc)
        attributes["exception.stacktrace"] = self.bound_size(stack, self.max_value_length)
        return attributes  # no exception.escaped: deprecated by the conventions


def _masked_arguments(arguments: Sequence[object], cleaned: list[str]) -> tuple[str, ...]:
    """``cleaned`` (the strings of ``arguments``, cleaned one by one), with the arguments that
    follow a flag naming a secret masked (``--password x``: the flag and its value are two)."""
    strings = [argument for argument in arguments if isinstance(argument, str)]
    if len(strings) == len(arguments) > 1:
        for index in secret_arguments(strings):
            cleaned[index] = REDACTED
    return tuple(cleaned)


def policy_from_env(capture_content: bool | str | None = None) -> ContentPolicy:
    """The content policy the environment asks for, as a manager reads it: capture from
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (or ``capture_content``), the cap from
    the attribute value length limits."""
    capture, cap = content_from_env(capture_content)
    return ContentPolicy(capture, max_value_length=cap)


_DIRECT_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_DURING_HANDLING = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _qualified_name(exc_type: type[BaseException]) -> str:
    """``ValueError``, ``httpx.ConnectError``: the type as Python's traceback names it."""
    module, name = exc_type.__module__, exc_type.__qualname__
    return name if module in ("builtins", "__main__") else f"{module}.{name}"


_MAX_GROUP_WIDTH = 15
_MAX_GROUP_DEPTH = 10
"""How many members of an exception group, and how many groups deep, a stack trace shows: Python's
own traceback limits (an ``asyncio.TaskGroup`` of 2,000 failed tasks is otherwise seconds of
formatting on the request's thread)."""


def _stack_without_messages(exc: BaseException, seen: set[int] | None = None, depth: int = 0) -> str:
    """The traceback as Python prints it, chained causes and the members of exception groups
    included (within Python's limits: 15 members, 10 groups deep), with every exception's message
    left out (a message may be content): frames and types only."""
    blocks: list[str] = []  # from ``exc`` back to the first cause, reversed below
    current: BaseException | None = exc
    seen = set() if seen is None else seen
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = "".join(traceback.format_tb(current.__traceback__))
        header = "Traceback (most recent call last):\n" if frames else ""
        block = header + frames + _qualified_name(type(current)) + "\n"
        if isinstance(current, BaseExceptionGroup):  # an asyncio.TaskGroup's failures, say
            block += _group_members(current, seen, depth + 1)
        blocks.append(block)
        if current.__cause__ is not None:
            blocks.append(_DIRECT_CAUSE)
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            blocks.append(_DURING_HANDLING)
            current = current.__context__
        else:
            current = None
    if blocks and blocks[-1] in (_DIRECT_CAUSE, _DURING_HANDLING):  # a cycle ended the walk
        blocks.pop()
    return "".join(reversed(blocks))


def _group_members(group: BaseExceptionGroup[BaseException], seen: set[int], depth: int) -> str:
    """The members' stack traces, as :func:`_stack_without_messages` shows them inside ``group``."""
    if depth > _MAX_GROUP_DEPTH:
        return f"+---------------- ... ----------------\n| ... (max_group_depth is {_MAX_GROUP_DEPTH})\n"
    text = ""
    for number, member in enumerate(group.exceptions[:_MAX_GROUP_WIDTH], 1):
        if id(member) not in seen:
            member_stack = _stack_without_messages(member, seen, depth)
            text += f"+---------------- {number} ----------------\n"
            text += "".join(f"| {line}" for line in member_stack.splitlines(keepends=True))
    if (more := len(group.exceptions) - _MAX_GROUP_WIDTH) > 0:
        text += f"+---------------- ... ----------------\n| and {more} more exceptions\n"
    return text


def to_attribute_value(value: object, policy: ContentPolicy) -> AttributeValue:
    """Make any value exportable: primitives pass, containers become JSON, the rest ``str``; a
    value over the cap is cleaned as it is cut (a secret the cut goes through is masked whole).

    A container is walked only as far as its JSON text can be kept (:class:`_BoundedWalk`): a
    long conversation history costs what the cap keeps, not its whole size."""
    if isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        return _exportable_int(value)
    if isinstance(value, str):
        return policy.bound_size(value, policy.max_value_length)
    if not isinstance(value, _WALKED) or _made_text(value, policy.max_value_length):
        # a UUID, a path, an enum, a small set: its plain text, not a JSON string literal in quotes
        return policy.bound_size(safe_str(value), policy.max_value_length)
    if (
        isinstance(value, (list, tuple))
        and len(value) <= _MAX_STRUCTURE_ITEMS  # longer ones: JSON text, walked as far as the cap keeps
        and all(isinstance(item, (str, bool, int, float)) for item in value)
        and sum(isinstance(item, str) and len(item) > policy.max_value_length for item in value) <= _MAX_SCANS
    ):
        kinds = {type(item) for item in value}
        if kinds == {int} and any(_exportable_int(item) is not item for item in value):
            return tuple(safe_str(item) for item in value)  # an integer beyond 64 bits: all as text
        if len(kinds) <= 1:
            return tuple(
                policy.bound_size(item, policy.max_value_length) if isinstance(item, str) else item
                for item in value
            )
    try:
        return _BoundedWalk(policy).json_text(value, 0)
    except Exception:  # any value must become an attribute: never raise into the caller
        return policy.bound_size(safe_str(value), policy.max_value_length)


def _exportable_int(value: int) -> int | str:
    """``value`` if OTLP can carry it (64 bits), else its text."""
    return value if -(2**63) <= value < 2**63 else safe_str(value)


def to_log_value(value: object, policy: ContentPolicy) -> AnyValue:
    """A structured value for a log record (OTLP ``AnyValue``): mappings and sequences stay
    structures, strings and bytes are capped as attribute values are, integers beyond 64 bits and
    other objects become text. A structure deeper than the cleaning layer walks becomes capped JSON
    text; a longer one keeps as many items as it walks (255, then ``"..."``): the GenAI event's
    messages stay structured, as the conventions ask. At most 10,000 values, and keys and strings
    of the cap's length in all, are kept (the rest is ``"..."``), a structure within itself is
    ``"<cycle>"``. Secrets are masked on export, as in any log record."""
    return _BoundedWalk(policy).convert(value, 0, None)


_MAX_WALKED_VALUES = 10_000
"""Values and containers one walk keeps; the rest is a marker (a list that holds the same list
many times would otherwise grow without bound)."""

_MAX_FLATTENED_DEPTH = 64
"""How deep a structure turned into JSON text is followed (then a marker)."""

_MORE = "..."
"""What stands for the values a walk did not keep."""

_MAX_SCANS = 16
"""Strings one walk cuts, each scanned for secrets as it is cut; the next are markers."""

_MAX_JSON_INT_BITS = 4096
"""Integers up to this size (about 1,230 digits) stay numbers in JSON text; larger ones become
text (Python refuses to print integers past 4,300 digits)."""

_JSON_OPENERS = ("{", "[")
"""How JSON text of a structure begins."""

_CUT_SHORT = "...[truncated]"
"""The end of a string cut inside JSON text: how much was left is not known."""

_MORE_JSON = json.dumps(_MORE)
"""JSON text that stands for a value none of which fits."""

_REFITS = 4
"""Walks again over what a walk kept, each with less room, before JSON text that does not fit
the cap is given up for :data:`_MORE_JSON`."""


class _BoundedWalk:
    """One walk over a value that stops where its result stops being kept: after
    :data:`_MAX_WALKED_VALUES` values, after :data:`_MAX_SCANS` strings cut (each cut is scanned
    for secrets), and once its text would pass the cap: for a structure becoming JSON text, its
    text; for one staying a structure, its keys and strings (the string that reaches the cap is
    cut there)."""

    __slots__ = ("_budget", "_characters", "_limit", "_on_path", "_policy", "_scans")

    def __init__(self, policy: ContentPolicy) -> None:
        self._policy = policy
        self._limit = policy.max_value_length
        self._characters = self._limit  # of a structure staying one
        self._budget = _MAX_WALKED_VALUES
        self._scans = _MAX_SCANS
        self._on_path: set[int] = set()

    def json_text(self, item: object, depth: int) -> str:
        """``item`` as JSON text no longer than the cap (only what the cap keeps is walked), and
        valid JSON however it is cut (the GenAI conventions' content attributes are JSON): a string
        the cap cuts ends in ``...[truncated]``, the items a cut leaves out are one ``"..."``."""
        room = self._limit
        left = [room]
        flattened = self.convert(item, depth, left)
        text = json.dumps(flattened, default=safe_str, ensure_ascii=False)
        for _ in range(_REFITS):
            if len(text) <= self._limit:
                break
            # The walk's count falls short of the text by escapes and closing brackets: what it
            # kept is walked again with less room than it counted, by the excess or in proportion
            # (a string of control characters is six times as long escaped), whichever keeps
            # more; it is already cut and cleaned: cheap.
            used = room - max(left[0], 0)  # what the walk counted of the room it was given
            excess = len(text) - self._limit
            room = min(used - 1, max(used - excess, used * self._limit // len(text)))
            if room <= 0:
                break
            spent, self._budget = self._budget, _MAX_WALKED_VALUES  # what was kept, not walked yet
            left = [room]
            flattened = self.convert(flattened, depth, left)
            self._budget = spent
            text = json.dumps(flattened, default=safe_str, ensure_ascii=False)
        if len(text) <= self._limit:
            return text
        return _MORE_JSON if len(_MORE_JSON) <= self._limit else ""

    def convert(self, item: object, depth: int, room: list[int] | None) -> AnyValue:
        """``item`` bounded; ``room``: for a structure becoming text, the characters it may still
        take (every value, key and number takes its share)."""
        self._budget -= 1
        if self._spent(room) or (room is not None and depth >= _MAX_FLATTENED_DEPTH):
            return _MORE
        if item is None or isinstance(item, bool):
            self._take(room, 7)
            return item
        if isinstance(item, float):
            if room is not None:
                self._take(room, len(safe_str(item)) + 2)
                if not math.isfinite(item):  # JSON has no NaN or Infinity: their names, as text
                    return json.dumps(item)
            return item
        if isinstance(item, int):
            if room is None:
                return _exportable_int(item)
            if item.bit_length() <= _MAX_JSON_INT_BITS:  # a JSON number, as json.dumps writes it
                self._take(room, int(item.bit_length() * 0.30103) + 3)  # its digits, sign, separator
                return item
        if isinstance(item, str | bytes) or not isinstance(item, _WALKED) or _made_text(item, self._limit):
            if room is None:
                cap = min(self._limit, self._characters)  # what the structure may still take
                if isinstance(item, bytes) and len(item) <= cap:
                    self._characters -= len(item)
                    return item
                return self._counted(self._cleaned(_text_of(item, self._limit), cap, None))
            return self._cut_to_room(_text_of(item, min(self._limit, room[0])), room)
        if id(item) in self._on_path:
            return "<cycle>"
        kept: int | None = None  # the items a structure staying one keeps, when not all
        if room is None:
            try:
                deep = depth >= _MAX_STRUCTURE_DEPTH
                if not deep and len(item) > _MAX_STRUCTURE_ITEMS:
                    # as many as the cleaning layer walks, the marker included: still a structure
                    # (the GenAI event's messages must be one, however many)
                    kept = _MAX_STRUCTURE_ITEMS - 1
            except Exception:  # a __len__ that raises
                return f"<unreadable {type(item).__name__}>"
            if deep:
                return self._counted(self.json_text(item, depth))  # what the cleaning layer would not walk
        self._on_path.add(id(item))
        try:
            if isinstance(item, Mapping):
                mapping: dict[str, AnyValue] = {}
                for key, member in item.items() if kept is None else islice(item.items(), kept):
                    if self._spent(room):
                        mapping[_MORE] = _MORE
                        break
                    full = safe_str(key) if room is None and not isinstance(key, bytes) else _key_text(key)
                    # named a secret (by its whole name, before any cut; a tuple key by its last
                    # part): masked whole, whatever it holds, as the export layer masks a structure
                    secret = not _is_empty(member) and self._policy.is_secret_named(
                        _name_of_key(key) if isinstance(key, tuple) else full
                    )
                    if room is None:
                        name = self._counted(self._cleaned(full, self._limit, ""))
                        mapping[name] = REDACTED if secret else self.convert(member, depth + 1, room)
                    else:
                        name = self._cut_to_room(full, room)
                        mapping[name] = (
                            self._cut_to_room(REDACTED, room)
                            if secret
                            else self.convert(member, depth + 1, room)
                        )
                else:
                    if kept is not None:
                        mapping[_MORE] = _MORE
                return mapping
            members: list[AnyValue] = []
            for member in item if kept is None else islice(item, kept):
                if self._spent(room):
                    members.append(_MORE)
                    break
                if room is not None and self._policy._is_secret_pair(member):
                    # becoming text, where the export layer sees no pair: masked here
                    members.append(
                        [self.convert(member[0], depth + 2, room), self._cut_to_room(REDACTED, room)]
                    )
                else:
                    members.append(self.convert(member, depth + 1, room))
            else:
                if kept is not None:
                    members.append(_MORE)
            return members
        except Exception:  # a container that cannot be read (its items() or __len__ raises)
            return f"<unreadable {type(item).__name__}>"
        finally:
            self._on_path.discard(id(item))

    def _cut_to_room(self, text: str, room: list[int]) -> str:
        """``text`` as far as the room and the cap keep it, cleaned as it is cut (a secret the cut
        goes through is masked whole), ending in ``...[truncated]`` (inside the string: the JSON
        text stays valid). A cut string takes all the room it was given, so a walk cuts (and
        scans) few of them."""
        cap = min(self._limit, room[0])
        if len(text) <= cap:
            self._take(room, len(text) + 4)
            return text
        self._take(room, cap + 4)
        if cap <= len(_CUT_SHORT):  # a stub ("u" of "user") would say less than the marker
            return _MORE
        return self._cleaned(text, cap, _CUT_SHORT)

    def _cleaned(self, text: str, cap: int, marker: str | None) -> str:
        """``text`` if within ``cap``, else cleaned as it is cut; past the walk's scan budget, a
        marker in its place (a thousand long strings must not cost a thousand scans)."""
        if len(text) <= cap:
            return text
        self._scans -= 1
        if self._scans < 0:
            return _MORE[:cap]
        return self._policy.clean_text(text, cap, marker)

    @staticmethod
    def _take(room: list[int] | None, characters: int) -> None:
        """Count ``characters`` of JSON text against ``room`` (when becoming text)."""
        if room is not None:
            room[0] -= characters

    def _counted(self, text: str) -> str:
        """``text``, counted against the characters a structure staying one may take."""
        self._characters -= len(text)
        return text

    def _spent(self, room: list[int] | None) -> bool:
        return self._budget < 0 or (self._characters <= 0 if room is None else room[0] <= 0)


_TEXT_COLLECTIONS = (Set, deque, ValuesView)
"""Collections exported as the text ``str()`` makes of them (``{1, 2}``), unless too long for it:
sets, deques and dict views (``keys()`` and ``items()`` are sets)."""

_WALKED = (dict, list, tuple, Mapping, *_TEXT_COLLECTIONS)
"""What may be walked item by item (the concrete types first: they are checked fastest)."""


def _made_text(value: Collection[object], cap: int) -> bool:
    """Whether ``value`` is exported as its text, not walked: a collection of
    :data:`_TEXT_COLLECTIONS` whose text is short to make (at most 256 numbers, or strings and
    bytes within ``cap``). A longer one, or one of larger items, is walked as a list: a set of
    two million numbers would cost a second."""
    try:
        return (
            isinstance(value, _TEXT_COLLECTIONS)
            and len(value) <= _MAX_STRUCTURE_ITEMS
            and all(_short_scalar(item, cap) for item in value)
        )
    except Exception:  # a __len__ or __iter__ that raises: its text is tried, as for any object
        return True


def _short_scalar(item: object, cap: int) -> bool:
    if item is None or isinstance(item, bool | int | float):
        return True
    return isinstance(item, str | bytes) and len(item) <= cap


def _text_of(item: object, cap: int) -> str:
    """A value that is no structure as text: bytes as far as ``cap`` and the redaction margin keep
    them (decoded, so that a secret in them is recognised), anything else as ``str()``."""
    if isinstance(item, bytes):
        return item[: cap + REDACTION_MARGIN].decode("utf-8", "replace")
    return item if isinstance(item, str) else safe_str(item)


def _is_empty(value: object) -> bool:
    """``None`` or an empty string, bytes or container: nothing under a secret-named key to mask."""
    return value is None or (isinstance(value, str | bytes | Mapping | list | tuple) and not len(value))


def _name_of_key(key: object) -> str:
    """The name a mapping key gives its value: a tuple key's last part (``("db", "password")``),
    bytes decoded, anything else as its text."""
    if isinstance(key, tuple) and key:
        key = key[-1]
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else safe_str(key)


def _key_text(key: object) -> str:
    """A mapping key as ``json.dumps`` writes one (``None`` is ``null``, ``True`` is ``true``, a
    number its JSON text), bytes decoded, any other key as its text."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("utf-8", "replace")
    if key is None or isinstance(key, bool | int | float):
        try:
            return json.dumps(key)
        except ValueError:  # an integer too long to print
            return safe_str(key)
    return safe_str(key)


def safe_str(value: object) -> str:
    """``str(value)``, or a placeholder naming its type when ``str()`` raises."""
    if type(value) is str:
        return value
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def to_attributes(
    attributes: Mapping[str, object] | None, policy: ContentPolicy
) -> dict[str, AttributeValue]:
    """Convert a mapping of arbitrary values into exportable attributes (``None`` values dropped);
    a value that is not a mapping is logged and gives none."""
    if attributes is None:
        return {}
    if type(attributes) is not dict and not isinstance(attributes, Mapping):  # before its truth (an array's)
        internal_error("span attributes", TypeError(f"not attributes: a {type(attributes).__qualname__}"))
        return {}
    if not attributes:
        return {}
    limit = policy.max_value_length
    converted: dict[str, AttributeValue] = {}
    for key, value in attributes.items():
        if type(key) is not str:  # its text, which never raises (an object whose str() fails)
            key = safe_str(key)
        # Plain strings and numbers, nearly every value on the request path, take no function call.
        if type(value) is str:
            converted[key] = value if len(value) <= limit else policy.bound_size(value, limit)
        elif (
            type(value) is float or type(value) is bool or (type(value) is int and -(2**63) <= value < 2**63)
        ):
            converted[key] = value  # a larger integer: text, by to_attribute_value
        elif type(value) is tuple and value and _short_texts(value, limit):  # finish reasons...
            converted[key] = value  # what to_attribute_value would rebuild, item by item
        elif value is not None:
            converted[key] = to_attribute_value(value, policy)
    return converted


def _short_texts(values: tuple[object, ...], limit: int) -> bool:
    """Whether every item is a plain ``str`` within ``limit`` (the tuple is then exported as it is)."""
    for item in values:  # noqa: SIM110 (all() over a generator costs more per call)
        if type(item) is not str or len(item) > limit:
            return False
    return True
