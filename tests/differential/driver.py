"""One version of rollout_trace in a process of its own, driven by JSON lines.

Run as ``python driver.py ROOT`` with ROOT first on ``PYTHONPATH`` (so its
``rollout_trace`` wins over an installed one; checked at the start) and
``PYTHONHASHSEED=0``. Each line read is a request, each line written its
answer, in order:

- ``{"op": "cli", "argv": [...], "cwd": DIR, "clock": T}``: ``rollout-trace
  ARGV`` through ``rollout_trace._cli.main.main`` in DIR, standard output and
  error caught; ``clock`` fixes ``time.time()`` for the call (watch prints the
  wall clock). Answer: ``rc``, ``out``, ``err`` (``exc`` if it raised).
- ``{"op": "api", "call": NAME, "paths": [...], "stall_after": S}``: one of
  the public calls on those paths, its result as JSON in ``out``.
- ``{"op": "render", ...}``: what this version would print with an intended
  change applied to its own answer (``allowed``); only asked of the base,
  whose internals are fixed.
- ``{"op": "batch", "requests": [...]}``: several at once, answers in ``results``.

The first line written says which package was imported (``hello``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
import time
import traceback
from collections import Counter
from typing import Any

Answer = dict[str, Any]


def _base(module: str, *names: str) -> list[Any]:
    """Names from one of the base's own modules: fixed at the base commit, and typed
    loosely, as the work tree's may differ."""
    mod = importlib.import_module(f"rollout_trace.{module}")
    return [getattr(mod, n) for n in names]


def _cli(req: dict[str, Any]) -> Answer:
    from rollout_trace._cli.main import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    wall = time.time
    clock = req.get("clock")
    rc: int | None = None
    exc = None
    try:
        os.chdir(req.get("cwd") or here)
        if clock is not None:
            time.time = lambda: float(clock)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(req["argv"]))
            except SystemExit as stop:  # as the interpreter turns it into a status
                code = stop.code
                if code is None or isinstance(code, int):
                    rc = code or 0
                else:
                    print(code, file=sys.stderr)
                    rc = 1
    except BaseException:
        exc = traceback.format_exc()
    finally:
        time.time = wall
        os.chdir(here)
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue(), "exc": exc}


def _encode(obj: Any) -> str:
    import msgspec

    return msgspec.json.encode(msgspec.to_builtins(obj)).decode()


def _api(req: dict[str, Any]) -> Answer:
    import rollout_trace as rt

    paths = list(req["paths"])
    call = req["call"]
    try:
        if call == "restore_costs":
            out = _encode(rt.restore_costs(rt.read(paths)))
        elif call == "health_report":
            out = _encode(rt.health_report(paths, stall_after=float(req["stall_after"])))
        elif call == "attempts":
            out = _encode(rt.attempts(paths))
        elif call == "timeline_document":
            out = _encode(rt.timeline_document(rt.read(paths)))
        else:
            raise ValueError(f"no call {call!r}")
    except BaseException:
        return {"rc": None, "out": "", "err": "", "exc": traceback.format_exc()}
    return {"rc": 0, "out": out, "err": "", "exc": None}


# --- the base's answers with an intended change applied (``allowed``) ----------------


def _prompt_text(p: Any, mixed: bool) -> str:
    """A prompt id as the attempts CSV writes it."""
    import msgspec

    return msgspec.json.encode(p).decode() if mixed else str(p)


def _render_report(req: dict[str, Any]) -> Answer:
    """``report`` (or ``rt.health_report``) with the stalls ``drop`` names left out."""
    import msgspec

    import rollout_trace as rt

    bad_lines, fold_timeline, trace_files = _base(
        "_cli.common", "BadLines", "fold_timeline", "trace_files"
    )
    [render] = _base("_cli.report", "render")
    [report_of] = _base("_report.health", "report_of")
    paths, stall_after, mixed = req["paths"], float(req["stall_after"]), req["mixed"]
    files = trace_files(paths)
    if req["via"] == "api":
        found = rt.health_report(paths, stall_after=stall_after)
    else:
        problems = bad_lines()
        with contextlib.redirect_stderr(io.StringIO()):
            tl = fold_timeline(files, problems)
        found = report_of(tl, stall_after, problems.count)
    drop = Counter(tuple(k) for k in req["drop"])
    for r in found.runs:
        kept = []
        for s in r.stalls:
            prompt = _prompt_text(s.prompt_id, mixed)
            key = (r.run_id, prompt, s.generation_index, s.attempt, s.started_at)
            if drop[key] > 0:
                drop[key] -= 1
            else:
                kept.append(s)
        r.stalls = kept
    found.stalls = sum(len(r.stalls) for r in found.runs)
    if req["via"] == "api":
        out = _encode(found)
    elif req["json"]:
        doc = msgspec.to_builtins(found)
        doc["files"] = files
        out = json.dumps(doc, indent=2, allow_nan=False) + "\n"
    else:
        out = render(found) + "\n"
    stalls = [
        [r.run_id, s.kind, s.prompt_id, s.generation_index, s.attempt, s.open_s]
        for r in found.runs
        for s in r.stalls
    ]
    return {"rc": 1 if found.stalls else 0, "out": out, "stalls": stalls}


