"""The plugin contract: a small async writer of encoded JSON lines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

__all__ = ["Sink", "SinkOptionValueError"]


class SinkOptionValueError(ValueError):
    """An option's value is not one the sink accepts (the tracer names the URI)."""


class Sink:
    """Writes batches of encoded JSON lines somewhere; knows nothing of events.

    A tracer builds a sink with the URI's location (the part after ``scheme://``,
    templates already filled in) and its query options, awaits ``open()`` once,
    then calls ``write()`` with whole lines, one batch at a time, never
    concurrently. ``flush()`` is called when the user asks for a flush and
    ``aclose()`` once at the end, also after a failed ``write()``; ``discard()``
    instead of ``aclose()`` when the tracer could not open as a whole.

    A subclass lists the query options it knows in ``options``: the tracer
    rejects any other option before the sink is built, naming the known ones.
    An exception from ``open()`` stops the tracer from opening; one from
    ``write()`` or ``flush()`` is reported once and the sink is not used again.
    """

    #: Query options this sink understands (``jsonl:///x.jsonl?fsync=batch``).
    options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        self.location = location

    async def open(self) -> None:
        """Acquire the resource. Raise ``OSError`` (or any error) if it cannot be had."""

    async def write(self, data: bytes) -> None:
        """Write ``data``: one or more whole lines, each ending in ``b"\\n"``."""
        raise NotImplementedError

    async def flush(self) -> None:
        """Push what was written to where readers can see it."""

    async def aclose(self) -> None:
        """Release the resource. Called once, also after a failed write."""

    async def discard(self) -> None:
        """Undo a successful ``open()``, leaving nothing behind (no file, no folder).

        Called instead of ``aclose()`` when another sink of the same tracer
        failed to open, so the tracer does not open at all. Closes by default.
        """
        await self.aclose()
