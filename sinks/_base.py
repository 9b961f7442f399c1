"""The plugin contract: a small blocking writer of encoded JSON lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import ClassVar

from .._errors import SinkOptionError

__all__ = ["Sink", "SinkOptionError"]

# The longest real-time slice a wait on the sink's clock sleeps for: a
# deadline that a test's clock is moved past ends the wait within it.
WAIT_SLICE_S = 0.05


class Sink:
    """Writes batches of encoded JSON lines somewhere; knows nothing of events.

    A tracer builds a sink with the URI's location (the part after ``scheme://``,
    templates already filled in) and its query options, then calls its methods
    from one thread of the sink's own, one call at a time: ``open()`` once,
    ``write()`` with whole lines, one batch at a time, ``flush()`` when the
    user asks for a flush, and ``close()`` once at the end (also after a failed
    ``write()``); ``discard()`` instead of ``close()`` when the tracer could not
    open as a whole.

    The methods block: the tracer never calls them on the event loop or on a
    thread that emits, so a sink needs no async code and works under every
    event loop. A sink that blocks for good (a hung mount, a pipe nobody
    reads) is given up on after the tracer's ``close_timeout``; its thread is
    a daemon and is left behind.

    A subclass lists the query options it knows in ``options``: the tracer
    rejects any other option before the sink is built, naming the known ones.
    ``__init__`` does no I/O (it runs when the tracer is built, to check the
    options). An exception from ``open()`` stops the tracer from opening; one
    from ``write()`` or ``flush()`` is reported once and the sink is not used
    again. ``write()`` either writes all of ``data`` or raises.

    A sink's own deadlines and timers (a call's timeout, a retry budget, a
    backoff) are on ``deadline_clock``, which the tracer sets to its own: a
    test that passes the tracer a ``rollout_trace.testing.MockClock`` moves
    them with the tracer's. A sink waits for one with ``wait_until``, never with
    ``time.sleep`` or a timeout in real time.
    """

    #: Query options this sink understands (``jsonl:///x.jsonl?fsync=batch``).
    options: ClassVar[frozenset[str]] = frozenset()
    #: True for a sink whose ``write()`` stages what it accepts and delivers it
    #: later (an object store, which cannot append, uploads whole objects).
    #: The tracer then counts a batch written only once ``staged_bytes()``
    #: says it was delivered, counts it lost if the sink stops first, answers
    #: a ``flush()`` with True only when nothing is left staged, and flushes
    #: the sink before it counts the run at its close.
    stages: ClassVar[bool] = False
    #: The most bytes of lines one ``write()`` is given, or None for no limit
    #: beyond the tracer's own. The tracer joins queued batches up to it and
    #: hands a larger batch in several writes of whole lines (a longer line
    #: alone): a sink whose call time grows with its size (a request per so
    #: many bytes, each with its own timeout) keeps each call short of the
    #: tracer's ``close_timeout``, after which it is given up as hung.
    max_write: ClassVar[int | None] = None
    #: The clock of the sink's deadlines, in seconds that only go forward: the
    #: tracer sets it to its ``deadline_clock`` before ``open()`` (by default
    #: ``time.monotonic``). Read it, never ``time.monotonic``, for a deadline.
    deadline_clock: Callable[[], float] = time.monotonic

    def __init__(self, location: str, options: Mapping[str, str]) -> None:
        self.location = location

    @classmethod
    def open_within(cls, options: Mapping[str, str]) -> float:
        """The longest ``open()`` may take with these options, in seconds.

        0 (the default): no longer than the tracer's ``close_timeout``. A sink
        whose open waits for a remote answer says how long it waits, and the
        tracer waits at least that long for it rather than give it up as hung.
        """
        return 0.0

    def wait_until(self, deadline: float, event: threading.Event | None = None) -> bool:
        """Wait until ``deadline_clock()`` reaches ``deadline``, or until ``event`` is set.

        Whether ``event`` was set (False: the deadline came first). The wait
        sleeps in slices of real time (``WAIT_SLICE_S`` at most), so that a
        deadline a test's ``MockClock`` is moved past ends it at the next one.
        """
        while True:
            if event is not None and event.is_set():
                return True
            left = deadline - self.deadline_clock()
            if left <= 0:
                return False
            if event is not None:
                event.wait(min(left, WAIT_SLICE_S))
            else:
                time.sleep(min(left, WAIT_SLICE_S))

    def open(self) -> None:
        """Acquire the resource. Raise ``OSError`` (or any error) if it cannot be had."""

    def write(self, data: bytes) -> None:
        """Write ``data``: one or more whole lines, each ending in ``b"\\n"``."""
        raise NotImplementedError

    def flush(self) -> None:
        """Push what was written to where readers can see it."""

    def close(self) -> None:
        """Release the resource. Called once, also after a failed write."""

    def staged_bytes(self) -> int:
        """How many of the last bytes ``write()`` accepted are not yet delivered
        (a staging sink's; called from the sink's thread after each call)."""
        return 0

    def staged_lines(self) -> int | None:
        """How many of the last lines ``write()`` accepted are not yet delivered,
        if the sink knows (``None``: it does not). With it the tracer counts
        the first lines of a write delivered without the rest (a segment that
        ended inside it) as written, rather than only whole writes."""
        return None

    def why_staged(self) -> str | None:
        """Why what is staged is not delivered yet (the last failure), if known."""
        return None

    def discard(self) -> None:
        """Undo a successful ``open()``, leaving nothing behind (no file, no folder).

        Called instead of ``close()`` when another sink of the same tracer
        failed to open, so the tracer does not open at all; and for a staging
        sink (``stages``) the tracer stopped, whose staged batches it counted
        lost: such a sink drops what it stages rather than deliver it after
        the counts. Closes by default.
        """
        self.close()
