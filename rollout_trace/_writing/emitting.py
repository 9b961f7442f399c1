"""What both tracers' ``emit`` says when it cannot take an event: each once."""

from __future__ import annotations

import itertools

from .._internals import peek_count
from .runner import logger

__all__ = ["EmitReport", "not_an_event", "frozen_event"]


def not_an_event(obj: object) -> TypeError:
    return TypeError(
        f"emit() takes an rollout_trace.Event, not {type(obj).__qualname__}: {obj!r:.200}"
    )


def frozen_event(ev: object) -> TypeError:
    return TypeError(
        f"emit() cannot stamp the envelope of a frozen event ({type(ev).__qualname__}); "
        "define the event class without frozen=True"
    )


class EmitReport:
    """Says each kind of trouble once per run, and counts emits outside a run."""

    __slots__ = ("_outside", "_said")

    def __init__(self) -> None:
        self._said: set[str] = set()
        # Emits made while no run was open (before the first open, after a
        # close): no trace_closed counts them. A count is atomic from threads.
        self._outside = itertools.count()

    @property
    def outside_run(self) -> int:
        return peek_count(self._outside)

    def add_outside(self, n: int) -> None:
        if n > 0:  # advance the count by n, in C
            next(itertools.islice(self._outside, n - 1, n), None)

    def quiet(self, kind: str) -> None:
        """Say nothing more of ``kind`` (it was said another way)."""
        self._said.add(kind)

    def _once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._said:
            self._said.add(kind)
            logger.warning(message, *args)

    def new_run(self) -> None:
        """A new run says its own troubles again."""
        self._said.clear()

    def full(self, buffer: int, run_id: str | None) -> None:
        # Said from the emit that dropped first, not from the writer: the
        # writer may be the part that is stuck.
        self._once(
            "full",
            "rollout_trace: the buffer of %d events is full, so new events are dropped "
            "(reported once; trace_closed counts them all): the sinks of run %s are "
            "slower than the program emits",
            buffer,
            run_id,
        )

    def not_open(self, *, closed: bool) -> None:
        next(self._outside)
        if closed:
            self._once(
                "closed",
                "rollout_trace: emit() on a closed tracer; the event is not written "
                "(reported once; counts.outside_run counts them)",
            )
        else:
            self._once(
                "new",
                "rollout_trace: emit() on a tracer that is not open yet; the event is not "
                "written (open it with `async with`/`with` first; reported once; "
                "counts.outside_run counts them)",
            )
