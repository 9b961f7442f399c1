"""Decoding wire lines back into typed events (the reader and capture_events use it)."""

from __future__ import annotations

from typing import Any, Union

import msgspec

from ._events import Event, _registry, _registry_version

__all__ = ["UnknownEvent", "decode_line", "event_decoder"]


class UnknownEvent(msgspec.Struct, kw_only=True):
    """A line whose ``event`` names no class defined in this process.

    Kept, never dropped (SPEC section 1): ``fields`` holds every field that
    is not part of the envelope.
    """

    event: str
    time: float
    run_id: str
    seq: int
    fields: dict[str, Any] = {}


class _Envelope(msgspec.Struct):
    event: str
    time: float
    run_id: str
    seq: int


_cache: dict[str, Any] = {"version": -1, "decoder": None}
_generic = msgspec.json.Decoder(dict[str, Any])
_envelope = msgspec.json.Decoder(_Envelope)
_ENVELOPE_KEYS = frozenset(_Envelope.__struct_fields__)


def event_decoder() -> msgspec.json.Decoder[Any]:
    """The decoder over the union of every event class defined so far.

    Rebuilt only when a new event class has been defined since the last call.
    """
    if _cache["version"] != _registry_version[0]:
        types = tuple(_registry().values())
        union: Any = Union[types] if len(types) > 1 else types[0]  # noqa: UP007
        _cache["decoder"] = msgspec.json.Decoder(union)
        _cache["version"] = _registry_version[0]
    decoder: msgspec.json.Decoder[Any] = _cache["decoder"]
    return decoder


def decode_line(line: bytes | str) -> Event | UnknownEvent:
    """Decode one wire line.

    Raises ``msgspec.DecodeError`` (not JSON) or ``msgspec.ValidationError``
    (a known event with a missing or wrongly typed field, or a bad envelope).
    """
    try:
        ev: Event = event_decoder().decode(line)
        return ev
    except msgspec.ValidationError:
        env = _envelope.decode(line)  # raises for a bad envelope
        if env.event in _registry():
            raise
        raw = _generic.decode(line)
        fields = {k: v for k, v in raw.items() if k not in _ENVELOPE_KEYS}
        return UnknownEvent(
            event=env.event, time=env.time, run_id=env.run_id, seq=env.seq, fields=fields
        )
