"""A trace set as a Chrome trace-event document, laid out for Perfetto's JSON importer.

Layout: one process per run (``pid`` is the run's place in the trace set, from
1, not its OS pid, which another host may share), named by host, OS pid and
run id. Its threads (tids from 1: the importer reads tid 0 as "the pid") are
``controller`` (steps, weight syncs, checkpoints, snapshots, restores,
downtime), ``groups``, ``other events`` (kinds this schema does not know),
``trained`` (where the flows of trained tries end, see ``links``) and
``attempts``.

An attempt is an async slice: a ``b`` and an ``e`` event with the category
``attempt`` and an id unique in the document, so that tries running at once
are drawn apart however they overlap. The id is process-scoped
(``id2.local``): Perfetto puts async slices with a plain ``id`` on global
tracks, away from their run, and those with a local id under their process,
on tracks of their name, as many as are open at once. The name is the outcome and ``cname`` its
reserved colour, so viewers that colour by name (Perfetto) and those that
honour ``cname`` (chrome://tracing) both colour by outcome; the ids are in
``args``. Flows go from a try that did not seal, or whose seal was thrown
away, to the next try of its sibling's use, and from a sealed try to the
step that trained it (``links``).

Each run has counters (``C``, numeric args only): the tries in flight, at
every start and end, and the policy lag of each step (``policy lag (max)``,
``policy lag (p50)``). A stop is a global instant (``s: g``).

Timestamps are microseconds since the Unix epoch (the clock of ``time.time()``
and of ``ray timeline``), so another trace-event document can be merged in
on the same axis (``merge``). A float holds such a time (about 1.8e15 µs) to
a quarter of a microsecond.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import msgspec
import orjson

from .._model.stops import StopCost
from .._schema.decoding import AnyEvent
from .._version import __version__
from .links import FLOW_IN, FLOW_OUT, RunLinks, in_flight, plan_links
from .merge import Foreign
from .model import OUTCOME_LABELS, Attempt, Mark, RunLine, Timeline, build_timeline, stop_figures

__all__ = [
    "CNAME",
    "MAX_US",
    "document_of",
    "timeline_document",
    "trace_events",
    "us",
    "write_document",
]

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

# Track ids within a run's process.
_CONTROLLER, _GROUPS, _OTHER, _TRAINED, _ATTEMPTS = 1, 2, 3, 4, 5
_TRACK_OF = {"group": _GROUPS, "other": _OTHER}
# The latest time written, in µs (the year 2255): past it a float no longer
# holds whole microseconds, and the importer's int64 nanoseconds soon overflow.
# Times before the epoch are written as 0. JSON has no infinity or NaN.
MAX_US = float(2**53)
# Trace events encoded per call when writing.
_CHUNK = 4096


def timeline_document(events: Iterable[AnyEvent]) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...], ...}``) of a trace set.

    Write it with ``json.dump`` and open it in https://ui.perfetto.dev or
    chrome://tracing. Every attempt is in it, however many there are.
    """
    return document_of(build_timeline(events))


def document_of(tl: Timeline, merge: Sequence[Foreign] = ()) -> dict[str, Any]:
    """The trace-event document of an already built ``Timeline``, with ``merge``'s events."""
    return {"traceEvents": list(trace_events(tl, merge)), **_tail(tl, merge)}


def write_document(tl: Timeline, out: BinaryIO, merge: Sequence[Foreign] = ()) -> int:
    """Write the document as JSON to ``out``, a chunk of events at a time; the bytes written.

    The same JSON as ``document_of`` gives, without holding every trace
    event as a dict at once.
    """
    written = out.write(b'{"traceEvents":[')
    first = True
    events = trace_events(tl, merge)
    while chunk := list(itertools.islice(events, _CHUNK)):
        data = _dumps(chunk)[1:-1]
        written += out.write(data if first else b"," + data)
        first = False
    written += out.write(b"]," + _dumps(_tail(tl, merge))[1:])
    return written


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        # An integer wider than 64 bits, or a user's struct in an event's
        # fields: msgspec writes both (and, like orjson, a non-finite float
        # as null, so the JSON stays plain JSON).
        return msgspec.json.encode(obj)


