"""One error hierarchy; third-party exceptions are translated at the boundary."""

from __future__ import annotations

__all__ = [
    "RolloutTraceError",
    "SinkError",
    "UnknownSchemeError",
    "SinkOptionError",
    "SinkOpenError",
    "TraceReadError",
    "TracerStateError",
    "EventTagError",
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


class TracerStateError(RolloutTraceError, RuntimeError):
    """A tracer was used in a way its state does not allow (opened twice at once)."""


class EventTagError(RolloutTraceError, TypeError):
    """An event class was refused: its lines would not be event lines a reader takes.

    Its tag is one another event class holds or not a str, or its msgspec
    options change the line (``array_like=True``, a ``tag_field`` other than
    ``"event"``, ``tag=False``, an envelope field renamed). Raised by the
    ``class`` statement of a class without ``tag=`` whose tag is taken.
    msgspec sets an explicit ``tag=`` and the other options only after every
    hook of ours has run, so such a class is refused when the next event class
    is defined, a tag is first looked up (reading, ``event_types()``), or
    ``emit`` first meets it; then ``emit`` raises this for each of its events.
    ``tag`` is the tag; ``classes`` the class that holds it and the one refused
    (just the refused one when it is not refused for a taken tag). Also a
    ``TypeError``, as a bad class definition is.
    """

    def __init__(self, message: str, *, tag: object = None, classes: tuple[type, ...] = ()) -> None:
        super().__init__(message)
        self.tag = tag
        self.classes = classes


EventTagError.__module__ = "rollout_trace"
