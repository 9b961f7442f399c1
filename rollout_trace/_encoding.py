"""Batch encoding of events to JSON lines, with numpy and friends through orjson."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import orjson

from ._events import Event

__all__ = ["BatchEncoder", "encode_one"]

_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def _enc_hook(obj: Any) -> msgspec.Raw:
    # msgspec cannot encode numpy scalars and arrays; orjson can, natively.
    try:
        return msgspec.Raw(orjson.dumps(obj, option=_ORJSON_OPTIONS))
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise TypeError(f"cannot encode a {type(obj).__qualname__} value: {exc}") from exc


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode_one(obj: Any) -> bytes:
    """Encode one object with the tracer's rules (used to check ``meta`` early)."""
    return _encoder.encode(obj)


class BatchEncoder:
    """Encodes a batch of events into one bytes object of lines.

    The fast path encodes the whole batch in one call; a batch with an event
    that cannot be encoded is encoded again one event at a time, so that one
    bad event costs only itself.
    """

    def __init__(self) -> None:
        self._encoder = msgspec.json.Encoder(enc_hook=_enc_hook)

    def encode(self, events: Sequence[Event]) -> tuple[bytes, list[tuple[Event, Exception]]]:
        """Return the encoded lines and the events that could not be encoded."""
        try:
            return self._encoder.encode_lines(events), []
        except Exception:
            pass
        buf = bytearray()
        bad: list[tuple[Event, Exception]] = []
        encode_into = self._encoder.encode_into
        for ev in events:
            mark = len(buf)
            try:
                encode_into(ev, buf, -1)
            except Exception as exc:
                del buf[mark:]
                bad.append((ev, exc))
                continue
            buf += b"\n"
        return bytes(buf), bad
