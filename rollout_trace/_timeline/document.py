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

from collections.abc import Iterable
from typing import Any

from .._analysis.figures import StopCost
from .._schema.decoding import AnyEvent
from .._version import __version__
from .model import Attempt, Mark, RunLine, Timeline, build_timeline

__all__ = ["CNAME", "timeline_document", "document_of"]

# Outcome -> the trace viewer's reserved colour name (catapult color_scheme).
CNAME = {
    "sealed": "good",
    "failed": "terrible",
    "dropped": "generic_work",
    "cancelled": "yellow",
    "refused": "olive",
    "restarted": "thread_state_iowait",
    "whole_group": "detailed_memory_dump",
    "in_flight": "thread_state_runnable",
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
_OUTCOME_NAME = {"in_flight": "in flight at stop"}

# Track ids within a run's process; lanes follow.
_CONTROLLER, _GROUPS, _OTHER, _FIRST_LANE = 0, 1, 2, 10
_TRACK_OF = {"group": _GROUPS, "other": _OTHER}


def timeline_document(events: Iterable[AnyEvent]) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...], ...}``) of a trace set.

    Write it with ``json.dump`` and open it in https://ui.perfetto.dev or
    chrome://tracing. Every attempt is in it, however many there are.
    """
    return document_of(build_timeline(events))


def document_of(tl: Timeline) -> dict[str, Any]:
    """The trace-event document of an already built ``Timeline``."""
    t0 = tl.t0

    def us(t: float) -> float:
        # Microseconds, rounded to the nanosecond the wire format can carry.
        return round((t - t0) * 1e6, 3)

    out: list[dict[str, Any]] = []
    for run in tl.runs:
        pid = run.index + 1
        out.extend(_metadata(run, pid))
        for a in run.attempts:
            out.append(_attempt(a, pid, us))
        for m in run.marks:
            out.extend(_mark(m, pid, us))
        for r in run.restores:
            start = us(r.started)
            end = start if r.finished is None else us(r.finished)
            args: dict[str, Any] = {"path": r.path, "step": r.step}
            if r.finished is None:
                args["finished"] = "no restore_finished in this run"
            out.append(
                _complete(
                    "restore", "restore", start, end, pid, _CONTROLLER, args, "rail_animation"
                )
            )
    by_id = {r.run_id: r for r in tl.runs}
    for i, stop in enumerate(tl.stops, 1):
        out.extend(_stop(i, stop, by_id, us))
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": f"rollout_trace {__version__}",
            "time_origin_unix_s": t0,
            "runs": len(tl.runs),
            "attempts": tl.attempt_count,
        },
    }


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
    kinds = {m.kind for m in run.marks}
    if "group" in kinds:
        tracks.append((_GROUPS, "groups"))
    if "other" in kinds:
        tracks.append((_OTHER, "other events"))
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


def _attempt(a: Attempt, pid: int, us: Any) -> dict[str, Any]:
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
    if a.after_stop is not None:
        args["after_stop"] = a.after_stop
    name = _OUTCOME_NAME.get(a.outcome, a.outcome)
    return _complete(
        name, "attempt", us(a.start), us(a.end), pid, _FIRST_LANE + a.lane, args, CNAME[a.outcome]
    )


def _mark(m: Mark, pid: int, us: Any) -> list[dict[str, Any]]:
    tid = _TRACK_OF.get(m.kind, _CONTROLLER)
    cname = _MARK_CNAME[m.kind]
    out = [_instant(m.name, m.kind, us(m.time), pid, tid, m.args, cname)]
    if m.captured_at is not None:
        # A second instant where the snapshot's state was taken: the gap to
        # the publish is work that a restore from it does again.
        args = {**m.args, "published_at": m.time}
        out.append(_instant(f"{m.name} captured", m.kind, us(m.captured_at), pid, tid, args, cname))
    return out


def _stop(i: int, stop: StopCost, by_id: dict[str, RunLine], us: Any) -> list[dict[str, Any]]:
    a_run, b_run = by_id.get(stop.stopped_run), by_id.get(stop.restored_run)
    if a_run is None or b_run is None:
        return []
    figures = stop.to_dict()
    if stop.reasons:
        figures["reasons"] = dict(stop.reasons)
    figures["restore_path"] = stop.restore_path
    t_stop = us(stop.stop_time)
    restore_at = stop.stop_time + stop.downtime_s
    return [
        _instant(f"stop {i}", "stop", t_stop, a_run.index + 1, _CONTROLLER, figures, "terrible"),
        _complete(
            f"downtime (stop {i})",
            "stop",
            t_stop,
            us(restore_at),
            b_run.index + 1,
            _CONTROLLER,
            {"downtime_s": stop.downtime_s, "stopped_run": stop.stopped_run},
            "generic_work",
        ),
    ]
