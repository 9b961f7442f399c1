"""Another trace-event document (``ray timeline``'s) folded into the timeline's, on one clock.

Ray writes a JSON array of trace events, complete events (``X``) timed in
microseconds since the Unix epoch as the timeline's are. ``ray timeline`` and
``ray.timeline()`` number processes and threads by strings (a node's address,
``worker:<id>``); the dashboard's timeline numbers them from 0 and names
them in ``process_name`` / ``thread_name`` metadata. Every process of a merged
document gets an integer pid above the runs' (one equal to a run's would
draw its events inside that run), and every thread an integer tid from 1
(the importer reads tid 0 as "the pid"), each keeping its name: the
document's own ``process_name`` / ``thread_name``, else the string it had,
else its old number.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from .._errors import RolloutTraceError

__all__ = ["EXPECTED", "Foreign", "MergeError", "load_foreign"]

EXPECTED = (
    "expected a trace-event document, as `ray timeline` writes: a JSON array of "
    'trace events, or an object with a "traceEvents" array'
)
# A merged document's flow ids start here (the timeline's own start at 2**32).
_FOREIGN_FLOWS = 1 << 48
# Metadata about a process, not a thread: its tid means nothing.
_PROCESS_META = frozenset({"process_name", "process_labels", "process_sort_index"})

_Key = tuple[str, Any]


class MergeError(RolloutTraceError):
    """A ``--merge`` file that cannot be read, or is not a trace-event document."""


def _key(v: Any) -> _Key:
    # 1 and "1" and 1.0 are three processes, as the JSON says.
    if v is None or isinstance(v, str | int | float):
        return (type(v).__name__, v)
    return (type(v).__name__, repr(v))


@dataclass
class Foreign:
    """A merged document's events, to be written with integer pids from ``first_pid``."""

    path: str
    events: list[dict[str, Any]]
    first_pid: int = 1
    # Old pid -> new pid, and (new pid, old tid) -> new tid; made by `renumber`.
    pids: dict[_Key, int] = field(default_factory=dict)
    tids: dict[tuple[int, _Key], int] = field(default_factory=dict)
    _named: set[tuple[str, int, int]] = field(default_factory=set)
    _tid_count: dict[int, int] = field(default_factory=dict)

    def renumber(self, first_pid: int) -> int:
        """Give every process a pid from ``first_pid``; the first pid left free."""
        self.first_pid = first_pid
        self.pids, self.tids, self._named, self._tid_count = {}, {}, set(), {}
        for ev in self.events:
            pid, tid = self._ids(ev)
            name = ev.get("name")
            if ev["ph"] == "M" and name in ("process_name", "thread_name"):
                self._named.add((name, pid, tid if name == "thread_name" else 0))
        return first_pid + len(self.pids)

    def _ids(self, ev: dict[str, Any]) -> tuple[int, int]:
        pid = self.pids.setdefault(_key(ev.get("pid")), self.first_pid + len(self.pids))
        if ev["ph"] == "M" and ev.get("name") in _PROCESS_META:
            return pid, 0
        key = (pid, _key(ev.get("tid")))
        tid = self.tids.get(key)
        if tid is None:
            tid = self.tids[key] = self._tid_count[pid] = self._tid_count.get(pid, 0) + 1
        return pid, tid

    def trace_events(self) -> Iterator[dict[str, Any]]:
        """Its events with the new ids, then a name for each process or thread that had none.

        Its flows' ``bind_id``s are numbered anew, above the timeline's own and
        apart from every other merged document's: kept, two documents' flows
        (or one's and the timeline's) would join up across them.
        """
        flows: dict[_Key, int] = {}
        base = _FOREIGN_FLOWS + (self.first_pid << 32)
        for ev in self.events:
            pid, tid = self._ids(ev)
            out = {**ev, "pid": pid, "tid": tid}
            if "bind_id" in ev:
                out["bind_id"] = flows.setdefault(_key(ev["bind_id"]), base + len(flows))
            yield out
        for (kind, old), pid in self.pids.items():
            if ("process_name", pid, 0) not in self._named:
                name = old if kind == "str" else f"pid {old}"
                yield _meta("process_name", pid, 0, name)
        for (pid, (kind, old)), tid in self.tids.items():
            if ("thread_name", pid, tid) not in self._named:
                name = old if kind == "str" else f"tid {old}"
                yield _meta("thread_name", pid, tid, name)

    def summary(self) -> dict[str, Any]:
        """What the document's ``otherData`` says of it: its file, events and new pids."""
        return {
            "file": self.path,
            "events": len(self.events),
            "pids": [[old, new] for (_, old), new in self.pids.items()],
        }


def _meta(name: str, pid: int, tid: int, value: Any) -> dict[str, Any]:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": {"name": value}}


def load_foreign(path: str) -> Foreign:
    """Read a trace-event document to merge; ``MergeError`` says what is wrong with it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise MergeError(f"cannot read --merge file {path!r}: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b":  # gzip, as trace files may be
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise MergeError(f"--merge file {path!r} is gzip that cannot be read: {exc}") from None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            # What orjson refuses and is still JSON: integers wider than 64 bits.
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise MergeError(f"--merge file {path!r} is not JSON ({exc}); {EXPECTED}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        got = (
            'an object with no "traceEvents" array'
            if isinstance(doc, dict)
            else f"a JSON {type(doc).__name__}"
        )
        raise MergeError(f"--merge file {path!r} holds {got}; {EXPECTED}")
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str):
            raise MergeError(
                f"--merge file {path!r}: event {i} is not a trace event (an object with a "
                f'"ph"): {str(ev)[:80]}; {EXPECTED}'
            )
    # A time that is not a finite number: the importer drops the event anyway,
    # and JSON has no NaN to write it with.
    kept = [ev for ev in events if "ts" not in ev or _finite(ev["ts"])]
    return Foreign(path, kept)


def _finite(ts: Any) -> bool:
    return isinstance(ts, int | float) and not isinstance(ts, bool) and math.isfinite(ts)
