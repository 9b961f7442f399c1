"""The README: short, its complete controller and its restart run end to end, and
what it links to is there.

The controller is the ```python block right after ``<!-- example: attempt -->``,
the restart the one after ``<!-- example: restart -->``; they run as they stand,
one after the other, in a fresh folder. The rest of what the README once held
lives in ``docs/`` (tests/test_docs.py runs its code).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from examples import cli as _cli
from examples import fenced_after as _fenced_after
from examples import run_python as _python
from markdown.extensions.toc import slugify

import rollout_trace as rt
from rollout_trace._cli.main import COMMANDS

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
# A newcomer reads it in five minutes.
MOST_LINES = 250


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def example_code(name: str, text: str | None = None) -> str:
    text = _readme() if text is None else text
    marker = f"<!-- example: {name} -->"
    assert text.count(marker) == 1, f"the README must hold {marker!r} exactly once"
    # The marker is followed directly by the block it marks (a run-after
    # marker of the docs' test between them is allowed).
    after = re.sub(r"^\n(<!--.*?-->\n)*", "\n", text[text.index(marker) + len(marker) :])
    assert after.startswith("\n```python\n"), f"{marker!r} must be followed by a ```python block"
    return _fenced_after(text, marker, "python")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh folder in which the README's controller has run once."""
    folder = tmp_path_factory.mktemp("readme-controller")
    script = folder / "controller.py"
    script.write_text(example_code("attempt"), encoding="utf-8")
    proc = _python(script, folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
    assert (folder / "attempts.jsonl").is_file(), "the controller wrote no attempts.jsonl"
    return folder


@pytest.fixture(scope="module")
def restarted(ran: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``ran`` in which the README's restart has run after the controller."""
    folder = tmp_path_factory.mktemp("readme-restart")
    for name in ("attempts.jsonl", "snapshot-step1.json"):
        (folder / name).write_bytes((ran / name).read_bytes())
    script = folder / "restore.py"
    script.write_text(example_code("restart"), encoding="utf-8")
    proc = _python(script, folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr
    return folder


def test_the_readme_is_short() -> None:
    lines = _readme().count("\n")
    assert lines < MOST_LINES, f"README.md has {lines} lines; the rest belongs in docs/"


def test_the_controller_writes_a_trace_validate_accepts_as_shown(ran: Path) -> None:
    proc = _cli("validate", "attempts.jsonl", cwd=ran)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 warning(s)" in proc.stdout, proc.stdout
    shown = _fenced_after(_readme(), "<!-- example: attempt -->", "text")
    assert proc.stdout.strip() in shown, proc.stdout


def test_the_controller_emits_what_the_readme_says(ran: Path) -> None:
    events = sorted(
        (ev for ev in rt.read(ran / "attempts.jsonl") if isinstance(ev, rt.Event)),
        key=lambda ev: ev.seq,
    )
    closed = events[-1]
    assert isinstance(closed, rt.TraceClosed)
    assert closed.emitted == closed.written and closed.dropped == closed.invalid == 0
    ends: dict[int, list[str]] = {}
    for ev in events:
        if isinstance(ev, (rt.AttemptSealed, rt.AttemptRefused, rt.AttemptAbandoned)):
            reason = getattr(ev, "reason", None)
            ends.setdefault(ev.generation_index, []).append(
                type(ev).__name__ + (f":{reason}" if reason else "")
            )
    # One try raises and is retried, one is refused and retried; all three seal.
    assert ends == {
        0: ["AttemptSealed"],
        1: ["AttemptAbandoned:failed", "AttemptSealed"],
        2: ["AttemptRefused:too_long", "AttemptSealed"],
    }
    names = [type(ev).__name__ for ev in events]
    # Weights first, then the group; the step, a sync and the snapshot last.
    assert names.index("WeightsSynced") < names.index("GroupReserved")
    tail = [n for n in names if n in ("GroupSealed", "StepTrained", "WeightsSynced")][-3:]
    assert tail == ["GroupSealed", "StepTrained", "WeightsSynced"]
    assert names[-2] == "SnapshotPublished"


def test_the_restart_makes_a_stop_cost_reads(restarted: Path) -> None:
    valid = _cli("validate", "attempts.jsonl", cwd=restarted)
    assert valid.returncode == 0 and "2 runs" in valid.stdout, valid.stdout + valid.stderr
    assert "0 warning(s)" in valid.stdout, valid.stdout
    cost = _cli("cost", "attempts.jsonl", "--json", cwd=restarted)
    assert cost.returncode == 0, cost.stdout + cost.stderr
    [stop] = json.loads(cost.stdout)["stops"]
    assert stop["restored_step"] == 1
    assert stop["captured_at"] is not None  # the path matched the published snapshot
    # Everything was sealed and trained before the snapshot: nothing lost but time.
    assert stop["in_flight"] == stop["lost_steps"] == 0
    assert stop["lost_s"] == 0.0


def test_the_examples_are_the_docs_home_page_s() -> None:
    """The README and the site's home page show one controller, not two that drift."""
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for name in ("attempt", "restart"):
        assert example_code(name) == example_code(name, home), name


def test_one_line_per_command() -> None:
    section = _readme().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `rollout-trace (\w+)", section, re.M)
    assert listed == [command.name for command in COMMANDS]


def test_links_lead_to_pages_and_sections_that_exist() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", _readme())
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README.md links to {path}, which does not exist"
        if anchor:
            text = re.sub(
                r"^```.*?^```$", "", target.read_text(encoding="utf-8"), flags=re.S | re.M
            )
            headings = {
                slugify(line.lstrip("#").strip(), "-")
                for line in text.splitlines()
                if line.startswith("#")
            }
            assert anchor in headings, f"README.md links to {link}, which no heading makes"


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
