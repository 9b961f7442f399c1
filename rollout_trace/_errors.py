"""One error hierarchy; third-party exceptions are translated at the boundary."""

from __future__ import annotations

__all__ = [
    "RolloutTraceError",
    "SinkError",
    "UnknownSchemeError",
    "SinkOptionError",
    "SinkOpenError",
    "TraceReadError",
]


class RolloutTraceError(Exception):
    """Base of every error rollout_trace raises on purpose."""


class SinkError(RolloutTraceError):
    """A sink URI cannot be used. ``uri`` is the URI as the user wrote it."""

    def __init__(self, uri: str, reason: str) -> None:
        super().__init__(f"sink {uri!r}: {reason}")
        self.uri = uri
        self.reason = reason


class UnknownSchemeError(SinkError):
    """The URI's scheme names no installed sink."""


class SinkOptionError(SinkError):
    """A query option is unknown to the sink, repeated, or has a bad value."""


class SinkOpenError(SinkError):
    """The sink could not be opened (the OS error is the ``__cause__``)."""


class TraceReadError(RolloutTraceError):
    """A trace file cannot be read at all (missing, unreadable, not a trace)."""
