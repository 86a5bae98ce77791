"""Shared pytest fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kaos_otel.receiver import OtlpReceiver


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A started in-process OTLP receiver (gRPC and HTTP/protobuf), stopped after the test."""
    with OtlpReceiver() as receiver:
        yield receiver
