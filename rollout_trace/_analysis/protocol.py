"""The rules a controller's events follow, one event at a time and per sibling in seq order.

The rules are the README's, sections Instrumenting a controller and Reference
> Rollout events: which numbers count from 0, and how a sibling's attempts
follow each other (a retry takes the next number; a try resumed after a
restore goes on under its number). ``validate`` applies them.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, MutableSequence
from typing import Any, Literal, NamedTuple, Union

from .._reading.lean import ATTEMPT_KIND, DISPATCHED, RESUMED
from .._schema.decoding import UnknownEvent
from .._schema.events import (
    SCHEMA_VERSION,
    Event,
    GroupReserved,
    SnapshotPublished,
    TraceClosed,
    TraceOpened,
)

__all__ = [
    "AttemptLog",
    "CHECKED",
    "Problem",
    "SiblingKey",
    "clock_of",
    "event_problems",
    "split_where",
    "where_of",
]

SiblingKey = tuple[Union[int, str], int]  # noqa: UP007

# Unix seconds of a trace written this century: 2001-09-09 to the year 5138.
# Below is a monotonic clock or a time since start; above, milliseconds.
UNIX_MIN = 1e9
UNIX_MAX = 1e11

# An event's place: the index of its file in the trace set, and its line;
# an attempt event's kind goes below it.
_LINE_BITS = 40
_KIND_BITS = 3
_KIND_MASK = (1 << _KIND_BITS) - 1
# generation_index below this shares one integer with prompt_id in a sibling's key.
_GEN_LIMIT = 1 << 32

# The fields each event has that count from 0, and why (README: Identity and
# Reference > Rollout events and Lifecycle events). A step, a turn or a weight
# version may be any integer: the README gives them no lower bound.
_FROM_ZERO: dict[type[Event], tuple[tuple[str, str], ...]] = {
    GroupReserved: (("size", "how many generations the group has"),),
    TraceClosed: tuple(
        (name, "a count of the run's events")
        for name in ("emitted", "written", "dropped", "invalid")
    ),
}
_SIBLING_FIELDS: tuple[tuple[str, str], ...] = (
    ("generation_index", "a sibling's slot in its group, from 0 to size - 1"),
    ("attempt", "a sibling's tries counted from 0"),
)


# The classes ``event_problems`` has rules for, besides the attempt events
# (which break one only with a negative attempt or generation_index).
CHECKED: frozenset[type[Any]] = frozenset({*_FROM_ZERO, TraceOpened, SnapshotPublished})


class Problem(NamedTuple):
    """One rule an event breaks: ``error`` or ``warning``, and what is wrong."""

    severity: Literal["error", "warning"]
    reason: str


def where_of(file_index: int, line: int) -> int:
    """A file's index and a line, packed into one integer (see ``AttemptLog``)."""
    return (file_index << _LINE_BITS) | line


def split_where(where: int) -> tuple[int, int]:
    """The file index and line packed by ``where_of``."""
    return where >> _LINE_BITS, where & ((1 << _LINE_BITS) - 1)


def clock_of(t: float) -> str | None:
    """None for Unix seconds; else what the number looks like instead."""
    if t < UNIX_MIN:
        return "a monotonic clock or a time since start (before 2001)"
    if t > UNIX_MAX:
        return "milliseconds (after the year 5000 in seconds)"
    return None


def event_problems(ev: Event | UnknownEvent) -> list[Problem]:
    """What is wrong with one event on its own, whatever the rest of its run holds.

    Only attempt events and those of the classes in ``CHECKED`` can have a problem here.
    """
    out: list[Problem] = []
    kind: Any = type(ev)
    fields = _SIBLING_FIELDS if kind in ATTEMPT_KIND else _FROM_ZERO.get(kind, ())
    for name, meaning in fields:
        value = getattr(ev, name)
        if value < 0:
            out.append(Problem("error", f"{name} {value} is negative; it is {meaning}, from 0"))
    if isinstance(ev, TraceClosed):
        for i, sink in enumerate(ev.sinks):
            if sink.written < 0:
                out.append(
                    Problem(
                        "error",
                        f"sinks[{i}].written {sink.written} is negative; it counts the lines "
                        f"sink {sink.uri!r} wrote, from 0",
                    )
                )
    elif isinstance(ev, TraceOpened) and ev.schema != SCHEMA_VERSION:
        out.append(
            Problem(
                "warning",
                f"trace_opened says schema {ev.schema!r}; this reader knows schema "
                f"{SCHEMA_VERSION} only and checks the run against it",
            )
        )
    elif isinstance(ev, SnapshotPublished):
        out.extend(_captured_at_problems(ev))
    return out


def _captured_at_problems(ev: SnapshotPublished) -> list[Problem]:
    c = ev.captured_at
    if c < 0:
        return [Problem("error", f"captured_at {c!r} is negative; expected Unix seconds")]
    looks, time_looks = clock_of(c), clock_of(ev.time)
    if looks == time_looks:
        # Both on one clock: Unix seconds, or a tracer's own clock= that the
        # controller used for captured_at too; the figures compare them.
        return []
    said = f"looks like {looks}" if looks else "is Unix seconds"
    time_said = f"looks like {time_looks}" if time_looks else "is Unix seconds"
    return [
        Problem(
            "error",
            f"captured_at {c!r} {said} but the event's time {ev.time!r} {time_said}: "
            "captured_at is the wall-clock time in Unix seconds, on the clock of the "
            "event times, which the redone figure compares it with",
        )
    ]


# An attempt's state in its run, as its events say in seq order.
_OPEN = 1
_RESUMED = 2
_ENDED = 4


