"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from kaos_otel import KaosOtelManager, _internal_log
from kaos_otel.receiver import OtlpReceiver

FAST_MODULES = frozenset(
    {
        "test_agent_config.py",
        "test_catalog.py",
        "test_config_parity.py",
        "test_content_policy.py",
        "test_content_safety_layer.py",
        "test_dashboards.py",
        "test_domain_spans.py",
        "test_propagation.py",
        "test_receiver.py",
        "test_spans.py",
        "test_w3c_trace_context.py",
    }
)
"""Modules in the quick subset (``python3 -m pytest -m fast``) as a whole: in-process only, no
service processes, collector, Prometheus or Mem0, no deadline waits. Other modules mark single
tests with ``@pytest.mark.fast``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of :data:`FAST_MODULES` ``fast``."""
    for item in items:
        if item.path.name in FAST_MODULES:
            item.add_marker(pytest.mark.fast)


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A started in-process OTLP receiver (gRPC and HTTP/protobuf), stopped after the test."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def module_receiver() -> Iterator[OtlpReceiver]:
    """One OTLP receiver for every test of a module (for modules that start processes once)."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def unsaid_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """kaos-otel's once-per-process notices as if none had been logged yet in this process."""
    monkeypatch.setattr(_internal_log, "_last_logged", {})


@pytest.fixture(autouse=True)
def clean_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``OTEL_*`` or ``KAOS_OTEL_*`` variable of the process reaches a test (the SDK reads them)."""
    for name in list(os.environ):
        if name.startswith(("OTEL_", "KAOS_OTEL_")):
            monkeypatch.delenv(name)


def set_environment(monkeypatch: pytest.MonkeyPatch, environ: Mapping[str, str]) -> None:
    """Set (or, for empty values, remove) variables for the rest of the test."""
    for name, value in environ.items():
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def make_otel(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., KaosOtelManager]]:
    """Build private-provider managers exporting to ``otlp_receiver``; all shut down after the test.

    ``make_otel("grpc" | "http/protobuf", environ={...}, **kwargs)``: the variables are set in
    the process environment (for the rest of the test) over a fast-export default, since the
    SDK and the exporters read them there.
    """
    managers: list[KaosOtelManager] = []

    def make(
        protocol: str = "grpc", *, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> KaosOtelManager:
        endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
        env = {
            "OTEL_SERVICE_NAME": "kaos-test",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_BLRP_SCHEDULE_DELAY": "50",
            **(environ or {}),
        }
        set_environment(monkeypatch, env)
        manager = KaosOtelManager(global_providers=False, **kwargs)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.shutdown(timeout=5)
