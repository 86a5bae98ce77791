"""docs/api.md is generated from the docstrings and current (``python3 docs/api_reference.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

GENERATOR = Path(__file__).resolve().parents[1] / "docs" / "api_reference.py"


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("kaos_api_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_api_md_is_generated_from_the_current_docstrings() -> None:
    generator = _generator()
    assert generator.main(["--check"]) == 0  # type: ignore[attr-defined]


def test_every_public_name_is_documented() -> None:
    text = (GENERATOR.parent / "api.md").read_text(encoding="utf-8")
    for name in ("KaosOtelManager", "instrument_app", "inject_headers", "submit_in_context", "OtlpReceiver"):
        assert f"`{name}" in text
    assert "(undocumented)" not in text
