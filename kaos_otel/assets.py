"""The dashboards, alert rules and collector configurations kaos-otel ships.

A wheel carries them as package data in ``kaos_otel/_data/`` (``setup.py`` copies them there at
build time from ``dashboards/`` and ``collector/``); a checkout or an editable install reads them
from those directories. Either way the paths below are relative to :func:`asset_root`.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "ASSET_PATTERNS",
    "COLLECTOR_PROFILES",
    "AssetsMissingError",
    "asset_files",
    "asset_root",
    "collector_config",
    "collector_files",
    "dashboard_files",
]

ASSET_PATTERNS: dict[str, tuple[str, ...]] = {
    "dashboards": ("signoz/*.v2.json", "signoz/alerts/*.json", "grafana/*.json", "prometheus/*.yml"),
    "collector": (
        "otelcol-config.yaml",
        "otelcol-agent.yaml",
        "otelcol-gateway.yaml",
        "builder-config.yaml",
        "jaeger-config.yaml",
        "prometheus.yml",
    ),
}
"""Per top-level folder, the glob patterns of the files that ship (build.py, tests and scripts stay)."""

_PACKAGED = Path(__file__).resolve().parent / "_data"
_CHECKOUT = Path(__file__).resolve().parent.parent


class AssetsMissingError(FileNotFoundError):
    """Neither the packaged copy nor a checkout's ``dashboards/`` and ``collector/`` exist."""


def asset_root() -> Path:
    """The directory holding ``dashboards/`` and ``collector/``: the package data, else the checkout."""
    for root in (_PACKAGED, _CHECKOUT):
        if all((root / folder).is_dir() for folder in ASSET_PATTERNS):
            return root
    raise AssetsMissingError(
        f"kaos-otel's dashboards and collector configurations are missing (looked in {_PACKAGED} and "
        f"{_CHECKOUT}); reinstall kaos-otel"
    )


def asset_files(folder: str, root: Path | None = None) -> list[Path]:
    """The shipped files of ``folder`` ("dashboards" or "collector") under ``root``, sorted."""
    base = (root or asset_root()) / folder
    return sorted({path for pattern in ASSET_PATTERNS[folder] for path in base.glob(pattern)})


def dashboard_files() -> list[Path]:
    """SigNoz dashboard and alert rules, Grafana dashboard, Prometheus rules and their tests."""
    return asset_files("dashboards")


def collector_files() -> list[Path]:
    """Collector configurations (single collector, agent and gateway tiers), builder manifest, Jaeger
    and Prometheus configurations."""
    return asset_files("collector")


COLLECTOR_PROFILES: dict[str, tuple[str, str, str]] = {
    "signoz": ("[otlp_grpc/signoz]", "[otlp_grpc/signoz, prometheus]", "[otlp_grpc/signoz]"),
    "jaeger": ("[otlp_grpc/jaeger]", "[prometheus]", "[debug]"),
    "prometheus": ("[debug]", "[prometheus]", "[debug]"),
    "otlp-http": ("[otlp_http/generic]", "[otlp_http/generic]", "[otlp_http/generic]"),
    "file": ("[file]", "[file]", "[file]"),
    "debug": ("[debug]", "[debug]", "[debug]"),
}
"""Default exporter lists (traces, metrics, logs) of ``otelcol-config.yaml`` per backend."""

_EXPORTER_LISTS = re.compile(r"\$\{env:KAOS_(TRACES|METRICS|LOGS)_EXPORTERS:-\[[^\]]*\]\}")
_DOCUMENTED_LISTS = re.compile(r"^(#   KAOS_(TRACES|METRICS|LOGS)_EXPORTERS .*?)\[[^\]]*\]$", re.MULTILINE)
"""The header's table of the variables, whose last column gives each list's default."""
_SIGNALS = ("TRACES", "METRICS", "LOGS")


def collector_config(profile: str = "signoz") -> str:
    """``otelcol-config.yaml`` whose default exporters are the ``profile``'s.

    The ``KAOS_*_EXPORTERS`` variables still override them, and every address still comes from
    the environment (see the file's header). Raises ``KeyError`` for an unknown profile.
    """
    lists = dict(zip(_SIGNALS, COLLECTOR_PROFILES[profile], strict=True))
    text = (asset_root() / "collector" / "otelcol-config.yaml").read_text(encoding="utf-8")
    found: set[str] = set()

    def substitute(match: re.Match[str]) -> str:
        found.add(match.group(1))
        return f"${{env:KAOS_{match.group(1)}_EXPORTERS:-{lists[match.group(1)]}}}"

    text = _EXPORTER_LISTS.sub(substitute, text)
    documented: set[str] = set()

    def document(match: re.Match[str]) -> str:
        documented.add(match.group(2))
        return match.group(1) + lists[match.group(2)]

    text = _DOCUMENTED_LISTS.sub(document, text)
    for where, signals in (("default", found), ("header line", documented)):
        if signals != set(_SIGNALS):  # the shipped file changed shape: say so rather than mislead
            missing = set(_SIGNALS) - signals
            raise ValueError(f"otelcol-config.yaml has no KAOS_*_EXPORTERS {where} for {missing}")
    header = f"# kaos-otel collector configuration, profile {profile!r} (kaos-otel collector config)\n"
    return header + text
