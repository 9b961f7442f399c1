"""The README's "Instrumenting a controller" example runs, and writes what the section says.

The example is the fenced block right after the line
``<!-- example: instrumenting -->``; it is run as it stands, in a fresh folder.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TypeVar

import pytest

import rollout_trace as rt

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
MARKER = "<!-- example: instrumenting -->"


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text of a ``## heading`` section, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _fenced_after(text: str, anchor: str, lang: str) -> str:
    """The body of the first ```lang block after ``anchor``."""
    at = text.index(anchor)
    match = re.compile(rf"^```{lang}\n(.*?)^```$", re.S | re.M).search(text, at)
    assert match is not None, f"no ```{lang} block after {anchor!r} in README.md"
    return match.group(1)


def example_code() -> str:
    text = _readme()
    assert text.count(MARKER) == 1, f"README.md must hold {MARKER!r} exactly once"
    # The marker is followed directly by the block it marks.
    after = text[text.index(MARKER) + len(MARKER) :]
    assert after.startswith("\n```python\n"), f"{MARKER!r} must be followed by a ```python block"
    return _fenced_after(text, MARKER, "python")


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout_trace", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder in which the README example has run once."""
    folder = tmp_path_factory.mktemp("readme-example")
    script = folder / "controller.py"
    script.write_text(example_code(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_TRACE"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (folder / "trace.jsonl").is_file(), "the example wrote no trace.jsonl"
    return folder


def test_example_trace_validates(ran: Path) -> None:
    proc = _cli("validate", "trace.jsonl", cwd=ran)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The README shows the same verdict.
    shown = _fenced_after(_section(_readme(), "Instrumenting a controller"), MARKER, "text")
    assert proc.stdout.strip() in shown, proc.stdout


def test_example_summary_is_the_one_shown(ran: Path) -> None:
    proc = _cli("summary", "trace.jsonl", cwd=ran)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = _fenced_after(_section(_readme(), "Instrumenting a controller"), MARKER, "text")

    def by_name(out: str) -> list[str]:
        # Host, pid, run id and times differ from run to run; the counts do not.
        return out[out.index("events by name") :].strip().splitlines()

    assert by_name(proc.stdout) == by_name(shown)
    # The columns shown are the ones printed.
    header = shown[shown.index("run_id ") :].splitlines()[0]
    assert proc.stdout.splitlines()[0].split() == header.split()


ATTEMPT_KINDS = (
    rt.AttemptDispatched,
    rt.AttemptSealed,
    rt.AttemptRefused,
    rt.AttemptAbandoned,
    rt.AttemptResumed,
)
Attempt = (
    rt.AttemptDispatched
    | rt.AttemptSealed
    | rt.AttemptRefused
    | rt.AttemptAbandoned
    | rt.AttemptResumed
)
E = TypeVar("E", bound=rt.Event)


def _events(folder: Path) -> list[rt.Event]:
    problems: list[rt.ReadProblem] = []
    events: list[rt.Event] = []
    for ev in rt.read(folder / "trace.jsonl", problems=problems):
        assert isinstance(ev, rt.Event), ev
        events.append(ev)
    assert problems == []
    return sorted(events, key=lambda ev: ev.seq)


def test_example_events_come_in_the_order_the_section_describes(ran: Path) -> None:
    events = _events(ran)
    assert len({ev.run_id for ev in events}) == 1
    assert [ev.seq for ev in events] == list(range(len(events)))
    assert isinstance(events[0], rt.TraceOpened)
    closed = events[-1]
    assert isinstance(closed, rt.TraceClosed)
    assert (closed.emitted, closed.written, closed.dropped, closed.invalid) == (20, 20, 0, 0)
    pos = {id(ev): i for i, ev in enumerate(events)}

    def at(ev: rt.Event) -> int:
        return pos[id(ev)]

    def only(cls: type[E], **fields: object) -> E:
        found = [
            ev
            for ev in events
            if isinstance(ev, cls) and all(getattr(ev, k) == v for k, v in fields.items())
        ]
        assert len(found) == 1, (cls.__name__, fields, found)
        return found[0]

    attempts: list[Attempt] = [ev for ev in events if isinstance(ev, ATTEMPT_KINDS)]

    # A group: reserved, then admitted, then its tries.
    for group_id, prompt_id in (("g0", 7), ("g1", 8)):
        reserved = only(rt.GroupReserved, group_id=group_id)
        admitted = only(rt.GroupAdmitted, group_id=group_id)
        assert reserved.prompt_id == prompt_id == admitted.prompt_id
        assert at(reserved) < at(admitted)
        mine = [ev for ev in attempts if ev.group_id == group_id]
        assert mine and all(at(admitted) < at(ev) for ev in mine)

    # Each sibling: tries numbered 0, 1, ...; a dispatch, then the one event
    # that ends it, before the next try is dispatched.
    outcomes: dict[tuple[int | str, int], list[str]] = {}
    for ev in attempts:
        outcomes.setdefault((ev.prompt_id, ev.generation_index), [])
    for key in outcomes:
        tries = [ev for ev in attempts if (ev.prompt_id, ev.generation_index) == key]
        assert len(tries) % 2 == 0, (key, tries)
        for n in range(len(tries) // 2):
            dispatched, end = tries[2 * n], tries[2 * n + 1]
            assert isinstance(dispatched, rt.AttemptDispatched), (key, n, dispatched)
            assert not isinstance(end, (rt.AttemptDispatched, rt.AttemptResumed)), (key, n, end)
            assert dispatched.attempt == end.attempt == n, (key, n)
            reason = getattr(end, "reason", None)
            outcomes[key].append(type(end).__name__ + (f":{reason}" if reason else ""))
    assert outcomes == {
        (7, 0): ["AttemptSealed"],
        (7, 1): ["AttemptAbandoned:failed", "AttemptSealed"],
        (7, 2): ["AttemptRefused:too_long", "AttemptSealed"],
        (8, 0): ["AttemptAbandoned:dropped"],
    }

    # Sealing a group follows the seal of each of its siblings.
    reserved_g0 = only(rt.GroupReserved, group_id="g0")
    sealed_g0 = only(rt.GroupSealed, group_id="g0")
    seals = [ev for ev in attempts if isinstance(ev, rt.AttemptSealed) and ev.group_id == "g0"]
    assert sorted(ev.generation_index for ev in seals) == list(range(reserved_g0.size))
    assert all(at(ev) < at(sealed_g0) for ev in seals)

    # A step trains on sealed groups; the weight sync follows it; the try
    # that the new weights made stale is dropped after the sync.
    step = only(rt.StepTrained, step=1)
    assert step.group_ids == ["g0"]
    assert at(sealed_g0) < at(step)
    synced = only(rt.WeightsSynced)
    assert at(step) < at(synced)
    stale = only(rt.AttemptDispatched, group_id="g1")
    dropped = only(rt.AttemptAbandoned, reason="dropped")
    assert at(stale) < at(synced) < at(dropped)
    assert stale.weight_version < synced.weight_version

    # The snapshot comes last, with the time its state was taken.
    snap = only(rt.SnapshotPublished)
    assert at(dropped) < at(snap) == len(events) - 2
    assert snap.step == 1
    assert snap.captured_at <= snap.time
    assert (ran / snap.path).is_file()


def test_other_code_in_the_section_is_python() -> None:
    section = _section(_readme(), "Instrumenting a controller")
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert len(blocks) >= 2
    for block in blocks:
        ast.parse(block)


def test_reference_anchors_exist() -> None:
    """Help texts and the README itself link to these sections by anchor."""
    text = _readme()
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in prose.splitlines()
        if line.startswith("#")
    }
    for anchor in set(re.findall(r"\]\(#([\w-]+)\)", text)) | {
        "reference",
        "wire-format",
        "lifecycle-events",
        "rollout-events",
        "restore-cost-figures",
        "sink-uris",
        "cli-commands",
        "exit-codes",
    }:
        assert anchor in headings, f"README.md links to #{anchor}, which no heading makes"


def test_adding_a_sink_names_every_part_of_the_plugin_contract() -> None:
    # What a plugin author may override or set: each is said in the section.
    from sinks import Sink

    section = _section(_readme(), "Adding a sink")
    contract = [n for n in vars(Sink) if not n.startswith("_")]
    assert len(contract) >= 12, contract
    missing = [n for n in contract if f"`{n}" not in section]
    assert missing == []


def test_ci_runs_the_readme_test_command_word_for_word() -> None:
    text = _readme()
    start = text.index("Run the tests")
    command = _fenced_after(text, "Run the tests", "sh").strip()
    assert start >= 0 and "\n" not in command
    # Lint and types as steps of their own, then the tests on every core.
    assert ".venv/bin/ruff check ." in command and ".venv/bin/mypy" in command
    assert "pytest -n auto" in command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command in ci.splitlines()
