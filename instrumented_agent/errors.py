"""Errors that end an agent run, each with the HTTP status and error type the server answers with;
and the error a service that cannot listen on its port stops with."""

from __future__ import annotations

__all__ = [
    "AgentError",
    "BudgetExceededError",
    "DelegationError",
    "DelegationTimeoutError",
    "ListenError",
    "MalformedToolCallError",
    "ModelError",
    "ToolError",
    "UnknownAgentError",
    "UnknownToolError",
]


class AgentError(Exception):
    """A run failed; ``status_code`` and ``error_type`` shape the HTTP error response."""

    status_code = 500
    error_type = "agent_error"


class ModelError(AgentError):
    """The model endpoint failed or answered something unusable."""

    status_code = 502
    error_type = "model_error"

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason
        """What failed, in a few values (the model call's ``error.type``): the HTTP status the
        model answered (``"429"``, ``"500"``), the transport error (``"ReadTimeout"``),
        ``"malformed_response"`` or ``"stream_error"``."""


class UnknownToolError(AgentError):
    """The model asked for a tool the agent does not have."""

    status_code = 502
    error_type = "unknown_tool"


class UnknownAgentError(AgentError):
    """The model asked to delegate to an agent that is not a configured sub-agent."""

    status_code = 502
    error_type = "unknown_agent"


class MalformedToolCallError(AgentError):
    """The model asked for a tool (or a delegation) with arguments that are not a JSON object, as
    when its output was cut short: the call is not made with arguments guessed."""

    status_code = 502
    error_type = "malformed_tool_call"


class ToolError(AgentError):
    """An MCP tool call failed or returned an error result."""

    status_code = 502
    error_type = "tool_error"


class DelegationError(AgentError):
    """A sub-agent could not be reached or answered with an error."""

    status_code = 502
    error_type = "delegation_error"


class DelegationTimeoutError(DelegationError):
    """A sub-agent did not answer within the delegation timeout (shorter than the run budget)."""

    status_code = 504
    error_type = "delegation_timeout"


class BudgetExceededError(AgentError):
    """The run used up its runtime budget."""

    status_code = 504
    error_type = "budget_exceeded"


class ListenError(OSError):
    """A service could not bind its port (in use, not permitted); the message says which and why."""
