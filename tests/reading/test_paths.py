"""Which files a trace set is: each file once, and what cannot be read said before reading.

README: Reference > Command line (exit codes): a path that cannot be used is
wrong usage, exit 2 with one line on standard error.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from scenario import disp, lines, make_run

import rollout_trace as rt
from rollout_trace._reading.paths import expand_paths

RUN = make_run(1, 100.0, [(101.0, disp(1, 0))])


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """runs/a.jsonl, runs/b.jsonl.gz, runs/notes.txt; the working folder is tmp_path."""
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.jsonl").write_bytes(lines(RUN))
    (runs / "b.jsonl.gz").write_bytes(b"")
    (runs / "notes.txt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _link(at: str, to: str) -> None:
    os.symlink(to, at)


@pytest.mark.parametrize(
    ("setup", "given", "expected"),
    [
        # One file named twice.
        (None, ["runs/a.jsonl", "runs/a.jsonl"], ["runs/a.jsonl"]),
        # Two spellings of one file; the first given is kept.
        (None, ["./runs/a.jsonl", "runs/a.jsonl"], ["./runs/a.jsonl"]),
        (None, ["runs/../runs/a.jsonl", "runs"], ["runs/../runs/a.jsonl", "runs/b.jsonl.gz"]),
        # A symbolic link to a file named with it.
        (lambda: _link("alias.jsonl", "runs/a.jsonl"), ["alias.jsonl", "runs"],
         ["alias.jsonl", "runs/b.jsonl.gz"]),
        # A folder met again through a link: its files once.
        (lambda: _link("again", "runs"), ["runs", "again"], ["runs/a.jsonl", "runs/b.jsonl.gz"]),
        # The order given is kept; a folder stands for its trace files, sorted.
        (None, ["runs/b.jsonl.gz", "runs"], ["runs/b.jsonl.gz", "runs/a.jsonl"]),
        # A `**` glob through a link to a folder above: each folder walked once.
        (lambda: _link("runs/up", ".."), ["**/*.jsonl"], ["runs/a.jsonl"]),
        # Two such links would make glob's walk grow without end.
        (lambda: (_link("runs/up", ".."), _link("runs/up2", "..")), ["**/a.jsonl"],
         ["runs/a.jsonl"]),
        # A folder named like a trace file, met in a folder or a glob, is passed over.
        (lambda: os.mkdir("runs/dir.jsonl"), ["runs"], ["runs/a.jsonl", "runs/b.jsonl.gz"]),
    ],
)  # fmt: skip
@pytest.mark.timeout(20)
def test_each_file_is_read_once(
    tree: Path, setup: Callable[[], object] | None, given: list[str], expected: list[str]
) -> None:
    if setup is not None:
        setup()
    assert expand_paths(given) == expected


@pytest.mark.parametrize(
    ("setup", "given", "message"),
    [
        # A link to nothing, named.
        (lambda: _link("gone.jsonl", "nowhere.jsonl"), "gone.jsonl",
         "'gone.jsonl' is a symbolic link to 'nowhere.jsonl', which does not exist"),
        # Links that lead round in a circle, named.
        (lambda: (_link("x.jsonl", "y.jsonl"), _link("y.jsonl", "x.jsonl")), "x.jsonl",
         "'x.jsonl' is a symbolic link that leads back to itself"),
        # The same, met in a folder.
        (lambda: _link("runs/gone.jsonl", "nowhere"), "runs",
         "'runs/gone.jsonl' (from 'runs') is a symbolic link to 'nowhere', which does not exist"),
        (lambda: _link("runs/self.jsonl", "self.jsonl"), "runs",
         "'runs/self.jsonl' (from 'runs') is a symbolic link that leads back to itself"),
        # And met by a glob.
        (lambda: _link("runs/gone.jsonl", "nowhere"), "runs/*.jsonl",
         "'runs/gone.jsonl' (from 'runs/*.jsonl') is a symbolic link to 'nowhere'"),
        # A path that does not exist, a glob that matches nothing.
        (None, "runs/missing.jsonl", "no such trace file: 'runs/missing.jsonl'"),
        (None, "runs/*.nothing", "no trace file matches 'runs/*.nothing'"),
    ],
)  # fmt: skip
def test_a_path_that_cannot_be_used_is_said_before_any_reading(
    tree: Path, setup: Callable[[], object] | None, given: str, message: str
) -> None:
    if setup is not None:
        setup()
    events = rt.read(["runs/a.jsonl", given])
    with pytest.raises(rt.TraceReadError) as caught:
        next(events)  # not even the good file's first event comes first
    assert message in str(caught.value)


def _without_root_powers() -> None:
    """Runs in the child: root's power to read whatever it likes is dropped.

    The interpreter lives where another user could not run it, so the child
    keeps root's user id and drops its two file-permission capabilities.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP (Linux)
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


# Each case in a folder of its own: how to spoil it, what to name, what is said.
CLI_CASES = {
    # A folder that cannot be listed, named.
    "unlistable": (
        lambda: os.chmod("runs", 0o300),
        "runs",
        "folder 'runs' cannot be listed: permission denied",
    ),
    # The same folder, met by a glob.
    "unlistable-by-glob": (
        lambda: os.chmod("runs", 0o300),
        "*/*.jsonl",
        "folder 'runs' (met by '*/*.jsonl') cannot be listed: permission denied",
    ),
    # A file that cannot be read.
    "unreadable": (
        lambda: os.chmod("runs/a.jsonl", 0o200),
        "runs/a.jsonl",
        "trace file 'runs/a.jsonl' cannot be read: permission denied",
    ),
    # A folder that cannot be passed through.
    "unreachable": (
        lambda: os.chmod("runs", 0o600),
        "runs/a.jsonl",
        "'runs/a.jsonl' cannot be reached: permission denied",
    ),
    # A link to nothing, met in a folder.
    "dangling": (lambda: _link("runs/gone.jsonl", "nowhere"), "runs", "which does not exist"),
}

# One child runs the command for every case: one interpreter start, not five.
_CHILD = """
import contextlib, io, json, os, sys
from rollout_trace._cli.main import main
out = {}
for name, given in json.loads(sys.argv[1]).items():
    os.chdir(name)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        out[name] = (main(["summary", given]), err.getvalue())
    os.chdir("..")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    root = tmp_path_factory.mktemp("cli")
    here = os.getcwd()
    try:
        for name, (spoil, _, _) in CLI_CASES.items():
            runs = root / name / "runs"
            runs.mkdir(parents=True)
            (runs / "a.jsonl").write_bytes(lines(RUN))
            os.chdir(root / name)
            spoil()
    finally:
        os.chdir(here)
    given = {name: case[1] for name, case in CLI_CASES.items()}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(given)],
            cwd=root,
            capture_output=True,
            text=True,
            # Another user is bound by the permissions as they are.
            preexec_fn=_without_root_powers if os.geteuid() == 0 else None,
            timeout=60,
            check=False,
        )
    except subprocess.SubprocessError:
        pytest.skip("root's file-permission capabilities cannot be dropped here")
    finally:
        for name in CLI_CASES:
            os.chmod(root / name / "runs", 0o755)
    assert proc.returncode == 0, proc.stderr
    results: dict[str, tuple[int, str]] = json.loads(proc.stdout)
    return results


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_command_line_says_so_in_one_line_and_exits_2(
    cli_results: dict[str, tuple[int, str]], case: str
) -> None:
    status, err = cli_results[case]
    assert (status, err.count("\n")) == (2, 1), err
    assert err.startswith("rollout-trace summary: error: ") and CLI_CASES[case][2] in err
