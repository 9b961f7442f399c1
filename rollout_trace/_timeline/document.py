"""A trace set as a Chrome trace-event document, which Perfetto and chrome://tracing open.

Layout: one process per run (``pid`` is the run's place in the trace set, not
its OS pid, which another host may share), named by host, OS pid and run id.
Within it, a ``controller`` track holds steps, weight syncs, checkpoints,
snapshots, restores and the stop; a ``groups`` track the group events; an
``other events`` track any event this schema does not know. Attempts go on
``lane N`` tracks: each attempt takes the lowest lane free when it starts
(see ``pack_lanes``), so a run needs as many lanes as it ever had attempts
running at once. One track per sibling would give tens of thousands of mostly
empty tracks on a long run; packed lanes stay as many as the rollout slots.

An attempt is a complete event (``X``) named by its outcome, so that viewers
that colour by name (Perfetto) and viewers that honour ``cname``
(chrome://tracing) both colour it by outcome; its ids are in ``args``.
Timestamps are microseconds from the earliest time in the trace set.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import msgspec
import orjson

from .._analysis.figures import StopCost
from .._schema.decoding import AnyEvent
from .._version import __version__
from .fold import build_timeline
from .model import OUTCOME_LABELS, Attempt, Mark, RunLine, Timeline, stop_figures

__all__ = ["CNAME", "document_of", "timeline_document", "write_document"]

# Outcome -> the trace viewer's reserved colour name (catapult color_scheme).
CNAME = {
    "sealed": "good",
    "failed": "terrible",
    "dropped": "generic_work",
    "cancelled": "yellow",
    "refused": "olive",
    "abandoned_restart": "thread_state_iowait",
    "whole_group": "detailed_memory_dump",
    "unended": "thread_state_runnable",
}
_MARK_CNAME = {
    "step": "black",
    "weights": "grey",
    "checkpoint": "light_memory_dump",
    "snapshot": "background_memory_dump",
    "group": "generic_work",
    "opened": "grey",
    "closed": "grey",
    "other": "generic_work",
}

# Track ids within a run's process; lanes follow.
_CONTROLLER, _GROUPS, _OTHER, _FIRST_LANE = 0, 1, 2, 10
_TRACK_OF = {"group": _GROUPS, "other": _OTHER}
# Timestamps stay finite: times at the ends of the float range are further
# apart than a float can say in microseconds, and JSON has no infinity.
_MAX_US = sys.float_info.max
# Trace events encoded per call when writing.
_CHUNK = 4096

Us = Callable[[float], float]


def timeline_document(events: Iterable[AnyEvent]) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...], ...}``) of a trace set.

    Write it with ``json.dump`` and open it in https://ui.perfetto.dev or
    chrome://tracing. Every attempt is in it, however many there are.
    """
    return document_of(build_timeline(events))


def document_of(tl: Timeline) -> dict[str, Any]:
    """The trace-event document of an already built ``Timeline``."""
    return {"traceEvents": list(trace_events(tl)), **_tail(tl)}


def write_document(tl: Timeline, out: BinaryIO) -> int:
    """Write the document as JSON to ``out``, a chunk of events at a time; the bytes written.

    The same JSON as ``document_of`` gives, without holding every trace
    event as a dict at once.
    """
    written = out.write(b'{"traceEvents":[')
    first = True
    events = trace_events(tl)
    while chunk := list(itertools.islice(events, _CHUNK)):
        data = _dumps(chunk)[1:-1]
        written += out.write(data if first else b"," + data)
        first = False
    written += out.write(b"]," + _dumps(_tail(tl))[1:])
    return written


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        # An integer wider than 64 bits, or a user's struct in an event's
        # fields: msgspec writes both (and, like orjson, a non-finite float
        # as null, so the JSON stays plain JSON).
        return msgspec.json.encode(obj)


def _tail(tl: Timeline) -> dict[str, Any]:
    return {
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": f"rollout_trace {__version__}",
            "time_origin_unix_s": tl.t0,
            "runs": len(tl.runs),
            "attempts": tl.attempt_count,
            # What the restore-cost analysis noted, as `rollout-trace cost --json` lists it.
            "notes": [msgspec.to_builtins(n) for n in tl.notes],
        },
    }


def trace_events(tl: Timeline) -> Iterator[dict[str, Any]]:
    """Every trace event of the document, run by run, then the stops."""
    t0 = tl.t0

    def us(t: float) -> float:
        # Microseconds, rounded to the nanosecond the wire format can carry.
        v = (t - t0) * 1e6
        if not v <= _MAX_US:
            return _MAX_US if v > 0 else 0.0  # infinity, or NaN from an event built in Python
        return round(v, 3)

    for run in tl.runs:
        pid = run.index + 1
        yield from _metadata(run, pid)
        for a in run.attempts:
            yield _attempt(a, pid, us, tl)
        for m in run.marks:
            yield from _mark(m, pid, us)
        for r in run.restores:
            start = us(r.started)
            end = start if r.finished is None else us(r.finished)
            args: dict[str, Any] = {"path": r.path, "step": r.step}
            if r.finished is None:
                args["finished"] = "no restore_finished in this run"
            yield _complete(
                "restore", "restore", start, end, pid, _CONTROLLER, args, "rail_animation"
            )
    by_id = {r.run_id: r for r in tl.runs}
    for i, stop in enumerate(tl.stops, 1):
        yield from _stop(i, stop, by_id, us)


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": args}


