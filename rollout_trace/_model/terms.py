"""The words every command uses about a trace set, each defined once.

A **try** is one start (``attempt_dispatched`` or ``attempt_resumed``) of one
attempt number of one sibling in one run, together with the event that ends
it; an end that finds no open try of its ``(sibling, attempt)`` is a try of its
own with no start (``started`` false, zero length at the end's time).

How a try ends (``EndKind``): ``SEALED``, ``REFUSED`` or ``ABANDONED`` by an
end event of its attempt; ``SUPERSEDED`` when a later start of the same
``(sibling, attempt)`` came before any end; ``OPEN`` when nothing ended it by
the run's last event. A try is **open** when it is ``OPEN`` and **sealed**
when it is ``SEALED``; a superseded try is not open.

Its **outcome** (the tables' word): ``sealed``, ``refused``, the abandon
reason (``restart`` reads ``abandoned_restart``; a reason outside the schema,
only possible from events built in Python, reads ``dropped``), or ``unended``
for an open or superseded try.

**The run order**: runs are ordered by the time of their lowest-seq
``trace_opened``, else of their lowest-seq event, then by run id.

**A use of a sibling** (``same_use``): a start after a seal of the sibling
continues the use that seal ended when it is in the same group and has a
higher attempt number, or the seal was in another run whose restored state
does not hold its result (the stop after that run did not find the seal at or
before the capture: ``stops``); anything else begins a new use. A resume goes
on with the try it resumes.

A seq is **usable** when a tracer could have given it, ``0 <= seq < 2**62``;
events with any other seq are counted and otherwise left out.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from .._schema.events import (
    AttemptAbandoned,
    AttemptDispatched,
    AttemptRefused,
    AttemptResumed,
    AttemptSealed,
    GroupAdmitted,
    GroupDiscarded,
    GroupReserved,
    GroupSealed,
    RestoreFinished,
    RestoreStarted,
    SnapshotPublished,
    StepTrained,
    TraceClosed,
    TraceOpened,
    TrainerCheckpointPublished,
    WeightsSynced,
)

__all__ = [
    "END_ABANDONED",
    "END_OPEN",
    "END_REFUSED",
    "END_SEALED",
    "END_SUPERSEDED",
    "OPEN_FLAGS",
    "ABANDONED",
    "DISPATCHED",
    "KIND",
    "OTHER",
    "OUTCOMES",
    "PLAIN_OUTCOME",
    "REFUSED",
    "RESTORE_FINISHED",
    "RESTORE_STARTED",
    "RESUMED",
    "SEALED",
    "SEQ_LIMIT",
    "SNAPSHOT",
    "CHECKPOINT",
    "STEP",
    "OPENED",
    "CLOSED",
    "EndKind",
    "canonical",
    "is_attempt",
    "is_rollout",
    "kind_of",
    "outcome_of",
    "run_order_key",
    "same_use",
    "usable",
]

# Kind codes, one per built-in event class; families are code ranges.
OTHER = 0  # UnknownEvent and users' own classes
DISPATCHED, RESUMED, SEALED, REFUSED, ABANDONED = 1, 2, 3, 4, 5
GROUP_RESERVED, GROUP_ADMITTED, GROUP_SEALED, GROUP_DISCARDED = 6, 7, 8, 9
STEP, WEIGHTS, CHECKPOINT, SNAPSHOT = 10, 11, 12, 13
RESTORE_STARTED, RESTORE_FINISHED = 14, 15
OPENED, CLOSED = 16, 17

# By exact class: a subclass of a built-in is a user's event, as the folds have it.
KIND: dict[type[Any], int] = {
    AttemptDispatched: DISPATCHED,
    AttemptResumed: RESUMED,
    AttemptSealed: SEALED,
    AttemptRefused: REFUSED,
    AttemptAbandoned: ABANDONED,
    GroupReserved: GROUP_RESERVED,
    GroupAdmitted: GROUP_ADMITTED,
    GroupSealed: GROUP_SEALED,
    GroupDiscarded: GROUP_DISCARDED,
    StepTrained: STEP,
    WeightsSynced: WEIGHTS,
    TrainerCheckpointPublished: CHECKPOINT,
    SnapshotPublished: SNAPSHOT,
    RestoreStarted: RESTORE_STARTED,
    RestoreFinished: RESTORE_FINISHED,
    TraceOpened: OPENED,
    TraceClosed: CLOSED,
}

# Every way a try can end, as the tables and the page's legend list them.
OUTCOMES = (
    "sealed",
    "failed",
    "dropped",
    "cancelled",
    "refused",
    "abandoned_restart",
    "whole_group",
    "unended",
)

# Seqs are kept in signed 64-bit columns; a larger one is corrupt data.
SEQ_LIMIT = 1 << 62


def kind_of(ev: Any) -> int:
    """The kind code of an event (``OTHER`` for any class not built in)."""
    return KIND.get(type(ev), OTHER)


def usable(seq: int) -> bool:
    """Whether a tracer could have given ``seq``."""
    return 0 <= seq < SEQ_LIMIT


def is_attempt(kind: int) -> bool:
    return DISPATCHED <= kind <= ABANDONED


def is_rollout(kind: int) -> bool:
    """A rollout event: every built-in kind but the lifecycle ones. Its first, by
    seq, tells whether a run's rollout work begins with a restore."""
    return DISPATCHED <= kind <= RESTORE_FINISHED


