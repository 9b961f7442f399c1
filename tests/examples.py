"""What the README's and the docs' tests share: finding a fenced block and
running an example or the CLI as a user would, in a folder of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def fenced_after(text: str, anchor: str, lang: str) -> str:
    """The body of the first ```lang block after ``anchor``."""
    match = re.compile(rf"^```{lang}\n(.*?)^```$", re.S | re.M).search(text, text.index(anchor))
    assert match is not None, f"no ```{lang} block after {anchor!r}"
    return match.group(1)


def clean_env() -> dict[str, str]:
    # A tracer with no URI reads $ROLLOUT_TRACE: the examples name their own sinks.
    return {k: v for k, v in os.environ.items() if k != "ROLLOUT_TRACE"}


def run_python(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python script`` in ``cwd``."""
    return _run([sys.executable, str(script)], cwd)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``rollout-trace args...`` in ``cwd``."""
    return _run([sys.executable, "-m", "rollout_trace", *args], cwd)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120
    )
