"""``stdout://`` and ``stderr://``: JSON lines to the process's standard streams."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import BinaryIO, TextIO

import aiofiles.os

from ._base import Sink

__all__ = ["StdoutSink", "StderrSink"]


class _StdStreamSink(Sink):
    _name = "stdout"

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        super().__init__(location, options)
        # A slow reader blocks the write: keep it off the event loop.
        self._write_async = aiofiles.os.wrap(self._write_sync)

    def _write_sync(self, data: bytes) -> None:
        stream: TextIO = getattr(sys, self._name)
        # Write below the text layer when there is one, so our lines and the
        # program's own prints share one buffer and keep their order.
        target: BinaryIO | None = getattr(stream, "buffer", None)
        try:
            if target is None:
                stream.write(data.decode())
                stream.flush()
                return
            target.write(data)
            target.flush()
        except BrokenPipeError:
            # The reader went away (`... | head`). Point the descriptor at
            # /dev/null so that Python's own flush at exit does not fail and
            # turn the exit code into 120; then let the tracer stop this sink.
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, (target or stream).fileno())
            finally:
                os.close(devnull)
            raise

    async def write(self, data: bytes) -> None:
        await self._write_async(data)


class StdoutSink(_StdStreamSink):
    """Writes to ``sys.stdout``'s binary buffer and flushes after every batch."""

    _name = "stdout"


class StderrSink(_StdStreamSink):
    """Writes to ``sys.stderr``'s binary buffer and flushes after every batch."""

    _name = "stderr"
