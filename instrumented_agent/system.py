"""The reference system's topology: scripted model, two MCP servers and three agents, as processes."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL

from instrumented_agent.mcp_servers import MCP_PATH
from instrumented_agent.supervisor import RunningService, ServiceSpec, Supervisor
from kaos_otel._config import SIGNAL_ENDPOINTS, SIGNAL_PROTOCOLS

__all__ = ["MODEL_NAME", "System", "agent_spec", "otlp_env", "start_system"]

MODEL_NAME = "scripted-model"

_INSTRUCTIONS = {
    "coordinator": "You coordinate specialists: delegate research to researcher and calculations to analyst.",
    "researcher": "You research topics with the echo search tool and report findings.",
    "analyst": "You analyse numbers with the calculator tool.",
}


@dataclass(frozen=True)
class System:
    """The running services by name: model, mcp-calculator, mcp-echo, researcher, analyst, coordinator."""

    services: Mapping[str, RunningService]

    @property
    def coordinator_url(self) -> str:
        """Base URL of the coordinator, the system's entry point."""
        return self.services["coordinator"].url


def otlp_env(
    endpoint: str, base: Mapping[str, str] | None = None, *, export_delay_ms: int | None = None
) -> dict[str, str]:
    """``base`` (default ``os.environ``) with OTLP/gRPC export of every signal to ``endpoint``.

    Per-signal endpoints and protocols in ``base`` are dropped: they would override these.
    ``export_delay_ms`` shortens the span/log batch delay and the metric interval (for tests).
    """
    env = dict(os.environ if base is None else base)
    for name in [*SIGNAL_ENDPOINTS.values(), *SIGNAL_PROTOCOLS.values()]:
        env.pop(name, None)
    env[OTEL_EXPORTER_OTLP_ENDPOINT] = endpoint
    env[OTEL_EXPORTER_OTLP_PROTOCOL] = "grpc"
    if export_delay_ms is not None:
        delay = str(export_delay_ms)
        env.update(
            OTEL_BSP_SCHEDULE_DELAY=delay, OTEL_BLRP_SCHEDULE_DELAY=delay, OTEL_METRIC_EXPORT_INTERVAL=delay
        )
    return env


def agent_spec(
    name: str,
    model: RunningService,
    mcp: Sequence[RunningService] = (),
    sub_agents: Sequence[RunningService] = (),
    extra_args: Sequence[str] = (),
) -> ServiceSpec:
    """An agent using the scripted ``model``, the ``mcp`` servers and the ``sub_agents``."""
    instructions = _INSTRUCTIONS.get(name, "You are a helpful agent.")
    args = ["agent", "--name", name, "--instructions", instructions]
    args += ["--model-url", f"{model.url}/v1", "--model", MODEL_NAME]
    for server in mcp:
        args += ["--mcp-server", server.url + MCP_PATH]
    for agent in sub_agents:
        args += ["--sub-agent", f"{agent.name}={agent.url}"]
    return ServiceSpec(name, [*args, *extra_args], ready_path="/ready")


def start_system(
    supervisor: Supervisor, *, model_latency_ms: float = 0.0, agent_args: Sequence[str] = ()
) -> System:
    """Start every service at once and wait until all are ready (:class:`StartupError` otherwise).

    ``agent_args`` are added to each agent's command line (budgets, for example).
    """
    model = supervisor.spawn(ServiceSpec("model", ["model", "--latency-ms", f"{model_latency_ms:g}"]))
    calculator = supervisor.spawn(ServiceSpec("mcp-calculator", ["mcp", "calculator"]))
    echo = supervisor.spawn(ServiceSpec("mcp-echo", ["mcp", "echo"]))
    researcher = supervisor.spawn(agent_spec("researcher", model, mcp=[echo], extra_args=agent_args))
    analyst = supervisor.spawn(agent_spec("analyst", model, mcp=[calculator], extra_args=agent_args))
    coordinator = supervisor.spawn(
        agent_spec("coordinator", model, sub_agents=[researcher, analyst], extra_args=agent_args)
    )
    started = [model, calculator, echo, researcher, analyst, coordinator]
    supervisor.wait_ready(started)
    return System({service.name: service for service in started})
