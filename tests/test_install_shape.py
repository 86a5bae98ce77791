"""The library installs and imports lean: no web framework, MCP, SQL or Mem0 with ``import kaos_otel``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_IMPORTED = ("fastapi", "starlette", "uvicorn", "mcp", "sqlalchemy", "mem0", "kaos_otel.receiver")
CORE_DISTRIBUTIONS = {
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-semantic-conventions",
}


def test_import_kaos_otel_loads_no_framework_nor_the_receiver() -> None:
    code = (
        "import sys, kaos_otel\n"
        f"print(','.join(m for m in {NOT_IMPORTED!r} if m in sys.modules))\n"
        "kaos_otel.KaosOtelManager(global_providers=False, bridge_logging=False).shutdown(1)\n"
        f"print(','.join(m for m in {NOT_IMPORTED!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["", ""], result.stdout


def test_core_dependencies_are_the_sdk_and_the_otlp_exporters_in_a_bounded_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {requirement.split(">")[0].split("<")[0].split("=")[0] for requirement in project["dependencies"]}
    assert names == CORE_DISTRIBUTIONS
    assert all("<" in requirement for requirement in project["dependencies"]), project["dependencies"]
    agent = " ".join(project["optional-dependencies"]["agent"])
    for needed in ("fastapi", "mcp", "uvicorn", "sqlalchemy"):
        assert needed in agent, agent
