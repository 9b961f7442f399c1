"""``stdout://`` and ``stderr://``: JSON lines to the process's standard streams."""

from __future__ import annotations

import contextlib
import os
import select
import stat

from ._base import Sink

__all__ = ["StdoutSink", "StderrSink"]

# The most bytes a write to a pipe that the kernel keeps whole, never mixed
# with another process's write to the same pipe (POSIX: at least 512).
_PIPE_BUF = getattr(select, "PIPE_BUF", 512)


class _StdStreamSink(Sink):
    """Writes each batch to its file descriptor with ``os.write``, whole lines only.

    Into a file or a terminal a batch goes in one write. Into a pipe or FIFO,
    which other processes may write to as well (a container's log pipe,
    ``| tee``), it goes in writes of at most ``PIPE_BUF`` bytes, each as many
    whole lines as fit: the kernel keeps such a write whole, so no line is cut
    by another writer's. A line longer than ``PIPE_BUF`` goes in a write of
    its own, and another writer's bytes may land inside it: no writer can
    keep it whole.
    """

    _fd = 1
    _pipe = False

    def open(self) -> None:
        # Once, not per write: what the descriptor is stays as it is. One that
        # is closed fails at the first write, as any write error does.
        with contextlib.suppress(OSError):
            self._pipe = stat.S_ISFIFO(os.fstat(self._fd).st_mode)

    def write(self, data: bytes) -> None:
        # The descriptor, not sys.stdout: a write blocked on a slow reader must
        # not hold the lock of Python's stdout buffer, or the interpreter's own
        # flush at exit would wait for it forever.
        try:
            if self._pipe:
                for piece in _whole_lines(data, _PIPE_BUF):
                    self._put(piece)
            else:
                self._put(memoryview(data))
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

    def _put(self, view: memoryview) -> None:
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:
                # A non-blocking descriptor (asyncio's connect_write_pipe sets
                # one, and it is shared with its parent) with a full pipe: wait
                # for the reader as a blocking one would. A reader that never
                # comes makes a hung call, which the tracer gives up on.
                select.select([], [self._fd], [])


def _whole_lines(data: bytes, limit: int) -> list[memoryview]:
    """``data`` cut at line ends into pieces of at most ``limit`` bytes, as few as
    can be; a line longer than ``limit`` is a piece of its own."""
    view = memoryview(data)
    pieces = []
    start, size = 0, len(data)
    while start < size:
        end = size
        if size - start > limit:
            end = data.rfind(b"\n", start, start + limit) + 1
            if end <= start:  # the first line alone is too long
                end = data.find(b"\n", start + limit) + 1 or size
        pieces.append(view[start:end])
        start = end
    return pieces


class StdoutSink(_StdStreamSink):
    """``_StdStreamSink`` on file descriptor 1."""

    _fd = 1


class StderrSink(_StdStreamSink):
    """``_StdStreamSink`` on file descriptor 2."""

    _fd = 2
