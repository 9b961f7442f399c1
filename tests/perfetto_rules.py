"""The rules of Perfetto's JSON importer that the timeline's document relies on, as checks.

Written after the importer's source (trace processor: importers/json, the
slice, track and flow trackers, the sorter): events are read by ``ts``, ties
in file order; an async slice is a ``b`` and an ``e`` of the same category and
id (``id``, or ``id2`` with ``local`` / ``global``) in one process; a flow is
bound to the slice an event begins (``b``, ``X``, ``n``) through its
``bind_id`` with ``flow_out`` (begin), ``flow_in`` (end) or both (a step on);
a begin of an id already begun, and a step or end of one never begun, are
dropped; counters take numeric ``args`` only; an instant's scope is ``g``,
``p`` or ``t``; ``tid`` 0 reads as the pid; only metadata may have no
``ts``. Shared by the timeline tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollout_trace._timeline.document import MAX_US

# The trace viewer's reserved colour names (catapult's color_scheme).
RESERVED_CNAMES = frozenset(
    [
        "thread_state_uninterruptible",
        "thread_state_iowait",
        "thread_state_running",
        "thread_state_runnable",
        "thread_state_sleeping",
        "thread_state_unknown",
        "background_memory_dump",
        "light_memory_dump",
        "detailed_memory_dump",
        "vsync_highlight_color",
        "generic_work",
        "good",
        "bad",
        "terrible",
        "black",
        "grey",
        "white",
        "yellow",
        "olive",
        "rail_response",
        "rail_animation",
        "rail_idle",
        "rail_load",
        "startup",
        "heap_dump_stack_frame",
        "heap_dump_object_type",
        "heap_dump_child_node_arrow",
        "cq_build_running",
        "cq_build_passed",
        "cq_build_failed",
        "cq_build_abandoned",
        "cq_build_attempt_runnig",
        "cq_build_attempt_passed",
        "cq_build_attempt_failed",
    ]
)
METADATA = frozenset(
    ["process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"]
)
# What the timeline writes of its own (a merged document may hold others).
OWN_PHASES = frozenset("XiMbeC")
_BEGINS_SLICE = frozenset("bXn")


@dataclass(frozen=True)
class Flow:
    """A flow as the importer draws it: from one event's slice to another's (indexes)."""

    id: int
    source: int
    target: int


def async_key(ev: dict[str, Any]) -> tuple[Any, ...]:
    """What pairs an async slice's ``b`` and ``e``."""
    id2 = ev.get("id2") or {}
    if "id" in ev:
        return ("global", ev.get("cat"), ev["id"])
    if "global" in id2:
        return ("global", ev.get("cat"), id2["global"])
    return ("local", ev["pid"], ev.get("cat"), id2["local"])


def check_trace_events(doc: dict[str, Any], *, own_pids: int | None = None) -> list[dict[str, Any]]:
    """Assert the importer's rules on ``doc``; its events.

    ``own_pids``: events of pids up to it are the timeline's own and are held
    to its layout too (a merged document's events keep theirs).
    """
    events: list[dict[str, Any]] = doc["traceEvents"]
    assert isinstance(events, list)
    json.dumps(doc, allow_nan=False)  # plain JSON: no NaN or infinity
    for ev in events:
        for key in ("ph", "pid", "tid"):
            assert key in ev, (key, ev)
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        # The importer drops any other event without a time.
        assert ev["ph"] == "M" or isinstance(ev["ts"], int | float), ev
        own = own_pids is None or ev["pid"] <= own_pids
        if not own:
            continue
        assert "name" in ev, ev
        assert ev["ph"] in OWN_PHASES, ev
        if ev["ph"] == "M":
            assert ev["name"] in METADATA, ev
            continue
        assert 0 <= ev["ts"] <= MAX_US, ev
        assert ev["tid"] >= 1, ev  # 0 would read as the pid: another track
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], int | float) and 0 <= ev["dur"] <= MAX_US, ev
        if ev["ph"] == "i":
            assert ev["s"] in ("g", "p", "t"), ev
        if ev["ph"] == "C":
            assert ev["args"], ev
            for value in ev["args"].values():
                assert isinstance(value, int | float) and not isinstance(value, bool), ev
        if "cname" in ev:
            assert ev["cname"] in RESERVED_CNAMES, ev
    check_async_pairs(events)
    check_no_nesting_at_one_time(events)
    flows(events)
    return events


def check_no_nesting_at_one_time(events: list[dict[str, Any]]) -> None:
    """No two zero-length ``X`` slices of one thread at one time: the importer
    nests each under the one before (``SliceTracker``: a zero-length slice
    stays open while the next begins at its time), drops them past 512 deep,
    and binds their flows to the slice then on top."""
    seen: set[tuple[Any, Any, Any]] = set()
    for ev in events:
        if ev["ph"] == "X" and ev.get("dur") == 0:
            at = (ev["pid"], ev["tid"], ev["ts"])
            assert at not in seen, ("zero-length slices nest at one time", ev)
            seen.add(at)


def check_async_pairs(events: list[dict[str, Any]]) -> None:
    """Every ``b`` has exactly one ``e`` of its category and id, of its name, not before it."""
    begins: dict[tuple[Any, ...], dict[str, Any]] = {}
    ends: dict[tuple[Any, ...], dict[str, Any]] = {}
    for ev in events:
        if ev["ph"] in "be":
            side = begins if ev["ph"] == "b" else ends
            key = async_key(ev)
            assert key not in side, ("the id is used twice", ev)
            side[key] = ev
    assert set(begins) == set(ends), set(begins) ^ set(ends)
    for key, b in begins.items():
        e = ends[key]
        assert e["ts"] >= b["ts"], (b, e)
        assert e["name"] == b["name"], (b, e)


def flows(events: list[dict[str, Any]]) -> list[Flow]:
    """The flows the importer draws, each asserted to bind two slices of the document."""
    # Stable: ties in file order. Metadata (no time) binds no flow.
    timed = [i for i, ev in enumerate(events) if ev["ph"] != "M"]
    order = sorted(timed, key=lambda i: events[i]["ts"])
    last: dict[int, int] = {}  # flow id -> the event whose slice it leaves from
    out: list[Flow] = []
    for i in order:
        ev = events[i]
        if "bind_id" not in ev:
            continue
        assert ev["ph"] in _BEGINS_SLICE, ("a flow on an event that begins no slice", ev)
        fid = ev["bind_id"]
        assert isinstance(fid, int) and fid >= 2**32, ev  # clear of the `s`/`f` flows' numbers
        into, out_of = ev.get("flow_in", False), ev.get("flow_out", False)
        assert into or out_of, ("a bind_id with no direction", ev)
        if into:
            assert fid in last, ("a flow ends where none began", ev)
            out.append(Flow(fid, last[fid], i))
        else:
            assert fid not in last, ("a flow id begun twice", ev)
        if out_of:
            last[fid] = i
    ended = {f.id for f in out}
    assert set(last) <= ended, ("a flow that begins and never ends", set(last) - ended)
    return out
