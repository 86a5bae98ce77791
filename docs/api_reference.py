"""Generate docs/api.md, the public API reference, from the docstrings.

    python3 docs/api_reference.py           # rewrite docs/api.md
    python3 docs/api_reference.py --check   # exit 1 if docs/api.md is not what the code says

The public API is every name in the ``__all__`` of the modules below (or, without one, every
public function and class they define); each gets its signature and docstring, and a class its
public methods and properties.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import inspect
import re
import sys
from pathlib import Path
from types import UnionType
from typing import Any, ParamSpec, TypeVar, TypeVarTuple

API_MD = Path(__file__).resolve().parent / "api.md"
MODULES = (
    "kaos_otel",
    "kaos_otel.propagation",
    "kaos_otel.context",
    "kaos_otel.instrumentation.fastapi",
    "kaos_otel.instrumentation.asgi",
    "kaos_otel.instrumentation.mem0",
    "kaos_otel.receiver",
    "kaos_otel.assets",
)
HEADER = """# API reference

Generated from the docstrings by `python3 docs/api_reference.py` (the tests check it is current).
Task-oriented examples are in the [guide](guide.md); metric and attribute names in
[metrics.md](metrics.md) and `kaos-otel catalog`.
"""


class _Raw:
    """Shows a string annotation or a default as written, not as a quoted repr."""

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


def _plain(value: Any) -> Any:
    if value is inspect.Parameter.empty:
        return value
    if isinstance(value, str):
        return _Raw(value)
    return _Raw(getattr(value, "__qualname__", None) or repr(value))


def _default(value: Any) -> Any:
    if value is inspect.Parameter.empty:
        return value
    if callable(value) and hasattr(value, "__qualname__"):
        return _Raw(value.__qualname__)
    if isinstance(value, enum.Enum):
        return _Raw(f"{type(value).__name__}.{value.name}")
    if isinstance(value, re.Pattern):  # its repr stops at 200 characters
        return _Raw(f"re.compile({value.pattern!r})")
    return value


def signature(obj: Any) -> str:
    """``(params) -> return`` with annotations as written in the source."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [
        p.replace(annotation=_plain(p.annotation), default=_default(p.default))
        for p in sig.parameters.values()
    ]
    return str(sig.replace(parameters=params, return_annotation=_plain(sig.return_annotation)))


def _doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "(undocumented)"


def _members(cls: type) -> list[str]:
    """The public members ``cls`` defines, and those it gets from private bases of kaos-otel's (a
    reader of the reference sees them nowhere else)."""
    lines: list[str] = []
    private_bases = [
        base
        for base in cls.__mro__[1:]
        if base.__name__.startswith("_") and base.__module__.startswith("kaos_otel")
    ]
    seen: set[str] = set()
    for name, member in [item for owner in (cls, *private_bases) for item in vars(owner).items()]:
        if name in seen:
            continue
        seen.add(name)
        if name.startswith("_") or not (callable(member) or isinstance(member, property | classmethod)):
            continue
        if isinstance(member, property):
            lines.append(f"- `{name}` (property): {_first_paragraph(member)}")
        else:
            function = member.__func__ if isinstance(member, classmethod | staticmethod) else member
            lines.append(f"- `{name}{signature(function)}`: {_first_paragraph(function)}")
    return lines


def _first_paragraph(obj: Any) -> str:
    return " ".join(_doc(obj).split("\n\n", 1)[0].split())


def _entry(module: str, name: str, obj: Any) -> list[str]:
    if inspect.isclass(obj):
        if issubclass(obj, enum.Enum):
            values = ", ".join(f"`{m.name}` = `{m.value!r}`" for m in obj)
            return [f"### `{name}` (enum)", "", _doc(obj), "", f"Members: {values}", ""]
        init = "" if obj.__init__ is object.__init__ else signature(obj)
        return [f"### class `{name}{init}`", "", _doc(obj), "", *_members(obj), ""]
    if inspect.isroutine(obj):
        return [f"### `{name}{signature(obj)}`", "", _doc(obj), ""]
    shown = repr(obj).replace("typing.", "")
    kind = "type" if "typing" in type(obj).__module__ or isinstance(obj, type | UnionType) else "value"
    return [f"### `{name}`", "", f"A {kind} of `{module}`: `{shown}`", ""]


def _defined_in(module: Any) -> list[str]:
    """Public names a module without ``__all__`` defines itself (not the ones it imports)."""
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and getattr(obj, "__module__", None) == module.__name__
        and not isinstance(obj, TypeVar | ParamSpec | TypeVarTuple)
    ]


def render() -> str:
    """The whole reference page."""
    lines = [HEADER]
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", _first_paragraph(module), ""]
        for name in sorted(getattr(module, "__all__", None) or _defined_in(module)):
            lines += _entry(module_name, name, getattr(module, name))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/api.md, or with ``--check`` compare it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if API_MD.read_text(encoding="utf-8") != text:
            print("docs/api.md is out of date: run python3 docs/api_reference.py", file=sys.stderr)
            return 1
        return 0
    API_MD.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
