"""``memory://``: keep the lines in memory, for tests."""

from __future__ import annotations

from collections.abc import Mapping

from ._base import Sink

__all__ = ["MemorySink"]


class MemorySink(Sink):
    """Keeps every written batch; ``lines()`` gives them back one line each."""

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        self._chunks: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self._chunks.append(data)

    def getvalue(self) -> bytes:
        """Everything written so far, as one bytes object."""
        return b"".join(self._chunks)

    def lines(self) -> list[bytes]:
        """Every line written so far, without its trailing newline."""
        return self.getvalue().splitlines()
