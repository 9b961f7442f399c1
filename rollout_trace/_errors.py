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
    "InvalidEventError",
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
    """A query option is unknown to the sink, repeated, or has a bad value.

    A sink raises it from ``__init__`` with the reason alone
    (``SinkOptionError("rotate_mb='x' is not a number ...")``): it knows no
    URI, and the tracer raises it again naming the URI the user wrote.
    """

    def __init__(self, uri: str, reason: str | None = None) -> None:
        if reason is None:  # from a sink: the reason alone
            RolloutTraceError.__init__(self, uri)
            self.uri, self.reason = "", uri
        else:
            super().__init__(uri, reason)


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


class InvalidEventError(RolloutTraceError, ValueError):
    """A strict tracer refused an event at ``emit``: a value its class does not allow.

    Raised only in strict mode (``rt.tracer(..., strict=True)``,
    ``capture_events(strict=True)``); otherwise such an event is counted
    ``invalid`` and not written. ``event`` is the event as passed to ``emit``;
    ``reason`` names its field, the value and what the field allows. Also a
    ``ValueError``, as msgspec's own validation errors are.
    """

    def __init__(self, reason: str, *, event: object = None) -> None:
        super().__init__(
            f"{reason} (strict mode raises this at emit; without it the event would be "
            "counted invalid and not written)"
        )
        self.reason = reason
        self.event = event


EventTagError.__module__ = "rollout_trace"
InvalidEventError.__module__ = "rollout_trace"
