"""Checks that a run's lines follow README > Reference > Wire format and Lifecycle events exactly.

Shared by the tests.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import rollout_trace as rt

_RUN_ID = re.compile(r"[0-9a-f]{32}")
ENVELOPE = ("event", "time", "run_id", "seq")


@dataclass
class Run:
    run_id: str
    opened: dict[str, Any]
    closed: dict[str, Any] | None
    events: list[dict[str, Any]] = field(default_factory=list)  # user events, in file order


def parse_lines(data: bytes) -> list[dict[str, Any]]:
    assert data.endswith(b"\n") or not data, "the last line must end in a newline"
    objs = [json.loads(line) for line in data.splitlines()]
    builtin = {
        tag for tag, cls in rt.event_types().items() if cls.__module__.startswith("rollout_trace")
    }
    for obj in objs:
        if obj["event"] in builtin:  # a user's event without kw_only=True lists its fields first
            assert list(obj)[:4] == list(ENVELOPE), f"envelope first, in order: {obj}"
        assert set(ENVELOPE) <= set(obj), obj
        assert isinstance(obj["event"], str)
        assert isinstance(obj["time"], float)
        assert _RUN_ID.fullmatch(obj["run_id"]), obj["run_id"]
        assert isinstance(obj["seq"], int) and obj["seq"] >= 0
    return objs


def check_runs(data: bytes, *, allow_drops: bool = False, uri: str | None = None) -> dict[str, Run]:
    """Split lines by run and check each run's lifecycle, seq numbers and counts.

    ``uri``: the sink that wrote ``data``, whose own count in ``trace_closed``
    must equal the lines really in it.
    """
    runs: dict[str, list[dict[str, Any]]] = {}
    for obj in parse_lines(data):
        runs.setdefault(obj["run_id"], []).append(obj)
    checked = {}
    for run_id, objs in runs.items():
        assert objs[0]["event"] == "trace_opened" and objs[0]["seq"] == 0, objs[0]
        opened = objs[0]
        assert opened["schema"] == 1
        assert set(opened) == {*ENVELOPE, "schema", "sdk_version", "pid", "host", "meta"}
        closed = objs[-1] if objs[-1]["event"] == "trace_closed" else None
        middle = objs[1:-1] if closed else objs[1:]
        seqs = sorted(o["seq"] for o in middle)
        assert len(set(seqs)) == len(seqs), "a seq appears twice"
        assert all(o["event"] not in ("trace_opened", "trace_closed") for o in middle)
        if closed is not None:
            c = closed
            assert set(c) == {*ENVELOPE, "emitted", "written", "dropped", "invalid", "sinks"}
            assert c["emitted"] == c["written"] + c["dropped"] + c["invalid"], c
            # What this file's sink acknowledged is what is really in it; the
            # run's `written` is what at least one sink wrote.
            mine = [s for s in c["sinks"] if uri is None or s["uri"] == uri]
            assert len(mine) == 1 or uri is None, (uri, c["sinks"])
            if uri is not None or len(c["sinks"]) == 1:
                assert mine[0]["written"] == len(middle), (c, len(middle))
            assert c["written"] >= len(middle), (c, len(middle))
            if not any(s["error"] for s in c["sinks"]):
                assert c["written"] == len(middle), (c, len(middle))
            assert c["seq"] == c["emitted"] + 1
            assert all(1 <= s <= c["emitted"] for s in seqs)
            if not allow_drops:
                assert c["dropped"] == 0 and c["invalid"] == 0, c
                assert seqs == list(range(1, c["emitted"] + 1))
        checked[run_id] = Run(run_id, opened, closed, middle)
    return checked


def only_run(data: bytes, **kwargs: Any) -> Run:
    runs = check_runs(data, **kwargs)
    assert len(runs) == 1, list(runs)
    return next(iter(runs.values()))