def _tail(tl: Timeline, merge: Sequence[Foreign]) -> dict[str, Any]:
    other: dict[str, Any] = {
        "producer": f"rollout_trace {__version__}",
        "clock": "ts in microseconds since the Unix epoch",
        "time_origin_unix_s": tl.t0,
        "runs": len(tl.runs),
        "attempts": tl.attempt_count,
    }
    if merge:
        other["merged"] = [f.summary() for f in merge]
    # What the restore-cost analysis noted, as `rollout-trace cost --json` lists it.
    other["notes"] = [msgspec.to_builtins(n) for n in tl.notes]
    return {"displayTimeUnit": "ms", "otherData": other}


# From 2**49 µs (1987) on, a double is a multiple of 1/8 µs: three decimals
# already, so rounding to three (slow: about 0.7 us a call) gives it back.
_EXACT_US = float(2**49)


def us(t: float) -> float:
    """A time in seconds since the epoch as the ``ts`` written: µs, in ``[0, MAX_US]``."""
    v = t * 1e6
    if _EXACT_US <= v <= MAX_US:
        return v
    if not 0.0 <= v <= MAX_US:
        return MAX_US if v > MAX_US else 0.0  # NaN too, from an event built in Python
    return round(v, 3)


def us_each(times: Sequence[float]) -> list[float]:
    """``us`` of each time, in C where every one is past ``_EXACT_US`` (as trace times are)."""
    v = list(map(operator.mul, times, itertools.repeat(1e6)))
    if all(map(_EXACT_US.__le__, v)) and all(map(MAX_US.__ge__, v)):
        return v
    return list(map(us, times))


def trace_events(tl: Timeline, merge: Sequence[Foreign] = ()) -> Iterator[dict[str, Any]]:
    """Every trace event of the document: run by run, then the stops, then ``merge``'s."""
    plans = plan_links(tl, us)
    slice_ids = itertools.count(1)
    for run, links in zip(tl.runs, plans, strict=True):
        pid = run.index + 1
        yield from _metadata(run, pid, bool(links.trained))
        for i, a in enumerate(run.attempts):
            yield from _attempt(a, next(slice_ids), pid, tl, links.flows[i], links.flags[i])
        for m in run.marks:
            yield from _mark(m, pid)
        for r in run.restores:
            start = us(r.started)
            end = start if r.finished is None else us(r.finished)
            args: dict[str, Any] = {"path": r.path, "step": r.step}
            if r.finished is None:
                args["finished"] = "no restore_finished in this run"
            yield _complete(
                "restore", "restore", start, end, pid, _CONTROLLER, args, "rail_animation"
            )
        yield from _trained(run, links, pid)
        yield from _counters(run, links, pid)
    by_id = {r.run_id: r for r in tl.runs}
    for i, stop in enumerate(tl.stops, 1):
        yield from _stop(i, stop, by_id)
    first_pid = len(tl.runs) + 1
    for foreign in merge:
        first_pid = foreign.renumber(first_pid)
        yield from foreign.trace_events()


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "ts": 0, "pid": pid, "tid": tid, "args": args}


def _metadata(run: RunLine, pid: int, trained: bool) -> list[dict[str, Any]]:
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
    if trained:
        tracks.append((_TRAINED, "trained (a trained try's flow ends here)"))
    if run.attempts:
        tracks.append((_ATTEMPTS, "attempts"))
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
    name: str,
    cat: str,
    ts: float,
    pid: int,
    tid: int,
    args: dict[str, Any],
    cname: str,
    scope: str = "t",
) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": scope,
        "name": name,
        "cat": cat,
        "ts": ts,
        "pid": pid,
        "tid": tid,
        "cname": cname,
        "args": args,
    }


def _attempt(
    a: Attempt, slice_id: int, pid: int, tl: Timeline, flow: int, flags: int
) -> tuple[dict[str, Any], dict[str, Any]]:
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
    name = OUTCOME_LABELS[a.outcome]
    start = us(a.start)
    # The end is never before the start, as the importer needs.
    end = max(start, us(a.end))
    scope = {"local": slice_id}
    begin: dict[str, Any] = {
        "ph": "b",
        "name": name,
        "cat": "attempt",
        "id2": scope,
        "ts": start,
        "pid": pid,
        "tid": _ATTEMPTS,
        "cname": CNAME[a.outcome],
        "args": args,
    }
    if flags:
        begin["bind_id"] = flow
        if flags & FLOW_IN:
            begin["flow_in"] = True
        if flags & FLOW_OUT:
            begin["flow_out"] = True
    finish = {
        "ph": "e",
        "name": name,
        "cat": "attempt",
        "id2": scope,
        "ts": end,
        "pid": pid,
        "tid": _ATTEMPTS,
    }
    return begin, finish


