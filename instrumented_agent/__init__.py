"""The reference multi-agent system: agents, a scripted model, MCP servers and ``kaos-agent``.

A coordinator delegates research to a researcher (echo search tool over MCP) and analysis to an
analyst (calculator over MCP); every hop is instrumented with :mod:`kaos_otel`.
"""
