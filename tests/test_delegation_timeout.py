"""A frozen sub-agent fails its delegation within the delegation timeout, as an error with ``error.type``.

The sub-agent is a socket that accepts connections and never answers; the coordinator's run
budget is 4 s and its delegation timeout defaults to half of it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from instrumented_agent.demo import SCENARIOS
from instrumented_agent.server import TRACE_ID_HEADER
from instrumented_agent.supervisor import ServiceSpec, Supervisor
from instrumented_agent.system import agent_spec, otlp_env
from kaos_otel import catalog
from kaos_otel.receiver import OtlpReceiver

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def frozen_agent_url() -> Iterator[str]:
    """A listening socket that never reads or answers (a sub-agent that hangs)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_frozen_sub_agent_is_a_delegation_timeout_error_before_the_run_budget(
    otlp_receiver: OtlpReceiver, tmp_path: Path, frozen_agent_url: str
) -> None:
    env = otlp_env(otlp_receiver.grpc_endpoint, export_delay_ms=200)
    with Supervisor(tmp_path, env=env) as supervisor:
        model = supervisor.spawn(ServiceSpec("model", ["model"]))
        extra = ["--max-runtime", "4", "--sub-agent", f"researcher={frozen_agent_url}"]
        coordinator = supervisor.spawn(agent_spec("coordinator", model, extra_args=extra))
        supervisor.wait_ready([model, coordinator])
        body = {"messages": [{"role": "user", "content": SCENARIOS["research"].prompt}]}
        with httpx.Client(timeout=30, trust_env=False) as client:
            response = client.post(f"{coordinator.url}/v1/chat/completions", json=body)

        assert response.status_code == 504
        assert response.json()["error"]["type"] == "delegation_timeout"
        trace_id = response.headers[TRACE_ID_HEADER]

        def delegation_and_run_arrived(r: OtlpReceiver) -> bool:
            names = {s.name for s in r.spans() if s.trace_id == trace_id}
            return {"invoke_agent researcher", "invoke_agent coordinator"} <= names

        assert otlp_receiver.wait_for(delegation_and_run_arrived, timeout=15)
    spans = {s.name: s for s in otlp_receiver.spans() if s.trace_id == trace_id}
    delegation, run = spans["invoke_agent researcher"], spans["invoke_agent coordinator"]
    assert delegation.status_code == run.status_code == "ERROR"
    assert delegation.attributes[catalog.KAOS_OUTCOME] == "error"
    assert delegation.attributes[catalog.ERROR_TYPE] == "DelegationTimeoutError"
    assert run.attributes[catalog.KAOS_OUTCOME] == "error"  # not canceled by the run budget
    assert otlp_receiver.wait_for(
        lambda r: any(
            p.name == catalog.KAOS_DELEGATIONS and p.attributes[catalog.KAOS_OUTCOME] == "error"
            for p in r.metric_points()
        ),
        timeout=10,
    )
