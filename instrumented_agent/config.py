"""Agent configuration from command-line flags and environment variables (flags win).

Every setting and the environment variable it reads is defined here, once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from kaos_otel import MemoryScope

__all__ = [
    "DELEGATED_BY_HEADER",
    "DELEGATE_TOOL",
    "ENV_AUTONOMOUS_GOAL",
    "ENV_AUTONOMOUS_INTERVAL_S",
    "ENV_DELEGATION_TIMEOUT_S",
    "ENV_INSTRUCTIONS",
    "ENV_MAX_RUNTIME_S",
    "ENV_MAX_STEPS",
    "ENV_MAX_TOOL_CALLS",
    "ENV_MCP_SERVERS",
    "ENV_MEMORY_LONG_TERM",
    "ENV_MEMORY_MAX_READ_SCOPE",
    "ENV_MEMORY_URL",
    "ENV_MEMORY_WINDOW_TOKENS",
    "ENV_MODEL_API_KEY",
    "ENV_MODEL_BASE_URL",
    "ENV_MODEL_NAME",
    "ENV_MODEL_PROVIDER",
    "ENV_NAME",
    "ENV_SUB_AGENTS",
    "MEMORY_SCOPE_HEADER",
    "SESSION_ID_HEADER",
    "USER_ID_HEADER",
    "AgentConfig",
    "ConfigError",
    "add_agent_arguments",
    "agent_config_from_args",
    "parse_sub_agents",
]

ENV_NAME = "KAOS_AGENT_NAME"
ENV_INSTRUCTIONS = "KAOS_AGENT_INSTRUCTIONS"
ENV_MODEL_BASE_URL = "KAOS_MODEL_BASE_URL"
ENV_MODEL_API_KEY = "KAOS_MODEL_API_KEY"
ENV_MODEL_NAME = "KAOS_MODEL_NAME"
ENV_MODEL_PROVIDER = "KAOS_MODEL_PROVIDER"
ENV_MCP_SERVERS = "KAOS_MCP_SERVERS"
ENV_SUB_AGENTS = "KAOS_SUB_AGENTS"
ENV_MAX_STEPS = "KAOS_AGENT_MAX_STEPS"
ENV_MAX_TOOL_CALLS = "KAOS_AGENT_MAX_TOOL_CALLS"
ENV_MAX_RUNTIME_S = "KAOS_AGENT_MAX_RUNTIME_S"
ENV_DELEGATION_TIMEOUT_S = "KAOS_AGENT_DELEGATION_TIMEOUT_S"
ENV_AUTONOMOUS_GOAL = "KAOS_AGENT_AUTONOMOUS_GOAL"
ENV_AUTONOMOUS_INTERVAL_S = "KAOS_AGENT_AUTONOMOUS_INTERVAL_S"
ENV_MEMORY_URL = "KAOS_MEMORY_URL"
ENV_MEMORY_WINDOW_TOKENS = "KAOS_MEMORY_WINDOW_TOKENS"
ENV_MEMORY_LONG_TERM = "KAOS_MEMORY_LONG_TERM"
ENV_MEMORY_MAX_READ_SCOPE = "KAOS_MEMORY_MAX_READ_SCOPE"

DELEGATE_TOOL = "delegate_to_agent"
"""The function agents with sub-agents offer the model: ``{"agent": name, "task": text}``."""

USER_ID_HEADER = "x-kaos-user-id"
"""Header a trusted gateway sets to the verified user id; the only source of user identity."""

SESSION_ID_HEADER = "x-kaos-session-id"
"""Header naming the conversation session (memory's session scope); generated when absent."""

DELEGATED_BY_HEADER = "x-kaos-delegated-by"
"""Header an agent sets on a delegation (its own name): the run is counted as ``delegated``."""

MEMORY_SCOPE_HEADER = "x-kaos-memory-scope"
"""Header choosing the memory read scope of a request (default ``session``, at most the ceiling)."""

T = TypeVar("T")

_DEFAULT_INSTRUCTIONS = "You are a helpful agent. Use your tools and sub-agents when they help."


class ConfigError(ValueError):
    """An agent setting is missing or malformed."""


@dataclass(frozen=True)
class AgentConfig:
    """Everything one agent process needs: identity, model, tools, sub-agents and budgets."""

    name: str
    model_base_url: str
    model_name: str
    instructions: str = _DEFAULT_INSTRUCTIONS
    model_api_key: str | None = field(default=None, repr=False)
    model_provider: str = "openai"
    mcp_servers: tuple[str, ...] = ()
    sub_agents: Mapping[str, str] = field(default_factory=dict)
    max_steps: int = 8
    max_tool_calls: int = 16
    max_runtime_s: float = 60.0
    delegation_timeout_s: float | None = None
    """Per delegation; ``None``: half the runtime budget. Always shorter than the budget, so a
    frozen sub-agent fails its delegation (an error) before the whole run is stopped."""
    autonomous_goal: str | None = None
    autonomous_interval_s: float = 60.0
    memory_url: str | None = field(default=None, repr=False)
    memory_window_tokens: int = 1024
    memory_long_term: bool = False
    memory_max_read_scope: MemoryScope = MemoryScope.AGENT

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("agent name is required")
        if not self.model_base_url:
            raise ConfigError("model base URL is required")
        if self.max_steps < 1 or self.max_tool_calls < 0 or not self.max_runtime_s > 0:  # NaN too
            raise ConfigError("budgets must be positive (max_steps >= 1, max_tool_calls >= 0, runtime > 0)")
        if self.delegation_timeout_s is not None and not 0 < self.delegation_timeout_s < self.max_runtime_s:
            raise ConfigError("the delegation timeout must be positive and shorter than the runtime budget")
        if not self.autonomous_interval_s > 0:  # NaN too
            raise ConfigError("autonomous interval must be positive")
        if self.name in self.sub_agents:
            raise ConfigError(f"agent {self.name!r} cannot be its own sub-agent")
        if self.memory_window_tokens < 1:
            raise ConfigError("memory window must be at least 1 token")
        if self.memory_max_read_scope is MemoryScope.STORE:
            raise ConfigError("the store memory scope is refused for agents (cluster-admin only)")
        if self.memory_url is not None:
            from instrumented_agent.memory.relational import parse_memory_url  # SQLAlchemy: only then

            try:
                parse_memory_url(self.memory_url)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None

    @property
    def delegation_timeout(self) -> float:
        """Seconds one delegation may take (the setting, or half the runtime budget)."""
        return self.delegation_timeout_s if self.delegation_timeout_s is not None else self.max_runtime_s / 2


_DEFAULTS = AgentConfig(name="defaults", model_base_url="unset", model_name="unset")


def _http_url(what: str, url: str) -> str:
    """``url`` if it is an ``http://`` or ``https://`` URL with a host (``localhost:8000`` is not:
    every call to it would fail); :class:`ConfigError` naming ``what`` otherwise (not the URL,
    which may hold credentials)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # ValueError for a port that is no number or out of range
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # "http://[host" too
        valid = False
    if not valid:
        raise ConfigError(f"{what} must be an http:// or https:// URL with a host")
    return url


def parse_sub_agents(value: str) -> dict[str, str]:
    """Parse ``name=url,name=url`` into a mapping (each URL ``http://`` or ``https://``)."""
    agents: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ConfigError(f"sub-agent must look like name=url, got {item!r}")
        agents[name.strip()] = _http_url(f"the URL of sub-agent {name.strip()!r}", url.strip())
    return agents


def _flag(value: str) -> bool:
    """Parse a boolean environment value."""
    lowered = value.lower()
    if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(value)
    return lowered in ("1", "true", "yes", "on")


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the agent flags; each defaults to its environment variable."""
    parser.add_argument("--name", help=f"agent name (env {ENV_NAME})")
    parser.add_argument("--instructions", help=f"system instructions (env {ENV_INSTRUCTIONS})")
    parser.add_argument(
        "--model-url", help=f"OpenAI-compatible base URL, e.g. .../v1 (env {ENV_MODEL_BASE_URL})"
    )
    parser.add_argument(
        "--model-key-file",
        help=f"file holding the model API key (the key itself only from env {ENV_MODEL_API_KEY}, "
        "never the command line, where every local user can read it)",
    )
    parser.add_argument("--model", help=f"model name (env {ENV_MODEL_NAME})")
    parser.add_argument("--model-provider", help=f"gen_ai.provider.name (env {ENV_MODEL_PROVIDER})")
    parser.add_argument(
        "--mcp-server",
        action="append",
        default=None,
        help=f"MCP streamable-HTTP URL, repeatable (env {ENV_MCP_SERVERS})",
    )
    parser.add_argument(
        "--sub-agent", action="append", default=None, help=f"name=url, repeatable (env {ENV_SUB_AGENTS})"
    )
    parser.add_argument("--max-steps", type=int, help=f"iteration budget (env {ENV_MAX_STEPS})")
    parser.add_argument("--max-tool-calls", type=int, help=f"tool-call budget (env {ENV_MAX_TOOL_CALLS})")
    parser.add_argument(
        "--max-runtime", type=float, help=f"runtime budget in seconds (env {ENV_MAX_RUNTIME_S})"
    )
    parser.add_argument(
        "--delegation-timeout",
        type=float,
        help=f"seconds per delegation, below the runtime budget (default: half of it; "
        f"env {ENV_DELEGATION_TIMEOUT_S})",
    )
    parser.add_argument(
        "--autonomous-goal",
        help=f"run this goal on a loop with the agent's own identity (env {ENV_AUTONOMOUS_GOAL})",
    )
    parser.add_argument(
        "--autonomous-interval",
        type=float,
        help=f"seconds between autonomous runs (env {ENV_AUTONOMOUS_INTERVAL_S})",
    )
    parser.add_argument(
        "--memory-url",
        help="turn memory on: sqlite (.kaos/memory.db here), sqlite:///FILE, sqlite:// (in memory) "
        f"or postgresql+psycopg://... (env {ENV_MEMORY_URL})",
    )
    parser.add_argument(
        "--memory-window-tokens",
        type=int,
        help=f"short-term window budget before compaction (env {ENV_MEMORY_WINDOW_TOKENS})",
    )
    parser.add_argument(
        "--memory-long-term",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"long-term facts in Mem0 (slower start; env {ENV_MEMORY_LONG_TERM})",
    )
    parser.add_argument(
        "--memory-max-read-scope",
        choices=[s.value for s in MemoryScope if s is not MemoryScope.STORE],
        help=f"widest memory read scope a request may use (env {ENV_MEMORY_MAX_READ_SCOPE})",
    )


def _setting(
    flag: T | None, environ: Mapping[str, str], env: str, parse: Callable[[str], T], default: T
) -> T:
    """The flag if given, else the parsed environment variable, else ``default``."""
    if flag is not None:
        return flag
    raw = environ.get(env, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"{env} is malformed: {raw!r}") from None


def _api_key(path: str | None, environ: Mapping[str, str]) -> str | None:
    """The model API key: read from ``path`` if given, else the environment (never argv)."""
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise ConfigError(f"cannot read the model API key file: {type(exc).__name__}") from None
    return environ.get(ENV_MODEL_API_KEY, "").strip() or None


def agent_config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> AgentConfig:
    """Build an :class:`AgentConfig` from parsed flags, falling back to ``environ``."""
    mcp = args.mcp_server if args.mcp_server is not None else environ.get(ENV_MCP_SERVERS, "").split(",")
    sub_agents = ",".join(args.sub_agent) if args.sub_agent is not None else environ.get(ENV_SUB_AGENTS, "")
    model_url = _setting(args.model_url, environ, ENV_MODEL_BASE_URL, str, "")
    return AgentConfig(
        name=_setting(args.name, environ, ENV_NAME, str, ""),
        model_base_url=model_url and _http_url("the model base URL", model_url),
        model_name=_setting(args.model, environ, ENV_MODEL_NAME, str, "scripted"),
        instructions=_setting(args.instructions, environ, ENV_INSTRUCTIONS, str, _DEFAULTS.instructions),
        model_api_key=_api_key(args.model_key_file, environ),
        model_provider=_setting(
            args.model_provider, environ, ENV_MODEL_PROVIDER, str, _DEFAULTS.model_provider
        ),
        mcp_servers=tuple(_http_url("an MCP server URL", url.strip()) for url in mcp if url.strip()),
        sub_agents=parse_sub_agents(sub_agents),
        max_steps=_setting(args.max_steps, environ, ENV_MAX_STEPS, int, _DEFAULTS.max_steps),
        max_tool_calls=_setting(
            args.max_tool_calls, environ, ENV_MAX_TOOL_CALLS, int, _DEFAULTS.max_tool_calls
        ),
        max_runtime_s=_setting(args.max_runtime, environ, ENV_MAX_RUNTIME_S, float, _DEFAULTS.max_runtime_s),
        delegation_timeout_s=_setting(
            args.delegation_timeout, environ, ENV_DELEGATION_TIMEOUT_S, float, _DEFAULTS.delegation_timeout_s
        ),
        autonomous_goal=_setting(args.autonomous_goal, environ, ENV_AUTONOMOUS_GOAL, str, "") or None,
        autonomous_interval_s=_setting(
            args.autonomous_interval,
            environ,
            ENV_AUTONOMOUS_INTERVAL_S,
            float,
            _DEFAULTS.autonomous_interval_s,
        ),
        memory_url=_setting(args.memory_url, environ, ENV_MEMORY_URL, str, "") or None,
        memory_window_tokens=_setting(
            args.memory_window_tokens,
            environ,
            ENV_MEMORY_WINDOW_TOKENS,
            int,
            _DEFAULTS.memory_window_tokens,
        ),
        memory_long_term=_setting(
            args.memory_long_term, environ, ENV_MEMORY_LONG_TERM, _flag, _DEFAULTS.memory_long_term
        ),
        memory_max_read_scope=_setting(
            MemoryScope(args.memory_max_read_scope) if args.memory_max_read_scope else None,
            environ,
            ENV_MEMORY_MAX_READ_SCOPE,
            MemoryScope,
            _DEFAULTS.memory_max_read_scope,
        ),
    )
