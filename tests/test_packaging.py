"""What an installed rollout-trace offers: the console script, types, entry points."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path

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


def test_the_package_and_its_sinks_are_typed() -> None:
    assert files("rollout_trace").joinpath("py.typed").is_file()
    assert files("rollout_trace.sinks").joinpath("py.typed").is_file()


def test_builtin_sinks_are_registered_as_entry_points() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="rollout_trace.sinks")}
    assert {"jsonl", "stdout", "stderr", "null", "memory", "s3", "otlp+http"} <= set(found)
    assert all(found[n].startswith("rollout_trace.sinks.") for n in ("jsonl", "s3"))
    assert issubclass(entry_points(group="rollout_trace.sinks")["jsonl"].load(), rt.Sink)


def test_a_project_with_its_own_sinks_package_imports_rollout_trace(tmp_path: Path) -> None:
    # A folder sinks/ is common in data and ML repositories: theirs, not ours.
    (tmp_path / "sinks").mkdir()
    (tmp_path / "sinks" / "__init__.py").write_text("MINE = True\n")
    code = (
        "import rollout_trace as rt, sinks; assert sinks.MINE; "
        "import rollout_trace.sinks as ours; t = rt.sync_tracer('memory://').open(); t.close(); "
        "print(rt.Sink is ours.Sink, ours.__name__)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "rollout_trace.sinks"]


def test_public_names_are_exactly_all() -> None:
    public = {n for n in dir(rt) if not n.startswith("_")} - {"testing"}
    modules = {n for n in public if type(getattr(rt, n)).__name__ == "module"}
    assert public - modules == set(rt.__all__) - {"__version__"}


def test_the_sdist_builds_a_wheel_with_the_sinks_inside_the_package(tmp_path: Path) -> None:
    # `python -m build` makes the sdist, then the wheel from it: a release's path.
    root = Path(__file__).parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(tmp_path), str(root)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (sdist,) = tmp_path.glob("*.tar.gz")
    (wheel,) = tmp_path.glob("*.whl")
    with tarfile.open(sdist) as tar:
        top = {n.split("/", 2)[1] for n in tar.getnames() if n.count("/") >= 2}
    assert {"sinks", "rollout_trace"} <= top  # the repository's layout
    names = zipfile.ZipFile(wheel).namelist()
    assert "rollout_trace/sinks/otlp.py" in names
    assert not [n for n in names if n.startswith("sinks/")]  # no top-level name
