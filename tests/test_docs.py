"""The documentation site builds with ``--strict``, and every code block in it runs.

Each ```python block in ``docs/`` runs as a script in a fresh folder, as a reader
would run it, and must exit 0 without a word on standard error. HTML comments on
the lines just before a block change that:

- ``<!-- not run: fragment -->``: the block only compiles (top-level ``await``
  allowed). For code that needs a cluster, a store or a collector; keep these few.
- ``<!-- run after: rollout-trace ARGS -->``: the command runs in the folder first,
  so the block can read what it writes (the demo's traces).
- ``<!-- run after: example NAME -->``: the page's block ``NAME`` runs in the folder
  first (a restart after the controller that published the snapshot).
- ``<!-- example: NAME -->``: names the block; tests below check what it writes.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from examples import clean_env as _env
from examples import cli as _cli
from examples import fenced_after as _fenced_after
from markdown.extensions.toc import slugify

import rollout_trace as rt

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("**/*.md"))

FRAGMENT = "<!-- not run: fragment -->"
RUN_AFTER = re.compile(r"<!-- run after: (rollout-trace [^>]*?|example [\w-]+) -->")
EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->")
# Fragments are the exception: most of what the docs show must run as shown.
MOST_FRAGMENTS = 3

FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    code: str
    markers: tuple[str, ...]  # the HTML comments on the lines just before the fence

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(DOCS).as_posix()}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        above = text[: match.start()].rstrip("\n").split("\n")
        markers: list[str] = []
        while above and above[-1].startswith("<!--") and above[-1].endswith("-->"):
            markers.insert(0, above.pop())
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group(1), tuple(markers)))
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]
TO_RUN = [b for b in BLOCKS if FRAGMENT not in b.markers]
FRAGMENTS = [b for b in BLOCKS if FRAGMENT in b.markers]


def _run(block: Block, folder: Path) -> subprocess.CompletedProcess[str]:
    for marker in block.markers:
        setup = RUN_AFTER.fullmatch(marker)
        if setup is None:
            continue
        kind, _, rest = setup.group(1).partition(" ")
        if kind == "example":
            done = _run(example(block.page.relative_to(DOCS).as_posix(), rest), folder)
        else:
            done = _cli(*shlex.split(rest), cwd=folder)
        assert done.returncode == 0, done.stdout + done.stderr
    script = folder / "example.py"
    script.write_text(block.code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def example(page: str, name: str) -> Block:
    """The block marked ``<!-- example: name -->`` on ``page``."""
    mark = f"<!-- example: {name} -->"
    marked = [b for b in BLOCKS if b.page == DOCS / page and mark in b.markers]
    assert len(marked) == 1, f"{page} must hold one block marked example: {name}"
    return marked[0]


# --- the site -------------------------------------------------------------------


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    """Broken links, anchors and API references fail the build (mkdocs.yml: strict)."""
    env = {**_env(), "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    # The API reference is generated from the docstrings, methods included.
    for name in (
        "rollout_trace.Tracer.emit",
        "rollout_trace.SyncTracer.attempt",
        "rollout_trace.Attempt.seal",
    ):
        assert f'id="{name}"' in api, name


def test_the_api_reference_lists_every_public_name() -> None:
    """A name added to ``rollout_trace.__all__`` gets its entry on the API page."""
    page = (DOCS / "api.md").read_text(encoding="utf-8")
    entries = set(re.findall(r"^::: rollout_trace\.(\w+)$", page, re.M))
    public = {name for name in rt.__all__ if not name.startswith("__")}
    assert sorted(public - entries) == []


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in PAGES:
        assert f": {page.relative_to(DOCS).as_posix()}\n" in nav, page


def test_the_home_page_picture_is_the_one_the_tests_keep() -> None:
    shown = DOCS / "images" / "example-timeline.png"
    assert shown.read_bytes() == (ROOT / "tests" / "data" / "example-timeline.png").read_bytes()


def test_the_sections_others_point_at_exist() -> None:
    """Pages, the README and comments in the code name these sections."""
    where = {
        "reference.md": [
            "wire-format",
            "lifecycle-events",
            "rollout-events",
            "restore-cost-figures",
            "cost-json",
        ],
        "cli.md": ["exit-codes", "trace-sets", "cost", "summary", "validate"],
        "sinks.md": ["templates-options-and-errors", "opentelemetry", "object-stores"],
        "instrument.md": [
            "snapshots-and-restores",
            "weight-versions",
            "groups-sealed-but-not-yet-trained",
        ],
    }
    for page, anchors in where.items():
        text = re.sub(
            r"^```.*?^```$", "", (DOCS / page).read_text(encoding="utf-8"), flags=re.S | re.M
        )
        headings = {
            slugify(line.lstrip("#").strip(), "-")
            for line in text.splitlines()
            if line.startswith("#")
        }
        missing = [a for a in anchors if a not in headings]
        assert missing == [], f"{page} lacks #{missing}"


# --- the code blocks --------------------------------------------------------------


def test_code_blocks_are_found_and_fragments_are_few() -> None:
    assert len(TO_RUN) >= 10, [b.name for b in TO_RUN]
    assert len(FRAGMENTS) <= MOST_FRAGMENTS, [b.name for b in FRAGMENTS]


def test_every_marker_is_one_this_module_knows() -> None:
    """A misspelt marker would silently run a fragment or skip a setup."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for marker in re.findall(r"<!--.*?-->", text, re.S):
            known = marker == FRAGMENT or RUN_AFTER.fullmatch(marker) or EXAMPLE.fullmatch(marker)
            generated = marker.startswith("<!-- run_all.py --readme:")  # benchmarks/run_all.py
            assert known or generated, f"{page.name}: unknown marker {marker!r}"


