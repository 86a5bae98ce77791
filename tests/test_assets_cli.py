"""Dashboards, alert rules and collector configurations ship in the wheel and the CLI hands them out.

The wheel is built from this checkout and unpacked into a directory that is put on ``PYTHONPATH``
alone (no editable install, no checkout on the path), and the commands run from another directory.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from test_collector import collector_binary
from test_dashboards import API_KEY, SIGNOZ_ALERTS, SIGNOZ_DASHBOARD, FakeSigNoz, _run_import

import kaos_otel
from kaos_otel.assets import ASSET_PATTERNS, COLLECTOR_PROFILES, asset_files, collector_config
from kaos_otel.cli import main as kaos_otel_main

REPO = Path(__file__).resolve().parents[1]


def build_wheel(source: Path, dist: Path) -> Path:
    """The wheel of the project at ``source``, built into ``dist``."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, "."],
        cwd=source, check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    (wheel,) = dist.glob("kaos_otel-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built as a wheel and unpacked: the directory to put on ``PYTHONPATH``."""
    wheel = build_wheel(REPO, tmp_path_factory.mktemp("dist"))
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def _run_installed(site: Path, cwd: Path, *words: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "kaos_otel", *words], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_the_wheel_carries_the_assets_and_the_commands_work_from_any_directory(
    installed_wheel: Path, tmp_path: Path
) -> None:
    assert (installed_wheel / "kaos_otel-0.1.0.dist-info" / "licenses" / "LICENSE").is_file()
    where = subprocess.run(
        [sys.executable, "-c", "import kaos_otel.assets as a; print(a.asset_root())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed_wheel)}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    assert where.stdout.strip() == str(installed_wheel / "kaos_otel" / "_data")

    done = _run_installed(installed_wheel, tmp_path, "dashboards", "export", "out/dashboards")
    assert done.returncode == 0, done.stderr
    exported = sorted(p.relative_to(tmp_path / "out" / "dashboards") for p in (tmp_path / "out").rglob("*.*"))
    shipped = sorted(p.relative_to(REPO / "dashboards") for p in asset_files("dashboards", REPO))
    assert exported == shipped
    assert Path("signoz/kaos-agents.v2.json") in exported
    assert Path("prometheus/kaos-alerts.rules.yml") in exported
    for name in exported:
        assert (tmp_path / "out" / "dashboards" / name).read_bytes() == (
            REPO / "dashboards" / name
        ).read_bytes()

    done = _run_installed(installed_wheel, tmp_path, "collector", "export", "collector")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "collector").iterdir()) == sorted(
        p.name for p in asset_files("collector", REPO)
    )

    done = _run_installed(installed_wheel, tmp_path, "collector", "config", "--profile", "jaeger")
    assert done.returncode == 0, done.stderr
    assert done.stdout == collector_config("jaeger")
    assert "${env:KAOS_TRACES_EXPORTERS:-[otlp_grpc/jaeger]}" in done.stdout

    done = _run_installed(installed_wheel, tmp_path, "--version")
    assert done.stdout.strip() == "kaos-otel 0.1.0"


@pytest.mark.parametrize("profile", sorted(COLLECTOR_PROFILES))
def test_every_collector_profile_is_a_valid_configuration(profile: str, tmp_path: Path) -> None:
    config = tmp_path / "otelcol.yaml"
    assert kaos_otel_main(["collector", "config", "--profile", profile, "--output", str(config)]) == 0
    validate = [str(collector_binary()), "validate", f"--config={config}"]
    done = subprocess.run(validate, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    # the same check refuses an exporter the configuration does not define
    traces = f"KAOS_TRACES_EXPORTERS:-{COLLECTOR_PROFILES[profile][0]}"
    assert traces in config.read_text()
    # the header's table of variables gives the same defaults
    for signal, exporters in zip(("traces", "metrics", "logs"), COLLECTOR_PROFILES[profile], strict=True):
        (documented,) = [line for line in config.read_text().splitlines() if f"list for {signal} " in line]
        assert documented.endswith(f" {exporters}"), documented
    config.write_text(config.read_text().replace(traces, "KAOS_TRACES_EXPORTERS:-[no_such_exporter]"))
    assert subprocess.run(validate, capture_output=True, timeout=60, check=False).returncode != 0


@pytest.mark.fast
@pytest.mark.parametrize("folder", sorted(ASSET_PATTERNS))
def test_export_overwrites_a_file_edited_since_only_with_force(
    folder: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exporting again changes nothing already there (an alert threshold tuned in DIR, say): it
    writes nothing and says which file, unless ``--force``; a copy still as shipped is no conflict."""
    export = [folder, "export", str(tmp_path)]
    assert kaos_otel_main(export) == 0
    assert kaos_otel_main(export) == 0  # the same files again
    edited, removed, *_ = sorted(path for path in tmp_path.rglob("*") if path.is_file())
    edited.write_text("tuned\n")
    removed.unlink()
    capsys.readouterr()
    assert kaos_otel_main(export) == 1
    assert f"kaos-otel: error: {edited} would be overwritten; nothing written (--force overwrites)" in (
        capsys.readouterr().err
    )
    assert (edited.read_text(), removed.exists()) == ("tuned\n", False)
    assert kaos_otel_main([*export, "--force"]) == 0
    shipped = {tmp_path / path.relative_to(REPO / folder): path for path in asset_files(folder, REPO)}
    assert all(copy.read_bytes() == source.read_bytes() for copy, source in shipped.items())


@pytest.mark.fast
def test_dashboards_import_asks_for_the_api_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SIGNOZ_API_KEY", raising=False)
    assert kaos_otel_main(["dashboards", "import", "--signoz", "http://127.0.0.1:9", "--dry-run"]) == 2
    assert "no API key: pass --api-key or set SIGNOZ_API_KEY" in capsys.readouterr().err


def test_dashboards_import_without_httpx_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The core install has no httpx: the command's options still parse, and it names the fix."""
    monkeypatch.setitem(sys.modules, "httpx", None)  # import httpx fails, as without it
    monkeypatch.delitem(sys.modules, "kaos_otel._signoz_import", raising=False)
    monkeypatch.delattr(kaos_otel, "_signoz_import", raising=False)
    words = ["dashboards", "import", "--signoz", "http://127.0.0.1:9", "--dry-run"]
    assert kaos_otel_main(words) == 1
    assert "dashboards import needs httpx" in capsys.readouterr().err


@pytest.mark.fast
def test_dashboards_import_fails_on_a_redirect_and_on_a_create_answer_without_an_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A URL that redirects (http to https, a wrong path prefix) or answers a create without the new
    item's id has created nothing: every item fails, none is reported created."""

    def redirect(request: httpx.Request) -> httpx.Response:
        return httpx.Response(308, headers={"Location": f"https://signoz.test{request.url.path}"})

    assert _run_import(redirect) == 1
    out, err = capsys.readouterr()
    assert "created" not in out
    assert "GET /api/v2/dashboards: HTTP 308 redirect to https://signoz.test/api/v2/dashboards" in err

    fake = FakeSigNoz()

    def create_answer_without_an_id(request: httpx.Request) -> httpx.Response:
        answer = fake(request)
        if request.method != "POST":
            return answer
        if "dashboards" in request.url.path:
            return httpx.Response(201)  # an empty body
        return httpx.Response(200, json={"status": "success"})

    assert _run_import(create_answer_without_an_id) == 1
    out, err = capsys.readouterr()
    assert "created" not in out
    assert err.count("the answer has no id of a created item") == 1 + len(SIGNOZ_ALERTS)
    assert f"{1 + len(SIGNOZ_ALERTS)} failure(s)" in err


@pytest.mark.fast
def test_dashboards_import_names_a_file_that_is_not_utf8_and_a_url_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Usage errors (exit status 2) in one line, not a traceback; neither gets as far as a request."""
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"alert": "caf\xe9"}')
    words = ["dashboards", "import", "--api-key", "k", "--signoz"]
    assert kaos_otel_main([*words, "http://127.0.0.1:9", str(latin1)]) == 2
    err = capsys.readouterr().err
    assert f"error: {latin1}: not UTF-8 text (invalid continuation byte at offset 14)" in err
    assert kaos_otel_main([*words, "http://localhost:8o80"]) == 2
    assert "error: the SigNoz URL 'http://localhost:8o80' is not valid" in capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize("url", ["localhost:8080", "ftp://signoz.test", ""])
def test_dashboards_import_refuses_a_url_that_is_not_http_before_any_request(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--signoz localhost:8080`` (no scheme) is a usage error naming the fix, not "cannot reach"."""
    assert kaos_otel_main(["dashboards", "import", "--api-key", "k", "--signoz", url]) == 2
    err = capsys.readouterr().err
    assert f"error: the SigNoz URL {url!r} is not valid: it starts with neither http:// nor https://" in err


@pytest.mark.fast
def test_dashboards_import_takes_a_pasted_api_key_and_never_shows_one_it_cannot_send(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A line break or space around the key (a file, a CRLF .env) is dropped; a key with a character
    an HTTP header cannot carry is a usage error naming where it is, not a traceback or a
    "cannot reach SigNoz" error quoting the key, and no request is sent."""
    fake = FakeSigNoz()
    assert _run_import(fake, key=f" {API_KEY}\r\n") == 0
    assert "created" in capsys.readouterr().out
    for key, said in (("t\u00e9st-key-1234", "a non-ASCII character at position 2 of 13"),
                      ("test\x1b-key-5678", "a control character at position 5 of 14")):  # fmt: skip
        fake = FakeSigNoz()
        assert _run_import(fake, key=key) == 2
        out, err = capsys.readouterr()
        assert f"error: the API key has {said}" in err and "Traceback" not in err
        assert key[-4:] not in out + err and fake.calls == []


@pytest.mark.fast
def test_dashboards_import_with_a_channel_sends_a_rule_whose_thresholds_are_not_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-edited rule with a threshold that is not an object gets SigNoz's reason, not a traceback."""
    rule = json.loads(SIGNOZ_ALERTS[0].read_text(encoding="utf-8"))
    rule["condition"]["thresholds"]["spec"].append("critical")
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(rule), encoding="utf-8")
    fake = FakeSigNoz()

    def refusing_the_rule(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(400, json={"status": "error", "error": {"message": "bad threshold"}})
        return fake(request)

    assert _run_import(refusing_the_rule, "--channel", "ops", str(path)) == 1
    assert "POST /api/v1/rules: HTTP 400: bad threshold" in capsys.readouterr().err


@pytest.mark.fast
def test_dashboards_import_at_a_web_server_that_is_not_signoz_fails_in_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """HTML pages (the URL of another server, a proxy's error page) are quoted as one line each."""
    page = "<!doctype html>\n<html>\n  <body>\n    <h1>Not \x1b[31mhere</h1>\n  </body>\n</html>\n"

    def web_server(request: httpx.Request) -> httpx.Response:
        status = 200 if request.url.path.startswith("/api/v2") else 404
        return httpx.Response(status, text=page, headers={"Content-Type": "text/html"})

    assert _run_import(web_server) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and err[-1] == "2 failure(s)"
    assert err[0].endswith(
        "non-JSON: <!doctype html> <html> <body> <h1>Not \\x1b[31mhere</h1> </body> </html>"
    )
    assert "HTTP 404 <!doctype html> <html>" in err[1]


IMPORT = ["dashboards", "import", "--signoz", "http://127.0.0.1:9", "--api-key", "k"]
SHOW = ["traces", "show", "telemetry.jsonl"]


@pytest.mark.fast
@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        (IMPORT, "--timeout", "nan"),
        (IMPORT, "--timeout", "-1"),
        (IMPORT, "--timeout", "0"),
        (SHOW, "--min-duration", "nan"),
        (SHOW, "--min-duration", "inf"),
        (SHOW, "--min-duration", "-1"),
    ],
)
def test_a_number_of_seconds_must_be_a_finite_one(
    command: list[str], option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error (exit status 2) before anything runs, not a traceback or a filter matching
    nothing: a timeout above 0, a minimum duration from 0 (``--min-duration 0``: every trace)."""
    with pytest.raises(SystemExit) as exited:
        kaos_otel_main([*command, option, value])
    assert exited.value.code == 2
    kind = "positive number" if option == "--timeout" else "number"
    assert f"argument {option}: {value!r} is not a {kind} of seconds" in capsys.readouterr().err


@pytest.mark.fast
def test_dashboards_import_creates_a_title_given_twice_once(capsys: pytest.CaptureFixture[str]) -> None:
    """The second copy counts as existing: skipped, or with --replace updated under the new id."""
    twice = [str(SIGNOZ_DASHBOARD), str(SIGNOZ_ALERTS[0])] * 2
    fake = FakeSigNoz()
    assert _run_import(fake, *twice) == 0
    assert [call for call in fake.calls if call[0] != "GET"] == [
        ("POST", "/api/v2/dashboards"),
        ("POST", "/api/v1/rules"),
    ]
    assert capsys.readouterr().out.count("skipped") == 2

    fake = FakeSigNoz()  # a dry run says what the run would do
    assert _run_import(fake, "--dry-run", *twice) == 0
    said = capsys.readouterr().out
    assert (said.count("would create"), said.count("exists, would skip")) == (1, 1)
    assert (said.count("(new): testRule passed"), said.count("(exists): testRule passed")) == (1, 1)

    fake = FakeSigNoz()
    assert _run_import(fake, "--replace", *twice) == 0
    (rule_id,) = re.findall(r"rule '.*': created \(id (\S+)\)", capsys.readouterr().out)
    assert [call for call in fake.calls if call[0] != "GET"] == [
        ("POST", "/api/v2/dashboards"),
        ("PUT", "/api/v2/dashboards/dash-1"),
        ("POST", "/api/v1/rules"),
        ("PUT", f"/api/v1/rules/{rule_id}"),
    ]


@pytest.mark.fast
def test_dashboards_import_imports_the_rules_into_a_signoz_without_v2_dashboards(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A SigNoz older than v2 dashboards answers their listing 404: that fails, the rules still go in."""
    fake = FakeSigNoz()

    def without_v2_dashboards(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/api/v2/dashboards"):
            return httpx.Response(404, text="404 page not found")
        return fake(request)

    assert _run_import(without_v2_dashboards) == 1
    out, err = capsys.readouterr()
    assert fake.calls.count(("POST", "/api/v1/rules")) == len(SIGNOZ_ALERTS)
    assert out.count("created") == len(SIGNOZ_ALERTS)
    assert "listing dashboards: GET /api/v2/dashboards: HTTP 404" in err and "1 failure(s)" in err


def docker_build_context(destination: Path) -> None:
    """What the Dockerfile's ``COPY`` lines put in its work directory, ``.dockerignore`` applied."""
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()]

    def is_ignored(relative: str) -> bool:
        return any(
            fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(relative, pattern.removeprefix("**/"))
            or relative.startswith(pattern.rstrip("/") + "/")
            for pattern in ignored
        )  # fmt: skip

    for line in (REPO / "Dockerfile").read_text().splitlines():
        words = line.split()
        if not words or words[0] != "COPY":
            continue
        *sources, target = words[1:]
        for source in sources:
            origin, folder = REPO / source, destination / target
            if origin.is_file():  # a file into a folder (``./``) or to a path
                copies = {origin: folder / source if target.endswith("/") else folder}
            else:  # a folder's contents into the target folder
                copies = {path: folder / path.relative_to(origin) for path in origin.rglob("*")}
            for path, copy in copies.items():
                relative = path.relative_to(REPO).as_posix()
                if path.is_file() and not is_ignored(relative):
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, copy)


@pytest.mark.timeout(300)
def test_the_docker_image_installs_the_assets_too(tmp_path: Path) -> None:
    """The image's ``pip install .`` runs on what the Dockerfile copies: its wheel carries every asset."""
    context = tmp_path / "app"
    docker_build_context(context)
    wheel = build_wheel(context, tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = {
        f"kaos_otel/_data/{path.relative_to(REPO).as_posix()}"
        for folder in ASSET_PATTERNS
        for path in asset_files(folder, REPO)
    }
    assert expected and expected <= names, sorted(expected - names)