class _State:
    __slots__ = ("end", "flags", "start")

    def __init__(self) -> None:
        self.flags = 0
        self.start = -1  # where it was last dispatched or resumed
        self.end = -1  # where it last ended


class AttemptLog:
    """One run's attempt events, kept until the run is read whole, then checked per sibling.

    Lines and files may come in any order, so the checks wait for the end and
    walk each sibling's events sorted by seq. Memory is four integers per
    attempt event (in arrays; a list for a number wider than 64 bits) and one
    entry per sibling; the other events are not kept.
    """

    __slots__ = ("_attempt", "_head", "_next", "_seq", "_where")

    def __init__(self) -> None:
        # Sibling -> its latest record; each record links to the one before
        # through _next (-1 ends the chain).
        self._head: dict[Any, int] = {}
        self._seq: MutableSequence[int] = array("q")
        self._attempt: MutableSequence[int] = array("q")
        self._where: MutableSequence[int] = array("q")  # where_of(...) << 3 | kind
        self._next: MutableSequence[int] = array("q")

    def __len__(self) -> int:
        return len(self._next)

    def add(self, kind: int, ev: Any, where: int) -> None:
        """Keep attempt event ``ev``, of kind ``kind`` (``ATTEMPT_KIND``), found at ``where``."""
        p, g = ev.prompt_id, ev.generation_index
        # One integer stands for the usual sibling, half the memory of a tuple.
        key: Any = (p << 32) | g if type(p) is int and 0 <= g < _GEN_LIMIT else (p, g)
        head = self._head
        nxt = self._next
        nxt.append(head.get(key, -1))
        head[key] = len(nxt) - 1
        try:
            self._seq.append(ev.seq)
        except OverflowError:
            self._seq = [*self._seq, ev.seq]
        try:
            self._attempt.append(ev.attempt)
        except OverflowError:
            self._attempt = [*self._attempt, ev.attempt]
        try:
            self._where.append(where << _KIND_BITS | kind)
        except OverflowError:  # past a million files
            self._where = [*self._where, where << _KIND_BITS | kind]

    def check(
        self, place: Callable[[int], str], *, ties: bool = False
    ) -> Iterator[tuple[int, str, str, str]]:
        """Each break of the attempt rules: where, which sibling, and what is wrong.

        ``place`` names a packed place (``where_of``) for the messages, e.g.
        ``file:line``. ``ties``: two events may share a seq (conflicting
        copies of a line); they are then ordered by what they are and where,
        not by which came first.
        """
        seq, nxt, attempt, where = self._seq, self._next, self._attempt, self._where
        for key, head in self._head.items():
            chain = []
            i = head
            while i >= 0:
                chain.append(i)
                i = nxt[i]
            chain.sort(key=seq.__getitem__)
            if ties:
                chain.sort(
                    key=lambda i: (
                        seq[i],
                        attempt[i],
                        where[i] & _KIND_MASK,
                        place(where[i] >> _KIND_BITS),
                    )
                )
            sibling = key if isinstance(key, tuple) else (key >> 32, key & (_GEN_LIMIT - 1))
            yield from self._check_sibling(sibling, chain, place)

    def _check_sibling(
        self, key: SiblingKey, chain: list[int], place: Callable[[int], str]
    ) -> Iterator[tuple[int, str, str, str]]:
        states: dict[int, _State] = {}
        top = -1  # the highest attempt started, and where
        top_at = -1
        for i in chain:
            attempt, packed = self._attempt[i], self._where[i]
            kind, where = packed & _KIND_MASK, packed >> _KIND_BITS
            state = states.get(attempt)
            if state is None:
                state = states[attempt] = _State()
            if kind == DISPATCHED:
                found = _dispatch_break(attempt, state, top, top_at, place)
                if found is not None:
                    severity, reason = found
                    sibling = f"prompt_id {key[0]!r}, generation_index {key[1]}"
                    yield where, sibling, severity, reason
                state.flags = _OPEN
                state.start = where
            elif kind == RESUMED:
                state.flags = _OPEN | _RESUMED
                state.start = where
            else:  # sealed, refused or abandoned: the try ended
                state.flags = (state.flags & _RESUMED) | _ENDED
                state.end = where
                continue
            if attempt > top or top_at < 0:
                top, top_at = attempt, where


def _dispatch_break(
    attempt: int, state: _State, top: int, top_at: int, place: Callable[[int], str]
) -> tuple[Literal["error", "warning"], str] | None:
    """What is wrong with dispatching ``attempt`` now, if anything, and how badly."""
    if state.flags & _RESUMED:
        return "error", (
            f"attempt {attempt} dispatched after attempt_resumed of the same attempt "
            f"(at {place(state.start)}); a resumed try goes on without a new dispatch, and one "
            "that starts over is abandoned (reason restart) and dispatched with the next number"
        )
    if state.flags & _OPEN:
        return "error", (
            f"attempt {attempt} dispatched again while it is open (at {place(state.start)}, with "
            "no attempt_sealed, attempt_refused or attempt_abandoned since); expected the "
            "try to end first, and a retry to take the next number"
        )
    if top_at >= 0 and top > attempt:
        return "error", (
            f"attempt numbers go back: attempt {attempt} dispatched after attempt {top} "
            f"started (at {place(top_at)}); a retry takes the next number, {top + 1}"
        )
    if state.flags & _ENDED:
        # A warning: a controller that numbers tries per group from 0 does this
        # when a later epoch reserves the same prompt again (the README's own
        # example does), which only a new group_id tells apart from a reuse.
        return "warning", (
            f"attempt {attempt} dispatched again after it ended (at {place(state.end)}); "
            f"a retry takes the next number, {max(top, attempt) + 1} (unless this is a new "
            "group of the same prompt, e.g. in a later epoch)"
        )
    return None