class EndKind(enum.IntEnum):
    """How a try ended; see the module's definitions."""

    OPEN = 0
    SEALED = 1
    REFUSED = 2
    ABANDONED = 3
    SUPERSEDED = 4


# The end kinds as plain ints, for loops over tries: a member's look-up and
# comparison cost more.
END_OPEN, END_SEALED, END_REFUSED = int(EndKind.OPEN), int(EndKind.SEALED), int(EndKind.REFUSED)
END_ABANDONED, END_SUPERSEDED = int(EndKind.ABANDONED), int(EndKind.SUPERSEDED)
# End kind -> 1 for an open try, else 0: the rule above as a ``bytes.translate`` table.
OPEN_FLAGS = bytes(1 if k == END_OPEN else 0 for k in range(256))

END_OF_KIND = {SEALED: EndKind.SEALED, REFUSED: EndKind.REFUSED, ABANDONED: EndKind.ABANDONED}


# The outcome of every end but an abandon's, which its reason tells.
PLAIN_OUTCOME = {
    int(EndKind.OPEN): "unended",
    int(EndKind.SEALED): "sealed",
    int(EndKind.REFUSED): "refused",
    int(EndKind.SUPERSEDED): "unended",
}


def outcome_of(end: int, reason: str | None) -> str:
    """The tables' outcome of a try that ended as ``end`` (an ``EndKind``;
    ``reason``: an abandon's)."""
    plain = PLAIN_OUTCOME.get(end)
    if plain is not None:
        return plain
    if reason == "restart":
        return "abandoned_restart"
    return reason if reason in OUTCOMES else "dropped"


def run_order_key(opened_at: float | None, first_time: float, run_id: str) -> tuple[float, str]:
    """Where a run stands in the run order: its ``trace_opened`` time, else its first event's."""
    return (opened_at if opened_at is not None else first_time, run_id)


def same_use(
    sealed_group: str,
    sealed_attempt: int,
    sealed_run: str,
    group: str,
    attempt: int,
    run: str,
    kept: bool = False,
) -> bool:
    """Whether a start continues the use of a sibling whose last seal it follows.

    It does when it is in the seal's group and has a higher attempt number, or
    the seal was in another run (a restore carried the group over) and is not
    ``kept``: the state restored after that run holds it (sealed at or before
    the capture), so the restored run starting the sibling again is a new use.
    """
    return group == sealed_group and (attempt > sealed_attempt or (run != sealed_run and not kept))


# Fields sorted: two lines that decode to one event encode alike, however spelled.
_encode = msgspec.json.Encoder(order="sorted").encode


def canonical(ev: Any) -> bytes:
    """The event's canonical encoding: equal exactly when two lines are one event.

    Also the order of versions (lines of one seq that differ): ascending.
    """
    return _encode(ev)
