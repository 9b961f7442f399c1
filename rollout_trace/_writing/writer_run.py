"""One run of the sync tracer as its writer thread holds it (``sync_tracer``).

The writer thread is handed its ``WriterRun`` when it starts and touches
nothing else of the tracer's, so a thread given up on at a close deadline can
never reach into the tracer's next run.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque

from .._internals import peek_count
from .._schema.events import Event
from .engine import Engine
from .runner import FlushMark

__all__ = ["CloseMark", "QueueMark", "WriterRun"]


class QueueMark:
    """Travels through the event queue. ``reached`` is set when the writer
    gets to it, or when the writer ends first (then ``mark`` stays ``None``);
    ``boundary`` is then the seq the next event would get."""

    __slots__ = ("boundary", "deadline", "mark", "reached")

    def __init__(self, deadline: float = math.inf) -> None:
        self.boundary = 0
        self.deadline = deadline
        self.mark: FlushMark | None = None
        self.reached = threading.Event()


class CloseMark(QueueMark):
    __slots__ = ()


class WriterRun:
    """One run: its engine, queue and numbering, and its writer thread.

    The writer thread is handed its run when it starts and touches nothing
    else of the tracer's: a close that gives a run up at its deadline leaves
    the thread behind (inside a hung or slow call), and the tracer may open
    again meanwhile. When the call returns, the thread ends this run, and only
    this one: it writes nothing more, closes the sink and ends.
    """

    __slots__ = (
        "abandoned",
        "drops",
        "drops_folded",
        "engine",
        "marks",
        "next_seq",
        "open_error",
        "opened",
        "queue",
        "thread",
        "urgent",
        "wake_flag",
        "writer_done",
    )

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.queue: deque[Event | QueueMark] = deque()
        # Marks queued and not yet handled by the writer (looked for among
        # the items it drains); each is released (``reached``) by then.
        self.marks: list[QueueMark] = []
        self.drops = itertools.count()  # emits dropped at a full buffer (emitting threads)
        self.drops_folded = 0  # ... of which the writer has given seqs
        self.next_seq = 1  # the writer's
        self.wake_flag = threading.Event()
        self.urgent = False
        self.opened = threading.Event()
        self.writer_done = False  # the writer thread has handled its last mark
        self.open_error: BaseException | None = None
        # The close gave the run up at its deadline: its counts are fixed, its
        # sinks stopped; the writer thread only ends it.
        self.abandoned = False
        self.thread: threading.Thread | None = None

    def emitted_so_far(self) -> int:
        # Read from any thread: the writer's numbers, the drops it has not
        # numbered yet, and what waits in the queue (marks aside, rarely there).
        unfolded = peek_count(self.drops) - self.drops_folded
        return self.next_seq - 1 + unfolded + max(0, len(self.queue) - len(self.marks))
