"""The Mem0 versions this instrumentation supports."""

_instruments = ("mem0ai >= 2.2, < 3",)
