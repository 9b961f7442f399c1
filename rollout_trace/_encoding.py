"""Batch encoding of events to JSON lines, with numpy and friends through orjson."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import orjson

from ._decoding import decoders
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
            data = self._encoder.encode_lines(events)
        except Exception:  # any failure: again one by one, below
            pass
        else:
            # JSON has no NaN or infinity: msgspec writes them as null, which
            # no reader takes for a float. Only lines holding a null are checked.
            return _without_non_finite(events, data) if b"null" in data else (data, [])
        buf = bytearray()
        bad: list[tuple[Event, Exception]] = []
        good: list[Event] = []
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
            good.append(ev)
        data = bytes(buf)
        if b"null" in data:
            data, more = _without_non_finite(good, data)
            bad += more
        return data, bad


def _without_non_finite(
    events: Sequence[Event], data: bytes
) -> tuple[bytes, list[tuple[Event, Exception]]]:
    """Drop the lines whose null stands for a NaN or an infinity (or any value
    the event's own types refuse), and say which events they were."""
    decode = decoders()[0].decode
    lines = data.split(b"\n")
    bad: list[tuple[Event, Exception]] = []
    keep: list[bytes] = []
    for ev, line in zip(events, lines, strict=False):
        if b"null" in line:
            try:
                decode(line)
            except msgspec.ValidationError as exc:
                reason = f"{exc} (JSON has no NaN or infinity; they are written as null)"
                bad.append((ev, ValueError(reason)))
                continue
        keep.append(line)
    if not bad:
        return data, []
    keep.append(b"")
    return b"\n".join(keep), bad