def _metadata(run: RunLine, pid: int) -> list[dict[str, Any]]:
    state = "closed cleanly" if run.closed else "no trace_closed"
    out = [
        _meta("process_name", pid, 0, {"name": f"{run.label} ({state})"}),
        _meta("process_sort_index", pid, 0, {"sort_index": pid}),
        _meta("process_labels", pid, 0, {"labels": run.run_id}),
    ]
    tracks = [(_CONTROLLER, "controller")]
    kinds = run.marks.kinds()
    if "group" in kinds:
        tracks.append((_GROUPS, "groups"))
    if "other" in kinds:
        name = "other events"
        if run.others_cut:
            name = "other events (the first of them only; rollout-trace summary counts all)"
        tracks.append((_OTHER, name))
    tracks += [(_FIRST_LANE + lane, f"lane {lane}") for lane in range(run.lanes)]
    for tid, name in tracks:
        out.append(_meta("thread_name", pid, tid, {"name": name}))
        out.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
    return out


def _complete(
    name: str,
    cat: str,
    start: float,
    end: float,
    pid: int,
    tid: int,
    args: dict[str, Any],
    cname: str,
) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "ts": start,
        "dur": max(0.0, round(end - start, 3)),
        "pid": pid,
        "tid": tid,
        "cname": cname,
        "args": args,
    }


def _instant(
    name: str, cat: str, ts: float, pid: int, tid: int, args: dict[str, Any], cname: str
) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "t",
        "name": name,
        "cat": cat,
        "ts": ts,
        "pid": pid,
        "tid": tid,
        "cname": cname,
        "args": args,
    }


def _attempt(a: Attempt, pid: int, us: Us, tl: Timeline) -> dict[str, Any]:
    args: dict[str, Any] = {
        "outcome": a.outcome,
        "group_id": a.group_id,
        "prompt_id": a.prompt_id,
        "generation_index": a.generation_index,
        "attempt": a.attempt,
    }
    if a.reason is not None:
        args["reason"] = a.reason
    if a.weight_version is not None:
        args["weight_version"] = a.weight_version
    if a.resumed_turn is not None:
        args["resumed_from_turn"] = a.resumed_turn
    if not a.started:
        args["started"] = "in an earlier run (no dispatch or resume in this one)"
    if a.fate is not None:
        args.update(_fate_args(a, tl))
    return _complete(
        OUTCOME_LABELS[a.outcome],
        "attempt",
        us(a.start),
        us(a.end),
        pid,
        _FIRST_LANE + a.lane,
        args,
        CNAME[a.outcome],
    )


def _fate_args(a: Attempt, tl: Timeline) -> dict[str, str]:
    """What stop ``a.stop`` did to the attempt, in words, under the name of its figure."""
    stop = tl.stops[a.stop - 1]
    b = tl.run_number(stop.restored_run)
    if a.fate == "redone":
        return {
            "redone": f"sealed after the state run {b} restored at stop {a.stop} was captured, "
            "so done again (counted in redone)"
        }
    return {
        "after_stop": f"{a.fate} by run {b} at stop {a.stop} "
        f"(in flight at the stop; counted in {a.fate})"
    }


def _mark(m: Mark, pid: int, us: Us) -> list[dict[str, Any]]:
    tid = _TRACK_OF.get(m.kind, _CONTROLLER)
    cname = _MARK_CNAME[m.kind]
    args = m.args
    out = [_instant(m.name, m.kind, us(m.time), pid, tid, args, cname)]
    if m.captured_at is not None:
        # A second instant where the snapshot's state was taken: the gap to
        # the publish is work that a restore from it does again.
        args = {**args, "published_at": m.time}
        out.append(_instant(f"{m.name} captured", m.kind, us(m.captured_at), pid, tid, args, cname))
    return out


def _stop(i: int, stop: StopCost, by_id: dict[str, RunLine], us: Us) -> list[dict[str, Any]]:
    a_run = by_id.get(stop.stopped_run) if stop.stopped_run is not None else None
    b_run = by_id.get(stop.restored_run) if stop.restored_run is not None else None
    figures, reasons = stop_figures(stop)
    args: dict[str, Any] = {"stopped_run": stop.stopped_run, "restored_run": stop.restored_run}
    args.update(figures)
    if reasons:
        args["reasons"] = reasons
    args["restore_path"] = stop.restore_path
    stop_time, downtime = figures["stop_time"], figures["downtime_s"]
    out = []
    if a_run is not None and stop_time is not None:
        out.append(
            _instant(
                f"stop {i}", "stop", us(stop_time), a_run.index + 1, _CONTROLLER, args, "terrible"
            )
        )
    elif b_run is not None:
        # The stopped run is not in the trace set: the figures go where the
        # restore begins, so that they are still in the document.
        at = b_run.restores[0].started if b_run.restores else b_run.first_time
        out.append(
            _instant(f"stop {i}", "stop", us(at), b_run.index + 1, _CONTROLLER, args, "terrible")
        )
    if a_run is not None and b_run is not None and stop_time is not None and downtime is not None:
        out.append(
            _complete(
                f"downtime (stop {i})",
                "stop",
                us(stop_time),
                us(stop_time + downtime),
                b_run.index + 1,
                _CONTROLLER,
                {"downtime_s": downtime, "stopped_run": stop.stopped_run},
                "generic_work",
            )
        )
    return out
