"""Integrations, one module per library: ASGI servers, httpx clients, Mem0."""
