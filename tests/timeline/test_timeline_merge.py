"""``rollout-trace timeline --merge``: a ``ray timeline`` document folded into the timeline's."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import timeline_data as td
from perfetto_rules import check_trace_events, flows
from scenario import write

from rollout_trace._cli.main import main

T0_US = td.T0 * 1e6

# What Ray's dashboard writes: integer pids (nodes) and tids (workers), names
# in metadata, a process_name with no tid; complete events in epoch µs.
RAY_NUMBERED: list[dict[str, Any]] = [
    {
        "cat": "task::rollout",
        "name": "task::rollout",
        "pid": 0,
        "tid": 0,
        "ts": T0_US + 2e6,
        "dur": 3e6,
        "cname": "rail_response",
        "args": {"task_id": "a1", "attempt_number": 0},
        "ph": "X",
    },
    {
        "cat": "task:execute",
        "name": "task:execute",
        "pid": 1,
        "tid": 1,
        "ts": T0_US + 33e6,
        "dur": 1e6,
        "cname": "rail_response",
        "args": {"task_id": "b2"},
        "ph": "X",
    },
    {"name": "process_name", "args": {"name": "Node 10.0.0.1"}, "pid": 0, "tid": None, "ph": "M"},
    {"name": "process_name", "args": {"name": "Node 10.0.0.2"}, "pid": 1, "tid": None, "ph": "M"},
    {"name": "thread_name", "ph": "M", "tid": 0, "pid": 0, "args": {"name": "worker:0f3a"}},
    {"name": "thread_name", "ph": "M", "tid": 1, "pid": 1, "args": {"name": "driver:77c1"}},
]
# What `ray timeline` writes: string pids (a node's address) and tids (a worker),
# no metadata; here as an object, with a flow event between two threads.
RAY_NAMED: dict[str, Any] = {
    "traceEvents": [
        {
            "cat": "task",
            "name": "rollout",
            "pid": "10.0.0.1",
            "tid": "worker:0f3a",
            "ts": T0_US + 2e6,
            "dur": 3e6,
            "ph": "X",
            "args": {},
        },
        {
            "cat": "submit_task",
            "name": "submit",
            "pid": "10.0.0.1",
            "tid": "driver",
            "ts": T0_US + 1e6,
            "dur": 1e5,
            "ph": "X",
            "args": {},
        },
        {
            "cat": "submit_task",
            "name": "submit",
            "pid": "10.0.0.1",
            "tid": "driver",
            "ts": T0_US + 1e6,
            "ph": "s",
            "id": 7,
        },
        {
            "cat": "submit_task",
            "name": "submit",
            "pid": "10.0.0.1",
            "tid": "worker:0f3a",
            "ts": T0_US + 2e6,
            "ph": "f",
            "id": 7,
            "bp": "e",
        },
    ],
    "displayTimeUnit": "ns",
}


def _timeline(tmp_path: Path, *merge: Any) -> tuple[int, Path]:
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    argv = ["timeline", str(trace), "-o", str(tmp_path / "out.json")]
    for i, doc in enumerate(merge):
        path = tmp_path / f"ray{i}.json"
        path.write_text(json.dumps(doc))
        argv += ["--merge", str(path)]
    return main(argv), tmp_path / "out.json"


def _without_ids(ev: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in ev.items() if k not in ("pid", "tid")}, sort_keys=True)


@pytest.mark.parametrize(
    ("ray", "processes", "threads"),
    [
        # the dashboard's: integer pids and tids, named by metadata
        (RAY_NUMBERED, {"Node 10.0.0.1", "Node 10.0.0.2"}, {"worker:0f3a", "driver:77c1"}),
        # `ray timeline`'s: strings, which name what they number
        (RAY_NAMED, {"10.0.0.1"}, {"worker:0f3a", "driver"}),
    ],
)
def test_a_ray_timeline_is_merged_whole_with_pids_of_its_own(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ray: Any,
    processes: set[str],
    threads: set[str],
) -> None:
    code, out = _timeline(tmp_path, ray)
    assert code == 0
    assert "merged events" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    events = check_trace_events(doc, own_pids=2)
    runs = {e["pid"] for e in events if e.get("cat") == "attempt"}
    assert runs == {1, 2}
    merged = [e for e in events if e["pid"] not in runs]
    given = ray["traceEvents"] if isinstance(ray, dict) else ray
    # Every event is there, as it was but for its pid and tid.
    kept = sorted(_without_ids(e) for e in merged)
    for ev in given:
        assert _without_ids(ev) in kept, ev
        kept.remove(_without_ids(ev))
    # What is left are the names of processes and threads the file did not name.
    assert all(json.loads(k)["ph"] == "M" for k in kept)
    assert all(type(e["pid"]) is int and type(e["tid"]) is int for e in merged)
    assert {e["args"]["name"] for e in merged if e["name"] == "process_name"} == processes
    assert {e["args"]["name"] for e in merged if e["name"] == "thread_name"} == threads
    # Each process its own pid, distinct from the runs' and from the others'.
    named = {e["pid"] for e in merged if e["name"] == "process_name"}
    assert len(named) == len(processes) and not named & runs
    assert {e["pid"] for e in merged} == named
    assert doc["otherData"]["merged"][0]["events"] == len(given)


def test_a_merged_flow_is_still_a_flow_and_ours_are_untouched(tmp_path: Path) -> None:
    code, out = _timeline(tmp_path, RAY_NAMED)
    assert code == 0
    events = json.loads(out.read_text())["traceEvents"]
    [start] = [e for e in events if e["ph"] == "s"]
    [end] = [e for e in events if e["ph"] == "f"]
    # Ray's flow joins its driver and worker threads of one node, renumbered alike.
    assert start["pid"] == end["pid"] > 2 and start["tid"] != end["tid"]
    assert len(flows(events)) == 3  # ours: a retried sibling twice, a trained try


def test_two_merged_files_keep_apart(tmp_path: Path) -> None:
    code, out = _timeline(tmp_path, RAY_NUMBERED, RAY_NAMED)
    assert code == 0
    doc = json.loads(out.read_text())
    check_trace_events(doc, own_pids=2)
    # The second file's pids follow the first's: none is shared.
    merged = doc["otherData"]["merged"]
    assert [m["pids"] for m in merged] == [[[0, 3], [1, 4]], [["10.0.0.1", 5]]]
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert (names[3], names[4], names[5]) == ("Node 10.0.0.1", "Node 10.0.0.2", "10.0.0.1")


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read"),  # no such file
        (b"ray timeline --output ray.json\n", "is not JSON"),  # not JSON at all
        (b"", "is not JSON"),  # empty
        (b"3", "holds a JSON int"),  # JSON, but no events
        (b'{"events": []}', 'no "traceEvents" array'),  # an object of another kind
        (b'{"traceEvents": {"ph": "X"}}', 'no "traceEvents" array'),  # not an array
        (b"[1, 2]", "event 0 is not a trace event"),  # an array of something else
        (b'[{"ph": "X", "ts": 1}, {"name": "x"}]', "event 1 is not a trace event"),  # no phase
        ("trace", "is not JSON"),  # a rollout trace (JSON lines) given by mistake
    ],
)
def test_a_merge_file_that_is_not_a_trace_event_document_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | str | None, said: str
) -> None:
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    path = trace if content == "trace" else tmp_path / "ray.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    out = tmp_path / "out.json"
    assert main(["timeline", str(trace), "--merge", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and repr(str(path)) in err, err
    if content is not None:
        assert "expected a trace-event document" in err
    assert err.startswith("rollout-trace timeline: error:") and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("out.html", "is a page"),  # a page has no trace events to merge into
        ("ray.json", "is a --merge file"),  # writing it would destroy what is merged
    ],
)
def test_merge_refuses_an_output_it_cannot_go_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str, said: str
) -> None:
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    ray = tmp_path / "ray.json"
    ray.write_text(json.dumps(RAY_NUMBERED))
    assert main(["timeline", str(trace), "--merge", str(ray), "-o", str(tmp_path / output)]) == 2
    assert said in capsys.readouterr().err
    assert json.loads(ray.read_text()) == RAY_NUMBERED


def test_a_merged_document_with_flows_of_its_own_keeps_them_apart(tmp_path: Path) -> None:
    # Our own timeline merged into another: its bind_ids were the same
    # numbers as ours, and would have joined flows across the two.
    code, first = _timeline(tmp_path)
    assert code == 0
    ours = json.loads(first.read_text())
    theirs = tmp_path / "theirs.json"
    first.rename(theirs)
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    out = tmp_path / "both.json"
    assert main(["timeline", str(trace), "--merge", str(theirs), "-o", str(out)]) == 0
    both = json.loads(out.read_text())
    mine = len(flows(ours["traceEvents"]))
    assert mine > 0
    assert len(flows(check_trace_events(both, own_pids=2))) == 2 * mine


@pytest.mark.parametrize(
    "how",
    [
        "gzip",  # as trace files may be
        "nan",  # a time that is no number: dropped, as the importer drops it
    ],
)
def test_a_merge_file_in_gzip_or_with_bad_times(tmp_path: Path, how: str) -> None:
    ray = [
        {"name": "task", "cat": "task", "ph": "X", "pid": "n1", "tid": "w1",
         "ts": 1_780_000_001e6, "dur": 5.0, "args": {}},
        {"name": "late", "cat": "task", "ph": "X", "pid": "n1", "tid": "w1",
         "ts": float("nan"), "dur": 5.0, "args": {}},
    ]  # fmt: skip
    data = json.dumps(ray if how == "nan" else ray[:1]).encode()
    path = tmp_path / "ray.json"
    path.write_bytes(gzip.compress(data) if how == "gzip" else data)
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    out = tmp_path / "out.json"
    assert main(["timeline", str(trace), "--merge", str(path), "-o", str(out)]) == 0
    events = check_trace_events(json.loads(out.read_text()), own_pids=2)
    assert [e["name"] for e in events if e.get("cat") == "task"] == ["task"]
