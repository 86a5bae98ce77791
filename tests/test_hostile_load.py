"""A short run of ``bench/hostile_load.py``: hostile clients get their 413s and 400s, the agent keeps
answering ``/health`` and its memory and database stay far from what the unbounded agent reached
(6.2 GB, 1.09 GB). The 10-minute run is ``python -m bench.hostile_load``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.hostile_load import run_hostile_load

pytestmark = pytest.mark.timeout(300)


def test_a_short_hostile_load_is_refused_and_stays_bounded(tmp_path: Path) -> None:
    report = run_hostile_load(duration_s=8, clients=2, workdir=tmp_path)
    by_kind: dict[str, set[str]] = {}
    for kind_status in report.statuses:
        kind, status = kind_status.split(" ", 1)
        by_kind.setdefault(kind, set()).add(status)
    for kind, expected in (("huge-declared", "413"), ("huge-streamed", "413"), ("too-many", "413")):
        assert by_kind[kind] == {expected}, report.statuses
    assert by_kind["surrogate"] == {"400"} and by_kind["forged-session"] == {"400"}, report.statuses
    assert not [s for statuses in by_kind.values() for s in statuses if s.startswith("5")], report.statuses
    assert report.health_checks >= 1 and report.health_failures == 0
    assert report.max_rss_bytes < 1 << 30
    assert report.max_database_bytes < 64 << 20
