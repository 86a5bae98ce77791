"""The reference system's topology: scripted model, two MCP servers and three agents, as processes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from instrumented_agent.mcp_servers import MCP_PATH
from instrumented_agent.supervisor import RunningService, ServiceSpec, Supervisor

__all__ = ["MODEL_NAME", "System", "start_system"]

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


def _agent(
    name: str,
    model: RunningService,
    mcp: Sequence[RunningService] = (),
    sub_agents: Sequence[RunningService] = (),
    extra_args: Sequence[str] = (),
) -> ServiceSpec:
    args = ["agent", "--name", name, "--instructions", _INSTRUCTIONS[name]]
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
    researcher = supervisor.spawn(_agent("researcher", model, mcp=[echo], extra_args=agent_args))
    analyst = supervisor.spawn(_agent("analyst", model, mcp=[calculator], extra_args=agent_args))
    coordinator = supervisor.spawn(
        _agent("coordinator", model, sub_agents=[researcher, analyst], extra_args=agent_args)
    )
    started = [model, calculator, echo, researcher, analyst, coordinator]
    supervisor.wait_ready(started)
    return System({service.name: service for service in started})
