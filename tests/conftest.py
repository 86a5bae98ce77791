"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from kaos_otel import KaosOtelManager
from kaos_otel.receiver import OtlpReceiver


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
def make_otel(otlp_receiver: OtlpReceiver) -> Iterator[Callable[..., KaosOtelManager]]:
    """Build private-provider managers exporting to ``otlp_receiver``; all shut down after the test.

    ``make_otel("grpc" | "http/protobuf", environ={...}, **kwargs)``: the environment mapping is
    layered over a fast-export default (``os.environ`` is never read or written).
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
        manager = KaosOtelManager(global_providers=False, environ=env, **kwargs)
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.shutdown(timeout=5)
