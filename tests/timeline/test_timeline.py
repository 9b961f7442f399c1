"""The timeline's trace-event document (Perfetto / chrome://tracing) and the CLI around it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
import timeline_data as td
from hypothesis import given, settings
from hypothesis import strategies as st
from perfetto_rules import check_trace_events
from scenario import captured_stop, disp, make_run, seal, write

import rollout_trace as rt
from rollout_trace._cli.main import main
from rollout_trace._timeline.document import MAX_US, us
from rollout_trace._timeline.model import Attempt, pack_lanes

EXAMPLE = Path(__file__).parents[1] / "data" / "example"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return rt.timeline_document(td.every_kind())


def test_document_follows_the_trace_event_rules(doc: dict[str, Any]) -> None:
    events = check_trace_events(doc)
    # Microseconds since the epoch: the earliest event is run A's trace_opened, at T0.
    assert min(e["ts"] for e in events if e["ph"] != "M") == td.T0 * 1e6


def test_every_event_type_of_the_fixture_is_drawn(doc: dict[str, Any]) -> None:
    tags = {type(e).__struct_config__.tag for e in td.every_kind() if isinstance(e, rt.Event)}
    # The tags an event type shows up under in the document (category or name).
    drawn = {e.get("cat") for e in doc["traceEvents"]} | {e["name"] for e in doc["traceEvents"]}
    shows_as = {
        "trace_opened": "opened",
        "trace_closed": "closed",
        "group_reserved": "group reserved",
        "group_admitted": "group admitted",
        "group_sealed": "group sealed",
        "group_discarded": "group discarded",
        "attempt_dispatched": "attempt",
        "attempt_sealed": "sealed",
        "attempt_refused": "refused",
        "attempt_resumed": "attempt",
        "attempt_abandoned": "failed",
        "step_trained": "step",
        "weights_synced": "weights",
        "trainer_checkpoint_published": "checkpoint",
        "snapshot_published": "snapshot",
        "restore_started": "restore",
        "restore_finished": "restore",
    }
    assert tags <= set(shows_as), tags - set(shows_as)
    assert {shows_as[t] for t in tags} <= drawn
    assert "gpu_memory_sampled" in drawn  # an event with no class is kept too


def _begins(doc: dict[str, Any]) -> dict[tuple[int, object, int], dict[str, Any]]:
    return {
        (e["pid"], e["args"]["prompt_id"], e["args"]["generation_index"]): e
        for e in doc["traceEvents"]
        if e["ph"] == "b"
    }


@pytest.mark.parametrize(
    ("pid", "prompt", "gen", "name", "cname", "start_s", "end_s", "extra"),
    [
        # sealed: dispatched at +1.5 s, sealed at +4 s
        (1, 1, 0, "sealed", "good", 1.5, 4.0, {}),
        # abandoned reasons are outcomes of their own
        (1, 1, 1, "failed", "terrible", 1.5, 5.0, {"reason": "failed"}),
        (1, 1, 2, "dropped", "generic_work", 1.5, 5.5, {"reason": "dropped"}),
        (1, 1, 3, "cancelled", "yellow", 1.5, 6.0, {"reason": "cancelled"}),
        (1, 1, 4, "refused", "olive", 1.5, 6.5, {"reason": "stale"}),
        (1, 1, 5, "whole group", "detailed_memory_dump", 1.5, 7.0, {"reason": "whole_group"}),
        # no end in A (open at its last event, +20 s): B resumed (2, 0) and restarted (2, 1)
        (1, 2, 0, "unended", "thread_state_runnable", 10.0, 20.0, {"after_stop": "resumed by"}),
        (1, 2, 1, "unended", "thread_state_runnable", 11.0, 20.0, {"after_stop": "restarted by"}),
        # B: the resume starts the attempt at +35 s; it seals at +38 s
        (2, 2, 0, "sealed", "good", 35.0, 38.0, {"resumed_from_turn": 1}),
        # B abandons for restart a try A started: no length, and says so
        (2, 2, 1, "abandoned: restart", "thread_state_iowait", 35.0, 35.0, {"started": "earlier"}),
    ],
)
def test_attempt_is_an_async_slice_by_outcome(
    doc: dict[str, Any],
    pid: int,
    prompt: int,
    gen: int,
    name: str,
    cname: str,
    start_s: float,
    end_s: float,
    extra: dict[str, Any],
) -> None:
    begin = _begins(doc)[(pid, prompt, gen)]
    [end] = [e for e in doc["traceEvents"] if e["ph"] == "e" and e["id2"] == begin["id2"]]
    assert (begin["name"], begin["cname"], begin["cat"]) == (name, cname, "attempt")
    assert (end["name"], end["cat"], end["pid"]) == (name, "attempt", pid)
    assert begin["ts"] == (td.T0 + start_s) * 1e6 and end["ts"] == (td.T0 + end_s) * 1e6
    # A process-scoped id: Perfetto draws the slice under its run, not on a global track.
    assert set(begin["id2"]) == {"local"} and "id" not in begin
    assert begin["args"]["group_id"] == "grp-1" and begin["args"]["attempt"] == 0
    for key, value in extra.items():
        assert key in begin["args"] and str(value) in str(begin["args"][key]), (key, begin)


def test_one_process_per_run_named_by_host_pid_and_run(doc: dict[str, Any]) -> None:
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert set(names) == {1, 2}
    assert names[1].startswith("node-1 pid 1000 run 00000000") and "no trace_closed" in names[1]
    assert names[2].startswith("node-1 pid 2000") and "closed cleanly" in names[2]
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e["name"] == "thread_name"
    }
    # Every track that holds an event has a name.
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= set(threads)


def test_marks_restore_and_stop(doc: dict[str, Any]) -> None:
    by_name = {e["name"]: e for e in doc["traceEvents"] if e["ph"] != "M"}
    snap, captured = by_name["snapshot step 1"], by_name["snapshot step 1 captured"]
    assert snap["ts"] == (td.T0 + 12) * 1e6 and captured["ts"] == (td.T0 + 9.5) * 1e6
    assert snap["args"]["captured_at"] == td.T0 + 9.5 and snap["args"]["path"] == "/ckpt/s1"
    assert by_name["checkpoint step 1"]["args"] == {"step": 1, "path": "/ckpt/t1"}
    restore = by_name["restore"]
    assert (restore["ph"], restore["pid"], restore["ts"], restore["dur"]) == (
        "X",
        2,
        (td.T0 + 32) * 1e6,
        3e6,
    )
    stop = by_name["stop 1"]
    # A global instant: drawn across every process, merged ones too.
    assert (stop["ph"], stop["s"], stop["pid"], stop["ts"]) == ("i", "g", 1, (td.T0 + 20) * 1e6)
    cost = rt.restore_costs(td.every_kind())[0]
    for figure, value in cost.to_dict().items():
        assert stop["args"][figure] == value, figure
    down = by_name["downtime (stop 1)"]
    assert (down["pid"], down["ts"], down["dur"]) == (2, (td.T0 + 20) * 1e6, 12e6)


@pytest.mark.parametrize(
    ("spans", "lanes"),
    [
        ([(0, 1), (2, 3), (4, 5)], 1),  # one after another: one lane
        ([(0, 10), (1, 2), (3, 4)], 2),  # the second lane is reused once free
        ([(0, 5), (0, 5), (0, 5)], 3),  # all at once: one lane each
        ([(0, 1), (1, 2)], 2),  # touching at a point: kept apart, so neither hides
        ([(3, 3), (3, 8)], 2),  # a try of no length at another's start stays visible
        ([], 0),
    ],
)
def test_lanes_are_as_many_as_attempts_at_once(spans: list[tuple[int, int]], lanes: int) -> None:
    attempts = [
        Attempt(float(s), float(e), "sealed", "g", 1, i, 0) for i, (s, e) in enumerate(spans)
    ]
    assert pack_lanes(attempts) == lanes
    for a in attempts:
        for b in attempts:
            if a is not b and a.lane == b.lane:
                assert a.end < b.start or b.end < a.start


def test_example_trace_set(tmp_path: Path) -> None:
    doc = rt.timeline_document(rt.read(EXAMPLE))
    events = check_trace_events(doc)
    attempts = [e for e in events if e["ph"] == "b"]
    dispatched = sum(isinstance(e, rt.AttemptDispatched) for e in rt.read(EXAMPLE))
    assert len(attempts) >= dispatched
    assert {e["name"] for e in attempts} >= {"sealed", "failed", "unended"}


# --- the command line ----------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".JSON", ".html"])
def test_cli_writes_the_kind_its_suffix_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    out = tmp_path / f"timeline{suffix}"
    assert main(["timeline", str(trace), "-o", str(out)]) == 0
    data = out.read_text()
    if suffix.lower() == ".json":
        check_trace_events(json.loads(data))
    else:
        assert data.startswith("<!DOCTYPE html>")
    assert f"wrote {out}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("out", "named"),
    [
        ("timeline.png", "suffix '.png'"),  # a suffix of another kind
        ("timeline.jsonl", "suffix '.jsonl'"),  # near miss
        ("timeline", "no suffix"),  # none at all
    ],
)
def test_cli_refuses_other_suffixes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, named: str
) -> None:
    trace = write(tmp_path / "t.jsonl", td.every_kind()[:-1])
    assert main(["timeline", str(trace), "-o", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err
    assert named in err and ".json" in err and ".html" in err
    assert not (tmp_path / out).exists()


def test_cli_reports_problems_and_missing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(
        tmp_path / "t.jsonl", make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))])
    )
    with trace.open("ab") as f:
        f.write(b'{"event":"attempt_sealed","time":1')  # a torn last line
    out = tmp_path / "t.json"
    assert main(["timeline", str(trace), "-o", str(out)]) == 0
    assert "torn last line" in capsys.readouterr().err
    assert len([e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "b"]) == 1
    assert main(["timeline", str(tmp_path / "missing.jsonl"), "-o", str(out)]) == 2
    assert "no such trace file" in capsys.readouterr().err
    assert main(["timeline", str(trace)]) == 2  # -o is required


# --- scale ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    events = td.many_attempts(100_000)
    return write(tmp_path_factory.mktemp("big") / "big.jsonl", events)


@pytest.mark.slow
def test_100k_attempts_all_in_the_json(big_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "big.json"
    assert main(["timeline", str(big_trace), "-o", str(out)]) == 0
    doc = json.loads(out.read_bytes())
    begins = {e["id2"]["local"]: e for e in doc["traceEvents"] if e["ph"] == "b"}
    ends = {e["id2"]["local"]: e for e in doc["traceEvents"] if e["ph"] == "e"}
    assert len(begins) == len(ends) == doc["otherData"]["attempts"] >= 100_000
    assert all(ends[i]["ts"] >= b["ts"] and not math.isnan(b["ts"]) for i, b in begins.items())


@pytest.mark.slow
def test_100k_attempts_html_stays_small(big_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "big.html"
    assert main(["timeline", str(big_trace), "-o", str(out)]) == 0
    page = out.read_text()
    assert len(page.encode()) < 3_000_000
    assert "are merged per pixel column" in page and "has every attempt" in page


def test_a_stop_of_an_unknown_run_keeps_its_figures_in_the_document() -> None:
    # A run that begins with a restore and no run before it: the stopped run
    # is not in the set, so the stop's figures go where the restore begins.
    events = make_run(
        2,
        110.0,
        [
            (111.0, rt.RestoreStarted(path="/x", step=1)),
            (112.5, rt.RestoreFinished(step=1, unfinished_groups=[])),
        ],
        closed=113.0,
    )
    [stop] = rt.restore_costs(events)
    assert stop.stopped_run is None
    doc = rt.timeline_document(events)
    [mark] = [e for e in doc["traceEvents"] if e["name"] == "stop 1"]
    assert (mark["pid"], mark["ts"]) == (1, 111e6)  # run 2's restore, 1 s after its start
    assert mark["args"]["restore_s"] == 1.5 and "downtime_s" in mark["args"]["reasons"]
    assert "stop 1: run ? → run 1" in rt.timeline_html(events)


def test_the_document_carries_the_cost_notes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run read twice and a line whose seq no tracer gives: two notes, in
    # the document as `rollout-trace cost --json` lists them.
    run = make_run(1, 100.0, [(101.0, disp(1, 0)), (102.0, seal(1, 0))], closed=103.0)
    events = [*run, *run, msgspec.structs.replace(run[1], seq=2**62 + 3)]
    path = write(tmp_path / "t.jsonl", events)
    assert main(["cost", str(path), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert sorted(n["kind"] for n in notes) == ["bad_seq", "read_twice"]
    out = tmp_path / "t.json"
    assert main(["timeline", str(path), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["otherData"]["notes"] == notes
    assert rt.timeline_document(events)["otherData"]["notes"] == notes


@settings(max_examples=2000, deadline=None)
@given(
    t=st.one_of(
        st.floats(1.0, 1e5),  # the tests' own small clocks
        st.floats(5e8, 4.1e9),  # wall clocks, 1985 to 2100
        st.floats(allow_nan=True, allow_infinity=True),
    )
)
def test_a_ts_is_the_time_in_microseconds_rounded_to_three_places(t: float) -> None:
    v = t * 1e6
    want = round(v, 3) if 0.0 <= v <= MAX_US else (MAX_US if v > MAX_US else 0.0)
    assert us(t) == want


class _Sample(msgspec.Struct):
    name: str
    value: float


class _Sampled(rt.Event, tag="test_timeline_sampled"):
    """A user's own event whose field is a struct of its own."""

    sample: _Sample | None = None
    at: tuple[int, int] = (0, 0)