@pytest.mark.parametrize("block", FRAGMENTS, ids=[b.name for b in FRAGMENTS])
def test_fragment_compiles(block: Block) -> None:
    compile(block.code, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("block", TO_RUN, ids=[b.name for b in TO_RUN])
def test_code_block_runs(block: Block, tmp_path: Path) -> None:
    proc = _run(block, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


# --- what the examples write --------------------------------------------------------

E = TypeVar("E", bound=rt.Event)


def _events(path: Path) -> list[rt.Event]:
    problems: list[rt.ReadProblem] = []
    events = [ev for ev in rt.read(path, problems=problems) if isinstance(ev, rt.Event)]
    assert problems == []
    return sorted(events, key=lambda ev: (ev.run_id, ev.seq))


@pytest.fixture(scope="module")
def instrumenting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder in which the hand-emitted complete example has run once."""
    folder = tmp_path_factory.mktemp("instrumenting")
    proc = _run(example("instrument.md", "instrumenting"), folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (folder / "trace.jsonl").is_file(), "the example wrote no trace.jsonl"
    return folder


def _shown_after_instrumenting() -> str:
    text = (DOCS / "instrument.md").read_text(encoding="utf-8")
    return _fenced_after(text, "<!-- example: instrumenting -->", "text")


def test_instrumenting_example_validates_as_shown(instrumenting: Path) -> None:
    proc = _cli("validate", "trace.jsonl", cwd=instrumenting)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() in _shown_after_instrumenting(), proc.stdout


def test_instrumenting_example_summary_is_the_one_shown(instrumenting: Path) -> None:
    proc = _cli("summary", "trace.jsonl", cwd=instrumenting)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = _shown_after_instrumenting()

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


def test_instrumenting_example_emits_in_the_order_the_page_describes(instrumenting: Path) -> None:
    events = _events(instrumenting / "trace.jsonl")
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
    assert (instrumenting / snap.path).is_file()


def test_restore_example_makes_the_stop_the_page_describes(tmp_path: Path) -> None:
    proc = _run(example("instrument.md", "restore"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["2", "1", "1"]  # in flight, resumed, restarted
    valid = _cli("validate", "trace.jsonl", cwd=tmp_path)
    assert valid.returncode == 0 and "0 warning(s)" in valid.stdout, valid.stdout + valid.stderr
    cost = _cli("cost", "trace.jsonl", "--json", cwd=tmp_path)
    assert cost.returncode == 0, cost.stdout + cost.stderr
    [stop] = json.loads(cost.stdout)["stops"]
    assert (stop["in_flight"], stop["resumed"], stop["restarted"], stop["redone"]) == (2, 1, 1, 0)
    assert stop["restored_step"] == 0 and stop["captured_at"] is not None
    # The restored run begins with the restore, as the page says it must.
    runs: dict[str, list[rt.Event]] = {}
    for ev in _events(tmp_path / "trace.jsonl"):
        runs.setdefault(ev.run_id, []).append(ev)
    restored = runs[stop["restored_run"]]
    rollout = [ev for ev in restored if not isinstance(ev, (rt.TraceOpened, rt.TraceClosed))]
    assert isinstance(rollout[0], rt.RestoreStarted)
    kinds = [type(ev).__name__ for ev in rollout]
    assert kinds.index("RestoreFinished") < kinds.index("WeightsSynced")


# --- the plugin contract ------------------------------------------------------------


def test_writing_a_sink_names_every_part_of_the_plugin_contract() -> None:
    # What a plugin author may override or set: each is said on the page.
    from rollout_trace.sinks import Sink

    page = (DOCS / "writing-a-sink.md").read_text(encoding="utf-8")
    contract = [n for n in vars(Sink) if not n.startswith("_")]
    assert len(contract) >= 12, contract
    missing = [n for n in contract if f"`{n}" not in page]
    assert missing == []