def _fate_args(a: Attempt, tl: Timeline) -> dict[str, Any]:
    """What stop ``a.stop`` did to the attempt, in words, under the name of its figure,
    and the seconds of its work the stop lost (``lost_s``, where known)."""
    stop = tl.stops[a.stop - 1]
    b = tl.run_number(stop.restored_run)
    out: dict[str, Any]
    if a.fate == "redone":
        out = {
            "redone": f"sealed after the state run {b} restored at stop {a.stop} was captured, "
            "and not resumed, so done again (counted in redone)"
        }
    else:
        where = "in flight at the stop" if a.open else "sealed after the capture"
        out = {"after_stop": f"{a.fate} by run {b} at stop {a.stop} ({where}; counted in {a.fate})"}
    if a.lost_s is not None:
        out["lost_s"] = a.lost_s
    return out


def _mark(m: Mark, pid: int) -> list[dict[str, Any]]:
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


def _trained(run: RunLine, links: RunLinks, pid: int) -> Iterator[dict[str, Any]]:
    """The slices where trained tries' flows end: one per try, at its step's time."""
    # The slices of one step follow each other a microsecond apart: at one
    # time, zero-length slices on a track nest in the importer, one under the
    # next, and past 512 deep it drops them (and binds their flows elsewhere).
    nth, last = 0, None
    for t in links.trained:
        a = t.attempt
        nth = nth + 1 if t.time == last else 0
        last = t.time
        ts = us(t.time) + nth
        args = {
            "step": t.step,
            "group_id": a.group_id,
            "prompt_id": a.prompt_id,
            "generation_index": a.generation_index,
            "attempt": a.attempt,
        }
        event = _complete(f"step {t.step}", "trained", ts, ts, pid, _TRAINED, args, "black")
        event["bind_id"] = t.flow
        event["flow_in"] = True
        yield event


def _counter(name: str, ts: float, pid: int, args: dict[str, float]) -> dict[str, Any]:
    return {"ph": "C", "name": name, "ts": ts, "pid": pid, "tid": _CONTROLLER, "args": args}


def _counters(run: RunLine, links: RunLinks, pid: int) -> Iterator[dict[str, Any]]:
    if len(run.tries):
        # Two arrays of doubles, not a list of event pairs: a run can hold millions of tries.
        start = us_each(run.tries.start)
        starts = array("d", sorted(start))
        ends = array("d", sorted(map(max, start, us_each(run.tries.end))))
        for ts, running in in_flight(starts, ends):
            # Perfetto names the track "in flight attempts": the name, then the arg.
            yield _counter("in flight", ts, pid, {"attempts": running})
    for lag in links.lags:
        ts = us(lag.time)
        yield _counter("policy lag (max)", ts, pid, {"versions": lag.max})
        yield _counter("policy lag (p50)", ts, pid, {"versions": lag.p50})


def _stop(i: int, stop: StopCost, by_id: dict[str, RunLine]) -> list[dict[str, Any]]:
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
    # A global instant: chrome://tracing draws a line across every process (Ray's
    # merged ones too); Perfetto puts it on a global track of its own.
    if a_run is not None and stop_time is not None:
        out.append(
            _instant(
                f"stop {i}",
                "stop",
                us(stop_time),
                a_run.index + 1,
                _CONTROLLER,
                args,
                "terrible",
                "g",
            )
        )
    elif b_run is not None:
        # The stopped run is not in the trace set: the figures go where the
        # restore begins, so that they are still in the document.
        at = b_run.restores[0].started if b_run.restores else b_run.first_time
        out.append(
            _instant(
                f"stop {i}", "stop", us(at), b_run.index + 1, _CONTROLLER, args, "terrible", "g"
            )
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
