"""What ``rollout-trace summary`` says of each run, read off the model.

Per run (``runs.normalize``): who wrote it (its lowest-seq ``trace_opened``),
when (the earliest and latest time of a kept event), what (its kept events:
each seq once, or once per version where its lines differ), its seq gaps, its
copies (``same_file``: a duplicate seq; ``other_file``: the same event read
again from another file) and its versions. The lines the model leaves out for
their seq are counted too, settled by the same rule (``checks.LeftOut``).
Runs come in the run order (``terms.run_order_key``); a run with no usable
seq, which has no place in it, after the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec

from .._schema.decoding import UnknownEvent
from .checks import LeftOut, seq_gaps, seq_ranges
from .runs import Collector, RunEvents, normalize
from .terms import CLOSED, KIND, OPENED, OTHER, kind_of

__all__ = ["TABLE_COLUMNS", "RunSummary", "summarize"]

# The columns of ``rollout-trace summary``'s table, each a key of a run's
# ``--json`` object with the same meaning (the table formats the value).
TABLE_COLUMNS = (
    "run_id",
    "host",
    "pid",
    "first_time",
    "last_time",
    "span_s",
    "events",
    "missing_seqs",
    "duplicate_seqs",
    "conflicts",
    "torn_lines",
    "invalid_lines",
    "closed",
)


class RunSummary(msgspec.Struct, kw_only=True):
    """What ``rollout-trace summary`` reports for one run.

    ``events`` counts the run's events, each ``(run_id, seq)`` once, or once
    per version where lines of one seq differ; ``read_twice`` the lines that
    were the same event read again from another file (not in ``events``);
    ``duplicate_seqs`` the lines that repeat a seq of their own file (not in
    ``events`` either); ``conflicts`` the seqs whose lines differ
    (``conflict_seqs``, as ranges).
    """

    run_id: str
    files: list[str]
    host: str | None
    pid: int | None
    first_time: float
    last_time: float
    span_s: float
    events: int
    events_by_name: dict[str, int]
    seq_gaps: list[tuple[int, int]]
    missing_seqs: int
    duplicate_seqs: int
    conflicts: int
    conflict_seqs: list[tuple[int, int]]
    read_twice: int
    torn_lines: int
    invalid_lines: int
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


def _class_tag(cls: type[Any]) -> str:
    tag = cls.__struct_config__.tag
    return tag if isinstance(tag, str) else cls.__name__


_NAME = {code: _class_tag(cls) for cls, code in KIND.items()}


def _name(ev: Any) -> str:
    if isinstance(ev, UnknownEvent):
        return ev.event
    return _class_tag(type(ev))


def _events_by_name(run: RunEvents, left: LeftOut | None) -> dict[str, int]:
    out: Counter[str] = Counter()
    for code, n in Counter(run.kind).items():
        if code != OTHER:
            out[_NAME[code]] += n
    other = run.kind.find(OTHER)
    while other >= 0:
        out[_name(run.events[other])] += 1
        other = run.kind.find(OTHER, other + 1)
    if left is not None:
        out.update(_name(ev) for ev in left.events)
    return dict(sorted(out.items()))


def _summary(run: RunEvents, files: list[str]) -> tuple[tuple[int, float, str], RunSummary]:
    """A run's place in the run order, and its summary (no bad lines charged yet)."""
    left = LeftOut(run) if run.left_out else None
    kept: list[tuple[Sequence[Any], bytearray]] = [(run.events, run.kind)]
    if left is not None:
        kept.append((left.events, bytearray(kind_of(ev) for ev in left.events)))
    # The lowest-seq trace_opened; of versions of one seq, the first in the model's order.
    opened = next((evs[k.index(OPENED)] for evs, k in kept if OPENED in k), None)
    times = [*run.time, *(ev.time for ev in left.events)] if left else run.time
    first, last = min(times), max(times)
    gaps = seq_gaps(seq_ranges(run.ranges(), left.seq) if left else run.ranges())
    versions = [*run.versions, *left.versions] if left else run.versions
    # A run with no usable seq has no place in the run order: after the others,
    # by first time (and, as ``sorted`` leaves them, in the order first read).
    order = (0, *run.order) if len(run) else (1, first, "")
    summary = RunSummary(
        run_id=run.run_id,
        files=files,
        host=opened.host if opened is not None else None,
        pid=opened.pid if opened is not None else None,
        first_time=first,
        last_time=last,
        span_s=last - first,
        events=len(run) + (len(left.events) if left else 0),
        events_by_name=_events_by_name(run, left),
        seq_gaps=gaps,
        missing_seqs=sum(hi - lo + 1 for lo, hi in gaps),
        duplicate_seqs=run.same_file + (left.same_file if left else 0),
        conflicts=len(versions),
        conflict_seqs=seq_ranges((), versions),
        read_twice=run.other_file + (left.other_file if left else 0),
        torn_lines=0,
        invalid_lines=0,
        closed=any(CLOSED in k for _, k in kept),
    )
    return order, summary


def summarize(collector: Collector) -> list[RunSummary]:
    """A summary of each run the collector gathered, in the run order; no bad line
    is charged to one (``torn_lines``, ``invalid_lines``: 0)."""
    out = []
    for run_id, (events, srcs) in collector.runs.items():
        files = [collector.files[s] for s in dict.fromkeys(srcs) if s >= 0]
        out.append(_summary(normalize(run_id, events, srcs), files))
    out.sort(key=lambda x: x[0])
    return [s for _, s in out]
