"""Benchmarks of kaos-otel against the raw OpenTelemetry SDK: ``python -m bench [--quick] [--json]``."""