def _render_summary(req: dict[str, Any]) -> Answer:
    """``summary`` with its runs in the order ``order`` gives (run ids; others after)."""
    collect, render = _base("_cli.summary", "collect", "render")
    with contextlib.redirect_stderr(io.StringIO()):
        found = collect(list(req["paths"]))
    place = {r: i for i, r in enumerate(req["order"])}
    found.runs = sorted(found.runs, key=lambda s: place.get(s.run_id, len(place)))
    text = json.dumps(found.to_dict(), indent=2) if req["json"] else render(found)
    return {"rc": 0, "out": text + "\n"}


def _render_watch(req: dict[str, Any]) -> Answer:
    """``watch --once`` with its run order, stalls, counts of bad lines and of damaged
    gzip files, or runs' last event times (``last_times``: run id -> time; the
    sealed/s window ends there too) given."""
    [frame] = _base("_cli.watch", "frame")
    live_stall, live_view = _base("_report.live", "LiveStall", "LiveView")
    view = live_view(list(req["paths"]), float(req["stall_after"]))
    view.poll()
    for rid, t in (req.get("last_times") or {}).items():
        if rid in view.runs:
            view.runs[rid].last_time = float(t)
    order = req.get("order")
    if order is not None:
        runs = [view.runs[r] for r in order if r in view.runs]
        runs += [r for r in view.ordered() if r.run_id not in order]
        view.ordered = lambda: runs
    stalls = req.get("stalls")
    if stalls is not None:
        made = [
            live_stall(view.runs[rid], (p, g, a), open_s, kind)
            for rid, kind, p, g, a, open_s in stalls
            if rid in view.runs
        ]
        view.stalls = lambda: made
    if req.get("bad_lines") is not None:
        view.bad_lines = int(req["bad_lines"])
    if req.get("damaged") is not None:
        view.follower.damaged = int(req["damaged"])
    out = frame(view, float(req["clock"])) + "\n"
    return {"rc": 1 if view.stalls() else 0, "out": out}


def _render(req: dict[str, Any]) -> Answer:
    try:
        what = req["what"]
        if what == "report":
            return _render_report(req)
        if what == "summary":
            return _render_summary(req)
        if what == "watch":
            return _render_watch(req)
        raise ValueError(f"nothing to render as {what!r}")
    except BaseException:
        return {"rc": None, "out": "", "exc": traceback.format_exc()}


def handle(req: dict[str, Any]) -> Answer:
    op = req.get("op")
    if op == "batch":
        return {"results": [handle(r) for r in req["requests"]]}
    if op == "cli":
        return _cli(req)
    if op == "api":
        return _api(req)
    if op == "render":
        return _render(req)
    return {"rc": None, "out": "", "err": "", "exc": f"unknown op {op!r}"}


def main() -> int:
    root = os.path.realpath(sys.argv[1])
    # The answers have the process's standard output to themselves: anything
    # else written to it (a worker process, a stray print) goes to stderr.
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    import rollout_trace

    where = os.path.realpath(rollout_trace.__file__)
    hello = {"hello": where, "version": rollout_trace.__version__, "root": root}
    if not where.startswith(root + os.sep):
        hello["error"] = f"rollout_trace imported from {where}, not from under {root}"
        proto.write(json.dumps(hello) + "\n")
        proto.flush()
        return 3
    proto.write(json.dumps(hello) + "\n")
    proto.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = handle(json.loads(line))
        proto.write(json.dumps(answer) + "\n")
        proto.flush()
    return 0


# Worker processes (cost --jobs) import this file again as their __main__:
# only a direct run serves requests.
if __name__ == "__main__":
    sys.exit(main())
