"""``stdout://`` and ``stderr://``: JSON lines to the process's standard streams."""

from __future__ import annotations

import os

from ._base import Sink

__all__ = ["StdoutSink", "StderrSink"]


class _StdStreamSink(Sink):
    _fd = 1

    def write(self, data: bytes) -> None:
        # The descriptor, not sys.stdout: a write blocked on a slow reader must
        # not hold the lock of Python's stdout buffer, or the interpreter's own
        # flush at exit would wait for it forever.
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except BrokenPipeError:
            # The reader went away (`... | head`). Point the descriptor at
            # /dev/null so that Python's own flush at exit does not fail and
            # turn the exit code into 120; then let the tracer stop this sink.
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._fd)
            finally:
                os.close(devnull)
            raise


class StdoutSink(_StdStreamSink):
    """Writes each batch to file descriptor 1 with ``os.write``, whole lines only."""

    _fd = 1


class StderrSink(_StdStreamSink):
    """Writes each batch to file descriptor 2 with ``os.write``, whole lines only."""

    _fd = 2
