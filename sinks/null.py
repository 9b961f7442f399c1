"""``null://``: encode and discard, for measuring overhead."""

from __future__ import annotations

from ._base import Sink

__all__ = ["NullSink"]


class NullSink(Sink):
    """Accepts every batch and keeps nothing; counts the bytes it was given."""

    bytes_written = 0

    def write(self, data: bytes) -> None:
        self.bytes_written += len(data)
