"""What an installed rollout-trace offers: the console script, types, entry points."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from importlib.resources import files

import pytest

import rollout_trace as rt

# The script installed beside this interpreter (the venv need not be on PATH).
SCRIPT = shutil.which("rollout-trace", path=os.path.dirname(sys.executable)) or "rollout-trace"


@pytest.mark.parametrize(
    ("args", "code", "stream", "words"),
    [
        (["--version"], 0, "stdout", f"rollout-trace {rt.__version__}"),  # the version
        (["--help"], 0, "stdout", "usage: rollout-trace"),  # help
        ([], 2, "stderr", "usage: rollout-trace"),  # no command: usage, exit 2
        (["--bogus"], 2, "stderr", "unrecognized arguments: --bogus"),  # wrong usage
    ],
)
def test_console_script(args: list[str], code: int, stream: str, words: str) -> None:
    proc = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == code
    assert words in getattr(proc, stream)


def test_python_dash_m_runs_the_same_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rollout_trace", "--version"], capture_output=True, text=True
    )
    assert proc.stdout.strip() == f"rollout-trace {rt.__version__}"


def test_both_packages_are_typed() -> None:
    assert files("rollout_trace").joinpath("py.typed").is_file()
    assert files("sinks").joinpath("py.typed").is_file()


def test_builtin_sinks_are_registered_as_entry_points() -> None:
    names = {ep.name for ep in entry_points(group="rollout_trace.sinks")}
    assert {"jsonl", "stdout", "stderr", "null", "memory"} <= names


def test_public_names_are_exactly_all() -> None:
    public = {n for n in dir(rt) if not n.startswith("_")} - {"testing"}
    modules = {n for n in public if type(getattr(rt, n)).__name__ == "module"}
    assert public - modules == set(rt.__all__) - {"__version__"}
