"""``memory://``: keep the lines in memory, for tests."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ._base import Sink

__all__ = ["MemorySink"]


class MemorySink(Sink):
    """Keeps every written batch; ``lines()`` gives them back one line each.

    What was written stays readable after the tracer closed.
    """

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self._chunks: list[bytes] = []
        # The sink's thread appends while a test may read from another one.
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            self._chunks.append(data)

    def getvalue(self) -> bytes:
        """Everything written so far, as one bytes object."""
        with self._lock:
            return b"".join(self._chunks)

    def lines(self) -> list[bytes]:
        """Every line written so far, without its trailing newline."""
        return self.getvalue().splitlines()
