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

import bisect
import datetime
import itertools
import operator
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO, NamedTuple

import msgspec
import orjson

from .._model.stops import StopCost
from .._model.terms import OPEN_FLAGS
from .._model.traceset import gc_paused
from .._schema.decoding import AnyEvent
from .._version import __version__
from .links import FLOW_IN, FLOW_OUT, RunLinks, plan_links
from .merge import Foreign
from .model import (
    OUTCOME_LABELS,
    Mark,
    RunLine,
    Timeline,
    TryColumns,
    build_timeline,
    stop_figures,
)

__all__ = [
    "CNAME",
    "MAX_US",
    "document_of",
    "timeline_document",
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
    """The trace-event document of an already built ``Timeline``, with ``merge``'s events,
    as plain values (``json.dump`` takes it): the events ``write_document`` writes."""
    events: list[Any] = []
    # Millions of acyclic records: the cyclic collector would walk them again and again.
    with gc_paused():
        for part in _parts(tl, merge):
            events += msgspec.to_builtins(part.events)
    return {"traceEvents": events, **msgspec.to_builtins(_tail(tl, merge))}


def write_document(tl: Timeline, out: BinaryIO, merge: Sequence[Foreign] = ()) -> int:
    """Write the document as JSON to ``out``, a chunk of events at a time; the bytes written.

    Every trace event is in it, run by run, then the stops, then ``merge``'s;
    no more than a chunk of them is held at once.
    """
    written = out.write(b'{"traceEvents":[')
    sep = b""
    for part in _parts(tl, merge):
        if not part.events:
            continue
        if part.exact:
            data = _ENCODE(part.events)
        elif part.structs:
            data = _dumps(msgspec.to_builtins(part.events, builtin_types=_AS_IS))
        else:
            data = _dumps(part.events)
        written += out.write(sep + data[1:-1])
        sep = b","
    written += out.write(b"]," + _dumps(_tail(tl, merge))[1:])
    return written


class _Part(NamedTuple):
    """Trace events of the document, in its order: dicts, or structs (``structs``)
    that msgspec writes as orjson does (``exact``: plain values only)."""

    events: list[Any]
    structs: bool = False
    exact: bool = False


def _parts(tl: Timeline, merge: Sequence[Foreign]) -> Iterator[_Part]:
    """The document's trace events, a part at a time, in the document's order."""
    plans = plan_links(tl, us, [us_each(run.tries.start) for run in tl.runs])
    first_id = 1
    for run, links in zip(tl.runs, plans, strict=True):
        pid = run.index + 1
        yield _Part(_metadata(run, pid, bool(links.trained)))
        # Each try's end as written: never before its start, as the importer needs.
        start = links.start
        end = list(map(max, start, us_each(run.tries.end)))
        yield from _attempts(run, links, start, end, first_id, pid, tl)
        first_id += len(run.tries)
        yield from _each(_others(run, links, pid))
        for counters in _in_flight(start, end, pid):
            yield _Part(counters, structs=True, exact=True)
        yield _Part(list(_lags(links, pid)))
    by_id = {r.run_id: r for r in tl.runs}
    for i, stop in enumerate(tl.stops, 1):
        yield _Part(_stop(i, stop, by_id))
    first_pid = len(tl.runs) + 1
    for foreign in merge:
        first_pid = foreign.renumber(first_pid)
        yield from _each(foreign.trace_events())


def _each(events: Iterator[dict[str, Any]]) -> Iterator[_Part]:
    while chunk := list(itertools.islice(events, _CHUNK)):
        yield _Part(chunk)


def _others(run: RunLine, links: RunLinks, pid: int) -> Iterator[dict[str, Any]]:
    """A run's marks, restores and the slices its steps' flows end on."""
    for m in run.marks:
        yield from _mark(m, pid)
    for r in run.restores:
        start = us(r.started)
        end = start if r.finished is None else us(r.finished)
        args: dict[str, Any] = {"path": r.path, "step": r.step}
        if r.finished is None:
            args["finished"] = "no restore_finished in this run"
        yield _complete("restore", "restore", start, end, pid, _CONTROLLER, args, "rail_animation")
    yield from _trained(run, links, pid)


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
    if len(run.tries):
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


# An attempt's async slice, its args and its in-flight counter, made from
# the run's try columns in C and encoded by msgspec (``_attempts`` says
# when): a dict for each of millions of them was most of a document's time.
class _Local(msgspec.Struct):
    local: int


class _Args(msgspec.Struct, omit_defaults=True):
    # None: left out (``reason`` ... ``lost_s`` are written only where known).
    outcome: str
    group_id: Any
    prompt_id: Any
    generation_index: Any
    attempt: Any
    reason: Any = None
    weight_version: Any = None
    resumed_from_turn: Any = None
    started: Any = None
    redone: Any = None
    after_stop: Any = None
    lost_s: Any = None


class _End(msgspec.Struct):
    ph: str
    name: str
    cat: str
    id2: _Local
    ts: float
    pid: int
    tid: int


class _Begin(_End):
    cname: str
    args: _Args
    bind_id: int | msgspec.UnsetType = msgspec.UNSET
    flow_in: bool | msgspec.UnsetType = msgspec.UNSET
    flow_out: bool | msgspec.UnsetType = msgspec.UNSET


class _Running(msgspec.Struct):
    attempts: int


class _Counter(msgspec.Struct):
    ph: str
    name: str
    ts: float
    pid: int
    tid: int
    args: _Running


_ENCODE = msgspec.json.Encoder().encode
_WIDE = 1e16
_PLAIN = frozenset({int, str, bool, type(None)})
# What orjson writes as it is (msgspec would give it another spelling).
_AS_IS = (datetime.datetime, datetime.date, datetime.time)
_NOT_STARTED = {True: None, False: "in an earlier run (no dispatch or resume in this one)"}


def _attempts(
    run: RunLine,
    links: RunLinks,
    start: list[float],
    end: list[float],
    first_id: int,
    pid: int,
    tl: Timeline,
) -> Iterator[_Part]:
    """Each try's ``b`` and ``e`` events (at ``start`` and ``end``), a chunk of tries
    at a time; a try's slice id is ``first_id`` plus its place in the run."""
    t = run.tries
    n = len(t)
    rep = itertools.repeat
    # msgspec writes what orjson does but for floats from 1e16 on (1e16, not
    # 1e+16) and dates: times are below that, and ids are ints and strs but in
    # events built in Python; a chunk with any other value is written as the
    # other events are.
    columns: tuple[Sequence[Any], ...] = (t.group_id, t.prompt_id, t.generation_index)
    columns += (t.attempt, t.reason, t.weight_version, t.resumed_turn)
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        group_id, prompt_id, index, attempt, reason, version, turn = (c[lo:hi] for c in columns)
        outcome = t.outcome[lo:hi]
        names = list(map(OUTCOME_LABELS.__getitem__, outcome))
        m = hi - lo
        redone: list[str | None] = [None] * m
        after_stop: list[str | None] = [None] * m
        lost_s: list[float | None] = [None] * m
        fates = t.fate[lo:hi]
        exact = all(
            isinstance(c, array) or _PLAIN.issuperset(map(type, c))
            for c in (group_id, prompt_id, index, attempt, reason, version, turn)
        )
        for i in itertools.compress(range(m), map(operator.is_not, fates, rep(None))):
            redone[i], after_stop[i], lost_s[i] = _fate_args(t, lo + i, tl)
            lost = lost_s[i]
            exact = exact and (lost is None or -_WIDE < lost < _WIDE)
        args = list(
            map(
                _Args,
                outcome,
                group_id,
                prompt_id,
                index,
                attempt,
                reason,
                version,
                turn,
                map(_NOT_STARTED.__getitem__, t.started[lo:hi]),
                redone,
                after_stop,
                lost_s,
            )
        )
        bind: list[Any] = [msgspec.UNSET] * m
        flow_in: list[Any] = [msgspec.UNSET] * m
        flow_out: list[Any] = [msgspec.UNSET] * m
        flags = links.flags[lo:hi]
        for i in itertools.compress(range(m), flags):
            bind[i] = links.flows[lo + i]
            if flags[i] & FLOW_IN:
                flow_in[i] = True
            if flags[i] & FLOW_OUT:
                flow_out[i] = True
        ids = list(map(_Local, range(first_id + lo, first_id + hi)))
        cat, pids, tid = rep("attempt"), rep(pid), rep(_ATTEMPTS)
        cnames = map(CNAME.__getitem__, outcome)
        begin = map(
            _Begin,
            rep("b"),
            names,
            cat,
            ids,
            start[lo:hi],
            pids,
            tid,
            cnames,
            args,
            bind,
            flow_in,
            flow_out,
        )
        finish = map(_End, rep("e"), names, cat, ids, end[lo:hi], pids, tid)
        events = list(itertools.chain.from_iterable(zip(begin, finish, strict=True)))
        yield _Part(events, structs=True, exact=exact)


def _fate_args(t: TryColumns, i: int, tl: Timeline) -> tuple[str | None, str | None, float | None]:
    """What stop ``t.stop[i]`` did to try ``i``, in words (``redone``, else
    ``after_stop``, each under the name of the figure that counts it), and the
    seconds of its work the stop lost (``lost_s``, where known)."""
    fate, stop_no = t.fate[i], t.stop[i]
    b = tl.run_number(tl.stops[stop_no - 1].restored_run)
    if fate == "redone":
        text = (
            f"sealed after the state run {b} restored at stop {stop_no} was captured, "
            "and not resumed, so done again (counted in redone)"
        )
        return text, None, t.lost_s[i]
    where = "in flight at the stop" if OPEN_FLAGS[t.end_kind[i]] else "sealed after the capture"
    text = f"{fate} by run {b} at stop {stop_no} ({where}; counted in {fate})"
    return None, text, t.lost_s[i]


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
        tries, i = t.run.tries, t.at
        nth = nth + 1 if t.time == last else 0
        last = t.time
        ts = us(t.time) + nth
        args = {
            "step": t.step,
            "group_id": tries.group_id[i],
            "prompt_id": tries.prompt_id[i],
            "generation_index": tries.generation_index[i],
            "attempt": tries.attempt[i],
        }
        event = _complete(f"step {t.step}", "trained", ts, ts, pid, _TRAINED, args, "black")
        event["bind_id"] = t.flow
        event["flow_in"] = True
        yield event


def _in_flight(start: list[float], end: list[float], pid: int) -> Iterator[list[_Counter]]:
    """A run's ``in flight`` counter: the tries running just after each time one
    starts or ends (a try runs from its ``start`` until its ``end``: one of no
    length adds nothing, one that ends where another starts is not counted
    with it)."""
    starts, ends = sorted(start), sorted(end)
    # Each time once, as the first of the starts equal to it holds it, else
    # the first of the ends (0.0 and -0.0 are one time).
    times = dict.fromkeys(starts)
    times.update(dict.fromkeys(ends))
    at = sorted(times)
    rep = itertools.repeat
    for lo in range(0, len(at), 2 * _CHUNK):
        part = at[lo : lo + 2 * _CHUNK]
        # Perfetto names the track "in flight attempts": the name, then the arg.
        running = map(
            operator.sub,
            map(bisect.bisect_right, rep(starts), part),
            map(bisect.bisect_right, rep(ends), part),
        )
        counts = map(_Running, running)
        yield list(
            map(_Counter, rep("C"), rep("in flight"), part, rep(pid), rep(_CONTROLLER), counts)
        )


def _lags(links: RunLinks, pid: int) -> Iterator[dict[str, Any]]:
    for lag in links.lags:
        ts = us(lag.time)
        for name, v in (("policy lag (max)", lag.max), ("policy lag (p50)", lag.p50)):
            yield {
                "ph": "C",
                "name": name,
                "ts": ts,
                "pid": pid,
                "tid": _CONTROLLER,
                "args": {"versions": v},
            }


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