def test_the_api_document_is_the_json_the_cli_writes(tmp_path: Path) -> None:
    # A user's struct and a tuple among a mark's args: the document is plain
    # JSON (json.dumps takes it), the very document `timeline -o x.json` writes.
    sampled = _Sampled(sample=_Sample("gpu", 0.5), at=(3, 4))
    events = make_run(1, td.T0, [(td.T0 + 1, disp(1, 0)), (td.T0 + 2, sampled)])
    doc = rt.timeline_document(events)
    trace = write(tmp_path / "t.jsonl", events)
    out = tmp_path / "t.json"
    assert main(["timeline", str(trace), "-o", str(out)]) == 0
    assert json.loads(json.dumps(doc)) == json.loads(out.read_bytes())
    (mark,) = [e for e in doc["traceEvents"] if e["name"] == "test_timeline_sampled"]
    assert mark["args"]["sample"] == {"name": "gpu", "value": 0.5}
    assert list(mark["args"]["at"]) == [3, 4]


@pytest.mark.parametrize("wide", [False, True])
def test_every_number_of_the_written_document_is_spelled_one_way(
    tmp_path: Path, wide: bool
) -> None:
    # A lost_s of 3e16 s (a clock far ahead): the attempts' args, the stop's figures
    # and every other number of the file are spelled as orjson spells them.
    events = captured_stop(3e16 if wide else 120.0)
    out = tmp_path / "t.json"
    assert main(["timeline", str(write(tmp_path / "t.jsonl", events)), "-o", str(out)]) == 0
    data = out.read_bytes()
    assert data == orjson.dumps(orjson.loads(data))
    assert (b"e+16" in data) == wide
