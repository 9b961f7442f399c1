"""Decoding wire lines back into typed events: the reader and capture_events use it."""

# No `from __future__ import annotations`: msgspec would resolve string
# annotations in the module named by `__module__`, which is `rollout_trace`
# for UnknownEvent (see the end of the module), where `Any` is not defined.
from typing import Any, Union

import msgspec

from .events import Event
from .registry import REGISTRY

__all__ = [
    "UnknownEvent",
    "AnyEvent",
    "decoders",
    "decode_one",
    "decode_line",
    "envelope_problem",
    "bounded",
]


class UnknownEvent(msgspec.Struct, kw_only=True):
    """A line whose ``event`` names no class defined in this process.

    Kept, never dropped (docs: Reference > Wire format): ``fields`` holds every field that
    is not part of the envelope.
    """

    event: str
    time: float
    run_id: str
    seq: int
    fields: dict[str, Any] = {}


UnknownEvent.__module__ = "rollout_trace"

AnyEvent = Union[Event, UnknownEvent]  # noqa: UP007


class _Envelope(msgspec.Struct):
    event: str
    time: float
    run_id: str
    seq: int


_generic = msgspec.json.Decoder(dict[str, Any])
_envelope = msgspec.json.Decoder(_Envelope)
_ENVELOPE_KEYS = frozenset(_Envelope.__struct_fields__)


def decoders() -> tuple[msgspec.json.Decoder[Any], msgspec.json.Decoder[Any]]:
    """Decoders for one event and for a list of events, over every known class.

    Rebuilt only when an event class was defined since the last call, so a
    user's own events read back typed when their module is imported.
    """
    return REGISTRY.decoders()


# A reason quotes what msgspec quotes, which can be a whole field of a huge
# line; a reason is for reading, so it is cut to a few lines' worth.
_REASON_LIMIT = 300


def bounded(reason: str) -> str:
    """``reason``, cut to a few hundred characters (saying how long it was)."""
    if len(reason) <= _REASON_LIMIT:
        return reason
    return f"{reason[:_REASON_LIMIT]}... ({len(reason):,} characters in all)"


def envelope_problem(time: float, run_id: str, seq: int) -> str | None:
    """Why an envelope that decoded is still not one (docs: Reference > Wire format).

    ``Event``'s own defaults (time 0.0, run_id "", seq -1) all fail here, so a
    line that lacks a field and one that holds a default's value are one case.
    """
    if not time > 0.0:
        return f"bad envelope: time {time!r} is not a positive number of seconds"
    if not run_id:
        return "bad envelope: run_id is empty; expected the id of the run that wrote the line"
    if seq < 0:
        return f"bad envelope: seq {seq} is negative; a run numbers its events from 0"
    return None


def decode_one(raw: bytes) -> tuple[AnyEvent | None, str | None]:
    """One line to an event (``UnknownEvent`` for an unknown tag), or why it is not one."""
    try:
        return _decode_one(raw)
    except RecursionError:
        # msgspec refuses JSON nested deeper than it can walk.
        return None, "not JSON: nested too deeply to read"


def _decode_one(raw: bytes) -> tuple[AnyEvent | None, str | None]:
    """One line to an event (``UnknownEvent`` for an unknown tag), or why it is not one."""
    one, _ = REGISTRY.decoders()
    # ValidationError subclasses DecodeError, so it must be caught first. Only
    # the message is kept: an exception kept past its `except` holds its
    # traceback, whose frame holds the exception again, a cycle per bad line
    # that only the garbage collector frees (and the commands pause it).
    invalid: str | None = None
    try:
        ev: Event = one.decode(raw)
    except msgspec.ValidationError as exc:
        invalid = str(exc)
    except msgspec.DecodeError as exc:
        return None, bounded(f"not JSON: {exc}")
    # The envelope is checked even for a known event: Event gives it defaults
    # (so users can build events without one), and a line without it would
    # otherwise decode quietly.
    try:
        env = _envelope.decode(raw)
    except msgspec.DecodeError as exc:
        return None, bounded(f"bad envelope: {exc}")
    bad = envelope_problem(env.time, env.run_id, env.seq)
    if bad is not None:
        return None, bounded(bad)
    if invalid is None:
        return ev, None
    if env.event in REGISTRY.tags():
        return None, bounded(f"bad {env.event!r} event: {invalid}")
    try:
        raw_obj = _generic.decode(raw)
    except msgspec.DecodeError as exc:  # e.g. bytes that are not UTF-8 in a field
        return None, bounded(f"not JSON: {exc}")
    fields = {k: v for k, v in raw_obj.items() if k not in _ENVELOPE_KEYS}
    return UnknownEvent(
        event=env.event, time=env.time, run_id=env.run_id, seq=env.seq, fields=fields
    ), None


def decode_line(raw: bytes) -> AnyEvent:
    """One line to an event; ``ValueError`` naming the reason when it is not one."""
    ev, reason = decode_one(raw)
    if ev is None:
        raise ValueError(reason)
    return ev
