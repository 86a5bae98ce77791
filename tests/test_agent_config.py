"""Agent configuration: flags win over environment variables, and bad settings fail clearly."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from instrumented_agent import cli
from instrumented_agent.config import (
    ENV_MAX_STEPS,
    ENV_MCP_SERVERS,
    ENV_MODEL_BASE_URL,
    ENV_NAME,
    ENV_SUB_AGENTS,
    ConfigError,
    add_agent_arguments,
    agent_config_from_args,
    parse_sub_agents,
)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    return parser.parse_args(argv)


ENV = {
    ENV_NAME: "researcher",
    ENV_MODEL_BASE_URL: "http://model:8000/v1",
    ENV_MCP_SERVERS: "http://echo:8000/mcp, http://calc:8000/mcp",
    ENV_SUB_AGENTS: "analyst=http://analyst:8000",
    ENV_MAX_STEPS: "3",
}


def test_environment_alone_configures_an_agent() -> None:
    config = agent_config_from_args(_args(), ENV)
    assert config.name == "researcher"
    assert config.model_base_url == "http://model:8000/v1"
    assert config.mcp_servers == ("http://echo:8000/mcp", "http://calc:8000/mcp")
    assert dict(config.sub_agents) == {"analyst": "http://analyst:8000"}
    assert (config.max_steps, config.max_tool_calls, config.model_api_key) == (3, 16, None)


def test_flags_override_the_environment() -> None:
    args = _args(
        "--name",
        "coordinator",
        "--max-steps",
        "5",
        "--mcp-server",
        "http://x/mcp",
        "--sub-agent",
        "a=http://a",
    )
    config = agent_config_from_args(args, ENV)
    assert (config.name, config.max_steps) == ("coordinator", 5)
    assert config.mcp_servers == ("http://x/mcp",)
    assert dict(config.sub_agents) == {"a": "http://a"}


def test_api_key_comes_from_env_or_a_file_never_argv_and_is_not_in_the_repr(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _args("--model-api-key", "sk-secret")  # no such flag: argv is readable by every local user
    config = agent_config_from_args(_args(), {**ENV, "KAOS_MODEL_API_KEY": "sk-secret"})
    assert config.model_api_key == "sk-secret"
    assert "sk-secret" not in repr(config)
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    assert (
        agent_config_from_args(_args("--model-key-file", str(key_file)), ENV).model_api_key == "sk-from-file"
    )


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ((), {ENV_MODEL_BASE_URL: "http://m/v1"}, "agent name is required"),
        (("--name", "a"), {}, "model base URL is required"),
        ((), {**ENV, ENV_MAX_STEPS: "many"}, "KAOS_AGENT_MAX_STEPS is malformed"),
        (("--max-steps", "0"), ENV, "budgets must be positive"),
        (("--max-runtime", "nan"), ENV, "budgets must be positive"),
        ((), {**ENV, "KAOS_AGENT_MAX_RUNTIME_S": "nan"}, "budgets must be positive"),
        (("--autonomous-interval", "nan"), ENV, "autonomous interval must be positive"),
        (("--sub-agent", "researcher=http://r"), ENV, "cannot be its own sub-agent"),
        (("--model-url", "localhost:8000/v1"), ENV, "the model base URL must be an http:// or https:// URL"),
        ((), {**ENV, ENV_MODEL_BASE_URL: "http://[model/v1"}, "the model base URL must be an http://"),
        (("--mcp-server", "echo:8000/mcp"), ENV, "an MCP server URL must be an http://"),
        ((), {**ENV, ENV_MCP_SERVERS: "http://echo:port/mcp"}, "an MCP server URL must be an http://"),
        (("--sub-agent", "analyst=analyst:8000"), ENV, "the URL of sub-agent 'analyst' must be an http://"),
        (("--sub-agent", "analyst=ftp://analyst"), ENV, "the URL of sub-agent 'analyst' must be an http://"),
        (("--memory-url", "mysql://app:pw@db/app"), ENV, "names database 'mysql': use sqlite"),
        (("--memory-url", "postgresql+psycopg://app@db:port/app"), ENV, "malformed: use sqlite"),
    ],
)
def test_bad_settings_raise_config_error(argv: tuple[str, ...], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        agent_config_from_args(_args(*argv), env)


def test_sub_agents_must_be_name_equals_url() -> None:
    assert parse_sub_agents(" a=http://a , b=http://b ") == {"a": "http://a", "b": "http://b"}
    with pytest.raises(ConfigError, match="name=url"):
        parse_sub_agents("http://a")


def test_serve_agent_without_a_name_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(ENV_NAME, raising=False)
    assert cli.main(["serve", "agent", "--model-url", "http://m/v1"]) == 2
    assert "agent name is required" in capsys.readouterr().err


def test_serving_on_a_busy_port_or_no_port_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "model", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err == f"kaos-agent: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    with pytest.raises(SystemExit) as usage:
        cli.main(["serve", "mcp", "echo", "--port", "99999"])
    assert usage.value.code == 2
    assert "'99999' is not a port number" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (("--fault", "memory-errors"), "--fault needs --duration"),
        (("--duration", "10", "--fault", "memory-errors@20"), "memory-errors@20 starts after the run ends"),
        (("--duration", "10", "--fault", "memory-errors@9-5"), "END after START"),
    ],
)
def test_demo_faults_it_cannot_run_are_usage_errors(
    words: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", *words]) == 2
    assert message in capsys.readouterr().err
